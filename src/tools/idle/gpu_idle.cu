/*
 * chimaera-gpu-idle: what an idle embedded runtime with a GPU costs, and how
 * soon it serves the first GPU->CPU task after a quiet spell.
 *
 *   chimaera-gpu-idle [--idle-s S] [--samples N] [--gap-ms MS]
 *
 * 1. After a warm-up and 1 s of quiet, the process's CPU time (every thread:
 *    GPU->CPU pollers, lease thread, CPU workers) over S seconds (default 5),
 *    as a percentage of one core, and the threads that used any.
 * 2. N times (default 20): MS ms (default 1000) of quiet, then a one-thread
 *    kernel times one 64-byte chi.echo GPU->CPU round trip with the GPU's
 *    %globaltimer (submit to result).  p50 / p90 / max.
 * 3. The same round trip N times with no quiet between (the warm figure).
 * The runtime takes its settings as usual (CHI_GPU_* variables), so one
 * binary measures every setting.  Exit 77 without a GPU.
 */
#include <dirent.h>
#include <getopt.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "chimaera.h"
#include "chimaera_device.h"
#include "chimaera/device_diag.h"

namespace {

__global__ void k_echo(chi_dev_context_t ctx, uint32_t n, uint64_t *ns, int32_t *bad) {
  uint8_t in[64], out[64];
  for (int i = 0; i < 64; ++i) in[i] = (uint8_t)(i * 3);
  for (uint32_t k = 0; k < n; ++k) {
    const uint64_t t0 = chi_port::timer_ns();
    chi_future_t f;
    uint32_t osz = 0;
    chi_status_t s = chi_dev_submit(&ctx, CHI_ROUTE_CPU, CHI_METHOD_ECHO, in, 64, &f);
    if (s == CHI_OK) s = chi_dev_wait(&ctx, f, 10000000000ll, out, 64, &osz);
    ns[k] = chi_port::timer_ns() - t0;
    if (s != CHI_OK || osz != 64 || out[63] != in[63]) atomicAdd(bad, 1);
  }
}

double now_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

double process_cpu_s() {
  rusage r;
  getrusage(RUSAGE_SELF, &r);
  return r.ru_utime.tv_sec + r.ru_utime.tv_usec * 1e-6 + r.ru_stime.tv_sec + r.ru_stime.tv_usec * 1e-6;
}

struct ThreadCpu {
  int tid;
  std::string name;
  long ticks;
};

// utime + stime of every thread of this process, in clock ticks.
std::vector<ThreadCpu> thread_cpu() {
  std::vector<ThreadCpu> out;
  DIR *d = opendir("/proc/self/task");
  if (!d) return out;
  while (dirent *e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::string base = std::string("/proc/self/task/") + e->d_name;
    FILE *f = fopen((base + "/stat").c_str(), "r");
    if (!f) continue;
    char buf[1024] = {0};
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *close = strrchr(buf, ')');
    const char *open = strchr(buf, '(');
    if (!close || !open) continue;
    // Fields after the name: state is field 3; utime 14, stime 15.
    long utime = 0, stime = 0;
    const char *p = close + 2;
    for (int field = 3; field < 14 && p; ++field) {
      p = strchr(p, ' ');
      if (p) ++p;
    }
    if (!p || sscanf(p, "%ld %ld", &utime, &stime) != 2) continue;
    out.push_back({atoi(e->d_name), std::string(open + 1, close), utime + stime});
  }
  closedir(d);
  return out;
}

void summarize(const char *what, std::vector<uint64_t> v) {
  if (v.empty()) return;
  std::sort(v.begin(), v.end());
  printf("%-44s p50 %8.1f us   p90 %8.1f us   max %8.1f us   (n=%zu)\n", what,
         v[(v.size() - 1) / 2] / 1e3, v[(v.size() * 9) / 10 < v.size() ? (v.size() * 9) / 10 : v.size() - 1] / 1e3,
         v.back() / 1e3, v.size());
}

}  // namespace

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  double idle_s = 5;
  unsigned samples = 20, gap_ms = 1000;
  static const option opts[] = {{"idle-s", required_argument, nullptr, 'i'},
                                {"samples", required_argument, nullptr, 'n'},
                                {"gap-ms", required_argument, nullptr, 'g'},
                                {nullptr, 0, nullptr, 0}};
  for (int c; (c = getopt_long(argc, argv, "", opts, nullptr)) != -1;) {
    if (c == 'i') idle_s = atof(optarg);
    else if (c == 'n') samples = unsigned(atoi(optarg));
    else if (c == 'g') gap_ms = unsigned(atoi(optarg));
    else return 2;
  }
  if (samples < 1 || idle_s <= 0) return 2;
  // Every kernel of this program loaded before chi_init (docs/gpu.md).
  setenv("CUDA_MODULE_LOADING", "EAGER", 1);
  int ngpu = 0;
  if (cudaGetDeviceCount(&ngpu) != cudaSuccess || ngpu == 0 || cudaFree(0) != cudaSuccess) {
    printf("chimaera-gpu-idle: no usable GPU\n");
    return 77;
  }
  cudaStream_t st;
  uint64_t *d_ns, *ns;
  int32_t *bad;
  if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess ||
      cudaMalloc((void **)&d_ns, samples * sizeof(uint64_t)) != cudaSuccess ||
      cudaHostAlloc((void **)&ns, samples * sizeof(uint64_t), cudaHostAllocDefault) != cudaSuccess ||
      cudaHostAlloc((void **)&bad, sizeof(int32_t), cudaHostAllocMapped) != cudaSuccess)
    return 1;
  *bad = 0;
  chi_runtime_t *rt;
  if (chi_init(NULL, &rt) != CHI_OK) {
    printf("chi_init: %s\n", chi_last_error_message());
    return 1;
  }
  int32_t count = 0;
  chi_gpu_count(rt, &count);
  if (count == 0) {
    chi_finalize(rt);
    printf("chimaera-gpu-idle: the runtime drives no GPU\n");
    return 77;
  }
  chi_dev_context_t ctx;
  chi_gpu_context(rt, 0, &ctx);
  const char *knobs[] = {"CHI_GPU_POLLERS", "CHI_GPU_POLL_INTERVAL_US", "CHI_GPU_POLLER_SPIN_NS",
                         "CHI_GPU_POLLER_PARK_AFTER_US", "CHI_GPU_POLLER_WATCH_INTERVAL_US", "CHI_GPU_POLLER_BELL_CHECK_US",
                         "CHI_GPU_LEASE_US"};
  printf("chimaera-gpu-idle: %ld CPUs;", sysconf(_SC_NPROCESSORS_ONLN));
  for (const char *k : knobs)
    if (getenv(k)) printf(" %s=%s", k, getenv(k));
  printf("\n");

  auto round_trips = [&](uint32_t n) {
    k_echo<<<1, 1, 0, st>>>(ctx, n, d_ns, bad);
    return cudaStreamSynchronize(st) == cudaSuccess;
  };
  // Copies on the program's own non-blocking stream: the legacy stream
  // would wait for the orchestrator's lease.
  auto fetch = [&](uint32_t n) {
    cudaMemcpyAsync(ns, d_ns, n * sizeof(uint64_t), cudaMemcpyDeviceToHost, st);
    return cudaStreamSynchronize(st) == cudaSuccess;
  };
  // Warm-up: every path taken once.
  for (int i = 0; i < 10; ++i)
    if (!round_trips(std::min<unsigned>(samples, 100))) return 1;

  // 1. Idle CPU.
  usleep(1000000);
  // The orchestrator's launches meanwhile (its diag words, chimaera/device_diag.h).
  const volatile uint64_t *diag = reinterpret_cast<const chi_dev_ctx_layout_t *>(&ctx)->diag;
  std::vector<ThreadCpu> before = thread_cpu();
  const uint64_t e0 = diag ? diag[CHI_DIAG_START_EPOCH] : 0;
  const double c0 = process_cpu_s(), t0 = now_s();
  usleep(useconds_t(idle_s * 1e6));
  const double c1 = process_cpu_s(), t1 = now_s();
  const uint64_t e1 = diag ? diag[CHI_DIAG_START_EPOCH] : 0;
  std::vector<ThreadCpu> after = thread_cpu();
  const double pct = 100.0 * (c1 - c0) / (t1 - t0);
  printf("idle CPU over %.1f s: %.2f%% of one core (%d threads); %.0f orchestrator launches/s\n", t1 - t0,
         pct, int(after.size()), double(e1 - e0) / (t1 - t0));
  const long hz = sysconf(_SC_CLK_TCK);
  for (const ThreadCpu &a : after) {
    long prev = 0;
    for (const ThreadCpu &b : before)
      if (b.tid == a.tid) prev = b.ticks;
    if (a.ticks > prev)
      printf("  thread %d (%s): %.2f%%\n", a.tid, a.name.c_str(), 100.0 * (a.ticks - prev) / hz / (t1 - t0));
  }

  // 2. First task after a quiet spell.
  std::vector<uint64_t> wake;
  for (unsigned i = 0; i < samples; ++i) {
    usleep(gap_ms * 1000);
    if (!round_trips(1) || !fetch(1)) return 1;
    wake.push_back(ns[0]);
  }
  char what[96];
  snprintf(what, sizeof what, "GPU->CPU first task after %u ms idle", gap_ms);
  summarize(what, wake);

  // 3. Warm: back to back.
  if (!round_trips(samples) || !fetch(samples)) return 1;
  summarize("GPU->CPU back to back", std::vector<uint64_t>(ns, ns + samples));

  const int failed = *bad;
  if (chi_finalize(rt) != CHI_OK) return 1;
  printf("RESULT idle_cpu_pct=%.2f wake_p50_us=%.1f failed=%d\n", pct,
         [&] {
           std::vector<uint64_t> v = wake;
           std::sort(v.begin(), v.end());
           return v[(v.size() - 1) / 2] / 1e3;
         }(),
         failed);
  cudaFree(d_ns);
  cudaFreeHost(ns);
  cudaFreeHost(bad);
  cudaStreamDestroy(st);
  return failed ? 1 : 0;
}

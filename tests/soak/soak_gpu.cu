// soak_gpu: the embedded GPU part of the soak (scripts/soak.sh --gpu).
//
//   soak_gpu --module SOAK_MODULE --dir LOGDIR [--start K] [--client-base B]
//            [--clients M] (--deadline-ms EPOCH_MS | --seconds S)
//            [--seq-bits 14] [--blocks 16] [--threads 128] [--round-bound-s 60]
//   soak_gpu --smoke S --module SOAK_MODULE --dir DIR
//
// An embedded runtime on GPU 0 loads the soak module (soak.record: CPU
// handler recording ids in the ledger $CHI_SOAK_LEDGER, GPU handler that
// records through a GPU->CPU task) and, until the deadline or SIGTERM, runs
// rounds of one kernel whose warps each take one kind of task per round:
//   gpu->cpu          soak.record to the CPU handler, waited        (R, ledger)
//   gpu->gpu          soak.record to the GPU handler, waited        (R, ledger)
//   gpu->gpu-builtin  chi.echo/add/checksum on the orchestrator      (B)
//   gpu->cpu-builtin  chi.echo/add/checksum on the CPU pollers       (B)
//   gpu->cpu-release  soak.record to the CPU, chi_dev_release'd      (L)
//   gpu->gpu-release  soak.record to the GPU handler, released       (L)
//   gpu-warp          soak.record through chi_dev_warp_submit/_wait,
//                     GPU->GPU and GPU->CPU in turn                  (R, ledger)
// Every waited result is checked.  Every device wait is bounded (waits of
// 1 s, given up after --wait-bound-s, default 20: the future is released and
// the task counted SOAK_HANG); the host waits for a round at most
// --round-bound-s, then prints the orchestrator's diag words, raises the
// kernel's stop flag (every lane checks it each task) and exits 3.  A host
// thread meanwhile submits CPU->GPU tasks (soak.record to the GPU handler,
// and the built-ins) with 8 in flight.
//
// Each kind of each round is one client number of the ledger (B + 1, 2, ...;
// the host thread takes a new number every 2^seq-bits tasks), logged in
// soak_client's format to LOGDIR/eK-kernel.log and LOGDIR/eK-host.log, so
// soak_check checks them against the ledger: an id answered CHI_OK is in
// it, none ran twice.  A round is logged when it ends (a killed program
// loses the round in flight: its runs show as runs no log accounts for).
//
// At the end (deadline or SIGTERM): device_slots_in_use and CPU slots
// (chi_stats) must come back to their values after start-up (0), and the
// CPU/GPU routes' tasks in flight to 0, within 10 s; the last line,
// "soak_gpu end: ...", gives them with the RSS after start-up and at the end
// (without the ledger's mapped pages).
// --smoke S: a short run for ctest (a private ledger in DIR), S seconds after
// start-up; it fails when no round ran.
// Exit status: 0 passed, 1 a check failed (wrong output, hang, unlogged
// outcome, leaked slots), 2 usage or set-up, 3 a round that did not end,
// 4 a CUDA error, 77 no usable GPU (skipped).
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>

#include "../gpu/gpu_common.h"
#include "soak_common.h"

namespace {

enum Kind : uint32_t { kCpuRec, kGpuRec, kGpuBuiltin, kCpuBuiltin, kCpuRel, kGpuRel, kWarpRec, kKinds };
const char *const kRouteName[kKinds] = {"gpu->cpu",         "gpu->gpu",         "gpu->gpu-builtin",
                                        "gpu->cpu-builtin", "gpu->cpu-release", "gpu->gpu-release",
                                        "gpu-warp"};
// Tasks per lane and round: released kinds hold their slots until the task
// ends, so fewer of them.
const uint32_t kIters[kKinds] = {32, 32, 24, 24, 8, 8, 16};

struct Round {
  uint64_t client[kKinds];
  uint32_t off[kKinds]; /* first outcome of each kind */
  uint32_t iters[kKinds];
  uint32_t round;
  chi_method_t record;
  uint64_t *out; /* outcomes: letter << 32 | status, 0 = none (pinned, mapped) */
  const volatile uint32_t *stop;
  int64_t wait_ns, bound_ns;
};

__device__ void put(const Round &p, uint32_t k, uint32_t seq, char letter, chi_status_t s) {
  p.out[p.off[k] + seq] = (static_cast<uint64_t>(static_cast<uint8_t>(letter)) << 32) | static_cast<uint32_t>(s);
}

__host__ __device__ uint64_t load64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

// Input of task `id`; *builtin: 0 (soak.record) or the built-in method.
__host__ __device__ uint32_t make_task(bool builtin_kind, uint32_t i, uint64_t id, uint8_t *in,
                                       chi_method_t *builtin) {
  *builtin = 0;
  if (builtin_kind) {
    const chi_method_t b[3] = {CHI_METHOD_ECHO, CHI_METHOD_ADD, CHI_METHOD_CHECKSUM};
    *builtin = b[i % 3];
    if (*builtin == CHI_METHOD_ADD) {
      const uint64_t v[2] = {id, soak_mix(id)};
      memcpy(in, v, sizeof v);
      return sizeof v;
    }
  }
  return static_cast<uint32_t>(soak_make_input(id, in));
}

__host__ __device__ bool output_right(chi_method_t builtin, uint64_t id, const uint8_t *in, uint32_t n,
                                      const uint8_t *out, uint32_t size) {
  if (builtin == 0) return size == 16 && load64(out) == id && load64(out + 8) == soak_fnv1a(in, n);
  if (builtin == CHI_METHOD_ECHO) {
    if (size != n) return false;
    for (uint32_t b = 0; b < n; ++b)
      if (out[b] != in[b]) return false;
    return true;
  }
  const uint64_t want = builtin == CHI_METHOD_ADD ? id + soak_mix(id) : soak_fnv1a(in, n);
  return size == 8 && load64(out) == want;
}

// chi_dev_wait in waits of wait_ns, given up after bound_ns (the future is
// released then: its slot comes back when the task ends).
__device__ chi_status_t wait_bounded(const chi_dev_context_t *ctx, chi_future_t f, const Round &p, uint8_t *out,
                                     uint32_t cap, uint32_t *size) {
  const uint64_t t0 = chi_port::timer_ns();
  for (;;) {
    chi_status_t s = chi_dev_wait(ctx, f, p.wait_ns, out, cap, size);
    if (s == CHI_ERR_TOO_LARGE) {
      chi_dev_release(ctx, f);
      return SOAK_BAD_OUTPUT;
    }
    if (s != CHI_ERR_TIMEOUT) return s;
    if (chi_port::timer_ns() - t0 >= static_cast<uint64_t>(p.bound_ns) || *p.stop) {
      chi_dev_release(ctx, f);
      return SOAK_HANG;
    }
  }
}

__global__ void soak_round(chi_dev_context_t ctx, Round p) {
  const uint32_t lane = chi_port::lane_id();
  const uint32_t g = (blockIdx.x * blockDim.x + threadIdx.x) / 32u;
  const uint32_t k = (g + p.round) % kKinds;
  const uint32_t w = (g / kKinds) * 32u + lane; /* this lane among the lanes of kind k */
  const uint32_t iters = p.iters[k];
  alignas(16) uint8_t in[8 + SOAK_MAX_PAD];
  alignas(16) uint8_t out[8 + SOAK_MAX_PAD];
  if (k == kWarpRec) {
    // Warp-collective: every lane, converged; the stop flag read by lane 0.
    for (uint32_t i = 0; i < iters; ++i) {
      if (chi_port::shfl(lane == 0 ? *p.stop : 0u, 0)) return;
      const uint32_t seq = w * iters + i;
      const uint64_t id = p.client[k] << 32 | seq;
      const uint32_t n = static_cast<uint32_t>(soak_make_input(id, in));
      const chi_route_t route = (i & 1u) ? CHI_ROUTE_CPU : CHI_ROUTE_LOCAL;
      chi_future_t f = 0;
      chi_status_t s = chi_dev_warp_submit(&ctx, route, p.record, in, n, 1, &f);
      bool pending = s == CHI_OK;
      if (!pending) put(p, k, seq, 'S', s);
      const uint64_t t0 = chi_port::timer_ns();
      while (chi_port::ballot(pending)) {
        uint32_t size = 0;
        chi_status_t ws = chi_dev_warp_wait(&ctx, f, p.wait_ns, out, sizeof out, &size, pending ? 1 : 0);
        if (!pending) continue;
        if (ws == CHI_ERR_TIMEOUT) {
          if (chi_port::timer_ns() - t0 < static_cast<uint64_t>(p.bound_ns) && !*p.stop) continue;
          chi_dev_release(&ctx, f);
          ws = SOAK_HANG;
        } else if (ws == CHI_ERR_TOO_LARGE) {
          chi_dev_release(&ctx, f);
          ws = SOAK_BAD_OUTPUT;
        } else if (ws == CHI_OK && !output_right(0, id, in, n, out, size)) {
          ws = SOAK_BAD_OUTPUT;
        }
        put(p, k, seq, 'R', ws);
        pending = false;
      }
    }
    return;
  }
  // Per-thread calls: lanes go their own ways.
  const bool to_cpu = k == kCpuRec || k == kCpuBuiltin || k == kCpuRel;
  const bool builtin_kind = k == kGpuBuiltin || k == kCpuBuiltin;
  const bool release = k == kCpuRel || k == kGpuRel;
  for (uint32_t i = 0; i < iters; ++i) {
    if (*p.stop) return;
    const uint32_t seq = w * iters + i;
    const uint64_t id = p.client[k] << 32 | seq;
    chi_method_t builtin;
    const uint32_t n = make_task(builtin_kind, i, id, in, &builtin);
    chi_future_t f = 0;
    chi_status_t s = chi_dev_submit(&ctx, to_cpu ? CHI_ROUTE_CPU : CHI_ROUTE_LOCAL, builtin ? builtin : p.record,
                                    in, n, &f);
    if (s != CHI_OK) {
      put(p, k, seq, 'S', s);
      continue;
    }
    if (release) {
      put(p, k, seq, 'L', chi_dev_release(&ctx, f));
      continue;
    }
    uint32_t size = 0;
    s = wait_bounded(&ctx, f, p, out, sizeof out, &size);
    if (s == CHI_OK && !output_right(builtin, id, in, n, out, size)) s = SOAK_BAD_OUTPUT;
    put(p, k, seq, builtin ? 'B' : 'R', s);
  }
}

// ------------------------------------------------------------------ host

volatile sig_atomic_t g_signal = 0;
std::atomic<bool> g_stop{false};
std::atomic<bool> g_fail{false};
std::atomic<uint64_t> g_next_client{0};
uint64_t g_client_end = 0;
int64_t g_deadline_ms = 0;
uint32_t g_seq_bits = 14;
const char *g_ledger = "";

void on_signal(int) { g_signal = 1; }

int64_t now_ms() {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

bool stopping() { return g_signal || g_stop.load() || now_ms() >= g_deadline_ms; }

// A new client number, or false when this start's range is used up.
bool take_client(uint64_t *c) {
  *c = g_next_client.fetch_add(1);
  return *c < g_client_end;
}

void write_all(int fd, const std::string &s) {
  const char *p = s.data();
  size_t n = s.size();
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      fprintf(stderr, "FAIL: soak_gpu: log write: %s\n", strerror(errno));
      _exit(2);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

std::string fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char *f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

// VmRSS without the pages of the ledger's mapping (the soak's bookkeeping), kB.
long rss_kb() {
  long rss = 0, ledger = 0;
  FILE *f = fopen("/proc/self/status", "r");
  char line[1024];
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "VmRSS:", 6)) rss = atol(line + 6);
  if (f) fclose(f);
  f = fopen("/proc/self/smaps", "r");
  bool in = false;
  while (f && fgets(line, sizeof line, f)) {
    unsigned long a, b;
    if (sscanf(line, "%lx-%lx ", &a, &b) == 2 && strchr(line, '-') < strchr(line, ' ')) {
      size_t len = strlen(line);
      while (len && (line[len - 1] == '\n' || line[len - 1] == ' ')) line[--len] = '\0';
      const size_t l = strlen(g_ledger);
      in = l && len >= l && !strcmp(line + len - l, g_ledger);
    } else if (in && !strncmp(line, "Rss:", 4)) {
      ledger += atol(line + 4);
    }
  }
  if (f) fclose(f);
  return rss - ledger;
}

// Runs of consecutive sequences with one outcome, as soak_client logs them.
struct Runs {
  std::string text;
  bool active = false;
  char letter = 0;
  int32_t status = 0;
  uint32_t first = 0, last = 0;
  void add(char l, int32_t s, uint32_t seq) {
    if (active && l == letter && s == status && seq == last + 1) {
      last = seq;
      return;
    }
    flush();
    active = true;
    letter = l;
    status = s;
    first = last = seq;
  }
  void flush() {
    if (active) text += fmt("%c %d %u %u\n", letter, static_cast<int>(status), first, last);
    active = false;
  }
};

struct Tally {
  uint64_t submitted = 0, ok = 0, released = 0, failed = 0, bad = 0, hangs = 0;
};
Tally g_tally[kKinds + 1]; /* kKinds: the host thread's CPU->GPU tasks */

// The host thread: CPU->GPU tasks, 8 in flight, soak.record and built-ins
// in blocks of 256 as soak_client --route gpu.
void host_client(chi_runtime_t *rt, chi_method_t record, int fd, int start) {
  constexpr uint32_t kWindow = 8;
  constexpr int64_t kHangMs = 20000;
  const uint32_t limit = (1u << g_seq_bits) - kWindow;
  Tally &t = g_tally[kKinds];
  uint64_t client;
  while (!stopping() && take_client(&client)) {
    write_all(fd, fmt("# client %llu address embedded route cpu->gpu pid %d window %u start %lld deadline %lld "
                      "run %d\n",
                      (unsigned long long)client, int(getpid()), kWindow, (long long)now_ms(),
                      (long long)g_deadline_ms, start));
    struct Pending {
      chi_future_t f;
      uint32_t seq;
    } ring[kWindow];
    uint32_t head = 0, count = 0, next = 0;
    Runs r, b, s;
    int64_t flushed = now_ms();
    auto wait_oldest = [&]() {
      Pending &p = ring[head];
      const uint64_t id = client << 32 | p.seq;
      uint8_t in[8 + SOAK_MAX_PAD];
      alignas(16) uint8_t out[8 + SOAK_MAX_PAD];
      chi_method_t builtin;
      const uint32_t n = make_task((p.seq >> 8) % 5 >= 2, (p.seq >> 8) % 5 - 2, id, in, &builtin);
      size_t size = 0;
      const int64_t t0 = now_ms();
      chi_status_t st;
      while ((st = chi_wait(rt, p.f, 1000000000, out, sizeof out, &size)) == CHI_ERR_TIMEOUT) {
        if (now_ms() - t0 >= kHangMs) {
          r.flush(), b.flush(), s.flush();
          write_all(fd, r.text + b.text + s.text +
                            fmt("E hang %lld seq %u waited_ms %lld\n", (long long)now_ms(), p.seq,
                                (long long)(now_ms() - t0)));
          fprintf(stderr, "FAIL: soak_gpu: a CPU->GPU chi_wait did not return within %lld ms\n",
                  (long long)kHangMs);
          _exit(3);
        }
      }
      if (st == CHI_OK && !output_right(builtin, id, in, n, out, static_cast<uint32_t>(size))) st = SOAK_BAD_OUTPUT;
      if (st == CHI_OK)
        t.ok++;
      else
        t.failed++;
      if (st == SOAK_BAD_OUTPUT) t.bad++;
      (builtin ? b : r).add(builtin ? 'B' : 'R', st, p.seq);
      head = (head + 1) % kWindow;
      count--;
    };
    while (!stopping() && next < limit) {
      while (count < kWindow && next < limit) {
        const uint32_t seq = next++;
        const uint64_t id = client << 32 | seq;
        uint8_t in[8 + SOAK_MAX_PAD];
        chi_method_t builtin;
        const uint32_t n = make_task((seq >> 8) % 5 >= 2, (seq >> 8) % 5 - 2, id, in, &builtin);
        chi_future_t f = 0;
        t.submitted++;
        chi_status_t st = chi_submit(rt, CHI_ROUTE_GPU(0), builtin ? builtin : record, in, n, &f);
        if (st != CHI_OK) {
          t.failed++;
          s.add('S', st, seq);
          if (count == 0) usleep(1000);
          break;
        }
        ring[(head + count) % kWindow] = {f, seq};
        count++;
      }
      if (count > 0) wait_oldest();
      if (now_ms() - flushed >= 20) { /* a killed program loses at most 20 ms of outcomes */
        r.flush(), b.flush(), s.flush();
        write_all(fd, r.text + b.text + s.text);
        r.text.clear(), b.text.clear(), s.text.clear();
        flushed = now_ms();
      }
    }
    while (count > 0) wait_oldest();
    r.flush(), b.flush(), s.flush();
    write_all(fd, r.text + b.text + s.text +
                      fmt("X %lld round submitted %u\n", (long long)now_ms(), next));
  }
}

void usage() {
  fprintf(stderr,
          "usage: soak_gpu --module SOAK_MODULE --dir LOGDIR [--start K] [--client-base B] [--clients M]\n"
          "                (--deadline-ms EPOCH_MS | --seconds S) [--seq-bits B] [--blocks N]\n"
          "                [--threads N] [--round-bound-s S] [--wait-bound-s S]\n"
          "       soak_gpu --smoke S --module SOAK_MODULE --dir DIR\n");
  exit(2);
}

}  // namespace

int main(int argc, char **argv) {
  const char *module = nullptr, *dir = nullptr;
  int start = 1, smoke = 0;
  uint64_t client_base = 0, clients = 65536;
  int64_t seconds = 0;
  uint32_t blocks = 16, threads = 128, round_bound_s = 60, wait_bound_s = 20;
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc) usage();
    const char *a = argv[i], *v = argv[i + 1];
    if (!strcmp(a, "--module")) module = v;
    else if (!strcmp(a, "--dir")) dir = v;
    else if (!strcmp(a, "--start")) start = atoi(v);
    else if (!strcmp(a, "--client-base")) client_base = strtoull(v, nullptr, 10);
    else if (!strcmp(a, "--clients")) clients = strtoull(v, nullptr, 10);
    else if (!strcmp(a, "--deadline-ms")) g_deadline_ms = strtoll(v, nullptr, 10);
    else if (!strcmp(a, "--seconds")) seconds = strtoll(v, nullptr, 10);
    else if (!strcmp(a, "--smoke")) smoke = 1, seconds = strtoll(v, nullptr, 10);
    else if (!strcmp(a, "--seq-bits")) g_seq_bits = static_cast<uint32_t>(atoi(v));
    else if (!strcmp(a, "--blocks")) blocks = static_cast<uint32_t>(atoi(v));
    else if (!strcmp(a, "--threads")) threads = static_cast<uint32_t>(atoi(v));
    else if (!strcmp(a, "--round-bound-s")) round_bound_s = static_cast<uint32_t>(atoi(v));
    else if (!strcmp(a, "--wait-bound-s")) wait_bound_s = static_cast<uint32_t>(atoi(v));
    else usage();
  }
  if (!module || !dir || (g_deadline_ms <= 0 && seconds <= 0) || g_seq_bits < 10 || g_seq_bits > 31 || blocks == 0 ||
      threads == 0 || threads % 32 != 0 || threads > 1024 || clients < 2 || round_bound_s == 0)
    usage();

  // No GPU, or none this build can drive: skipped, before anything is written.
  if (!gt_have_cuda()) {
    printf("soak_gpu: no usable CUDA device; skipped\n");
    return 77;
  }
  mkdir(dir, 0700);
  char ledger[1024];
  if (smoke) {
    snprintf(ledger, sizeof ledger, "%s/ledger", dir);
    unlink(ledger);
    unlink(fmt("%s/e%d-kernel.log", dir, start).c_str());
    unlink(fmt("%s/e%d-host.log", dir, start).c_str());
    setenv("CHI_SOAK_LEDGER", ledger, 1);
    setenv("CHI_SOAK_SEQ_BITS", fmt("%u", g_seq_bits).c_str(), 1);
    setenv("CHI_SOAK_CLIENTS", fmt("%llu", (unsigned long long)(client_base + clients)).c_str(), 1);
  }
  if (!getenv("CHI_SOAK_LEDGER")) {
    fprintf(stderr, "soak_gpu: CHI_SOAK_LEDGER names no ledger file\n");
    return 2;
  }
  g_ledger = getenv("CHI_SOAK_LEDGER");
  g_next_client = client_base;
  g_client_end = client_base + clients;

  // The rounds' layout: warps of each kind, their outcomes' offsets.
  const uint32_t nwarps = blocks * threads / 32u;
  uint32_t max_tasks = 0;
  for (uint32_t k = 0; k < kKinds; ++k) {
    const uint32_t warps = (nwarps + kKinds - 1) / kKinds; /* the most any round gives kind k */
    const uint32_t tasks = warps * 32u * kIters[k];
    if (tasks >= (1u << g_seq_bits)) {
      fprintf(stderr, "soak_gpu: %u tasks of one kind do not fit --seq-bits %u\n", tasks, g_seq_bits);
      return 2;
    }
    max_tasks += tasks;
  }

  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  // Pinned memory and the stream before chi_init: no device-wide call later.
  uint64_t *outcomes = nullptr;
  uint32_t *stop = nullptr;
  cudaStream_t stream;
  if (cudaHostAlloc(&outcomes, sizeof(uint64_t) * max_tasks, cudaHostAllocMapped) != cudaSuccess ||
      cudaHostAlloc(&stop, sizeof(uint32_t), cudaHostAllocMapped) != cudaSuccess ||
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    fprintf(stderr, "FAIL: soak_gpu: CUDA set-up: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 4;
  }
  *stop = 0;
  uint64_t *d_out = nullptr;
  uint32_t *d_stop = nullptr;
  cudaHostGetDevicePointer(reinterpret_cast<void **>(&d_out), outcomes, 0);
  cudaHostGetDevicePointer(reinterpret_cast<void **>(&d_stop), stop, 0);

  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.num_workers = 4;
  cfg.gpus = -1;
  // Four GPU->GPU worker warps: the GPU handler waits for a GPU->CPU task.
  cfg.settings = "gpu.warps_per_block: 8\n";
  chi_runtime_t *rt = nullptr;
  chi_status_t s = chi_init(&cfg, &rt);
  int32_t gpus = 0;
  if (s == CHI_OK) chi_gpu_count(rt, &gpus);
  if (s != CHI_OK || gpus == 0) {
    printf("soak_gpu: the runtime drives no GPU (%s: %s); skipped\n", chi_status_string(s), chi_last_error_message());
    chi_finalize(rt);
    return 77;
  }
  chi_method_t record = 0;
  chi_dev_context_t ctx;
  if ((s = chi_load_module(rt, module)) != CHI_OK || (s = chi_method_lookup(rt, SOAK_METHOD, &record)) != CHI_OK ||
      (s = chi_gpu_context(rt, 0, &ctx)) != CHI_OK) {
    fprintf(stderr, "FAIL: soak_gpu: set-up: %s (%s)\n", chi_status_string(s), chi_last_error_message());
    chi_finalize(rt);
    return 2;
  }
  const volatile uint64_t *diag = gt_diag(&ctx);
  const std::string klog = fmt("%s/e%d-kernel.log", dir, start), hlog = fmt("%s/e%d-host.log", dir, start);
  const int kfd = open(klog.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  const int hfd = open(hlog.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (kfd < 0 || hfd < 0) {
    fprintf(stderr, "FAIL: soak_gpu: %s: %s\n", klog.c_str(), strerror(errno));
    return 2;
  }
  // The baseline: what the runtime holds before any task (0 expected).
  chi_stats_t base;
  memset(&base, 0, sizeof base);
  base.struct_size = sizeof base;
  chi_stats(rt, &base);
  if (seconds > 0) g_deadline_ms = now_ms() + seconds * 1000; /* from here: start-up not counted */
  const long rss_start = rss_kb();
  printf("soak_gpu: ready pid %d start %d rss_kb %ld grid %ux%u clients %llu..%llu\n", int(getpid()), start,
         rss_start, blocks, threads, (unsigned long long)client_base,
         (unsigned long long)(client_base + clients - 1));
  fflush(stdout);

  std::thread host(host_client, rt, record, hfd, start);

  uint32_t rounds = 0;
  int rc = 0;
  while (!stopping()) {
    Round p;
    memset(&p, 0, sizeof p);
    p.round = rounds;
    p.record = record;
    p.out = d_out;
    p.stop = d_stop;
    p.wait_ns = 1000000000;
    p.bound_ns = static_cast<int64_t>(wait_bound_s) * 1000000000;
    uint32_t tasks[kKinds], total = 0;
    bool have = true;
    for (uint32_t k = 0; k < kKinds && have; ++k) {
      uint32_t warps = 0;
      for (uint32_t g = 0; g < nwarps; ++g) warps += (g + rounds) % kKinds == k;
      p.iters[k] = kIters[k];
      tasks[k] = warps * 32u * kIters[k];
      p.off[k] = total;
      total += tasks[k];
      have = take_client(&p.client[k]);
    }
    if (!have) {
      write_all(kfd, fmt("E client-limit %lld\n", (long long)now_ms()));
      while (!stopping()) usleep(100000);
      break;
    }
    memset(outcomes, 0, sizeof(uint64_t) * total);
    const int64_t t0 = now_ms();
    soak_round<<<blocks, threads, 0, stream>>>(ctx, p);
    cudaError_t e = cudaGetLastError();
    /* Until the round ends, a CUDA error, or the bound. */
    while (e == cudaSuccess || e == cudaErrorNotReady) {
      e = cudaStreamQuery(stream);
      if (e != cudaErrorNotReady || now_ms() - t0 >= int64_t(round_bound_s) * 1000) break;
      usleep(200);
    }
    if (e == cudaErrorNotReady) {
      const std::string d = gt_diag_line(diag, gt_realtime_ns());
      fprintf(stderr, "FAIL: soak_gpu: round %u still runs after %u s; orchestrator: %s\n", rounds, round_bound_s,
              d.c_str());
      write_all(kfd, fmt("E hang %lld round %u\n", (long long)now_ms(), rounds));
      *reinterpret_cast<volatile uint32_t *>(stop) = 1;
      const int64_t t1 = now_ms();
      while (cudaStreamQuery(stream) == cudaErrorNotReady && now_ms() - t1 < 20000) usleep(1000);
      fprintf(stderr, "soak_gpu: the kernel %s after the stop flag\n",
              cudaStreamQuery(stream) == cudaSuccess ? "ended" : "still runs");
      fflush(stderr);
      _exit(3);
    }
    if (e != cudaSuccess) {
      fprintf(stderr, "FAIL: soak_gpu: round %u: %s\n", rounds, cudaGetErrorString(e));
      _exit(4);
    }
    // The round's outcomes, one client per kind.
    std::string text;
    uint64_t again = 0;
    for (uint32_t k = 0; k < kKinds; ++k) {
      Tally &t = g_tally[k];
      Runs r;
      r.text = fmt("# client %llu address embedded route %s pid %d window 1 start %lld deadline %lld run %d\n",
                   (unsigned long long)p.client[k], kRouteName[k], int(getpid()), (long long)t0,
                   (long long)g_deadline_ms, start);
      for (uint32_t seq = 0; seq < tasks[k]; ++seq) {
        const uint64_t v = outcomes[p.off[k] + seq];
        char letter = static_cast<char>(v >> 32);
        int32_t st = static_cast<int32_t>(static_cast<uint32_t>(v));
        if (letter == 0) { /* never written: a broken round */
          fprintf(stderr, "FAIL: soak_gpu: round %u kind %s seq %u has no outcome\n", rounds, kRouteName[k], seq);
          g_fail = true;
          letter = 'S';
          st = SOAK_HANG;
        }
        t.submitted++;
        if (st == CHI_OK && letter == 'L')
          t.released++;
        else if (st == CHI_OK)
          t.ok++;
        else
          t.failed++;
        if (st == SOAK_BAD_OUTPUT) t.bad++;
        if (st == SOAK_HANG) t.hangs++;
        again += st == CHI_ERR_AGAIN;
        r.add(letter, st, seq);
      }
      r.flush();
      text += r.text + fmt("X %lld round submitted %u\n", (long long)now_ms(), tasks[k]);
    }
    if (again && diag) {
      // Why GPU->GPU submits answered CHI_ERR_AGAIN: the gate's last give-up
      // and the orchestrator's state (device_diag.h, CHI_DIAG_*).
      const uint64_t w = diag[CHI_DIAG_GATE_GAVE_UP_WHY];
      printf("soak_gpu: round %u: %llu submits answered CHI_ERR_AGAIN; last gate give-up after %llu us, lease thread "
             "phase %llu%s; step-asides so far %llu; %s\n",
             rounds, (unsigned long long)again, (unsigned long long)(w >> 32), (unsigned long long)(w & 0xFFu),
             (w >> 8) & 1u ? " (submit timeout)" : "", (unsigned long long)diag[CHI_DIAG_ASIDE_N],
             gt_diag_line(diag, gt_realtime_ns()).c_str());
      fflush(stdout);
    }
    write_all(kfd, text);
    rounds++;
  }
  g_stop = true;
  host.join();

  // Every slot back: released futures' slots come back when their tasks end.
  chi_stats_t st;
  const int64_t t0 = now_ms();
  for (;;) {
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    chi_stats(rt, &st);
    const bool back = st.device_slots_in_use == base.device_slots_in_use && st.slots_in_use == base.slots_in_use &&
                      st.routes[CHI_STATS_CPU].in_flight == 0 && st.routes[CHI_STATS_GPU].in_flight == 0;
    if (back || now_ms() - t0 >= 10000) break;
    usleep(10000);
  }
  const long rss_end = rss_kb();
  uint64_t bad = 0, hangs = 0;
  for (uint32_t k = 0; k <= kKinds; ++k) {
    const Tally &t = g_tally[k];
    bad += t.bad;
    hangs += t.hangs;
    printf("soak_gpu: %-17s submitted %llu ok %llu released %llu failed %llu (wrong output %llu, hangs %llu)\n",
           k < kKinds ? kRouteName[k] : "cpu->gpu (host)", (unsigned long long)t.submitted,
           (unsigned long long)t.ok, (unsigned long long)t.released, (unsigned long long)t.failed,
           (unsigned long long)t.bad, (unsigned long long)t.hangs);
  }
  const bool leak = st.device_slots_in_use != base.device_slots_in_use || st.slots_in_use != base.slots_in_use ||
                    st.routes[CHI_STATS_CPU].in_flight != 0 || st.routes[CHI_STATS_GPU].in_flight != 0;
  /* A smoke run that ran no round checked nothing. */
  const bool idle = smoke && rounds == 0;
  if (idle) fprintf(stderr, "FAIL: soak_gpu --smoke: no round ran\n");
  const bool fail = leak || bad || hangs || g_fail.load() || idle;
  const std::string end = fmt(
      "soak_gpu end: start %d rounds %u device_slots_in_use %llu (of %llu, at start %llu) slots_in_use %llu (at start "
      "%llu) cpu_in_flight %llu gpu_in_flight %llu rss_start_kb %ld rss_end_kb %ld wrong_output %llu hangs %llu "
      "result %s\n",
      start, rounds, (unsigned long long)st.device_slots_in_use, (unsigned long long)st.device_slots_total,
      (unsigned long long)base.device_slots_in_use, (unsigned long long)st.slots_in_use,
      (unsigned long long)base.slots_in_use, (unsigned long long)st.routes[CHI_STATS_CPU].in_flight,
      (unsigned long long)st.routes[CHI_STATS_GPU].in_flight, rss_start, rss_end, (unsigned long long)bad,
      (unsigned long long)hangs, fail ? "FAILED" : "passed");
  fputs(end.c_str(), stdout);
  fflush(stdout);
  write_all(hfd, "E " + end);
  if (leak) fprintf(stderr, "FAIL: soak_gpu: slots or tasks in flight not back at their start after 10 s\n");
  s = chi_finalize(rt);
  if (s != CHI_OK) fprintf(stderr, "FAIL: soak_gpu: chi_finalize: %s\n", chi_status_string(s));
  close(kfd);
  close(hfd);
  cudaStreamDestroy(stream);
  cudaFreeHost(outcomes);
  cudaFreeHost(stop);
  if (smoke && !fail) unlink(ledger);
  rc = fail || s != CHI_OK ? 1 : 0;
  return rc;
}

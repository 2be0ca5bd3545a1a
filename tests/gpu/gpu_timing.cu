/*
 * gpu_timing: where the GPU routes stand.  Round trips of a 64-byte chi.echo
 * through the public API (p50 and p99 over many, after a warm-up), per
 * route, and aggregate throughput with many submitters.  Not a benchmark
 * (chimaera-bench is): a quick reading printed by scripts/gpu-run.sh.  It
 * fails only if a task fails; it asserts no time.  Exit 77 without a GPU.
 *   gpu_timing [round_trips [all|lat|tput]]   (default 20000 all)
 * lat: latency rows only; tput: throughput rows only (for quick variants,
 * e.g. under another CHI_GPU_WAIT_SPIN_NS or CHI_GPU_POLLERS).
 */
#include "gpu_common.h"

#include <time.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* One thread: n round trips over `route` of `bytes` (<= 64) into a buffer of
 * `cap` bytes, each timed with %globaltimer (ns); sub[i]: the chi_dev_submit
 * part. */
__global__ void k_latency(chi_dev_context_t ctx, chi_route_t route, uint32_t n, uint32_t *ns,
                          uint32_t *sub, int32_t *bad, uint32_t bytes = 64, uint32_t cap = 64) {
  uint8_t in[64], out[64];
  for (int i = 0; i < 64; ++i) in[i] = (uint8_t)i;
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t t0 = chi_port::timer_ns();
    chi_future_t f;
    uint32_t osz = 0;
    chi_status_t s = chi_dev_submit(&ctx, route, CHI_METHOD_ECHO, in, bytes, &f);
    uint64_t t1 = chi_port::timer_ns();
    if (s == CHI_OK) s = chi_dev_wait(&ctx, f, 10000000000ll, out, cap, &osz);
    ns[i] = (uint32_t)(chi_port::timer_ns() - t0);
    sub[i] = (uint32_t)(t1 - t0);
    if (s != CHI_OK || osz != bytes || out[bytes - 1] != bytes - 1) atomicAdd(bad, 1);
  }
}

/* `lanes` lanes of every warp each run `tasks` 64-byte echoes back to back. */
__global__ void k_throughput(chi_dev_context_t ctx, chi_route_t route, uint32_t lanes,
                             uint32_t tasks, int32_t *bad) {
  if ((threadIdx.x & 31) >= lanes) return;
  uint8_t in[64], out[64];
  for (int i = 0; i < 64; ++i) in[i] = (uint8_t)(i + threadIdx.x);
  for (uint32_t i = 0; i < tasks; ++i) {
    chi_future_t f;
    uint32_t osz = 0;
    chi_status_t s;
    while ((s = chi_dev_submit(&ctx, route, CHI_METHOD_ECHO, in, 64, &f)) == CHI_ERR_AGAIN)
      __nanosleep(200);
    if (s == CHI_OK) s = chi_dev_wait(&ctx, f, 10000000000ll, out, 64, &osz);
    if (s != CHI_OK || osz != 64 || out[9] != in[9]) atomicAdd(bad, 1);
  }
}

/* The same with the warp-collective calls: every lane of a warp calls,
 * the first `lanes` with a task (one ticket bump per warp and route). */
__global__ void k_throughput_warp(chi_dev_context_t ctx, chi_route_t route, uint32_t lanes,
                                  uint32_t tasks, int32_t *bad) {
  const int mine = (threadIdx.x & 31) < lanes;
  uint8_t in[64], out[64];
  for (int i = 0; i < 64; ++i) in[i] = (uint8_t)(i + threadIdx.x);
  for (uint32_t i = 0; i < tasks; ++i) {
    chi_future_t f = 0;
    chi_status_t s = CHI_OK;
    int need = mine;
    while (__any_sync(0xFFFFFFFFu, need)) {
      chi_future_t g;
      chi_status_t r = chi_dev_warp_submit(&ctx, route, CHI_METHOD_ECHO, in, 64, need, &g);
      if (need && r != CHI_ERR_AGAIN) {
        s = r;
        f = g;
        need = 0;
      }
      if (__any_sync(0xFFFFFFFFu, need)) __nanosleep(200); /* all slots in use: back off */
    }
    uint32_t osz = 0;
    const int wait = mine && s == CHI_OK;
    chi_status_t w = chi_dev_warp_wait(&ctx, f, 10000000000ll, out, 64, &osz, wait);
    if (mine && (s != CHI_OK || w != CHI_OK || osz != 64 || out[9] != in[9])) atomicAdd(bad, 1);
  }
}

static void report(const char *what, std::vector<double> &us) {
  std::sort(us.begin(), us.end());
  printf("%-34s p50 %7.2f us   p99 %7.2f us   (n=%zu)\n", what, us[us.size() / 2],
         us[us.size() * 99 / 100], us.size());
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  if (!gt_have_cuda()) return 77;
  const uint32_t n = argc > 1 ? (uint32_t)atoi(argv[1]) : 20000;
  const char *mode = argc > 2 ? argv[2] : "all";
  const bool lat = strcmp(mode, "tput") != 0, tput = strcmp(mode, "lat") != 0;
  if (n < 100) return 2;
  /* CUDA allocations before chi_init (and frees after chi_finalize): some of
   * them synchronize the device, which an orchestrator never lets finish.
   * Timings go to device memory, so the timed loop never writes host memory. */
  cudaStream_t st;
  uint32_t *ns, *sub, *d_ns, *d_sub;
  int32_t *bad;
  if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess ||
      cudaMalloc((void **)&d_ns, n * sizeof(uint32_t)) != cudaSuccess ||
      cudaMalloc((void **)&d_sub, n * sizeof(uint32_t)) != cudaSuccess ||
      cudaHostAlloc((void **)&ns, n * sizeof(uint32_t), cudaHostAllocMapped) != cudaSuccess ||
      cudaHostAlloc((void **)&sub, n * sizeof(uint32_t), cudaHostAllocMapped) != cudaSuccess ||
      cudaHostAlloc((void **)&bad, sizeof(int32_t), cudaHostAllocMapped) != cudaSuccess)
    return 1;
  chi_runtime_t *rt;
  chi_config_t cfg;
  chi_config_init(&cfg);
  if (chi_init(&cfg, &rt) != CHI_OK) return 1;
  int32_t count = 0;
  chi_gpu_count(rt, &count);
  if (count == 0) {
    chi_finalize(rt);
    return 77;
  }
  chi_dev_context_t ctx;
  chi_gpu_context(rt, 0, &ctx);
  static GtWatchdog wd; /* a hang fails with the orchestrator's state */
  wd.start(&ctx, 240);
  *bad = 0;
  int failed = 0;
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  printf("gpu_timing on %s, 64-byte chi.echo round trips\n", prop.name);

  /* CPU -> GPU */
  if (lat) {
    uint8_t in[64], out[64];
    memset(in, 1, sizeof in);
    std::vector<double> us;
    for (uint32_t i = 0; i < n + n / 10; ++i) {
      double t0 = now_us();
      chi_future_t f;
      size_t osz;
      if (chi_submit(rt, 0, CHI_METHOD_ECHO, in, 64, &f) != CHI_OK ||
          chi_wait(rt, f, 10000000000ll, out, 64, &osz) != CHI_OK)
        ++failed;
      if (i >= n / 10) us.push_back(now_us() - t0);
    }
    report("CPU->GPU (chi_submit+chi_wait)", us);
  }
  /* GPU -> CPU and GPU -> GPU, timed on the device */
  const chi_route_t routes[2] = {CHI_ROUTE_CPU, CHI_ROUTE_LOCAL};
  const char *names[2] = {"GPU->CPU (chi_dev_submit+wait)", "GPU->GPU (chi_dev_submit+wait)"};
  for (int r = 0; r < 2 && lat; ++r) {
    k_latency<<<1, 1, 0, st>>>(ctx, routes[r], n / 10, d_ns, d_sub, bad); /* warm-up */
    k_latency<<<1, 1, 0, st>>>(ctx, routes[r], n, d_ns, d_sub, bad);
    cudaMemcpyAsync(ns, d_ns, n * sizeof(uint32_t), cudaMemcpyDeviceToHost, st);
    cudaMemcpyAsync(sub, d_sub, n * sizeof(uint32_t), cudaMemcpyDeviceToHost, st);
    if (cudaStreamSynchronize(st) != cudaSuccess) return 1;
    std::vector<double> us(n), sus(n);
    for (uint32_t i = 0; i < n; ++i) {
      us[i] = ns[i] / 1000.0;
      sus[i] = sub[i] / 1000.0;
    }
    report(names[r], us);
    report("  of which chi_dev_submit", sus);
  }
  /* GPU->CPU with an 8-byte result: into a buffer of 8 bytes, whose poll
   * also reads the result (chi_dev_wait), and into one of 64. */
  for (uint32_t cap : {8u, 64u}) {
    if (!lat) break;
    k_latency<<<1, 1, 0, st>>>(ctx, CHI_ROUTE_CPU, n / 10, d_ns, d_sub, bad, 8, cap);
    k_latency<<<1, 1, 0, st>>>(ctx, CHI_ROUTE_CPU, n, d_ns, d_sub, bad, 8, cap);
    cudaMemcpyAsync(ns, d_ns, n * sizeof(uint32_t), cudaMemcpyDeviceToHost, st);
    if (cudaStreamSynchronize(st) != cudaSuccess) return 1;
    std::vector<double> us(n);
    for (uint32_t i = 0; i < n; ++i) us[i] = ns[i] / 1000.0;
    report(cap == 8 ? "GPU->CPU 8 B, 8-byte buffer" : "GPU->CPU 8 B, 64-byte buffer", us);
  }
  /* Throughput: many warps on the device (per-thread calls, then the
   * warp-collective ones), 8 threads on the host.  ~1M tasks per row at
   * the default n; rows in flight stay under gpu.device_slots (8192). */
  struct {
    uint32_t warps, lanes, tasks;
    bool warp;
  } shapes[] = {{1056, 1, 1000, false}, {1056, 4, 250, false}, {1056, 4, 250, true},
                {240, 32, 137, true}};
  for (int r = 0; r < 2 && tput; ++r) {
    for (auto &s : shapes) {
      uint32_t tasks = (uint32_t)((uint64_t)s.tasks * n / 20000) + 1;
      double t0 = now_us();
      if (s.warp)
        k_throughput_warp<<<(s.warps + 7) / 8, 256, 0, st>>>(ctx, routes[r], s.lanes, tasks, bad);
      else
        k_throughput<<<(s.warps + 7) / 8, 256, 0, st>>>(ctx, routes[r], s.lanes, tasks, bad);
      if (cudaStreamSynchronize(st) != cudaSuccess) return 1;
      double dt = now_us() - t0;
      double total = (double)((s.warps + 7) / 8 * 8) * s.lanes * tasks;
      printf("%s throughput, %u warps x %u lanes%s: %.2f M tasks/s\n", r ? "GPU->GPU" : "GPU->CPU",
             (s.warps + 7) / 8 * 8, s.lanes, s.warp ? " (warp calls)" : "", total / dt);
    }
  }
  if (tput) {
    const int threads = 8, depth = 16;
    const uint32_t per = n * 5;
    std::atomic<long> errs{0};
    double t0 = now_us();
    std::vector<std::thread> th;
    for (int t = 0; t < threads; ++t)
      th.emplace_back([&] {
        uint8_t in[64] = {2}, out[64];
        chi_future_t f[depth];
        for (uint32_t i = 0; i < per; i += depth) {
          for (int k = 0; k < depth; ++k)
            while (chi_submit(rt, 0, CHI_METHOD_ECHO, in, 64, &f[k]) == CHI_ERR_AGAIN) {
            }
          for (int k = 0; k < depth; ++k) {
            size_t osz;
            if (chi_wait(rt, f[k], 10000000000ll, out, 64, &osz) != CHI_OK) ++errs;
          }
        }
      });
    for (auto &t : th) t.join();
    double dt = now_us() - t0;
    printf("CPU->GPU throughput, %d host threads x %d in flight: %.2f M tasks/s\n", threads, depth,
           threads * (double)((per + depth - 1) / depth * depth) / dt);
    failed += (int)errs.load();
  }
  failed += *bad;
  wd.stop();
  if (chi_finalize(rt) != CHI_OK) ++failed;
  cudaFreeHost(ns);
  cudaFreeHost(sub);
  cudaFree(d_ns);
  cudaFree(d_sub);
  cudaFreeHost(bad);
  cudaStreamDestroy(st);
  printf("gpu_timing: %s\n", failed ? "FAILED tasks" : "all tasks ok");
  return failed ? 1 : 0;
}

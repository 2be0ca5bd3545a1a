/*
 * The orchestrator beside ordinary CUDA code (docs/gpu.md, "Coexisting with
 * other CUDA code"): with the leased orchestrator (gpu.lease_us) device-wide
 * calls from user threads return and nothing hangs, without chi_gpu_pause.
 *
 *   - test_lazy_first_launch: the process sets CUDA_MODULE_LOADING=LAZY before
 *     its first CUDA call; kernels launched for the first time after chi_init
 *     (on the legacy default stream, then from a second thread while host
 *     tasks flow) load and run.
 *   - test_device_wide_idle / test_device_wide_under_load: a thread calls
 *     cudaFree, cudaDeviceSynchronize, legacy-stream cudaMemcpy and
 *     cudaFreeHost in a loop, the runtime idle, then while CPU->GPU tasks
 *     (host threads), GPU->GPU and GPU->CPU tasks (kernels relaunched in a
 *     loop) flow; every task's result and every copy is checked.
 *   - test_library_loop_beside_waiter: allocate, copy, launch, copy back,
 *     check, free in a loop beside a kernel that holds GPU->GPU futures across
 *     several leases before waiting for them, and waits on GPU->CPU tasks.
 *
 * Each call's time is recorded and printed ("# ..." lines: n, p50, p99,
 * max), never asserted: tests do not assert wall-clock bounds.  Exit 77
 * without a usable GPU.  CHI_TEST_LEASE_US sets gpu.lease_us for the run
 * (unset: the library's default); CHI_TEST_SCALE scales the loop counts.
 */
#include "gpu_common.h"

#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

static chi_runtime_t *g_rt;
static chi_dev_context_t g_ctx;
static chi_method_t g_slow_method; /* CPU handler that sleeps 2 ms, then echoes */

static GtWatchdog g_wd;

/* The orchestrator's diag words, sampled every 20 us into a ring while a
 * test runs, so that a slow device-wide call can be explained afterwards:
 * what the keeper decided and where the lease thread was meanwhile. */
struct DiagSample {
  uint64_t at;
  uint64_t w[CHI_DEV_DIAG_WORDS];
};
static std::vector<DiagSample> g_ring(1u << 16);
static std::atomic<uint64_t> g_ring_n{0};
static std::atomic<bool> g_sampling{false};
static std::thread g_sampler;

static void sampler_start(void) {
  const volatile uint64_t *d = gt_diag(&g_ctx);
  if (!d) return;
  g_sampling = true;
  g_sampler = std::thread([d] {
    DiagSample last{};
    while (g_sampling.load()) {
      DiagSample s;
      for (uint32_t i = 0; i < CHI_DEV_DIAG_WORDS; ++i) s.w[i] = d[i];
      s.at = gt_realtime_ns();
      if (memcmp(s.w, last.w, sizeof s.w) != 0) {
        g_ring[g_ring_n.load() & (g_ring.size() - 1)] = s;
        g_ring_n.fetch_add(1);
        last = s;
      }
      struct timespec ts = {0, 20000};
      nanosleep(&ts, NULL);
    }
  });
}

static void sampler_stop(void) {
  g_sampling = false;
  if (g_sampler.joinable()) g_sampler.join();
}

/* Prints the sampled states during [t0, t1] (host realtime), at most `most` lines. */
static void explain_window(const char *what, uint64_t t0, uint64_t t1, int most) {
  const uint64_t n = g_ring_n.load(), size = g_ring.size();
  printf("#   %s took %.1f us; orchestrator states meanwhile:\n", what, (t1 - t0) / 1e3);
  int lines = 0;
  for (uint64_t i = n > size ? n - size : 0; i < n && lines < most; ++i) {
    const DiagSample &s = g_ring[i & (size - 1)];
    if (s.at + 50000 < t0 || s.at > t1) continue;
    printf("#   +%8.1f us  %s\n", ((double)(int64_t)(s.at - t0)) / 1e3,
           gt_diag_line((const volatile uint64_t *)s.w, s.at).c_str());
    ++lines;
  }
}

/* Device-wide calls slower than this get their window explained. */
#define SLOW_CALL_US 5000.0

/* Device timeouts here: a lost task fails in seconds, not the 20 s of GT_WAIT_NS. */
#define WAIT_NS 5000000000ll

static double us_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count();
}

/* Prints n, p50, p99 and max of a series of call times (microseconds). */
static void report(const char *what, std::vector<double> v) {
  if (v.empty()) {
    printf("# %-46s none\n", what);
    return;
  }
  std::sort(v.begin(), v.end());
  printf("# %-46s n=%5zu p50=%9.1f p99=%9.1f max=%9.1f us\n", what, v.size(), v[v.size() / 2],
         v[std::min(v.size() - 1, v.size() * 99 / 100)], v.back());
}

static void sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

static chi_status_t h_slow_echo(chi_request_t *req, void *ud) {
  (void)ud;
  sleep_us(2000);
  if (req->input_size > req->output_capacity) return CHI_ERR_TOO_LARGE;
  memcpy(req->output, req->input, req->input_size);
  req->output_size = req->input_size;
  return CHI_OK;
}

/* ---------------------------------------------------------------- kernels */

/* What a library launches: p[i] = p[i] * 2 + 1. */
__global__ void k_scale(uint32_t *p, uint32_t n) {
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = p[i] * 2u + 1u;
}

/* Launched only in test_lazy_first_launch: their first launch loads them. */
__global__ void k_lazy_a(uint32_t *out, uint32_t v) { out[threadIdx.x] = v + threadIdx.x; }
__global__ void k_lazy_b(uint32_t *out, uint32_t v) { out[threadIdx.x] = v ^ threadIdx.x; }

/* Each thread: `tasks` echo round trips of 64 bytes over `route`, each
 * checked; counts[0] += good, counts[1] += bad, counts[2] += refused
 * (CHI_ERR_AGAIN: a GPU->GPU submit while the orchestrator stepped aside for
 * a device-wide call and did not come back within two leases; not retried,
 * as docs/gpu.md asks: that call may be waiting for this kernel). */
__global__ void k_load(chi_dev_context_t ctx, chi_route_t route, uint32_t tasks, uint64_t seed,
                       unsigned long long *counts) {
  const uint32_t tid = blockIdx.x * blockDim.x + threadIdx.x;
  uint8_t in[64], out[64];
  unsigned long long good = 0, bad = 0, refused = 0;
  for (uint32_t k = 0; k < tasks; ++k) {
    gt_fill(in, 64, seed ^ ((uint64_t)tid << 20) ^ k);
    chi_future_t f;
    uint32_t osz = 0;
    chi_status_t s = chi_dev_submit(&ctx, route, CHI_METHOD_ECHO, in, 64, &f);
    if (s == CHI_ERR_AGAIN) {
      ++refused;
      continue;
    }
    if (s == CHI_OK) s = chi_dev_wait(&ctx, f, WAIT_NS, out, 64, &osz);
    bool ok = s == CHI_OK && osz == 64;
    for (int b = 0; ok && b < 64; ++b) ok = out[b] == in[b];
    if (ok) ++good;
    else ++bad;
  }
  atomicAdd(counts, good);
  atomicAdd(counts + 1, bad);
  atomicAdd(counts + 2, refused);
}

/* The waiter: each thread, `rounds` times, submits a GPU->GPU echo, holds
 * its future for `hold_ns` (several leases), then waits for it; and a
 * GPU->CPU task whose CPU handler takes 2 ms.  counts[0] good, counts[1] bad,
 * counts[2] the first bad status. */
__global__ void k_waiter(chi_dev_context_t ctx, chi_method_t slow, uint32_t rounds, uint64_t hold_ns,
                         unsigned long long *counts) {
  const uint32_t tid = blockIdx.x * blockDim.x + threadIdx.x;
  uint8_t in[64], out[64];
  unsigned long long good = 0, bad = 0, refused = 0;
  for (uint32_t k = 0; k < rounds; ++k) {
    for (int route = 0; route < 2; ++route) {
      gt_fill(in, 64, ((uint64_t)tid << 32) ^ (k * 2u + route));
      chi_future_t f;
      uint32_t osz = 0;
      chi_status_t s = route == 0 ? chi_dev_submit(&ctx, CHI_ROUTE_LOCAL, CHI_METHOD_ECHO, in, 64, &f)
                                  : chi_dev_submit(&ctx, CHI_ROUTE_CPU, slow, in, 64, &f);
      if (s == CHI_ERR_AGAIN && route == 0) {
        /* The orchestrator stepped aside for the library's device-wide call,
         * which waits for this kernel (docs/gpu.md): refused, not retried. */
        ++refused;
        continue;
      }
      if (s == CHI_OK && route == 0) {
        const uint64_t t0 = chi_port::timer_ns();
        while (chi_port::timer_ns() - t0 < hold_ns) __nanosleep(1000);
      }
      if (s == CHI_OK) s = chi_dev_wait(&ctx, f, WAIT_NS, out, 64, &osz);
      bool ok = s == CHI_OK && osz == 64;
      for (int b = 0; ok && b < 64; ++b) ok = out[b] == in[b];
      if (ok) {
        ++good;
      } else {
        ++bad;
        atomicCAS(counts + 2, 0ull, (unsigned long long)(uint32_t)(s == CHI_OK ? -1000 : s));
      }
    }
  }
  atomicAdd(counts, good);
  atomicAdd(counts + 1, bad);
  atomicAdd(counts + 3, refused);
}

/* ------------------------------------------------------------ host loads */

/* CPU->GPU echo round trips until *stop; every result checked. */
static void h2d_load(int id, std::atomic<bool> *stop, std::atomic<long> *ok, std::atomic<long> *bad) {
  uint8_t in[64], out[64];
  uint64_t seq = 0;
  while (!stop->load()) {
    gt_fill(in, 64, (uint64_t)id << 40 | seq++);
    chi_future_t f;
    size_t osz = 0;
    chi_status_t s = chi_submit(g_rt, 0, CHI_METHOD_ECHO, in, 64, &f);
    if (s == CHI_ERR_AGAIN) continue;
    if (s == CHI_OK) s = chi_wait(g_rt, f, GT_WAIT_NS, out, 64, &osz);
    if (s != CHI_OK || osz != 64 || memcmp(in, out, 64) != 0) ++*bad;
    else ++*ok;
  }
}

/* A kernel of device tasks over `route`, relaunched until *stop: the way an
 * application keeps launching work.  counts: device memory, 2 words. */
static void dev_load(chi_route_t route, std::atomic<bool> *stop, unsigned long long *counts,
                     std::atomic<long> *launches) {
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (uint64_t seed = 1; !stop->load(); ++seed) {
    k_load<<<16, 64, 0, s>>>(g_ctx, route, 8, seed * 0x100000001ull + route, counts);
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(s));
    ++*launches;
  }
  CK(cudaStreamDestroy(s));
}

/* One round of the device-wide calls; every copy checked.  Appends each
 * call's time in microseconds. */
struct DeviceWideTimes {
  std::vector<double> free_after_kernel, sync, memcpy_legacy, free_host, free_plain;
  struct Slow {
    const char *what;
    uint64_t t0, t1;
  };
  std::vector<Slow> slow; /* calls over SLOW_CALL_US, host realtime */
  long bad_words = 0; /* checked by the caller (this may run on another thread) */
};

/* Runs one device-wide call, appends its time (us) to `v`, and keeps its
 * window when it was slow. */
template <class F>
static void timed(DeviceWideTimes *t, const char *what, std::vector<double> &v, F call) {
  const uint64_t r0 = gt_realtime_ns();
  auto t0 = std::chrono::steady_clock::now();
  call();
  const double us = us_since(t0);
  v.push_back(us);
  if (us > SLOW_CALL_US && t->slow.size() < 64) t->slow.push_back({what, r0, gt_realtime_ns()});
}

static void device_wide_round(DeviceWideTimes *t, uint32_t round, cudaStream_t s, uint32_t *host) {
  const uint32_t n = 1u << 18; /* 1 MiB of words */
  uint32_t *p;
  CK(cudaMalloc((void **)&p, n * 4));
  for (uint32_t i = 0; i < n; ++i) host[i] = i ^ round;
  CK(cudaMemcpyAsync(p, host, n * 4, cudaMemcpyHostToDevice, s));
  k_scale<<<n / 256, 256, 0, s>>>(p, n);
  CK(cudaGetLastError());
  /* cudaFree right after a kernel on the user's stream: waits for it too. */
  uint32_t *q;
  CK(cudaMalloc((void **)&q, n * 4));
  CK(cudaMemcpyAsync(q, p, n * 4, cudaMemcpyDeviceToDevice, s));
  timed(t, "cudaFree after a kernel", t->free_after_kernel, [&] { CK(cudaFree(p)); });
  timed(t, "cudaDeviceSynchronize", t->sync, [&] { CK(cudaDeviceSynchronize()); });
  memset(host, 0, n * 4);
  timed(t, "cudaMemcpy legacy", t->memcpy_legacy,
        [&] { CK(cudaMemcpy(host, q, n * 4, cudaMemcpyDeviceToHost)); /* legacy default stream */ });
  for (uint32_t i = 0; i < n; i += 97)
    if (host[i] != (i ^ round) * 2u + 1u) ++t->bad_words;
  timed(t, "cudaFree", t->free_plain, [&] { CK(cudaFree(q)); });
  void *pinned;
  CK(cudaMallocHost(&pinned, 1 << 16));
  memset(pinned, 1, 1 << 16);
  timed(t, "cudaFreeHost", t->free_host, [&] { CK(cudaFreeHost(pinned)); });
}

static void report_device_wide(const char *when, const DeviceWideTimes &t) {
  char name[96];
  snprintf(name, sizeof name, "%s: cudaFree after a kernel", when);
  report(name, t.free_after_kernel);
  snprintf(name, sizeof name, "%s: cudaDeviceSynchronize", when);
  report(name, t.sync);
  snprintf(name, sizeof name, "%s: cudaMemcpy D2H 1 MiB, legacy stream", when);
  report(name, t.memcpy_legacy);
  snprintf(name, sizeof name, "%s: cudaFree", when);
  report(name, t.free_plain);
  snprintf(name, sizeof name, "%s: cudaFreeHost", when);
  report(name, t.free_host);
  printf("# %s: %zu call(s) over %.0f us\n", when, t.slow.size(), SLOW_CALL_US);
  for (size_t i = 0; i < t.slow.size() && i < 2; ++i) explain_window(t.slow[i].what, t.slow[i].t0, t.slow[i].t1, 24);
}

/* ------------------------------------------------------------------ tests */

static void test_lazy_first_launch(void **state) {
  (void)state;
  g_wd.enter("test_lazy_first_launch");
  const char *mode = getenv("CUDA_MODULE_LOADING");
  printf("# CUDA_MODULE_LOADING=%s\n", mode ? mode : "(unset)");
  uint32_t *d, h[32];
  CK(cudaMalloc((void **)&d, 32 * 4));
  /* First launch of k_lazy_a, legacy default stream, runtime idle. */
  auto t0 = std::chrono::steady_clock::now();
  k_lazy_a<<<1, 32>>>(d, 1000);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<double> first_idle{us_since(t0)};
  CK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
  for (uint32_t i = 0; i < 32; ++i) assert_int_equal(h[i], 1000 + i);

  /* First launch of k_lazy_b from another thread while host tasks flow. */
  std::atomic<bool> stop{false};
  std::atomic<long> ok{0}, bad{0};
  std::vector<std::thread> th;
  for (int i = 0; i < 2; ++i) th.emplace_back(h2d_load, i, &stop, &ok, &bad);
  sleep_us(20000);
  std::vector<double> first_load;
  std::thread user([&] {
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    auto t1 = std::chrono::steady_clock::now();
    k_lazy_b<<<1, 32, 0, s>>>(d, 77);
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(s));
    first_load.push_back(us_since(t1));
    CK(cudaStreamDestroy(s));
  });
  user.join();
  sleep_us(20000);
  stop = true;
  for (auto &t : th) t.join();
  CK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
  for (uint32_t i = 0; i < 32; ++i) assert_int_equal(h[i], 77u ^ i);
  CK(cudaFree(d));
  report("first launch + sync, idle (legacy stream)", first_idle);
  report("first launch + sync, CPU->GPU load", first_load);
  printf("# CPU->GPU tasks meanwhile: %ld ok, %ld bad\n", ok.load(), bad.load());
  assert_int_equal(bad.load(), 0);
  assert_true(ok.load() > 0);
}

static void test_device_wide_idle(void **state) {
  (void)state;
  g_wd.enter("test_device_wide_idle");
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<uint32_t> host(1u << 18);
  DeviceWideTimes t;
  const long rounds = chi_test_scaled(200);
  for (long r = 0; r < rounds; ++r) device_wide_round(&t, (uint32_t)r, s, host.data());
  CK(cudaStreamDestroy(s));
  report_device_wide("idle", t);
  assert_int_equal(t.bad_words, 0);
  /* The runtime still works afterwards. */
  uint8_t in[64], out[64];
  gt_fill(in, 64, 5);
  chi_future_t f;
  size_t osz = 0;
  assert_status(CHI_OK, chi_submit(g_rt, 0, CHI_METHOD_ECHO, in, 64, &f));
  assert_status(CHI_OK, chi_wait(g_rt, f, GT_WAIT_NS, out, 64, &osz));
  assert_memory_equal(in, out, 64);
}

static void test_device_wide_under_load(void **state) {
  (void)state;
  g_wd.enter("test_device_wide_under_load");
  unsigned long long *counts; /* [0..2] GPU->GPU good, bad, refused; [3..5] GPU->CPU */
  CK(cudaMalloc((void **)&counts, 6 * sizeof(unsigned long long)));
  CK(cudaMemset(counts, 0, 6 * sizeof(unsigned long long)));
  std::atomic<bool> stop{false};
  std::atomic<long> ok{0}, bad{0}, d2d_launches{0}, d2h_launches{0};
  std::vector<std::thread> th;
  for (int i = 0; i < 2; ++i) th.emplace_back(h2d_load, i, &stop, &ok, &bad);
  th.emplace_back(dev_load, CHI_ROUTE_LOCAL, &stop, counts, &d2d_launches);
  th.emplace_back(dev_load, CHI_ROUTE_CPU, &stop, counts + 3, &d2h_launches);
  sleep_us(20000);
  DeviceWideTimes t;
  std::thread user([&] {
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::vector<uint32_t> host(1u << 18);
    const long rounds = chi_test_scaled(200);
    for (long r = 0; r < rounds; ++r) device_wide_round(&t, (uint32_t)r + 7, s, host.data());
    CK(cudaStreamDestroy(s));
  });
  user.join();
  stop = true;
  for (auto &x : th) x.join();
  unsigned long long c[6];
  CK(cudaMemcpy(c, counts, sizeof c, cudaMemcpyDeviceToHost));
  CK(cudaFree(counts));
  report_device_wide("load", t);
  assert_int_equal(t.bad_words, 0);
  printf("# tasks meanwhile: CPU->GPU %ld ok %ld bad; GPU->GPU %llu ok %llu bad %llu refused (%ld kernels); "
         "GPU->CPU %llu ok %llu bad %llu refused (%ld kernels)\n",
         ok.load(), bad.load(), c[0], c[1], c[2], d2d_launches.load(), c[3], c[4], c[5], d2h_launches.load());
  assert_int_equal(bad.load(), 0);
  assert_true(c[1] == 0 && c[4] == 0);
  /* GPU->CPU never depends on the orchestrator: nothing refused there. */
  assert_int_equal(c[5], 0);
  assert_true(ok.load() > 0 && c[0] > 0 && c[3] > 0);
}

static void test_library_loop_beside_waiter(void **state) {
  (void)state;
  g_wd.enter("test_library_loop_beside_waiter");
  unsigned long long *counts;
  CK(cudaMalloc((void **)&counts, 4 * sizeof(unsigned long long)));
  CK(cudaMemset(counts, 0, 4 * sizeof(unsigned long long)));
  cudaStream_t ws;
  CK(cudaStreamCreateWithFlags(&ws, cudaStreamNonBlocking));
  const uint32_t rounds = (uint32_t)chi_test_scaled(10);
  const uint64_t hold_ns = 3000000; /* 3 ms: longer than the default lease */
  std::vector<double> iter_us, free_us;
  const uint32_t n = 1u << 16;
  std::vector<uint32_t> host(n), back(n);
  long iterations = 0, waiters = 0;
  for (int w = 0; w < 3; ++w) {
    k_waiter<<<2, 32, 0, ws>>>(g_ctx, g_slow_method, rounds, hold_ns, counts);
    CK(cudaGetLastError());
    ++waiters;
    /* The library: allocate, copy in, launch, copy out, check, free, on the
     * legacy default stream, as long as the waiter runs. */
    do {
      auto t0 = std::chrono::steady_clock::now();
      uint32_t *p;
      CK(cudaMalloc((void **)&p, n * 4));
      for (uint32_t i = 0; i < n; ++i) host[i] = i * 3u + (uint32_t)iterations;
      CK(cudaMemcpy(p, host.data(), n * 4, cudaMemcpyHostToDevice));
      k_scale<<<n / 256, 256>>>(p, n);
      CK(cudaGetLastError());
      CK(cudaMemcpy(back.data(), p, n * 4, cudaMemcpyDeviceToHost));
      for (uint32_t i = 0; i < n; ++i)
        if (back[i] != host[i] * 2u + 1u) fail_msg("iteration %ld: word %u is %u", iterations, i, back[i]);
      auto t1 = std::chrono::steady_clock::now();
      CK(cudaFree(p));
      free_us.push_back(us_since(t1));
      iter_us.push_back(us_since(t0));
      ++iterations;
    } while (cudaStreamQuery(ws) == cudaErrorNotReady);
  }
  CK(cudaStreamSynchronize(ws));
  CK(cudaStreamDestroy(ws));
  unsigned long long c[4];
  CK(cudaMemcpy(c, counts, sizeof c, cudaMemcpyDeviceToHost));
  CK(cudaFree(counts));
  report("library iteration (malloc..free)", iter_us);
  report("library cudaFree beside a waiting kernel", free_us);
  printf("# waiter kernels: %ld, device futures %llu ok, %llu bad (first bad status %lld), %llu "
         "GPU->GPU submits refused while the orchestrator stood aside; library iterations %ld\n",
         waiters, c[0], c[1], (long long)(int32_t)c[2], c[3], iterations);
  assert_true(c[1] == 0);
  assert_true(c[0] + c[3] == (unsigned long long)waiters * 64ull * rounds * 2ull);
}

/* chi_gpu_pause / chi_gpu_resume still work with the lease, and a paused
 * GPU still lets device-wide calls return. */
static void test_pause_resume_with_lease(void **state) {
  (void)state;
  g_wd.enter("test_pause_resume_with_lease");
  std::atomic<bool> stop{false};
  std::atomic<long> ok{0}, bad{0};
  std::vector<std::thread> th;
  for (int i = 0; i < 2; ++i) th.emplace_back(h2d_load, i, &stop, &ok, &bad);
  for (int i = 0; i < 20; ++i) {
    sleep_us(1500 + 300 * i); /* pauses at varied points of the lease */
    assert_status(CHI_OK, chi_gpu_pause(g_rt, 0));
    CK(cudaDeviceSynchronize());
    assert_status(CHI_OK, chi_gpu_resume(g_rt, 0));
  }
  stop = true;
  for (auto &t : th) t.join();
  assert_int_equal(bad.load(), 0);
  assert_true(ok.load() > 0);
}

int main(void) {
  setvbuf(stdout, NULL, _IONBF, 0);
  /* As a user would: lazy loading chosen before the first CUDA call. */
  setenv("CUDA_MODULE_LOADING", "LAZY", 1);
  /* CHI_TEST_LEASE_US: the lease to test; unset, the library's default. */
  const char *lease = getenv("CHI_TEST_LEASE_US");
  if (lease) setenv("CHI_GPU_LEASE_US", lease, 1);
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    printf("# no CUDA device\n");
    return 77;
  }
  if (int rc = gt_start(&g_rt, &g_ctx)) return rc;
  if (chi_register_handler(g_rt, "test.slow_echo", h_slow_echo, NULL, &g_slow_method) != CHI_OK) return 1;
  printf("# gpu.lease_us: %s\n", lease ? lease : "the library's default");

  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lazy_first_launch),
      cmocka_unit_test(test_device_wide_idle),
      cmocka_unit_test(test_device_wide_under_load),
      cmocka_unit_test(test_library_loop_beside_waiter),
      cmocka_unit_test(test_pause_resume_with_lease),
  };
  g_wd.start(&g_ctx, 120);
  sampler_start();
  int failed = chi_test_run("gpu_coexist", tests);
  sampler_stop();
  g_wd.stop();
  failed += gt_finalize(g_rt);
  return failed ? 1 : 0;
}

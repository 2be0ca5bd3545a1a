/*
 * The CUDA side of the bindings' client GPU tests (Rust tests/gpu_client.rs,
 * Fortran tests/gpu_client.f90): kernels that submit from the device with
 * the context that chi_gpu_context gives a client process (the relay context,
 * docs/server.md "Client kernels"), behind three plain C functions that
 * either language calls.  Built as libchi_bindings_client_kernel.so in CUDA
 * builds (bindings/CMakeLists.txt); the Fortran test links it, the Rust test
 * opens it with dlopen (so that cargo builds the test without nvcc).
 * Every function synchronizes its kernel before it returns: the runtime may
 * be finalized right after.
 */
#include <stdint.h>
#include <string.h>

#include <cuda_runtime.h>

#include "chimaera.h"
#include "chimaera_device.h"

#define CK_API extern "C" __attribute__((visibility("default")))
#define CK_WAIT_NS 20000000000ll

/* The cases of ck_routes, one per thread and iteration in turn.  The binding
 * under test registers `mine`: input a little-endian u64 v, output 3 * v,
 * and it refuses (-1001) a task whose source is not GPU 0. */
enum { C_CPU_ADD, C_CPU_ECHO, C_CPU_MINE, C_CPU_BIG_ECHO, C_ANY_ECHO, C_LOCAL_ADD, C_COUNT };

/* counts[0] right, counts[1] wrong, counts[2] case and counts[3] status of
 * the first wrong one. */
__device__ void note_bad(unsigned long long *counts, int c, chi_status_t s) {
  if (atomicAdd(&counts[1], 1ull) == 0) {
    counts[2] = (unsigned long long)(long long)c;
    counts[3] = (unsigned long long)(long long)s;
  }
}

__device__ uint8_t pattern(uint64_t seed, uint32_t i) { return (uint8_t)((seed * 0x9E3779B97F4A7C15ull + i * 131u) >> 56); }

__global__ void k_routes(chi_dev_context_t ctx, chi_method_t add, chi_method_t echo, chi_method_t mine,
                         uint32_t iters, unsigned long long *counts) {
  const uint32_t tid = blockIdx.x * blockDim.x + threadIdx.x;
  uint8_t in[320], out[320];
  for (uint32_t i = 0; i < iters; ++i) {
    const int c = (int)((tid + i) % C_COUNT);
    const uint64_t a = ((uint64_t)tid << 20) + i, b = 0x1234567ull + i;
    chi_route_t route = CHI_ROUTE_CPU;
    chi_method_t m = add;
    uint32_t n = 16;
    switch (c) {
      case C_CPU_ECHO: m = echo; n = 40; break;
      case C_CPU_MINE: m = mine; n = 8; break;
      case C_CPU_BIG_ECHO: m = echo; n = 300; break;
      case C_ANY_ECHO: route = CHI_ROUTE_GPU_ANY; m = echo; n = 64; break;
      case C_LOCAL_ADD: route = CHI_ROUTE_LOCAL; break;
      default: break;
    }
    if (m == echo) {
      for (uint32_t k = 0; k < n; ++k) in[k] = pattern(a, k);
    } else {
      memcpy(in, &a, 8);
      memcpy(in + 8, &b, 8);
    }
    chi_future_t f;
    uint32_t got = 0;
    chi_status_t s = chi_dev_submit(&ctx, route, m, in, n, &f);
    if (s == CHI_OK) s = chi_dev_wait(&ctx, f, CK_WAIT_NS, out, sizeof out, &got);
    bool right = s == CHI_OK;
    if (right && m == echo) {
      right = got == n;
      for (uint32_t k = 0; right && k < n; ++k) right = out[k] == in[k];
    } else if (right) {
      uint64_t v;
      memcpy(&v, out, 8);
      right = got == 8 && v == (m == mine ? 3 * a : a + b);
    }
    if (right) atomicAdd(&counts[0], 1ull);
    else note_bad(counts, c, s);
  }
}

__device__ uint8_t g_big[1u << 16];

/* Warp 0, lane 0: the refusals, test and release, one status per case in
 * res[0..7] (0 where a case that should succeed did); warp 1: the warp
 * variants on CHI_ROUTE_CPU, res[8] = 0 when every lane's sum was right. */
__global__ void k_edges(chi_dev_context_t ctx, chi_method_t add, chi_method_t mine, int32_t ngpus, int32_t *res) {
  const uint32_t lane = threadIdx.x % 32u, warp = threadIdx.x / 32u;
  uint64_t in[2] = {40, 2};
  uint8_t out[16];
  uint32_t got = 0;
  chi_future_t f;
  if (warp == 0 && lane == 0) {
    res[0] = chi_dev_submit(&ctx, CHI_ROUTE_CPU, 0, in, 16, &f);                /* INVALID: method 0 */
    res[1] = chi_dev_submit(&ctx, -7, add, in, 16, &f);                         /* INVALID: route */
    res[2] = chi_dev_submit(&ctx, CHI_ROUTE_GPU(ngpus), add, in, 16, &f);       /* NO_DEVICE */
    res[3] = chi_dev_submit(&ctx, CHI_ROUTE_CPU, add, g_big, sizeof g_big, &f); /* TOO_LARGE */
    chi_status_t s = chi_dev_submit(&ctx, CHI_ROUTE_CPU, 0x3FFFFF00u, in, 16, &f);
    res[4] = s == CHI_OK ? chi_dev_wait(&ctx, f, CK_WAIT_NS, out, sizeof out, &got) : 100 + s; /* NOT_FOUND */
    s = chi_dev_submit(&ctx, CHI_ROUTE_LOCAL, mine, in, 8, &f); /* the client's own handler on a GPU route */
    res[5] = s == CHI_OK ? chi_dev_wait(&ctx, f, CK_WAIT_NS, out, sizeof out, &got) : 100 + s; /* NOT_FOUND */
    s = chi_dev_submit(&ctx, CHI_ROUTE_CPU, add, in, 16, &f);
    int done = 0;
    while (s == CHI_OK && !done) s = chi_dev_test(&ctx, f, &done);
    if (s == CHI_OK) s = chi_dev_wait(&ctx, f, CK_WAIT_NS, out, sizeof out, &got);
    uint64_t sum = 0;
    memcpy(&sum, out, 8);
    res[6] = s == CHI_OK && got == 8 && sum == 42 ? 0 : 200 + s;
    int rel = 0;
    for (int r = 0; r < 100 && rel == 0; ++r) {
      if (chi_dev_submit(&ctx, CHI_ROUTE_CPU, add, in, 16, &f) != CHI_OK) rel = 300;
      else if (chi_dev_release(&ctx, f) != CHI_OK) rel = 301;
      else if (chi_dev_wait(&ctx, f, 0, out, sizeof out, &got) != CHI_ERR_INVALID) rel = 302; /* consumed */
    }
    res[7] = rel;
  }
  if (warp == 1) {
    uint64_t w[2] = {lane, 1000};
    const bool active = lane % 3 != 2;
    chi_status_t s = chi_dev_warp_submit(&ctx, CHI_ROUTE_CPU, add, w, 16, active, &f);
    chi_status_t s2 = chi_dev_warp_wait(&ctx, f, CK_WAIT_NS, out, sizeof out, &got, active && s == CHI_OK);
    uint64_t v = 0;
    memcpy(&v, out, 8);
    const int bad = active && (s != CHI_OK || s2 != CHI_OK || got != 8 || v != lane + 1000);
    const int any = __any_sync(0xFFFFFFFFu, bad);
    if (lane == 0) res[8] = any ? 1 : 0;
  }
}

/* Runs launch(stream, host) on a non-blocking stream of its own on CUDA
 * device gpu and waits for it; *host (bytes of mapped pinned memory, zeroed)
 * is where the kernel writes: no copy that could wait behind the relay's
 * own kernels. */
template <typename Launch>
static int32_t run_on(int32_t gpu, size_t bytes, void **host, Launch launch) {
  cudaError_t e = cudaSetDevice(gpu);
  cudaStream_t st = NULL;
  if (e == cudaSuccess) e = cudaHostAlloc(host, bytes, cudaHostAllocMapped);
  if (e != cudaSuccess) return (int32_t)e;
  memset(*host, 0, bytes);
  e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  if (e == cudaSuccess) {
    launch(st, *host);
    e = cudaGetLastError();
    cudaError_t e2 = cudaStreamSynchronize(st);
    if (e == cudaSuccess) e = e2;
    cudaStreamDestroy(st);
  }
  return (int32_t)e;
}

/* CUDA devices this process sees (0 when there is no driver or no GPU). */
CK_API int32_t ck_device_count(void) {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

/* blocks x threads threads each submit iters tasks from CUDA device gpu with
 * *ctx, the cases above in turn, and check every result.  counts[4]: right,
 * wrong, case and status of the first wrong one.  Returns the cudaError_t of
 * the launch (0: the kernel ran). */
CK_API int32_t ck_routes(const chi_dev_context_t *ctx, int32_t gpu, uint32_t add, uint32_t echo, uint32_t mine,
                         uint32_t blocks, uint32_t threads, uint32_t iters, int64_t counts[4]) {
  void *host = NULL;
  const chi_dev_context_t c = *ctx;
  const int32_t e = run_on(gpu, 4 * sizeof(unsigned long long), &host, [&](cudaStream_t st, void *p) {
    k_routes<<<blocks, threads, 0, st>>>(c, add, echo, mine, iters, (unsigned long long *)p);
  });
  if (host) {
    memcpy(counts, host, 4 * sizeof(int64_t));
    cudaFreeHost(host);
  }
  return e;
}

/* The refusals and the rest (k_edges) from CUDA device gpu; ngpus is the
 * server's GPU count.  res[9]: the statuses, in order: INVALID (method 0),
 * INVALID (route -7), NO_DEVICE (GPU ngpus), TOO_LARGE (64 KiB input),
 * NOT_FOUND (unknown method, at the wait), NOT_FOUND (`mine` on
 * CHI_ROUTE_LOCAL, at the wait), then 0 for test-then-wait, release, and the
 * warp variants.  Returns the cudaError_t of the launch. */
CK_API int32_t ck_edges(const chi_dev_context_t *ctx, int32_t gpu, uint32_t add, uint32_t mine, int32_t ngpus,
                        int32_t res[9]) {
  void *host = NULL;
  const chi_dev_context_t c = *ctx;
  const int32_t e = run_on(gpu, 9 * sizeof(int32_t), &host, [&](cudaStream_t st, void *p) {
    for (int i = 0; i < 9; ++i) ((int32_t *)p)[i] = 999;
    k_edges<<<1, 64, 0, st>>>(c, add, mine, ngpus, (int32_t *)p);
  });
  if (host) {
    memcpy(res, host, 9 * sizeof(int32_t));
    cudaFreeHost(host);
  }
  return e;
}

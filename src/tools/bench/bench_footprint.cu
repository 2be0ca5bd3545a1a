// Footprint rows: what a GPU's orchestrator costs other kernels.  A
// grid-filling FMA kernel (8 blocks of 256 threads per SM, 8 waves) and a
// 256 MiB device-to-device copy kernel, each timed with events (median of
// kFootprintReps launches): with the orchestrator paused (the floor row),
// beside the idle orchestrator, and while a host thread keeps CPU->GPU echo
// tasks flowing to it.  The ratio column is the cost (1.02x: 2%).
#include "bench_footprint.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <thread>
#include <vector>

namespace {

constexpr int kFootprintReps = 7;
constexpr uint32_t kFmaIters = 16384;
constexpr uint32_t kFmaBlocksPerSm = 8 * 8;  // 8 resident blocks of 256 threads, 8 waves
constexpr size_t kCopyBytes = size_t(256) << 20;

__global__ void k_fma(float *sink, uint32_t iters) {
  float a = threadIdx.x * 1e-3f, b = 1.000001f, c = 0.999999f, d = blockIdx.x * 1e-4f;
  for (uint32_t i = 0; i < iters; ++i) {
    a = fmaf(a, b, c);
    b = fmaf(b, c, d);
    c = fmaf(c, d, a);
    d = fmaf(d, a, b);
  }
  if (a + b + c + d == 1234.5f) sink[0] = a; /* never true: keeps the work */
}

__global__ void k_copy(const uint4 *src, uint4 *dst, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}

struct Buffers {
  float *sink = nullptr;
  uint4 *src = nullptr, *dst = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t a = nullptr, b = nullptr;
};

// Median milliseconds of kFootprintReps launches of kernel `which` (0 FMA, 1 copy).
bool time_kernel(const Buffers &m, int sms, int which, double *ms) {
  std::vector<double> v;
  for (int r = 0; r < kFootprintReps; ++r) {
    cudaEventRecord(m.a, m.stream);
    if (which == 0)
      k_fma<<<uint32_t(sms) * kFmaBlocksPerSm, 256, 0, m.stream>>>(m.sink, kFmaIters);
    else
      k_copy<<<uint32_t(sms) * 8u, 256, 0, m.stream>>>(m.src, m.dst, kCopyBytes / sizeof(uint4));
    cudaEventRecord(m.b, m.stream);
    if (cudaStreamSynchronize(m.stream) != cudaSuccess) return false;
    float t = 0;
    cudaEventElapsedTime(&t, m.a, m.b);
    v.push_back(t);
  }
  std::sort(v.begin(), v.end());
  *ms = v[v.size() / 2];
  return cudaGetLastError() == cudaSuccess;
}

// A host thread's CPU->GPU echo tasks, 16 in flight, until *stop.
void h2d_load(chi_runtime_t *rt, int32_t gpu, const std::atomic<bool> *stop, std::atomic<uint64_t> *done) {
  chi_future_t f[16];
  uint8_t in[64] = {1}, out[64];
  size_t n = 0;
  int k = 0;
  for (; k < 16; ++k)
    if (chi_submit(rt, CHI_ROUTE_GPU(gpu), CHI_METHOD_ECHO, in, sizeof in, &f[k]) != CHI_OK) break;
  const int window = k;
  for (uint64_t i = 0; window > 0 && !stop->load(std::memory_order_relaxed); ++i) {
    chi_future_t &x = f[i % window];
    if (chi_wait(rt, x, 10000000000ll, out, sizeof out, &n) != CHI_OK) break;
    done->fetch_add(1, std::memory_order_relaxed);
    if (chi_submit(rt, CHI_ROUTE_GPU(gpu), CHI_METHOD_ECHO, in, sizeof in, &x) != CHI_OK) return;
  }
  for (int j = 0; j < window; ++j) chi_wait(rt, f[j], 10000000000ll, out, sizeof out, &n);
}

void fill(chi_bench_row *r, double ms, const char *floor, const char *what) {
  r->count = kFootprintReps;
  r->p50_ns = ms * 1e6;
  r->threads = 1;
  std::snprintf(r->floor, sizeof r->floor, "%s", floor);
  std::snprintf(r->method, sizeof r->method, "%s", what);
}

}  // namespace

int chi_bench_footprint_rows(chi_runtime_t *rt, int32_t gpu, int ordinal, chi_bench_row *rows, int max_rows) {
  if (max_rows < 6) return 0;
  int sms = 0;
  Buffers m;
  cudaSetDevice(ordinal);
  cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ordinal);
  // Allocation, the first launches (module loading) and the frees with the
  // orchestrator paused: they may wait for every kernel.
  if (chi_gpu_pause(rt, gpu) != CHI_OK) {
    chi_bench_row_init(&rows[0], "footprint.setup", CHI_BENCH_FLOOR);
    chi_bench_row_fail(&rows[0], CHI_ERR_INTERNAL, "chi_gpu_pause: %s", chi_last_error_message());
    return 1;
  }
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaMalloc(&m.sink, sizeof(float));
  if (e == cudaSuccess) e = cudaMalloc(&m.src, kCopyBytes);
  if (e == cudaSuccess) e = cudaMalloc(&m.dst, kCopyBytes);
  if (e == cudaSuccess) e = cudaMemsetAsync(m.src, 1, kCopyBytes, m.stream);
  if (e == cudaSuccess) e = cudaEventCreate(&m.a);
  if (e == cudaSuccess) e = cudaEventCreate(&m.b);
  struct Row {
    const char *name, *floor, *what;
    int kernel;
    int when;  // 0 alone (paused), 1 beside the idle orchestrator, 2 under CPU->GPU load
  };
  const Row plan[] = {{"footprint.fma alone", "", "fma", 0, 0},
                      {"footprint.copy alone", "", "copy 256MiB", 1, 0},
                      {"footprint.fma +idle orch", "footprint.fma alone", "fma", 0, 1},
                      {"footprint.copy +idle orch", "footprint.copy alone", "copy 256MiB", 1, 1},
                      {"footprint.fma +loaded orch", "footprint.fma alone", "fma", 0, 2},
                      {"footprint.copy +loaded orch", "footprint.copy alone", "copy 256MiB", 1, 2}};
  int n = 0;
  double warm = 0;
  bool ok = e == cudaSuccess && time_kernel(m, sms, 0, &warm) && time_kernel(m, sms, 1, &warm);
  bool paused = true;
  for (const Row &p : plan) {
    chi_bench_row *r = &rows[n++];
    chi_bench_row_init(r, p.name, p.when == 0 ? CHI_BENCH_FLOOR : CHI_BENCH_PEER);
    if (!ok) {
      chi_bench_row_fail(r, CHI_ERR_INTERNAL, "setting up: %s", cudaGetErrorString(e));
      continue;
    }
    if (p.when > 0 && paused) {
      if (chi_gpu_resume(rt, gpu) != CHI_OK) {
        chi_bench_row_fail(r, CHI_ERR_INTERNAL, "chi_gpu_resume: %s", chi_last_error_message());
        continue;
      }
      paused = false;
    }
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> done{0};
    std::thread load;
    if (p.when == 2) load = std::thread(h2d_load, rt, gpu, &stop, &done);
    double ms = 0;
    const bool timed = time_kernel(m, sms, p.kernel, &ms);
    stop = true;
    if (load.joinable()) load.join();
    if (!timed) {
      chi_bench_row_fail(r, CHI_ERR_INTERNAL, "kernel failed: %s", cudaGetErrorString(cudaGetLastError()));
      continue;
    }
    fill(r, ms, p.floor, p.what);
    if (p.when == 2) r->throughput = double(done.load()) / (ms * kFootprintReps * 1e-3);
  }
  if (paused || chi_gpu_pause(rt, gpu) == CHI_OK) {
    cudaStreamSynchronize(m.stream);
    cudaFree(m.sink);
    cudaFree(m.src);
    cudaFree(m.dst);
    if (m.a) cudaEventDestroy(m.a);
    if (m.b) cudaEventDestroy(m.b);
    if (m.stream) cudaStreamDestroy(m.stream);
  }
  chi_gpu_resume(rt, gpu);
  cudaGetLastError();
  return n;
}

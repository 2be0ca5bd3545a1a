// chimaera-bench's GPU rows: the raw floors of docs/performance.md measured on GPU 0
// (flag ping-pongs through pinned and device memory, GPU->CPU calls from many
// warps) and what users do today (kernel launch, graph launch,
// cudaLaunchHostFunc), then every GPU route through the public API with
// chi.echo: CPU->GPU from host threads, GPU->CPU and GPU->GPU from kernels,
// one task at a time (latency) and from 1, 32 and 8-per-SM warps (throughput).
// For --server runs, the GPU->CPU and GPU->GPU latency rows and their floors
// in an embedded runtime, and the same rows from a kernel of a client process.
//
// The orchestrators are paused while the floors run and while this file's
// kernels are first launched (see preload) and freed: a persistent kernel and
// device-wide waits do not mix.  Every spin loop, on either side, has a
// timeout, so a broken route fails its row instead of hanging the GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda/atomic>
#include <string>
#include <thread>
#include <vector>

#include "bench_gpu.h"
#include "bench_footprint.h"
#include "chimaera_device.h"
#include "chimaera/device_diag.h"
#include "cpu_routes.h"
#include "tool_util.h"

namespace {

constexpr const char *kCpuGpuFloor = "floor.cpu_gpu_pingpong";
constexpr const char *kGpuCpuFloor = "floor.gpu_cpu_pingpong";
constexpr const char *kGpuGpuFloor = "floor.gpu_block_pingpong";

// docs/performance.md targets.
constexpr double kCpuGpuTargetP50Ns = 4000.0;
constexpr double kCpuGpuTargetTput = 5e6;
constexpr double kGpuCpuTargetP50Ns = 4000.0;
constexpr double kGpuCpuTargetTput = 30e6;
constexpr double kGpuGpuTargetP50Ns = 2000.0;
constexpr double kGpuGpuTargetTput = 100e6;

constexpr int64_t kWaitTimeoutNs = 10'000'000'000;
// Floors: how long either side of a ping-pong waits for the other.
constexpr double kSpinTimeoutS = 2.0;
constexpr uint64_t kHostSpinTimeoutNs = 2'000'000'000;
// Routes: how long a lane retries a submit that found every slot busy.
constexpr uint64_t kAgainTimeoutNs = 2'000'000'000;
// A client kernel's latency rows stop after this much (warm-up included):
// time-sliced against the server's orchestrator without MPS, a GPU->GPU
// round trip can take milliseconds.
constexpr uint64_t kClientBudgetNs = 20'000'000'000;
// ... and at most this many warm-up round trips.
constexpr uint64_t kClientWarmup = 200;
// GPU->CPU calls per warp in the many-warp floor (as probes/limits.cu).
constexpr unsigned kFloorCallsPerWarp = 2000;
// Latency-under-load samples kept per warp in throughput rows.
constexpr uint32_t kSamplesPerWarp = 64;
constexpr uint32_t kSampleEveryRound = 16;
constexpr unsigned kFullMask = 0xFFFFFFFFu;
constexpr uint32_t kWarpsPerSm = 8;  // 1056 warps on 132 SMs (docs/performance.md)

// A kernel's clock64 and globaltimer at the start and end of its timed part:
// cycles * (g1 - g0) / (c1 - c0) is nanoseconds at the clock the SM ran.
struct Span {
  unsigned long long c0, c1, g0, g1;
};

double ns_per_cycle(const Span &s, double fallback) {
  if (s.c1 > s.c0 && s.g1 > s.g0) return double(s.g1 - s.g0) / double(s.c1 - s.c0);
  return fallback;
}

__device__ unsigned long long gtimer() { return chi_port::timer_ns(); }

// ------------------------------------------------------------------ floors

__global__ void k_empty() {}

// CPU -> persistent GPU thread -> CPU through two pinned words.
__global__ void k_pong_host(unsigned *req, unsigned *rsp, unsigned n, long long timeout,
                            unsigned *fault) {
  if (threadIdx.x != 0 || blockIdx.x != 0 || n == 0) return;
  cuda::atomic_ref<unsigned, cuda::thread_scope_system> r(*req), s(*rsp);
  for (unsigned i = 1; i <= n; ++i) {
    const long long t0 = clock64();
    while (r.load(cuda::memory_order_acquire) != i)
      if (clock64() - t0 > timeout) {
        *fault = 1;
        return;
      }
    s.store(i, cuda::memory_order_release);
  }
}

// Two blocks bounce a flag through device memory; block 0 times each round trip.
__global__ void k_block_pingpong(unsigned *a, unsigned *b, unsigned n, unsigned warm,
                                 long long timeout, unsigned long long *samples, Span *span,
                                 unsigned *fault) {
  if (threadIdx.x != 0 || blockIdx.x > 1 || n == 0) return;
  cuda::atomic_ref<unsigned, cuda::thread_scope_device> fa(*a), fb(*b);
  long long c_start = clock64();
  unsigned long long g_start = gtimer();
  for (unsigned i = 1; i <= n; ++i) {
    if (blockIdx.x == 0) {
      if (i == warm + 1) {
        c_start = clock64();
        g_start = gtimer();
      }
      const long long t0 = clock64();
      fa.store(i, cuda::memory_order_release);
      while (fb.load(cuda::memory_order_acquire) != i)
        if (clock64() - t0 > timeout) {
          *fault = 1;
          return;
        }
      const long long t1 = clock64();
      if (i > warm) samples[i - warm - 1] = static_cast<unsigned long long>(t1 - t0);
    } else {
      const long long t0 = clock64();
      while (fa.load(cuda::memory_order_acquire) != i)
        if (clock64() - t0 > timeout) {
          *fault = 1;
          return;
        }
      fb.store(i, cuda::memory_order_release);
    }
  }
  if (blockIdx.x == 0)
    *span = Span{static_cast<unsigned long long>(c_start),
                 static_cast<unsigned long long>(clock64()), g_start, gtimer()};
}

// One thread on each of two GPUs bounces a word over peer memory: each
// writes the other's flag (in the other GPU's memory) and polls its own.
// The side on the first GPU times each round trip with %globaltimer.
__global__ void k_peer_ping(unsigned *mine, unsigned *theirs, unsigned n, unsigned warm, unsigned long long timeout_ns,
                            unsigned long long *samples, unsigned *fault) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  cuda::atomic_ref<unsigned, cuda::thread_scope_system> me(*mine), them(*theirs);
  for (unsigned i = 1; i <= n; ++i) {
    const unsigned long long t0 = gtimer();
    them.store(i, cuda::memory_order_release);
    while (me.load(cuda::memory_order_acquire) != i)
      if (gtimer() - t0 > timeout_ns) {
        *fault = 1;
        return;
      }
    if (i > warm) samples[i - warm - 1] = gtimer() - t0;
  }
}
__global__ void k_peer_pong(unsigned *mine, unsigned *theirs, unsigned n, unsigned long long timeout_ns,
                            unsigned *fault) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  cuda::atomic_ref<unsigned, cuda::thread_scope_system> me(*mine), them(*theirs);
  for (unsigned i = 1; i <= n; ++i) {
    const unsigned long long t0 = gtimer();
    while (me.load(cuda::memory_order_acquire) != i)
      if (gtimer() - t0 > timeout_ns) {
        *fault = 1;
        return;
      }
    them.store(i, cuda::memory_order_release);
  }
}

// GPU warp -> CPU thread -> GPU: each warp's lane 0 owns one pinned slot.
struct alignas(64) CallSlot {
  unsigned req;
  unsigned rsp;
  unsigned long long arg;
  unsigned long long ret;
};

struct CallsOut {
  unsigned long long t_start;  // globaltimer: first warp past warm-up
  unsigned long long t_end;    // last warp done
  unsigned long long bad;      // wrong answers
  unsigned fault;              // a wait timed out
};

__global__ void k_gpu_calls(CallSlot *slots, unsigned nwarps, unsigned calls, unsigned warm,
                            long long timeout, unsigned long long *samples, Span *span,
                            CallsOut *out) {
  if (threadIdx.x % 32u != 0u) return;
  const unsigned w = (blockIdx.x * blockDim.x + threadIdx.x) / 32u;
  if (w >= nwarps || calls == 0) return;
  CallSlot &s = slots[w];
  cuda::atomic_ref<unsigned, cuda::thread_scope_system> req(s.req), rsp(s.rsp);
  long long c_start = clock64();
  unsigned long long g_start = gtimer();
  for (unsigned i = 1; i <= warm + calls; ++i) {
    if (i == warm + 1) {
      c_start = clock64();
      g_start = gtimer();
      atomicMin(&out->t_start, g_start);
    }
    const long long t0 = clock64();
    s.arg = static_cast<unsigned long long>(w) * 1000003ull + i;
    req.store(i, cuda::memory_order_release);
    while (rsp.load(cuda::memory_order_acquire) != i) {
      if (clock64() - t0 > timeout) {
        out->fault = 1;
        return;
      }
      __nanosleep(64);
    }
    const long long t1 = clock64();
    if (s.ret != s.arg * 2 + 1) atomicAdd(&out->bad, 1ull);
    if (samples && w == 0 && i > warm)
      samples[i - warm - 1] = static_cast<unsigned long long>(t1 - t0);
  }
  atomicMax(&out->t_end, gtimer());
  if (span && w == 0)
    *span = Span{static_cast<unsigned long long>(c_start),
                 static_cast<unsigned long long>(clock64()), g_start, gtimer()};
}

// ------------------------------------------------------------------ routes

enum : uint32_t { kWhereSubmit = 1, kWhereWait = 2, kWhereEcho = 3, kWhereAgain = 4 };

struct RouteOut {
  uint32_t where;  // first failure (kWhere*), 0: none
  int32_t status;
  unsigned long long index;
  uint32_t abort;
  uint32_t pad;
  unsigned long long done;
  unsigned long long again;  // submits answered CHI_ERR_AGAIN (retried)
  unsigned long long t_start, t_end;
  Span span;  // latency kernel's timed part
};

__device__ void route_failed(RouteOut *o, uint32_t where, chi_status_t s, unsigned long long idx) {
  if (atomicCAS(&o->where, 0u, where) == 0u) {
    o->status = s;
    o->index = idx;
  }
  chi_port::st_relaxed_dev(&o->abort, 1u);
}

// Input of task `seq` from lane `who`: distinct per task, so an echo that
// returned another task's bytes is caught.
__device__ void fill_input(uint8_t *p, uint32_t n, unsigned long long who, unsigned long long seq) {
  for (uint32_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(0xA5u ^ (i * 37u));
  const unsigned long long words[2] = {seq, who};
  const uint8_t *w = reinterpret_cast<const uint8_t *>(words);
  for (uint32_t i = 0; i < n && i < 16u; ++i) p[i] = w[i];
}

__device__ bool same_bytes(const uint8_t *a, const uint8_t *b, uint32_t n) {
  for (uint32_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return false;
  return true;
}

// One thread: warm + iters round trips (submit, wait), each timed in SM
// cycles, or with `gt` in %globaltimer ns: a kernel time-sliced against
// another process's context may resume on another SM, whose clock64 is not
// this one's.  budget_ns > 0 ends the run at the first round trip that
// starts past it; out->done counts the timed ones.
__global__ void k_route_latency(chi_dev_context_t ctx, chi_route_t route, uint32_t payload,
                                uint8_t *buf, uint32_t stride, unsigned long long warm,
                                unsigned long long iters, bool gt, unsigned long long budget_ns,
                                unsigned long long *samples, RouteOut *out) {
  if (threadIdx.x != 0 || blockIdx.x != 0 || iters == 0) return;
  uint8_t *in = buf, *got = buf + stride;
  const unsigned long long g_begin = gtimer();
  long long c_start = clock64();
  unsigned long long g_start = g_begin;
  unsigned long long i = 0;
  for (; i < warm + iters; ++i) {
    if (i == warm) {
      c_start = clock64();
      g_start = gtimer();
    }
    if (budget_ns != 0 && gtimer() - g_begin > budget_ns) break;
    fill_input(in, payload, 0, i);
    const long long t0 = clock64();
    const unsigned long long n0 = gt ? gtimer() : 0;
    chi_future_t f = 0;
    chi_status_t s = chi_dev_submit(&ctx, route, CHI_METHOD_ECHO, in, payload, &f);
    if (s != CHI_OK) return route_failed(out, kWhereSubmit, s, i);
    uint32_t n = 0;
    s = chi_dev_wait(&ctx, f, kWaitTimeoutNs, got, stride, &n);
    const long long t1 = clock64();
    const unsigned long long n1 = gt ? gtimer() : 0;
    if (s != CHI_OK) return route_failed(out, kWhereWait, s, i);
    if (n != payload || !same_bytes(in, got, payload))
      return route_failed(out, kWhereEcho, CHI_ERR_INTERNAL, i);
    if (i >= warm) samples[i - warm] = gt ? n1 - n0 : static_cast<unsigned long long>(t1 - t0);
  }
  out->span = Span{static_cast<unsigned long long>(c_start),
                   static_cast<unsigned long long>(clock64()), g_start, gtimer()};
  out->done = i > warm ? i - warm : 0;
}

// Every warp below nwarps: lanes below `lanes` each run `per_lane` tasks, a
// round at a time (warp submit, then warp wait); a lane whose submit found
// no slot retries in the next round.
__global__ void k_route_tput(chi_dev_context_t ctx, chi_route_t route, uint32_t payload,
                             uint8_t *scratch, uint32_t stride, uint32_t nwarps, uint32_t lanes,
                             uint32_t per_lane, unsigned long long *samples, Span *spans,
                             RouteOut *out) {
  const uint32_t lane = threadIdx.x % 32u;
  const uint32_t gw = (blockIdx.x * blockDim.x + threadIdx.x) / 32u;
  if (gw >= nwarps || per_lane == 0) return;
  const bool active = lane < lanes;
  uint8_t *in = scratch + (static_cast<size_t>(gw) * 32u + lane) * 2u * stride;
  uint8_t *got = in + stride;
  const unsigned long long who = (static_cast<unsigned long long>(gw) << 8) | lane;
  uint32_t left = active ? per_lane : 0u;
  unsigned long long seq = 0, done = 0, again = 0, again_since = 0;
  chi_future_t f = 0;
  uint32_t round = 0, nsamples = 0;
  bool stop = false;
  const long long c_start = clock64();
  const unsigned long long g_start = gtimer();
  if (lane == 0) atomicMin(&out->t_start, g_start);
  for (;;) {
    const bool want = left > 0 && f == 0 && !stop;
    if (!__any_sync(kFullMask, want || f != 0)) break;
    const long long r0 = clock64();
    if (want) fill_input(in, payload, who, seq);
    chi_future_t nf = 0;
    const chi_status_t sub =
        chi_dev_warp_submit(&ctx, route, CHI_METHOD_ECHO, in, payload, want ? 1 : 0, &nf);
    if (want) {
      if (sub == CHI_OK) {
        f = nf;
        again_since = 0;
      } else if (sub == CHI_ERR_AGAIN) {
        ++again;
        const unsigned long long now = gtimer();
        if (again_since == 0)
          again_since = now;
        else if (now - again_since > kAgainTimeoutNs) {
          route_failed(out, kWhereAgain, sub, seq);
          stop = true;
        }
      } else {
        route_failed(out, kWhereSubmit, sub, seq);
        stop = true;
      }
    }
    const bool have = f != 0;
    uint32_t n = 0;
    const chi_status_t s =
        chi_dev_warp_wait(&ctx, f, kWaitTimeoutNs, got, stride, &n, have ? 1 : 0);
    if (have) {
      f = 0;
      if (s != CHI_OK) {
        route_failed(out, kWhereWait, s, seq);
        stop = true;
      } else if (n != payload || !same_bytes(in, got, payload)) {
        route_failed(out, kWhereEcho, CHI_ERR_INTERNAL, seq);
        stop = true;
      } else {
        ++done;
        ++seq;
        --left;
      }
    }
    if (want && sub == CHI_ERR_AGAIN && !have) __nanosleep(500);
    if (lane == 0 && round % kSampleEveryRound == 0 && nsamples < kSamplesPerWarp)
      samples[static_cast<size_t>(gw) * kSamplesPerWarp + nsamples++] =
          static_cast<unsigned long long>(clock64() - r0);
    ++round;
    const int halt = lane == 0 ? static_cast<int>(chi_port::ld_relaxed_dev(&out->abort)) : 0;
    if (__any_sync(kFullMask, stop) || __shfl_sync(kFullMask, halt, 0)) stop = true;
  }
  // Per-warp sums, one atomic each.
  for (int o = 16; o > 0; o /= 2) {
    done += __shfl_down_sync(kFullMask, done, o);
    again += __shfl_down_sync(kFullMask, again, o);
  }
  if (lane == 0) {
    atomicAdd(&out->done, done);
    atomicAdd(&out->again, again);
    atomicMax(&out->t_end, gtimer());
    spans[gw] = Span{static_cast<unsigned long long>(c_start),
                     static_cast<unsigned long long>(clock64()), g_start, gtimer()};
    // Unused sample slots stay 0 and are dropped on the host.
    for (uint32_t k = nsamples; k < kSamplesPerWarp; ++k)
      samples[static_cast<size_t>(gw) * kSamplesPerWarp + k] = 0;
  }
}

// --------------------------------------------------------------- host side

std::string cuda_msg(const char *what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorString(e);
}

// Hands out rows until max_rows is reached.
struct Rows {
  chi_bench_row *rows;
  int max;
  int n = 0;
  chi_bench_row *next(const char *name, int kind) {
    if (n >= max) return nullptr;
    chi_bench_row *r = &rows[n++];
    chi_bench_row_init(r, name, kind);
    return r;
  }
};

struct Gpu {
  int32_t id = 0;
  int ordinal = -1;
  int sms = 1;
  double nominal_ns_per_cycle = 1.0;
  long long timeout_cycles = 0;
  chi_dev_context_t ctx{};
  uint32_t slots = 32;       // GPU->GPU and GPU->CPU slots (gpu.device_slots)
  uint32_t max_payload = 0;  // gpu.max_payload
  cudaStream_t stream = nullptr;
  uint8_t *scratch = nullptr;  // route kernels' inputs and outputs
  unsigned long long *samples = nullptr;
  Span *spans = nullptr;
  RouteOut *out = nullptr;
  std::string error;
  chi_status_t error_status = CHI_ERR_INTERNAL;  // of `error`, for the route rows
};

// Memory of the floors (GPU 0 only).
struct FloorMem {
  uint8_t *pinned = nullptr;   // flags and call slots, mapped
  unsigned *dflags = nullptr;  // block ping-pong flags, device
  CallsOut *calls_out = nullptr;
  unsigned *fault = nullptr;  // device
};

uint32_t max_warps(const Gpu &g) { return kWarpsPerSm * uint32_t(g.sms); }
uint32_t stride_of(uint32_t payload) { return (std::max<uint32_t>(payload, 1u) + 15u) & ~15u; }

// Grid for `warps` warps spread over the SMs.
void grid_for(const Gpu &g, uint32_t warps, uint32_t *blocks, uint32_t *threads) {
  uint32_t per_block = (warps + uint32_t(g.sms) - 1) / uint32_t(g.sms);
  *threads = 32u * per_block;
  *blocks = (warps + per_block - 1) / per_block;
}

void setup(chi_runtime_t *rt, const chi_bench_options &opt, Gpu *g) {
  chi_status_t st = chi_gpu_context(rt, g->id, &g->ctx);
  if (st != CHI_OK) {
    g->error =
        std::string("chi_gpu_context: ") + chi_status_string(st) + ": " + chi_last_error_message();
    g->error_status = st;
    return;
  }
  const auto *l = reinterpret_cast<const chi_dev_ctx_layout_t *>(&g->ctx);
  g->slots = l->slots;
  g->max_payload = l->max_payload;
  // Device memory of the context's GPU (a client's relay context has no d2d_*).
  cudaPointerAttributes a{};
  cudaError_t e = cudaPointerGetAttributes(&a, l->d2d_state ? static_cast<const void *>(l->d2d_state)
                                                            : static_cast<const void *>(l->d2h_state));
  if (e == cudaSuccess) g->ordinal = a.device;
  if (e == cudaSuccess) e = cudaSetDevice(g->ordinal);
  int khz = 0;
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&g->sms, cudaDevAttrMultiProcessorCount, g->ordinal);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, g->ordinal);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking);
  // Rows whose payload is over gpu.max_payload are refused before any launch.
  const uint32_t stride = stride_of(std::min(opt.payload, g->max_payload));
  const size_t warps = max_warps(*g);
  if (e == cudaSuccess) e = cudaMalloc(&g->scratch, warps * 32u * 2u * stride);
  if (e == cudaSuccess)
    e = cudaMalloc(&g->samples, sizeof(unsigned long long) *
                                    std::max<size_t>(opt.iters, warps * kSamplesPerWarp));
  if (e == cudaSuccess) e = cudaMalloc(&g->spans, sizeof(Span) * warps);
  if (e == cudaSuccess) e = cudaMalloc(&g->out, sizeof(RouteOut));
  if (e != cudaSuccess) {
    g->error = cuda_msg("setting up GPU buffers", e);
    return;
  }
  if (khz > 0) g->nominal_ns_per_cycle = 1e6 / khz;
  g->timeout_cycles = static_cast<long long>(kSpinTimeoutS * 1e3 * (khz > 0 ? khz : 2000000));
}

// The first launch of a kernel may load its module, and under CUDA's lazy
// loading that can wait for every running kernel, the orchestrators
// included, which wait for nobody: so each kernel runs once, with nothing to
// do, while the orchestrators are paused (the caller's job).
void preload(Gpu &g) {
  if (!g.error.empty()) return;
  cudaSetDevice(g.ordinal);
  k_empty<<<1, 1, 0, g.stream>>>();
  k_pong_host<<<1, 1, 0, g.stream>>>(nullptr, nullptr, 0, 0, nullptr);
  k_block_pingpong<<<1, 32, 0, g.stream>>>(nullptr, nullptr, 0, 0, 0, nullptr, nullptr, nullptr);
  k_gpu_calls<<<1, 32, 0, g.stream>>>(nullptr, 0, 0, 0, 0, nullptr, nullptr, nullptr);
  k_route_latency<<<1, 32, 0, g.stream>>>(g.ctx, CHI_ROUTE_LOCAL, 0, nullptr, 16, 0, 0, false, 0,
                                          nullptr, nullptr);
  k_route_tput<<<1, 32, 0, g.stream>>>(g.ctx, CHI_ROUTE_LOCAL, 0, nullptr, 16, 0, 0, 0, nullptr,
                                       nullptr, nullptr);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaStreamSynchronize(g.stream);
  if (e != cudaSuccess) g.error = cuda_msg("loading the benchmark kernels", e);
}

void spin_relax(unsigned *n) {
  chi_tool_cpu_relax();
  ++*n;
}

// ----------------------------------------------------------- floor rows

void floor_cpu_gpu(Gpu &g, FloorMem &m, const chi_bench_options &opt, chi_bench_row *row) {
  row->payload_bytes = 0;
  unsigned *req = reinterpret_cast<unsigned *>(m.pinned);
  unsigned *rsp = reinterpret_cast<unsigned *>(m.pinned + 64);
  unsigned *hfault = reinterpret_cast<unsigned *>(m.pinned + 128);
  *req = *rsp = *hfault = 0;
  const uint64_t total = opt.warmup + opt.iters;
  if (total > 0xFFFFFFF0ull) {
    chi_bench_row_fail(row, CHI_ERR_INVALID, "too many round trips for 32-bit flags");
    return;
  }
  k_pong_host<<<1, 1, 0, g.stream>>>(req, rsp, unsigned(total), g.timeout_cycles, hfault);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) {
    chi_bench_row_fail(row, CHI_ERR_INTERNAL, "%s", cuda_msg("launch", e).c_str());
    return;
  }
  if (opt.pin) chi_tool_pin_thread(0);
  std::vector<uint64_t> samples;
  samples.reserve(opt.iters);
  bool lost = false;
  for (uint64_t i = 1; i <= total && !lost; i++) {
    const uint64_t t0 = chi_tool_now_ns();
    __atomic_store_n(req, unsigned(i), __ATOMIC_RELEASE);
    unsigned spins = 0;
    while (__atomic_load_n(rsp, __ATOMIC_ACQUIRE) != unsigned(i)) {
      spin_relax(&spins);
      if ((spins & 1023u) == 0 && chi_tool_now_ns() - t0 > kHostSpinTimeoutNs) {
        lost = true;
        break;
      }
    }
    const uint64_t t1 = chi_tool_now_ns();
    if (i > opt.warmup) samples.push_back(t1 - t0);
  }
  cudaError_t e = cudaStreamSynchronize(g.stream);
  if (lost || e != cudaSuccess || *hfault) {
    chi_bench_row_fail(row, CHI_ERR_TIMEOUT, "%s",
                       e != cudaSuccess ? cuda_msg("pong kernel", e).c_str()
                                        : "no answer from the GPU thread within 2 s");
    return;
  }
  chi_bench_row_samples(row, samples.data(), samples.size());
}

void floor_block(Gpu &g, FloorMem &m, const chi_bench_options &opt, chi_bench_row *row) {
  row->payload_bytes = 0;
  const uint64_t total = opt.warmup + opt.iters;
  Span span{};
  unsigned fault = 0;
  cudaError_t e = cudaMemsetAsync(m.dflags, 0, 256, g.stream);
  if (e == cudaSuccess) e = cudaMemsetAsync(m.fault, 0, sizeof(unsigned), g.stream);
  if (e == cudaSuccess) {
    k_block_pingpong<<<2, 32, 0, g.stream>>>(m.dflags, m.dflags + 32, unsigned(total),
                                             unsigned(opt.warmup), g.timeout_cycles, g.samples,
                                             g.spans, m.fault);
    e = cudaGetLastError();
  }
  std::vector<uint64_t> samples(opt.iters);
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(samples.data(), g.samples, sizeof(uint64_t) * opt.iters,
                        cudaMemcpyDeviceToHost, g.stream);
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(&span, g.spans, sizeof span, cudaMemcpyDeviceToHost, g.stream);
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(&fault, m.fault, sizeof fault, cudaMemcpyDeviceToHost, g.stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(g.stream);
  if (e != cudaSuccess || fault) {
    chi_bench_row_fail(row, e != cudaSuccess ? CHI_ERR_INTERNAL : CHI_ERR_TIMEOUT, "%s",
                       e != cudaSuccess ? cuda_msg("block ping-pong", e).c_str()
                                        : "the other block did not answer within 2 s");
    return;
  }
  const double k = ns_per_cycle(span, g.nominal_ns_per_cycle);
  for (auto &s : samples) s = uint64_t(std::llround(double(s) * k));
  chi_bench_row_samples(row, samples.data(), samples.size());
}

// One host thread answers every slot's calls until told to stop.
void serve_calls(CallSlot *slots, unsigned nwarps, const std::atomic<bool> *stop, bool pin) {
  if (pin) chi_tool_pin_thread(1);
  std::vector<unsigned> seen(nwarps, 0);
  while (!stop->load(std::memory_order_relaxed)) {
    for (unsigned w = 0; w < nwarps; ++w) {
      unsigned q = __atomic_load_n(&slots[w].req, __ATOMIC_ACQUIRE);
      if (q != seen[w]) {
        seen[w] = q;
        slots[w].ret = slots[w].arg * 2 + 1;
        __atomic_store_n(&slots[w].rsp, q, __ATOMIC_RELEASE);
      }
    }
  }
}

// GPU->CPU flag calls from `nwarps` warps; latency row when nwarps == 1.
void floor_gpu_cpu(Gpu &g, FloorMem &m, const chi_bench_options &opt, unsigned nwarps,
                   unsigned calls, unsigned warm, chi_bench_row *row) {
  row->payload_bytes = 0;
  row->threads = nwarps;
  CallSlot *slots = reinterpret_cast<CallSlot *>(m.pinned + 4096);
  std::memset(slots, 0, sizeof(CallSlot) * nwarps);
  CallsOut init{~0ull, 0, 0, 0}, got{};
  const bool latency = nwarps == 1;
  std::atomic<bool> stop{false};
  cudaError_t e =
      cudaMemcpyAsync(m.calls_out, &init, sizeof init, cudaMemcpyHostToDevice, g.stream);
  if (e != cudaSuccess) {
    chi_bench_row_fail(row, CHI_ERR_INTERNAL, "%s", cuda_msg("setup", e).c_str());
    return;
  }
  e = cudaStreamSynchronize(g.stream);
  std::thread server(serve_calls, slots, nwarps, &stop, opt.pin != 0);
  uint32_t blocks, threads;
  grid_for(g, nwarps, &blocks, &threads);
  if (e == cudaSuccess) {
    k_gpu_calls<<<blocks, threads, 0, g.stream>>>(slots, nwarps, calls, warm, g.timeout_cycles,
                                                  latency ? g.samples : nullptr,
                                                  latency ? g.spans : nullptr, m.calls_out);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaStreamSynchronize(g.stream);
  stop = true;
  server.join();
  std::vector<uint64_t> samples(latency ? calls : 0);
  Span span{};
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(&got, m.calls_out, sizeof got, cudaMemcpyDeviceToHost, g.stream);
  if (e == cudaSuccess && latency) {
    e = cudaMemcpyAsync(samples.data(), g.samples, sizeof(uint64_t) * calls, cudaMemcpyDeviceToHost,
                        g.stream);
    if (e == cudaSuccess)
      e = cudaMemcpyAsync(&span, g.spans, sizeof span, cudaMemcpyDeviceToHost, g.stream);
  }
  if (e == cudaSuccess) e = cudaStreamSynchronize(g.stream);
  if (e != cudaSuccess) {
    chi_bench_row_fail(row, CHI_ERR_INTERNAL, "%s", cuda_msg("GPU->CPU calls", e).c_str());
    return;
  }
  if (got.fault) {
    chi_bench_row_fail(row, CHI_ERR_TIMEOUT, "a call got no answer from the host thread in 2 s");
    return;
  }
  if (got.bad) {
    chi_bench_row_fail(row, CHI_ERR_INTERNAL, "%llu wrong answers", got.bad);
    return;
  }
  if (latency) {
    const double k = ns_per_cycle(span, g.nominal_ns_per_cycle);
    for (auto &s : samples) s = uint64_t(std::llround(double(s) * k));
    chi_bench_row_samples(row, samples.data(), samples.size());
  } else {
    row->count = uint64_t(nwarps) * calls;
    if (got.t_end > got.t_start)
      row->throughput = double(row->count) * 1e9 / double(got.t_end - got.t_start);
  }
}

void peer_launch(Gpu &g, const chi_bench_options &opt, bool graph, chi_bench_row *row) {
  row->payload_bytes = 0;
  std::snprintf(row->floor, sizeof row->floor, "%s", kCpuGpuFloor);
  cudaGraph_t gr = nullptr;
  cudaGraphExec_t ge = nullptr;
  cudaError_t e = cudaSuccess;
  if (graph) {
    // Thread-local capture: the runtime's own threads keep calling CUDA meanwhile.
    e = cudaStreamBeginCapture(g.stream, cudaStreamCaptureModeThreadLocal);
    if (e == cudaSuccess) {
      k_empty<<<1, 1, 0, g.stream>>>();
      e = cudaStreamEndCapture(g.stream, &gr);
    }
    if (e == cudaSuccess) e = cudaGraphInstantiate(&ge, gr, 0);
  }
  std::vector<uint64_t> samples;
  samples.reserve(opt.iters);
  for (uint64_t i = 0; i < opt.warmup + opt.iters && e == cudaSuccess; i++) {
    const uint64_t t0 = chi_tool_now_ns();
    if (graph) {
      e = cudaGraphLaunch(ge, g.stream);
    } else {
      k_empty<<<1, 1, 0, g.stream>>>();
      e = cudaGetLastError();
    }
    if (e == cudaSuccess) e = cudaStreamSynchronize(g.stream);
    const uint64_t t1 = chi_tool_now_ns();
    if (i >= opt.warmup) samples.push_back(t1 - t0);
  }
  if (ge) cudaGraphExecDestroy(ge);
  if (gr) cudaGraphDestroy(gr);
  if (e != cudaSuccess) {
    chi_bench_row_fail(row, CHI_ERR_INTERNAL, "%s",
                       cuda_msg(graph ? "graph launch" : "launch", e).c_str());
    return;
  }
  chi_bench_row_samples(row, samples.data(), samples.size());
}

void CUDART_CB host_func_done(void *flag) {
  static_cast<std::atomic<int> *>(flag)->store(1, std::memory_order_release);
}

void peer_host_func(Gpu &g, const chi_bench_options &opt, chi_bench_row *row) {
  row->payload_bytes = 0;
  std::snprintf(row->floor, sizeof row->floor, "%s", kGpuCpuFloor);
  std::atomic<int> flag{0};
  std::vector<uint64_t> samples;
  samples.reserve(opt.iters);
  cudaError_t e = cudaSuccess;
  bool lost = false;
  for (uint64_t i = 0; i < opt.warmup + opt.iters && e == cudaSuccess && !lost; i++) {
    flag.store(0, std::memory_order_relaxed);
    const uint64_t t0 = chi_tool_now_ns();
    e = cudaLaunchHostFunc(g.stream, host_func_done, &flag);
    unsigned spins = 0;
    while (e == cudaSuccess && !flag.load(std::memory_order_acquire)) {
      spin_relax(&spins);
      if ((spins & 1023u) == 0 && chi_tool_now_ns() - t0 > kHostSpinTimeoutNs) lost = true;
      if (lost) break;
    }
    const uint64_t t1 = chi_tool_now_ns();
    if (i >= opt.warmup) samples.push_back(t1 - t0);
  }
  // The callback may still be queued: it must run before `flag` goes away.
  cudaError_t s = cudaStreamSynchronize(g.stream);
  if (e == cudaSuccess) e = s;
  if (e != cudaSuccess || lost) {
    chi_bench_row_fail(
        row, lost ? CHI_ERR_TIMEOUT : CHI_ERR_INTERNAL, "%s",
        lost ? "callback did not run within 2 s" : cuda_msg("cudaLaunchHostFunc", e).c_str());
    return;
  }
  chi_bench_row_samples(row, samples.data(), samples.size());
}

// Runs the floors and peers on g with its orchestrator paused.
void floors(Gpu &g, FloorMem &m, const chi_bench_options &opt, Rows &rows) {
  const uint32_t W = max_warps(g);
  if (chi_bench_row *r = rows.next(kCpuGpuFloor, CHI_BENCH_FLOOR)) floor_cpu_gpu(g, m, opt, r);
  if (chi_bench_row *r = rows.next(kGpuCpuFloor, CHI_BENCH_FLOOR))
    floor_gpu_cpu(g, m, opt, 1, unsigned(opt.iters), unsigned(opt.warmup), r);
  char name[48];
  std::snprintf(name, sizeof name, "floor.gpu_cpu_calls %uw", W);
  if (chi_bench_row *r = rows.next(name, CHI_BENCH_FLOOR))
    floor_gpu_cpu(g, m, opt, W, kFloorCallsPerWarp, 100, r);
  if (chi_bench_row *r = rows.next(kGpuGpuFloor, CHI_BENCH_FLOOR)) floor_block(g, m, opt, r);
  if (chi_bench_row *r = rows.next("peer.kernel_launch", CHI_BENCH_PEER))
    peer_launch(g, opt, false, r);
  if (chi_bench_row *r = rows.next("peer.graph_launch", CHI_BENCH_PEER))
    peer_launch(g, opt, true, r);
  if (chi_bench_row *r = rows.next("peer.launch_host_func", CHI_BENCH_PEER))
    peer_host_func(g, opt, r);
}

// ------------------------------------------------------------ route rows

void set_route(chi_bench_row *row, const char *route, const char *floor, uint32_t payload) {
  std::snprintf(row->route, sizeof row->route, "%s", route);
  std::snprintf(row->method, sizeof row->method, "chi.echo");
  std::snprintf(row->floor, sizeof row->floor, "%s", floor);
  row->payload_bytes = payload;
}

const char *where_name(uint32_t where) {
  switch (where) {
    case kWhereSubmit:
      return "chi_dev_submit";
    case kWhereWait:
      return "chi_dev_wait";
    case kWhereEcho:
      return "chi.echo output differs from its input";
    case kWhereAgain:
      return "chi_dev_submit: no free slot for 2 s";
    default:
      return "?";
  }
}

// One of the orchestrator's diag words (chimaera/device_diag.h); 0 without them.
uint64_t diag_word(const Gpu &g, uint32_t w) {
  const volatile uint64_t *d = reinterpret_cast<const chi_dev_ctx_layout_t *>(&g.ctx)->diag;
  return d ? d[w] : 0;
}

// The orchestrator's launches and step-asides so far (diag words).
struct LeaseMark {
  uint64_t launches = 0, asides = 0, bell = 0, in_use = 0, ran_ns = 0, ended = 0;
};
LeaseMark lease_mark(const Gpu &g) {
  LeaseMark m;
  m.launches = diag_word(g, CHI_DIAG_START_EPOCH);
  m.asides = diag_word(g, CHI_DIAG_ASIDE_N);
  m.bell = diag_word(g, CHI_DIAG_ASIDE_BELL);
  m.in_use = diag_word(g, CHI_DIAG_ASIDE_IN_USE);
  m.ran_ns = diag_word(g, CHI_DIAG_LAUNCH_NS);
  m.ended = diag_word(g, CHI_DIAG_LAUNCH_N);
  return m;
}
// With CHI_BENCH_LEASE set: the row's launches and step-asides, on stderr.
void lease_note(const Gpu &g, const LeaseMark &m0, const chi_bench_row *row) {
  if (!std::getenv("CHI_BENCH_LEASE")) return;
  const LeaseMark m1 = lease_mark(g);
  const uint64_t ended = m1.ended - m0.ended;
  std::fprintf(stderr, "chimaera-bench: %s: %llu launches (%llu ended, %.1f us each), %llu step-asides (%llu for the bell, %llu with slots in use)\n",
               row->name, static_cast<unsigned long long>(m1.launches - m0.launches),
               static_cast<unsigned long long>(ended), ended ? double(m1.ran_ns - m0.ran_ns) / 1e3 / double(ended) : 0.0,
               static_cast<unsigned long long>(m1.asides - m0.asides),
               static_cast<unsigned long long>(m1.bell - m0.bell),
               static_cast<unsigned long long>(m1.in_use - m0.in_use));
}

// mark: the diag words when the row started.  A CHI_ERR_AGAIN names the
// orchestrator's step-asides meanwhile (a submit waits at most two leases
// for the next launch, docs/gpu.md).
bool route_ok(const RouteOut &o, chi_bench_row *row, const Gpu &g, const LeaseMark &mark) {
  if (o.where == 0) return true;
  char why[384] = "";
  if (o.status == CHI_ERR_AGAIN) {
    const uint64_t w = diag_word(g, CHI_DIAG_ASIDE_WHY);
    const uint64_t gw = diag_word(g, CHI_DIAG_GATE_GAVE_UP_WHY);
    static const char *const phases[] = CHI_DIAG_PHASE_NAMES;
    std::snprintf(why, sizeof why, "; orchestrator stepped aside %llu times in this row (the runtime's "
                  "total: %llu, %llu for the bell, %llu with slots in use; last: %s, slots %s, routes quiet %llu us)"
                  "; the last submit to give up at the closed gate waited %llu us, lease thread %s%s",
                  static_cast<unsigned long long>(diag_word(g, CHI_DIAG_ASIDE_N) - mark.asides),
                  static_cast<unsigned long long>(diag_word(g, CHI_DIAG_ASIDE_N)),
                  static_cast<unsigned long long>(diag_word(g, CHI_DIAG_ASIDE_BELL)),
                  static_cast<unsigned long long>(diag_word(g, CHI_DIAG_ASIDE_IN_USE)),
                  (w & 1u) ? "bell" : "lease, successor not queued", (w & 2u) ? "in use" : "free",
                  static_cast<unsigned long long>(w >> 32), static_cast<unsigned long long>(gw >> 32),
                  phases[(gw & 0xFFu) < CHI_DIAG_PHASE_COUNT ? (gw & 0xFFu) : 0u], (gw >> 8) & 1u ? " (submit timeout)" : "");
  }
  chi_bench_row_fail(row, o.status, "%s: %s (task %llu)%s", where_name(o.where),
                     chi_status_string(o.status), o.index, why);
  return false;
}

bool usable_for_routes(const Gpu &g, const chi_bench_options &opt, chi_bench_row *row) {
  if (!g.error.empty()) {
    chi_bench_row_fail(row, g.error_status, "%s", g.error.c_str());
    return false;
  }
  if (opt.payload > g.max_payload) {
    chi_bench_row_fail(row, CHI_ERR_TOO_LARGE, "payload %u over gpu.max_payload %u", opt.payload,
                       g.max_payload);
    return false;
  }
  return true;
}

// How a latency row is timed: the embedded rows of a plain run in SM cycles
// without a bound; the rows of a --server run in %globaltimer ns (see
// k_route_latency), a client kernel's within a time budget.
struct LatencyMode {
  bool globaltimer = false;
  uint64_t budget_ns = 0;  // 0: none
};

void gpu_latency(Gpu &g, chi_route_t route, const chi_bench_options &opt, chi_bench_row *row,
                 const LatencyMode &mode = LatencyMode()) {
  if (!usable_for_routes(g, opt, row)) return;
  cudaSetDevice(g.ordinal);
  RouteOut o{};
  const LeaseMark mark = lease_mark(g);
  const uint32_t stride = stride_of(opt.payload);
  cudaError_t e = cudaMemsetAsync(g.out, 0, sizeof(RouteOut), g.stream);
  if (e == cudaSuccess) {
    k_route_latency<<<1, 32, 0, g.stream>>>(g.ctx, route, opt.payload, g.scratch, stride,
                                            opt.warmup, opt.iters, mode.globaltimer,
                                            mode.budget_ns, g.samples, g.out);
    e = cudaGetLastError();
  }
  // The kernel ends before any copy to pageable memory: such a copy blocks
  // this process's other CUDA calls, the orchestrator's relaunch among them,
  // while it waits for the stream (docs/gpu.md, "Coexisting with other CUDA code").
  if (e == cudaSuccess) e = cudaStreamSynchronize(g.stream);
  std::vector<uint64_t> samples(opt.iters);
  if (e == cudaSuccess) e = cudaMemcpyAsync(&o, g.out, sizeof o, cudaMemcpyDeviceToHost, g.stream);
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(samples.data(), g.samples, sizeof(uint64_t) * opt.iters,
                        cudaMemcpyDeviceToHost, g.stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(g.stream);
  lease_note(g, mark, row);
  if (e != cudaSuccess) {
    chi_bench_row_fail(row, CHI_ERR_INTERNAL, "%s", cuda_msg("latency kernel", e).c_str());
    g.error = row->error;  // a faulted context fails every later row too
    return;
  }
  if (!route_ok(o, row, g, mark)) return;
  if (o.done == 0) {
    chi_bench_row_fail(row, CHI_ERR_TIMEOUT, "no timed round trip within %.0f s (%llu warm-up)",
                       double(mode.budget_ns) / 1e9, static_cast<unsigned long long>(opt.warmup));
    return;
  }
  samples.resize(std::min<uint64_t>(o.done, opt.iters));
  if (samples.size() < opt.iters)
    std::fprintf(stderr, "chimaera-bench: %s: %zu of %llu round trips within its %.0f s budget\n",
                 row->name, samples.size(), static_cast<unsigned long long>(opt.iters),
                 double(mode.budget_ns) / 1e9);
  if (!mode.globaltimer) {
    const double k = ns_per_cycle(o.span, g.nominal_ns_per_cycle);
    for (auto &s : samples) s = uint64_t(std::llround(double(s) * k));
  }
  chi_bench_row_samples(row, samples.data(), samples.size());
}

// Runs k_route_tput; returns false (row failed) on error.
bool tput_run(Gpu &g, chi_route_t route, const chi_bench_options &opt, uint32_t nwarps,
              uint32_t lanes, uint32_t per_lane, RouteOut *o, chi_bench_row *row) {
  RouteOut init{};
  init.t_start = ~0ull;
  const LeaseMark mark = lease_mark(g);
  uint32_t blocks, threads;
  grid_for(g, nwarps, &blocks, &threads);
  cudaError_t e = cudaMemcpyAsync(g.out, &init, sizeof init, cudaMemcpyHostToDevice, g.stream);
  if (e == cudaSuccess) {
    k_route_tput<<<blocks, threads, 0, g.stream>>>(g.ctx, route, opt.payload, g.scratch,
                                                   stride_of(opt.payload), nwarps, lanes, per_lane,
                                                   g.samples, g.spans, g.out);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaStreamSynchronize(g.stream);  // before pageable copies: see gpu_latency
  lease_note(g, mark, row);
  if (e == cudaSuccess) e = cudaMemcpyAsync(o, g.out, sizeof *o, cudaMemcpyDeviceToHost, g.stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(g.stream);
  if (e != cudaSuccess) {
    chi_bench_row_fail(row, CHI_ERR_INTERNAL, "%s", cuda_msg("throughput kernel", e).c_str());
    g.error = row->error;
    return false;
  }
  return route_ok(*o, row, g, mark);
}

void gpu_throughput(Gpu &g, chi_route_t route, const chi_bench_options &opt, uint32_t nwarps,
                    chi_bench_row *row) {
  row->threads = nwarps;
  if (!usable_for_routes(g, opt, row)) return;
  cudaSetDevice(g.ordinal);
  // Tasks in flight stay within the route's slots, so the rows measure the
  // route rather than CHI_ERR_AGAIN retries (--gpu-lanes: fewer, or more).
  const uint32_t lanes = opt.gpu_lanes ? opt.gpu_lanes : std::clamp<uint32_t>(g.slots / nwarps, 1u, 32u);
  row->window = lanes;
  const uint64_t per_lane64 = std::max<uint64_t>(
      (opt.tput_tasks + uint64_t(nwarps) * lanes - 1) / (uint64_t(nwarps) * lanes), 16);
  const uint32_t per_lane = uint32_t(std::min<uint64_t>(per_lane64, 1u << 30));
  RouteOut o{};
  if (!tput_run(g, route, opt, nwarps, lanes, 4, &o, row)) return;  // warm-up
  if (!tput_run(g, route, opt, nwarps, lanes, per_lane, &o, row)) return;
  std::vector<uint64_t> raw(size_t(nwarps) * kSamplesPerWarp);
  std::vector<Span> spans(nwarps);
  cudaError_t e = cudaMemcpyAsync(raw.data(), g.samples, sizeof(uint64_t) * raw.size(),
                                  cudaMemcpyDeviceToHost, g.stream);
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(spans.data(), g.spans, sizeof(Span) * nwarps, cudaMemcpyDeviceToHost,
                        g.stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(g.stream);
  if (e != cudaSuccess) {
    chi_bench_row_fail(row, CHI_ERR_INTERNAL, "%s", cuda_msg("copying samples", e).c_str());
    return;
  }
  // Latency under load: one warp round (its lanes' tasks submitted, then all
  // waited for) in kSampleEveryRound.
  std::vector<uint64_t> samples;
  for (uint32_t w = 0; w < nwarps; w++) {
    const double k = ns_per_cycle(spans[w], g.nominal_ns_per_cycle);
    for (uint32_t s = 0; s < kSamplesPerWarp; s++) {
      uint64_t c = raw[size_t(w) * kSamplesPerWarp + s];
      if (c) samples.push_back(uint64_t(std::llround(double(c) * k)));
    }
  }
  chi_bench_row_samples(row, samples.data(), samples.size());
  row->count = o.done;
  row->throughput = o.t_end > o.t_start ? double(o.done) * 1e9 / double(o.t_end - o.t_start) : NAN;
}

void cpu_to_gpu_rows(chi_runtime_t *rt, const std::vector<Gpu> &gpus, const chi_bench_options &opt,
                     Rows &rows) {
  auto finish = [&](chi_bench_row *r) {
    std::snprintf(r->floor, sizeof r->floor, "%s", kCpuGpuFloor);
    if (r->kind == CHI_BENCH_LATENCY) {
      r->target_p50_ns = kCpuGpuTargetP50Ns;
      r->target_throughput = NAN;
    } else {
      r->target_p50_ns = NAN;
      r->target_throughput = kCpuGpuTargetTput;
    }
  };
  if (chi_bench_row *r = rows.next("cpu->gpu_any", CHI_BENCH_LATENCY)) {
    chi_bench::cpu_latency(rt, CHI_ROUTE_GPU_ANY, "cpu->gpu_any", "CHI_ROUTE_GPU_ANY", opt, r);
    finish(r);
  }
  for (const auto &g : gpus) {
    char name[48], route[24];
    std::snprintf(name, sizeof name, "cpu->gpu%d", int(g.id));
    std::snprintf(route, sizeof route, "CHI_ROUTE_GPU(%d)", int(g.id));
    if (chi_bench_row *r = rows.next(name, CHI_BENCH_LATENCY)) {
      chi_bench::cpu_latency(rt, CHI_ROUTE_GPU(g.id), name, route, opt, r);
      finish(r);
    }
  }
  for (uint32_t threads : {1u, 4u, 8u}) {
    char name[48];
    std::snprintf(name, sizeof name, "cpu->gpu_any pipelined x%u", threads);
    if (chi_bench_row *r = rows.next(name, CHI_BENCH_THROUGHPUT)) {
      chi_bench::cpu_throughput(rt, CHI_ROUTE_GPU_ANY, name, "CHI_ROUTE_GPU_ANY", threads, opt, r);
      finish(r);
    }
  }
}

// The routes that start in a kernel: GPU->CPU and GPU->GPU.
struct RouteKind {
  chi_route_t route;
  const char *suffix, *route_name, *floor;
  double p50, tput;
};
const RouteKind kGpuOriginKinds[] = {
    {CHI_ROUTE_CPU, "cpu", "CHI_ROUTE_CPU", kGpuCpuFloor, kGpuCpuTargetP50Ns, kGpuCpuTargetTput},
    {CHI_ROUTE_LOCAL, "local", "CHI_ROUTE_LOCAL", kGpuGpuFloor, kGpuGpuTargetP50Ns,
     kGpuGpuTargetTput}};

// "gpuN->cpu" and "gpuN->local" (after `prefix`), one task at a time.  The
// targets are the embedded routes'; a client kernel's rows have none.
void gpu_origin_latency(Gpu &g, const chi_bench_options &opt, Rows &rows, const char *prefix,
                        const LatencyMode &mode) {
  for (const auto &k : kGpuOriginKinds) {
    char name[48];
    std::snprintf(name, sizeof name, "%sgpu%d->%s", prefix, int(g.id), k.suffix);
    if (chi_bench_row *r = rows.next(name, CHI_BENCH_LATENCY)) {
      set_route(r, k.route_name, k.floor, opt.payload);
      if (prefix[0] == '\0') r->target_p50_ns = k.p50;
      gpu_latency(g, k.route, opt, r, mode);
    }
  }
}

void gpu_origin_rows(std::vector<Gpu> &gpus, const chi_bench_options &opt, Rows &rows) {
  const auto &kinds = kGpuOriginKinds;
  for (auto &g : gpus) gpu_origin_latency(g, opt, rows, "", LatencyMode());
  // Throughput on the first GPU: the others have the same hardware path.
  Gpu &g = gpus.front();
  for (const auto &k : kinds) {
    for (uint32_t warps : {1u, 32u, max_warps(g)}) {
      char name[48];
      std::snprintf(name, sizeof name, "gpu%d->%s %u warps", int(g.id), k.suffix, warps);
      if (chi_bench_row *r = rows.next(name, CHI_BENCH_THROUGHPUT)) {
        set_route(r, k.route_name, k.floor, opt.payload);
        r->target_throughput = k.tput;
        gpu_throughput(g, k.route, opt, warps, r);
      }
    }
  }
}

// floor.gpu_peer_pingpong: the round trip any device-initiated transfer
// between two GPUs pays (k_peer_ping / k_peer_pong), peer access enabled by
// the runtime.
void floor_peer(Gpu &a, Gpu &b, const chi_bench_options &opt, chi_bench_row *row) {
  row->payload_bytes = 4;
  const uint64_t total = opt.warmup + opt.iters;
  unsigned *fa = nullptr, *fb = nullptr, *fault = nullptr;
  cudaError_t e = cudaSetDevice(a.ordinal);
  if (e == cudaSuccess) e = cudaMalloc(&fa, 256);
  if (e == cudaSuccess) e = cudaMemset(fa, 0, 256);
  if (e == cudaSuccess) e = cudaHostAlloc(reinterpret_cast<void **>(&fault), sizeof(unsigned), cudaHostAllocMapped);
  if (e == cudaSuccess) e = cudaSetDevice(b.ordinal);
  if (e == cudaSuccess) e = cudaMalloc(&fb, 256);
  if (e == cudaSuccess) e = cudaMemset(fb, 0, 256);
  if (e == cudaSuccess) {
    *fault = 0;
    k_peer_pong<<<1, 32, 0, b.stream>>>(fb, fa, unsigned(total), kHostSpinTimeoutNs, fault);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaSetDevice(a.ordinal);
  if (e == cudaSuccess) {
    k_peer_ping<<<1, 32, 0, a.stream>>>(fa, fb, unsigned(total), unsigned(opt.warmup), kHostSpinTimeoutNs,
                                        a.samples, fault);
    e = cudaGetLastError();
  }
  std::vector<uint64_t> samples(opt.iters);
  if (e == cudaSuccess) e = cudaStreamSynchronize(a.stream);
  if (e == cudaSuccess)
    e = cudaMemcpy(samples.data(), a.samples, sizeof(uint64_t) * opt.iters, cudaMemcpyDeviceToHost);
  if (e == cudaSuccess) {
    cudaSetDevice(b.ordinal);
    e = cudaStreamSynchronize(b.stream);
    cudaSetDevice(a.ordinal);
  }
  if (e != cudaSuccess || *fault) {
    chi_bench_row_fail(row, e != cudaSuccess ? CHI_ERR_INTERNAL : CHI_ERR_TIMEOUT, "%s",
                       e != cudaSuccess ? cuda_msg("peer ping-pong", e).c_str() : "the other GPU did not answer");
  } else {
    chi_bench_row_samples(row, samples.data(), samples.size());
  }
  cudaSetDevice(a.ordinal);
  if (fa) cudaFree(fa);
  if (fault) cudaFreeHost(fault);
  cudaSetDevice(b.ordinal);
  if (fb) cudaFree(fb);
  cudaSetDevice(a.ordinal);
  (void)cudaGetLastError();
}

// GPU->GPU across GPUs (skipped on one GPU): gpu0->gpu1 latency and a full
// grid's throughput, against floor.gpu_peer_pingpong measured just before.
void peer_rows(std::vector<Gpu> &gpus, const chi_bench_options &opt, Rows &rows) {
  // Only where the runtime serves them (gpu.peer_routes, experimental).
  const char *on = std::getenv("CHI_GPU_PEER_ROUTES");
  if (!on || (std::strcmp(on, "1") != 0 && std::strcmp(on, "true") != 0)) return;
  if (gpus.size() < 2 || !gpus[0].error.empty() || !gpus[1].error.empty()) return;
  Gpu &g = gpus[0];
  if (chi_bench_row *r = rows.next("floor.gpu_peer_pingpong", CHI_BENCH_FLOOR)) floor_peer(g, gpus[1], opt, r);
  if (chi_bench_row *r = rows.next("gpu0->gpu1", CHI_BENCH_LATENCY)) {
    set_route(r, "CHI_ROUTE_GPU(1)", "floor.gpu_peer_pingpong", opt.payload);
    r->target_p50_ns = 4000.0;
    gpu_latency(g, CHI_ROUTE_GPU(1), opt, r, LatencyMode());
  }
  char name[48];
  std::snprintf(name, sizeof name, "gpu0->gpu1 %u warps", max_warps(g));
  if (chi_bench_row *r = rows.next(name, CHI_BENCH_THROUGHPUT)) {
    set_route(r, "CHI_ROUTE_GPU(1)", "floor.gpu_peer_pingpong", opt.payload);
    gpu_throughput(g, CHI_ROUTE_GPU(1), opt, max_warps(g), r);
  }
}

void fail_all(Rows &rows, const char *name, chi_status_t st, const std::string &why) {
  if (chi_bench_row *r = rows.next(name, CHI_BENCH_FLOOR))
    chi_bench_row_fail(r, st, "%s", why.c_str());
}

void alloc_floors(Gpu &g0, FloorMem &fm) {
  if (!g0.error.empty()) return;
  cudaSetDevice(g0.ordinal);
  const size_t pinned = 4096 + sizeof(CallSlot) * max_warps(g0);
  cudaError_t e = cudaHostAlloc(&fm.pinned, pinned, cudaHostAllocMapped | cudaHostAllocPortable);
  if (e == cudaSuccess) e = cudaMalloc(&fm.dflags, 256);
  if (e == cudaSuccess) e = cudaMalloc(&fm.calls_out, sizeof(CallsOut));
  if (e == cudaSuccess) e = cudaMalloc(&fm.fault, sizeof(unsigned));
  if (e != cudaSuccess) g0.error = cuda_msg("allocating floor buffers", e);
}

void sync_streams(std::vector<Gpu> &gpus) {
  for (auto &g : gpus)
    if (g.stream) {
      cudaSetDevice(g.ordinal);
      cudaStreamSynchronize(g.stream);
    }
}

// cudaFree and cudaFreeHost wait for every kernel of the process: a caller
// whose process runs orchestrators pauses them first.
void free_buffers(std::vector<Gpu> &gpus, FloorMem *fm) {
  for (auto &g : gpus) {
    if (g.ordinal < 0) continue;
    cudaSetDevice(g.ordinal);
    cudaFree(g.scratch);
    cudaFree(g.samples);
    cudaFree(g.spans);
    cudaFree(g.out);
    if (g.stream) cudaStreamDestroy(g.stream);
  }
  if (fm && !gpus.empty() && gpus.front().ordinal >= 0) {
    cudaSetDevice(gpus.front().ordinal);
    cudaFreeHost(fm->pinned);
    cudaFree(fm->dflags);
    cudaFree(fm->calls_out);
    cudaFree(fm->fault);
  }
}

// Frees with the orchestrators of rt paused.
void free_paused(chi_runtime_t *rt, std::vector<Gpu> &gpus, FloorMem *fm) {
  sync_streams(gpus);
  if (chi_gpu_pause(rt, -1) != CHI_OK) return;
  free_buffers(gpus, fm);
  if (chi_gpu_resume(rt, -1) != CHI_OK)
    std::fprintf(stderr, "chimaera-bench: chi_gpu_resume: %s\n", chi_last_error_message());
}

// Puts the current device back on every return.
struct DeviceRestore {
  int prev = 0;
  bool have = cudaGetDevice(&prev) == cudaSuccess;
  ~DeviceRestore() {
    cudaGetLastError();
    if (have) cudaSetDevice(prev);
  }
};

}  // namespace

// A parked GPU's first task (docs/gpu.md, "Parked GPUs") against its floor:
// a bare launch whose one thread answers one request in pinned memory,
// after the same quiet (a launch after quiet is slow because the GPU idles
// too).  GPU 0, before any device context is taken (that keeps a GPU from
// parking).  The floor block runs first, with the GPU parked, then the
// route block: each sample follows `quiet` with no other work.
__global__ void k_answer(const volatile uint32_t *req, volatile uint32_t *rep) {
  if (threadIdx.x == 0 && blockIdx.x == 0) *rep = *req;
}

void wake_rows(chi_runtime_t *rt, const chi_bench_options &opt, Rows &rows) {
  struct Quiet {
    int64_t ns;
    const char *floor, *route;
    uint32_t n;
  };
  const uint32_t scale = std::max<uint32_t>(1, uint32_t(std::min<uint64_t>(opt.iters / 2000, 8)));
  const Quiet quiets[] = {{10'000'000, "floor.launch_after_10ms", "cpu->gpu0 after 10ms", 20 * scale},
                          {1'000'000'000, "floor.launch_after_1s", "cpu->gpu0 after 1s", 4 * scale}};
  auto nap = [](int64_t ns) {
    timespec ts{time_t(ns / 1000000000), long(ns % 1000000000)};
    nanosleep(&ts, nullptr);
  };
  auto parked = [rt] {
    chi_stats_t st;
    std::memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    return chi_stats(rt, &st) == CHI_OK && (st.gpus_parked & 1);
  };
  uint32_t *pin = nullptr, *dpin = nullptr;
  cudaStream_t stream = nullptr;
  cudaError_t e = cudaSetDevice(0);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaHostAlloc(reinterpret_cast<void **>(&pin), 64, cudaHostAllocMapped);
  if (e == cudaSuccess) e = cudaHostGetDevicePointer(reinterpret_cast<void **>(&dpin), pin, 0);
  if (e == cudaSuccess) {
    k_answer<<<1, 32, 0, stream>>>(dpin, dpin + 1);  // loads the module
    e = cudaStreamSynchronize(stream);
  }
  for (const Quiet &q : quiets) {
    chi_bench_row *fr = rows.next(q.floor, CHI_BENCH_FLOOR);
    chi_bench_row *rr = rows.next(q.route, CHI_BENCH_LATENCY);
    if (!fr || !rr) break;
    std::snprintf(rr->route, sizeof rr->route, "CHI_ROUTE_GPU(0)");
    std::snprintf(rr->method, sizeof rr->method, "chi.echo");
    std::snprintf(rr->floor, sizeof rr->floor, "%s", q.floor);
    rr->payload_bytes = fr->payload_bytes = 64;
    rr->threads = fr->threads = 1;
    if (e != cudaSuccess) {
      chi_bench_row_fail(fr, CHI_ERR_INTERNAL, "%s", cuda_msg("wake floor", e).c_str());
      chi_bench_row_fail(rr, CHI_ERR_INTERNAL, "%s", cuda_msg("wake floor", e).c_str());
      continue;
    }
    // Parked first (the keep-alive passes; 30 s bound).
    for (int i = 0; i < 3000 && !parked(); ++i) nap(10'000'000);
    std::vector<uint64_t> fs, rs;
    for (uint32_t i = 0; i < q.n && e == cudaSuccess; ++i) {
      nap(q.ns);
      const uint32_t want = (uint32_t(i) + 1) | 0x80000000u;
      pin[1] = 0;
      pin[0] = want;
      const int64_t t0 = int64_t(chi_tool_now_ns());
      k_answer<<<1, 32, 0, stream>>>(dpin, dpin + 1);
      while (reinterpret_cast<volatile uint32_t *>(pin)[1] != want)
        if (int64_t(chi_tool_now_ns()) - t0 > int64_t(kHostSpinTimeoutNs)) break;
      fs.push_back(uint64_t(int64_t(chi_tool_now_ns()) - t0));
      e = cudaStreamSynchronize(stream);
    }
    uint8_t in[64], out[64];
    for (int i = 0; i < 64; ++i) in[i] = uint8_t(i);
    chi_status_t st = CHI_OK;
    for (uint32_t i = 0; i < q.n && st == CHI_OK; ++i) {
      nap(q.ns);
      chi_future_t f;
      size_t n = 0;
      const int64_t t0 = int64_t(chi_tool_now_ns());
      st = chi_submit(rt, CHI_ROUTE_GPU(0), CHI_METHOD_ECHO, in, sizeof in, &f);
      if (st == CHI_OK) st = chi_wait(rt, f, kWaitTimeoutNs, out, sizeof out, &n);
      rs.push_back(uint64_t(int64_t(chi_tool_now_ns()) - t0));
      if (st == CHI_OK && (n != sizeof in || std::memcmp(in, out, n) != 0)) st = CHI_ERR_INTERNAL;
    }
    if (e != cudaSuccess) chi_bench_row_fail(fr, CHI_ERR_INTERNAL, "%s", cuda_msg("wake floor", e).c_str());
    else chi_bench_row_samples(fr, fs.data(), fs.size());
    if (st != CHI_OK) chi_bench_row_fail(rr, st, "%s", chi_last_error_message());
    else chi_bench_row_samples(rr, rs.data(), rs.size());
  }
  if (stream) cudaStreamDestroy(stream);
  if (pin) cudaFreeHost(pin);
  (void)cudaGetLastError();
}

extern "C" int chi_bench_gpu_visible(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

extern "C" int chi_bench_gpu_rows(chi_runtime_t *rt, const struct chi_bench_options *opt,
                                  struct chi_bench_row *rows, int max_rows) {
  int32_t count = 0;
  if (rt == nullptr || opt == nullptr || rows == nullptr || max_rows <= 0 ||
      chi_gpu_count(rt, &count) != CHI_OK || count <= 0)
    return 0;
  DeviceRestore restore;
  Rows out{rows, max_rows};
  // Before setup: it takes every GPU's device context, which keeps it awake.
  const char *wake = std::getenv("CHI_BENCH_WAKE");
  if (!wake || std::strcmp(wake, "0") != 0) wake_rows(rt, *opt, out);
  std::vector<Gpu> gpus(static_cast<size_t>(count));
  for (int32_t i = 0; i < count; i++) {
    gpus[i].id = i;
    setup(rt, *opt, &gpus[i]);
  }

  FloorMem fm;
  Gpu &g0 = gpus.front();
  alloc_floors(g0, fm);

  chi_status_t st = chi_gpu_pause(rt, -1);
  if (st != CHI_OK) {
    // Without a pause neither the first launches nor the frees are safe.
    fail_all(out, "gpu.setup", st, std::string("chi_gpu_pause: ") + chi_last_error_message());
    return out.n;
  }
  for (auto &g : gpus) preload(g);
  if (g0.error.empty()) {
    cudaSetDevice(g0.ordinal);
    floors(g0, fm, *opt, out);
  } else {
    fail_all(out, kCpuGpuFloor, CHI_ERR_INTERNAL, g0.error);
  }
  st = chi_gpu_resume(rt, -1);
  if (st != CHI_OK) {
    fail_all(out, "gpu.resume", st, std::string("chi_gpu_resume: ") + chi_last_error_message());
    return out.n;
  }

  cpu_to_gpu_rows(rt, gpus, *opt, out);
  gpu_origin_rows(gpus, *opt, out);
  peer_rows(gpus, *opt, out);
  if (g0.error.empty() && out.max - out.n >= 6)
    out.n += chi_bench_footprint_rows(rt, g0.id, g0.ordinal, out.rows + out.n, out.max - out.n);

  free_paused(rt, gpus, &fm);
  return out.n;
}

extern "C" int chi_bench_gpu_embedded_rows(chi_runtime_t *rt, const struct chi_bench_options *opt,
                                           struct chi_bench_row *rows, int max_rows) {
  int32_t count = 0;
  if (rt == nullptr || opt == nullptr || rows == nullptr || max_rows <= 0 ||
      chi_gpu_count(rt, &count) != CHI_OK || count <= 0)
    return 0;
  DeviceRestore restore;
  Rows out{rows, max_rows};
  std::vector<Gpu> gpus(1);
  Gpu &g = gpus.front();
  setup(rt, *opt, &g);
  FloorMem fm;
  alloc_floors(g, fm);

  chi_status_t st = chi_gpu_pause(rt, -1);
  if (st != CHI_OK) {
    fail_all(out, "gpu.setup", st, std::string("chi_gpu_pause: ") + chi_last_error_message());
    return out.n;
  }
  preload(g);
  if (g.error.empty()) {
    cudaSetDevice(g.ordinal);
    if (chi_bench_row *r = out.next(kGpuCpuFloor, CHI_BENCH_FLOOR))
      floor_gpu_cpu(g, fm, *opt, 1, unsigned(opt->iters), unsigned(opt->warmup), r);
    if (chi_bench_row *r = out.next(kGpuGpuFloor, CHI_BENCH_FLOOR)) floor_block(g, fm, *opt, r);
  } else {
    fail_all(out, kGpuCpuFloor, g.error_status, g.error);
  }
  st = chi_gpu_resume(rt, -1);
  if (st != CHI_OK) {
    fail_all(out, "gpu.resume", st, std::string("chi_gpu_resume: ") + chi_last_error_message());
    return out.n;
  }
  LatencyMode mode;
  mode.globaltimer = true;
  gpu_origin_latency(g, *opt, out, "", mode);
  free_paused(rt, gpus, &fm);
  return out.n;
}

extern "C" int chi_bench_gpu_client_rows(chi_runtime_t *rt, const struct chi_bench_options *opt,
                                         chi_status_t refused, const char *why,
                                         struct chi_bench_row *rows, int max_rows) {
  if (opt == nullptr || rows == nullptr || max_rows <= 0 || chi_bench_gpu_visible() <= 0) return 0;
  DeviceRestore restore;
  Rows out{rows, max_rows};
  std::vector<Gpu> gpus(1);
  Gpu &g = gpus.front();
  if (refused != CHI_OK || rt == nullptr) {
    g.error = why && *why ? why : "no client runtime";
    g.error_status = refused != CHI_OK ? refused : CHI_ERR_INVALID;
  } else {
    setup(rt, *opt, &g);  // chi_gpu_context: the relay's memory and threads
  }
  // No orchestrator runs in a client process: nothing to pause around the
  // first launches and the frees.
  preload(g);
  LatencyMode mode;
  mode.globaltimer = true;
  mode.budget_ns = kClientBudgetNs;
  // Without MPS a client kernel's GPU->GPU round trip takes turns with the
  // server's orchestrator (ms each): a long warm-up would eat the budget.
  chi_bench_options o = *opt;
  o.warmup = std::min<uint64_t>(o.warmup, kClientWarmup);
  gpu_origin_latency(g, o, out, "client ", mode);
  sync_streams(gpus);
  free_buffers(gpus, nullptr);
  return out.n;
}

// chimaera-demo's GPU-originated routes.  On every GPU a kernel sends the
// demo's tasks to the CPU (CHI_ROUTE_CPU: the CPU handlers run them) and to
// its own orchestrator (CHI_ROUTE_LOCAL), first one at a time from one thread
// (timed on the device), then from many warps at once, half through the warp
// variants and half through per-thread calls from diverged lanes.  The host
// checks every result with chi_demo_check, as it does for host routes.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "chimaera_device.h"
#include "demo_check.h"
#include "demo_gpu.h"
#include "tool_util.h"

namespace {

// As main.c: long enough for any sane route, short enough that a lost task
// shows up as a failure instead of a hang.
constexpr int64_t kWaitTimeoutNs = 10'000'000'000;
// Tasks per kernel launch, whatever --tasks says: bounds the device buffers.
constexpr uint32_t kBatch = 16384;
constexpr uint32_t kBurstBlocks = 32;
constexpr uint32_t kBurstThreads = 128;
constexpr unsigned kFullMask = 0xFFFFFFFFu;

struct DevTask {
  uint32_t method;
  uint32_t input_size;
  uint8_t input[CHI_DEMO_MAX_INPUT];
};

enum : uint32_t { kNotRun = 0, kRefused = 1, kWaited = 2 };

struct DevResult {
  uint32_t phase;  // kNotRun, kRefused (status from chi_dev_submit), kWaited (from chi_dev_wait)
  int32_t status;
  uint32_t output_size;
  uint32_t pad;
  unsigned long long cycles;  // submit to result, serial kernel only
  uint8_t output[CHI_DEMO_MAX_INPUT];
};

// One batch's shared state, in device memory.
struct DevControl {
  uint32_t abort;  // a wait timed out: the route is broken, stop submitting
  uint32_t pad;
  // The serial kernel's clock64 and globaltimer at start and end: their ratio
  // turns cycle counts into nanoseconds at the clock the SM actually ran.
  unsigned long long c0, c1, g0, g1;
};

__device__ bool aborted(DevControl *c) { return chi_port::ld_relaxed_dev(&c->abort) != 0u; }

// chi_dev_submit waits for a slot when all are busy (gpu.device_submit_timeout_us).
__device__ chi_status_t submit_task(const chi_dev_context_t *ctx, chi_route_t route,
                                    const DevTask *t, chi_future_t *f) {
  return chi_dev_submit(ctx, route, t->method, t->input, t->input_size, f);
}

__device__ void record_wait(chi_status_t s, uint32_t out_size, DevResult *r, DevControl *c) {
  r->status = s;
  r->output_size = out_size;
  r->phase = kWaited;
  if (s == CHI_ERR_TIMEOUT) chi_port::st_relaxed_dev(&c->abort, 1u);
}

// One thread runs the batch's tasks one after the other, timing each.
__global__ void serial_kernel(chi_dev_context_t ctx, chi_route_t route, const DevTask *tasks,
                              DevResult *res, uint32_t n, DevControl *c) {
  if (threadIdx.x != 0 || blockIdx.x != 0 || n == 0) return;
  const unsigned long long g0 = chi_port::timer_ns();
  const long long c0 = clock64();
  for (uint32_t i = 0; i < n && !aborted(c); ++i) {
    DevResult *r = &res[i];
    const long long t0 = clock64();
    chi_future_t f = 0;
    chi_status_t s = submit_task(&ctx, route, &tasks[i], &f);
    if (s != CHI_OK) {
      r->phase = kRefused;
      r->status = s;
      continue;
    }
    uint32_t got = 0;
    s = chi_dev_wait(&ctx, f, kWaitTimeoutNs, r->output, CHI_DEMO_MAX_INPUT, &got);
    r->cycles = static_cast<unsigned long long>(clock64() - t0);
    record_wait(s, got, r, c);
  }
  c->c1 = static_cast<unsigned long long>(clock64());
  c->g1 = chi_port::timer_ns();
  c->c0 = static_cast<unsigned long long>(c0);
  c->g0 = g0;
}

// A warp's 32 tasks through the warp-collective calls (a lane that finds no
// slot waits for one inside chi_dev_warp_submit).
__device__ void warp_chunk(const chi_dev_context_t *ctx, chi_route_t route, const DevTask *t,
                           DevResult *r, bool mine, DevControl *c) {
  chi_future_t f = 0;
  const chi_status_t sub = chi_dev_warp_submit(ctx, route, mine ? t->method : CHI_METHOD_ECHO,
                                               mine ? t->input : nullptr, mine ? t->input_size : 0u,
                                               mine ? 1 : 0, &f);
  if (mine && sub != CHI_OK) {
    r->phase = kRefused;
    r->status = sub;
    f = 0;
  }
  const bool have = f != 0;
  uint32_t got = 0;
  chi_status_t s = chi_dev_warp_wait(ctx, f, kWaitTimeoutNs, have ? r->output : nullptr,
                                     CHI_DEMO_MAX_INPUT, &got, have ? 1 : 0);
  if (have) record_wait(s, got, r, c);
}

// A warp's 32 tasks through the per-thread calls, lanes deliberately apart:
// some submit late, some wait late, so results complete in another order
// than they are collected.
__device__ void diverged_chunk(const chi_dev_context_t *ctx, chi_route_t route, const DevTask *t,
                               DevResult *r, uint32_t lane, DevControl *c) {
  if (lane % 3u == 0u) __nanosleep(200u + 20u * lane);
  chi_future_t f = 0;
  chi_status_t s = submit_task(ctx, route, t, &f);
  if (s != CHI_OK) {
    r->phase = kRefused;
    r->status = s;
    return;
  }
  if (lane & 1u) __nanosleep(40u * lane);
  uint32_t got = 0;
  s = chi_dev_wait(ctx, f, kWaitTimeoutNs, r->output, CHI_DEMO_MAX_INPUT, &got);
  record_wait(s, got, r, c);
}

// Many warps at once, each taking chunks of 32 tasks; even chunks use the
// warp variants, odd chunks the per-thread calls.
__global__ void burst_kernel(chi_dev_context_t ctx, chi_route_t route, const DevTask *tasks,
                             DevResult *res, uint32_t n, DevControl *c) {
  const uint32_t lane = threadIdx.x % 32u;
  const uint32_t warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32u;
  const uint32_t nwarps = gridDim.x * blockDim.x / 32u;
  for (uint32_t chunk = warp; chunk * 32u < n; chunk += nwarps) {
    const int stop = __shfl_sync(kFullMask, lane == 0 ? (aborted(c) ? 1 : 0) : 0, 0);
    if (stop) return;
    const uint32_t i = chunk * 32u + lane;
    const bool mine = i < n;
    if ((chunk & 1u) == 0u)
      warp_chunk(&ctx, route, mine ? &tasks[i] : nullptr, mine ? &res[i] : nullptr, mine, c);
    else if (mine)
      diverged_chunk(&ctx, route, &tasks[i], &res[i], lane, c);
    __syncwarp();
  }
}

struct Gpu {
  int32_t id = 0;
  int ordinal = -1;
  chi_dev_context_t ctx{};
  cudaStream_t stream = nullptr;
  DevTask *tasks = nullptr;
  DevResult *results = nullptr;
  DevControl *control = nullptr;
  double nominal_ns_per_cycle = NAN;
  std::string error;  // set up failed: every row of this GPU fails with it
};

void fail(chi_demo_row *row, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void fail(chi_demo_row *row, const char *fmt, ...) {
  row->failures++;
  if (row->detail[0] != '\0') return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(row->detail, sizeof row->detail, fmt, ap);
  va_end(ap);
}

std::string cuda_msg(const char *what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorString(e);
}

// The CUDA device of a GPU id: where its context's device memory lives.
cudaError_t ordinal_of(const chi_dev_context_t &ctx, int *ordinal) {
  const auto *l = reinterpret_cast<const chi_dev_ctx_layout_t *>(&ctx);
  cudaPointerAttributes a{};
  cudaError_t e = cudaPointerGetAttributes(&a, l->d2d_state);
  if (e == cudaSuccess) *ordinal = a.device;
  return e;
}

void setup(chi_runtime_t *rt, uint32_t batch, Gpu *g) {
  chi_status_t st = chi_gpu_context(rt, g->id, &g->ctx);
  if (st != CHI_OK) {
    g->error =
        std::string("chi_gpu_context: ") + chi_status_string(st) + ": " + chi_last_error_message();
    return;
  }
  cudaError_t e = ordinal_of(g->ctx, &g->ordinal);
  if (e == cudaSuccess) e = cudaSetDevice(g->ordinal);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaMalloc(&g->tasks, sizeof(DevTask) * batch);
  if (e == cudaSuccess) e = cudaMalloc(&g->results, sizeof(DevResult) * batch);
  if (e == cudaSuccess) e = cudaMalloc(&g->control, sizeof(DevControl));
  if (e != cudaSuccess) {
    g->error = cuda_msg("setting up the GPU's buffers", e);
    return;
  }
  int khz = 0;
  if (cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, g->ordinal) == cudaSuccess && khz > 0)
    g->nominal_ns_per_cycle = 1e6 / khz;
}

// The first launch of a kernel may load its module, and under CUDA's lazy
// loading that can wait for every running kernel, the orchestrators
// included, which wait for nobody: launch each kernel once, with nothing to
// do, while the orchestrators are paused.
void preload(chi_runtime_t *rt, std::vector<Gpu> &gpus) {
  chi_status_t st = chi_gpu_pause(rt, -1);
  if (st != CHI_OK) {
    std::string why =
        std::string("chi_gpu_pause: ") + chi_status_string(st) + ": " + chi_last_error_message();
    for (auto &g : gpus)
      if (g.error.empty()) g.error = why;
    return;
  }
  for (auto &g : gpus) {
    if (!g.error.empty()) continue;
    cudaSetDevice(g.ordinal);
    serial_kernel<<<1, 32, 0, g.stream>>>(g.ctx, CHI_ROUTE_LOCAL, nullptr, nullptr, 0, nullptr);
    burst_kernel<<<1, 32, 0, g.stream>>>(g.ctx, CHI_ROUTE_LOCAL, nullptr, nullptr, 0, nullptr);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaStreamSynchronize(g.stream);
    if (e != cudaSuccess) g.error = cuda_msg("loading the demo kernels", e);
  }
  st = chi_gpu_resume(rt, -1);
  if (st != CHI_OK) {
    std::string why =
        std::string("chi_gpu_resume: ") + chi_status_string(st) + ": " + chi_last_error_message();
    for (auto &g : gpus)
      if (g.error.empty()) g.error = why;
  }
}

// cudaFree waits for every kernel of the device, so it runs while the
// orchestrators are paused; if they cannot be paused the buffers are left
// for the process exit to reclaim.
void release(chi_runtime_t *rt, std::vector<Gpu> &gpus) {
  for (auto &g : gpus)
    if (g.stream) {
      cudaSetDevice(g.ordinal);
      cudaStreamSynchronize(g.stream);
    }
  const bool paused = chi_gpu_pause(rt, -1) == CHI_OK;
  for (auto &g : gpus) {
    if (g.ordinal < 0) continue;
    cudaSetDevice(g.ordinal);
    if (paused) {
      cudaFree(g.tasks);
      cudaFree(g.results);
      cudaFree(g.control);
    }
    if (g.stream) cudaStreamDestroy(g.stream);
  }
  if (paused && chi_gpu_resume(rt, -1) != CHI_OK)
    std::fprintf(stderr, "chimaera-demo: chi_gpu_resume: %s\n", chi_last_error_message());
}

// Checks one batch's results; returns false when the route was abandoned.
bool check_batch(const std::vector<chi_demo_task_t> &tasks, const std::vector<DevResult> &res,
                 uint32_t n, bool timed, double ns_per_cycle, std::vector<uint64_t> *lat,
                 chi_demo_row *row) {
  bool abandoned = false;
  for (uint32_t i = 0; i < n; i++) {
    const DevResult &r = res[i];
    row->tasks++;
    char why[160];
    switch (r.phase) {
      case kNotRun:
        abandoned = true;
        fail(row, "not run: an earlier task of this route timed out");
        break;
      case kRefused:
        fail(row, "chi_dev_submit: %s", chi_status_string(r.status));
        break;
      default:
        if (r.status == CHI_ERR_TIMEOUT) {
          fail(row, "chi_dev_wait: no result after %lld ms",
               static_cast<long long>(kWaitTimeoutNs / 1000000));
        } else if (!chi_demo_check(&tasks[i], r.status, r.output, r.output_size, why, sizeof why)) {
          fail(row, "%s", why);
        }
        if (timed && !std::isnan(ns_per_cycle))
          lat->push_back(static_cast<uint64_t>(std::llround(r.cycles * ns_per_cycle)));
    }
  }
  return !abandoned;
}

void run_route(Gpu &g, chi_route_t route, const char *label, chi_method_t reverse,
               int reverse_served, const chi_demo_options *opt, uint32_t batch, chi_demo_row *row) {
  std::memset(row, 0, sizeof *row);
  std::snprintf(row->route, sizeof row->route, "%s", label);
  row->p50_ns = row->p99_ns = NAN;
  if (!g.error.empty()) {
    fail(row, "%s", g.error.c_str());
    return;
  }
  cudaSetDevice(g.ordinal);
  const uint64_t timed = (opt->tasks + 1) / 2;
  std::vector<chi_demo_task_t> tasks(batch);
  std::vector<DevTask> dtasks(batch);
  std::vector<DevResult> res(batch);
  std::vector<uint64_t> lat;
  lat.reserve(timed < (1u << 20) ? timed : (1u << 20));

  for (uint64_t first = 0; first < opt->tasks;) {
    const bool serial = first < timed;
    const uint64_t end = serial ? timed : opt->tasks;
    const uint32_t n = static_cast<uint32_t>(end - first < batch ? end - first : batch);
    for (uint32_t i = 0; i < n; i++) {
      chi_demo_make_task(opt->seed, first + i, reverse, reverse_served, &tasks[i]);
      dtasks[i].method = tasks[i].method;
      dtasks[i].input_size = static_cast<uint32_t>(tasks[i].input_size);
      std::memcpy(dtasks[i].input, tasks[i].input, tasks[i].input_size);
    }
    DevControl ctl{};
    cudaError_t e = cudaMemcpyAsync(g.tasks, dtasks.data(), sizeof(DevTask) * n,
                                    cudaMemcpyHostToDevice, g.stream);
    if (e == cudaSuccess) e = cudaMemsetAsync(g.results, 0, sizeof(DevResult) * n, g.stream);
    if (e == cudaSuccess) e = cudaMemsetAsync(g.control, 0, sizeof(DevControl), g.stream);
    if (e == cudaSuccess) {
      if (serial)
        serial_kernel<<<1, 32, 0, g.stream>>>(g.ctx, route, g.tasks, g.results, n, g.control);
      else
        burst_kernel<<<kBurstBlocks, kBurstThreads, 0, g.stream>>>(g.ctx, route, g.tasks, g.results,
                                                                   n, g.control);
      e = cudaGetLastError();
    }
    if (e == cudaSuccess)
      e = cudaMemcpyAsync(res.data(), g.results, sizeof(DevResult) * n, cudaMemcpyDeviceToHost,
                          g.stream);
    if (e == cudaSuccess)
      e = cudaMemcpyAsync(&ctl, g.control, sizeof ctl, cudaMemcpyDeviceToHost, g.stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(g.stream);
    if (e != cudaSuccess) {
      fail(row, "%s", cuda_msg(serial ? "serial kernel" : "burst kernel", e).c_str());
      g.error = row->detail;  // a faulted context fails every later route too
      return;
    }
    double ns_per_cycle = g.nominal_ns_per_cycle;
    if (serial && ctl.c1 > ctl.c0 && ctl.g1 > ctl.g0)
      ns_per_cycle = double(ctl.g1 - ctl.g0) / double(ctl.c1 - ctl.c0);
    if (!check_batch(tasks, res, n, serial, ns_per_cycle, &lat, row)) return;
    first += n;
  }
  chi_tool_stats_t stats;
  chi_tool_summarize(lat.data(), lat.size(), &stats);
  row->p50_ns = stats.p50_ns;
  row->p99_ns = stats.p99_ns;
}

}  // namespace

extern "C" int chi_demo_gpu_routes(chi_runtime_t *rt, const struct chi_demo_options *opt,
                                   struct chi_demo_row *rows, int max_rows) {
  if (rt == nullptr || opt == nullptr || rows == nullptr || opt->gpu_count <= 0 || max_rows <= 0)
    return 0;
  int prev_device = 0;
  const bool have_prev = cudaGetDevice(&prev_device) == cudaSuccess;
  // demo.reverse has a CPU handler and no GPU one: GPU->CPU runs it, GPU->GPU
  // must answer CHI_ERR_NOT_FOUND.
  chi_method_t reverse = 0;
  if (chi_method_lookup(rt, CHI_DEMO_REVERSE_NAME, &reverse) != CHI_OK) reverse = 0;
  const uint32_t batch = static_cast<uint32_t>(opt->tasks < kBatch ? opt->tasks : kBatch);

  std::vector<Gpu> gpus(static_cast<size_t>(opt->gpu_count));
  for (int32_t i = 0; i < opt->gpu_count; i++) {
    gpus[i].id = i;
    setup(rt, batch, &gpus[i]);
  }
  preload(rt, gpus);

  int n = 0;
  for (auto &g : gpus) {
    char label[40];
    if (n < max_rows) {
      std::snprintf(label, sizeof label, "GPU %d -> CPU", static_cast<int>(g.id));
      run_route(g, CHI_ROUTE_CPU, label, reverse, 1, opt, batch, &rows[n++]);
    }
    if (n < max_rows) {
      std::snprintf(label, sizeof label, "GPU %d -> LOCAL (GPU %d)", static_cast<int>(g.id),
                    static_cast<int>(g.id));
      run_route(g, CHI_ROUTE_LOCAL, label, reverse, 0, opt, batch, &rows[n++]);
    }
  }
  release(rt, gpus);
  cudaGetLastError();
  if (have_prev) cudaSetDevice(prev_device);
  return n;
}

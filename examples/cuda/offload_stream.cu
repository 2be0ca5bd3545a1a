// offload_stream: CPU code that sends a stream of small tasks to the GPU.
//
// The task, y' = a*x + y on a 12-element vector carried inline (104 bytes in,
// 48 out), is "example.saxpy": a device handler defined in this file and
// served by a user orchestrator made with CHI_DEFINE_ORCHESTRATOR and
// installed with chi_gpu_set_orchestrator.  The same stream of tasks runs
// three ways, timed:
//   1. one kernel launch + cudaStreamSynchronize per task (input and output
//      in mapped pinned memory, so no copies: the cheapest launch there is);
//   2. chimaera, one task at a time: chi_submit(CHI_ROUTE_GPU_ANY) + chi_wait,
//      served by the orchestrator that is already running;
//   3. chimaera pipelined: up to kWindow tasks in flight.
// Every result is checked (bit for bit: both sides use a fused multiply-add).
//
// Usage: chi_example_offload_stream [TASKS]   (default 20000)
// Exit status: 0 every result right, 1 a failure, 77 no usable GPU.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <vector>

#include "chimaera.h"
#include "chimaera_device.h"

namespace {

constexpr uint32_t kN = 12;  // vector length: the task fits one 112-byte inline record
constexpr uint32_t kWindow = 64;
constexpr int64_t kWaitNs = 10'000'000'000;

// The task's input as it travels (little-endian, packed).
struct SaxpyIn {
  float a;
  uint32_t n;
  float x[kN];
  float y[kN];
};
static_assert(sizeof(SaxpyIn) == 8 + 8 * kN, "packed input");

// ---- the device handler and the user orchestrator ---------------------------

// Runs on the orchestrator's warp: each lane computes some elements.  The
// input and output buffers carry no alignment promise: bytes are copied.
__device__ chi_status_t saxpy(chi_dev_request_t *req) {
  const uint8_t *in = static_cast<const uint8_t *>(req->input);
  if (req->input_size < 8) return CHI_ERR_INVALID;
  float a;
  uint32_t n;
  memcpy(&a, in, 4);
  memcpy(&n, in + 4, 4);
  if (n > kN || req->input_size != 8 + 8 * n) return CHI_ERR_INVALID;
  if (req->output_capacity < 4 * n) return CHI_ERR_TOO_LARGE;
  uint8_t *out = static_cast<uint8_t *>(req->output);
  for (uint32_t i = threadIdx.x % 32u; i < n; i += 32u) {
    float x, y;
    memcpy(&x, in + 8 + 4 * i, 4);
    memcpy(&y, in + 8 + 4 * (n + i), 4);
    const float r = __fmaf_rn(a, x, y);
    memcpy(out + 4 * i, &r, 4);
  }
  req->output_size = 4 * n;
  return CHI_OK;
}

// index: position of the method in kMethods.
__device__ chi_status_t example_dispatch(uint32_t index, chi_dev_request_t *req) {
  switch (index) {
    case 0:
      return saxpy(req);
    default:
      return CHI_ERR_NOT_FOUND;
  }
}

const char *const kMethods[] = {"example.saxpy"};

}  // namespace

// Defines the orchestrator kernel (the built-in loop, dispatching to
// example_dispatch), its launcher, and example_orchestrator() for
// chi_gpu_set_orchestrator.  Built-in methods keep working.
CHI_DEFINE_ORCHESTRATOR(example_orchestrator, example_dispatch, kMethods, 1)

namespace {

// ---- the per-task kernel the chimaera path replaces ---------------------------

__global__ void saxpy_kernel(const SaxpyIn *in, float *out) {
  const uint32_t i = threadIdx.x;
  if (i < in->n) out[i] = __fmaf_rn(in->a, in->x[i], in->y[i]);
}

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

void make_task(uint64_t k, SaxpyIn *t) {
  t->a = 0.5f + float(k % 7);
  t->n = kN;
  for (uint32_t i = 0; i < kN; i++) {
    t->x[i] = float((k * 31 + i) % 1000) * 0.125f;
    t->y[i] = float((k * 17 + 3 * i) % 977) - 400.0f;
  }
}

bool right(const SaxpyIn &t, const float *out) {
  for (uint32_t i = 0; i < t.n; i++)
    if (out[i] != fmaf(t.a, t.x[i], t.y[i])) return false;
  return true;
}

// The CUDA device behind a chimaera GPU (chimaera numbers only the usable
// devices): the one that holds its context's device memory.
int cuda_device_of(const chi_dev_context_t &ctx) {
  const auto *l = reinterpret_cast<const chi_dev_ctx_layout_t *>(&ctx);
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, l->d2d_state) != cudaSuccess) return 0;
  return a.device;
}

struct Timing {
  double us_per_task = 0;
  uint64_t wrong = 0;
  const char *error = nullptr;
  char detail[160] = "";
};

Timing by_launch(uint64_t tasks, cudaStream_t stream, SaxpyIn *in, float *out) {
  Timing r;
  const uint64_t t0 = now_ns();
  for (uint64_t k = 0; k < tasks; k++) {
    make_task(k, in);
    saxpy_kernel<<<1, 32, 0, stream>>>(in, out);
    cudaError_t e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) {
      r.error = "kernel launch";
      snprintf(r.detail, sizeof r.detail, "%s", cudaGetErrorString(e));
      return r;
    }
    if (!right(*in, out)) r.wrong++;
  }
  r.us_per_task = double(now_ns() - t0) / 1e3 / double(tasks);
  return r;
}

Timing by_chimaera(chi_runtime_t *rt, chi_method_t saxpy_id, uint64_t tasks, uint32_t window) {
  Timing r;
  std::vector<SaxpyIn> in(window);
  std::vector<chi_future_t> fut(window);
  float out[kN];
  uint64_t issued = 0, done = 0;
  const uint64_t t0 = now_ns();
  while (done < tasks) {
    // Fill the window, then collect the oldest task.
    while (issued < tasks && issued - done < window) {
      SaxpyIn &t = in[issued % window];
      make_task(issued, &t);
      chi_status_t s =
          chi_submit(rt, CHI_ROUTE_GPU_ANY, saxpy_id, &t, sizeof t, &fut[issued % window]);
      if (s != CHI_OK) {
        r.error = "chi_submit";
        snprintf(r.detail, sizeof r.detail, "%s: %s", chi_status_string(s),
                 chi_last_error_message());
        return r;
      }
      issued++;
    }
    size_t got = 0;
    chi_status_t s = chi_wait(rt, fut[done % window], kWaitNs, out, sizeof out, &got);
    if (s != CHI_OK) {
      r.error = "chi_wait";
      snprintf(r.detail, sizeof r.detail, "%s: %s", chi_status_string(s), chi_last_error_message());
      return r;
    }
    if (got != sizeof out || !right(in[done % window], out)) r.wrong++;
    done++;
  }
  r.us_per_task = double(now_ns() - t0) / 1e3 / double(tasks);
  return r;
}

bool report(const char *what, const Timing &t, uint64_t tasks) {
  if (t.error) {
    fprintf(stderr, "offload_stream: %s: %s: %s\n", what, t.error, t.detail);
    return false;
  }
  printf("  %-38s %8.2f us/task  (%.1f ms)\n", what, t.us_per_task, t.us_per_task * tasks / 1e3);
  if (t.wrong)
    fprintf(stderr, "offload_stream: %s: %llu wrong results\n", what, (unsigned long long)t.wrong);
  return t.wrong == 0;
}

}  // namespace

int main(int argc, char **argv) {
  uint64_t tasks = 20000;
  if (argc > 1) {
    char *end = nullptr;
    tasks = strtoull(argv[1], &end, 10);
    if (!end || *end || tasks == 0) {
      fprintf(stderr, "usage: %s [TASKS]\n", argv[0]);
      return 1;
    }
  }
  // Load the per-task kernel now: a first launch while an orchestrator runs
  // could make CUDA's lazy module loading wait for that never-ending kernel.
  // (The orchestrator kernel itself is launched by chi_gpu_set_orchestrator,
  // which stops the built-in one first.)  Without a GPU this fails;
  // chi_gpu_count below says so.
  cudaFuncAttributes attr;
  if (cudaFuncGetAttributes(&attr, saxpy_kernel) != cudaSuccess) cudaGetLastError();

  chi_runtime_t *rt = nullptr;
  chi_status_t st = chi_init(nullptr, &rt);
  if (st != CHI_OK) {
    fprintf(stderr, "chi_init: %s: %s\n", chi_status_string(st), chi_last_error_message());
    return 1;
  }
  int32_t gpus = 0;
  if (chi_gpu_count(rt, &gpus) != CHI_OK || gpus == 0) {
    printf("offload_stream: no usable GPU, skipped\n");
    chi_finalize(rt);
    return 77;
  }

  // Every GPU runs our orchestrator: GPU_ANY may pick any of them.
  const chi_gpu_orchestrator_t orch = example_orchestrator();
  chi_method_t saxpy_id = 0;
  st = chi_gpu_set_orchestrator(rt, -1, &orch);
  if (st == CHI_OK) st = chi_method_lookup(rt, "example.saxpy", &saxpy_id);
  chi_dev_context_t ctx;
  if (st == CHI_OK) st = chi_gpu_context(rt, 0, &ctx);
  if (st != CHI_OK) {
    fprintf(stderr, "offload_stream: setup: %s: %s\n", chi_status_string(st),
            chi_last_error_message());
    chi_finalize(rt);
    return 1;
  }

  cudaStream_t stream = nullptr;
  SaxpyIn *in = nullptr;
  float *out = nullptr;
  cudaError_t e = cudaSetDevice(cuda_device_of(ctx));
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaHostAlloc(&in, sizeof *in, cudaHostAllocMapped);
  if (e == cudaSuccess) e = cudaHostAlloc(&out, sizeof(float) * kN, cudaHostAllocMapped);
  if (e != cudaSuccess) {
    fprintf(stderr, "offload_stream: CUDA: %s\n", cudaGetErrorString(e));
    chi_finalize(rt);
    return 1;
  }

  // Warm-up, untimed: first launches, first tasks, page faults.
  const uint64_t warm = tasks < 1000 ? tasks : 1000;
  bool ok = by_launch(warm, stream, in, out).error == nullptr &&
            by_chimaera(rt, saxpy_id, warm, kWindow).error == nullptr;
  printf(
      "offload_stream: %llu example.saxpy tasks (%u-element vectors, %zu bytes in, %zu out) on %d "
      "GPU(s):\n",
      (unsigned long long)tasks, kN, sizeof(SaxpyIn), sizeof(float) * kN, (int)gpus);
  const Timing launch = by_launch(tasks, stream, in, out);
  const Timing one = by_chimaera(rt, saxpy_id, tasks, 1);
  const Timing piped = by_chimaera(rt, saxpy_id, tasks, kWindow);
  ok = report("kernel launch + sync per task", launch, tasks) && ok;
  ok = report("chimaera submit + wait per task", one, tasks) && ok;
  char label[64];
  snprintf(label, sizeof label, "chimaera pipelined (window %u)", kWindow);
  ok = report(label, piped, tasks) && ok;
  if (!launch.error && !one.error && one.us_per_task > 0)
    printf("  chimaera per task is %.1fx the speed of a launch per task; pipelined %.1fx\n",
           launch.us_per_task / one.us_per_task,
           piped.us_per_task > 0 ? launch.us_per_task / piped.us_per_task : 0.0);

  st = chi_finalize(rt);
  if (st != CHI_OK) {
    fprintf(stderr, "chi_finalize: %s: %s\n", chi_status_string(st), chi_last_error_message());
    ok = false;
  }
  // The orchestrators are gone: freeing cannot wait on them now.
  cudaFreeHost(in);
  cudaFreeHost(out);
  cudaStreamDestroy(stream);
  printf("%s\n", ok ? "offload_stream: every result right" : "offload_stream: FAILED");
  return ok ? 0 : 1;
}

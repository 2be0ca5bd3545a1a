// host_writer: a CUDA kernel that calls a host handler while it runs, to
// stream its results into a file.
//
// Each block reduces chunks of a data array (sum, min, max, odd count) and,
// for every chunk, submits one row to "example.write" with CHI_ROUTE_CPU.
// That method is a plain CPU handler: a chimaera poller thread runs it (it
// appends a text line to a file) while the kernel goes on with its next
// chunk; each block keeps one row in flight.  When the kernel is done the
// program re-reads the file and checks every row against the CPU's answer.
//
// Usage: chi_example_host_writer [FILE]   (default: a temporary file, removed)
// Exit status: 0 every row right, 1 a failure, 77 no usable GPU.
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <vector>

#include "chimaera.h"
#include "chimaera_device.h"

namespace {

constexpr uint32_t kChunk = 4096;   // elements reduced into one row
constexpr uint32_t kChunks = 2048;  // rows in the file
constexpr uint32_t kBlocks = 64;
constexpr uint32_t kThreads = 256;  // a power of two (tree reduction)
constexpr int64_t kWaitNs = 10'000'000'000;

// One row as the kernel sends it (the task's input).
struct Row {
  uint32_t chunk;
  uint32_t odd;
  unsigned long long sum;
  uint32_t min;
  uint32_t max;
};

// What the kernel reports back (device memory).
struct Report {
  unsigned long long written;  // rows the handler acknowledged
  unsigned failed;             // rows that failed
  int status;                  // the first failure's status
};

uint32_t value_at(uint64_t i) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull;
  x ^= x >> 29;
  return static_cast<uint32_t>(x & 0xFFFFFu);
}

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

// ---- the host side of the method: a CPU handler ----------------------------

struct Writer {
  FILE *file;
  pthread_mutex_t mu;  // chimaera may run the handler on several threads at once
  uint64_t lines;
  uint64_t first_ns;  // when the first row was written
};

// example.write: appends a row as one text line; answers the line number.
chi_status_t write_row(chi_request_t *req, void *user_data) {
  Writer *w = static_cast<Writer *>(user_data);
  Row r;
  if (req->input_size != sizeof r || req->output_capacity < sizeof(uint64_t))
    return CHI_ERR_INVALID;
  memcpy(&r, req->input, sizeof r);
  pthread_mutex_lock(&w->mu);
  const int n = fprintf(w->file, "chunk %u sum %llu min %u max %u odd %u gpu %d\n", r.chunk, r.sum,
                        r.min, r.max, r.odd, static_cast<int>(req->source));
  const uint64_t line = w->lines++;
  if (line == 0) w->first_ns = now_ns();
  pthread_mutex_unlock(&w->mu);
  if (n < 0) return CHI_ERR_USER_BASE - 1;  // handler-defined: the write failed
  memcpy(req->output, &line, sizeof line);
  req->output_size = sizeof line;
  return CHI_OK;
}

// ---- the kernel ---------------------------------------------------------------

__device__ void row_failed(Report *rep, chi_status_t s) {
  if (atomicAdd(&rep->failed, 1u) == 0u) rep->status = s;
}

// Submits a row.  When every GPU->CPU slot is busy, chi_dev_submit waits for
// one (up to gpu.device_submit_timeout_us, then CHI_ERR_AGAIN).  Returns the
// future, or 0 after recording the failure.
__device__ chi_future_t submit_row(const chi_dev_context_t *ctx, chi_method_t write, const Row &row,
                                   Report *rep) {
  chi_future_t f = 0;
  chi_status_t s = chi_dev_submit(ctx, CHI_ROUTE_CPU, write, &row, sizeof row, &f);
  if (s == CHI_OK) return f;
  row_failed(rep, s);
  return 0;
}

__device__ void collect(const chi_dev_context_t *ctx, chi_future_t f, Report *rep) {
  unsigned long long line = 0;
  uint32_t n = 0;
  chi_status_t s = chi_dev_wait(ctx, f, kWaitNs, &line, sizeof line, &n);
  if (s == CHI_OK && n == sizeof line)
    atomicAdd(&rep->written, 1ull);
  else
    row_failed(rep, s == CHI_OK ? CHI_ERR_PROTOCOL : s);
}

__global__ void reduce_and_write(chi_dev_context_t ctx, chi_method_t write, const uint32_t *data,
                                 uint32_t chunks, Report *rep) {
  __shared__ unsigned long long s_sum[kThreads];
  __shared__ uint32_t s_min[kThreads], s_max[kThreads], s_odd[kThreads];
  const uint32_t t = threadIdx.x;
  chi_future_t pending = 0;  // thread 0's row in flight
  for (uint32_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    const uint32_t *p = data + static_cast<size_t>(c) * kChunk;
    unsigned long long sum = 0;
    uint32_t mn = 0xFFFFFFFFu, mx = 0, odd = 0;
    for (uint32_t i = t; i < kChunk; i += blockDim.x) {
      const uint32_t v = p[i];
      sum += v;
      mn = min(mn, v);
      mx = max(mx, v);
      odd += v & 1u;
    }
    s_sum[t] = sum;
    s_min[t] = mn;
    s_max[t] = mx;
    s_odd[t] = odd;
    __syncthreads();
    for (uint32_t half = blockDim.x / 2; half > 0; half /= 2) {
      if (t < half) {
        s_sum[t] += s_sum[t + half];
        s_min[t] = min(s_min[t], s_min[t + half]);
        s_max[t] = max(s_max[t], s_max[t + half]);
        s_odd[t] += s_odd[t + half];
      }
      __syncthreads();
    }
    if (t == 0) {
      // The previous row has had a whole chunk's worth of time to be written.
      if (pending) collect(&ctx, pending, rep);
      const Row row{c, s_odd[0], s_sum[0], s_min[0], s_max[0]};
      pending = submit_row(&ctx, write, row, rep);
    }
    __syncthreads();
  }
  if (t == 0 && pending) collect(&ctx, pending, rep);
}

// The CUDA device behind a chimaera GPU (chimaera numbers only the usable
// devices): the one that holds its context's device memory.
int cuda_device_of(const chi_dev_context_t &ctx) {
  const auto *l = reinterpret_cast<const chi_dev_ctx_layout_t *>(&ctx);
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, l->d2d_state) != cudaSuccess) return 0;
  return a.device;
}

// ---- checking the file ----------------------------------------------------------

int check_file(const char *path, const std::vector<uint32_t> &data, int32_t gpus) {
  FILE *f = fopen(path, "r");
  if (!f) {
    perror(path);
    return 1;
  }
  std::vector<char> seen(kChunks, 0);
  char line[256];
  unsigned rows = 0, bad = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned chunk, mn, mx, odd;
    unsigned long long sum;
    int gpu;
    if (sscanf(line, "chunk %u sum %llu min %u max %u odd %u gpu %d", &chunk, &sum, &mn, &mx, &odd,
               &gpu) != 6 ||
        chunk >= kChunks || seen[chunk] || gpu < 0 || gpu >= gpus) {
      if (bad++ == 0) fprintf(stderr, "host_writer: bad or repeated row: %s", line);
      continue;
    }
    seen[chunk] = 1;
    rows++;
    unsigned long long want_sum = 0;
    uint32_t want_min = 0xFFFFFFFFu, want_max = 0, want_odd = 0;
    for (uint32_t i = 0; i < kChunk; i++) {
      const uint32_t v = data[size_t(chunk) * kChunk + i];
      want_sum += v;
      want_min = v < want_min ? v : want_min;
      want_max = v > want_max ? v : want_max;
      want_odd += v & 1u;
    }
    if (sum != want_sum || mn != want_min || mx != want_max || odd != want_odd) {
      if (bad++ == 0)
        fprintf(stderr,
                "host_writer: chunk %u: got sum %llu min %u max %u odd %u, want %llu %u %u %u\n",
                chunk, sum, mn, mx, odd, want_sum, want_min, want_max, want_odd);
    }
  }
  fclose(f);
  if (rows != kChunks) fprintf(stderr, "host_writer: %u of %u rows in %s\n", rows, kChunks, path);
  return rows == kChunks && bad == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char **argv) {
  char tmp[] = "/tmp/chimaera-host-writer-XXXXXX";
  const char *path = argc > 1 ? argv[1] : nullptr;

  // Load the kernel now: a first launch while an orchestrator runs could make
  // CUDA's lazy module loading wait for that never-ending kernel.  Without a
  // GPU this fails; chi_gpu_count below says so.
  cudaFuncAttributes attr;
  if (cudaFuncGetAttributes(&attr, reduce_and_write) != cudaSuccess) cudaGetLastError();

  chi_runtime_t *rt = nullptr;
  chi_status_t st = chi_init(nullptr, &rt);
  if (st != CHI_OK) {
    fprintf(stderr, "chi_init: %s: %s\n", chi_status_string(st), chi_last_error_message());
    return 1;
  }
  int32_t gpus = 0;
  if (chi_gpu_count(rt, &gpus) != CHI_OK || gpus == 0) {
    printf("host_writer: no usable GPU, skipped\n");
    chi_finalize(rt);
    return 77;
  }

  Writer w{};
  pthread_mutex_init(&w.mu, nullptr);
  if (!path) {
    int fd = mkstemp(tmp);
    if (fd >= 0) close(fd);
    path = tmp;
  }
  w.file = fopen(path, "w");
  if (!w.file) {
    perror(path);
    chi_finalize(rt);
    return 1;
  }
  chi_method_t write = 0;
  st = chi_register_handler(rt, "example.write", write_row, &w, &write);
  chi_dev_context_t ctx;
  if (st == CHI_OK) st = chi_gpu_context(rt, 0, &ctx);
  if (st != CHI_OK) {
    fprintf(stderr, "setup: %s: %s\n", chi_status_string(st), chi_last_error_message());
    chi_finalize(rt);
    return 1;
  }

  // Device memory on chimaera's GPU 0; our own non-blocking stream, never the
  // default one, and no cudaDeviceSynchronize/cudaFree while the runtime runs.
  std::vector<uint32_t> data(size_t(kChunks) * kChunk);
  for (size_t i = 0; i < data.size(); i++) data[i] = value_at(i);
  cudaStream_t stream = nullptr;
  uint32_t *d_data = nullptr;
  Report *d_rep = nullptr;
  Report rep{};
  cudaError_t e = cudaSetDevice(cuda_device_of(ctx));
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaMalloc(&d_data, data.size() * sizeof(uint32_t));
  if (e == cudaSuccess) e = cudaMalloc(&d_rep, sizeof(Report));
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(d_data, data.data(), data.size() * sizeof(uint32_t), cudaMemcpyHostToDevice,
                        stream);
  if (e == cudaSuccess) e = cudaMemsetAsync(d_rep, 0, sizeof(Report), stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  uint64_t t1 = 0;
  if (e == cudaSuccess) {
    reduce_and_write<<<kBlocks, kThreads, 0, stream>>>(ctx, write, d_data, kChunks, d_rep);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  t1 = now_ns();
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(&rep, d_rep, sizeof rep, cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);

  int failed = 0;
  if (e != cudaSuccess) {
    fprintf(stderr, "host_writer: CUDA: %s\n", cudaGetErrorString(e));
    failed = 1;
  } else if (rep.failed || rep.written != kChunks) {
    fprintf(stderr, "host_writer: %llu rows acknowledged, %u failed (first: %s)\n", rep.written,
            rep.failed, chi_status_string(rep.status));
    failed = 1;
  }
  // Every acknowledged row is in the file: the handler wrote it before answering.
  fclose(w.file);
  if (!failed) failed = check_file(path, data, gpus);
  if (!failed)
    printf(
        "host_writer: %u rows from %u blocks written to %s by a CPU handler; the first "
        "landed %.2f ms before the kernel finished; every row checked\n",
        kChunks, kBlocks, path, w.first_ns && t1 > w.first_ns ? (t1 - w.first_ns) / 1e6 : 0.0);

  st = chi_finalize(rt);
  if (st != CHI_OK) {
    fprintf(stderr, "chi_finalize: %s: %s\n", chi_status_string(st), chi_last_error_message());
    failed = 1;
  }
  // The orchestrators are gone: freeing device memory cannot wait on them now.
  cudaFree(d_data);
  cudaFree(d_rep);
  if (stream) cudaStreamDestroy(stream);
  pthread_mutex_destroy(&w.mu);
  if (argc <= 1) unlink(path);
  return failed;
}

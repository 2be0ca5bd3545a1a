/*
 * The GPU backend through the public API: CPU->GPU, GPU->CPU and GPU->GPU
 * tasks with payloads of 0, 1, 64, 112, 113 and max bytes; CPU->GPU from 8
 * host threads; GPU->CPU and GPU->GPU from >= 1000 warps with per-task
 * checksums; device-side timeouts; pause/resume under load; registered
 * memory; error statuses on both sides.  Exit 77 without a usable GPU.
 *
 * Environment: CHI_TEST_WARPS (default 1024), CHI_TEST_TASKS_PER_WARP
 * (default 1000), CHI_TEST_H2D_TASKS (per host thread, default 4000): the
 * sanitizer runs set them lower.
 */
#include "gpu_common.h"

#include <time.h>

#include <atomic>
#include <thread>
#include <vector>

static chi_runtime_t *g_rt;
static chi_dev_context_t g_ctx;
static cudaStream_t g_stream;
static uint32_t g_max; /* gpu.max_payload */
static chi_method_t g_sleep_method, g_source_method, g_cpu_only_method;
static uint8_t *g_scratch; /* device: kernels' payload buffers */
static int32_t *g_st;      /* mapped pinned: kernels' statuses */
static uint32_t *g_val;    /* mapped pinned: kernels' values */
static unsigned long long *g_cnt; /* mapped pinned: counters */
/* Pinned buffers are allocated before chi_init and freed after chi_finalize:
 * cudaFreeHost (like cudaFree) waits for every kernel, the orchestrator too. */
static chi_mem_ref_t *g_refs;
static uint64_t *g_ptrs;

#define SCRATCH_BYTES (1u << 24)

static __host__ __device__ inline uint32_t size_at(int i) {
  const uint32_t s[] = {0, 1, 64, 112, 113, 4096};
  return s[i];
}
#define NSIZES 6

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
  nanosleep(&ts, NULL);
}

static void sync_stream(void) {
  CK(cudaGetLastError());
  CK(cudaStreamSynchronize(g_stream));
}

/* ----------------------------------------------------------- CPU handlers */

static chi_status_t h_sleep(chi_request_t *req, void *ud) {
  (void)ud;
  sleep_ms(150);
  req->output_size = 0;
  return CHI_OK;
}

static chi_status_t h_source(chi_request_t *req, void *ud) {
  (void)ud;
  if (req->output_capacity < 4) return CHI_ERR_TOO_LARGE;
  memcpy(req->output, &req->source, 4);
  req->output_size = 4;
  return CHI_OK;
}

static chi_status_t h_cpu_only(chi_request_t *req, void *ud) {
  (void)ud;
  req->output_size = 0;
  return CHI_OK;
}

/* ---------------------------------------------------------------- kernels */

/* One thread: echo and checksum of every size in kSizes over `route`.
 * st[4i..4i+3] = echo status, echo ok, checksum status, checksum ok. */
__global__ void k_payloads(chi_dev_context_t ctx, chi_route_t route, uint32_t max, uint8_t *scratch,
                           int32_t *st) {
  uint8_t *in = scratch, *out = scratch + 8192;
  for (int i = 0; i < NSIZES; ++i) {
    uint32_t n = size_at(i) == 4096 ? max : size_at(i);
    gt_fill(in, n, 1000 + i);
    chi_future_t f;
    uint32_t osz = 0xFFFF;
    chi_status_t s = chi_dev_submit(&ctx, route, CHI_METHOD_ECHO, in, n, &f);
    if (s == CHI_OK) s = chi_dev_wait(&ctx, f, GT_WAIT_NS, out, 8192, &osz);
    int ok = s == CHI_OK && osz == n;
    for (uint32_t b = 0; ok && b < n; ++b) ok = out[b] == in[b];
    st[4 * i] = s;
    st[4 * i + 1] = ok;
    s = chi_dev_submit(&ctx, route, CHI_METHOD_CHECKSUM, in, n, &f);
    if (s == CHI_OK) s = chi_dev_wait(&ctx, f, GT_WAIT_NS, out, 8, &osz);
    st[4 * i + 2] = s;
    st[4 * i + 3] = s == CHI_OK && osz == 8 && gt_load64(out) == gt_fnv(in, n);
  }
}

/* One thread, `rounds` times: a max-size echo whose every 32-bit word is
 * v (small numbers, like the generations of the slot's next tasks), then
 * echoes of 8 and 64 bytes, which go as LL words (GPU->GPU): a slot whose
 * plain bytes could pass for LL words with the next task's flag would hand
 * back those bytes.  st[0]: small echoes right, st[1]: tried, st[2]: first
 * wrong round, st[3]: its status. */
__global__ void k_mixed_sizes(chi_dev_context_t ctx, chi_route_t route, uint32_t max, uint32_t rounds,
                              uint8_t *scratch, int32_t *st) {
  uint8_t *in = scratch, *out = scratch + 8192;
  st[0] = st[1] = 0;
  st[2] = -1;
  for (uint32_t r = 0; r < rounds; ++r) {
    uint32_t *w = reinterpret_cast<uint32_t *>(in);
    for (uint32_t k = 0; k < max / 4u; ++k) w[k] = r + 1u + (k & 1u);
    chi_future_t f;
    uint32_t osz = 0;
    chi_status_t s = chi_dev_submit(&ctx, route, CHI_METHOD_ECHO, in, max, &f);
    if (s == CHI_OK) s = chi_dev_wait(&ctx, f, GT_WAIT_NS, out, 8192, &osz);
    for (uint32_t n = 8; n <= 64; n += 56) {
      gt_fill(in, n, 7u * r + n);
      s = chi_dev_submit(&ctx, route, CHI_METHOD_ECHO, in, n, &f);
      if (s == CHI_OK) s = chi_dev_wait(&ctx, f, GT_WAIT_NS, out, 8192, &osz);
      int ok = s == CHI_OK && osz == n;
      for (uint32_t b = 0; ok && b < n; ++b) ok = out[b] == in[b];
      st[1] += 1;
      st[0] += ok;
      if (!ok && st[2] < 0) {
        st[2] = static_cast<int32_t>(r);
        st[3] = s;
      }
    }
  }
}

/* One thread: echo of many sizes around the copy paths' edges (16-byte
 * pieces, the 64-byte register path, the 112-byte inline limit, batches,
 * the maximum), from inputs and into outputs at odd offsets.  Bytes around
 * the output must stay as they were (a copy that writes a padded tail past
 * the size would show here).  st[0]: tasks right, st[1]: first wrong
 * (size << 8 | in_off << 4 | out_off), st[2]: its status, st[3]: tasks tried. */
__global__ void k_shapes(chi_dev_context_t ctx, chi_route_t route, uint32_t max, uint8_t *scratch,
                         int32_t *st) {
  const uint32_t sizes[] = {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 48, 63, 64, 65, 80,
                            100, 111, 112, 113, 127, 128, 129, 1000, 1023, 1024, 4095, 0};
  const uint32_t in_offs[] = {0, 1, 3, 4, 8}, out_offs[] = {0, 1, 5, 8};
  uint8_t *in = scratch, *out = scratch + 8192;
  int32_t right = 0, tried = 0;
  st[1] = -1;
  for (uint32_t si = 0; si < sizeof sizes / sizeof sizes[0]; ++si) {
    const uint32_t n = sizes[si] == 0 ? max : sizes[si];
    if (n > max) continue;
    for (uint32_t ii = 0; ii < 5; ++ii)
      for (uint32_t oi = 0; oi < 4; ++oi) {
        const uint32_t io = in_offs[ii], oo = out_offs[oi];
        gt_fill(in + io, n, 7000 + n + io);
        for (uint32_t b = 0; b < n + oo + 48; ++b) out[b] = 0xA5;
        chi_future_t f;
        uint32_t osz = 0;
        ++tried;
        chi_status_t s = chi_dev_submit(&ctx, route, CHI_METHOD_ECHO, in + io, n, &f);
        if (s == CHI_OK) s = chi_dev_wait(&ctx, f, GT_WAIT_NS, out + oo, n, &osz);
        int ok = s == CHI_OK && osz == n;
        for (uint32_t b = 0; ok && b < oo; ++b) ok = out[b] == 0xA5;
        for (uint32_t b = 0; ok && b < n; ++b) ok = out[oo + b] == gt_byte(7000 + n + io, b);
        for (uint32_t b = 0; ok && b < 48; ++b) ok = out[oo + n + b] == 0xA5;
        if (ok) {
          ++right;
        } else if (st[1] == -1) {
          st[1] = (int32_t)(n << 8 | io << 4 | oo);
          st[2] = s;
        }
      }
  }
  st[0] = right;
  st[3] = tried;
}

/* One thread: the error paths of the device API over `route`. */
__global__ void k_errors(chi_dev_context_t ctx, chi_route_t route, uint32_t max, uint8_t *scratch,
                         int32_t *st, uint32_t *val) {
  uint8_t *in = scratch, *out = scratch + 8192;
  gt_fill(in, 64, 7);
  chi_future_t f = 0, g = 0;
  uint32_t osz = 0;
  st[0] = chi_dev_submit(&ctx, route, CHI_METHOD_ECHO, in, max + 1, &f); /* TOO_LARGE */
  st[1] = chi_dev_submit(&ctx, route, 4000, in, 8, &f);                   /* unknown: */
  st[2] = st[1] == CHI_OK ? chi_dev_wait(&ctx, f, GT_WAIT_NS, out, 64, &osz) : -100; /* NOT_FOUND */
  st[3] = chi_dev_submit(&ctx, route, CHI_METHOD_ECHO, in, 64, &f);
  st[4] = chi_dev_wait(&ctx, f, GT_WAIT_NS, out, 16, &osz); /* TOO_LARGE, future stays valid */
  val[0] = osz;                                             /* 64 */
  st[5] = chi_dev_wait(&ctx, f, GT_WAIT_NS, out, 64, &osz); /* OK */
  val[1] = osz;
  st[6] = chi_dev_wait(&ctx, f, GT_WAIT_NS, out, 64, &osz); /* consumed: INVALID */
  st[7] = chi_dev_wait(&ctx, 0, 0, out, 64, &osz);          /* INVALID */
  st[8] = chi_dev_submit(&ctx, CHI_ROUTE_GPU(7), CHI_METHOD_ECHO, in, 8, &g); /* NO_DEVICE with < 8 GPUs */
  st[9] = chi_dev_submit(&ctx, route, 0, in, 8, &g);                          /* INVALID */
  /* chi_dev_test until done, then the result. */
  st[10] = chi_dev_submit(&ctx, route, CHI_METHOD_ECHO, in, 64, &f);
  int done = 0;
  uint64_t t0 = chi_port::timer_ns();
  while (st[10] == CHI_OK && !done && chi_port::timer_ns() - t0 < (uint64_t)GT_WAIT_NS)
    if (chi_dev_test(&ctx, f, &done) != CHI_OK) break;
  st[11] = done;
  st[12] = chi_dev_wait(&ctx, f, GT_WAIT_NS, NULL, 0, &osz); /* discard: OK */
  st[13] = chi_dev_test(&ctx, f, &done);                     /* INVALID */
  /* A future of the other route kind and a forged one. */
  st[14] = chi_dev_wait(&ctx, f ^ (3ull << 52), 0, out, 64, &osz);
  st[15] = chi_dev_wait(&ctx, f + 5, 0, out, 64, &osz);
  /* chi_dev_wait with timeout 0 in a loop until the result comes, into an
   * 8-byte buffer (the reply's LL words) and a 64-byte one: TIMEOUT leaves
   * the future valid, the result is whole, and the future is consumed. */
  for (int k = 0; k < 2; ++k) {
    const uint32_t n = k == 0 ? 8u : 64u;
    gt_fill(in, n, 900 + n);
    for (uint32_t b = 0; b < n; ++b) out[b] = 0;
    chi_status_t s = chi_dev_submit(&ctx, route, CHI_METHOD_ECHO, in, n, &f);
    uint32_t polls = 0;
    t0 = chi_port::timer_ns();
    while (s == CHI_OK && chi_port::timer_ns() - t0 < (uint64_t)GT_WAIT_NS) {
      s = chi_dev_wait(&ctx, f, 0, out, n, &osz);
      ++polls;
      if (s != CHI_ERR_TIMEOUT) break;
      s = CHI_OK;
    }
    int same = osz == n;
    for (uint32_t b = 0; same && b < n; ++b) same = out[b] == gt_byte(900 + n, b);
    st[16 + 2 * k] = s;
    st[17 + 2 * k] = same;
    val[2 + k] = polls;
    st[20 + k] = chi_dev_wait(&ctx, f, 0, out, n, &osz); /* consumed: INVALID */
  }
}

/* Claims of a future by its waiters.  Thread 0: 1 ns waits in a loop until
 * the result comes (each TIMEOUT gives the future back; it stays valid, and
 * the result is whole).  Then `rounds` times, threads 0 and 32 (two warps)
 * wait on one future at once: exactly one gets the result.
 * st[0] the loop's last status, st[1] result whole, st[2] a wait after it,
 * st[3] rounds where one waiter got OK with the whole result and the other
 * INVALID, st[4] first bad pair (status << 16 | other status); val[4] TIMEOUTs. */
__global__ void k_claims(chi_dev_context_t ctx, chi_route_t route, uint32_t rounds, int32_t *st, uint32_t *val) {
  __shared__ chi_future_t shared_f;
  __shared__ int32_t got[2];
  uint8_t in[64], out[64];
  uint32_t osz = 0;
  const uint32_t t = threadIdx.x;
  if (t == 0) {
    gt_fill(in, 64, 4242);
    chi_future_t f;
    chi_status_t s = chi_dev_submit(&ctx, route, CHI_METHOD_ECHO, in, 64, &f);
    uint32_t timeouts = 0;
    const uint64_t t0 = chi_port::timer_ns();
    while (s == CHI_OK && chi_port::timer_ns() - t0 < (uint64_t)GT_WAIT_NS) {
      s = chi_dev_wait(&ctx, f, 1, out, 64, &osz);
      if (s != CHI_ERR_TIMEOUT) break;
      ++timeouts;
      s = CHI_OK;
    }
    int same = osz == 64;
    for (uint32_t b = 0; same && b < 64; ++b) same = out[b] == gt_byte(4242, b);
    st[0] = s;
    st[1] = same;
    st[2] = chi_dev_wait(&ctx, f, 0, out, 64, &osz);
    val[4] = timeouts;
    st[3] = 0;
    st[4] = 0;
  }
  for (uint32_t r = 0; r < rounds; ++r) {
    __syncthreads();
    if (t == 0) {
      gt_fill(in, 64, 5000 + r);
      if (chi_dev_submit(&ctx, route, CHI_METHOD_ECHO, in, 64, &shared_f) != CHI_OK) shared_f = 0;
    }
    __syncthreads();
    if (t == 0 || t == 32) {
      for (uint32_t b = 0; b < 64; ++b) out[b] = 0;
      osz = 0;
      chi_status_t s = chi_dev_wait(&ctx, shared_f, GT_WAIT_NS, out, 64, &osz);
      int same = osz == 64;
      for (uint32_t b = 0; same && b < 64; ++b) same = out[b] == gt_byte(5000 + r, b);
      got[t / 32] = s == CHI_OK && !same ? -1000 : s;
    }
    __syncthreads();
    if (t == 0) {
      const bool one = (got[0] == CHI_OK && got[1] == CHI_ERR_INVALID) ||
                       (got[1] == CHI_OK && got[0] == CHI_ERR_INVALID);
      if (one) ++st[3];
      else if (st[4] == 0) st[4] = (got[0] << 16) | (got[1] & 0xFFFF);
    }
  }
}

/* One thread: a CPU handler that takes 150 ms against a 5 ms device wait. */
__global__ void k_timeout(chi_dev_context_t ctx, chi_method_t sleeper, int32_t *st) {
  chi_future_t f;
  uint32_t n = 99;
  st[0] = chi_dev_submit(&ctx, CHI_ROUTE_CPU, sleeper, NULL, 0, &f);
  st[1] = chi_dev_wait(&ctx, f, 5000000, NULL, 0, &n); /* TIMEOUT */
  st[2] = chi_dev_wait(&ctx, f, GT_WAIT_NS, NULL, 0, &n); /* OK */
  st[3] = (int32_t)n;
}

__global__ void k_source(chi_dev_context_t ctx, chi_method_t m, int32_t *st) {
  chi_future_t f;
  int32_t src = -100;
  uint32_t n = 0;
  st[0] = chi_dev_submit(&ctx, CHI_ROUTE_CPU, m, NULL, 0, &f);
  st[1] = chi_dev_wait(&ctx, f, GT_WAIT_NS, &src, sizeof src, &n);
  st[2] = src;
  st[3] = (int32_t)n;
}

/* Lane 0 of every warp: `tasks` checksums of 64-byte inputs, each checked
 * against the device's own FNV-1a.  cnt[0] bad results, cnt[1] AGAIN retries,
 * cnt[2] tasks done, cnt[3] first bad status. */
__global__ void k_many(chi_dev_context_t ctx, chi_route_t route, uint32_t tasks,
                       unsigned long long *cnt) {
  if ((threadIdx.x & 31) != 0) return;
  const uint64_t warp = (blockIdx.x * (uint64_t)blockDim.x + threadIdx.x) / 32;
  uint8_t in[64], out[8];
  for (uint32_t i = 0; i < tasks; ++i) {
    gt_fill(in, 64, warp * 1000003ull + i);
    chi_future_t f;
    chi_status_t s;
    while ((s = chi_dev_submit(&ctx, route, CHI_METHOD_CHECKSUM, in, 64, &f)) == CHI_ERR_AGAIN) {
      atomicAdd(&cnt[1], 1ull);
      __nanosleep(1000);
    }
    uint32_t n = 0;
    if (s == CHI_OK) s = chi_dev_wait(&ctx, f, GT_WAIT_NS, out, 8, &n);
    if (s != CHI_OK || n != 8 || gt_load64(out) != gt_fnv(in, 64)) {
      if (atomicAdd(&cnt[0], 1ull) == 0) cnt[3] = (unsigned long long)(uint32_t)s;
      return; /* one failure tells; a broken runtime must not take tasks x timeout */
    } else {
      atomicAdd(&cnt[2], 1ull);
    }
  }
}

/* Every lane, diverged at random: per-thread calls inside divergent branches,
 * then the warp-collective variants with a random set of active lanes. */
__global__ void k_diverged(chi_dev_context_t ctx, chi_route_t route, uint32_t tasks,
                           unsigned long long *cnt) {
  const uint32_t lane = threadIdx.x & 31;
  const uint64_t warp = (blockIdx.x * (uint64_t)blockDim.x + threadIdx.x) / 32;
  uint8_t in[16], out[8];
  for (uint32_t i = 0; i < tasks; ++i) {
    const uint64_t seed = (warp * 977 + i) * 32 + lane;
    const uint32_t n = 1 + (uint32_t)(seed % 16);
    gt_fill(in, n, seed);
    chi_future_t f = 0;
    chi_status_t s = CHI_OK;
    uint32_t osz = 0;
    if ((seed * 2654435761u >> 7) % 3 == 0) { /* a third of the lanes go first, alone */
      while ((s = chi_dev_submit(&ctx, route, CHI_METHOD_CHECKSUM, in, n, &f)) == CHI_ERR_AGAIN)
        __nanosleep(500 + lane * 10);
      if (s == CHI_OK) s = chi_dev_wait(&ctx, f, GT_WAIT_NS, out, 8, &osz);
      if (s != CHI_OK || gt_load64(out) != gt_fnv(in, n)) {
        atomicAdd(&cnt[0], 1ull);
        tasks = 0; /* leaves the loop after this round, still converged */
      } else {
        atomicAdd(&cnt[2], 1ull);
      }
    }
    __syncwarp();
    const int active = (seed >> 3) % 4 != 0;
    s = chi_dev_warp_submit(&ctx, route, CHI_METHOD_CHECKSUM, in, n, active, &f);
    if (active && s == CHI_ERR_AGAIN) {
      atomicAdd(&cnt[1], 1ull);
      s = CHI_OK;
      f = 0; /* nothing to wait for */
    }
    int waiting = active && f != 0;
    chi_status_t w = chi_dev_warp_wait(&ctx, f, GT_WAIT_NS, out, 8, &osz, waiting);
    int failed = active && (s != CHI_OK || (waiting && (w != CHI_OK || gt_load64(out) != gt_fnv(in, n))));
    if (failed) atomicAdd(&cnt[0], 1ull);
    else if (waiting) atomicAdd(&cnt[2], 1ull);
    if (__any_sync(0xFFFFFFFFu, failed) || __any_sync(0xFFFFFFFFu, tasks == 0)) break;
  }
}

/* One thread per reference. */
__global__ void k_resolve(chi_dev_context_t ctx, const chi_mem_ref_t *refs, int n, int32_t *st,
                          uint64_t *ptrs) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  void *p = NULL;
  st[i] = chi_dev_mem_resolve(&ctx, &refs[i], &p);
  ptrs[i] = (uint64_t)p;
}

/* Every lane of the grid: chi.add of two numbers of its own over `route`,
 * all in flight together (on the GPU->GPU route a round of the
 * orchestrator's worker holds many of them, each run by its own lane).
 * Thread 0 also sends an 8-byte input (CHI_ERR_INVALID at the wait) and
 * waits with a 4-byte buffer (CHI_ERR_TOO_LARGE, then the sum).
 * cnt[0] wrong sums, cnt[2] right ones, cnt[3] first bad status;
 * st[0..2]: thread 0's statuses. */
__global__ void k_add(chi_dev_context_t ctx, chi_route_t route, unsigned long long *cnt, int32_t *st) {
  const uint64_t t = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
  uint64_t ab[2] = {t * 1000003ull + 17u, ~t << 20};
  chi_future_t f;
  chi_status_t s;
  while ((s = chi_dev_submit(&ctx, route, CHI_METHOD_ADD, ab, 16, &f)) == CHI_ERR_AGAIN) __nanosleep(500);
  uint64_t sum = 0;
  uint32_t n = 0;
  if (s == CHI_OK) s = chi_dev_wait(&ctx, f, GT_WAIT_NS, &sum, 8, &n);
  if (s != CHI_OK || n != 8 || sum != ab[0] + ab[1]) {
    if (atomicAdd(&cnt[0], 1ull) == 0) cnt[3] = (unsigned long long)(uint32_t)s;
  } else {
    atomicAdd(&cnt[2], 1ull);
  }
  if (t != 0) return;
  st[0] = chi_dev_submit(&ctx, route, CHI_METHOD_ADD, ab, 8, &f);
  st[1] = st[0] == CHI_OK ? chi_dev_wait(&ctx, f, GT_WAIT_NS, &sum, 8, &n) : -100;
  uint32_t small = 0;
  st[2] = chi_dev_submit(&ctx, route, CHI_METHOD_ADD, ab, 16, &f);
  if (st[2] == CHI_OK) st[2] = chi_dev_wait(&ctx, f, GT_WAIT_NS, &small, 4, &n); /* TOO_LARGE */
  st[3] = (int32_t)n;
  sum = 0;
  st[4] = chi_dev_wait(&ctx, f, GT_WAIT_NS, &sum, 8, &n);
  st[5] = sum == ab[0] + ab[1];
}

/* Built-ins of every kind and outcome at once, so that the orchestrator's
 * rounds hold many of them and run them on their own lanes (solo
 * built-ins), errors included: by t % 6, chi.add of 16 bytes (the sum), of
 * 8 and of 24 bytes (CHI_ERR_INVALID), chi.checksum of t % 65 bytes, chi.echo
 * of t % 65 bytes, and chi.echo of 64 bytes into a 32-byte buffer
 * (CHI_ERR_TOO_LARGE from the wait, then the bytes into a larger one).
 * cnt[kind] counts right answers, cnt[6] wrong ones (cnt[7]: the first
 * wrong thread and its status). */
__device__ static bool gt_same(const uint8_t *a, const uint8_t *b, uint32_t n) {
  for (uint32_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return false;
  return true;
}
__global__ void k_builtins_mixed(chi_dev_context_t ctx, chi_route_t route, unsigned long long *cnt) {
  const uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
  const uint32_t kind = t % 6u;
  uint8_t in[64], out[64];
  for (uint32_t i = 0; i < 64; ++i) in[i] = (uint8_t)(t * 131u + i * 7u + 1u);
  const uint64_t a = gt_load64(in), b = gt_load64(in + 8);
  chi_method_t m = CHI_METHOD_ADD;
  uint32_t n = 16, cap = 64;
  if (kind == 1u) n = 8;
  if (kind == 2u) n = 24;
  if (kind == 3u) { m = CHI_METHOD_CHECKSUM; n = t % 65u; }
  if (kind == 4u) { m = CHI_METHOD_ECHO; n = t % 65u; }
  if (kind == 5u) { m = CHI_METHOD_ECHO; n = 64; cap = 32; }
  chi_future_t f;
  chi_status_t s;
  while ((s = chi_dev_submit(&ctx, route, m, in, n, &f)) == CHI_ERR_AGAIN) __nanosleep(500);
  uint32_t osz = 0;
  bool ok = false;
  if (s == CHI_OK) {
    for (uint32_t i = 0; i < 64; ++i) out[i] = 0;
    s = chi_dev_wait(&ctx, f, GT_WAIT_NS, out, cap, &osz);
    if (kind == 0u) ok = s == CHI_OK && osz == 8 && gt_load64(out) == a + b;
    if (kind == 1u || kind == 2u) ok = s == CHI_ERR_INVALID && osz == 0;
    if (kind == 3u) ok = s == CHI_OK && osz == 8 && gt_load64(out) == gt_fnv(in, n);
    if (kind == 4u) ok = s == CHI_OK && osz == n && gt_same(out, in, n);
    if (kind == 5u && s == CHI_ERR_TOO_LARGE && osz == 64) { /* the future stays: a larger buffer */
      s = chi_dev_wait(&ctx, f, GT_WAIT_NS, out, 64, &osz);
      ok = s == CHI_OK && osz == 64 && gt_same(out, in, 64);
    }
  }
  if (ok) {
    atomicAdd(&cnt[kind], 1ull);
  } else if (atomicAdd(&cnt[6], 1ull) == 0) {
    cnt[7] = (unsigned long long)t << 32 | (uint32_t)s;
  }
}

/* ------------------------------------------------------------------ tests */

static void run_payloads(chi_route_t route) {
  memset(g_st, 0x7F, 64 * sizeof(int32_t));
  k_payloads<<<1, 1, 0, g_stream>>>(g_ctx, route, g_max, g_scratch, g_st);
  sync_stream();
  for (int i = 0; i < NSIZES; ++i) {
    if (g_st[4 * i] != CHI_OK || !g_st[4 * i + 1] || g_st[4 * i + 2] != CHI_OK || !g_st[4 * i + 3])
      fail_msg("route %d, %u bytes: echo %d (%s) ok=%d, checksum %d (%s) ok=%d", route,
               size_at(i), g_st[4 * i], chi_status_string(g_st[4 * i]), g_st[4 * i + 1],
               g_st[4 * i + 2], chi_status_string(g_st[4 * i + 2]), g_st[4 * i + 3]);
  }
}

static void run_errors(chi_route_t route) {
  memset(g_st, 0x7F, 64 * sizeof(int32_t));
  k_errors<<<1, 1, 0, g_stream>>>(g_ctx, route, g_max, g_scratch, g_st, g_val);
  sync_stream();
  int32_t gpus = 0;
  chi_gpu_count(g_rt, &gpus);
  /* CHI_ROUTE_GPU(7) from a kernel: no such GPU below 8 GPUs, else GPU 7 over peer memory
   * (test_gpu_peer), or CHI_ERR_NO_DEVICE without peer access. */
  const chi_status_t gpu7 = gpus <= 7 ? CHI_ERR_NO_DEVICE : g_st[8] == CHI_ERR_NO_DEVICE ? CHI_ERR_NO_DEVICE : CHI_OK;
  const chi_status_t want[16] = {CHI_ERR_TOO_LARGE, CHI_OK,          CHI_ERR_NOT_FOUND,
                                 CHI_OK,            CHI_ERR_TOO_LARGE, CHI_OK,
                                 CHI_ERR_INVALID,   CHI_ERR_INVALID, gpu7,
                                 CHI_ERR_INVALID,   CHI_OK,          1,
                                 CHI_OK,            CHI_ERR_INVALID, CHI_ERR_INVALID,
                                 CHI_ERR_INVALID};
  for (int i = 0; i < 16; ++i)
    if (g_st[i] != want[i])
      fail_msg("route %d, step %d: got %d (%s), want %d", route, i, g_st[i],
               chi_status_string(g_st[i]), want[i]);
  /* The timeout-0 poll loops: OK with the whole result, then INVALID. */
  const int32_t want_poll[6] = {CHI_OK, 1, CHI_OK, 1, CHI_ERR_INVALID, CHI_ERR_INVALID};
  printf("# route %d: timeout-0 polls until the result: %u (8 B), %u (64 B)\n", route, g_val[2],
         g_val[3]);
  for (int i = 0; i < 6; ++i)
    if (g_st[16 + i] != want_poll[i])
      fail_msg("route %d, poll step %d: got %d (%s), want %d", route, i, g_st[16 + i],
               chi_status_string(g_st[16 + i]), want_poll[i]);
  assert_int_equal(g_val[0], 64);
  assert_int_equal(g_val[1], 64);
}

static void run_claims(chi_route_t route) {
  const uint32_t rounds = 64;
  memset(g_st, 0x7F, 64 * sizeof(int32_t));
  k_claims<<<1, 64, 0, g_stream>>>(g_ctx, route, rounds, g_st, g_val);
  sync_stream();
  printf("# route %d: 1 ns waits until the result: %u TIMEOUTs\n", route, g_val[4]);
  assert_status(CHI_OK, g_st[0]);
  assert_int_equal(g_st[1], 1);
  assert_status(CHI_ERR_INVALID, g_st[2]);
  if (g_st[3] != (int32_t)rounds)
    fail_msg("route %d: %d of %u rounds with one result for two waiters; first bad pair %d / %d", route,
             g_st[3], rounds, g_st[4] >> 16, (int16_t)(g_st[4] & 0xFFFF));
}

static void test_wait_claims(void **state) {
  (void)state;
  run_claims(CHI_ROUTE_LOCAL);
  run_claims(CHI_ROUTE_CPU);
}

static void run_many(chi_route_t route) {
  const uint32_t warps = gt_env_count("CHI_TEST_WARPS", 1024);
  const uint32_t tasks = gt_env_count("CHI_TEST_TASKS_PER_WARP", 1000);
  memset(g_cnt, 0, 8 * sizeof *g_cnt);
  k_many<<<(warps + 7) / 8, 256, 0, g_stream>>>(g_ctx, route, tasks, g_cnt);
  sync_stream();
  uint64_t expect = (uint64_t)((warps + 7) / 8) * 8 * tasks;
  printf("# route %d: %u warps x %u tasks: %llu ok, %llu bad, %llu AGAIN retries\n", route,
         (warps + 7) / 8 * 8, tasks, g_cnt[2], g_cnt[0], g_cnt[1]);
  if (g_cnt[0] != 0)
    fail_msg("route %d: %llu bad tasks (first status %d)", route, g_cnt[0], (int)g_cnt[3]);
  assert_int_equal(g_cnt[2], expect);
}

static void run_diverged(chi_route_t route) {
  const uint32_t warps = gt_env_count("CHI_TEST_WARPS", 1024);
  const uint32_t tasks = gt_env_count("CHI_TEST_TASKS_PER_WARP", 1000) / 10 + 1;
  memset(g_cnt, 0, 8 * sizeof *g_cnt);
  k_diverged<<<(warps + 7) / 8, 256, 0, g_stream>>>(g_ctx, route, tasks, g_cnt);
  sync_stream();
  printf("# route %d diverged: %llu ok, %llu bad, %llu AGAIN\n", route, g_cnt[2], g_cnt[0],
         g_cnt[1]);
  assert_int_equal(g_cnt[0], 0);
  assert_true(g_cnt[2] > 0);
}

static void test_h2d_payloads(void **state) {
  (void)state;
  uint8_t in[4096], out[4096];
  for (int r = 0; r < 2; ++r) {
    chi_route_t route = r ? CHI_ROUTE_GPU_ANY : CHI_ROUTE_GPU(0);
    for (int i = 0; i < NSIZES; ++i) {
      uint32_t n = size_at(i) == 4096 ? g_max : size_at(i);
      gt_fill(in, n, 77 + i);
      chi_future_t f;
      size_t osz = 0;
      assert_status(CHI_OK, chi_submit(g_rt, route, CHI_METHOD_ECHO, in, n, &f));
      assert_status(CHI_OK, chi_wait(g_rt, f, GT_WAIT_NS, out, sizeof out, &osz));
      assert_int_equal(osz, n);
      assert_memory_equal(out, in, n);
      assert_status(CHI_OK, chi_submit(g_rt, route, CHI_METHOD_CHECKSUM, in, n, &f));
      assert_status(CHI_OK, chi_wait(g_rt, f, GT_WAIT_NS, out, 8, &osz));
      assert_int_equal(osz, 8);
      assert_true(gt_load64(out) == chi_test_fnv1a(in, n));
    }
    uint64_t ab[2] = {0xFFFFFFFF00000001ull, 0x00000001FFFFFFFFull};
    chi_future_t f;
    size_t osz = 0;
    uint64_t sum = 0;
    assert_status(CHI_OK, chi_submit(g_rt, route, CHI_METHOD_ADD, ab, sizeof ab, &f));
    assert_status(CHI_OK, chi_wait(g_rt, f, GT_WAIT_NS, &sum, sizeof sum, &osz));
    assert_int_equal(osz, 8);
    assert_true(sum == ab[0] + ab[1]);
    assert_status(CHI_OK, chi_submit(g_rt, route, CHI_METHOD_ADD, ab, 8, &f));
    assert_status(CHI_ERR_INVALID, chi_wait(g_rt, f, GT_WAIT_NS, &sum, sizeof sum, &osz));
  }
}

static void h2d_thread(int id, std::atomic<long> *bad) {
  const long tasks = chi_test_scaled(gt_env_count("CHI_TEST_H2D_TASKS", 4000));
  uint64_t rng = 0x1234567ull + id;
  enum { kDepth = 8 };
  static thread_local uint8_t in[kDepth][4096], out[4096];
  chi_future_t f[kDepth];
  uint32_t n[kDepth];
  for (long done = 0; done < tasks; done += kDepth) {
    for (int k = 0; k < kDepth; ++k) {
      n[k] = (uint32_t)(chi_test_rand(&rng) % (g_max + 1));
      if (k == 0) n[k] = 64;
      gt_fill(in[k], n[k], (uint64_t)id << 40 | (uint64_t)done << 8 | k);
      chi_status_t s;
      while ((s = chi_submit(g_rt, CHI_ROUTE_GPU(0), CHI_METHOD_ECHO, in[k], n[k], &f[k])) ==
             CHI_ERR_AGAIN) {
      }
      if (s != CHI_OK) {
        ++*bad;
        f[k] = 0;
      }
    }
    for (int k = 0; k < kDepth; ++k) {
      if (!f[k]) continue;
      size_t osz = 0;
      chi_status_t s = chi_wait(g_rt, f[k], GT_WAIT_NS, out, sizeof out, &osz);
      if (s != CHI_OK || osz != n[k] || memcmp(out, in[k], n[k]) != 0) ++*bad;
    }
  }
}

static void test_h2d_threads(void **state) {
  (void)state;
  std::atomic<long> bad{0};
  std::vector<std::thread> th;
  for (int t = 0; t < 8; ++t) th.emplace_back(h2d_thread, t, &bad);
  for (auto &t : th) t.join();
  assert_int_equal(bad.load(), 0);
}

static void test_h2d_errors(void **state) {
  (void)state;
  uint8_t in[64], out[64];
  gt_fill(in, 64, 5);
  chi_future_t f;
  size_t osz = 0;
  /* Output too small: size needed, future still valid. */
  assert_status(CHI_OK, chi_submit(g_rt, 0, CHI_METHOD_ECHO, in, 64, &f));
  assert_status(CHI_ERR_TOO_LARGE, chi_wait(g_rt, f, GT_WAIT_NS, out, 10, &osz));
  assert_int_equal(osz, 64);
  assert_status(CHI_OK, chi_wait(g_rt, f, GT_WAIT_NS, out, 64, &osz));
  assert_memory_equal(out, in, 64);
  /* Consumed: stale from now on, on every call. */
  assert_status(CHI_ERR_INVALID, chi_wait(g_rt, f, GT_WAIT_NS, out, 64, &osz));
  int done = 0;
  assert_status(CHI_ERR_INVALID, chi_test(g_rt, f, &done));
  assert_status(CHI_ERR_INVALID, chi_release(g_rt, f));
  /* Release, finished or not, consumes too. */
  assert_status(CHI_OK, chi_submit(g_rt, 0, CHI_METHOD_ECHO, in, 64, &f));
  assert_status(CHI_OK, chi_release(g_rt, f));
  assert_status(CHI_ERR_INVALID, chi_wait(g_rt, f, GT_WAIT_NS, out, 64, &osz));
  /* A forged slot number. */
  assert_status(CHI_ERR_INVALID, chi_wait(g_rt, f ^ 0x7FFFull, 0, out, 64, &osz));
  /* NULL output: result discarded, size reported. */
  assert_status(CHI_OK, chi_submit(g_rt, 0, CHI_METHOD_ECHO, in, 64, &f));
  assert_status(CHI_OK, chi_wait(g_rt, f, GT_WAIT_NS, NULL, 0, &osz));
  assert_int_equal(osz, 64);
  /* A method without GPU handler: NOT_FOUND at the waiter. */
  assert_status(CHI_OK, chi_submit(g_rt, 0, g_cpu_only_method, in, 8, &f));
  assert_status(CHI_ERR_NOT_FOUND, chi_wait(g_rt, f, GT_WAIT_NS, out, 64, &osz));
  /* Oversized input refused at submit. */
  static uint8_t big[1 << 20];
  assert_status(CHI_ERR_TOO_LARGE, chi_submit(g_rt, 0, CHI_METHOD_ECHO, big, g_max + 1, &f));
  assert_has_message();
  int32_t count = 0;
  assert_status(CHI_OK, chi_gpu_count(g_rt, &count));
  assert_status(CHI_ERR_INVALID, chi_submit(g_rt, count, CHI_METHOD_ECHO, in, 8, &f));
  /* Many releases of unfinished tasks: their slots come back. */
  for (long i = 0, n = chi_test_scaled(5000); i < n; ++i) {
    chi_status_t s;
    while ((s = chi_submit(g_rt, 0, CHI_METHOD_CHECKSUM, big, 4096, &f)) == CHI_ERR_AGAIN) {
    }
    assert_status(CHI_OK, s);
    assert_status(CHI_OK, chi_release(g_rt, f));
  }
  /* Queued behind up to a queue's worth of released 4 KiB checksums, which
   * take long under compute-sanitizer: a timed-out wait leaves the future
   * valid, so wait again (a lost task still fails after ten rounds). */
  assert_status(CHI_OK, chi_submit(g_rt, 0, CHI_METHOD_ECHO, in, 64, &f));
  chi_status_t s = CHI_ERR_TIMEOUT;
  for (int round = 0; round < 10 && s == CHI_ERR_TIMEOUT; ++round)
    s = chi_wait(g_rt, f, GT_WAIT_NS, out, 64, &osz);
  assert_status(CHI_OK, s);
}

static void test_d2h_payloads(void **state) {
  (void)state;
  run_payloads(CHI_ROUTE_CPU);
}

static void test_d2d_payloads(void **state) {
  (void)state;
  run_payloads(CHI_ROUTE_LOCAL);
  run_payloads(CHI_ROUTE_GPU(0));
}

static void run_shapes(chi_route_t route) {
  memset(g_st, 0x7F, 64 * sizeof(int32_t));
  k_shapes<<<1, 1, 0, g_stream>>>(g_ctx, route, g_max, g_scratch, g_st);
  sync_stream();
  const int32_t want = g_st[3]; /* the sizes up to gpu.max_payload, at every offset */
  assert_true(want >= 20 * 5 * 4);
  if (g_st[0] != want)
    fail_msg("route %d: %d of %d echoes right; first wrong: %d bytes, input offset %d, output offset %d, "
             "status %d", route, g_st[0], want, g_st[1] >> 8, (g_st[1] >> 4) & 15, g_st[1] & 15, g_st[2]);
}

/* Sizes and alignments around every copy path, bytes around the output untouched. */
static void run_mixed_sizes(chi_route_t route) {
  memset(g_st, 0x7F, 64 * sizeof(int32_t));
  k_mixed_sizes<<<1, 1, 0, g_stream>>>(g_ctx, route, g_max, 200, g_scratch, g_st);
  sync_stream();
  if (g_st[0] != g_st[1] || g_st[1] != 400)
    fail_msg("route %d: %d of %d small echoes right after large ones; first wrong in round %d, status %d",
             route, g_st[0], g_st[1], g_st[2], g_st[3]);
}
/* Large and small payloads in turns through the same slots. */
static void test_d2d_mixed_sizes(void **state) {
  (void)state;
  run_mixed_sizes(CHI_ROUTE_LOCAL);
}

static void test_d2h_shapes(void **state) {
  (void)state;
  run_shapes(CHI_ROUTE_CPU);
}
static void test_d2d_shapes(void **state) {
  (void)state;
  run_shapes(CHI_ROUTE_LOCAL);
}

static void test_d2h_errors(void **state) {
  (void)state;
  run_errors(CHI_ROUTE_CPU);
}

static void test_d2d_errors(void **state) {
  (void)state;
  run_errors(CHI_ROUTE_LOCAL);
}

static void test_d2h_source(void **state) {
  (void)state;
  k_source<<<1, 1, 0, g_stream>>>(g_ctx, g_source_method, g_st);
  sync_stream();
  assert_status(CHI_OK, g_st[0]);
  assert_status(CHI_OK, g_st[1]);
  assert_int_equal(g_st[2], 0); /* GPU 0 */
  assert_int_equal(g_st[3], 4);
}

/* The pollers' bell (docs/gpu.md, "Idle GPU->CPU pollers"): after a quiet
 * spell the parked watcher sleeps on it, and a lone GPU->CPU task makes the
 * orchestrator's keeper ring it (end its launch) to wake the watcher.  main()
 * sets gpu.poller_bell_check_us to 1 s, so without a rung bell these tasks
 * would wait for a timeout; the keeper's diag word says it rang, each time
 * with a new value (1 + the first ticket not yet served). */
static void test_d2h_bell(void **state) {
  (void)state;
  const chi_dev_ctx_layout_t *l = reinterpret_cast<const chi_dev_ctx_layout_t *>(&g_ctx);
  if (l->lease_us == 0) {
    printf("# persistent orchestrator (gpu.lease_us 0): no bell\n");
    return;
  }
  volatile uint64_t *diag = l->diag;
  for (int round = 0; round < 5; ++round) {
    sleep_ms(100); /* parked after 10 ms, then the watcher sleeps on the bell */
    const uint64_t before = diag[CHI_DIAG_BELL];
    k_source<<<1, 1, 0, g_stream>>>(g_ctx, g_source_method, g_st);
    sync_stream();
    assert_status(CHI_OK, g_st[0]);
    assert_status(CHI_OK, g_st[1]);
    assert_int_equal(g_st[3], 4);
    const uint64_t rung = diag[CHI_DIAG_BELL];
    if (rung == before)
      fail_msg("round %d: the keeper did not ring the bell (diag %llu); the task was served by a timeout",
               round, (unsigned long long)rung);
    assert_true(rung > before);
  }
}

/* gpu.idle_lease_us (main sets 20 ms): while the routes are idle (the pollers
 * asleep on the bell, no CPU->GPU task in flight) each launch of the
 * orchestrator lasts that long, so it is launched far less often; the
 * launches are counted from its diag words (a slow host launches fewer,
 * never more).  Then every route still answers. */
static void test_idle_lease(void **state) {
  (void)state;
  const chi_dev_ctx_layout_t *l = reinterpret_cast<const chi_dev_ctx_layout_t *>(&g_ctx);
  if (l->lease_us == 0) {
    printf("# persistent orchestrator (gpu.lease_us 0): no lease\n");
    return;
  }
  const char *env = getenv("CHI_GPU_IDLE_LEASE_US");
  const long idle_us = env ? atol(env) : 0;
  if (idle_us < 4 * (long)l->lease_us) {
    printf("# gpu.idle_lease_us %ld: too close to gpu.lease_us to tell apart\n", idle_us);
    return;
  }
  volatile uint64_t *diag = l->diag;
  sleep_ms(100); /* idle: the pollers park and sleep on the bell */
  const uint64_t e0 = diag[CHI_DIAG_START_EPOCH];
  sleep_ms(200);
  const uint64_t launches = diag[CHI_DIAG_START_EPOCH] - e0;
  printf("# %llu launches in 200 ms idle (lease %u us, idle lease %ld us)\n", (unsigned long long)launches,
         l->lease_us, idle_us);
  assert_true(launches <= 200000 / (uint64_t)idle_us + 3);
  /* Every route still answers after the quiet spell. */
  k_source<<<1, 1, 0, g_stream>>>(g_ctx, g_source_method, g_st);
  sync_stream();
  assert_status(CHI_OK, g_st[1]);
  run_payloads(CHI_ROUTE_LOCAL);
  uint8_t in[64], out[64];
  size_t osz = 0;
  chi_future_t f;
  for (int i = 0; i < 64; ++i) in[i] = (uint8_t)i;
  assert_status(CHI_OK, chi_submit(g_rt, CHI_ROUTE_GPU(0), CHI_METHOD_ECHO, in, 64, &f));
  assert_status(CHI_OK, chi_wait(g_rt, f, GT_WAIT_NS, out, 64, &osz));
  assert_memory_equal(in, out, 64);
}

static void run_add(chi_route_t route) {
  memset(g_cnt, 0, 8 * sizeof *g_cnt);
  memset(g_st, 0x7F, 64 * sizeof(int32_t));
  k_add<<<8, 128, 0, g_stream>>>(g_ctx, route, g_cnt, g_st);
  sync_stream();
  printf("# route %d: chi.add from 1024 threads: %llu right, %llu wrong\n", route, g_cnt[2], g_cnt[0]);
  if (g_cnt[0] != 0)
    fail_msg("route %d: %llu wrong sums (first status %d)", route, g_cnt[0], (int)g_cnt[3]);
  assert_int_equal(g_cnt[2], 1024);
  assert_status(CHI_OK, g_st[0]);
  assert_status(CHI_ERR_INVALID, g_st[1]);      /* 8 bytes: not two numbers */
  assert_status(CHI_ERR_TOO_LARGE, g_st[2]);    /* a 4-byte buffer: the future stays */
  assert_int_equal(g_st[3], 8);
  assert_status(CHI_OK, g_st[4]);
  assert_int_equal(g_st[5], 1);
}

static void test_d2d_add(void **state) {
  (void)state;
  run_add(CHI_ROUTE_LOCAL);
  run_add(CHI_ROUTE_CPU);
}

/* Many built-in tasks at once, every outcome (k_builtins_mixed): each
 * thread's status and answer are checked. */
static void run_builtins_mixed(chi_route_t route) {
  memset(g_cnt, 0, 8 * sizeof *g_cnt);
  k_builtins_mixed<<<8, 192, 0, g_stream>>>(g_ctx, route, g_cnt);
  sync_stream();
  printf("# route %d: 1536 mixed built-ins: add %llu, add 8 B %llu, add 24 B %llu, checksum %llu, echo %llu, "
         "echo too large %llu right; %llu wrong\n",
         route, g_cnt[0], g_cnt[1], g_cnt[2], g_cnt[3], g_cnt[4], g_cnt[5], g_cnt[6]);
  if (g_cnt[6] != 0)
    fail_msg("route %d: %llu wrong answers (first: thread %llu, kind %llu, status %d)", route, g_cnt[6],
             g_cnt[7] >> 32, (g_cnt[7] >> 32) % 6, (int)(uint32_t)g_cnt[7]);
  for (int k = 0; k < 6; ++k) assert_int_equal(g_cnt[k], 256);
}

static void test_d2d_builtins_mixed(void **state) {
  (void)state;
  run_builtins_mixed(CHI_ROUTE_LOCAL);
  run_builtins_mixed(CHI_ROUTE_CPU);
}

static void test_d2h_many_warps(void **state) {
  (void)state;
  run_many(CHI_ROUTE_CPU);
}

static void test_d2d_many_warps(void **state) {
  (void)state;
  run_many(CHI_ROUTE_LOCAL);
}

static void test_diverged_lanes(void **state) {
  (void)state;
  run_diverged(CHI_ROUTE_CPU);
  run_diverged(CHI_ROUTE_LOCAL);
}

static void test_device_timeout(void **state) {
  (void)state;
  k_timeout<<<1, 1, 0, g_stream>>>(g_ctx, g_sleep_method, g_st);
  sync_stream();
  assert_status(CHI_OK, g_st[0]);
  assert_status(CHI_ERR_TIMEOUT, g_st[1]);
  assert_status(CHI_OK, g_st[2]);
  assert_int_equal(g_st[3], 0);
}

static void pause_load_thread(int id, std::atomic<bool> *stop, std::atomic<long> *bad,
                              std::atomic<long> *ok) {
  uint8_t in[64], out[64];
  uint64_t seq = 0;
  while (!stop->load()) {
    gt_fill(in, 64, (uint64_t)id << 32 | seq++);
    chi_future_t f;
    size_t osz = 0;
    chi_status_t s = chi_submit(g_rt, 0, CHI_METHOD_ECHO, in, 64, &f);
    if (s == CHI_ERR_AGAIN) continue;
    if (s == CHI_OK) s = chi_wait(g_rt, f, GT_WAIT_NS, out, 64, &osz);
    if (s != CHI_OK || osz != 64 || memcmp(in, out, 64) != 0) ++*bad;
    else ++*ok;
  }
}

static void test_pause_resume(void **state) {
  (void)state;
  std::atomic<bool> stop{false};
  std::atomic<long> bad{0}, ok{0};
  std::vector<std::thread> th;
  for (int t = 0; t < 4; ++t) th.emplace_back(pause_load_thread, t, &stop, &bad, &ok);
  for (int i = 0; i < 20; ++i) {
    sleep_ms(3);
    assert_status(CHI_OK, chi_gpu_pause(g_rt, 0));
    assert_status(CHI_OK, chi_gpu_pause(g_rt, 0)); /* no-op */
    sleep_ms(2);
    assert_status(CHI_OK, chi_gpu_resume(g_rt, -1));
  }
  stop = true;
  for (auto &t : th) t.join();
  assert_int_equal(bad.load(), 0);
  assert_true(ok.load() > 0);

  /* Paused: host tasks wait, GPU->CPU tasks still run (CPU pollers), and
   * device-wide synchronization returns. */
  uint8_t in[64], out[64];
  gt_fill(in, 64, 3);
  chi_future_t f;
  size_t osz = 0;
  int done = 1;
  assert_status(CHI_OK, chi_gpu_pause(g_rt, -1));
  assert_status(CHI_OK, chi_submit(g_rt, 0, CHI_METHOD_ECHO, in, 64, &f));
  sleep_ms(20);
  assert_status(CHI_OK, chi_test(g_rt, f, &done));
  assert_int_equal(done, 0);
  assert_status(CHI_ERR_TIMEOUT, chi_wait(g_rt, f, 1000000, out, 64, &osz));
  CK(cudaDeviceSynchronize());
  run_payloads(CHI_ROUTE_CPU);
  assert_status(CHI_OK, chi_gpu_resume(g_rt, 0));
  assert_status(CHI_OK, chi_gpu_resume(g_rt, 0)); /* no-op */
  assert_status(CHI_OK, chi_wait(g_rt, f, GT_WAIT_NS, out, 64, &osz));
  assert_memory_equal(in, out, 64);
  /* Resuming GPU 0 left any other GPU paused: -1 resumes the rest. */
  assert_status(CHI_OK, chi_gpu_resume(g_rt, -1));
  assert_status(CHI_ERR_INVALID, chi_gpu_pause(g_rt, 99));
}

static void test_regions(void **state) {
  (void)state;
  const size_t size = 1 << 20;
  uint8_t *buf = g_scratch + (8u << 20); /* inside the 16 MiB allocation */
  uint64_t region = 0, other = 0;
  assert_status(CHI_OK, chi_register_gpu_mem(g_rt, 0, buf, size, &region));
  assert_true(region != 0);
  /* Not on that GPU / not device memory / past the allocation's end. */
  static uint8_t host[64];
  assert_status(CHI_ERR_INVALID, chi_register_gpu_mem(g_rt, 0, host, sizeof host, &other));
  assert_status(CHI_ERR_INVALID, chi_register_gpu_mem(g_rt, 0, g_st, 64, &other));
  assert_status(CHI_ERR_INVALID,
                chi_register_gpu_mem(g_rt, 0, g_scratch + SCRATCH_BYTES - 16, 4096, &other));
  /* Host-side resolution. */
  chi_mem_ref_t ref = {region, 100, 200};
  void *p = NULL;
  int32_t gpu = -5;
  assert_status(CHI_OK, chi_mem_resolve(g_rt, &ref, &p, &gpu));
  assert_ptr_equal(p, buf + 100);
  assert_int_equal(gpu, 0);

  chi_mem_ref_t *refs = g_refs;
  uint64_t *ptrs = g_ptrs;
  refs[0] = chi_mem_ref_t{region, 0, size};             /* all of it */
  refs[1] = chi_mem_ref_t{region, 4096, 1};             /* inside */
  refs[2] = chi_mem_ref_t{region, size, 0};             /* empty, at the end */
  refs[3] = chi_mem_ref_t{region, size - 8, 9};         /* one byte past */
  refs[4] = chi_mem_ref_t{region, ~0ull - 4, 16};       /* overflowing sum */
  refs[5] = chi_mem_ref_t{region + (1ull << 32), 0, 1}; /* stale generation */
  refs[6] = chi_mem_ref_t{0, 0, 1};                     /* no region */
  refs[7] = chi_mem_ref_t{region + 1, 0, 1};            /* other index */
  k_resolve<<<1, 8, 0, g_stream>>>(g_ctx, refs, 8, g_st, ptrs);
  sync_stream();
  const chi_status_t want[8] = {CHI_OK, CHI_OK, CHI_OK, CHI_ERR_INVALID,
                                CHI_ERR_INVALID, CHI_ERR_INVALID, CHI_ERR_INVALID, CHI_ERR_INVALID};
  for (int i = 0; i < 8; ++i)
    if (g_st[i] != want[i])
      fail_msg("reference %d: got %d (%s), want %d", i, g_st[i], chi_status_string(g_st[i]), want[i]);
  assert_true(ptrs[0] == (uint64_t)buf);
  assert_true(ptrs[1] == (uint64_t)(buf + 4096));
  /* Unregistered: the device refuses it too. */
  assert_status(CHI_OK, chi_unregister_mem(g_rt, region));
  k_resolve<<<1, 8, 0, g_stream>>>(g_ctx, refs, 2, g_st, ptrs);
  sync_stream();
  assert_status(CHI_ERR_INVALID, g_st[0]);
  assert_status(CHI_ERR_INVALID, g_st[1]);
  /* The entry reused by a new registration: the old id stays dead. */
  assert_status(CHI_OK, chi_register_gpu_mem(g_rt, 0, buf, 64, &other));
  refs[2] = chi_mem_ref_t{other, 0, 64};
  k_resolve<<<1, 8, 0, g_stream>>>(g_ctx, refs, 3, g_st, ptrs);
  sync_stream();
  assert_status(CHI_ERR_INVALID, g_st[0]);
  assert_status(CHI_OK, g_st[2]);
  assert_status(CHI_OK, chi_unregister_mem(g_rt, other));
}

static void test_second_gpu(void **state) {
  (void)state;
  int32_t count = 0;
  assert_status(CHI_OK, chi_gpu_count(g_rt, &count));
  if (count < 2) {
    printf("# one GPU: CHI_ROUTE_GPU(1) not exercised\n");
    skip();
  }
  uint8_t in[64], out[64];
  gt_fill(in, 64, 11);
  chi_future_t f;
  size_t osz = 0;
  for (int i = 0; i < 100; ++i) {
    assert_status(CHI_OK, chi_submit(g_rt, CHI_ROUTE_GPU(1), CHI_METHOD_ECHO, in, 64, &f));
    assert_status(CHI_OK, chi_wait(g_rt, f, GT_WAIT_NS, out, 64, &osz));
    assert_memory_equal(in, out, 64);
  }
  assert_status(CHI_OK, chi_gpu_pause(g_rt, 1));
  assert_status(CHI_OK, chi_gpu_resume(g_rt, 1));
}

int main(void) {
  setvbuf(stdout, NULL, _IONBF, 0);
  if (!gt_have_cuda()) {
    printf("# no CUDA device\n");
    return 77;
  }
  /* test_d2h_bell: a bell that does not ring shows as a missing diag word,
   * not as a task served by the watcher's safety-net look. */
  setenv("CHI_GPU_POLLER_BELL_CHECK_US", "1000000", 0);
  setenv("CHI_GPU_IDLE_LEASE_US", "20000", 0); /* test_idle_lease */
  if (int rc = gt_start(&g_rt, &g_ctx)) return rc;
  /* A hang fails with the orchestrator's state instead of ctest's timeout. */
  static GtWatchdog wd;
  wd.start(&g_ctx, 540);
  g_max = reinterpret_cast<const chi_dev_ctx_layout_t *>(&g_ctx)->max_payload;
  chi_register_handler(g_rt, "test.sleep", h_sleep, NULL, &g_sleep_method);
  chi_register_handler(g_rt, "test.source", h_source, NULL, &g_source_method);
  chi_register_handler(g_rt, "test.cpu_only", h_cpu_only, NULL, &g_cpu_only_method);
  if (cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking) != cudaSuccess ||
      cudaMalloc((void **)&g_scratch, SCRATCH_BYTES) != cudaSuccess ||
      cudaHostAlloc((void **)&g_st, 64 * sizeof(int32_t), cudaHostAllocMapped) != cudaSuccess ||
      cudaHostAlloc((void **)&g_val, 64 * sizeof(uint32_t), cudaHostAllocMapped) != cudaSuccess ||
      cudaHostAlloc((void **)&g_cnt, 8 * sizeof(unsigned long long), cudaHostAllocMapped) !=
          cudaSuccess ||
      cudaHostAlloc((void **)&g_refs, 8 * sizeof(chi_mem_ref_t), cudaHostAllocMapped) != cudaSuccess ||
      cudaHostAlloc((void **)&g_ptrs, 8 * sizeof(uint64_t), cudaHostAllocMapped) != cudaSuccess)
    return 1;

  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_h2d_payloads),   cmocka_unit_test(test_h2d_errors),
      cmocka_unit_test(test_h2d_threads),    cmocka_unit_test(test_d2h_payloads),
      cmocka_unit_test(test_d2d_payloads),   cmocka_unit_test(test_d2h_shapes),
      cmocka_unit_test(test_d2d_shapes),   cmocka_unit_test(test_d2d_mixed_sizes),
      cmocka_unit_test(test_d2h_errors),
      cmocka_unit_test(test_d2d_errors),     cmocka_unit_test(test_d2h_source),
      cmocka_unit_test(test_d2h_bell),       cmocka_unit_test(test_idle_lease),
      cmocka_unit_test(test_device_timeout), cmocka_unit_test(test_wait_claims),
      cmocka_unit_test(test_d2h_many_warps),
      cmocka_unit_test(test_d2d_many_warps), cmocka_unit_test(test_diverged_lanes),
      cmocka_unit_test(test_d2d_add),
      cmocka_unit_test(test_d2d_builtins_mixed),
      cmocka_unit_test(test_pause_resume),   cmocka_unit_test(test_regions),
      cmocka_unit_test(test_second_gpu),
  };
  int failed = chi_test_run("gpu", tests);
  /* Whatever failed, the orchestrators stop here; only then may memory be freed. */
  wd.stop();
  failed += gt_finalize(g_rt);
  cudaFree(g_scratch);
  cudaFreeHost(g_st);
  cudaFreeHost(g_val);
  cudaFreeHost(g_cnt);
  cudaFreeHost(g_refs);
  cudaFreeHost(g_ptrs);
  cudaStreamDestroy(g_stream);
  return failed ? 1 : 0;
}

/*
 * Device submits that wait for a slot, and device release:
 *   - a full-device grid (1056 warps x 32 lanes x 20 tasks by default) where
 *     every thread submits with chi_dev_submit and waits, GPU->GPU and
 *     GPU->CPU: every result right, no CHI_ERR_AGAIN; prints the throughput
 *     and the longest submit (the wait for a slot);
 *   - handlers run by GPU->GPU workers that submit GPU->GPU tasks and wait
 *     for them: none waits for its own warp;
 *   - chi_dev_release: release-then-wait/test/release answer
 *     CHI_ERR_INVALID, release after the task ended, and 100,000 released
 *     futures per route whose tasks all still run and whose slots all come
 *     back (chi_stats device_slots_in_use back to 0);
 *   - every GPU->CPU slot held: chi_dev_try_submit and chi_dev_warp_try_submit
 *     answer CHI_ERR_AGAIN at once, chi_dev_submit after its timeout, and a
 *     handler in the orchestrator that submits gets CHI_ERR_AGAIN without
 *     waiting; then everything held finishes;
 *   - a GPU->GPU submitter that found the orchestrator stepped aside (the
 *     gate's wait, over gate and diag words of the test's own): it waits for
 *     a lease thread that is late but on its way (sleeping, or waiting for a
 *     queued successor) past two leases, and gives up after two leases when
 *     the lease thread is in a CUDA call (a device-wide call may hold it and
 *     wait for this kernel), when the phase becomes such a call, without diag
 *     words, and after gpu.device_submit_timeout_us in any case.
 * Exit 77 without a usable GPU.
 *
 * Environment: CHI_TEST_GRID_WARPS (default 1056), CHI_TEST_GRID_TASKS
 * (per thread, default 20), CHI_TEST_RELEASES (per route, default 100000).
 */
#include "gpu_common.h"

#include <string.h>
#include <time.h>
#include <unistd.h>

#include <atomic>

static chi_runtime_t *g_rt;
static chi_dev_context_t g_ctx;
static cudaStream_t g_stream;
static chi_method_t g_count, g_nested, g_wait_local, g_gate, g_cpu_count;
static unsigned long long *g_dev; /* device: kernels' counters */
static chi_future_t *g_futs;      /* device: futures held across kernels */
static uint32_t g_slots;          /* gpu.device_slots */
/* Mapped pinned result words.  Like all CUDA memory here, allocated before
 * chi_init and freed after chi_finalize: cudaFreeHost and cudaFree wait for
 * every kernel, a persistent orchestrator's too. */
static int32_t *g_st32;
static int64_t *g_st64;
/* Mapped pinned words of test_gate_wait_*: [0] the gate, [2] the answer,
 * [3] started, [32..] diag words. */
static uint64_t *g_fake;
#define MAX_FUTS 65536u
static std::atomic<int> g_gate_open{0};
static std::atomic<unsigned long long> g_gate_ran{0}, g_cpu_ran{0};

#define SUBMIT_TIMEOUT_US 1000000u /* the documented default, set explicitly */
#define NCNT 8
enum { kOk, kBad, kAgain, kOther, kMaxWait, kReleased, kSpare1, kSpare2 };

__device__ unsigned long long d_task_count;

/* t.count: counts the tasks it ran (lane 0). */
__device__ chi_status_t t_count(chi_dev_request_t *r) {
  if (chi_port::lane_id() == 0) atomicAdd(&d_task_count, 1ull);
  r->output_size = 0;
  return CHI_OK;
}

/* t.nested: submits a GPU->CPU echo from inside the orchestrator (lane 0)
 * and answers {status of that submit, ns it took}. */
__device__ chi_status_t t_nested(chi_dev_request_t *r) {
  if (r->output_capacity < 16) return CHI_ERR_TOO_LARGE;
  if (chi_port::lane_id() == 0) {
    uint8_t in[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    chi_future_t f = 0;
    const uint64_t t0 = chi_port::timer_ns();
    const chi_status_t s = chi_dev_submit(r->ctx, CHI_ROUTE_CPU, CHI_METHOD_ECHO, in, 8, &f);
    const uint64_t dt = chi_port::timer_ns() - t0;
    if (s == CHI_OK) chi_dev_release(r->ctx, f);
    int64_t out[2] = {s, (int64_t)dt};
    memcpy(r->output, out, 16);
  }
  r->output_size = 16;
  return CHI_OK;
}

/* t.wait_local: submits a GPU->GPU echo of its 8-byte input from inside
 * the orchestrator (lane 0) and waits for it, at most 100 ms (released on a
 * timeout); answers {submit status, wait status, echo right}.  Run by a
 * GPU->GPU worker, it must not wait for a task only its own warp would run. */
__device__ chi_status_t t_wait_local(chi_dev_request_t *r) {
  if (r->output_capacity < 12 || r->input_size != 8) return CHI_ERR_INVALID;
  if (chi_port::lane_id() == 0) {
    uint8_t out[8] = {0};
    uint32_t n = 0;
    chi_future_t f = 0;
    int32_t res[3] = {chi_dev_submit(r->ctx, CHI_ROUTE_LOCAL, CHI_METHOD_ECHO, r->input, 8, &f), CHI_ERR_INVALID, 0};
    if (res[0] == CHI_OK) {
      res[1] = chi_dev_wait(r->ctx, f, 100000000ll, out, 8, &n);
      if (res[1] == CHI_ERR_TIMEOUT) chi_dev_release(r->ctx, f);
      int same = 1;
      for (int b = 0; b < 8; ++b) same &= out[b] == static_cast<const uint8_t *>(r->input)[b];
      res[2] = res[1] == CHI_OK && n == 8 && same;
    }
    memcpy(r->output, res, 12);
  }
  r->output_size = 12;
  return CHI_OK;
}

__device__ chi_status_t t_dispatch(uint32_t index, chi_dev_request_t *r) {
  switch (index) {
    case 0: return t_count(r);
    case 1: return t_nested(r);
    case 2: return t_wait_local(r);
  }
  return CHI_ERR_NOT_FOUND;
}
static const char *const kNames[] = {"t.count", "t.nested", "t.wait_local"};
CHI_DEFINE_ORCHESTRATOR(submit_test_orchestrator, t_dispatch, kNames, 3)

static void sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

/* t.gate (CPU): holds its poller until the test opens the gate. */
static chi_status_t h_gate(chi_request_t *req, void *ud) {
  (void)ud;
  while (!g_gate_open.load()) sleep_us(50);
  g_gate_ran++;
  req->output_size = 0;
  return CHI_OK;
}

static chi_status_t h_cpu_count(chi_request_t *req, void *ud) {
  (void)ud;
  g_cpu_ran++;
  req->output_size = 0;
  return CHI_OK;
}

static void sync_stream(void) {
  CK(cudaGetLastError());
  CK(cudaStreamSynchronize(g_stream));
}

static void read_counters(unsigned long long *c) {
  CK(cudaMemcpyAsync(c, g_dev, NCNT * sizeof *c, cudaMemcpyDeviceToHost, g_stream));
  sync_stream();
}

static void clear_counters(void) {
  CK(cudaMemsetAsync(g_dev, 0, NCNT * sizeof(unsigned long long), g_stream));
  sync_stream();
}

/* Device slots held now (chi_stats), after waiting for them to come back:
 * released tasks may still be running.  The bound only keeps a broken
 * runtime from hanging the test. */
static uint64_t slots_settled(void) {
  chi_stats_t st;
  st.struct_size = sizeof st;
  for (int i = 0; i < 60000; ++i) {
    assert_status(CHI_OK, chi_stats(g_rt, &st));
    if (st.device_slots_in_use == 0) break;
    sleep_us(1000);
  }
  return st.device_slots_in_use;
}

/* ------------------------------------------------------------ full grid */

/* Every thread: `rounds` x (chi_dev_submit chi.add, chi_dev_wait, check). */
__global__ void k_grid(chi_dev_context_t ctx, chi_route_t route, uint32_t rounds, unsigned long long *cnt) {
  const uint64_t tid = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
  unsigned long long ok = 0, bad = 0, again = 0, other = 0, maxwait = 0;
  for (uint32_t r = 0; r < rounds; ++r) {
    uint64_t in[2] = {tid * 1000003ull, r * 7ull + 1ull}, out = 0;
    chi_future_t f = 0;
    const uint64_t t0 = chi_port::timer_ns();
    chi_status_t s = chi_dev_submit(&ctx, route, CHI_METHOD_ADD, in, 16, &f);
    const uint64_t dt = chi_port::timer_ns() - t0;
    if (dt > maxwait) maxwait = dt;
    if (s == CHI_ERR_AGAIN) {
      ++again;
      continue;
    }
    if (s != CHI_OK) {
      ++other;
      continue;
    }
    uint32_t n = 0;
    s = chi_dev_wait(&ctx, f, GT_WAIT_NS, &out, sizeof out, &n);
    if (s == CHI_OK && n == 8 && out == in[0] + in[1]) ++ok;
    else ++bad;
  }
  atomicAdd(&cnt[kOk], ok);
  atomicAdd(&cnt[kBad], bad);
  atomicAdd(&cnt[kAgain], again);
  atomicAdd(&cnt[kOther], other);
  atomicMax(&cnt[kMaxWait], maxwait);
}

static void full_grid(chi_route_t route, const char *name) {
  const uint32_t warps = gt_env_count("CHI_TEST_GRID_WARPS", 1056);
  const uint32_t rounds = gt_env_count("CHI_TEST_GRID_TASKS", 20);
  const uint32_t threads = 256, blocks = (warps * 32 + threads - 1) / threads;
  const unsigned long long tasks = (unsigned long long)blocks * threads * rounds;
  clear_counters();
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaEventRecord(a, g_stream));
  k_grid<<<blocks, threads, 0, g_stream>>>(g_ctx, route, rounds, g_dev);
  CK(cudaEventRecord(b, g_stream));
  sync_stream();
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  unsigned long long c[NCNT];
  read_counters(c);
  printf("# full grid %s: %u warps x 32 lanes x %u = %llu tasks: ok %llu, wrong %llu, AGAIN %llu, "
         "other errors %llu; %.2f M tasks/s; longest submit (slot wait) %.1f us\n",
         name, blocks * threads / 32, rounds, tasks, c[kOk], c[kBad], c[kAgain], c[kOther],
         tasks / (ms * 1e3), c[kMaxWait] / 1e3);
  assert_int_equal(c[kOk], tasks);
  assert_int_equal(c[kBad], 0);
  assert_int_equal(c[kAgain], 0);
  assert_int_equal(c[kOther], 0);
  assert_int_equal(slots_settled(), 0);
}

static void test_full_grid_gpu_to_gpu(void **state) {
  (void)state;
  full_grid(CHI_ROUTE_LOCAL, "GPU->GPU");
}

static void test_full_grid_gpu_to_cpu(void **state) {
  (void)state;
  full_grid(CHI_ROUTE_CPU, "GPU->CPU");
}

/* ------------------------------------------------- handlers that wait */

/* Lane 0 of each warp in turn (warp k after warp k - 1, through the counter
 * cnt[kSpare1]): `rounds` x a GPU->GPU t.wait_local, whose handler submits a
 * GPU->GPU echo and waits for it; counts right answers, wrong ones, and
 * inner waits that timed out.  One parent at a time: with every worker
 * holding a waiting parent, their children would wait for a free worker
 * whatever the design (docs/gpu.md); different warps' slots put the
 * parents on different workers. */
__global__ void k_wait_local(chi_dev_context_t ctx, chi_method_t m, uint32_t rounds, unsigned long long *cnt) {
  const uint32_t warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32u;
  if (threadIdx.x % 32u != 0u) return;
  while (atomicAdd(&cnt[kSpare1], 0ull) != warp) __nanosleep(1000);
  for (uint32_t r = 0; r < rounds; ++r) {
    uint64_t in = warp * 131ull + r;
    int32_t res[3] = {0, 0, 0};
    uint32_t n = 0;
    chi_future_t f = 0;
    chi_status_t s = chi_dev_submit(&ctx, CHI_ROUTE_LOCAL, m, &in, 8, &f);
    if (s == CHI_OK) s = chi_dev_wait(&ctx, f, GT_WAIT_NS, res, sizeof res, &n);
    if (s == CHI_OK && n == 12 && res[0] == CHI_OK && res[1] == CHI_OK && res[2] == 1) atomicAdd(&cnt[kOk], 1ull);
    else if (res[1] == CHI_ERR_TIMEOUT) atomicAdd(&cnt[kAgain], 1ull);
    else atomicAdd(&cnt[kBad], 1ull);
  }
  __threadfence();
  atomicAdd(&cnt[kSpare1], 1ull);
}

/* Handlers run by GPU->GPU workers wait for GPU->GPU tasks they submitted:
 * each such task goes to a slot another worker serves, so none waits for
 * its own warp (64 warps in turn x 8 rounds). */
static void test_handler_waits_gpu(void **state) {
  (void)state;
  clear_counters();
  const uint32_t warps = 64, rounds = 8;
  k_wait_local<<<8, warps / 8 * 32, 0, g_stream>>>(g_ctx, g_wait_local, rounds, g_dev);
  sync_stream();
  unsigned long long c[NCNT];
  read_counters(c);
  printf("# handlers waiting for GPU->GPU tasks: ok %llu, inner timeouts %llu, wrong %llu\n", c[kOk], c[kAgain],
         c[kBad]);
  assert_int_equal(c[kAgain], 0);
  assert_int_equal(c[kBad], 0);
  assert_int_equal(c[kOk], (unsigned long long)warps * rounds);
  assert_int_equal(slots_settled(), 0);
}

/* ---------------------------------------------------------------- release */

/* One thread: the statuses of release on `route`, into st[0..15]. */
__global__ void k_release_rules(chi_dev_context_t ctx, chi_route_t route, int32_t *st) {
  uint8_t in[16] = {9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 1, 2, 3, 4, 5, 6}, out[16];
  uint32_t n = 0;
  int done = 0;
  chi_future_t f = 0;
  st[0] = chi_dev_submit(&ctx, route, CHI_METHOD_ECHO, in, 16, &f);
  st[1] = chi_dev_release(&ctx, f);                            /* OK */
  st[2] = chi_dev_wait(&ctx, f, GT_WAIT_NS, out, 16, &n);      /* INVALID */
  st[3] = chi_dev_test(&ctx, f, &done);                        /* INVALID */
  st[4] = chi_dev_release(&ctx, f);                            /* INVALID */
  /* Released after the task ended. */
  st[5] = chi_dev_submit(&ctx, route, CHI_METHOD_ECHO, in, 16, &f);
  st[6] = CHI_OK;
  for (done = 0; !done && st[6] == CHI_OK;) st[6] = chi_dev_test(&ctx, f, &done);
  st[7] = chi_dev_release(&ctx, f);                            /* OK */
  st[8] = chi_dev_wait(&ctx, f, 0, out, 16, &n);               /* INVALID */
  st[9] = chi_dev_release(&ctx, 0);                            /* INVALID */
  st[10] = chi_dev_release(NULL, f);                           /* INVALID */
  /* A consumed future cannot be released. */
  st[11] = chi_dev_try_submit(&ctx, route, CHI_METHOD_ECHO, in, 16, &f);
  st[12] = chi_dev_wait(&ctx, f, GT_WAIT_NS, out, 16, &n);     /* OK */
  st[13] = n == 16 && out[0] == 9 && out[15] == 6;
  st[14] = chi_dev_release(&ctx, f);                           /* INVALID */
  st[15] = chi_dev_release(&ctx, f ^ (1ull << 30));            /* another generation: INVALID */
}

static void release_rules(chi_route_t route) {
  int32_t *st = g_st32;
  k_release_rules<<<1, 1, 0, g_stream>>>(g_ctx, route, st);
  sync_stream();
  const int32_t want[16] = {CHI_OK, CHI_OK, CHI_ERR_INVALID, CHI_ERR_INVALID, CHI_ERR_INVALID,
                            CHI_OK, CHI_OK, CHI_OK, CHI_ERR_INVALID, CHI_ERR_INVALID,
                            CHI_ERR_INVALID, CHI_OK, CHI_OK, 1, CHI_ERR_INVALID, CHI_ERR_INVALID};
  for (int i = 0; i < 16; ++i)
    if (st[i] != want[i]) fail_msg("route %d: step %d gave %d, want %d", route, i, st[i], want[i]);
  assert_int_equal(slots_settled(), 0);
}

static void test_release_rules_gpu(void **state) {
  (void)state;
  release_rules(CHI_ROUTE_LOCAL);
}

static void test_release_rules_cpu(void **state) {
  (void)state;
  release_rules(CHI_ROUTE_CPU);
}

/* Every thread: `per` x (chi_dev_submit, chi_dev_release). */
__global__ void k_release_many(chi_dev_context_t ctx, chi_route_t route, chi_method_t m, uint32_t per,
                               unsigned long long *cnt) {
  unsigned long long released = 0, again = 0, other = 0;
  for (uint32_t i = 0; i < per; ++i) {
    chi_future_t f;
    chi_status_t s = chi_dev_submit(&ctx, route, m, NULL, 0, &f);
    if (s == CHI_ERR_AGAIN) {
      ++again;
      continue;
    }
    if (s == CHI_OK) s = chi_dev_release(&ctx, f);
    if (s == CHI_OK) ++released;
    else ++other;
  }
  atomicAdd(&cnt[kReleased], released);
  atomicAdd(&cnt[kAgain], again);
  atomicAdd(&cnt[kOther], other);
}

static void release_many(chi_route_t route, chi_method_t m, const char *name) {
  const uint32_t total = gt_env_count("CHI_TEST_RELEASES", 100000);
  const uint32_t threads = 400, per = (total + threads - 1) / threads;
  const unsigned long long n = (unsigned long long)threads * per;
  unsigned long long zero = 0, ran = 0;
  CK(cudaMemcpyToSymbolAsync(d_task_count, &zero, sizeof zero, 0, cudaMemcpyHostToDevice, g_stream));
  g_cpu_ran = 0;
  clear_counters();
  k_release_many<<<threads / 80, 80, 0, g_stream>>>(g_ctx, route, m, per, g_dev);
  sync_stream();
  unsigned long long c[NCNT];
  read_counters(c);
  const uint64_t held = slots_settled();
  /* Every released task still ran (they have all ended once their slots are back). */
  if (route == CHI_ROUTE_CPU) {
    ran = g_cpu_ran.load();
  } else {
    CK(cudaMemcpyFromSymbolAsync(&ran, d_task_count, sizeof ran, 0, cudaMemcpyDeviceToHost, g_stream));
    sync_stream();
  }
  chi_stats_t st;
  st.struct_size = sizeof st;
  assert_status(CHI_OK, chi_stats(g_rt, &st));
  printf("# %s: %llu futures released (AGAIN %llu, errors %llu); tasks run %llu; device slots held "
         "after: %llu of %llu\n",
         name, c[kReleased], c[kAgain], c[kOther], ran, (unsigned long long)held,
         (unsigned long long)st.device_slots_total);
  assert_int_equal(c[kReleased], n);
  assert_int_equal(c[kAgain], 0);
  assert_int_equal(c[kOther], 0);
  assert_int_equal(ran, n);
  assert_int_equal(held, 0);
}

static void test_release_many_gpu(void **state) {
  (void)state;
  release_many(CHI_ROUTE_LOCAL, g_count, "GPU->GPU release");
}

static void test_release_many_cpu(void **state) {
  (void)state;
  release_many(CHI_ROUTE_CPU, g_cpu_count, "GPU->CPU release");
}

/* ------------------------------------------------------- every slot held */

__global__ void k_hold(chi_dev_context_t ctx, chi_method_t gate, uint32_t n, chi_future_t *futs,
                       unsigned long long *cnt) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  chi_status_t s = chi_dev_try_submit(&ctx, CHI_ROUTE_CPU, gate, NULL, 0, &futs[i]);
  atomicAdd(&cnt[s == CHI_OK ? kOk : kOther], 1ull);
}

/* One warp while every GPU->CPU slot is held: st[0] try, st[1] warp try
 * (lane 0's), st[2] waiting submit, st[3] the GPU->GPU route still free. */
__global__ void k_full(chi_dev_context_t ctx, int64_t *st) {
  uint8_t in[8] = {0};
  chi_future_t f = 0;
  const uint32_t lane = threadIdx.x;
  if (lane == 0) st[0] = chi_dev_try_submit(&ctx, CHI_ROUTE_CPU, CHI_METHOD_ECHO, in, 8, &f);
  chi_status_t w = chi_dev_warp_try_submit(&ctx, CHI_ROUTE_CPU, CHI_METHOD_ECHO, in, 8, lane == 0, &f);
  if (lane == 0) {
    st[1] = w;
    const uint64_t t0 = chi_port::timer_ns();
    st[2] = chi_dev_submit(&ctx, CHI_ROUTE_CPU, CHI_METHOD_ECHO, in, 8, &f);
    st[4] = (int64_t)(chi_port::timer_ns() - t0);
    uint32_t n = 0;
    st[3] = chi_dev_submit(&ctx, CHI_ROUTE_LOCAL, CHI_METHOD_ECHO, in, 8, &f);
    if (st[3] == CHI_OK) st[3] = chi_dev_wait(&ctx, f, GT_WAIT_NS, in, 8, &n);
  }
}

__global__ void k_drain(chi_dev_context_t ctx, uint32_t n, const chi_future_t *futs, unsigned long long *cnt) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  chi_status_t s = chi_dev_wait(&ctx, futs[i], GT_WAIT_NS, NULL, 0, NULL);
  atomicAdd(&cnt[s == CHI_OK ? kOk : kBad], 1ull);
}

static void test_every_slot_held(void **state) {
  (void)state;
  assert_int_equal(slots_settled(), 0);
  g_gate_open = 0;
  g_gate_ran = 0;
  clear_counters();
  k_hold<<<(g_slots + 255) / 256, 256, 0, g_stream>>>(g_ctx, g_gate, g_slots, g_futs, g_dev);
  sync_stream();
  unsigned long long c[NCNT];
  read_counters(c);
  assert_int_equal(c[kOk], g_slots);

  int64_t *st = g_st64;
  k_full<<<1, 32, 0, g_stream>>>(g_ctx, st);
  sync_stream();
  printf("# every GPU->CPU slot held: try %d, warp try %d, submit %d after %.1f ms (timeout %u ms), "
         "GPU->GPU meanwhile %d\n",
         (int)st[0], (int)st[1], (int)st[2], st[4] / 1e6, SUBMIT_TIMEOUT_US / 1000, (int)st[3]);
  assert_int_equal(st[0], CHI_ERR_AGAIN);
  assert_int_equal(st[1], CHI_ERR_AGAIN);
  assert_int_equal(st[2], CHI_ERR_AGAIN);
  /* It waited for a slot: AGAIN only once the timeout passed. */
  assert_true(st[4] >= (int64_t)SUBMIT_TIMEOUT_US * 1000);
  assert_int_equal(st[3], CHI_OK);

  /* A handler in the orchestrator that submits while every slot is held:
   * AGAIN, without waiting out the timeout (which would be a wait for slots
   * that may only come back through this very orchestrator). */
  chi_future_t f;
  int64_t out[2] = {0, 0};
  size_t n = 0;
  assert_status(CHI_OK, chi_submit(g_rt, 0, g_nested, NULL, 0, &f));
  assert_status(CHI_OK, chi_wait(g_rt, f, GT_WAIT_NS, out, sizeof out, &n));
  printf("# handler in the orchestrator, every slot held: submit %d in %.1f us\n", (int)out[0], out[1] / 1e3);
  assert_int_equal(n, 16);
  assert_int_equal(out[0], CHI_ERR_AGAIN);
  assert_true(out[1] < (int64_t)SUBMIT_TIMEOUT_US * 1000);

  /* Open the gate: everything held runs and is consumed. */
  g_gate_open = 1;
  clear_counters();
  k_drain<<<(g_slots + 255) / 256, 256, 0, g_stream>>>(g_ctx, g_slots, g_futs, g_dev);
  sync_stream();
  read_counters(c);
  assert_int_equal(c[kOk], g_slots);
  assert_int_equal(c[kBad], 0);
  assert_int_equal(g_gate_ran.load(), g_slots);
  assert_int_equal(slots_settled(), 0);
  /* And the orchestrator's submit works again once slots are free. */
  assert_status(CHI_OK, chi_submit(g_rt, 0, g_nested, NULL, 0, &f));
  assert_status(CHI_OK, chi_wait(g_rt, f, GT_WAIT_NS, out, sizeof out, &n));
  assert_int_equal(out[0], CHI_OK);
}

/* The gate's wait as a GPU->GPU submit runs it after finding the
 * orchestrator stepped aside, over the test's own layout: w[2] = 1 when the
 * gate opened, 0 when it gave up. */
__global__ void k_gate_wait(chi_dev_ctx_layout_t l, volatile uint64_t *w) {
  w[3] = 1;
  __threadfence_system();
  w[2] = chi_dev_detail::gate_wait(&l, true) ? 1u : 0u;
}

/* Runs k_gate_wait with the gate shut and the lease thread's phase `phase`;
 * after `after_ms` sets the phase to `then` (0: unchanged) and opens the
 * gate if `open`.  Returns the kernel's answer. */
static uint64_t gate_case(uint64_t phase, bool with_diag, uint32_t lease_us, uint32_t timeout_us, int after_ms,
                          uint64_t then, bool open) {
  volatile uint64_t *w = g_fake;
  volatile uint64_t *diag = g_fake + 32;
  for (uint32_t i = 0; i < 32u + CHI_DEV_DIAG_WORDS; ++i) w[i] = 0;
  w[0] = chi_dev_detail::kGateAway;
  w[2] = 2;
  diag[CHI_DIAG_LEASE_PHASE] = phase;
  chi_dev_ctx_layout_t l;
  memset(&l, 0, sizeof l);
  l.gate = g_fake;
  l.diag = with_diag ? g_fake + 32 : NULL;
  l.lease_us = lease_us;
  l.submit_timeout_us = timeout_us;
  k_gate_wait<<<1, 1, 0, g_stream>>>(l, g_fake);
  CK(cudaGetLastError());
  for (int i = 0; i < 10000 && w[3] == 0; ++i) usleep(1000);
  assert_int_equal(w[3], 1);
  usleep((useconds_t)after_ms * 1000);
  if (then) diag[CHI_DIAG_LEASE_PHASE] = then;
  if (open) w[0] = 0;
  sync_stream();
  printf("# gate wait: phase %llu%s, lease %u us, timeout %u us, after %d ms: phase %llu%s -> %s\n",
         (unsigned long long)phase, with_diag ? "" : " (no diag words)", lease_us, timeout_us, after_ms,
         (unsigned long long)(then ? then : phase), open ? ", gate open" : "", w[2] == 1 ? "opened" : "gave up");
  return w[2];
}

/* The lease thread on its way, though later than two leases (the host's
 * scheduler): the submitter waits for the launch. */
static void test_gate_wait_late_lease_thread(void **state) {
  (void)state;
  assert_int_equal(gate_case(CHI_DIAG_PHASE_SLEEP, true, 100, 10000000, 20, 0, true), 1);
  assert_int_equal(gate_case(CHI_DIAG_PHASE_WAIT_END, true, 100, 10000000, 20, 0, true), 1);
}

/* The lease thread in a CUDA call (a device-wide call may hold it back and
 * wait for this kernel), or becoming so, or unknown: two leases, then
 * CHI_ERR_AGAIN; and the submit timeout bounds every wait. */
static void test_gate_wait_gives_up(void **state) {
  (void)state;
  assert_int_equal(gate_case(CHI_DIAG_PHASE_QUEUE, true, 100, 10000000, 0, 0, false), 0);
  assert_int_equal(gate_case(CHI_DIAG_PHASE_QUERY, true, 100, 10000000, 0, 0, false), 0);
  assert_int_equal(gate_case(CHI_DIAG_PHASE_SLEEP, true, 100, 10000000, 20, CHI_DIAG_PHASE_QUEUE, false), 0);
  assert_int_equal(gate_case(CHI_DIAG_PHASE_SLEEP, false, 100, 10000000, 0, 0, false), 0);
  assert_int_equal(gate_case(CHI_DIAG_PHASE_SLEEP, true, 100, 50000, 0, 0, false), 0);
}

int main(void) {
  setvbuf(stdout, NULL, _IONBF, 0);
  if (!gt_have_cuda()) return 77;
  if (cudaHostAlloc((void **)&g_st32, 16 * sizeof(int32_t), cudaHostAllocMapped) != cudaSuccess ||
      cudaHostAlloc((void **)&g_st64, 8 * sizeof(int64_t), cudaHostAllocMapped) != cudaSuccess ||
      cudaHostAlloc((void **)&g_fake, (32 + CHI_DEV_DIAG_WORDS) * sizeof(uint64_t), cudaHostAllocMapped) !=
          cudaSuccess ||
      cudaMalloc((void **)&g_dev, NCNT * sizeof(unsigned long long)) != cudaSuccess ||
      cudaMalloc((void **)&g_futs, MAX_FUTS * sizeof(chi_future_t)) != cudaSuccess ||
      cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking) != cudaSuccess) {
    fprintf(stderr, "CUDA set-up failed\n");
    return 1;
  }
  chi_config_t cfg;
  chi_config_init(&cfg);
  char settings[128];
  snprintf(settings, sizeof settings, "gpu.device_submit_timeout_us: %u\n", SUBMIT_TIMEOUT_US);
  cfg.settings = settings;
  if (chi_init(&cfg, &g_rt) != CHI_OK) {
    fprintf(stderr, "chi_init: %s\n", chi_last_error_message());
    return 1;
  }
  int32_t count = 0;
  chi_gpu_count(g_rt, &count);
  if (count == 0) {
    chi_finalize(g_rt);
    return 77;
  }
  chi_gpu_orchestrator_t o = submit_test_orchestrator();
  chi_stats_t st;
  st.struct_size = sizeof st;
  if (chi_gpu_set_orchestrator(g_rt, -1, &o) != CHI_OK ||
      chi_register_handler(g_rt, "t.gate", h_gate, NULL, &g_gate) != CHI_OK ||
      chi_register_handler(g_rt, "t.cpu_count", h_cpu_count, NULL, &g_cpu_count) != CHI_OK ||
      chi_method_lookup(g_rt, "t.count", &g_count) != CHI_OK ||
      chi_method_lookup(g_rt, "t.nested", &g_nested) != CHI_OK ||
      chi_method_lookup(g_rt, "t.wait_local", &g_wait_local) != CHI_OK ||
      chi_gpu_context(g_rt, 0, &g_ctx) != CHI_OK || chi_stats(g_rt, &st) != CHI_OK) {
    fprintf(stderr, "set-up: %s\n", chi_last_error_message());
    chi_finalize(g_rt);
    return 1;
  }
  g_slots = (uint32_t)(st.device_slots_total / 2 / (uint64_t)count);
  if (g_slots > MAX_FUTS) {
    fprintf(stderr, "gpu.device_slots %u: this test holds at most %u\n", g_slots, MAX_FUTS);
    chi_finalize(g_rt);
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_full_grid_gpu_to_gpu),
      cmocka_unit_test(test_full_grid_gpu_to_cpu),
      cmocka_unit_test(test_handler_waits_gpu),
      cmocka_unit_test(test_release_rules_gpu),
      cmocka_unit_test(test_release_rules_cpu),
      cmocka_unit_test(test_release_many_gpu),
      cmocka_unit_test(test_release_many_cpu),
      cmocka_unit_test(test_every_slot_held),
      cmocka_unit_test(test_gate_wait_late_lease_thread),
      cmocka_unit_test(test_gate_wait_gives_up),
  };
  static GtWatchdog wd; /* a hang fails with the orchestrator's state */
  wd.start(&g_ctx, 240);
  int failed = chi_test_run("gpu_device_submit", tests);
  wd.stop();
  /* A failed test may leave the gate shut with pollers inside it. */
  g_gate_open = 1;
  if (chi_finalize(g_rt) != CHI_OK) failed++;
  cudaFree(g_dev);
  cudaFree(g_futs);
  cudaFreeHost(g_st32);
  cudaFreeHost(g_st64);
  cudaFreeHost(g_fake);
  cudaStreamDestroy(g_stream);
  return failed ? 1 : 0;
}

/*
 * LL words after a generation cycle of their slot (issue 49; review of
 * 2026-11-28, finding 3).  A slot's generation comes back after 2^24-1 uses,
 * and an LL word that no task rewrote since carries that flag again: a
 * reader that loads it before the new task's word lands cannot tell the two
 * apart.  Each case sends 64 bytes of pattern P through a slot at
 * generation g (8 bytes for GPU->CPU), uses the slot with smaller payloads
 * until its next task has generation g again, then runs a task of pattern Q
 * there in the way that loads the words early:
 *   - GPU->GPU output, built-in echo (solo) and a user echo (the warp path):
 *     the worker that serves the slot is held by a task of another slot of
 *     its bell word, so the waiter's young polls load the output words
 *     before the orchestrator writes them;
 *   - GPU->GPU input, both paths: the request words and the bell go out
 *     before the input words (a submitter's stores landing out of order), so
 *     the worker's scan loads the input words before they are there;
 *   - GPU->CPU reply words 2-3: the CPU handler takes 2 ms, so the waiter's
 *     young polls load words 2-3 long before the reply.
 * Q must come back; the stale P is reported as such.  By default a test
 * hook moves the slot's generation (its state word, while the slot is free
 * and its last task is marked done): every task still goes through the real
 * submit, orchestrator and wait, and the cycle crosses the wrap from
 * 0xFFFFFF to 1.  `full` runs the review's recipe instead, without the hook:
 * 64 bytes of P, exactly 16,777,214 echoes of 8 bytes on the same slot,
 * then 64 bytes of Q (about a minute).  The orchestrator runs without a
 * lease (gpu.lease_us 0) unless CHI_GPU_LEASE_US says otherwise.
 * Exit 77 without a usable GPU.
 */
#include "gpu_common.h"

/* ------------------------------------------------------------ device side */

/* Generations are 24 bits and skip 0 (chimaera/device_protocol.h). */
__host__ __device__ static inline uint32_t gt_next_gen(uint32_t g) {
  return (g & 0xFFFFFFu) == 0xFFFFFFu ? 1u : g + 1u;
}
__host__ __device__ static inline uint32_t gt_prev_gen(uint32_t g) { return g > 1u ? g - 1u : 0xFFFFFFu; }
__device__ static inline uint32_t fut_gen(chi_future_t f) { return (uint32_t)(f >> 24) & 0xFFFFFFu; }
__device__ static inline uint32_t fut_slot(chi_future_t f) { return (uint32_t)(f & 0xFFFFFFu) - 1u; }

/* test.echo: the input back, every lane at work: a user method, so it runs
 * on the orchestrator's warp path (run_local_task), not solo. */
__device__ chi_status_t user_echo(chi_dev_request_t *r) {
  if (r->input_size > r->output_capacity) return CHI_ERR_TOO_LARGE;
  const uint8_t *in = (const uint8_t *)r->input;
  uint8_t *out = (uint8_t *)r->output;
  for (uint32_t i = chi_port::lane_id(); i < r->input_size; i += 32) out[i] = in[i];
  r->output_size = r->input_size;
  return CHI_OK;
}

/* test.hold: input {uint32_t *started, uint64_t ns}: sets *started, then
 * keeps its worker for ns. */
__device__ chi_status_t user_hold(chi_dev_request_t *r) {
  uint64_t a[2];
  if (r->input_size != sizeof a) return CHI_ERR_INVALID;
  memcpy(a, r->input, sizeof a);
  if (chi_port::lane_id() == 0) {
    *(volatile uint32_t *)(uintptr_t)a[0] = 1u;
    __threadfence();
  }
  const uint64_t t0 = chi_port::timer_ns();
  while (chi_port::timer_ns() - t0 < a[1]) chi_port::nanosleep(1000);
  r->output_size = 0;
  return CHI_OK;
}

__device__ chi_status_t ll_dispatch(uint32_t index, chi_dev_request_t *r) {
  switch (index) {
    case 0: return user_echo(r);
    case 1: return user_hold(r);
  }
  return CHI_ERR_NOT_FOUND;
}

static const char *const kNames[] = {"test.echo", "test.hold"};
CHI_DEFINE_ORCHESTRATOR(ll_orchestrator, ll_dispatch, kNames, 2)

enum Dir { kOutSolo, kOutWarp, kInSolo, kInWarp, kToCpu };

/* Where a case stopped (Result.step) and why (Result.status). */
enum Step { kDone, kWarm, kHook, kSendP, kCheckP, kCycle, kHold, kSendQ, kWaitQ, kSlotMoved, kGenWrong };

struct Result {
  int32_t step, status;
  uint32_t slot0, slot;   /* the case's slot; the one a task got instead */
  uint32_t gen_p, gen_q;  /* P's and Q's generations */
  uint32_t expect_gen;    /* in kGenWrong: what the task should have had */
  uint32_t n;             /* Q's output size */
  uint64_t uses;          /* tasks through the slot after P */
  uint32_t again;         /* CHI_ERR_AGAIN answers retried */
  uint32_t hold_slot;
  uint8_t out[64];
};

struct Methods {
  chi_method_t echo;      /* GPU->GPU: CHI_METHOD_ECHO or test.echo */
  chi_method_t hold;      /* test.hold */
  chi_method_t inc;       /* GPU->CPU: the input's uint64 + 1 */
  chi_method_t slow_inc;  /* ... after 2 ms */
};

__device__ uint32_t g_started;

__device__ bool same_bytes(const void *a, const void *b, uint32_t n) {
  for (uint32_t i = 0; i < n; ++i)
    if (((const uint8_t *)a)[i] != ((const uint8_t *)b)[i]) return false;
  return true;
}

__device__ bool give_up(Result *res, int step, chi_status_t s) {
  res->step = step;
  res->status = s;
  return false;
}

/* Submit (CHI_ERR_AGAIN: nothing was queued, so again) and wait.  The try
 * variant: its slot is the thread's first guess whenever that is free
 * (bitmap_alloc), so the case's tasks keep one slot; a waiting submit
 * starts its search at a place that moves with the clock. */
__device__ chi_status_t run_task(const chi_dev_context_t *ctx, chi_route_t route, chi_method_t m, const void *in,
                                 uint32_t n, void *out, uint32_t cap, uint32_t *on, chi_future_t *f, Result *res) {
  chi_status_t s;
  for (uint32_t i = 0;; ++i) {
    s = chi_dev_try_submit(ctx, route, m, in, n, f);
    if (s != CHI_ERR_AGAIN || i == 1000) break;
    ++res->again;
    chi_port::nanosleep(10000);
  }
  if (s != CHI_OK) return s;
  return chi_dev_wait(ctx, *f, GT_WAIT_NS, out, cap, on);
}

/* One task on the case's slot: its status checked, its slot the case's, its
 * generation `*gen`'s next (0: any), *gen set to it. */
__device__ bool use_slot(const chi_dev_context_t *ctx, chi_route_t route, chi_method_t m, const void *in, uint32_t n,
                         void *out, uint32_t cap, uint32_t *gen, int step, Result *res) {
  chi_future_t f = 0;
  uint32_t on = 0;
  const chi_status_t s = run_task(ctx, route, m, in, n, out, cap, &on, &f, res);
  if (s != CHI_OK) return give_up(res, step, s);
  if (fut_slot(f) != res->slot0) {
    res->slot = fut_slot(f);
    return give_up(res, kSlotMoved, CHI_OK);
  }
  if (*gen && fut_gen(f) != gt_next_gen(*gen)) {
    res->expect_gen = gt_next_gen(*gen);
    res->slot = fut_gen(f);
    return give_up(res, kGenWrong, CHI_OK);
  }
  *gen = fut_gen(f);
  return true;
}

/* The test hook: the slot's next task takes generation `next`, as if the
 * slot had been used that many more times.  The slot is free (its last
 * future consumed); a GPU->GPU one waits for the orchestrator's mark of its
 * last task first, so that nothing but the next submitter touches the word. */
__device__ bool move_gen(uint32_t *state, bool d2d, uint32_t next, Result *res) {
  if (d2d) {
    const uint64_t t0 = chi_port::timer_ns();
    for (;;) {
      const uint32_t v = chi_port::ld_relaxed_dev(state);
      if ((v & CHI_DEV_SLOT_DONE_BIT) || (v & 0xFFu) == CHI_DEV_SLOT_CLAIMED) break;
      if (chi_port::timer_ns() - t0 > 100000000ull) return give_up(res, kHook, (chi_status_t)v);
      chi_port::nanosleep(1000);
    }
  }
  chi_port::st_relaxed_dev(state, (gt_prev_gen(next) << 8) | CHI_DEV_SLOT_CLAIMED);
  return true;
}

/* A GPU->GPU submit of Q whose input words land well after its request
 * words and bell: the submit of chimaera/device_protocol.h (local_prepare,
 * local_publish) step by step, the input last. */
__device__ chi_status_t submit_late_input(const chi_dev_context_t *ctx, chi_method_t m, const uint8_t *q,
                                          chi_future_t *f, Result *res) {
  using namespace chi_dev_detail;
  const chi_dev_layout *l = layout(ctx);
  for (uint32_t i = 0; !gate_enter(l); ++i) {
    if (i == 100000) return CHI_ERR_AGAIN;
    chi_port::nanosleep(1000);
  }
  const int32_t s = bitmap_alloc(l->d2d_bitmap, l->slots);
  if (s < 0 || (uint32_t)s != res->slot0) {
    if (s >= 0) bitmap_free(l->d2d_bitmap, (uint32_t)s);
    gate_leave(l);
    res->slot = (uint32_t)s;
    give_up(res, kSlotMoved, CHI_OK);
    return CHI_ERR_INTERNAL;
  }
  const uint32_t slot = (uint32_t)s;
  const uint32_t gen = next_gen(chi_port::ld_relaxed_dev(l->d2d_state + slot) >> 8);
  chi_port::st_relaxed_dev(l->d2d_state + slot, (gen << 8) | CHI_DEV_SLOT_SUBMITTED);
  chi_port::ll_store16_dev(d2d_words(l, slot) + CHI_DEV_D2D_REQ_WORD, ll_pack(m, gen), ll_pack(64u, gen));
  chi_port::red_xor_dev(l->d2d_bell + (slot >> 5), 1u << (slot & 31u));
  gate_leave(l);
  /* The worker's scan has loaded the input words by now (an idle worker
   * looks at its bells every few microseconds). */
  const uint64_t t0 = chi_port::timer_ns();
  while (chi_port::timer_ns() - t0 < 2000000ull) chi_port::nanosleep(1000);
  ll_put(d2d_in_ll(l, slot), q, 64u, gen);
  *f = make_future(kKindLocal, gen, slot);
  return CHI_OK;
}

/* One warp; lane 0 runs the case, lane 1 holds the worker (kOut*). */
__global__ void k_cycle(chi_dev_context_t ctx, int dir, int full, Methods ms, Result *res) {
  const uint32_t lane = threadIdx.x;
  const bool d2d = dir != kToCpu;
  const chi_route_t route = d2d ? CHI_ROUTE_LOCAL : CHI_ROUTE_CPU;
  const chi_dev_ctx_layout_t *l = (const chi_dev_ctx_layout_t *)&ctx;
  __shared__ int ok;
  __shared__ uint32_t hold_slot;
  __shared__ chi_future_t hold_f;
  uint8_t p[64], q[64], out[64];
  for (uint32_t i = 0; i < 64; ++i) {
    p[i] = gt_byte(0x5050, i);
    q[i] = gt_byte(0x5151, i);
  }
  /* GPU->CPU: 8-byte outputs (inc) at P and Q, 16-byte echoes between. */
  const chi_method_t m_p = d2d ? ms.echo : ms.inc, m_q = d2d ? ms.echo : ms.slow_inc;
  const chi_method_t m_mid = d2d ? ms.echo : CHI_METHOD_ECHO;
  const uint32_t n_p = d2d ? 64u : 8u, n_mid = d2d ? 8u : 16u;
  if (lane == 0) {
    ok = 0;
    uint32_t *state = (d2d ? l->d2d_state : l->d2h_state);
    uint32_t gen = 0, on = 0;
    chi_future_t f = 0;
    /* The slot: this thread's first guess, every time (bitmap_alloc). */
    chi_status_t s = run_task(&ctx, route, m_mid, p, n_mid, out, sizeof out, &on, &f, res);
    if (s != CHI_OK) {
      give_up(res, kWarm, s);
      goto done;
    }
    res->slot0 = fut_slot(f);
    gen = fut_gen(f);
    if (!full) {
      /* P at generation 1 (the generation the slot's reply words carry must differ). */
      while (gen == 1u)
        if (!use_slot(&ctx, route, m_mid, p, n_mid, out, sizeof out, &gen, kWarm, res)) goto done;
      if (!move_gen(state + res->slot0, d2d, 1u, res)) goto done;
      gen = 0;
    }
    if (!use_slot(&ctx, route, m_p, p, n_p, out, sizeof out, &gen, kSendP, res)) goto done;
    res->gen_p = gen;
    if (!full && gen != 1u) { /* the hook did not take */
      res->expect_gen = 1u;
      res->slot = gen;
      give_up(res, kGenWrong, CHI_OK);
      goto done;
    }
    if (d2d ? !same_bytes(out, p, 64) : gt_load64(out) != gt_load64(p) + 1u) {
      give_up(res, kCheckP, CHI_OK);
      goto done;
    }
    /* To the generation before P's: C - 1 real uses, or the hook and two. */
    uint64_t uses = full ? 0xFFFFFEull : 2u;
    if (!full) {
      if (!move_gen(state + res->slot0, d2d, gt_prev_gen(gt_prev_gen(res->gen_p)), res)) goto done;
      gen = 0;
    }
    for (uint64_t i = 0; i < uses; ++i) {
      uint64_t x[2] = {i, ~i};
      if (!use_slot(&ctx, route, m_mid, x, n_mid, out, sizeof out, &gen, kCycle, res)) goto done;
      if (!same_bytes(out, x, n_mid)) {
        give_up(res, kCycle, CHI_ERR_INTERNAL);
        goto done;
      }
      res->uses = i + 1;
    }
    if (gt_next_gen(gen) != res->gen_p) {
      res->expect_gen = res->gen_p;
      res->slot = gt_next_gen(gen);
      give_up(res, kGenWrong, CHI_OK);
      goto done;
    }
    ok = 1;
  }
done:
  __syncwarp();
  const bool hold = ok && (dir == kOutSolo || dir == kOutWarp);
  if (hold && lane == 1) {
    /* A task of another slot whose bell word the same worker serves keeps
     * that worker for 2 ms (main: one worker serves every bell word). */
    g_started = 0;
    __threadfence();
    const uint64_t a[2] = {(uint64_t)(uintptr_t)&g_started, 2000000ull};
    chi_status_t s = chi_dev_submit(&ctx, route, ms.hold, a, sizeof a, &hold_f);
    hold_slot = s == CHI_OK ? fut_slot(hold_f) : 0xFFFFFFFFu;
    if (s != CHI_OK) {
      give_up(res, kHold, s);
      ok = 0;
    } else if ((hold_slot / 32u) % l->d2d_workers != (res->slot0 / 32u) % l->d2d_workers) {
      res->hold_slot = hold_slot;
      give_up(res, kHold, CHI_ERR_INTERNAL);
      ok = 0;
    }
  }
  __syncwarp();
  if (lane == 1 && hold && hold_slot != 0xFFFFFFFFu) {
    const chi_status_t s = chi_dev_wait(&ctx, hold_f, GT_WAIT_NS, NULL, 0, NULL);
    if (s != CHI_OK && ok) give_up(res, kHold, s);
  }
  if (lane == 0 && ok) {
    if (hold) {
      const uint64_t t0 = chi_port::timer_ns();
      while (*(volatile uint32_t *)&g_started == 0u)
        if (chi_port::timer_ns() - t0 > 1000000000ull) {
          give_up(res, kHold, CHI_ERR_TIMEOUT);
          return;
        }
    }
    chi_future_t f = 0;
    chi_status_t s;
    if (dir == kInSolo || dir == kInWarp) {
      s = submit_late_input(&ctx, m_q, q, &f, res);
    } else {
      for (uint32_t i = 0;; ++i) {
        s = chi_dev_try_submit(&ctx, route, m_q, q, n_p, &f);
        if (s != CHI_ERR_AGAIN || i == 1000) break;
        ++res->again;
        chi_port::nanosleep(10000);
      }
    }
    if (s != CHI_OK) {
      if (res->step == kDone) give_up(res, kSendQ, s);
      return;
    }
    res->gen_q = fut_gen(f);
    if (fut_slot(f) != res->slot0) {
      res->slot = fut_slot(f);
      give_up(res, kSlotMoved, CHI_OK);
    }
    /* A wait with a timeout polls from the start (young polls load the LL
     * output words: up to 64 bytes GPU->GPU, 8 GPU->CPU). */
    uint32_t on = 0;
    s = chi_dev_wait(&ctx, f, GT_WAIT_NS, res->out, d2d ? 64u : 8u, &on);
    res->n = on;
    if (s != CHI_OK) give_up(res, kWaitQ, s);
  }
}

/* -------------------------------------------------------------- host side */

static chi_runtime_t *g_rt;
static chi_dev_context_t g_ctx;
static cudaStream_t g_stream;
static Result *g_res;
static Methods g_ms;

static chi_status_t h_inc(chi_request_t *req, void *ud) { return gt_inc_handler(req, ud); }
static chi_status_t h_slow_inc(chi_request_t *req, void *ud) {
  struct timespec ts = {0, 2000000};
  nanosleep(&ts, NULL);
  return gt_inc_handler(req, ud);
}

static const char *step_name(int s) {
  static const char *const names[] = {"done", "warm-up", "test hook", "P's task", "P's answer", "the cycle",
                                      "the holding task", "Q's submit", "Q's wait", "slot moved", "generation"};
  return s >= 0 && s <= kGenWrong ? names[s] : "?";
}

static void run_case(int dir, int full, const char *what) {
  memset(g_res, 0, sizeof *g_res);
  Methods ms = g_ms;
  if (dir == kOutSolo || dir == kInSolo) ms.echo = CHI_METHOD_ECHO;
  k_cycle<<<1, 32, 0, g_stream>>>(g_ctx, dir, full, ms, g_res);
  CK(cudaGetLastError());
  CK(cudaStreamSynchronize(g_stream));
  const Result &r = *g_res;
  printf("# %s: slot %u, P generation %u, %llu uses between, Q generation %u, %u CHI_ERR_AGAIN retried\n", what,
         r.slot0, r.gen_p, (unsigned long long)r.uses, r.gen_q, r.again);
  if (r.step == kSlotMoved) fail_msg("%s: a task got slot %u, not the case's slot %u", what, r.slot, r.slot0);
  if (r.step == kGenWrong)
    fail_msg("%s: a task got generation %u, not %u (after %llu uses)", what, r.slot, r.expect_gen,
             (unsigned long long)r.uses);
  if (r.step == kHold && r.status == CHI_ERR_INTERNAL)
    fail_msg("%s: the holding task got slot %u, whose bell word another worker serves than slot %u's", what, r.hold_slot, r.slot0);
  if (r.step != kDone)
    fail_msg("%s: stopped at %s: %s (%d)", what, step_name(r.step), chi_status_string(r.status), r.status);
  assert_int_equal(r.gen_q, r.gen_p);
  uint8_t p[64], q[64];
  gt_fill(p, 64, 0x5050);
  gt_fill(q, 64, 0x5151);
  if (dir == kToCpu) {
    const uint64_t got = gt_load64(r.out), want = gt_load64(q) + 1u, stale = gt_load64(p) + 1u;
    if (r.n != 8 || got != want)
      fail_msg("%s: Q's answer %#llx (%u bytes), want %#llx%s", what, (unsigned long long)got, r.n,
               (unsigned long long)want, got == stale ? ": P's answer, from reply words 2-3 of its generation" : "");
    return;
  }
  assert_int_equal(r.n, 64);
  if (memcmp(r.out, q, 64) != 0) {
    int stale = 0, wrong = 0;
    for (int i = 0; i < 64; ++i) {
      if (r.out[i] == q[i]) continue;
      ++wrong;
      if (r.out[i] == p[i]) ++stale;
    }
    fail_msg("%s: %d of Q's 64 bytes wrong, %d of them P's (stale LL words of generation %u)", what, wrong, stale,
             r.gen_p);
  }
}

static void test_output_solo(void **) { run_case(kOutSolo, 0, "GPU->GPU output, built-in echo (solo)"); }
static void test_output_warp(void **) { run_case(kOutWarp, 0, "GPU->GPU output, user echo (warp path)"); }
static void test_input_solo(void **) { run_case(kInSolo, 0, "GPU->GPU input, built-in echo (solo)"); }
static void test_input_warp(void **) { run_case(kInWarp, 0, "GPU->GPU input, user echo (warp path)"); }
static void test_reply_words(void **) { run_case(kToCpu, 0, "GPU->CPU reply words 2-3"); }
static void test_full_cycle(void **) {
  run_case(kOutSolo, 1, "GPU->GPU output, built-in echo, 16,777,214 echoes between (no hook)");
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  const bool full = argc >= 2 && !strcmp(argv[1], "full");
  if (!gt_have_cuda()) return 77;
  if (cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking) != cudaSuccess ||
      cudaHostAlloc((void **)&g_res, sizeof *g_res, cudaHostAllocMapped) != cudaSuccess)
    return 1;
  /* No lease unless asked for: a launch that ends while the holding task
   * runs may step aside and close the gate, and Q's submit would then wait
   * for the hold to end. */
  setenv("CHI_GPU_LEASE_US", "0", 0);
  /* One GPU->GPU worker (2 warps: one polls the CPU->GPU ring, one serves
   * every bell word), so that the holding task, wherever its slot, holds
   * the worker that serves the case's slot. */
  setenv("CHI_GPU_BLOCKS", "1", 0);
  setenv("CHI_GPU_WARPS_PER_BLOCK", "2", 0);
  int rc = gt_start(&g_rt, &g_ctx);
  if (rc) return rc;
  chi_gpu_orchestrator_t o = ll_orchestrator();
  if (chi_gpu_set_orchestrator(g_rt, -1, &o) != CHI_OK || chi_gpu_context(g_rt, 0, &g_ctx) != CHI_OK ||
      chi_method_lookup(g_rt, "test.echo", &g_ms.echo) != CHI_OK ||
      chi_method_lookup(g_rt, "test.hold", &g_ms.hold) != CHI_OK ||
      chi_register_handler(g_rt, "test.inc", h_inc, NULL, &g_ms.inc) != CHI_OK ||
      chi_register_handler(g_rt, "test.slow_inc", h_slow_inc, NULL, &g_ms.slow_inc) != CHI_OK) {
    fprintf(stderr, "setup: %s\n", chi_last_error_message());
    chi_finalize(g_rt);
    return 1;
  }
  static GtWatchdog wd; /* a hang fails with the orchestrator's state */
  wd.start(&g_ctx, full ? 280 : 100);
  const struct CMUnitTest hooked[] = {
      cmocka_unit_test(test_output_solo), cmocka_unit_test(test_output_warp), cmocka_unit_test(test_input_solo),
      cmocka_unit_test(test_input_warp),  cmocka_unit_test(test_reply_words),
  };
  const struct CMUnitTest recipe[] = {cmocka_unit_test(test_full_cycle)};
  int failed = full ? chi_test_run("gpu_ll_cycle_full", recipe) : chi_test_run("gpu_ll_cycle", hooked);
  wd.stop();
  failed += gt_finalize(g_rt);
  cudaFreeHost(g_res);
  cudaStreamDestroy(g_stream);
  return failed ? 1 : 0;
}

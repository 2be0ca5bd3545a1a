/* Many threads on one runtime: submit/wait storms with checked results,
 * nested submits from handlers, full task slots in both submit modes, racing
 * waiters and racing registrations. */
#include "common.h"

#include <sched.h>
#include <stdatomic.h>
#include <strings.h>
#include <time.h>

/* Client mode (the *_client ctest variants, tests/run_with_server.sh): a case
 * that only an embedded runtime can show skips itself, saying why. */
static const char kClientSlotsReason[] =
    "queue_depth in this YAML sizes an embedded runtime; a client's slots come from the "
    "server (server.client_slots)";

/* Threads cannot use cmocka's asserts (they longjmp); they record the first
 * failure here and the test asserts on it after joining. */
static pthread_mutex_t failure_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_int failures;
static char first_failure[512];

static void record_failure(const char *what, chi_status_t s) {
  pthread_mutex_lock(&failure_mu);
  if (atomic_fetch_add(&failures, 1) == 0)
    snprintf(first_failure, sizeof first_failure, "%s: status %d (%s), last error '%s'", what,
             (int)s, chi_status_string(s), chi_last_error_message());
  pthread_mutex_unlock(&failure_mu);
}

#define CHECK(cond, what, s)                        \
  do {                                              \
    if (!(cond)) record_failure((what), (s));       \
  } while (0)

static void reset_failures(void) {
  atomic_store(&failures, 0);
  first_failure[0] = '\0';
}

static void assert_no_failures(void) {
  if (atomic_load(&failures) != 0)
    fail_msg("%d failure(s) in threads; first: %s", atomic_load(&failures), first_failure);
}

static void join_all(pthread_t *t, int n) {
  for (int i = 0; i < n; i++) assert_int_equal(pthread_join(t[i], NULL), 0);
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Deadlock detection: a waiter gives up when a progress counter (tasks
 * finished, pool-wide) did not move for 10 s, so that a lost task or a stuck
 * pool fails the test with a message instead of hanging until ctest kills
 * it.  It bounds no work, only a total standstill.  A test that saw a stall
 * leaves its runtime unfinalized: finalize could hang too. */
typedef struct progress {
  atomic_long *counter;
  long seen;
  struct timespec since;
} progress_t;

static void progress_init(progress_t *p, atomic_long *counter) {
  p->counter = counter;
  p->seen = atomic_load(counter);
  clock_gettime(CLOCK_MONOTONIC, &p->since);
}

static int progress_stalled(progress_t *p) {
  long now = atomic_load(p->counter);
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  if (now != p->seen) {
    p->seen = now;
    p->since = t;
    return 0;
  }
  return t.tv_sec - p->since.tv_sec > 10;
}

/* chi_wait(-1) with stall detection: CHI_ERR_TIMEOUT means a standstill. */
static chi_status_t wait_watched(chi_runtime_t *rt, chi_future_t f, void *out, size_t cap,
                                 size_t *out_size, atomic_long *counter) {
  progress_t pr;
  progress_init(&pr, counter);
  for (;;) {
    chi_status_t s = chi_wait(rt, f, 1000000000LL, out, cap, out_size);
    if (s != CHI_ERR_TIMEOUT || progress_stalled(&pr)) return s;
  }
}

#define STALL_MESSAGE "no task finished for 10 s: a task was lost or the pool deadlocked"

/* test.reverse: output = input reversed, then the FNV-1a of the input. */
static atomic_long reverse_calls;

static chi_status_t reverse_handler(chi_request_t *req, void *user_data) {
  (void)user_data;
  size_t n = req->input_size;
  if (n + 8 > req->output_capacity) return CHI_ERR_TOO_LARGE;
  const unsigned char *in = req->input;
  unsigned char *out = req->output;
  for (size_t i = 0; i < n; i++) out[i] = in[n - 1 - i];
  uint64_t h = chi_test_fnv1a(in, n);
  memcpy(out + n, &h, 8);
  req->output_size = n + 8;
  atomic_fetch_add(&reverse_calls, 1);
  return CHI_OK;
}

enum { kMaxInput = 200, kWindow = 16 };

typedef struct storm_arg {
  chi_runtime_t *rt;
  chi_method_t method;
  uint64_t seed;
  long tasks;
} storm_arg_t;

typedef struct pending {
  chi_future_t f;
  size_t size;
  unsigned char in[kMaxInput];
} pending_t;

/* Takes one result, by one of three styles picked by `style`, and checks it.
 * Returns 0, or -1 when the pool stood still (the thread then gives up). */
static int finish(chi_runtime_t *rt, pending_t *p, unsigned style) {
  unsigned char out[kMaxInput + 8];
  size_t sz = 0;
  chi_status_t s;
  progress_t pr;
  progress_init(&pr, &reverse_calls);
  if (style == 0) {
    int done = 0;
    for (;;) {
      s = chi_test(rt, p->f, &done);
      if (s != CHI_OK) {
        record_failure("chi_test", s);
        return 0;
      }
      if (done) break;
      if (progress_stalled(&pr)) {
        record_failure(STALL_MESSAGE, CHI_ERR_TIMEOUT);
        return -1;
      }
      sched_yield();
    }
    s = chi_wait(rt, p->f, 0, out, sizeof out, &sz);
  } else if (style == 1) {
    s = wait_watched(rt, p->f, out, sizeof out, &sz, &reverse_calls);
  } else {
    while ((s = chi_wait(rt, p->f, 1000000, out, sizeof out, &sz)) == CHI_ERR_TIMEOUT &&
           !progress_stalled(&pr)) {
    }
  }
  if (s == CHI_ERR_TIMEOUT) {
    record_failure(STALL_MESSAGE, s);
    return -1;
  }
  if (s != CHI_OK) {
    record_failure("chi_wait", s);
    return 0;
  }
  int ok = sz == p->size + 8;
  for (size_t i = 0; ok && i < p->size; i++) ok = out[i] == p->in[p->size - 1 - i];
  uint64_t h;
  memcpy(&h, out + p->size, 8);
  ok = ok && h == chi_test_fnv1a(p->in, p->size);
  CHECK(ok, "wrong result", s);
  return 0;
}

static void *storm_thread(void *varg) {
  storm_arg_t *a = varg;
  pending_t *win = calloc(kWindow, sizeof *win);
  if (!win) {
    record_failure("calloc", CHI_ERR_NOMEM);
    return NULL;
  }
  uint64_t seed = a->seed;
  long head = 0, tail = 0; /* window holds tasks tail..head-1 */
  while (tail < a->tasks) {
    if (head < a->tasks && head - tail < kWindow) {
      pending_t *p = &win[head % kWindow];
      p->size = (size_t)(chi_test_rand(&seed) % (kMaxInput + 1));
      for (size_t i = 0; i < p->size; i++) p->in[i] = (unsigned char)chi_test_rand(&seed);
      chi_status_t s = chi_submit(a->rt, CHI_ROUTE_CPU, a->method, p->in, p->size, &p->f);
      if (s != CHI_OK) {
        record_failure("chi_submit", s);
        break;
      }
      head++;
    } else {
      if (finish(a->rt, &win[tail % kWindow], (unsigned)(chi_test_rand(&seed) % 3)) != 0) break;
      tail++;
    }
  }
  free(win);
  return NULL;
}

static void test_submit_storm(void **state) {
  (void)state;
  reset_failures();
  atomic_store(&reverse_calls, 0);
  chi_runtime_t *rt = chi_test_init(4, NULL);
  chi_method_t m = 0;
  assert_status(CHI_OK, chi_register_handler(rt, "test.reverse", reverse_handler, NULL, &m));
  enum { kThreads = 8 };
  pthread_t t[kThreads];
  storm_arg_t args[kThreads];
  const long per_thread = chi_test_scaled(20000);
  for (int i = 0; i < kThreads; i++) {
    args[i] = (storm_arg_t){rt, m, 0x1234567ull * (uint64_t)(i + 1) + 99, per_thread};
    assert_int_equal(pthread_create(&t[i], NULL, storm_thread, &args[i]), 0);
  }
  join_all(t, kThreads);
  assert_no_failures(); /* a stalled runtime is left behind */
  assert_int_equal(atomic_load(&reverse_calls), per_thread * kThreads);
  assert_status(CHI_OK, chi_finalize(rt));
}

/* test.tree: input {depth, fanout, value}.  A leaf (depth 0) outputs value; an
 * inner node submits `fanout` children {depth - 1, fanout, value * fanout + i},
 * waits for them all and outputs the sum of their outputs. */
typedef struct tree_in {
  uint32_t depth;
  uint32_t fanout;
  uint64_t value;
} tree_in_t;

typedef struct tree_ctx {
  chi_runtime_t *rt;
  chi_method_t method;
  atomic_int tickets;
  atomic_int arrived;
  int rendezvous; /* the first two inner nodes meet (see tree_handler) */
  atomic_long calls;
  atomic_long finished;
} tree_ctx_t;

static chi_status_t tree_handler(chi_request_t *req, void *user_data) {
  tree_ctx_t *ctx = user_data;
  tree_in_t in;
  if (req->input_size != sizeof in || req->output_capacity < 8) return CHI_ERR_INVALID;
  memcpy(&in, req->input, sizeof in);
  atomic_fetch_add(&ctx->calls, 1);
  uint64_t sum = 0;
  if (in.depth == 0) {
    sum = in.value;
  } else {
    /* The first two inner nodes meet before submitting, so that both workers
     * (workers = 2) sit in a nested wait at the same time: only the rule
     * "a waiting worker runs queued tasks" lets their children run. */
    if (ctx->rendezvous && atomic_fetch_add(&ctx->tickets, 1) < 2) {
      atomic_fetch_add(&ctx->arrived, 1);
      while (atomic_load(&ctx->arrived) < 2) sched_yield();
    }
    chi_future_t f[16];
    if (in.fanout > 16) return CHI_ERR_INVALID;
    for (uint32_t i = 0; i < in.fanout; i++) {
      tree_in_t child = {in.depth - 1, in.fanout, in.value * in.fanout + i};
      chi_status_t s = chi_submit(ctx->rt, CHI_ROUTE_CPU, ctx->method, &child, sizeof child, &f[i]);
      if (s != CHI_OK) {
        for (uint32_t j = 0; j < i; j++) chi_release(ctx->rt, f[j]);
        return s;
      }
    }
    chi_status_t first_error = CHI_OK;
    for (uint32_t i = 0; i < in.fanout; i++) {
      uint64_t r = 0;
      size_t sz = 0;
      chi_status_t s = chi_wait(ctx->rt, f[i], -1, &r, sizeof r, &sz);
      if (s == CHI_OK && sz != 8) s = CHI_ERR_INTERNAL;
      if (s != CHI_OK && first_error == CHI_OK) first_error = s;
      sum += r;
    }
    if (first_error != CHI_OK) return first_error;
  }
  memcpy(req->output, &sum, 8);
  req->output_size = 8;
  atomic_fetch_add(&ctx->finished, 1);
  return CHI_OK;
}

static uint64_t tree_expected(uint32_t depth, uint32_t fanout, uint64_t value) {
  if (depth == 0) return value;
  uint64_t sum = 0;
  for (uint32_t i = 0; i < fanout; i++) sum += tree_expected(depth - 1, fanout, value * fanout + i);
  return sum;
}

static long tree_nodes(uint32_t depth, uint32_t fanout) {
  long n = 1, level = 1;
  for (uint32_t d = 0; d < depth; d++) n += (level *= fanout);
  return n;
}

typedef struct tree_arg {
  tree_ctx_t *ctx;
  int id;
  long roots;
} tree_arg_t;

static void *tree_thread(void *varg) {
  tree_arg_t *a = varg;
  enum { kRootWindow = 8 };
  chi_future_t f[kRootWindow];
  uint64_t want[kRootWindow];
  long head = 0, tail = 0;
  while (tail < a->roots) {
    if (head < a->roots && head - tail < kRootWindow) {
      tree_in_t in = {2, 4, (uint64_t)a->id * 1000000 + (uint64_t)head};
      want[head % kRootWindow] = tree_expected(in.depth, in.fanout, in.value);
      chi_status_t s =
          chi_submit(a->ctx->rt, CHI_ROUTE_CPU, a->ctx->method, &in, sizeof in, &f[head % kRootWindow]);
      if (s != CHI_OK) {
        record_failure("submit root", s);
        return NULL;
      }
      head++;
    } else {
      uint64_t r = 0;
      chi_status_t s =
          wait_watched(a->ctx->rt, f[tail % kRootWindow], &r, sizeof r, NULL, &a->ctx->finished);
      if (s == CHI_ERR_TIMEOUT) {
        record_failure(STALL_MESSAGE, s);
        return NULL;
      }
      CHECK(s == CHI_OK, "wait root", s);
      CHECK(s != CHI_OK || r == want[tail % kRootWindow], "wrong tree sum", s);
      tail++;
    }
  }
  return NULL;
}

static void test_nested_submits(void **state) {
  (void)state;
  reset_failures();
  /* On the heap and leaked if the pool deadlocks: its stuck workers still use it. */
  tree_ctx_t *ctx = calloc(1, sizeof *ctx);
  assert_non_null(ctx);
  ctx->rt = chi_test_init(2, NULL);
  ctx->rendezvous = 1;
  assert_status(CHI_OK, chi_register_handler(ctx->rt, "test.tree", tree_handler, ctx, &ctx->method));
  enum { kThreads = 4 };
  pthread_t t[kThreads];
  tree_arg_t args[kThreads];
  const long roots = chi_test_scaled(60);
  for (int i = 0; i < kThreads; i++) {
    args[i] = (tree_arg_t){ctx, i, roots};
    assert_int_equal(pthread_create(&t[i], NULL, tree_thread, &args[i]), 0);
  }
  join_all(t, kThreads);
  assert_no_failures(); /* a deadlocked runtime is left behind: finalize would hang */
  assert_int_equal(atomic_load(&ctx->calls), kThreads * roots * tree_nodes(2, 4));
  assert_true(atomic_load(&ctx->arrived) >= 2);
  assert_status(CHI_OK, chi_finalize(ctx->rt));
  free(ctx);
}

static chi_test_gate_t busy_gate;

static chi_status_t busy_handler(chi_request_t *req, void *user_data) {
  (void)req;
  (void)user_data;
  chi_test_gate_pass(&busy_gate);
  return CHI_OK;
}

static void test_nested_wide(void **state) {
  (void)state;
  reset_failures();
  /* Many parents queued ahead of all their children: each waiting worker
   * picks up more parents, nesting deeper, before any child runs.  However
   * deep that gets, the children must run in the end. */
  tree_ctx_t *ctx = calloc(1, sizeof *ctx); /* leaked on deadlock, as above */
  assert_non_null(ctx);
  ctx->rt = chi_test_init(2, NULL);
  chi_method_t busy = 0;
  chi_test_gate_init(&busy_gate);
  assert_status(CHI_OK, chi_register_handler(ctx->rt, "test.tree", tree_handler, ctx, &ctx->method));
  assert_status(CHI_OK, chi_register_handler(ctx->rt, "test.busy", busy_handler, NULL, &busy));
  /* Hold both workers while the parents are queued. */
  chi_future_t hold[2];
  for (int i = 0; i < 2; i++)
    assert_status(CHI_OK, chi_submit(ctx->rt, CHI_ROUTE_CPU, busy, NULL, 0, &hold[i]));
  chi_test_gate_await(&busy_gate, 2);
  enum { kParents = 400 };
  chi_future_t *f = calloc(kParents, sizeof *f);
  assert_non_null(f);
  for (int i = 0; i < kParents; i++) {
    tree_in_t in = {1, 1, (uint64_t)i};
    assert_status(CHI_OK, chi_submit(ctx->rt, CHI_ROUTE_CPU, ctx->method, &in, sizeof in, &f[i]));
  }
  chi_test_gate_open(&busy_gate);
  for (int i = 0; i < kParents; i++) {
    uint64_t r = ~0ull;
    chi_status_t s = wait_watched(ctx->rt, f[i], &r, sizeof r, NULL, &ctx->finished);
    if (s == CHI_ERR_TIMEOUT)
      fail_msg("parent %d: %s (%ld of %d parents and children done)", i, STALL_MESSAGE,
               atomic_load(&ctx->finished), 2 * kParents);
    assert_status(CHI_OK, s);
    assert_true(r == (uint64_t)i);
  }
  free(f);
  for (int i = 0; i < 2; i++) assert_status(CHI_OK, chi_wait(ctx->rt, hold[i], -1, NULL, 0, NULL));
  assert_status(CHI_OK, chi_finalize(ctx->rt));
  free(ctx);
  chi_test_gate_destroy(&busy_gate);
}

/* test.greedy: submits chi.echo children until a submit fails, then waits for
 * those accepted.  Reports what it saw. */
typedef struct greedy_out {
  int32_t accepted;
  int32_t refusal;     /* status of the submit that failed */
  int32_t has_message; /* chi_last_error_message was non-empty after it */
  int32_t children_ok; /* every accepted child came back intact */
} greedy_out_t;

static chi_status_t greedy_handler(chi_request_t *req, void *user_data) {
  chi_runtime_t *rt = user_data;
  greedy_out_t out = {0, CHI_OK, 0, 1};
  chi_future_t f[64];
  while (out.accepted < 64) {
    int32_t v = out.accepted;
    chi_status_t s = chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, &v, sizeof v, &f[out.accepted]);
    if (s != CHI_OK) {
      out.refusal = s;
      out.has_message = chi_last_error_message()[0] != '\0';
      break;
    }
    out.accepted++;
  }
  for (int32_t i = 0; i < out.accepted; i++) {
    int32_t v = -1;
    size_t sz = 0;
    if (chi_wait(rt, f[i], -1, &v, sizeof v, &sz) != CHI_OK || sz != sizeof v || v != i)
      out.children_ok = 0;
  }
  memcpy(req->output, &out, sizeof out);
  req->output_size = sizeof out;
  return CHI_OK;
}

static void test_submit_from_handler_never_blocks(void **state) {
  (void)state;
  SKIP_IN_CLIENT_MODE(kClientSlotsReason);
  /* Four slots and an hour-long submit timeout: a handler whose submit
   * blocked for a slot instead of failing would hang this test. */
  chi_runtime_t *rt = chi_test_init_yaml(2, "queue_depth: 4\nsubmit_timeout_ms: 3600000\n");
  chi_method_t m = 0;
  assert_status(CHI_OK, chi_register_handler(rt, "test.greedy", greedy_handler, rt, &m));
  for (int round = 0; round < 3; round++) {
    chi_future_t f = 0;
    assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, m, NULL, 0, &f));
    greedy_out_t out;
    size_t sz = 0;
    assert_status(CHI_OK, chi_wait(rt, f, -1, &out, sizeof out, &sz));
    assert_int_equal(sz, sizeof out);
    assert_status(CHI_ERR_AGAIN, out.refusal);
    assert_true(out.has_message);
    /* The parent holds one of the four slots. */
    assert_true(out.accepted >= 1 && out.accepted <= 3);
    assert_true(out.children_ok);
  }
  assert_status(CHI_OK, chi_finalize(rt));
}

static void test_nonblocking_full(void **state) {
  (void)state;
  SKIP_IN_CLIENT_MODE(kClientSlotsReason);
  chi_runtime_t *rt = chi_test_init_yaml(1, "queue_depth: 4\nsubmit_blocking: false\n");
  chi_future_t f[5];
  for (int i = 0; i < 4; i++)
    assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, &i, sizeof i, &f[i]));
  /* Finished or not, unconsumed tasks hold their slots. */
  assert_status(CHI_ERR_AGAIN, chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, "x", 1, &f[4]));
  assert_has_message();
  assert_status(CHI_ERR_AGAIN, chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, "x", 1, &f[4]));
  /* Releasing a finished task frees its slot at once (an unfinished one's
   * slot comes back only when it finishes). */
  int done = 0;
  do {
    assert_status(CHI_OK, chi_test(rt, f[0], &done));
    if (!done) sched_yield();
  } while (!done);
  assert_status(CHI_OK, chi_release(rt, f[0]));
  assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, "x", 1, &f[0]));
  char out[8];
  assert_status(CHI_OK, chi_wait(rt, f[0], -1, out, sizeof out, NULL));
  assert_int_equal(out[0], 'x');
  for (int i = 1; i < 4; i++) {
    int v = -1;
    assert_status(CHI_OK, chi_wait(rt, f[i], -1, &v, sizeof v, NULL));
    assert_int_equal(v, i);
  }
  assert_status(CHI_OK, chi_finalize(rt));
}

/* A worker busy in a long handler and another one idle: a new task is run
 * by the idle one, without waiting for the handler, whether the idle worker
 * sleeps at once (spin_ns: 0) or spins first (the default).  The busy
 * worker cleared its spinning flag when it took its task: a flag left set
 * would make the submitter skip the sleeper's wake-up, and the task would
 * wait for the handler, which here waits for the task (the wait's 10 s
 * timeout then fails the test instead of a hang).  The last two settings
 * run three workers with one spinner, and with three spinners that stay
 * awake (a long spin_ns), so the spinner that took the held task also held
 * the watch and must have handed it on. */
typedef struct hold {
  atomic_int running; /* handlers that started */
  atomic_int release;
} hold_t;

static chi_status_t hold_handler(chi_request_t *req, void *user) {
  hold_t *h = user;
  atomic_fetch_add(&h->running, 1);
  /* Released by the test; 60 s at most, so that a failed test ends. */
  for (int i = 0; i < 60000 && !atomic_load(&h->release); i++) sleep_ms(1);
  req->output_size = 0;
  return CHI_OK;
}

static void test_idle_worker_runs_beside_busy(void **state) {
  (void)state;
  SKIP_IN_CLIENT_MODE("spin_ns in this YAML is the embedded runtime's own; a client's tasks run on the "
                      "server's workers");
  static const char *const yaml[4] = {"spin_ns: 0\n", "", "worker_spinners: 1\n",
                                      "worker_spinners: 3\nspin_ns: 200000000\n"};
  for (int v = 0; v < 4; v++) {
    chi_runtime_t *rt = chi_test_init_yaml(v < 2 ? 2 : 3, yaml[v]);
    static hold_t h;
    chi_method_t m = 0;
    assert_status(CHI_OK, chi_register_handler(rt, "test.hold", hold_handler, &h, &m));
    for (int round = 0; round < 4; round++) {
      atomic_store(&h.running, 0);
      atomic_store(&h.release, 0);
      chi_future_t held = 0, f = 0;
      assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, m, NULL, 0, &held));
      while (!atomic_load(&h.running)) sched_yield();
      /* Rounds 2 and 3: the other worker has gone to sleep meanwhile. */
      if (round >= 2) sleep_ms(20);
      char c = 0;
      assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, "w", 1, &f));
      const chi_status_t s = chi_wait(rt, f, 10000000000LL, &c, 1, NULL);
      atomic_store(&h.release, 1);
      assert_status(CHI_OK, s);
      assert_int_equal(c, 'w');
      assert_status(CHI_OK, chi_wait(rt, held, -1, NULL, 0, NULL));
    }
    assert_status(CHI_OK, chi_finalize(rt));
  }
}

/* Spinners that leave together, each with a task that holds its worker,
 * while the other workers sleep: the tasks queued behind them still run.  A
 * worker that leaves its spin with a task skips the look for more work (and
 * the wake-up it would pass on) while another worker spins; of spinners
 * that leave at once, the last to read the others' flags sees them all
 * clear and looks.  Were that look skipped by all of them, the quick tasks
 * would wait for the held handlers, which wait for the test: the 10 s wait
 * fails the test instead of a hang.  Two and three spinners of four
 * workers, spinning long so that only the cap decides who sleeps. */
static void test_spinners_leave_together(void **state) {
  (void)state;
  SKIP_IN_CLIENT_MODE("worker_spinners in this YAML is the embedded runtime's own; a client's tasks run on "
                      "the server's workers");
  static const char *const yaml[2] = {"worker_spinners: 2\nspin_ns: 200000000\n",
                                      "worker_spinners: 3\nspin_ns: 200000000\n"};
  for (int v = 0; v < 2; v++) {
    chi_runtime_t *rt = chi_test_init_yaml(4, yaml[v]);
    static hold_t h;
    chi_method_t m = 0;
    assert_status(CHI_OK, chi_register_handler(rt, "test.hold", hold_handler, &h, &m));
    const long rounds = chi_test_scaled(100);
    for (long round = 0; round < rounds; round++) {
      atomic_store(&h.running, 0);
      atomic_store(&h.release, 0);
      enum { kHeld = 2, kQuick = 6 };
      chi_future_t held[kHeld], quick[kQuick];
      for (int i = 0; i < kHeld; i++) assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, m, NULL, 0, &held[i]));
      /* Odd rounds: the quick tasks come once both held ones run. */
      if (round % 2)
        while (atomic_load(&h.running) < kHeld) sched_yield();
      for (int i = 0; i < kQuick; i++) {
        const char c = (char)('a' + i);
        assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, &c, 1, &quick[i]));
      }
      chi_status_t first_bad = CHI_OK;
      for (int i = 0; i < kQuick; i++) {
        char c = 0;
        const chi_status_t s = chi_wait(rt, quick[i], 10000000000LL, &c, 1, NULL);
        if (s == CHI_OK && c != (char)('a' + i)) first_bad = CHI_ERR_INVALID;
        if (s != CHI_OK && first_bad == CHI_OK) first_bad = s;
        if (s != CHI_OK) break;
      }
      atomic_store(&h.release, 1);
      for (int i = 0; i < kHeld; i++) assert_status(CHI_OK, chi_wait(rt, held[i], -1, NULL, 0, NULL));
      assert_status(CHI_OK, first_bad);
    }
    assert_status(CHI_OK, chi_finalize(rt));
  }
}

/* Bursts after idle spells, each task of a burst needing a worker of its
 * own: kBurst handlers that wait for each other (a barrier bounded at 10 s,
 * so a lost wake-up fails the test instead of hanging it).  One wake is
 * under way at a time (wake_pending_): submitters that find it set skip
 * their wake, and the woken worker passes the wake on when it sees more
 * work, so every sleeper of a burst is woken in a chain.  A task whose
 * submitter skipped its wake must be seen by the look of the worker woken
 * (the sleep protocol's clears, docs/threading.md), or the barrier waits
 * for a worker that never comes.  Submitted from one thread and from
 * kBurst threads at once, after pauses long enough for every worker to
 * sleep (spin_ns: 0, and a short spin) and without them. */
enum { kBurst = 4 };
typedef struct barrier_round {
  atomic_int arrived;
  atomic_int timed_out;
} barrier_round_t;

static chi_status_t barrier_handler(chi_request_t *req, void *user) {
  barrier_round_t *b = user;
  atomic_fetch_add(&b->arrived, 1);
  int i = 0;
  for (; i < 10000 && atomic_load(&b->arrived) < kBurst; i++) sleep_ms(1);
  if (atomic_load(&b->arrived) < kBurst) atomic_store(&b->timed_out, 1);
  req->output_size = 0;
  return CHI_OK;
}

typedef struct burst_arg {
  chi_runtime_t *rt;
  chi_method_t method;
  atomic_int *go;
  chi_future_t future;
  chi_status_t status;
} burst_arg_t;

static void *burst_submitter(void *varg) {
  burst_arg_t *a = varg;
  while (!atomic_load(a->go)) sched_yield();
  a->status = chi_submit(a->rt, CHI_ROUTE_CPU, a->method, NULL, 0, &a->future);
  return NULL;
}

static void test_burst_wakes_every_worker(void **state) {
  (void)state;
  SKIP_IN_CLIENT_MODE("spin_ns in this YAML is the embedded runtime's own; a client's tasks run on the "
                      "server's workers");
  static const char *const yaml[2] = {"spin_ns: 0\nworker_pop_batch: 1\n",
                                      "spin_ns: 20000\nworker_spinners: 1\nworker_pop_batch: 1\n"};
  for (int v = 0; v < 2; v++) {
    chi_runtime_t *rt = chi_test_init_yaml(kBurst, yaml[v]);
    static barrier_round_t b;
    chi_method_t m = 0;
    assert_status(CHI_OK, chi_register_handler(rt, "test.barrier", barrier_handler, &b, &m));
    const long rounds = chi_test_scaled(200);
    for (long round = 0; round < rounds; round++) {
      atomic_store(&b.arrived, 0);
      atomic_store(&b.timed_out, 0);
      if (round % 4 != 3) sleep_ms(round % 4 == 0 ? 5 : 1); /* the workers go to sleep */
      chi_future_t f[kBurst] = {0};
      if (round % 2 == 0) {
        for (int i = 0; i < kBurst; i++) assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, m, NULL, 0, &f[i]));
      } else {
        atomic_int go = 0;
        pthread_t t[kBurst];
        burst_arg_t a[kBurst];
        for (int i = 0; i < kBurst; i++) {
          a[i] = (burst_arg_t){rt, m, &go, 0, CHI_ERR_INTERNAL};
          assert_int_equal(0, pthread_create(&t[i], NULL, burst_submitter, &a[i]));
        }
        atomic_store(&go, 1);
        join_all(t, kBurst);
        for (int i = 0; i < kBurst; i++) {
          assert_status(CHI_OK, a[i].status);
          f[i] = a[i].future;
        }
      }
      for (int i = 0; i < kBurst; i++) assert_status(CHI_OK, chi_wait(rt, f[i], 20000000000LL, NULL, 0, NULL));
      if (atomic_load(&b.timed_out))
        fail_msg("round %ld (%s): %d of %d tasks of a burst ran at once: a sleeper was not woken", round,
                 yaml[v], atomic_load(&b.arrived), kBurst);
    }
    assert_status(CHI_OK, chi_finalize(rt));
  }
}

/* inline_wait: every worker held in a handler, a task of this thread's
 * still runs, on the waiting thread (its handler sees no worker free).
 * Without the setting the same wait times out (the future stays valid and
 * is taken once the workers are released).  A task run inline may submit
 * and wait for a task of its own (chi.echo from inside "test.relay"), which
 * runs inline too, and its chi_finalize is refused as on a worker. */
typedef struct relay_ctx {
  chi_runtime_t *rt;
  atomic_int ran_on_test_thread;
  pthread_t test_thread;
  chi_status_t finalize_status; /* chi_finalize from the first relay: refused */
} relay_ctx_t;

static chi_status_t relay_handler(chi_request_t *req, void *user) {
  relay_ctx_t *c = user;
  if (pthread_equal(pthread_self(), c->test_thread)) atomic_fetch_add(&c->ran_on_test_thread, 1);
  if (c->finalize_status == CHI_OK) c->finalize_status = chi_finalize(c->rt);
  chi_future_t f = 0;
  chi_status_t s = chi_submit(c->rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, req->input, req->input_size, &f);
  if (s != CHI_OK) return s;
  size_t got = 0;
  s = chi_wait(c->rt, f, 10000000000LL, req->output, req->output_capacity, &got);
  req->output_size = got;
  return s;
}

static void test_inline_wait(void **state) {
  (void)state;
  SKIP_IN_CLIENT_MODE("inline_wait runs an embedded runtime's queued tasks; a client's tasks run on the server");
  static const char *const yaml[2] = {"inline_wait: false\n", "inline_wait: true\n"};
  /* The file decides here, not the inline_wait variant's CHI_INLINE_WAIT. */
  char *env = getenv("CHI_INLINE_WAIT");
  char saved[16] = {0};
  if (env) snprintf(saved, sizeof saved, "%s", env);
  unsetenv("CHI_INLINE_WAIT");
  for (int v = 0; v < 2; v++) {
    chi_runtime_t *rt = chi_test_init_yaml(2, yaml[v]);
    static hold_t h;
    static relay_ctx_t c;
    c.rt = rt;
    c.test_thread = pthread_self();
    c.finalize_status = CHI_OK;
    atomic_store(&c.ran_on_test_thread, 0);
    chi_method_t hold = 0, relay = 0;
    assert_status(CHI_OK, chi_register_handler(rt, "test.hold", hold_handler, &h, &hold));
    assert_status(CHI_OK, chi_register_handler(rt, "test.relay", relay_handler, &c, &relay));
    const long rounds = chi_test_scaled(20);
    for (long round = 0; round < rounds; round++) {
      atomic_store(&h.running, 0);
      atomic_store(&h.release, 0);
      chi_future_t held[2], f = 0;
      for (int i = 0; i < 2; i++) assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, hold, NULL, 0, &held[i]));
      while (atomic_load(&h.running) < 2) sched_yield();
      char in[8] = "relay", out[8] = {0};
      size_t got = 0;
      assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, relay, in, sizeof in, &f));
      /* v 0: no worker is free, so nothing runs it within 20 ms.  v 1: the
       * waiter runs it, and its child, while both workers are still held. */
      const chi_status_t s = chi_wait(rt, f, v ? 10000000000LL : 20000000LL, out, sizeof out, &got);
      const int released = atomic_load(&h.release);
      atomic_store(&h.release, 1);
      if (v) {
        assert_status(CHI_OK, s);
        assert_int_equal(released, 0);
      } else {
        assert_status(CHI_ERR_TIMEOUT, s);
        assert_status(CHI_OK, chi_wait(rt, f, 10000000000LL, out, sizeof out, &got));
      }
      assert_int_equal(got, sizeof in);
      assert_memory_equal(out, in, sizeof in);
      for (int i = 0; i < 2; i++) assert_status(CHI_OK, chi_wait(rt, held[i], -1, NULL, 0, NULL));
    }
    if (v) assert_int_equal(atomic_load(&c.ran_on_test_thread), rounds);
    else assert_int_equal(atomic_load(&c.ran_on_test_thread), 0);
    assert_status(CHI_ERR_INVALID, c.finalize_status);
    assert_status(CHI_OK, chi_finalize(rt));
  }
  if (saved[0]) setenv("CHI_INLINE_WAIT", saved, 1);
}

static void test_blocking_submit_times_out(void **state) {
  (void)state;
  SKIP_IN_CLIENT_MODE(kClientSlotsReason);
  chi_runtime_t *rt = chi_test_init_yaml(1, "queue_depth: 2\nsubmit_timeout_ms: 20\n");
  chi_future_t f[3];
  for (int i = 0; i < 2; i++)
    assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, "a", 1, &f[i]));
  assert_status(CHI_ERR_AGAIN, chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, "b", 1, &f[2]));
  assert_has_message();
  assert_status(CHI_OK, chi_wait(rt, f[0], -1, NULL, 0, NULL));
  assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, "c", 1, &f[2]));
  assert_status(CHI_OK, chi_wait(rt, f[1], -1, NULL, 0, NULL));
  char c = 0;
  assert_status(CHI_OK, chi_wait(rt, f[2], -1, &c, 1, NULL));
  assert_int_equal(c, 'c');
  assert_status(CHI_OK, chi_finalize(rt));
}

typedef struct blocked_arg {
  chi_runtime_t *rt;
  atomic_int started;
  chi_status_t submit_status;
  chi_status_t wait_status;
  char result;
} blocked_arg_t;

static void *blocked_submitter(void *varg) {
  blocked_arg_t *a = varg;
  chi_future_t f = 0;
  atomic_store(&a->started, 1);
  a->submit_status = chi_submit(a->rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, "B", 1, &f);
  if (a->submit_status == CHI_OK) a->wait_status = chi_wait(a->rt, f, -1, &a->result, 1, NULL);
  return NULL;
}

static void test_blocking_submit_gets_freed_slot(void **state) {
  (void)state;
  chi_runtime_t *rt = chi_test_init_yaml(1, "queue_depth: 2\nsubmit_timeout_ms: 3600000\n");
  chi_future_t f[2];
  for (int i = 0; i < 2; i++)
    assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, "A", 1, &f[i]));
  blocked_arg_t a;
  memset(&a, 0, sizeof a);
  a.rt = rt;
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, blocked_submitter, &a), 0);
  while (!atomic_load(&a.started)) sched_yield();
  sleep_ms(20); /* most likely asleep in chi_submit by now; correct either way */
  assert_status(CHI_OK, chi_wait(rt, f[0], -1, NULL, 0, NULL));
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_status(CHI_OK, a.submit_status);
  assert_status(CHI_OK, a.wait_status);
  assert_int_equal(a.result, 'B');
  assert_status(CHI_OK, chi_wait(rt, f[1], -1, NULL, 0, NULL));
  assert_status(CHI_OK, chi_finalize(rt));
}

/* test.count: output = 3 * input + 1 (uint64), counting calls. */
static atomic_long count_calls;

static chi_status_t count_handler(chi_request_t *req, void *user_data) {
  (void)user_data;
  uint64_t v;
  if (req->input_size != 8) return CHI_ERR_INVALID;
  memcpy(&v, req->input, 8);
  v = 3 * v + 1;
  memcpy(req->output, &v, 8);
  req->output_size = 8;
  atomic_fetch_add(&count_calls, 1);
  return CHI_OK;
}

typedef struct nb_arg {
  chi_runtime_t *rt;
  chi_method_t method;
  int id;
  long tasks;
  long again;
} nb_arg_t;

static void *nonblocking_thread(void *varg) {
  nb_arg_t *a = varg;
  chi_future_t f[kWindow];
  uint64_t v[kWindow];
  long head = 0, tail = 0;
  progress_t pr;
  progress_init(&pr, &count_calls);
  while (tail < a->tasks) {
    chi_status_t s = CHI_ERR_AGAIN;
    if (head < a->tasks && head - tail < kWindow) {
      v[head % kWindow] = ((uint64_t)a->id << 32) | (uint64_t)head;
      s = chi_submit(a->rt, CHI_ROUTE_CPU, a->method, &v[head % kWindow], 8, &f[head % kWindow]);
      if (s == CHI_OK) {
        head++;
        continue;
      }
      if (s != CHI_ERR_AGAIN) {
        record_failure("non-blocking submit", s);
        return NULL;
      }
      CHECK(chi_last_error_message()[0] != '\0', "CHI_ERR_AGAIN without a message", s);
      a->again++;
    }
    if (tail == head) {
      if (progress_stalled(&pr)) {
        record_failure(STALL_MESSAGE, CHI_ERR_AGAIN);
        return NULL;
      }
      sched_yield(); /* others hold every slot */
      continue;
    }
    uint64_t r = 0;
    s = wait_watched(a->rt, f[tail % kWindow], &r, 8, NULL, &count_calls);
    if (s == CHI_ERR_TIMEOUT) {
      record_failure(STALL_MESSAGE, s);
      return NULL;
    }
    CHECK(s == CHI_OK && r == 3 * v[tail % kWindow] + 1, "non-blocking result", s);
    tail++;
  }
  return NULL;
}

static void test_nonblocking_submitters(void **state) {
  (void)state;
  reset_failures();
  atomic_store(&count_calls, 0);
  chi_runtime_t *rt = chi_test_init_yaml(2, "queue_depth: 8\nsubmit_blocking: false\n");
  chi_method_t m = 0;
  assert_status(CHI_OK, chi_register_handler(rt, "test.count", count_handler, NULL, &m));
  enum { kThreads = 4 };
  pthread_t t[kThreads];
  nb_arg_t args[kThreads];
  const long per_thread = chi_test_scaled(5000);
  for (int i = 0; i < kThreads; i++) {
    args[i] = (nb_arg_t){rt, m, i, per_thread, 0};
    assert_int_equal(pthread_create(&t[i], NULL, nonblocking_thread, &args[i]), 0);
  }
  join_all(t, kThreads);
  assert_no_failures(); /* a stalled runtime is left behind */
  long again = 0;
  for (int i = 0; i < kThreads; i++) again += args[i].again;
  /* Each thread wants 16 tasks in flight and there are 8 slots. */
  assert_true(again > 0);
  assert_int_equal(atomic_load(&count_calls), per_thread * kThreads);
  assert_status(CHI_OK, chi_finalize(rt));
}

/* Several threads wait on the same future: exactly one takes the result. */
typedef struct race_arg {
  chi_runtime_t *rt;
  chi_future_t f;
  atomic_int *go;
  chi_status_t status;
  char out[8];
} race_arg_t;

static void *racing_waiter(void *varg) {
  race_arg_t *a = varg;
  while (!atomic_load(a->go)) sched_yield();
  a->status = chi_wait(a->rt, a->f, -1, a->out, sizeof a->out, NULL);
  return NULL;
}

static chi_test_gate_t race_gate;

static chi_status_t gated_echo(chi_request_t *req, void *user_data) {
  (void)user_data;
  chi_test_gate_pass(&race_gate);
  memcpy(req->output, req->input, req->input_size);
  req->output_size = req->input_size;
  return CHI_OK;
}

static void test_racing_waiters(void **state) {
  (void)state;
  chi_runtime_t *rt = chi_test_init(2, NULL);
  chi_method_t gated = 0;
  chi_test_gate_init(&race_gate);
  assert_status(CHI_OK, chi_register_handler(rt, "test.gated", gated_echo, NULL, &gated));
  enum { kWaiters = 3 };
  const long rounds = chi_test_scaled(200);
  for (long round = 0; round < rounds; round++) {
    /* Round 0 holds the task until every waiter is surely in chi_wait. */
    chi_method_t m = round == 0 ? gated : CHI_METHOD_ECHO;
    atomic_int go;
    atomic_init(&go, 0);
    race_arg_t a[kWaiters];
    pthread_t t[kWaiters];
    chi_future_t f = 0;
    assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, m, "ok", 3, &f));
    for (int i = 0; i < kWaiters; i++) {
      memset(&a[i], 0, sizeof a[i]);
      a[i].rt = rt;
      a[i].f = f;
      a[i].go = &go;
      assert_int_equal(pthread_create(&t[i], NULL, racing_waiter, &a[i]), 0);
    }
    atomic_store(&go, 1);
    if (round == 0) {
      sleep_ms(20);
      chi_test_gate_open(&race_gate);
    }
    join_all(t, kWaiters);
    int winners = 0;
    for (int i = 0; i < kWaiters; i++) {
      if (a[i].status == CHI_OK) {
        winners++;
        assert_string_equal(a[i].out, "ok");
      } else {
        assert_status(CHI_ERR_INVALID, a[i].status);
      }
    }
    assert_int_equal(winners, 1);
  }
  assert_status(CHI_OK, chi_finalize(rt));
  chi_test_gate_destroy(&race_gate);
}

typedef struct reg_arg {
  chi_runtime_t *rt;
  int id;
  int count;
  chi_method_t ids[100];
} reg_arg_t;

static void *registering_thread(void *varg) {
  reg_arg_t *a = varg;
  for (int i = 0; i < a->count; i++) {
    char name[64];
    snprintf(name, sizeof name, "thread%d.method%d", a->id, i);
    chi_status_t s = chi_register_handler(a->rt, name, count_handler, NULL, &a->ids[i]);
    if (s != CHI_OK) {
      record_failure("register", s);
      return NULL;
    }
    /* Use it at once: a new id must be callable from any thread. */
    uint64_t v = (uint64_t)i, r = 0;
    chi_future_t f = 0;
    s = chi_submit(a->rt, CHI_ROUTE_CPU, a->ids[i], &v, 8, &f);
    if (s == CHI_OK) s = chi_wait(a->rt, f, -1, &r, 8, NULL);
    CHECK(s == CHI_OK && r == 3 * v + 1, "call fresh method", s);
  }
  return NULL;
}

static void test_concurrent_registration(void **state) {
  (void)state;
  reset_failures();
  chi_runtime_t *rt = chi_test_init(2, NULL);
  enum { kThreads = 4, kPer = 100 };
  pthread_t t[kThreads];
  reg_arg_t *args = calloc(kThreads, sizeof *args);
  assert_non_null(args);
  for (int i = 0; i < kThreads; i++) {
    args[i].rt = rt;
    args[i].id = i;
    args[i].count = kPer;
    assert_int_equal(pthread_create(&t[i], NULL, registering_thread, &args[i]), 0);
  }
  join_all(t, kThreads);
  assert_no_failures();
  for (int i = 0; i < kThreads; i++) {
    for (int j = 0; j < kPer; j++) {
      char name[64];
      snprintf(name, sizeof name, "thread%d.method%d", i, j);
      chi_method_t m = 0;
      assert_status(CHI_OK, chi_method_lookup(rt, name, &m));
      assert_int_equal(m, args[i].ids[j]);
      assert_true(m > CHI_METHOD_CHECKSUM);
      /* Ids are unique: compare with every earlier one. */
      for (int k = 0; k <= i; k++)
        for (int l = 0; l < (k == i ? j : kPer); l++) assert_true(args[k].ids[l] != m);
    }
  }
  free(args);
  assert_status(CHI_OK, chi_finalize(rt));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_submit_storm),
      cmocka_unit_test(test_nested_submits),
      cmocka_unit_test(test_nested_wide),
      cmocka_unit_test(test_submit_from_handler_never_blocks),
      cmocka_unit_test(test_nonblocking_full),
      cmocka_unit_test(test_blocking_submit_times_out),
      cmocka_unit_test(test_idle_worker_runs_beside_busy),
      cmocka_unit_test(test_spinners_leave_together),
      cmocka_unit_test(test_burst_wakes_every_worker),
      cmocka_unit_test(test_inline_wait),
      cmocka_unit_test(test_blocking_submit_gets_freed_slot),
      cmocka_unit_test(test_nonblocking_submitters),
      cmocka_unit_test(test_racing_waiters),
      cmocka_unit_test(test_concurrent_registration),
  };
  return chi_test_run("concurrency", tests);
}

/* chi_submit_batch and chi_wait_batch: results in order, where each call
 * stops and what it leaves valid, argument checks, interplay with the
 * one-task calls, several batching threads, and a batch larger than the slot
 * pool in the non-blocking submit mode. */
#include "common.h"

#include <stdatomic.h>

typedef struct fixture {
  chi_runtime_t *rt;
  chi_test_gate_t gate;
  chi_method_t gated;  /* test.gated: waits at the gate, then echoes */
  chi_method_t status; /* test.status: returns the int32 in its input */
  chi_method_t nested; /* test.nested: sums its input's bytes through a batch of chi.add */
} fixture_t;

static chi_status_t gated_handler(chi_request_t *req, void *user_data) {
  fixture_t *fx = user_data;
  chi_test_gate_pass(&fx->gate);
  if (req->input_size > req->output_capacity) return CHI_ERR_TOO_LARGE;
  if (req->input_size) memcpy(req->output, req->input, req->input_size);
  req->output_size = req->input_size;
  return CHI_OK;
}

static chi_status_t status_handler(chi_request_t *req, void *user_data) {
  (void)user_data;
  int32_t s;
  if (req->input_size != sizeof s) return CHI_ERR_INVALID;
  memcpy(&s, req->input, sizeof s);
  return s;
}

/* A handler that batches: input n bytes; adds (byte i, i) for each with one
 * chi_submit_batch of chi.add and one chi_wait_batch, outputs the total. */
static chi_status_t nested_handler(chi_request_t *req, void *user_data) {
  fixture_t *fx = user_data;
  enum { kMax = 16 };
  const unsigned char *in = req->input;
  size_t n = req->input_size;
  if (n > kMax || req->output_capacity < sizeof(uint64_t)) return CHI_ERR_INVALID;
  uint64_t args[kMax][2], sums[kMax];
  chi_task_desc_t tasks[kMax];
  chi_task_result_t results[kMax];
  chi_future_t futures[kMax];
  for (size_t i = 0; i < n; i++) {
    args[i][0] = in[i];
    args[i][1] = i;
    tasks[i] = (chi_task_desc_t){CHI_METHOD_ADD, args[i], sizeof args[i]};
    results[i] = (chi_task_result_t){&sums[i], sizeof sums[i], 0, CHI_ERR_INTERNAL};
  }
  size_t sent = 0, done = 0;
  chi_status_t s = chi_submit_batch(fx->rt, CHI_ROUTE_CPU, tasks, n, futures, &sent);
  if (s != CHI_OK) return s;
  s = chi_wait_batch(fx->rt, futures, sent, -1, results, &done);
  if (s != CHI_OK) return s;
  uint64_t total = 0;
  for (size_t i = 0; i < n; i++) {
    if (results[i].status != CHI_OK) return results[i].status;
    total += sums[i];
  }
  memcpy(req->output, &total, sizeof total);
  req->output_size = sizeof total;
  return CHI_OK;
}

static int setup(void **state) {
  fixture_t *fx = calloc(1, sizeof *fx);
  assert_non_null(fx);
  chi_test_gate_init(&fx->gate);
  fx->rt = chi_test_init(2, NULL);
  assert_status(CHI_OK, chi_register_handler(fx->rt, "test.gated", gated_handler, fx, &fx->gated));
  assert_status(CHI_OK, chi_register_handler(fx->rt, "test.status", status_handler, NULL, &fx->status));
  assert_status(CHI_OK, chi_register_handler(fx->rt, "test.nested", nested_handler, fx, &fx->nested));
  *state = fx;
  return 0;
}

static int teardown(void **state) {
  fixture_t *fx = *state;
  chi_test_gate_open(&fx->gate);
  chi_status_t s = chi_finalize(fx->rt);
  chi_test_gate_destroy(&fx->gate);
  free(fx);
  return s == CHI_OK ? 0 : -1;
}

static void fill(unsigned char *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 131 + seed * 7 + 1);
}

static int message_has(const char *needle) {
  return strstr(chi_last_error_message(), needle) != NULL;
}

/* Echoes of every size class (0 bytes, inline in the queue cell, just past
 * it, at max_inline_payload), the built-ins and a failing handler in the
 * middle: every result in its place, the failure only in its own status. */
static void test_mixed_results(void **state) {
  fixture_t *fx = *state;
  enum { kLimit = 4096, kN = 9 };
  static const size_t sizes[] = {0, 1, 104, 105, 1000, kLimit};
  static unsigned char in[6][kLimit], out[kN][kLimit];
  const uint64_t add_in[2] = {40, 2};
  const int32_t code = CHI_ERR_USER_BASE - 5;
  chi_task_desc_t tasks[kN];
  for (size_t i = 0; i < 6; i++) {
    fill(in[i], sizes[i], (unsigned)i);
    tasks[i] = (chi_task_desc_t){CHI_METHOD_ECHO, sizes[i] ? in[i] : NULL, sizes[i]};
  }
  /* The failing task sits between echoes. */
  tasks[6] = tasks[3];
  tasks[3] = (chi_task_desc_t){fx->status, &code, sizeof code};
  tasks[7] = (chi_task_desc_t){CHI_METHOD_ADD, add_in, sizeof add_in};
  tasks[8] = (chi_task_desc_t){CHI_METHOD_CHECKSUM, in[5], kLimit};

  chi_future_t futures[kN];
  size_t sent = 99;
  assert_status(CHI_OK, chi_submit_batch(fx->rt, CHI_ROUTE_CPU, tasks, kN, futures, &sent));
  assert_int_equal(sent, kN);
  chi_task_result_t results[kN];
  for (size_t i = 0; i < kN; i++) {
    assert_true(futures[i] != 0);
    results[i] = (chi_task_result_t){out[i], kLimit, (size_t)-1, 12345};
  }
  size_t done = 99;
  assert_status(CHI_OK, chi_wait_batch(fx->rt, futures, kN, -1, results, &done));
  assert_int_equal(done, kN);
  for (size_t i = 0; i < kN; i++) {
    if (i == 3 || i == 7 || i == 8) continue;
    assert_status(CHI_OK, results[i].status);
    assert_int_equal(results[i].output_size, tasks[i].input_size);
    if (tasks[i].input_size) assert_memory_equal(out[i], tasks[i].input, tasks[i].input_size);
  }
  assert_int_equal(results[3].status, code);
  assert_status(CHI_OK, results[7].status);
  uint64_t sum = 0;
  assert_int_equal(results[7].output_size, sizeof sum);
  memcpy(&sum, out[7], sizeof sum);
  assert_int_equal(sum, 42);
  uint64_t h = 0;
  assert_status(CHI_OK, results[8].status);
  memcpy(&h, out[8], sizeof h);
  assert_int_equal(h, chi_test_fnv1a(in[5], kLimit));
  /* Every future was consumed. */
  for (size_t i = 0; i < kN; i++) assert_status(CHI_ERR_INVALID, chi_release(fx->rt, futures[i]));
  /* CHI_ROUTE_LOCAL from host code is the CPU route, batched alike. */
  assert_status(CHI_OK, chi_submit_batch(fx->rt, CHI_ROUTE_LOCAL, tasks, 3, futures, &sent));
  assert_status(CHI_OK, chi_wait_batch(fx->rt, futures, 3, -1, results, &done));
  assert_int_equal(results[2].output_size, 104);
  assert_memory_equal(out[2], in[2], 104);
}

/* A task that cannot be queued stops the batch: the ones before it run, its
 * own future and the later ones are 0. */
static void test_submit_stops_at_failure(void **state) {
  fixture_t *fx = *state;
  static unsigned char big[4097];
  const char a[] = "first", b[] = "second", c[] = "never";
  struct {
    chi_task_desc_t bad;
    chi_status_t want;
  } cases[] = {
      {{CHI_METHOD_ECHO, big, sizeof big}, CHI_ERR_TOO_LARGE},
      {{0, a, sizeof a}, CHI_ERR_INVALID},
      {{0x7ffff, a, sizeof a}, CHI_ERR_NOT_FOUND},
      {{CHI_METHOD_ECHO, NULL, 8}, CHI_ERR_INVALID},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    chi_task_desc_t tasks[4] = {{CHI_METHOD_ECHO, a, sizeof a},
                                {CHI_METHOD_ECHO, b, sizeof b},
                                cases[k].bad,
                                {CHI_METHOD_ECHO, c, sizeof c}};
    chi_future_t futures[4] = {7, 7, 7, 7};
    size_t sent = 99;
    assert_status(cases[k].want, chi_submit_batch(fx->rt, CHI_ROUTE_CPU, tasks, 4, futures, &sent));
    assert_has_message();
    assert_true(message_has("tasks[2]"));
    assert_int_equal(sent, 2);
    assert_true(futures[0] != 0 && futures[1] != 0);
    assert_true(futures[2] == 0 && futures[3] == 0);
    char out[2][16];
    chi_task_result_t results[2] = {{out[0], sizeof out[0], 0, -77}, {out[1], sizeof out[1], 0, -77}};
    size_t done = 0;
    assert_status(CHI_OK, chi_wait_batch(fx->rt, futures, 2, -1, results, &done));
    assert_int_equal(done, 2);
    assert_string_equal(out[0], a);
    assert_string_equal(out[1], b);
  }
  /* A bad route: nothing queued. */
  chi_task_desc_t t = {CHI_METHOD_ECHO, a, sizeof a};
  chi_future_t f = 7;
  size_t sent = 99;
  assert_status(CHI_ERR_INVALID, chi_submit_batch(fx->rt, -7, &t, 1, &f, &sent));
  assert_int_equal(sent, 0);
  assert_true(f == 0);
}

/* An output buffer too small stops the wait at that future, which stays
 * valid; a later wait with a larger buffer takes it. */
static void test_too_large_keeps_future(void **state) {
  fixture_t *fx = *state;
  unsigned char in[3][100], out[3][100];
  chi_task_desc_t tasks[3];
  for (int i = 0; i < 3; i++) {
    fill(in[i], sizeof in[i], 10 + (unsigned)i);
    tasks[i] = (chi_task_desc_t){CHI_METHOD_ECHO, in[i], sizeof in[i]};
  }
  chi_future_t futures[3];
  assert_status(CHI_OK, chi_submit_batch(fx->rt, CHI_ROUTE_CPU, tasks, 3, futures, NULL));
  chi_task_result_t results[3] = {{out[0], 100, 0, -77}, {out[1], 10, 0, -77}, {out[2], 100, 0, -77}};
  size_t done = 99;
  assert_status(CHI_ERR_TOO_LARGE, chi_wait_batch(fx->rt, futures, 3, -1, results, &done));
  assert_has_message();
  assert_true(message_has("futures[1]"));
  assert_int_equal(done, 1);
  assert_status(CHI_OK, results[0].status);
  assert_memory_equal(out[0], in[0], 100);
  assert_int_equal(results[1].status, CHI_ERR_TOO_LARGE);
  assert_int_equal(results[1].output_size, 100);
  assert_int_equal(results[2].status, -77); /* untouched */
  assert_status(CHI_ERR_INVALID, chi_test(fx->rt, futures[0], &(int){0}));
  int finished = 0;
  assert_status(CHI_OK, chi_test(fx->rt, futures[1], &finished));
  assert_status(CHI_OK, chi_test(fx->rt, futures[2], &finished));

  results[1].output_capacity = 100;
  assert_status(CHI_OK, chi_wait_batch(fx->rt, futures + 1, 2, -1, results + 1, &done));
  assert_int_equal(done, 2);
  assert_memory_equal(out[1], in[1], 100);
  assert_memory_equal(out[2], in[2], 100);
  /* A NULL buffer discards the output (no size check), as chi_wait. */
  assert_status(CHI_OK, chi_submit_batch(fx->rt, CHI_ROUTE_CPU, tasks, 1, futures, NULL));
  chi_task_result_t discard = {NULL, 0, 0, -77};
  assert_status(CHI_OK, chi_wait_batch(fx->rt, futures, 1, -1, &discard, &done));
  assert_status(CHI_OK, discard.status);
  assert_int_equal(discard.output_size, 100);
}

/* A task still running stops the wait with CHI_ERR_TIMEOUT, leaving it and
 * the later futures valid. */
static void test_timeout(void **state) {
  fixture_t *fx = *state;
  const char x[] = "x", held[] = "held", z[] = "z";
  chi_task_desc_t tasks[3] = {{CHI_METHOD_ECHO, x, sizeof x}, {fx->gated, held, sizeof held},
                              {CHI_METHOD_ECHO, z, sizeof z}};
  chi_future_t futures[3];
  assert_status(CHI_OK, chi_submit_batch(fx->rt, CHI_ROUTE_CPU, tasks, 3, futures, NULL));
  chi_test_gate_await(&fx->gate, 1);
  // The first task ends on its own (the gate holds only the second): wait
  // for it without a clock, so the 1 ms below bounds only the held task's
  // wait (a loaded machine may take longer than that to run an echo).
  for (int first_done = 0; !first_done;)
    assert_status(CHI_OK, chi_test(fx->rt, futures[0], &first_done));
  char out[3][16];
  chi_task_result_t results[3];
  for (int i = 0; i < 3; i++) results[i] = (chi_task_result_t){out[i], sizeof out[i], 0, -77};
  size_t done = 99;
  assert_status(CHI_ERR_TIMEOUT, chi_wait_batch(fx->rt, futures, 3, 1000000, results, &done));
  assert_has_message();
  assert_int_equal(done, 1);
  assert_string_equal(out[0], x);
  assert_int_equal(results[1].status, CHI_ERR_TIMEOUT);
  assert_status(CHI_ERR_TIMEOUT, chi_wait_batch(fx->rt, futures + 1, 2, 0, results + 1, &done));
  assert_int_equal(done, 0);
  int finished = 1;
  assert_status(CHI_OK, chi_test(fx->rt, futures[1], &finished));
  assert_int_equal(finished, 0);
  assert_status(CHI_OK, chi_test(fx->rt, futures[2], &finished));

  chi_test_gate_open(&fx->gate);
  assert_status(CHI_OK, chi_wait_batch(fx->rt, futures + 1, 2, -1, results + 1, &done));
  assert_int_equal(done, 2);
  assert_string_equal(out[1], held);
  assert_string_equal(out[2], z);
}

static void test_invalid_arguments(void **state) {
  fixture_t *fx = *state;
  chi_runtime_t *rt = fx->rt;
  const char a[] = "a";
  chi_task_desc_t t = {CHI_METHOD_ECHO, a, sizeof a};
  chi_future_t f[2] = {0, 0};
  char out[8];
  chi_task_result_t r[2] = {{out, sizeof out, 0, 0}, {out, sizeof out, 0, 0}};
  size_t count = 99;

  assert_status(CHI_ERR_INVALID, chi_submit_batch(NULL, CHI_ROUTE_CPU, &t, 1, f, &count));
  assert_has_message();
  assert_int_equal(count, 0);
  assert_status(CHI_ERR_INVALID, chi_submit_batch(rt, CHI_ROUTE_CPU, NULL, 1, f, &count));
  assert_true(message_has("tasks"));
  assert_status(CHI_ERR_INVALID, chi_submit_batch(rt, CHI_ROUTE_CPU, &t, 1, NULL, &count));
  assert_true(message_has("futures"));
  assert_status(CHI_ERR_INVALID,
                chi_submit_batch(rt, CHI_ROUTE_CPU, &t, (size_t)CHI_BATCH_MAX + 1, f, &count));
  assert_true(message_has("CHI_BATCH_MAX"));
  assert_int_equal(count, 0);
  count = 99;
  assert_status(CHI_OK, chi_submit_batch(rt, CHI_ROUTE_CPU, NULL, 0, NULL, &count));
  assert_int_equal(count, 0);

  count = 99;
  assert_status(CHI_ERR_INVALID, chi_wait_batch(NULL, f, 1, -1, r, &count));
  assert_has_message();
  assert_int_equal(count, 0);
  assert_status(CHI_ERR_INVALID, chi_wait_batch(rt, NULL, 1, -1, r, &count));
  assert_status(CHI_ERR_INVALID, chi_wait_batch(rt, f, 1, -1, NULL, &count));
  assert_status(CHI_ERR_INVALID, chi_wait_batch(rt, f, (size_t)CHI_BATCH_MAX + 1, -1, r, &count));
  count = 99;
  assert_status(CHI_OK, chi_wait_batch(rt, NULL, 0, -1, NULL, &count));
  assert_int_equal(count, 0);

  /* Future 0, and a consumed future, stop the wait at their index. */
  assert_status(CHI_OK, chi_submit_batch(rt, CHI_ROUTE_CPU, &t, 1, &f[1], NULL));
  f[0] = 0;
  assert_status(CHI_ERR_INVALID, chi_wait_batch(rt, f, 2, -1, r, &count));
  assert_int_equal(count, 0);
  assert_int_equal(r[0].status, CHI_ERR_INVALID);
  assert_true(message_has("futures[0]"));
  f[0] = f[1];
  assert_status(CHI_OK, chi_submit_batch(rt, CHI_ROUTE_CPU, &t, 1, &f[1], NULL));
  assert_status(CHI_OK, chi_wait(rt, f[0], -1, out, sizeof out, NULL));
  /* f[0] is stale now; f[1] is live and stays so. */
  r[1].status = -77;
  assert_status(CHI_ERR_INVALID, chi_wait_batch(rt, f, 2, -1, r, &count));
  assert_int_equal(count, 0);
  assert_int_equal(r[1].status, -77);
  assert_status(CHI_OK, chi_wait_batch(rt, &f[1], 1, -1, &r[1], &count));
  assert_int_equal(count, 1);
  assert_status(CHI_ERR_INVALID, chi_wait_batch(rt, &f[1], 1, -1, &r[1], &count));
  assert_int_equal(count, 0);
}

/* Futures of either kind work with the calls of the other. */
static void test_interop_with_single_calls(void **state) {
  fixture_t *fx = *state;
  chi_runtime_t *rt = fx->rt;
  enum { kN = 6 };
  uint64_t vals[kN][2];
  chi_task_desc_t tasks[kN];
  for (int i = 0; i < kN; i++) {
    vals[i][0] = (uint64_t)i * 1000;
    vals[i][1] = 7;
    tasks[i] = (chi_task_desc_t){CHI_METHOD_ADD, vals[i], sizeof vals[i]};
  }
  chi_future_t futures[kN];
  assert_status(CHI_OK, chi_submit_batch(rt, CHI_ROUTE_CPU, tasks, kN, futures, NULL));
  uint64_t sum = 0;
  size_t sz = 0;
  assert_status(CHI_OK, chi_wait(rt, futures[0], -1, &sum, sizeof sum, &sz));
  assert_int_equal(sum, 7);
  assert_status(CHI_OK, chi_release(rt, futures[1]));
  int finished = 0;
  assert_status(CHI_OK, chi_test(rt, futures[2], &finished));

  /* Single futures mixed with the rest of the batch in one wait. */
  chi_future_t mixed[kN];
  assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ADD, vals[5], sizeof vals[5], &mixed[0]));
  for (int i = 2; i < kN; i++) mixed[i - 1] = futures[i];
  assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_LOCAL, CHI_METHOD_ADD, vals[0], sizeof vals[0], &mixed[5]));
  uint64_t sums[kN];
  chi_task_result_t results[kN];
  for (int i = 0; i < kN; i++) results[i] = (chi_task_result_t){&sums[i], sizeof sums[i], 0, -77};
  size_t done = 0;
  assert_status(CHI_OK, chi_wait_batch(rt, mixed, kN, -1, results, &done));
  assert_int_equal(done, kN);
  assert_int_equal(sums[0], 5007);
  for (int i = 2; i < kN; i++) assert_int_equal(sums[i - 1], (uint64_t)i * 1000 + 7);
  assert_int_equal(sums[5], 7);
  assert_status(CHI_ERR_INVALID, chi_release(rt, futures[1]));
}

/* A handler may batch too (the worker's own queue; it never blocks). */
static void test_batch_from_handler(void **state) {
  fixture_t *fx = *state;
  unsigned char in[16];
  uint64_t want = 0;
  for (size_t i = 0; i < sizeof in; i++) {
    in[i] = (unsigned char)(200 + i);
    want += in[i] + i;
  }
  enum { kN = 8 };
  chi_task_desc_t tasks[kN];
  for (int i = 0; i < kN; i++) tasks[i] = (chi_task_desc_t){fx->nested, in, sizeof in};
  chi_future_t futures[kN];
  uint64_t totals[kN];
  chi_task_result_t results[kN];
  for (int i = 0; i < kN; i++) results[i] = (chi_task_result_t){&totals[i], sizeof totals[i], 0, -77};
  assert_status(CHI_OK, chi_submit_batch(fx->rt, CHI_ROUTE_CPU, tasks, kN, futures, NULL));
  assert_status(CHI_OK, chi_wait_batch(fx->rt, futures, kN, -1, results, NULL));
  for (int i = 0; i < kN; i++) {
    assert_status(CHI_OK, results[i].status);
    assert_int_equal(totals[i], want);
  }
}

typedef struct batcher {
  chi_runtime_t *rt;
  unsigned id;
  long rounds;
  long failures;
  uint64_t tasks;
} batcher_t;

/* Batches of varying length (past the pool's internal group of 64 too),
 * checksummed and echoed payloads of varying size. */
static void *batch_thread(void *arg) {
  batcher_t *b = arg;
  enum { kMax = 150, kPayload = 300 };
  static _Thread_local unsigned char in[kMax][kPayload], out[kMax][kPayload];
  chi_task_desc_t tasks[kMax];
  chi_task_result_t results[kMax];
  chi_future_t futures[kMax];
  uint64_t rng = 0x9e3779b97f4a7c15ull * (b->id + 1);
  for (long r = 0; r < b->rounds; r++) {
    size_t n = 1 + chi_test_rand(&rng) % kMax;
    for (size_t i = 0; i < n; i++) {
      size_t sz = chi_test_rand(&rng) % kPayload;
      fill(in[i], sz, b->id * 7919u + (unsigned)(r * 31 + (long)i));
      chi_method_t m = (i % 3 == 2) ? CHI_METHOD_CHECKSUM : CHI_METHOD_ECHO;
      tasks[i] = (chi_task_desc_t){m, in[i], sz};
      results[i] = (chi_task_result_t){out[i], kPayload, 0, -77};
    }
    size_t sent = 0, done = 0;
    if (chi_submit_batch(b->rt, CHI_ROUTE_CPU, tasks, n, futures, &sent) != CHI_OK || sent != n ||
        chi_wait_batch(b->rt, futures, n, -1, results, &done) != CHI_OK || done != n) {
      print_error("batcher %u round %ld: n %zu sent %zu done %zu: %s\n", b->id, r, n, sent, done,
                  chi_last_error_message());
      b->failures++;
      return NULL;
    }
    for (size_t i = 0; i < n; i++) {
      int bad = results[i].status != CHI_OK;
      if (tasks[i].method == CHI_METHOD_ECHO) {
        bad |= results[i].output_size != tasks[i].input_size ||
               memcmp(out[i], in[i], tasks[i].input_size) != 0;
      } else {
        uint64_t h = 0;
        memcpy(&h, out[i], sizeof h);
        bad |= results[i].output_size != sizeof h || h != chi_test_fnv1a(in[i], tasks[i].input_size);
      }
      if (bad)
        print_error("batcher %u round %ld: task %zu of %zu (method %u, %zu bytes): status %d, %zu bytes\n",
                    b->id, r, i, n, tasks[i].method, tasks[i].input_size, results[i].status,
                    results[i].output_size);
      b->failures += bad;
    }
    b->tasks += n;
  }
  return NULL;
}

static void test_threads_batching_at_once(void **state) {
  (void)state;
  SKIP_IN_CLIENT_MODE("counts the embedded runtime's CPU statistics");
  chi_runtime_t *rt = chi_test_init(2, NULL);
  enum { kThreads = 4 };
  pthread_t th[kThreads];
  batcher_t b[kThreads];
  for (unsigned i = 0; i < kThreads; i++) {
    b[i] = (batcher_t){rt, i, chi_test_scaled(300), 0, 0};
    assert_int_equal(pthread_create(&th[i], NULL, batch_thread, &b[i]), 0);
  }
  uint64_t total = 0;
  for (unsigned i = 0; i < kThreads; i++) {
    assert_int_equal(pthread_join(th[i], NULL), 0);
    assert_int_equal(b[i].failures, 0);
    total += b[i].tasks;
  }
  chi_stats_t st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  assert_status(CHI_OK, chi_stats(rt, &st));
  assert_int_equal(st.routes[CHI_STATS_CPU].submitted, total);
  assert_int_equal(st.routes[CHI_STATS_CPU].completed, total);
  assert_int_equal(st.routes[CHI_STATS_CPU].in_flight, 0);
  assert_int_equal(st.slots_in_use, 0);
  assert_status(CHI_OK, chi_finalize(rt));
}

/* Non-blocking mode, a batch larger than the whole pool: CHI_ERR_AGAIN once
 * the slots run out, the queued part intact, nothing leaked. */
static void test_batch_over_pool_nonblocking(void **state) {
  (void)state;
  SKIP_IN_CLIENT_MODE("sets the embedded runtime's queue_depth");
  enum { kDepth = 64, kN = 100 };
  chi_runtime_t *rt = chi_test_init_yaml(2, "queue_depth: 64\nsubmit_blocking: false\n");
  uint32_t vals[kN];
  chi_task_desc_t tasks[kN];
  for (uint32_t i = 0; i < kN; i++) {
    vals[i] = i * 2654435761u;
    tasks[i] = (chi_task_desc_t){CHI_METHOD_ECHO, &vals[i], sizeof vals[i]};
  }
  chi_future_t futures[kN];
  uint32_t outs[kN];
  chi_task_result_t results[kN];
  for (int round = 0; round < 3; round++) {
    size_t sent = 99;
    assert_status(CHI_ERR_AGAIN, chi_submit_batch(rt, CHI_ROUTE_CPU, tasks, kN, futures, &sent));
    assert_has_message();
    assert_int_equal(sent, kDepth);
    for (size_t i = sent; i < kN; i++) assert_true(futures[i] == 0);
    for (size_t i = 0; i < kN; i++) results[i] = (chi_task_result_t){&outs[i], sizeof outs[i], 0, -77};
    size_t done = 0;
    assert_status(CHI_OK, chi_wait_batch(rt, futures, sent, -1, results, &done));
    assert_int_equal(done, sent);
    for (size_t i = 0; i < sent; i++) {
      assert_status(CHI_OK, results[i].status);
      assert_int_equal(outs[i], vals[i]);
    }
  }
  /* Every slot is usable again: exactly the pool's size goes in one batch. */
  size_t sent = 0;
  assert_status(CHI_OK, chi_submit_batch(rt, CHI_ROUTE_CPU, tasks, kDepth, futures, &sent));
  assert_int_equal(sent, kDepth);
  chi_future_t extra = 0;
  assert_status(CHI_ERR_AGAIN, chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, &vals[0], 4, &extra));
  assert_status(CHI_OK, chi_wait_batch(rt, futures, kDepth, -1, results, NULL));
  chi_stats_t st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  assert_status(CHI_OK, chi_stats(rt, &st));
  assert_int_equal(st.routes[CHI_STATS_CPU].submitted, 4 * kDepth);
  assert_int_equal(st.routes[CHI_STATS_CPU].completed, 4 * kDepth);
  assert_int_equal(st.slots_in_use, 0);
  assert_int_equal(st.slots_total, kDepth);
  assert_status(CHI_OK, chi_finalize(rt));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_mixed_results, setup, teardown),
      cmocka_unit_test_setup_teardown(test_submit_stops_at_failure, setup, teardown),
      cmocka_unit_test_setup_teardown(test_too_large_keeps_future, setup, teardown),
      cmocka_unit_test_setup_teardown(test_timeout, setup, teardown),
      cmocka_unit_test_setup_teardown(test_invalid_arguments, setup, teardown),
      cmocka_unit_test_setup_teardown(test_interop_with_single_calls, setup, teardown),
      cmocka_unit_test_setup_teardown(test_batch_from_handler, setup, teardown),
      cmocka_unit_test(test_threads_batching_at_once),
      cmocka_unit_test(test_batch_over_pool_nonblocking),
  };
  return chi_test_run("batch", tests);
}

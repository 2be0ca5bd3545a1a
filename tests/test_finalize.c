/* chi_finalize: drains what was accepted (each handler runs exactly once),
 * frees outstanding futures, refuses to run from a handler, and leaves
 * nothing behind across many init/finalize cycles (checked by ASan). */
#include "common.h"

#include <sched.h>
#include <stdatomic.h>
#include <time.h>

enum { kMaxTasks = 4000 };

typedef struct counting {
  atomic_int runs[kMaxTasks];
  atomic_int slow_started;
} counting_t;

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* test.count: input uint32 index; counts the run of that index.  The first
 * two tasks sleep a little, so finalize finds tasks running and queued. */
static chi_status_t count_handler(chi_request_t *req, void *user_data) {
  counting_t *c = user_data;
  uint32_t i;
  if (req->input_size != sizeof i) return CHI_ERR_INVALID;
  memcpy(&i, req->input, sizeof i);
  if (i >= kMaxTasks) return CHI_ERR_INVALID;
  if (i < 2) {
    atomic_fetch_add(&c->slow_started, 1);
    sleep_ms(30);
  }
  atomic_fetch_add(&c->runs[i], 1);
  memcpy(req->output, &i, sizeof i);
  req->output_size = sizeof i;
  return CHI_OK;
}

static void test_finalize_with_tasks_in_flight(void **state) {
  (void)state;
  counting_t *c = calloc(1, sizeof *c);
  assert_non_null(c);
  chi_runtime_t *rt = chi_test_init(2, NULL);
  chi_method_t m = 0;
  assert_status(CHI_OK, chi_register_handler(rt, "test.count", count_handler, c, &m));

  uint32_t n = (uint32_t)chi_test_scaled(1000);
  if (n < 10) n = 10;
  assert_true(n <= kMaxTasks);
  int *accepted = calloc(n, sizeof *accepted);
  chi_future_t *f = calloc(n, sizeof *f);
  assert_non_null(accepted);
  assert_non_null(f);
  for (uint32_t i = 0; i < n; i++) {
    assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, m, &i, sizeof i, &f[i]));
    accepted[i] = 1;
    /* A third released, a few waited for, the rest never looked at again. */
    if (i % 3 == 1) assert_status(CHI_OK, chi_release(rt, f[i]));
  }
  /* Early tasks only, so that most of the queue is still there at finalize. */
  const uint32_t waited[] = {3, 5, 6};
  for (size_t k = 0; k < sizeof waited / sizeof waited[0]; k++) {
    uint32_t out = 0;
    assert_status(CHI_OK, chi_wait(rt, f[waited[k]], -1, &out, sizeof out, NULL));
    assert_int_equal(out, waited[k]);
  }
  while (atomic_load(&c->slow_started) < 1) sched_yield();
  assert_status(CHI_OK, chi_finalize(rt));

  for (uint32_t i = 0; i < n; i++) {
    if (atomic_load(&c->runs[i]) != accepted[i])
      fail_msg("task %u ran %d times", i, atomic_load(&c->runs[i]));
  }
  free(accepted);
  free(f);
  free(c);
}

/* test.finalize_self: calls chi_finalize on its own runtime. */
static chi_status_t finalize_self_handler(chi_request_t *req, void *user_data) {
  chi_status_t s = chi_finalize((chi_runtime_t *)user_data);
  int has_message = chi_last_error_message()[0] != '\0';
  memcpy(req->output, &s, sizeof s);
  memcpy((char *)req->output + sizeof s, &has_message, sizeof has_message);
  req->output_size = sizeof s + sizeof has_message;
  return CHI_OK;
}

static void test_finalize_from_handler_refused(void **state) {
  (void)state;
  chi_runtime_t *rt = chi_test_init(2, NULL);
  chi_method_t m = 0;
  assert_status(CHI_OK, chi_register_handler(rt, "test.finalize_self", finalize_self_handler, rt, &m));
  chi_future_t f = 0;
  assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, m, NULL, 0, &f));
  int32_t out[2] = {0, 0};
  size_t sz = 0;
  assert_status(CHI_OK, chi_wait(rt, f, -1, out, sizeof out, &sz));
  assert_int_equal(sz, sizeof out);
  assert_status(CHI_ERR_INVALID, out[0]);
  assert_true(out[1]);
  /* The runtime is still whole. */
  char echo[4] = {0};
  assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, "ok", 3, &f));
  assert_status(CHI_OK, chi_wait(rt, f, -1, echo, sizeof echo, NULL));
  assert_string_equal(echo, "ok");
  assert_status(CHI_OK, chi_finalize(rt));
}

/* test.spawn: submits one test.leaf child and waits for it.  Running while
 * finalize drains the queue, its submit may be refused with CHI_ERR_SHUTDOWN;
 * a child that was accepted must still run and be waitable. */
typedef struct spawn_ctx {
  chi_runtime_t *rt;
  chi_method_t leaf;
  atomic_int spawns;
  atomic_int leaves;
  atomic_int accepted_children;
  atomic_int refused_children;
  atomic_int bad;
} spawn_ctx_t;

static chi_status_t leaf_handler(chi_request_t *req, void *user_data) {
  spawn_ctx_t *c = user_data;
  (void)req;
  atomic_fetch_add(&c->leaves, 1);
  return CHI_OK;
}

static chi_status_t spawn_handler(chi_request_t *req, void *user_data) {
  spawn_ctx_t *c = user_data;
  (void)req;
  atomic_fetch_add(&c->spawns, 1);
  chi_future_t f = 0;
  chi_status_t s = chi_submit(c->rt, CHI_ROUTE_CPU, c->leaf, NULL, 0, &f);
  if (s == CHI_OK) {
    atomic_fetch_add(&c->accepted_children, 1);
    if (chi_wait(c->rt, f, -1, NULL, 0, NULL) != CHI_OK) atomic_fetch_add(&c->bad, 1);
  } else if (s == CHI_ERR_SHUTDOWN || s == CHI_ERR_AGAIN) {
    atomic_fetch_add(&c->refused_children, 1);
  } else {
    atomic_fetch_add(&c->bad, 1);
  }
  return CHI_OK;
}

static void test_finalize_while_handlers_submit(void **state) {
  (void)state;
  spawn_ctx_t *c = calloc(1, sizeof *c);
  assert_non_null(c);
  c->rt = chi_test_init(2, NULL);
  chi_method_t spawn = 0;
  assert_status(CHI_OK, chi_register_handler(c->rt, "test.leaf", leaf_handler, c, &c->leaf));
  assert_status(CHI_OK, chi_register_handler(c->rt, "test.spawn", spawn_handler, c, &spawn));
  /* At most 100: more queued spawns than the workers can nest would test
   * nesting depth, which test_concurrency covers. */
  const int n = (int)chi_test_scaled(100);
  for (int i = 0; i < n; i++) {
    chi_future_t f = 0;
    assert_status(CHI_OK, chi_submit(c->rt, CHI_ROUTE_CPU, spawn, NULL, 0, &f));
    if (i % 2) assert_status(CHI_OK, chi_release(c->rt, f));
  }
  assert_status(CHI_OK, chi_finalize(c->rt));
  assert_int_equal(atomic_load(&c->bad), 0);
  assert_int_equal(atomic_load(&c->spawns), n);
  assert_int_equal(atomic_load(&c->accepted_children) + atomic_load(&c->refused_children), n);
  assert_int_equal(atomic_load(&c->leaves), atomic_load(&c->accepted_children));
  free(c);
}

static void test_init_finalize_cycles(void **state) {
  (void)state;
  const long cycles = chi_test_scaled(40);
  for (long i = 0; i < cycles; i++) {
    chi_runtime_t *rt = chi_test_init((int32_t)(1 + i % 3), NULL);
    if (i % 2) {
      /* Leave a few finished and unfinished futures for finalize to free. */
      for (int k = 0; k < 8; k++) {
        chi_future_t f = 0;
        assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, &k, sizeof k, &f));
      }
    }
    assert_status(CHI_OK, chi_finalize(rt));
  }
}

static void test_independent_runtimes(void **state) {
  (void)state;
  /* Finalizing one runtime leaves another one working. */
  chi_runtime_t *a = chi_test_init(1, NULL);
  chi_runtime_t *b = chi_test_init(1, NULL);
  chi_future_t fa = 0, fb = 0;
  assert_status(CHI_OK, chi_submit(b, CHI_ROUTE_CPU, CHI_METHOD_ECHO, "b", 1, &fb));
  assert_status(CHI_OK, chi_submit(a, CHI_ROUTE_CPU, CHI_METHOD_ECHO, "a", 1, &fa));
  assert_status(CHI_OK, chi_finalize(a));
  char out = 0;
  assert_status(CHI_OK, chi_wait(b, fb, -1, &out, 1, NULL));
  assert_int_equal(out, 'b');
  assert_status(CHI_OK, chi_finalize(b));
  assert_status(CHI_OK, chi_finalize(NULL));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_finalize_with_tasks_in_flight),
      cmocka_unit_test(test_finalize_from_handler_refused),
      cmocka_unit_test(test_finalize_while_handlers_submit),
      cmocka_unit_test(test_init_finalize_cycles),
      cmocka_unit_test(test_independent_runtimes),
  };
  return chi_test_run("finalize", tests);
}

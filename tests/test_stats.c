/*
 * chi_stats on the CPU route: counts are exact (one submitter, many, and
 * threads that come and go, more of them than the counters have lines),
 * and the latency figures, taken from one task in 64 per submitting thread,
 * are there and ordered (p50 <= p99 <= max) even after a few tasks.
 */
#include "common.h"

#include <pthread.h>

static void round_trips(chi_runtime_t *rt, int n) {
  unsigned char in[64], out[64];
  for (int i = 0; i < n; i++) {
    memset(in, i & 0xFF, sizeof in);
    chi_future_t f;
    size_t osz = 0;
    assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, in, sizeof in, &f));
    assert_status(CHI_OK, chi_wait(rt, f, -1, out, sizeof out, &osz));
    assert_int_equal(osz, sizeof in);
    assert_memory_equal(in, out, sizeof in);
  }
}

static chi_route_stats_t cpu_stats(chi_runtime_t *rt) {
  chi_stats_t st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  assert_status(CHI_OK, chi_stats(rt, &st));
  return st.routes[CHI_STATS_CPU];
}

static void check_latency(const chi_route_stats_t *r) {
  assert_true(r->latency_p50_ns > 0);
  assert_true(r->latency_p50_ns <= r->latency_p99_ns);
  assert_true(r->latency_p99_ns <= r->latency_max_ns);
}

static int embedded(void) {
  const char *m = getenv("CHI_MODE");
  return !m || strcmp(m, "client") != 0;
}

static void test_counts_one_thread(void **state) {
  (void)state;
  if (!embedded()) skip();
  chi_runtime_t *rt;
  assert_status(CHI_OK, chi_init(NULL, &rt));
  round_trips(rt, 1);
  chi_route_stats_t r = cpu_stats(rt);
  assert_int_equal(r.submitted, 1);
  assert_int_equal(r.completed, 1);
  assert_int_equal(r.failed, 0);
  assert_int_equal(r.in_flight, 0);
  check_latency(&r); /* a thread's first task is timed */
  const int n = (int)chi_test_scaled(5000);
  round_trips(rt, n);
  r = cpu_stats(rt);
  assert_int_equal(r.submitted, (uint64_t)n + 1);
  assert_int_equal(r.completed, (uint64_t)n + 1);
  assert_int_equal(r.in_flight, 0);
  check_latency(&r);
  assert_status(CHI_OK, chi_finalize(rt));
}

struct worker_arg {
  chi_runtime_t *rt;
  int tasks;
};

static void *submitter(void *p) {
  struct worker_arg *a = p;
  round_trips(a->rt, a->tasks);
  return NULL;
}

static void run_threads(chi_runtime_t *rt, int threads, int tasks) {
  pthread_t t[16];
  struct worker_arg a = {rt, tasks};
  assert_true(threads <= 16);
  for (int i = 0; i < threads; i++) assert_int_equal(pthread_create(&t[i], NULL, submitter, &a), 0);
  for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
}

static void test_counts_many_threads(void **state) {
  (void)state;
  if (!embedded()) skip();
  chi_runtime_t *rt;
  assert_status(CHI_OK, chi_init(NULL, &rt));
  const int tasks = (int)chi_test_scaled(2000);
  run_threads(rt, 8, tasks);
  chi_route_stats_t r = cpu_stats(rt);
  assert_int_equal(r.submitted, 8ull * tasks);
  assert_int_equal(r.completed, 8ull * tasks);
  assert_int_equal(r.in_flight, 0);
  check_latency(&r);
  /* Threads that come and go: 200 of them over time, more than the counters
   * have lines of their own; nothing is lost. */
  for (int round = 0; round < 25; round++) run_threads(rt, 8, 5);
  r = cpu_stats(rt);
  assert_int_equal(r.submitted, 8ull * tasks + 25 * 8 * 5);
  assert_int_equal(r.completed, 8ull * tasks + 25 * 8 * 5);
  assert_int_equal(r.in_flight, 0);
  check_latency(&r);
  assert_status(CHI_OK, chi_finalize(rt));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_counts_one_thread),
      cmocka_unit_test(test_counts_many_threads),
  };
  return chi_test_run("stats", tests);
}

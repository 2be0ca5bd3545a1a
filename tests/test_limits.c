/* Limits a new user runs into: method ids of other runtimes and ids never
 * registered, deep queues with the default configuration (slots committed as
 * they are used), settings given through chi_config_t.settings, and worker
 * stacks large enough for a handler with a big local array. */
#include "common.h"

#include <stdatomic.h>

static atomic_int runs_a, runs_b;

static chi_status_t count_a(chi_request_t *req, void *user_data) {
  (void)user_data;
  atomic_fetch_add(&runs_a, 1);
  req->output_size = 0;
  return CHI_OK;
}

static chi_status_t count_b(chi_request_t *req, void *user_data) {
  (void)user_data;
  atomic_fetch_add(&runs_b, 1);
  req->output_size = 0;
  return CHI_OK;
}

static void test_never_registered(void **state) {
  (void)state;
  chi_runtime_t *rt = chi_test_init(2, NULL);
  chi_future_t f = 1;
  const uint32_t ids[] = {4, 99, 4000, 4095, 4096, 0x00FFFFFFu, 0x3FFFFFFFu, 0x80000000u};
  for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
    assert_status(CHI_ERR_NOT_FOUND, chi_submit(rt, CHI_ROUTE_CPU, ids[i], "x", 1, &f));
    assert_has_message();
    assert_true(f == 0);
    assert_status(CHI_ERR_NOT_FOUND, chi_submit(rt, CHI_ROUTE_LOCAL, ids[i], NULL, 0, &f));
  }
  assert_status(CHI_ERR_INVALID, chi_submit(rt, CHI_ROUTE_CPU, 0, "x", 1, &f));
  assert_has_message();
  assert_status(CHI_OK, chi_finalize(rt));
}

/* Submits method m to rt and expects it refused, with a message. */
static void expect_refused(chi_runtime_t *rt, chi_method_t m) {
  chi_future_t f = 1;
  assert_status(CHI_ERR_NOT_FOUND, chi_submit(rt, CHI_ROUTE_CPU, m, NULL, 0, &f));
  assert_true(f == 0);
  assert_non_null(strstr(chi_last_error_message(), "another runtime"));
}

/* Runs m over 16 zero bytes (a valid input of every built-in). */
static void run_one(chi_runtime_t *rt, chi_method_t m) {
  const uint8_t in[16] = {0};
  chi_future_t f;
  assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, m, in, sizeof in, &f));
  assert_status(CHI_OK, chi_wait(rt, f, -1, NULL, 0, NULL));
}

static void test_other_runtimes_methods(void **state) {
  (void)state;
  atomic_store(&runs_a, 0);
  atomic_store(&runs_b, 0);
  chi_runtime_t *a = chi_test_init(2, NULL);
  chi_runtime_t *b = chi_test_init(2, NULL);
  chi_method_t ma = 0, mb = 0, ma2 = 0, mb2 = 0;
  /* The same name on both runtimes, then one name each. */
  assert_status(CHI_OK, chi_register_handler(a, "limits.same", count_a, NULL, &ma));
  assert_status(CHI_OK, chi_register_handler(b, "limits.same", count_b, NULL, &mb));
  assert_status(CHI_OK, chi_register_handler(a, "limits.only_a", count_a, NULL, &ma2));
  assert_status(CHI_OK, chi_register_handler(b, "limits.only_b", count_b, NULL, &mb2));
  const chi_method_t all[] = {ma, mb, ma2, mb2};
  for (size_t i = 0; i < 4; i++) {
    assert_true(all[i] > CHI_METHOD_CHECKSUM && all[i] < 4096);
    assert_true((all[i] & 0x40000000u) == 0);
    for (size_t j = 0; j < i; j++) assert_true(all[i] != all[j]);
  }

  expect_refused(b, ma);
  expect_refused(b, ma2);
  expect_refused(a, mb);
  expect_refused(a, mb2);
  assert_int_equal(atomic_load(&runs_a), 0);
  assert_int_equal(atomic_load(&runs_b), 0);

  run_one(a, ma);
  run_one(a, ma2);
  run_one(b, mb);
  assert_int_equal(atomic_load(&runs_a), 2);
  assert_int_equal(atomic_load(&runs_b), 1);

  /* Built-in ids belong to every runtime. */
  for (chi_method_t m = CHI_METHOD_ECHO; m <= CHI_METHOD_CHECKSUM; m++) {
    run_one(a, m);
    run_one(b, m);
  }

  /* A finished runtime's ids are not handed to the next one at once. */
  assert_status(CHI_OK, chi_finalize(a));
  chi_runtime_t *c = chi_test_init(2, NULL);
  chi_method_t mc = 0;
  assert_status(CHI_OK, chi_register_handler(c, "limits.same", count_b, NULL, &mc));
  assert_true(mc != ma && mc != ma2 && mc != mb && mc != mb2);
  chi_future_t f;
  assert_status(CHI_ERR_NOT_FOUND, chi_submit(b, CHI_ROUTE_CPU, ma, NULL, 0, &f));
  assert_status(CHI_ERR_NOT_FOUND, chi_submit(c, CHI_ROUTE_CPU, ma, NULL, 0, &f));
  expect_refused(b, mc);
  expect_refused(c, mb);
  assert_status(CHI_OK, chi_finalize(c));
  assert_status(CHI_OK, chi_finalize(b));
  assert_int_equal(atomic_load(&runs_a), 2);
}

/* Runtimes made and finished from many threads at once, each registering
 * methods: ids of live runtimes never collide. */
#define ID_THREADS 8
#define ID_METHODS 20

typedef struct id_arg {
  int index;
  chi_method_t ids[ID_METHODS];
  chi_runtime_t *rt;
} id_arg_t;

static void *register_many(void *p) {
  id_arg_t *arg = p;
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.gpus = 0;
  cfg.num_workers = 1;
  if (chi_init(&cfg, &arg->rt) != CHI_OK) return NULL;
  for (int i = 0; i < ID_METHODS; i++) {
    char name[64];
    snprintf(name, sizeof name, "limits.m%d", i);
    if (chi_register_handler(arg->rt, name, count_a, NULL, &arg->ids[i]) != CHI_OK) arg->ids[i] = 0;
  }
  return NULL;
}

static void test_ids_unique_among_live_runtimes(void **state) {
  (void)state;
  long rounds = chi_test_scaled(10);
  for (long r = 0; r < rounds; r++) {
    pthread_t th[ID_THREADS];
    id_arg_t args[ID_THREADS];
    memset(args, 0, sizeof args);
    for (int t = 0; t < ID_THREADS; t++) {
      args[t].index = t;
      assert_int_equal(pthread_create(&th[t], NULL, register_many, &args[t]), 0);
    }
    for (int t = 0; t < ID_THREADS; t++) assert_int_equal(pthread_join(th[t], NULL), 0);
    static uint8_t seen[4096];
    memset(seen, 0, sizeof seen);
    for (int t = 0; t < ID_THREADS; t++) {
      assert_non_null(args[t].rt);
      for (int i = 0; i < ID_METHODS; i++) {
        chi_method_t m = args[t].ids[i];
        assert_true(m > CHI_METHOD_CHECKSUM && m < 4096);
        assert_int_equal(seen[m], 0);
        seen[m] = 1;
        chi_runtime_t *other = args[(t + 1) % ID_THREADS].rt;
        chi_future_t f;
        assert_status(CHI_ERR_NOT_FOUND, chi_submit(other, CHI_ROUTE_CPU, m, NULL, 0, &f));
      }
    }
    for (int t = 0; t < ID_THREADS; t++) assert_status(CHI_OK, chi_finalize(args[t].rt));
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_never_registered),
      cmocka_unit_test(test_other_runtimes_methods),
      cmocka_unit_test(test_ids_unique_among_live_runtimes),
  };
  return chi_test_run("limits", tests);
}

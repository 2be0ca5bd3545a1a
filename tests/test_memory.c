/* Registered memory on the CPU route: register, resolve with bounds checks,
 * unregister, and a handler that reads host memory by reference. */
#include "common.h"

#include <stdatomic.h>

typedef struct fixture {
  chi_runtime_t *rt;
  unsigned char *buf;
  size_t size;
  uint64_t region;
} fixture_t;

static int setup(void **state) {
  fixture_t *fx = calloc(1, sizeof *fx);
  assert_non_null(fx);
  fx->rt = chi_test_init(2, NULL);
  fx->size = 4096;
  fx->buf = malloc(fx->size);
  assert_non_null(fx->buf);
  for (size_t i = 0; i < fx->size; i++) fx->buf[i] = (unsigned char)(i * 7 + 3);
  assert_status(CHI_OK, chi_register_gpu_mem(fx->rt, CHI_ROUTE_CPU, fx->buf, fx->size, &fx->region));
  assert_true(fx->region != 0);
  *state = fx;
  return 0;
}

static int teardown(void **state) {
  fixture_t *fx = *state;
  chi_status_t s = chi_finalize(fx->rt);
  free(fx->buf);
  free(fx);
  return s == CHI_OK ? 0 : -1;
}

static chi_status_t resolve(fixture_t *fx, uint64_t region, uint64_t offset, uint64_t length,
                            void **ptr, int32_t *gpu) {
  chi_mem_ref_t ref = {region, offset, length};
  return chi_mem_resolve(fx->rt, &ref, ptr, gpu);
}

static void test_resolve_in_range(void **state) {
  fixture_t *fx = *state;
  void *p = NULL;
  int32_t gpu = 99;
  assert_status(CHI_OK, resolve(fx, fx->region, 0, fx->size, &p, &gpu));
  assert_ptr_equal(p, fx->buf);
  assert_int_equal(gpu, CHI_ROUTE_CPU);
  assert_status(CHI_OK, resolve(fx, fx->region, 100, 50, &p, NULL));
  assert_ptr_equal(p, fx->buf + 100);
  assert_status(CHI_OK, resolve(fx, fx->region, fx->size - 1, 1, &p, NULL));
  assert_ptr_equal(p, fx->buf + fx->size - 1);
  assert_status(CHI_OK, resolve(fx, fx->region, 17, 0, &p, NULL));
  assert_ptr_equal(p, fx->buf + 17);
}

static void test_resolve_out_of_range(void **state) {
  fixture_t *fx = *state;
  void *p = NULL;
  const uint64_t n = fx->size;
  const struct {
    uint64_t offset, length;
  } bad[] = {
      {0, n + 1},
      {1, n},
      {n - 10, 11},
      {n, 1},
      {n + 1, 0},
      {UINT64_MAX, 1},
      {UINT64_MAX, 0},
      {8, UINT64_MAX - 4},  /* offset + length wraps to 3 */
      {UINT64_MAX - 1, 3},  /* wraps to 1 */
      {0, UINT64_MAX},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    p = (void *)1;
    chi_status_t s = resolve(fx, fx->region, bad[i].offset, bad[i].length, &p, NULL);
    if (s != CHI_ERR_INVALID)
      fail_msg("offset %llu length %llu: got %d (%s), want CHI_ERR_INVALID",
               (unsigned long long)bad[i].offset, (unsigned long long)bad[i].length, (int)s,
               chi_status_string(s));
    assert_has_message();
  }
}

static void test_unknown_regions(void **state) {
  fixture_t *fx = *state;
  void *p = NULL;
  const uint64_t unknown[] = {0, fx->region + 1, fx->region ^ (1ull << 32), fx->region ^ (1ull << 63),
                              UINT64_MAX, 12345};
  for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
    if (unknown[i] == fx->region) continue;
    assert_status(CHI_ERR_INVALID, resolve(fx, unknown[i], 0, 1, &p, NULL));
    assert_has_message();
    assert_status(CHI_ERR_INVALID, chi_unregister_mem(fx->rt, unknown[i]));
  }
}

static void test_unregister(void **state) {
  fixture_t *fx = *state;
  void *p = NULL;
  uint64_t old = fx->region;
  assert_status(CHI_OK, chi_unregister_mem(fx->rt, old));
  assert_status(CHI_ERR_INVALID, resolve(fx, old, 0, 1, &p, NULL));
  assert_has_message();
  assert_status(CHI_ERR_INVALID, chi_unregister_mem(fx->rt, old));
  assert_has_message();

  /* A new registration, likely in the same table entry, gets a new id; the
   * old id stays dead. */
  uint64_t again = 0;
  assert_status(CHI_OK, chi_register_gpu_mem(fx->rt, CHI_ROUTE_CPU, fx->buf, fx->size, &again));
  assert_true(again != 0);
  assert_true(again != old);
  assert_status(CHI_ERR_INVALID, resolve(fx, old, 0, 1, &p, NULL));
  assert_status(CHI_ERR_INVALID, chi_unregister_mem(fx->rt, old));
  assert_status(CHI_OK, resolve(fx, again, 0, 1, &p, NULL));
  fx->region = again;
}

static void test_register_validation(void **state) {
  fixture_t *fx = *state;
  uint64_t region = 0;
  assert_status(CHI_ERR_INVALID, chi_register_gpu_mem(fx->rt, CHI_ROUTE_CPU, fx->buf, 0, &region));
  assert_has_message();
  assert_status(CHI_ERR_INVALID, chi_register_gpu_mem(fx->rt, CHI_ROUTE_CPU, NULL, 16, &region));
  assert_status(CHI_ERR_INVALID, chi_register_gpu_mem(fx->rt, CHI_ROUTE_CPU, fx->buf, 16, NULL));
  assert_status(CHI_ERR_INVALID, chi_register_gpu_mem(fx->rt, -5, fx->buf, 16, &region));
  assert_status(CHI_ERR_INVALID, chi_register_gpu_mem(fx->rt, -100, fx->buf, 16, &region));
  /* This runtime was made with gpus = 0. */
  assert_status(CHI_ERR_NO_DEVICE, chi_register_gpu_mem(fx->rt, 0, fx->buf, 16, &region));
  assert_has_message();

  /* Overlapping registrations of host memory are independent regions. */
  uint64_t a = 0, b = 0;
  assert_status(CHI_OK, chi_register_gpu_mem(fx->rt, CHI_ROUTE_CPU, fx->buf + 10, 20, &a));
  assert_status(CHI_OK, chi_register_gpu_mem(fx->rt, CHI_ROUTE_CPU, fx->buf + 10, 20, &b));
  assert_true(a != b && a != fx->region && b != fx->region);
  void *p = NULL;
  assert_status(CHI_OK, resolve(fx, a, 19, 1, &p, NULL));
  assert_ptr_equal(p, fx->buf + 29);
  assert_status(CHI_ERR_INVALID, resolve(fx, a, 20, 1, &p, NULL));
  assert_status(CHI_OK, chi_unregister_mem(fx->rt, a));
  assert_status(CHI_OK, resolve(fx, b, 0, 20, &p, NULL));
  assert_status(CHI_OK, chi_unregister_mem(fx->rt, b));
}

static void test_region_table_full(void **state) {
  fixture_t *fx = *state;
  enum { kTries = 1 << 17 };
  uint64_t *ids = calloc(kTries, sizeof *ids);
  assert_non_null(ids);
  int n = 0;
  chi_status_t s = CHI_OK;
  while (n < kTries) {
    s = chi_register_gpu_mem(fx->rt, CHI_ROUTE_CPU, fx->buf + (n % 64), 1, &ids[n]);
    if (s != CHI_OK) break;
    n++;
  }
  assert_true(n > 0);
  assert_status(CHI_ERR_NOMEM, s); /* a full table says so rather than growing forever */
  assert_has_message();
  /* Freeing one entry makes room for one more. */
  assert_status(CHI_OK, chi_unregister_mem(fx->rt, ids[n / 2]));
  assert_status(CHI_OK, chi_register_gpu_mem(fx->rt, CHI_ROUTE_CPU, fx->buf, 1, &ids[n / 2]));
  for (int i = 0; i < n; i++) assert_status(CHI_OK, chi_unregister_mem(fx->rt, ids[i]));
  free(ids);
  void *p = NULL;
  assert_status(CHI_OK, resolve(fx, fx->region, 0, 1, &p, NULL));
}

/* test.sum: input chi_mem_ref_t; output the uint64 sum of those bytes. */
static chi_status_t sum_handler(chi_request_t *req, void *user_data) {
  chi_runtime_t *rt = user_data;
  chi_mem_ref_t ref;
  if (req->input_size != sizeof ref || req->output_capacity < 8) return CHI_ERR_INVALID;
  memcpy(&ref, req->input, sizeof ref);
  void *p = NULL;
  int32_t gpu = 0;
  chi_status_t s = chi_mem_resolve(rt, &ref, &p, &gpu);
  if (s != CHI_OK) return s;
  if (gpu != CHI_ROUTE_CPU) return CHI_ERR_USER_BASE - 1;
  uint64_t sum = 0;
  for (uint64_t i = 0; i < ref.length; i++) sum += ((const unsigned char *)p)[i];
  memcpy(req->output, &sum, 8);
  req->output_size = 8;
  return CHI_OK;
}

static chi_status_t sum_task(fixture_t *fx, chi_method_t m, uint64_t region, uint64_t offset,
                             uint64_t length, uint64_t *sum) {
  chi_mem_ref_t ref = {region, offset, length};
  chi_future_t f = 0;
  assert_status(CHI_OK, chi_submit(fx->rt, CHI_ROUTE_CPU, m, &ref, sizeof ref, &f));
  return chi_wait(fx->rt, f, -1, sum, sizeof *sum, NULL);
}

static void test_handler_reads_by_reference(void **state) {
  fixture_t *fx = *state;
  chi_method_t m = 0;
  assert_status(CHI_OK, chi_register_handler(fx->rt, "test.sum", sum_handler, fx->rt, &m));
  const struct {
    uint64_t offset, length;
  } ranges[] = {{0, 4096}, {0, 1}, {4095, 1}, {1000, 1000}, {123, 0}};
  for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
    uint64_t want = 0, got = ~0ull;
    for (uint64_t k = 0; k < ranges[i].length; k++) want += fx->buf[ranges[i].offset + k];
    assert_status(CHI_OK, sum_task(fx, m, fx->region, ranges[i].offset, ranges[i].length, &got));
    assert_true(got == want);
  }
  /* The handler sees the memory as it is now, not a copy. */
  memset(fx->buf, 1, fx->size);
  uint64_t got = 0;
  assert_status(CHI_OK, sum_task(fx, m, fx->region, 0, fx->size, &got));
  assert_true(got == fx->size);

  /* A bad reference fails inside the handler and the waiter hears of it. */
  assert_status(CHI_ERR_INVALID, sum_task(fx, m, fx->region, 4000, 200, &got));
  assert_status(CHI_ERR_INVALID, sum_task(fx, m, fx->region + 1, 0, 1, &got));
  assert_status(CHI_OK, chi_unregister_mem(fx->rt, fx->region));
  assert_status(CHI_ERR_INVALID, sum_task(fx, m, fx->region, 0, 1, &got));
}

/* Threads register, resolve and unregister their own regions at once. */
typedef struct churn_arg {
  chi_runtime_t *rt;
  unsigned char *buf;
  long rounds;
  atomic_int *failures;
} churn_arg_t;

static void *churn_thread(void *varg) {
  churn_arg_t *a = varg;
  for (long i = 0; i < a->rounds; i++) {
    uint64_t id = 0;
    size_t size = 1 + (size_t)(i % 64);
    if (chi_register_gpu_mem(a->rt, CHI_ROUTE_CPU, a->buf, size, &id) != CHI_OK) {
      atomic_fetch_add(a->failures, 1);
      continue;
    }
    chi_mem_ref_t ok = {id, 0, size}, bad = {id, 0, size + 1};
    void *p = NULL;
    if (chi_mem_resolve(a->rt, &ok, &p, NULL) != CHI_OK || p != a->buf) atomic_fetch_add(a->failures, 1);
    if (chi_mem_resolve(a->rt, &bad, &p, NULL) != CHI_ERR_INVALID) atomic_fetch_add(a->failures, 1);
    if (chi_unregister_mem(a->rt, id) != CHI_OK) atomic_fetch_add(a->failures, 1);
    if (chi_mem_resolve(a->rt, &ok, &p, NULL) != CHI_ERR_INVALID) atomic_fetch_add(a->failures, 1);
  }
  return NULL;
}

static void test_concurrent_churn(void **state) {
  fixture_t *fx = *state;
  enum { kThreads = 4 };
  atomic_int failures;
  atomic_init(&failures, 0);
  pthread_t t[kThreads];
  churn_arg_t args[kThreads];
  for (int i = 0; i < kThreads; i++) {
    args[i] = (churn_arg_t){fx->rt, fx->buf + 100 * i, chi_test_scaled(2000), &failures};
    assert_int_equal(pthread_create(&t[i], NULL, churn_thread, &args[i]), 0);
  }
  for (int i = 0; i < kThreads; i++) assert_int_equal(pthread_join(t[i], NULL), 0);
  assert_int_equal(atomic_load(&failures), 0);
  void *p = NULL;
  assert_status(CHI_OK, resolve(fx, fx->region, 0, fx->size, &p, NULL));
}

static void test_regions_are_per_runtime(void **state) {
  fixture_t *fx = *state;
  chi_runtime_t *other = chi_test_init(1, NULL);
  void *p = NULL;
  chi_mem_ref_t ref = {fx->region, 0, 1};
  /* The other runtime has no regions at all. */
  assert_status(CHI_ERR_INVALID, chi_mem_resolve(other, &ref, &p, NULL));
  assert_status(CHI_ERR_INVALID, chi_unregister_mem(other, fx->region));
  assert_status(CHI_OK, chi_finalize(other));
  assert_status(CHI_OK, resolve(fx, fx->region, 0, 1, &p, NULL));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_resolve_in_range, setup, teardown),
      cmocka_unit_test_setup_teardown(test_resolve_out_of_range, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unknown_regions, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unregister, setup, teardown),
      cmocka_unit_test_setup_teardown(test_register_validation, setup, teardown),
      cmocka_unit_test_setup_teardown(test_region_table_full, setup, teardown),
      cmocka_unit_test_setup_teardown(test_handler_reads_by_reference, setup, teardown),
      cmocka_unit_test_setup_teardown(test_concurrent_churn, setup, teardown),
      cmocka_unit_test_setup_teardown(test_regions_are_per_runtime, setup, teardown),
  };
  return chi_test_run("memory", tests);
}

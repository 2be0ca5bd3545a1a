/*
 * The HIP build (-DCHI_ENABLE_HIP=ON) on a machine without an AMD GPU: the
 * library asks the HIP runtime for devices, finds none, and answers
 * CHI_ERR_NO_DEVICE on every GPU route while the CPU side works.  Where the
 * HIP runtime does find a GPU, this program has nothing to check (exit 77).
 */
#include "common.h"

#include "chimaera/config.h"

static chi_runtime_t *start(int32_t gpus, chi_status_t *st) {
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.gpus = gpus;
  cfg.num_workers = 1;
  chi_runtime_t *rt = NULL;
  *st = chi_init(&cfg, &rt);
  return rt;
}

static void test_all_gpus_none_found(void **state) {
  (void)state;
  chi_status_t st;
  chi_runtime_t *rt = start(-1, &st);
  assert_status(CHI_OK, st);
  int32_t count = -1;
  assert_status(CHI_OK, chi_gpu_count(rt, &count));
  assert_int_equal(count, 0);
  const char in[4] = "abc";
  chi_future_t f = 0;
  assert_status(CHI_ERR_NO_DEVICE, chi_submit(rt, CHI_ROUTE_GPU(0), CHI_METHOD_ECHO, in, sizeof in, &f));
  assert_has_message();
  assert_status(CHI_ERR_NO_DEVICE, chi_submit(rt, CHI_ROUTE_GPU_ANY, CHI_METHOD_ECHO, in, sizeof in, &f));
  chi_dev_context_t ctx;
  assert_status(CHI_ERR_NO_DEVICE, chi_gpu_context(rt, 0, &ctx));
  char buf[8];
  uint64_t region = 0;
  assert_status(CHI_ERR_NO_DEVICE, chi_register_gpu_mem(rt, 0, buf, sizeof buf, &region));
  /* The CPU side is unaffected. */
  assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, in, sizeof in, &f));
  char out[4];
  size_t n = 0;
  assert_status(CHI_OK, chi_wait(rt, f, -1, out, sizeof out, &n));
  assert_int_equal(n, sizeof in);
  assert_memory_equal(out, in, sizeof in);
  assert_status(CHI_OK, chi_finalize(rt));
}

static void test_one_gpu_required(void **state) {
  (void)state;
  chi_status_t st;
  chi_runtime_t *rt = start(1, &st);
  assert_status(CHI_ERR_NO_DEVICE, st);
  assert_null(rt);
  assert_has_message();
}

int main(void) {
  if (!CHI_HAVE_HIP) {
    printf("test_hip_backend: not a HIP build, skipped\n");
    return 77;
  }
  chi_status_t st;
  chi_runtime_t *rt = start(-1, &st);
  int32_t count = 0;
  if (st == CHI_OK) chi_gpu_count(rt, &count);
  if (rt) chi_finalize(rt);
  if (count > 0) {
    printf("test_hip_backend: %d AMD GPU(s) found, nothing to check without one, skipped\n", count);
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_all_gpus_none_found),
      cmocka_unit_test(test_one_gpu_required),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/* Modules: chi_load_module and the `modules:` config key, with the sample
 * module built from module_sample.c (paths come from CMake). */
#include "common.h"

#include <strings.h>

/* Client mode (the *_client ctest variants, tests/run_with_server.sh): a case
 * that only an embedded runtime can show skips itself, saying why. */
static const char kClientModulesReason[] =
    "a client loads no modules from its own config (the server's modules: key does)";

#ifndef SAMPLE_MODULE_PATH
#error "SAMPLE_MODULE_PATH must name the sample module"
#endif

#define SAMPLE_INIT_STATUS (-1777) /* what the failing variant's init returns */

static uint64_t call_double(chi_runtime_t *rt, uint64_t v) {
  chi_method_t m = 0;
  assert_status(CHI_OK, chi_method_lookup(rt, "sample.double", &m));
  chi_future_t f = 0;
  assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, m, &v, sizeof v, &f));
  uint64_t r = 0;
  size_t sz = 0;
  assert_status(CHI_OK, chi_wait(rt, f, -1, &r, sizeof r, &sz));
  assert_int_equal(sz, sizeof r);
  return r;
}

static void test_load_and_call(void **state) {
  (void)state;
  chi_runtime_t *rt = chi_test_init(2, NULL);
  chi_method_t m = 0;
  assert_status(CHI_ERR_NOT_FOUND, chi_method_lookup(rt, "sample.double", &m));
  assert_status(CHI_OK, chi_load_module(rt, SAMPLE_MODULE_PATH));
  assert_true(call_double(rt, 21) == 42);
  assert_true(call_double(rt, 0x4000000000000000ull) == 0x8000000000000000ull);

  /* The module's init was told the version of the library it runs in. */
  assert_status(CHI_OK, chi_method_lookup(rt, "sample.version", &m));
  chi_future_t f = 0;
  assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, m, NULL, 0, &f));
  uint32_t version = 0;
  assert_status(CHI_OK, chi_wait(rt, f, -1, &version, sizeof version, NULL));
  assert_int_equal(version, CHI_VERSION_NUMBER);

  /* A second load runs init again, whose registrations now collide: its
   * status comes back and the first registration keeps working. */
  assert_status(CHI_ERR_INVALID, chi_load_module(rt, SAMPLE_MODULE_PATH));
  assert_true(call_double(rt, 5) == 10);
  assert_status(CHI_OK, chi_finalize(rt));
}

static void test_two_runtimes_share_a_module(void **state) {
  (void)state;
  chi_runtime_t *a = chi_test_init(1, NULL);
  chi_runtime_t *b = chi_test_init(1, NULL);
  assert_status(CHI_OK, chi_load_module(a, SAMPLE_MODULE_PATH));
  assert_status(CHI_OK, chi_load_module(b, SAMPLE_MODULE_PATH));
  /* Finalizing a must not unload the code b still runs. */
  assert_status(CHI_OK, chi_finalize(a));
  assert_true(call_double(b, 1000) == 2000);
  assert_status(CHI_OK, chi_finalize(b));
}

static void test_load_failures(void **state) {
  (void)state;
  chi_runtime_t *rt = chi_test_init(1, NULL);
  assert_status(CHI_ERR_NOT_FOUND, chi_load_module(rt, "/nonexistent/libnothing.so"));
  assert_has_message();
  assert_status(CHI_ERR_NOT_FOUND, chi_load_module(rt, "/"));
  assert_status(CHI_ERR_NOT_FOUND, chi_load_module(rt, SAMPLE_NOSYM_PATH));
  assert_has_message();
  assert_status(SAMPLE_INIT_STATUS, chi_load_module(rt, SAMPLE_FAIL_PATH));
  chi_method_t m = 0;
  assert_status(CHI_ERR_NOT_FOUND, chi_method_lookup(rt, "sample.double", &m));
  /* The failures left the runtime usable, and the good module still loads. */
  assert_status(CHI_OK, chi_load_module(rt, SAMPLE_MODULE_PATH));
  assert_true(call_double(rt, 7) == 14);
  assert_status(CHI_OK, chi_finalize(rt));
}

static void test_modules_config_key(void **state) {
  (void)state;
  SKIP_IN_CLIENT_MODE(kClientModulesReason);
  chi_runtime_t *rt = chi_test_init_yaml(1, "modules:\n  - \"" SAMPLE_MODULE_PATH "\"\n");
  assert_true(call_double(rt, 123) == 246);
  assert_status(CHI_OK, chi_finalize(rt));

  /* Also in flow style. */
  rt = chi_test_init_yaml(1, "modules: [\"" SAMPLE_MODULE_PATH "\"]\n");
  assert_true(call_double(rt, 1) == 2);
  assert_status(CHI_OK, chi_finalize(rt));
}

static void expect_init_failure(const char *yaml) {
  char path[512];
  chi_test_write_yaml(yaml, path, sizeof path);
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.gpus = 0;
  cfg.num_workers = 1;
  cfg.config_path = path;
  chi_runtime_t *rt = (chi_runtime_t *)&cfg;
  chi_status_t s = chi_init(&cfg, &rt);
  unlink(path);
  if (s == CHI_OK) {
    chi_finalize(rt);
    fail_msg("chi_init accepted a config whose module cannot load:\n%s", yaml);
  }
  assert_null(rt);
  assert_has_message();
}

static void test_modules_config_key_failures(void **state) {
  (void)state;
  SKIP_IN_CLIENT_MODE(kClientModulesReason);
  expect_init_failure("modules:\n  - /nonexistent/libnothing.so\n");
  expect_init_failure("modules:\n  - \"" SAMPLE_NOSYM_PATH "\"\n");
  expect_init_failure("modules:\n  - \"" SAMPLE_FAIL_PATH "\"\n");
  expect_init_failure("modules: 42\n");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_load_and_call),
      cmocka_unit_test(test_two_runtimes_share_a_module),
      cmocka_unit_test(test_load_failures),
      cmocka_unit_test(test_modules_config_key),
      cmocka_unit_test(test_modules_config_key_failures),
  };
  return chi_test_run("modules", tests);
}

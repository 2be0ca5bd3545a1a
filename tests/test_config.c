/* Configuration through the public API: chimaera.yaml errors with
 * file:line:column, CHI_* environment overrides, chi_config_t checks, and the
 * settings' visible effects on chi_submit. */
#include "common.h"

#include <dirent.h>
#include <limits.h>

#ifndef CHI_EXAMPLE_CONFIG
#error "CHI_EXAMPLE_CONFIG must name the repository's chimaera.yaml"
#endif

/* Every file a test writes lives in this directory, removed at the end. */
static char g_dir[PATH_MAX];

static int group_setup(void **state) {
  (void)state;
  const char *tmp = getenv("TMPDIR");
  if (!tmp || !tmp[0]) tmp = "/tmp";
  snprintf(g_dir, sizeof g_dir, "%s/chi-config-test-XXXXXX", tmp);
  return mkdtemp(g_dir) ? 0 : -1;
}

static int group_teardown(void **state) {
  (void)state;
  DIR *d = opendir(g_dir);
  if (!d) return -1;
  struct dirent *e;
  char path[PATH_MAX + 256];
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    snprintf(path, sizeof path, "%s/%s", g_dir, e->d_name);
    unlink(path);
  }
  closedir(d);
  return rmdir(g_dir);
}

/* Each test starts from a clean environment, whatever the caller exported. */
static int test_setup(void **state) {
  (void)state;
  chi_test_clean_env();
  return 0;
}

static void make_path(const char *name, char *path) {
  snprintf(path, PATH_MAX, "%s/%s", g_dir, name);
}

/* Writes `text` to a file `name` in the test directory; its path goes to path. */
static void write_file(const char *name, const char *text, char *path) {
  make_path(name, path);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
  assert_int_equal(fclose(f), 0);
}

static void assert_contains(const char *haystack, const char *needle) {
  if (!strstr(haystack, needle)) fail_msg("expected \"%s\" in \"%s\"", needle, haystack);
}

/* chi_init options for the tests: CPU only, so results do not depend on GPUs. */
static chi_config_t options(const char *path) {
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.config_path = path;
  cfg.gpus = 0;
  return cfg;
}

static chi_status_t init_from(const char *path, chi_runtime_t **rt) {
  chi_config_t cfg = options(path);
  return chi_init(&cfg, rt);
}

/* chi_init with `text` as the file fails with CHI_ERR_CONFIG and a message
 * "PATH:LINE:COLUMN: what...". */
static void expect_file_error(const char *name, const char *text, int line, int column,
                              const char *what) {
  char path[PATH_MAX];
  write_file(name, text, path);
  chi_runtime_t *rt = (chi_runtime_t *)path; /* must be reset to NULL */
  assert_status(CHI_ERR_CONFIG, init_from(path, &rt));
  assert_null(rt);
  char want[PATH_MAX + 256];
  snprintf(want, sizeof want, "%s:%d:%d: %s", path, line, column, what);
  assert_contains(chi_last_error_message(), want);
}

/* Submits `size` bytes of chi.echo on the CPU route; on success checks the
 * echo and consumes the future. */
static chi_status_t echo(chi_runtime_t *rt, size_t size) {
  static unsigned char in[1 << 16], out[1 << 16];
  assert_true(size <= sizeof in);
  for (size_t i = 0; i < size; ++i) in[i] = (unsigned char)(i * 7 + 1);
  chi_future_t f = 0;
  chi_status_t st = chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, in, size, &f);
  if (st != CHI_OK) return st;
  size_t got = 0;
  assert_status(CHI_OK, chi_wait(rt, f, -1, out, sizeof out, &got));
  assert_int_equal(got, size);
  assert_memory_equal(in, out, size);
  return CHI_OK;
}

/* The runtime's inline payload limit is exactly `limit`. */
static void expect_payload_limit(chi_runtime_t *rt, size_t limit) {
  assert_status(CHI_OK, echo(rt, limit));
  assert_status(CHI_ERR_TOO_LARGE, echo(rt, limit + 1));
}

static void unknown_key(void **state) {
  (void)state;
  expect_file_error("unknown.yaml", "workers: 2\nwrokers: 3\n", 2, 1, "unknown key 'wrokers'");
  expect_file_error("unknown_dotted.yaml", "gpu.blocks: 2\n", 1, 1, "unknown key 'gpu.blocks'");
}

static void wrong_type(void **state) {
  (void)state;
  expect_file_error("type_gpu.yaml", "gpu: 3\n", 1, 6, "gpu: expected a mapping");
  expect_file_error("type_list.yaml", "# workers\n\nworkers: [1, 2]\n", 3, 10,
                    "workers: expected an integer in [0, 1024], got a list");
  expect_file_error("type_quoted.yaml", "workers: \"4\"\n", 1, 10,
                    "workers: expected an integer in [0, 1024], got the quoted string '4'");
  expect_file_error("type_bool.yaml", "submit_blocking: maybe\n", 1, 18,
                    "submit_blocking: expected a boolean");
  expect_file_error("type_modules.yaml", "modules: lib.so\n", 1, 10,
                    "modules: expected a list of module paths");
  expect_file_error("type_module_item.yaml", "modules:\n  - a.so\n  - {b: 1}\n", 3, 5,
                    "modules: expected a module path, got a mapping");
  expect_file_error("type_level.yaml", "log_level: loud\n", 1, 12,
                    "log_level: expected one of error, warn, info, debug, got 'loud'");
  expect_file_error("type_mode.yaml", "mode: remote\n", 1, 7, "mode: expected one of embedded");
  expect_file_error("type_address.yaml", "server_address: http://x\n", 1, 17,
                    "server_address: expected an address");
  expect_file_error("type_top.yaml", "- workers\n", 1, 1, "expected a mapping of settings");
  expect_file_error("type_empty_value.yaml", "queue_depth:\n", 1, 13,
                    "queue_depth: expected a power of two in [2, 1048576], got an empty value");
}

static void out_of_range(void **state) {
  (void)state;
  expect_file_error("range_workers.yaml", "workers: 1025\n", 1, 10,
                    "workers: expected an integer in [0, 1024], got '1025'");
  expect_file_error("range_negative.yaml", "submit_timeout_ms: -1\n", 1, 20,
                    "submit_timeout_ms: expected an integer in [0, 3600000], got '-1'");
  expect_file_error("range_float.yaml", "spin_ns: 1.5\n", 1, 10,
                    "spin_ns: expected an integer in [0, 10000000000], got '1.5'");
  expect_file_error("range_huge.yaml", "spin_ns: 99999999999999999999999\n", 1, 10,
                    "spin_ns: expected an integer in [0, 10000000000]");
  expect_file_error("range_payload.yaml", "max_inline_payload: 1048577\n", 1, 21,
                    "max_inline_payload: expected an integer in [0, 1048576]");
}

static void not_power_of_two(void **state) {
  (void)state;
  expect_file_error("pow2.yaml", "workers: 2\nqueue_depth: 1000\n", 2, 14,
                    "queue_depth: expected a power of two in [2, 1048576], got '1000'");
  expect_file_error("pow2_one.yaml", "queue_depth: 1\n", 1, 14,
                    "queue_depth: expected a power of two");
}

static void duplicate_key(void **state) {
  (void)state;
  expect_file_error("dup.yaml", "queue_depth: 64\nworkers: 2\nqueue_depth: 128\n", 3, 1,
                    "duplicate key 'queue_depth' (first at line 1, column 1)");
}

static void syntax_error(void **state) {
  (void)state;
  expect_file_error("syntax.yaml", "workers: 4\n  bad: 1\n", 2, 6, "invalid YAML: ");
  expect_file_error("syntax_flow.yaml", "workers: [1, 2\n", 2, 1, "invalid YAML: ");
  expect_file_error("syntax_alias.yaml", "workers: &w 2\nqueue_depth: *w\n", 2, 14,
                    "aliases (*w) are not supported");
  expect_file_error("syntax_docs.yaml", "workers: 1\n---\nworkers: 2\n", 2, 1,
                    "only one YAML document is allowed");
  expect_file_error("syntax_deep.yaml", "modules: [[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]\n", 1,
                    25, "nested more than");
}

static void missing_file(void **state) {
  (void)state;
  char path[PATH_MAX];
  make_path("does-not-exist.yaml", path);
  chi_runtime_t *rt = NULL;
  assert_status(CHI_ERR_CONFIG, init_from(path, &rt));
  assert_null(rt);
  char want[PATH_MAX + 64];
  snprintf(want, sizeof want, "%s: cannot open: ", path);
  assert_contains(chi_last_error_message(), want);

  /* A directory is not a configuration file either. */
  assert_status(CHI_ERR_CONFIG, init_from(g_dir, &rt));
  assert_contains(chi_last_error_message(), "cannot open: ");
}

static void oversized_file(void **state) {
  (void)state;
  char path[PATH_MAX];
  make_path("huge.yaml", path);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  char line[1024];
  memset(line, '#', sizeof line - 1);
  line[sizeof line - 1] = '\n';
  for (int i = 0; i < 1025; ++i) assert_int_equal(fwrite(line, 1, sizeof line, f), sizeof line);
  assert_int_equal(fclose(f), 0);
  chi_runtime_t *rt = NULL;
  assert_status(CHI_ERR_CONFIG, init_from(path, &rt));
  assert_contains(chi_last_error_message(), "larger than");
}

static void gpu_key_errors(void **state) {
  (void)state;
  expect_file_error("gpu_unknown.yaml", "gpu:\n  blocks: 2\n  blokcs: 1\n", 3, 3,
                    "unknown key 'gpu.blokcs'");
  expect_file_error("gpu_range.yaml", "gpu:\n  warps_per_block: 33\n", 2, 20,
                    "gpu.warps_per_block: expected an integer in [1, 32], got '33'");
  expect_file_error("gpu_devices.yaml", "gpu:\n  devices: -2\n", 2, 12,
                    "gpu.devices: expected an integer in [-1, 1024]");
  expect_file_error("gpu_pow2.yaml", "gpu:\n  device_slots: 48\n", 2, 17,
                    "gpu.device_slots: expected a power of two in [32, 4194304]");
  expect_file_error("gpu_dup.yaml", "gpu:\n  queue_depth: 8\n  queue_depth: 8\n", 3, 3,
                    "duplicate key 'gpu.queue_depth'");
  expect_file_error("gpu_list.yaml", "gpu: [1]\n", 1, 6, "gpu: expected a mapping");
  /* Checked on the merged settings: the GPU limit cannot exceed the CPU one. */
  expect_file_error("gpu_payload.yaml", "max_inline_payload: 64\ngpu:\n  max_payload: 128\n", 3,
                    16, "gpu.max_payload (128) must not exceed max_inline_payload (64");
}

static void expect_env_error(const char *var, const char *value, const char *what) {
  assert_int_equal(setenv(var, value, 1), 0);
  chi_runtime_t *rt = NULL;
  assert_status(CHI_ERR_CONFIG, init_from(NULL, &rt));
  assert_null(rt);
  char want[256];
  snprintf(want, sizeof want, "%s: %s", var, what);
  assert_contains(chi_last_error_message(), want);
  assert_int_equal(unsetenv(var), 0);
}

static void env_errors(void **state) {
  (void)state;
  expect_env_error("CHI_WORKERS", "abc", "expected an integer in [0, 1024], got 'abc'");
  expect_env_error("CHI_WORKERS", "-3", "expected an integer in [0, 1024]");
  expect_env_error("CHI_QUEUE_DEPTH", "1000", "expected a power of two in [2, 1048576]");
  expect_env_error("CHI_MAX_INLINE_PAYLOAD", "2097152", "expected an integer in [0, 1048576]");
  expect_env_error("CHI_SPIN_NS", "1e3", "expected an integer");
  expect_env_error("CHI_SUBMIT_BLOCKING", "maybe", "expected a boolean");
  expect_env_error("CHI_SUBMIT_TIMEOUT_MS", "3600001", "expected an integer in [0, 3600000]");
  expect_env_error("CHI_CONNECT_TIMEOUT_MS", "0", "expected an integer in [1, 3600000]");
  expect_env_error("CHI_LOG_LEVEL", "loud", "expected one of error, warn, info, debug");
  expect_env_error("CHI_MODE", "remote", "expected one of embedded, client");
  expect_env_error("CHI_SERVER_ADDRESS", "tcp://host", "expected an address");
  expect_env_error("CHI_GPU_DEVICES", "-2", "expected an integer in [-1, 1024]");
  expect_env_error("CHI_GPU_BLOCKS", "1025", "expected an integer in [0, 1024]");
  expect_env_error("CHI_GPU_WARPS_PER_BLOCK", "64", "expected an integer in [1, 32]");
  expect_env_error("CHI_GPU_QUEUE_DEPTH", "3", "expected a power of two");
  expect_env_error("CHI_GPU_DEVICE_SLOTS", "16", "expected a power of two in [32, 4194304]");
  expect_env_error("CHI_GPU_POLL_INTERVAL_US", "100001", "expected an integer in [0, 100000]");
  expect_env_error("CHI_GPU_POLLER_SPIN_NS", "x", "expected an integer");
  expect_env_error("CHI_WORKER_POP_BATCH", "9", "expected an integer in [0, 8]");
  expect_env_error("CHI_WORKER_SPINNERS", "1025", "expected an integer in [0, 1024]");
  expect_env_error("CHI_GPU_POLLER_STEAL_US", "10000001", "expected an integer in [0, 10000000]");
  expect_env_error("CHI_GPU_POLLER_STEAL_US", "-1", "expected an integer in [0, 10000000]");
  expect_env_error("CHI_GPU_MAX_PAYLOAD", "8192",
                   "gpu.max_payload (8192) must not exceed max_inline_payload (4096");
}

/* A variable beats the file; an empty variable counts as unset. */
static void env_overrides_file(void **state) {
  (void)state;
  char path[PATH_MAX];
  write_file("env_override.yaml", "max_inline_payload: 64\n", path);
  chi_runtime_t *rt = NULL;

  assert_int_equal(setenv("CHI_MAX_INLINE_PAYLOAD", "128", 1), 0);
  assert_status(CHI_OK, init_from(path, &rt));
  expect_payload_limit(rt, 128);
  assert_status(CHI_OK, chi_finalize(rt));

  assert_int_equal(setenv("CHI_MAX_INLINE_PAYLOAD", "", 1), 0);
  assert_status(CHI_OK, init_from(path, &rt));
  expect_payload_limit(rt, 64);
  assert_status(CHI_OK, chi_finalize(rt));
}

static void chi_config_env_used(void **state) {
  (void)state;
  char bad[PATH_MAX], good[PATH_MAX];
  write_file("via_env_bad.yaml", "\nqueue_depth: 3\n", bad);
  write_file("via_env_good.yaml", "max_inline_payload: 100\n", good);
  chi_runtime_t *rt = NULL;

  assert_int_equal(setenv("CHI_CONFIG", bad, 1), 0);
  assert_status(CHI_ERR_CONFIG, init_from(NULL, &rt));
  char want[PATH_MAX + 64];
  snprintf(want, sizeof want, "%s:2:14: queue_depth", bad);
  assert_contains(chi_last_error_message(), want);
  assert_status(CHI_ERR_CONFIG, chi_init(NULL, &rt)); /* cfg NULL reads it too */

  assert_int_equal(setenv("CHI_CONFIG", good, 1), 0);
  assert_status(CHI_OK, init_from(NULL, &rt));
  expect_payload_limit(rt, 100);
  assert_status(CHI_OK, chi_finalize(rt));

  /* The message says where a missing file's name came from. */
  char missing[PATH_MAX];
  make_path("via_env_missing.yaml", missing);
  assert_int_equal(setenv("CHI_CONFIG", missing, 1), 0);
  assert_status(CHI_ERR_CONFIG, init_from(NULL, &rt));
  assert_contains(chi_last_error_message(), "cannot open");
  assert_contains(chi_last_error_message(), "CHI_CONFIG");
}

static void config_path_beats_env(void **state) {
  (void)state;
  char bad[PATH_MAX], good[PATH_MAX];
  write_file("priority_bad.yaml", "wrokers: 1\n", bad);
  write_file("priority_good.yaml", "max_inline_payload: 32\n", good);
  assert_int_equal(setenv("CHI_CONFIG", bad, 1), 0);
  chi_runtime_t *rt = NULL;
  assert_status(CHI_OK, init_from(good, &rt));
  expect_payload_limit(rt, 32);
  assert_status(CHI_OK, chi_finalize(rt));
}

static void example_config_loads(void **state) {
  (void)state;
  chi_runtime_t *rt = NULL;
  if (init_from(CHI_EXAMPLE_CONFIG, &rt) != CHI_OK)
    fail_msg("%s: %s", CHI_EXAMPLE_CONFIG, chi_last_error_message());
  expect_payload_limit(rt, 4096); /* the file holds the defaults */
  assert_status(CHI_OK, chi_finalize(rt));
}

static void empty_files_load(void **state) {
  (void)state;
  const char *texts[] = {"", "# nothing but a comment\n\n", "---\n", "gpu:\nmodules:\n"};
  for (size_t i = 0; i < sizeof texts / sizeof texts[0]; ++i) {
    char name[32], path[PATH_MAX];
    snprintf(name, sizeof name, "empty%zu.yaml", i);
    write_file(name, texts[i], path);
    chi_runtime_t *rt = NULL;
    if (init_from(path, &rt) != CHI_OK) fail_msg("%s: %s", texts[i], chi_last_error_message());
    expect_payload_limit(rt, 4096);
    assert_status(CHI_OK, chi_finalize(rt));
  }
}

static void no_file(void **state) {
  (void)state;
  chi_runtime_t *rt = NULL;
  assert_status(CHI_OK, chi_init(NULL, &rt));
  assert_non_null(rt);
  expect_payload_limit(rt, 4096);
  assert_status(CHI_OK, chi_finalize(rt));

  assert_status(CHI_OK, init_from(NULL, &rt));
  assert_status(CHI_OK, chi_finalize(rt));
  /* "" is "no file" too (what bindings pass for an absent string). */
  assert_int_equal(setenv("CHI_CONFIG", "", 1), 0);
  assert_status(CHI_OK, init_from("", &rt));
  assert_status(CHI_OK, chi_finalize(rt));
}

static void every_key_accepted(void **state) {
  (void)state;
  char path[PATH_MAX];
  write_file("all.yaml",
             "workers: 3\nqueue_depth: 64\nmax_inline_payload: 256\nspin_ns: 0\n"
             "submit_blocking: yes\nsubmit_timeout_ms: 10\nlog_level: error\nmodules: []\n"
             "mode: embedded\nserver_address: tcp://localhost:5555\n"
             "gpu:\n  devices: 0\n  blocks: 2\n  warps_per_block: 8\n  queue_depth: 2\n"
             "  device_slots: 32\n  max_payload: 256\n  poll_interval_us: 0\n"
             "  poller_spin_ns: 0\n",
             path);
  chi_runtime_t *rt = NULL;
  if (init_from(path, &rt) != CHI_OK) fail_msg("%s", chi_last_error_message());
  expect_payload_limit(rt, 256);
  assert_status(CHI_OK, chi_finalize(rt));
}

static void bad_struct(void **state) {
  (void)state;
  chi_runtime_t *rt = NULL;
  chi_config_t cfg = options(NULL);

  cfg.struct_size = sizeof(size_t);
  assert_status(CHI_ERR_INVALID, chi_init(&cfg, &rt));
  assert_null(rt);
  assert_contains(chi_last_error_message(), "struct_size");
  cfg.struct_size = (size_t)1 << 30;
  assert_status(CHI_ERR_INVALID, chi_init(&cfg, &rt));

  cfg = options(NULL);
  cfg.num_workers = -1;
  assert_status(CHI_ERR_INVALID, chi_init(&cfg, &rt));
  assert_contains(chi_last_error_message(), "num_workers");
  cfg = options(NULL);
  cfg.gpus = -2;
  assert_status(CHI_ERR_INVALID, chi_init(&cfg, &rt));
  assert_contains(chi_last_error_message(), "gpus");
  cfg = options(NULL);
  cfg.mode = 7;
  assert_status(CHI_ERR_INVALID, chi_init(&cfg, &rt));
  assert_contains(chi_last_error_message(), "mode");
  cfg = options(NULL);
  cfg.server_address = "smtp://x";
  assert_status(CHI_ERR_INVALID, chi_init(&cfg, &rt));
  assert_contains(chi_last_error_message(), "server_address");
}

/* An older caller's struct ends early: fields past struct_size are never read. */
static void short_struct(void **state) {
  (void)state;
  chi_config_t cfg = options(NULL);
  cfg.struct_size = offsetof(chi_config_t, num_workers);
  cfg.num_workers = -5;
  cfg.gpus = -7;
  chi_runtime_t *rt = NULL;
  assert_status(CHI_OK, chi_init(&cfg, &rt));
  assert_status(CHI_OK, chi_finalize(rt));
}

/* A newer caller's struct is longer: the known prefix is used. */
static void long_struct(void **state) {
  (void)state;
  struct {
    chi_config_t cfg;
    uint64_t future_fields[4];
  } big;
  memset(&big, 0xff, sizeof big);
  big.cfg = options(NULL);
  big.cfg.struct_size = sizeof big;
  chi_runtime_t *rt = NULL;
  assert_status(CHI_OK, chi_init(&big.cfg, &rt));
  assert_status(CHI_OK, chi_finalize(rt));
}

static void inline_payload_limit(void **state) {
  (void)state;
  char path[PATH_MAX];
  write_file("payload.yaml", "max_inline_payload: 64\n", path);
  chi_runtime_t *rt = NULL;
  assert_status(CHI_OK, init_from(path, &rt));
  assert_status(CHI_ERR_TOO_LARGE, echo(rt, 65));
  assert_status(CHI_OK, echo(rt, 64));
  assert_status(CHI_OK, chi_finalize(rt));
}

static chi_status_t wait_at_gate(chi_request_t *req, void *user_data) {
  (void)req;
  chi_test_gate_pass(user_data);
  return CHI_OK;
}

/* With two slots, one worker stuck in a handler and non-blocking submits,
 * the third submit fails at once.  The hour-long submit timeout makes a
 * runtime that ignored submit_blocking hang (and ctest time out) instead of
 * passing after the timeout. */
static void expect_nonblocking(const char *path) {
  chi_runtime_t *rt = NULL;
  assert_status(CHI_OK, init_from(path, &rt));
  chi_test_gate_t gate;
  chi_test_gate_init(&gate);
  chi_method_t m = 0;
  assert_status(CHI_OK, chi_register_handler(rt, "test.gated", wait_at_gate, &gate, &m));

  chi_future_t futures[64];
  int n = 0;
  chi_status_t st = CHI_OK;
  while (n < 64 && (st = chi_submit(rt, CHI_ROUTE_CPU, m, NULL, 0, &futures[n])) == CHI_OK) ++n;

  chi_test_gate_open(&gate);
  for (int i = 0; i < n; ++i)
    assert_status(CHI_OK, chi_wait(rt, futures[i], -1, NULL, 0, NULL));
  assert_status(CHI_OK, chi_finalize(rt));
  chi_test_gate_destroy(&gate);

  assert_status(CHI_ERR_AGAIN, st);
  assert_int_equal(n, 2); /* queue_depth is the number of task slots */
}

static void nonblocking_submit(void **state) {
  (void)state;
  char path[PATH_MAX];
  write_file("nonblocking.yaml",
             "workers: 1\nqueue_depth: 2\nsubmit_blocking: false\nsubmit_timeout_ms: 3600000\n",
             path);
  expect_nonblocking(path);
}

/* The same settings from the environment alone. */
static void nonblocking_submit_env(void **state) {
  (void)state;
  assert_int_equal(setenv("CHI_WORKERS", "1", 1), 0);
  assert_int_equal(setenv("CHI_QUEUE_DEPTH", "2", 1), 0);
  assert_int_equal(setenv("CHI_SUBMIT_BLOCKING", "off", 1), 0);
  assert_int_equal(setenv("CHI_SUBMIT_TIMEOUT_MS", "3600000", 1), 0);
  expect_nonblocking(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(unknown_key, test_setup),
      cmocka_unit_test_setup(wrong_type, test_setup),
      cmocka_unit_test_setup(out_of_range, test_setup),
      cmocka_unit_test_setup(not_power_of_two, test_setup),
      cmocka_unit_test_setup(duplicate_key, test_setup),
      cmocka_unit_test_setup(syntax_error, test_setup),
      cmocka_unit_test_setup(missing_file, test_setup),
      cmocka_unit_test_setup(oversized_file, test_setup),
      cmocka_unit_test_setup(gpu_key_errors, test_setup),
      cmocka_unit_test_setup(env_errors, test_setup),
      cmocka_unit_test_setup(env_overrides_file, test_setup),
      cmocka_unit_test_setup(chi_config_env_used, test_setup),
      cmocka_unit_test_setup(config_path_beats_env, test_setup),
      cmocka_unit_test_setup(example_config_loads, test_setup),
      cmocka_unit_test_setup(empty_files_load, test_setup),
      cmocka_unit_test_setup(no_file, test_setup),
      cmocka_unit_test_setup(every_key_accepted, test_setup),
      cmocka_unit_test_setup(bad_struct, test_setup),
      cmocka_unit_test_setup(short_struct, test_setup),
      cmocka_unit_test_setup(long_struct, test_setup),
      cmocka_unit_test_setup(inline_payload_limit, test_setup),
      cmocka_unit_test_setup(nonblocking_submit, test_setup),
      cmocka_unit_test_setup(nonblocking_submit_env, test_setup),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

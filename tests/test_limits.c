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

static chi_status_t gated(chi_request_t *req, void *user_data) {
  chi_test_gate_pass(user_data);
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

/* The program: one thread submits 100000 tasks before waiting on
 * any, with no configuration at all. */
static void test_deep_queue_default_config(void **state) {
  (void)state;
  chi_runtime_t *rt = NULL;
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.gpus = 0;
  assert_status(CHI_OK, chi_init(&cfg, &rt));
  const long n = 100000;
  chi_future_t *f = calloc((size_t)n, sizeof *f);
  assert_non_null(f);
  for (long i = 0; i < n; i++) {
    uint64_t x = (uint64_t)i * 7919u;
    assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, &x, sizeof x, &f[i]));
  }
  chi_stats_t st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  assert_status(CHI_OK, chi_stats(rt, &st));
  assert_true(st.slots_total >= (uint32_t)n);
  for (long i = 0; i < n; i++) {
    uint64_t y = 0;
    size_t size = 0;
    assert_status(CHI_OK, chi_wait(rt, f[i], -1, &y, sizeof y, &size));
    assert_int_equal(size, sizeof y);
    assert_true(y == (uint64_t)i * 7919u);
  }
  free(f);
  assert_status(CHI_OK, chi_finalize(rt));
}

/* Inputs of every size class travel through the spill lists intact: small
 * ones (in the queue cell or the slot's small area) and large ones. */
static void test_deep_queue_payload_sizes(void **state) {
  (void)state;
  chi_runtime_t *rt = chi_test_init(2, NULL);
  const long n = chi_test_scaled(20000);
  chi_future_t *f = calloc((size_t)n, sizeof *f);
  assert_non_null(f);
  static const size_t sizes[] = {0, 1, 8, 103, 104, 105, 128, 1000, 4096};
  const size_t nsizes = sizeof sizes / sizeof sizes[0];
  uint8_t buf[4096];
  for (long i = 0; i < n; i++) {
    size_t len = sizes[(size_t)i % nsizes];
    for (size_t k = 0; k < len; k++) buf[k] = (uint8_t)(i * 31 + (long)k);
    assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_CHECKSUM, buf, len, &f[i]));
  }
  for (long i = 0; i < n; i++) {
    size_t len = sizes[(size_t)i % nsizes];
    for (size_t k = 0; k < len; k++) buf[k] = (uint8_t)(i * 31 + (long)k);
    uint64_t h = 0;
    assert_status(CHI_OK, chi_wait(rt, f[i], -1, &h, sizeof h, NULL));
    assert_true(h == chi_test_fnv1a(buf, len));
  }
  free(f);
  assert_status(CHI_OK, chi_finalize(rt));
}

/* A handler that fans out more children than a worker's ring holds, then
 * waits on all of them: the nested-wait rule holds with spilled tasks. */
typedef struct fan {
  chi_runtime_t *rt;
  chi_method_t leaf;
  chi_method_t parent;
} fan_t;

static fan_t g_fan;

static chi_status_t leaf_handler(chi_request_t *req, void *user_data) {
  (void)user_data;
  memcpy(req->output, req->input, req->input_size);
  req->output_size = req->input_size;
  return CHI_OK;
}

static chi_status_t fan_handler(chi_request_t *req, void *user_data) {
  fan_t *fan = user_data;
  enum { kChildren = 3000 };
  /* On the heap: a waiting worker may run another parent nested on its stack. */
  chi_future_t *kids = malloc(kChildren * sizeof *kids);
  if (!kids) return CHI_ERR_NOMEM;
  chi_status_t s = CHI_OK;
  uint32_t queued = 0;
  for (; queued < kChildren && s == CHI_OK; queued++)
    s = chi_submit(fan->rt, CHI_ROUTE_CPU, fan->leaf, &queued, sizeof queued, &kids[queued]);
  if (s != CHI_OK) queued--;
  uint64_t sum = 0;
  for (uint32_t i = 0; i < queued; i++) {
    uint32_t v = 0;
    chi_status_t w = chi_wait(fan->rt, kids[i], -1, &v, sizeof v, NULL);
    if (w != CHI_OK && s == CHI_OK) s = w;
    sum += v;
  }
  free(kids);
  if (s != CHI_OK) return s;
  memcpy(req->output, &sum, sizeof sum);
  req->output_size = sizeof sum;
  return CHI_OK;
}

static void test_handler_fan_out_past_ring(void **state) {
  (void)state;
  g_fan.rt = chi_test_init(2, NULL);
  assert_status(CHI_OK, chi_register_handler(g_fan.rt, "limits.leaf", leaf_handler, NULL, &g_fan.leaf));
  assert_status(CHI_OK, chi_register_handler(g_fan.rt, "limits.fan", fan_handler, &g_fan, &g_fan.parent));
  const int parents = 4;
  chi_future_t f[4];
  for (int i = 0; i < parents; i++)
    assert_status(CHI_OK, chi_submit(g_fan.rt, CHI_ROUTE_CPU, g_fan.parent, NULL, 0, &f[i]));
  for (int i = 0; i < parents; i++) {
    uint64_t sum = 0;
    assert_status(CHI_OK, chi_wait(g_fan.rt, f[i], -1, &sum, sizeof sum, NULL));
    assert_true(sum == 3000ull * 2999ull / 2);
  }
  assert_status(CHI_OK, chi_finalize(g_fan.rt));
}

/* queue_depth is still the bound: past it, submit answers CHI_ERR_AGAIN. */
static void test_queue_depth_bound(void **state) {
  (void)state;
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.gpus = 0;
  cfg.num_workers = 1;
  cfg.settings = "queue_depth: 64\nsubmit_blocking: false\n";
  chi_runtime_t *rt = NULL;
  assert_status(CHI_OK, chi_init(&cfg, &rt));
  chi_test_gate_t gate;
  chi_test_gate_init(&gate);
  chi_method_t m;
  assert_status(CHI_OK, chi_register_handler(rt, "limits.gated", gated, &gate, &m));
  chi_future_t f[64], extra;
  for (int i = 0; i < 64; i++) assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, m, NULL, 0, &f[i]));
  assert_status(CHI_ERR_AGAIN, chi_submit(rt, CHI_ROUTE_CPU, m, NULL, 0, &extra));
  assert_has_message();
  chi_test_gate_open(&gate);
  for (int i = 0; i < 64; i++) assert_status(CHI_OK, chi_wait(rt, f[i], -1, NULL, 0, NULL));
  assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, m, NULL, 0, &extra));
  assert_status(CHI_OK, chi_wait(rt, extra, -1, NULL, 0, NULL));
  assert_status(CHI_OK, chi_finalize(rt));
  chi_test_gate_destroy(&gate);
}

/* chi_config_t.settings reaches every key, with dotted names too; errors
 * name the field and the position. */
static void test_settings_field(void **state) {
  (void)state;
  chi_config_t cfg;
  chi_config_init(&cfg);
  assert_null(cfg.settings);
  cfg.gpus = 0;
  cfg.settings = "workers: 3\nqueue_depth: 256\nmax_inline_payload: 512\ngpu.lease_us: 0\n"
                 "gpu: {blocks: 2}\nworker_stack_size: 1M\nlog_level: warn\n";
  chi_runtime_t *rt = NULL;
  assert_status(CHI_OK, chi_init(&cfg, &rt));
  chi_stats_t st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  assert_status(CHI_OK, chi_stats(rt, &st));
  assert_int_equal(st.workers, 3);
  assert_int_equal(st.slots_total, 256);
  char big[600] = {0};
  chi_future_t f;
  assert_status(CHI_ERR_TOO_LARGE, chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, big, sizeof big, &f));
  assert_status(CHI_OK, chi_finalize(rt));

  /* The named fields win over the same key in settings. */
  cfg.num_workers = 2;
  assert_status(CHI_OK, chi_init(&cfg, &rt));
  assert_status(CHI_OK, chi_stats(rt, &st));
  assert_int_equal(st.workers, 2);
  assert_status(CHI_OK, chi_finalize(rt));

  static const char *const bad[] = {
      "queue_depth: 1000\n",        /* not a power of two */
      "wrokers: 2\n",               /* unknown key */
      "gpu.nope: 1\n",              /* unknown dotted key */
      "worker_stack_size: 1000\n",  /* below 64 KiB */
      "worker_stack_size: 12X\n",   /* bad unit */
      "workers: [\n",               /* not YAML */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    cfg.settings = bad[i];
    rt = (chi_runtime_t *)1;
    assert_status(CHI_ERR_CONFIG, chi_init(&cfg, &rt));
    assert_null(rt);
    assert_non_null(strstr(chi_last_error_message(), "chi_config_t.settings:"));
  }
  cfg.settings = "";
  assert_status(CHI_OK, chi_init(&cfg, &rt));
  assert_status(CHI_OK, chi_finalize(rt));
}

/* A handler whose frame needs 32 MiB runs on workers given a 64 MiB stack;
 * the size a worker really got is at least the configured one. */
#define BIG_FRAME (32u << 20)

static chi_status_t big_frame_handler(chi_request_t *req, void *user_data) {
  (void)user_data;
  volatile uint8_t frame[BIG_FRAME];
  for (size_t i = 0; i < BIG_FRAME; i += 4096) frame[i] = (uint8_t)(i >> 12);
  uint64_t sum = 0;
  for (size_t i = 0; i < BIG_FRAME; i += 4096) sum += frame[i];
  pthread_attr_t attr;
  size_t stack = 0;
  if (pthread_getattr_np(pthread_self(), &attr) == 0) {
    pthread_attr_getstacksize(&attr, &stack);
    pthread_attr_destroy(&attr);
  }
  uint64_t out[2] = {sum, (uint64_t)stack};
  memcpy(req->output, out, sizeof out);
  req->output_size = sizeof out;
  return CHI_OK;
}

static void test_worker_stack_size(void **state) {
  (void)state;
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.gpus = 0;
  cfg.num_workers = 2;
  cfg.settings = "worker_stack_size: 64M\n";
  chi_runtime_t *rt = NULL;
  assert_status(CHI_OK, chi_init(&cfg, &rt));
  chi_method_t m;
  assert_status(CHI_OK, chi_register_handler(rt, "limits.big_frame", big_frame_handler, NULL, &m));
  uint64_t expect = 0;
  for (size_t i = 0; i < BIG_FRAME; i += 4096) expect += (uint8_t)(i >> 12);
  for (int k = 0; k < 4; k++) {
    chi_future_t f;
    assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, m, NULL, 0, &f));
    uint64_t out[2] = {0, 0};
    assert_status(CHI_OK, chi_wait(rt, f, -1, out, sizeof out, NULL));
    assert_true(out[0] == expect);
    assert_true(out[1] >= (64u << 20));
  }
  assert_status(CHI_OK, chi_finalize(rt));

  /* The environment variable sets it too. */
  setenv("CHI_WORKER_STACK_SIZE", "40MiB", 1);
  cfg.settings = NULL;
  assert_status(CHI_OK, chi_init(&cfg, &rt));
  unsetenv("CHI_WORKER_STACK_SIZE");
  assert_status(CHI_OK, chi_register_handler(rt, "limits.big_frame", big_frame_handler, NULL, &m));
  chi_future_t f;
  assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, m, NULL, 0, &f));
  uint64_t out[2] = {0, 0};
  assert_status(CHI_OK, chi_wait(rt, f, -1, out, sizeof out, NULL));
  assert_true(out[0] == expect);
  assert_true(out[1] >= (40u << 20));
  assert_status(CHI_OK, chi_finalize(rt));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_never_registered),
      cmocka_unit_test(test_other_runtimes_methods),
      cmocka_unit_test(test_ids_unique_among_live_runtimes),
      cmocka_unit_test(test_deep_queue_default_config),
      cmocka_unit_test(test_deep_queue_payload_sizes),
      cmocka_unit_test(test_handler_fan_out_past_ring),
      cmocka_unit_test(test_queue_depth_bound),
      cmocka_unit_test(test_settings_field),
      cmocka_unit_test(test_worker_stack_size),
  };
  return chi_test_run("limits", tests);
}

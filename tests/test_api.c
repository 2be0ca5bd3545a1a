/* The host API's contract on CPU routes: argument checks, statuses and
 * messages, futures, payload limits, handler results and the built-ins. */
#include "common.h"

#include <sched.h>
#include <stdatomic.h>

typedef struct fixture {
  chi_runtime_t *rt;
  chi_test_gate_t gate;
  atomic_int gated_runs; /* completed runs of test.gated */
  chi_method_t gated;    /* test.gated: waits at the gate, then echoes */
  chi_method_t status;   /* test.status: returns the int32 in its input */
  chi_method_t inspect;  /* test.inspect: reports what the handler saw */
  chi_method_t overflow; /* test.overflow: claims more output than capacity */
} fixture_t;

static chi_status_t gated_handler(chi_request_t *req, void *user_data) {
  fixture_t *fx = user_data;
  chi_test_gate_pass(&fx->gate);
  if (req->input_size > req->output_capacity) return CHI_ERR_TOO_LARGE;
  if (req->input_size) memcpy(req->output, req->input, req->input_size);
  req->output_size = req->input_size;
  atomic_fetch_add(&fx->gated_runs, 1);
  return CHI_OK;
}

static chi_status_t status_handler(chi_request_t *req, void *user_data) {
  (void)user_data;
  int32_t s;
  if (req->input_size != sizeof s) return CHI_ERR_INVALID;
  memcpy(&s, req->input, sizeof s);
  /* Output written before a failure must not reach the waiter as a result. */
  if (req->output_capacity >= 4) {
    memcpy(req->output, "junk", 4);
    req->output_size = 4;
  }
  return s;
}

typedef struct seen {
  uint32_t method;
  int32_t source;
  uint64_t input_size;
  uint64_t output_capacity;
  uint64_t output_size_on_entry;
  uint64_t user_data;
  uint64_t input_checksum;
} seen_t;

static chi_status_t inspect_handler(chi_request_t *req, void *user_data) {
  seen_t s;
  memset(&s, 0, sizeof s);
  s.method = req->method;
  s.source = req->source;
  s.input_size = req->input_size;
  s.output_capacity = req->output_capacity;
  s.output_size_on_entry = req->output_size;
  s.user_data = (uint64_t)(uintptr_t)user_data;
  s.input_checksum = chi_test_fnv1a(req->input, req->input_size);
  if (req->output_capacity < sizeof s) return CHI_ERR_TOO_LARGE;
  memcpy(req->output, &s, sizeof s);
  req->output_size = sizeof s;
  return CHI_OK;
}

static chi_status_t overflow_handler(chi_request_t *req, void *user_data) {
  (void)user_data;
  req->output_size = req->output_capacity + 1;
  return CHI_OK;
}

static chi_status_t noop_handler(chi_request_t *req, void *user_data) {
  (void)req;
  (void)user_data;
  return CHI_OK;
}

static int setup(void **state) {
  fixture_t *fx = calloc(1, sizeof *fx);
  assert_non_null(fx);
  chi_test_gate_init(&fx->gate);
  atomic_init(&fx->gated_runs, 0);
  fx->rt = chi_test_init(2, NULL);
  assert_status(CHI_OK, chi_register_handler(fx->rt, "test.gated", gated_handler, fx, &fx->gated));
  assert_status(CHI_OK,
                chi_register_handler(fx->rt, "test.status", status_handler, NULL, &fx->status));
  assert_status(CHI_OK, chi_register_handler(fx->rt, "test.inspect", inspect_handler,
                                             (void *)(uintptr_t)0x5eed, &fx->inspect));
  assert_status(CHI_OK,
                chi_register_handler(fx->rt, "test.overflow", overflow_handler, NULL, &fx->overflow));
  *state = fx;
  return 0;
}

static int teardown(void **state) {
  fixture_t *fx = *state;
  /* A failed test may leave gated tasks behind: let them finish. */
  chi_test_gate_open(&fx->gate);
  chi_status_t s = chi_finalize(fx->rt);
  chi_test_gate_destroy(&fx->gate);
  free(fx);
  return s == CHI_OK ? 0 : -1;
}

/* Submits, waits forever, expects CHI_OK; returns the output size. */
static size_t run_ok(chi_runtime_t *rt, chi_route_t route, chi_method_t m, const void *in,
                     size_t in_size, void *out, size_t cap) {
  chi_future_t f = 0;
  assert_status(CHI_OK, chi_submit(rt, route, m, in, in_size, &f));
  assert_true(f != 0);
  size_t out_size = (size_t)-1;
  assert_status(CHI_OK, chi_wait(rt, f, -1, out, cap, &out_size));
  return out_size;
}

static chi_status_t run_status(chi_runtime_t *rt, chi_method_t m, int32_t code) {
  chi_future_t f = 0;
  assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, m, &code, sizeof code, &f));
  char out[64];
  size_t out_size = 0;
  return chi_wait(rt, f, -1, out, sizeof out, &out_size);
}

static void test_version(void **state) {
  (void)state;
  assert_int_equal(chi_version(), CHI_VERSION_NUMBER);
  char want[32];
  snprintf(want, sizeof want, "%d.%d.%d", CHI_VERSION_MAJOR, CHI_VERSION_MINOR, CHI_VERSION_PATCH);
  assert_non_null(chi_version_string());
  assert_string_equal(chi_version_string(), want);
}

static void test_status_strings(void **state) {
  (void)state;
  const chi_status_t known[] = {
      CHI_OK,           CHI_ERR_INVALID,      CHI_ERR_NOMEM,    CHI_ERR_TIMEOUT,
      CHI_ERR_AGAIN,    CHI_ERR_NOT_FOUND,    CHI_ERR_NO_DEVICE, CHI_ERR_DISCONNECTED,
      CHI_ERR_PROTOCOL, CHI_ERR_TOO_LARGE,    CHI_ERR_CONFIG,   CHI_ERR_PERMISSION,
      CHI_ERR_SHUTDOWN, CHI_ERR_INTERNAL,
  };
  const size_t n = sizeof known / sizeof known[0];
  for (size_t i = 0; i < n; i++) {
    const char *s = chi_status_string(known[i]);
    assert_non_null(s);
    assert_true(s[0] != '\0');
    assert_string_not_equal(s, "unknown status");
    assert_string_not_equal(s, "handler-defined error");
    for (size_t j = 0; j < i; j++) assert_string_not_equal(s, chi_status_string(known[j]));
  }
  const chi_status_t user[] = {CHI_ERR_USER_BASE, -1001, -1234, -65536, INT32_MIN};
  for (size_t i = 0; i < sizeof user / sizeof user[0]; i++)
    assert_string_equal(chi_status_string(user[i]), "handler-defined error");
  const chi_status_t unknown[] = {1, 42, INT32_MAX, CHI_ERR_INTERNAL - 1, -100, -999};
  for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++)
    assert_string_equal(chi_status_string(unknown[i]), "unknown status");
}

static void *fresh_thread_message(void *arg) {
  const char *m = chi_last_error_message();
  *(int *)arg = (m != NULL && m[0] == '\0');
  return NULL;
}

static void *failing_thread(void *arg) {
  (void)arg;
  chi_method_t m;
  (void)chi_method_lookup(NULL, "chi.echo", &m);
  return NULL;
}

static void test_last_error_message(void **state) {
  (void)state;
  /* Nothing failed yet on a new thread: empty, not NULL. */
  int empty = 0;
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, fresh_thread_message, &empty), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_true(empty);

  assert_status(CHI_ERR_INVALID, chi_init(NULL, NULL));
  assert_has_message();
  char mine[512];
  snprintf(mine, sizeof mine, "%s", chi_last_error_message());

  /* The message is per thread: another thread's failure leaves ours alone. */
  assert_int_equal(pthread_create(&t, NULL, failing_thread, NULL), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_string_equal(chi_last_error_message(), mine);
}

static void test_config_init(void **state) {
  (void)state;
  chi_config_init(NULL);
  chi_config_t cfg;
  memset(&cfg, 0xAB, sizeof cfg);
  chi_config_init(&cfg);
  assert_int_equal(cfg.struct_size, sizeof cfg);
  assert_null(cfg.config_path);
  assert_int_equal(cfg.mode, CHI_MODE_EMBEDDED);
  assert_null(cfg.server_address);
  assert_int_equal(cfg.num_workers, 0);
  assert_int_equal(cfg.gpus, -1);
}

static void test_init_bad_arguments(void **state) {
  (void)state;
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.gpus = 0;
  assert_status(CHI_ERR_INVALID, chi_init(&cfg, NULL));
  assert_has_message();

  chi_runtime_t *rt = (chi_runtime_t *)&cfg; /* must be reset to NULL on failure */
  chi_config_t bad = cfg;
  bad.struct_size = 0;
  assert_status(CHI_ERR_INVALID, chi_init(&bad, &rt));
  assert_null(rt);
  assert_has_message();

  rt = (chi_runtime_t *)&cfg;
  bad = cfg;
  bad.num_workers = -1;
  assert_status(CHI_ERR_INVALID, chi_init(&bad, &rt));
  assert_null(rt);

  rt = (chi_runtime_t *)&cfg;
  bad = cfg;
  bad.mode = 42;
  assert_status(CHI_ERR_INVALID, chi_init(&bad, &rt));
  assert_null(rt);

  assert_status(CHI_OK, chi_finalize(NULL));
}

static void test_null_arguments(void **state) {
  fixture_t *fx = *state;
  chi_runtime_t *rt = fx->rt;
  chi_method_t m = 0;
  chi_future_t f = 0;
  int done = 0;
  uint64_t region = 0;
  int32_t count = 0;
  char buf[16] = {0};
  void *ptr = NULL;
  chi_mem_ref_t ref = {1, 0, 1};
  chi_dev_context_t ctx;

#define EXPECT_INVALID(call)                 \
  do {                                       \
    assert_status(CHI_ERR_INVALID, (call));  \
    assert_has_message();                    \
  } while (0)

  EXPECT_INVALID(chi_register_handler(NULL, "x.y", noop_handler, NULL, &m));
  EXPECT_INVALID(chi_register_handler(rt, NULL, noop_handler, NULL, &m));
  EXPECT_INVALID(chi_method_lookup(NULL, "chi.echo", &m));
  EXPECT_INVALID(chi_method_lookup(rt, NULL, &m));
  EXPECT_INVALID(chi_method_lookup(rt, "chi.echo", NULL));
  EXPECT_INVALID(chi_submit(NULL, CHI_ROUTE_CPU, CHI_METHOD_ECHO, buf, 1, &f));
  EXPECT_INVALID(chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, buf, 1, NULL));
  EXPECT_INVALID(chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, NULL, 1, &f));
  EXPECT_INVALID(chi_wait(NULL, 1, 0, NULL, 0, NULL));
  EXPECT_INVALID(chi_test(NULL, 1, &done));
  EXPECT_INVALID(chi_release(NULL, 1));
  EXPECT_INVALID(chi_register_gpu_mem(NULL, CHI_ROUTE_CPU, buf, sizeof buf, &region));
  EXPECT_INVALID(chi_register_gpu_mem(rt, CHI_ROUTE_CPU, NULL, sizeof buf, &region));
  EXPECT_INVALID(chi_register_gpu_mem(rt, CHI_ROUTE_CPU, buf, sizeof buf, NULL));
  EXPECT_INVALID(chi_unregister_mem(NULL, 1));
  EXPECT_INVALID(chi_mem_resolve(NULL, &ref, &ptr, NULL));
  EXPECT_INVALID(chi_mem_resolve(rt, NULL, &ptr, NULL));
  EXPECT_INVALID(chi_mem_resolve(rt, &ref, NULL, NULL));
  EXPECT_INVALID(chi_load_module(NULL, "/nonexistent.so"));
  EXPECT_INVALID(chi_load_module(rt, NULL));
  EXPECT_INVALID(chi_gpu_count(NULL, &count));
  EXPECT_INVALID(chi_gpu_count(rt, NULL));
  EXPECT_INVALID(chi_gpu_context(NULL, 0, &ctx));
  EXPECT_INVALID(chi_gpu_pause(NULL, 0));
  EXPECT_INVALID(chi_gpu_resume(NULL, 0));
  EXPECT_INVALID(chi_gpu_set_orchestrator(NULL, -1, NULL));
#undef EXPECT_INVALID

  /* A valid future survives a test call with a NULL done pointer. */
  assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, "x", 1, &f));
  assert_status(CHI_ERR_INVALID, chi_test(rt, f, NULL));
  assert_status(CHI_OK, chi_wait(rt, f, -1, buf, sizeof buf, NULL));
  assert_int_equal(buf[0], 'x');
}

static void test_register_validation(void **state) {
  fixture_t *fx = *state;
  chi_runtime_t *rt = fx->rt;
  chi_method_t m = 0;

  assert_status(CHI_ERR_INVALID, chi_register_handler(rt, "test.nullfn", NULL, NULL, &m));
  assert_has_message();
  assert_status(CHI_ERR_INVALID, chi_register_handler(rt, "", noop_handler, NULL, &m));
  assert_has_message();

  char name[129];
  memset(name, 'n', 128);
  name[128] = '\0';
  assert_status(CHI_ERR_INVALID, chi_register_handler(rt, name, noop_handler, NULL, &m));
  assert_has_message();
  name[127] = '\0'; /* 127 bytes: the longest name allowed */
  chi_method_t longest = 0;
  assert_status(CHI_OK, chi_register_handler(rt, name, noop_handler, NULL, &longest));
  chi_method_t found = 0;
  assert_status(CHI_OK, chi_method_lookup(rt, name, &found));
  assert_int_equal(found, longest);

  const char *bad_names[] = {"tab\there", "new\nline", "bell\a", "del\x7f", "high\x80", "\xff"};
  for (size_t i = 0; i < sizeof bad_names / sizeof bad_names[0]; i++) {
    assert_status(CHI_ERR_INVALID, chi_register_handler(rt, bad_names[i], noop_handler, NULL, &m));
    assert_has_message();
    assert_status(CHI_ERR_NOT_FOUND, chi_method_lookup(rt, bad_names[i], &m));
  }

  chi_method_t first = 0;
  assert_status(CHI_OK, chi_register_handler(rt, "test.dup", noop_handler, NULL, &first));
  assert_status(CHI_ERR_INVALID, chi_register_handler(rt, "test.dup", noop_handler, NULL, &m));
  assert_has_message();
  assert_status(CHI_ERR_INVALID, chi_register_handler(rt, "chi.echo", noop_handler, NULL, &m));
  assert_status(CHI_OK, chi_method_lookup(rt, "test.dup", &found));
  assert_int_equal(found, first);

  /* method may be NULL; ids are distinct and never 0. */
  assert_status(CHI_OK, chi_register_handler(rt, "test.noid", noop_handler, NULL, NULL));
  assert_status(CHI_OK, chi_method_lookup(rt, "test.noid", &found));
  assert_true(found != 0);
  const chi_method_t ids[] = {CHI_METHOD_ECHO, CHI_METHOD_ADD, CHI_METHOD_CHECKSUM, fx->gated,
                              fx->status,      fx->inspect,    fx->overflow,        longest,
                              first,           found};
  const size_t n = sizeof ids / sizeof ids[0];
  for (size_t i = 0; i < n; i++) {
    assert_true(ids[i] != 0);
    for (size_t j = 0; j < i; j++) assert_true(ids[i] != ids[j]);
  }
  assert_int_equal(run_ok(rt, CHI_ROUTE_CPU, found, NULL, 0, NULL, 0), 0);
}

static void test_method_lookup(void **state) {
  fixture_t *fx = *state;
  chi_method_t m = 0;
  assert_status(CHI_OK, chi_method_lookup(fx->rt, "chi.echo", &m));
  assert_int_equal(m, CHI_METHOD_ECHO);
  assert_status(CHI_OK, chi_method_lookup(fx->rt, "chi.add", &m));
  assert_int_equal(m, CHI_METHOD_ADD);
  assert_status(CHI_OK, chi_method_lookup(fx->rt, "chi.checksum", &m));
  assert_int_equal(m, CHI_METHOD_CHECKSUM);
  assert_status(CHI_OK, chi_method_lookup(fx->rt, "test.inspect", &m));
  assert_int_equal(m, fx->inspect);
  assert_status(CHI_ERR_NOT_FOUND, chi_method_lookup(fx->rt, "no.such.method", &m));
  assert_has_message();
  assert_status(CHI_ERR_NOT_FOUND, chi_method_lookup(fx->rt, "chi.ech", &m));
  assert_status(CHI_ERR_NOT_FOUND, chi_method_lookup(fx->rt, "", &m));
}

static void test_submit_validation(void **state) {
  fixture_t *fx = *state;
  chi_runtime_t *rt = fx->rt;
  chi_future_t f = 0;
  const char in[4] = "abc";

  assert_status(CHI_ERR_INVALID, chi_submit(rt, CHI_ROUTE_CPU, 0, in, sizeof in, &f));
  assert_has_message();
  assert_status(CHI_ERR_NOT_FOUND, chi_submit(rt, CHI_ROUTE_CPU, 4000, in, sizeof in, &f));
  assert_has_message();
  assert_status(CHI_ERR_NOT_FOUND, chi_submit(rt, CHI_ROUTE_CPU, UINT32_MAX, in, sizeof in, &f));

  const chi_route_t bad_routes[] = {-4, -100, INT32_MIN};
  for (size_t i = 0; i < sizeof bad_routes / sizeof bad_routes[0]; i++) {
    assert_status(CHI_ERR_INVALID, chi_submit(rt, bad_routes[i], CHI_METHOD_ECHO, in, sizeof in, &f));
    assert_has_message();
  }

  /* This runtime was made with gpus = 0. */
  assert_status(CHI_ERR_NO_DEVICE, chi_submit(rt, CHI_ROUTE_GPU(0), CHI_METHOD_ECHO, in, 1, &f));
  assert_has_message();
  assert_status(CHI_ERR_NO_DEVICE, chi_submit(rt, CHI_ROUTE_GPU_ANY, CHI_METHOD_ECHO, in, 1, &f));
  assert_has_message();

  /* The runtime still works after the refusals. */
  char out[4];
  assert_int_equal(run_ok(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, in, sizeof in, out, sizeof out), 4);
}

static void test_route_local_is_cpu(void **state) {
  fixture_t *fx = *state;
  seen_t s;
  const char in[] = "local";
  assert_int_equal(run_ok(fx->rt, CHI_ROUTE_LOCAL, fx->inspect, in, sizeof in, &s, sizeof s),
                   sizeof s);
  assert_int_equal(s.source, CHI_ROUTE_CPU);
  assert_int_equal(s.method, fx->inspect);
}

static void test_handler_sees_request(void **state) {
  fixture_t *fx = *state;
  seen_t s;
  unsigned char in[300];
  for (size_t i = 0; i < sizeof in; i++) in[i] = (unsigned char)(i * 13 + 1);
  assert_int_equal(run_ok(fx->rt, CHI_ROUTE_CPU, fx->inspect, in, sizeof in, &s, sizeof s),
                   sizeof s);
  assert_int_equal(s.method, fx->inspect);
  assert_int_equal(s.source, CHI_ROUTE_CPU);
  assert_int_equal(s.input_size, sizeof in);
  assert_true(s.output_capacity >= 4096); /* output may be as large as the payload limit */
  assert_int_equal(s.output_size_on_entry, 0);
  assert_int_equal(s.user_data, 0x5eed);
  assert_true(s.input_checksum == chi_test_fnv1a(in, sizeof in));

  /* Empty input: input_size 0, input may be NULL. */
  assert_int_equal(run_ok(fx->rt, CHI_ROUTE_CPU, fx->inspect, NULL, 0, &s, sizeof s), sizeof s);
  assert_int_equal(s.input_size, 0);
  assert_true(s.input_checksum == 0xcbf29ce484222325ull);
}

static void test_futures_are_checked(void **state) {
  fixture_t *fx = *state;
  chi_runtime_t *rt = fx->rt;
  chi_future_t f = 0;
  int done = 0;
  char out[8];

  /* Future 0 and made-up values. */
  assert_status(CHI_ERR_INVALID, chi_wait(rt, 0, -1, out, sizeof out, NULL));
  assert_has_message();
  assert_status(CHI_ERR_INVALID, chi_test(rt, 0, &done));
  assert_status(CHI_ERR_INVALID, chi_release(rt, 0));
  const chi_future_t made_up[] = {1, 2, 0x1000001, 0xDEADBEEF12345678ull, UINT64_MAX,
                                  0x00FFFFFFFFFFFFFFull};
  for (size_t i = 0; i < sizeof made_up / sizeof made_up[0]; i++) {
    assert_status(CHI_ERR_INVALID, chi_wait(rt, made_up[i], -1, out, sizeof out, NULL));
    assert_status(CHI_ERR_INVALID, chi_test(rt, made_up[i], &done));
    assert_status(CHI_ERR_INVALID, chi_release(rt, made_up[i]));
  }

  /* A live future with one bit changed anywhere is not that future (the task
   * is held at the gate so the slot stays in use while we probe). */
  assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, fx->gated, "g", 1, &f));
  for (int bit = 0; bit < 64; bit++) {
    chi_future_t g = f ^ (1ull << bit);
    assert_status(CHI_ERR_INVALID, chi_test(rt, g, &done));
  }
  chi_test_gate_open(&fx->gate);
  assert_status(CHI_OK, chi_wait(rt, f, -1, out, sizeof out, NULL));

  /* Stale after a successful wait: every further use is refused. */
  assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, "abc", 3, &f));
  assert_status(CHI_OK, chi_wait(rt, f, -1, out, sizeof out, NULL));
  assert_status(CHI_ERR_INVALID, chi_wait(rt, f, -1, out, sizeof out, NULL));
  assert_has_message();
  assert_status(CHI_ERR_INVALID, chi_wait(rt, f, 0, out, sizeof out, NULL));
  assert_status(CHI_ERR_INVALID, chi_test(rt, f, &done));
  assert_status(CHI_ERR_INVALID, chi_release(rt, f));

  /* The slot is reused by later tasks: the old future must stay stale. */
  for (int i = 0; i < 64; i++) {
    chi_future_t g = 0;
    assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, "z", 1, &g));
    assert_true(g != f);
    assert_status(CHI_ERR_INVALID, chi_wait(rt, f, 0, out, sizeof out, NULL));
    assert_status(CHI_OK, chi_wait(rt, g, -1, out, sizeof out, NULL));
  }
}

static void test_future_of_another_runtime(void **state) {
  fixture_t *fx = *state;
  chi_runtime_t *other = chi_test_init(1, NULL);
  chi_future_t a = 0, b = 0;
  char out[8];
  size_t sz = 0;
  /* Both runtimes have a task in flight, in what is likely the same slot. */
  assert_status(CHI_OK, chi_submit(fx->rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, "A", 1, &a));
  assert_status(CHI_OK, chi_submit(other, CHI_ROUTE_CPU, CHI_METHOD_ECHO, "B", 1, &b));
  assert_true(a != b);
  assert_status(CHI_ERR_INVALID, chi_wait(other, a, -1, out, sizeof out, &sz));
  assert_has_message();
  assert_status(CHI_ERR_INVALID, chi_test(fx->rt, b, &(int){0}));
  assert_status(CHI_ERR_INVALID, chi_release(fx->rt, b));
  assert_status(CHI_OK, chi_wait(fx->rt, a, -1, out, sizeof out, &sz));
  assert_int_equal(sz, 1);
  assert_int_equal(out[0], 'A');
  assert_status(CHI_OK, chi_wait(other, b, -1, out, sizeof out, &sz));
  assert_int_equal(out[0], 'B');
  assert_status(CHI_OK, chi_finalize(other));
}

static void test_payload_limit(void **state) {
  fixture_t *fx = *state;
  const size_t limit = 4096; /* default max_inline_payload */
  unsigned char *in = malloc(limit + 1);
  unsigned char *out = malloc(limit + 1);
  assert_non_null(in);
  assert_non_null(out);
  for (size_t i = 0; i <= limit; i++) in[i] = (unsigned char)(i * 31 + 7);
  chi_future_t f = 0;
  assert_status(CHI_ERR_TOO_LARGE, chi_submit(fx->rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, in, limit + 1, &f));
  assert_has_message();
  assert_status(CHI_ERR_TOO_LARGE,
                chi_submit(fx->rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, in, SIZE_MAX, &f));
  assert_int_equal(run_ok(fx->rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, in, limit, out, limit + 1), limit);
  assert_memory_equal(in, out, limit);
  free(in);
  free(out);
}

static void test_output_buffer_too_small(void **state) {
  fixture_t *fx = *state;
  chi_runtime_t *rt = fx->rt;
  unsigned char in[100], out[100];
  for (size_t i = 0; i < sizeof in; i++) in[i] = (unsigned char)(255 - i);
  chi_future_t f = 0;
  assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, in, sizeof in, &f));

  size_t sz = 0;
  assert_status(CHI_ERR_TOO_LARGE, chi_wait(rt, f, -1, out, 10, &sz));
  assert_int_equal(sz, sizeof in);
  assert_has_message();
  /* The future stays valid: the task is done and can still be taken. */
  int done = 0;
  assert_status(CHI_OK, chi_test(rt, f, &done));
  assert_int_equal(done, 1);
  sz = 0;
  assert_status(CHI_ERR_TOO_LARGE, chi_wait(rt, f, 0, out, 0, &sz));
  assert_int_equal(sz, sizeof in);
  assert_status(CHI_ERR_TOO_LARGE, chi_wait(rt, f, -1, out, sizeof in - 1, NULL));
  memset(out, 0, sizeof out);
  sz = 0;
  assert_status(CHI_OK, chi_wait(rt, f, -1, out, sizeof out, &sz));
  assert_int_equal(sz, sizeof in);
  assert_memory_equal(in, out, sizeof in);
  assert_status(CHI_ERR_INVALID, chi_wait(rt, f, -1, out, sizeof out, &sz));
}

static void test_output_discarded(void **state) {
  fixture_t *fx = *state;
  chi_runtime_t *rt = fx->rt;
  unsigned char in[64];
  memset(in, 0x5a, sizeof in);
  chi_future_t f = 0;
  assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, in, sizeof in, &f));
  size_t sz = 0;
  assert_status(CHI_OK, chi_wait(rt, f, -1, NULL, 0, &sz));
  assert_int_equal(sz, sizeof in);
  assert_status(CHI_ERR_INVALID, chi_test(rt, f, &(int){0}));

  assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, in, sizeof in, &f));
  assert_status(CHI_OK, chi_wait(rt, f, -1, NULL, 0, NULL));

  /* Empty output into a NULL buffer of capacity 0 is a plain success. */
  assert_int_equal(run_ok(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, NULL, 0, NULL, 0), 0);
}

static void test_timeout_and_polling(void **state) {
  fixture_t *fx = *state;
  chi_runtime_t *rt = fx->rt;
  const char in[] = "held at the gate";
  char out[64];
  size_t sz = 0;
  int done = -1;
  chi_future_t f = 0;
  assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, fx->gated, in, sizeof in, &f));
  chi_test_gate_await(&fx->gate, 1);

  assert_status(CHI_ERR_TIMEOUT, chi_wait(rt, f, 1000000, out, sizeof out, &sz));
  assert_has_message();
  assert_status(CHI_ERR_TIMEOUT, chi_wait(rt, f, 0, out, sizeof out, &sz));
  assert_status(CHI_ERR_TIMEOUT, chi_wait(rt, f, 1, NULL, 0, NULL));
  assert_status(CHI_OK, chi_test(rt, f, &done));
  assert_int_equal(done, 0);
  /* A too-small buffer on an unfinished task is a timeout, not a size error. */
  assert_status(CHI_ERR_TIMEOUT, chi_wait(rt, f, 0, out, 1, &sz));

  chi_test_gate_open(&fx->gate);
  memset(out, 0, sizeof out);
  assert_status(CHI_OK, chi_wait(rt, f, -1, out, sizeof out, &sz));
  assert_int_equal(sz, sizeof in);
  assert_string_equal(out, in);
  assert_int_equal(atomic_load(&fx->gated_runs), 1);

  /* chi_test turns to 1 once the task ran; then a zero-timeout wait takes it. */
  assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, in, sizeof in, &f));
  do {
    assert_status(CHI_OK, chi_test(rt, f, &done));
    if (!done) sched_yield();
  } while (!done);
  assert_status(CHI_OK, chi_test(rt, f, &done));
  assert_int_equal(done, 1);
  memset(out, 0, sizeof out);
  assert_status(CHI_OK, chi_wait(rt, f, 0, out, sizeof out, &sz));
  assert_string_equal(out, in);

  /* Polling with timeout 0 until the result comes. */
  assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, "p", 1, &f));
  chi_status_t s;
  while ((s = chi_wait(rt, f, 0, out, sizeof out, &sz)) == CHI_ERR_TIMEOUT) sched_yield();
  assert_status(CHI_OK, s);
  assert_int_equal(sz, 1);
  assert_int_equal(out[0], 'p');
}

static void test_release(void **state) {
  fixture_t *fx = *state;
  chi_runtime_t *rt = fx->rt;
  chi_future_t f = 0;
  char out[8];

  /* A finished task. */
  assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, "r", 1, &f));
  int done = 0;
  do {
    assert_status(CHI_OK, chi_test(rt, f, &done));
  } while (!done);
  assert_status(CHI_OK, chi_release(rt, f));
  assert_status(CHI_ERR_INVALID, chi_wait(rt, f, -1, out, sizeof out, NULL));
  assert_has_message();
  assert_status(CHI_ERR_INVALID, chi_release(rt, f));

  /* A task that has not run yet or is running: it still runs once. */
  assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, fx->gated, "a", 1, &f));
  chi_test_gate_await(&fx->gate, 1);
  assert_status(CHI_OK, chi_release(rt, f));
  assert_status(CHI_ERR_INVALID, chi_test(rt, f, &done));
  assert_status(CHI_ERR_INVALID, chi_wait(rt, f, 0, out, sizeof out, NULL));
  chi_test_gate_open(&fx->gate);
  /* The released slot comes back: a long run of tasks does not exhaust slots. */
  for (int i = 0; i < 3000; i++) {
    chi_future_t g = 0;
    assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, "q", 1, &g));
    assert_status(CHI_OK, chi_release(rt, g));
  }
  assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, "w", 1, &f));
  assert_status(CHI_OK, chi_wait(rt, f, -1, out, sizeof out, NULL));
  assert_int_equal(out[0], 'w');
}

static void test_release_running_then_finalize(void **state) {
  (void)state;
  fixture_t fx;
  memset(&fx, 0, sizeof fx);
  chi_test_gate_init(&fx.gate);
  atomic_init(&fx.gated_runs, 0);
  fx.rt = chi_test_init(2, NULL);
  assert_status(CHI_OK, chi_register_handler(fx.rt, "test.gated", gated_handler, &fx, &fx.gated));
  chi_future_t f[4];
  for (int i = 0; i < 4; i++)
    assert_status(CHI_OK, chi_submit(fx.rt, CHI_ROUTE_CPU, fx.gated, "x", 1, &f[i]));
  chi_test_gate_await(&fx.gate, 2); /* two running, two queued */
  for (int i = 0; i < 4; i++) assert_status(CHI_OK, chi_release(fx.rt, f[i]));
  chi_test_gate_open(&fx.gate);
  assert_status(CHI_OK, chi_finalize(fx.rt));
  assert_int_equal(atomic_load(&fx.gated_runs), 4);
  chi_test_gate_destroy(&fx.gate);
}

static void test_handler_statuses(void **state) {
  fixture_t *fx = *state;
  chi_runtime_t *rt = fx->rt;
  /* Handler codes reach the waiter unchanged. */
  assert_status(-1234, run_status(rt, fx->status, -1234));
  assert_status(CHI_ERR_USER_BASE, run_status(rt, fx->status, CHI_ERR_USER_BASE));
  assert_status(INT32_MIN, run_status(rt, fx->status, INT32_MIN));
  assert_status(CHI_ERR_NOT_FOUND, run_status(rt, fx->status, CHI_ERR_NOT_FOUND));
  assert_status(CHI_ERR_PERMISSION, run_status(rt, fx->status, CHI_ERR_PERMISSION));
  assert_status(CHI_ERR_AGAIN, run_status(rt, fx->status, CHI_ERR_AGAIN));
  assert_status(CHI_OK, run_status(rt, fx->status, CHI_OK));
  /* A positive return is a broken handler. */
  assert_status(CHI_ERR_INTERNAL, run_status(rt, fx->status, 1));
  assert_status(CHI_ERR_INTERNAL, run_status(rt, fx->status, INT32_MAX));

  /* A handler that ran is consumed by the wait that reported its error. */
  chi_future_t f = 0;
  int32_t code = -1234;
  assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, fx->status, &code, sizeof code, &f));
  assert_status(-1234, chi_wait(rt, f, -1, NULL, 0, NULL));
  assert_status(CHI_ERR_INVALID, chi_wait(rt, f, -1, NULL, 0, NULL));

  /* output_size over capacity is caught, not copied. */
  char out[16];
  assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, fx->overflow, NULL, 0, &f));
  assert_status(CHI_ERR_INTERNAL, chi_wait(rt, f, -1, out, sizeof out, NULL));
  assert_has_message();
  assert_status(CHI_ERR_INVALID, chi_test(rt, f, &(int){0}));
}

static uint64_t add_u64(chi_runtime_t *rt, chi_route_t route, uint64_t a, uint64_t b) {
  unsigned char in[16];
  for (int i = 0; i < 8; i++) {
    in[i] = (unsigned char)(a >> (8 * i));
    in[8 + i] = (unsigned char)(b >> (8 * i));
  }
  unsigned char out[16];
  assert_int_equal(run_ok(rt, route, CHI_METHOD_ADD, in, sizeof in, out, sizeof out), 8);
  uint64_t r = 0;
  for (int i = 0; i < 8; i++) r |= (uint64_t)out[i] << (8 * i);
  return r;
}

static uint64_t checksum(chi_runtime_t *rt, const void *in, size_t size) {
  uint64_t r = 0;
  assert_int_equal(run_ok(rt, CHI_ROUTE_CPU, CHI_METHOD_CHECKSUM, in, size, &r, sizeof r), 8);
  return r;
}

static void test_builtins(void **state) {
  fixture_t *fx = *state;
  chi_runtime_t *rt = fx->rt;

  assert_true(add_u64(rt, CHI_ROUTE_CPU, 2, 3) == 5);
  assert_true(add_u64(rt, CHI_ROUTE_LOCAL, 0x123456789ull, 0x1000000000ull) == 0x1123456789ull);
  assert_true(add_u64(rt, CHI_ROUTE_CPU, UINT64_MAX, 2) == 1); /* wraps */
  chi_future_t f = 0;
  assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ADD, "12345678", 8, &f));
  chi_status_t s = chi_wait(rt, f, -1, NULL, 0, NULL);
  assert_true(s < 0); /* wrong input size is an error, whichever */

  unsigned char in[4096], out[4096];
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  const size_t sizes[] = {0, 1, 7, 8, 63, 1000, 4096};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    for (size_t j = 0; j < sizes[i]; j++) in[j] = (unsigned char)chi_test_rand(&seed);
    memset(out, 0, sizeof out);
    assert_int_equal(run_ok(rt, CHI_ROUTE_LOCAL, CHI_METHOD_ECHO, in, sizes[i], out, sizeof out),
                     sizes[i]);
    assert_memory_equal(in, out, sizes[i]);
    assert_true(checksum(rt, in, sizes[i]) == chi_test_fnv1a(in, sizes[i]));
  }
  /* Published FNV-1a 64 vectors. */
  assert_true(checksum(rt, "", 0) == 0xcbf29ce484222325ull);
  assert_true(checksum(rt, "a", 1) == 0xaf63dc4c8601ec8cull);
  assert_true(checksum(rt, "foobar", 6) == 0x85944171f73967e8ull);
}

static void test_no_gpu(void **state) {
  fixture_t *fx = *state;
  chi_runtime_t *rt = fx->rt;
  int32_t count = -1;
  assert_status(CHI_OK, chi_gpu_count(rt, &count));
  assert_int_equal(count, 0);
  chi_dev_context_t ctx;
  assert_status(CHI_ERR_NO_DEVICE, chi_gpu_context(rt, 0, &ctx));
  assert_has_message();
  assert_status(CHI_ERR_NO_DEVICE, chi_gpu_pause(rt, 0));
  assert_has_message();
  assert_status(CHI_ERR_NO_DEVICE, chi_gpu_resume(rt, 0));
  assert_has_message();
  uint64_t region = 0;
  char buf[8];
  assert_status(CHI_ERR_NO_DEVICE, chi_register_gpu_mem(rt, 0, buf, sizeof buf, &region));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_version),
      cmocka_unit_test(test_status_strings),
      cmocka_unit_test(test_last_error_message),
      cmocka_unit_test(test_config_init),
      cmocka_unit_test(test_init_bad_arguments),
      cmocka_unit_test_setup_teardown(test_null_arguments, setup, teardown),
      cmocka_unit_test_setup_teardown(test_register_validation, setup, teardown),
      cmocka_unit_test_setup_teardown(test_method_lookup, setup, teardown),
      cmocka_unit_test_setup_teardown(test_submit_validation, setup, teardown),
      cmocka_unit_test_setup_teardown(test_route_local_is_cpu, setup, teardown),
      cmocka_unit_test_setup_teardown(test_handler_sees_request, setup, teardown),
      cmocka_unit_test_setup_teardown(test_futures_are_checked, setup, teardown),
      cmocka_unit_test_setup_teardown(test_future_of_another_runtime, setup, teardown),
      cmocka_unit_test_setup_teardown(test_payload_limit, setup, teardown),
      cmocka_unit_test_setup_teardown(test_output_buffer_too_small, setup, teardown),
      cmocka_unit_test_setup_teardown(test_output_discarded, setup, teardown),
      cmocka_unit_test_setup_teardown(test_timeout_and_polling, setup, teardown),
      cmocka_unit_test_setup_teardown(test_release, setup, teardown),
      cmocka_unit_test(test_release_running_then_finalize),
      cmocka_unit_test_setup_teardown(test_handler_statuses, setup, teardown),
      cmocka_unit_test_setup_teardown(test_builtins, setup, teardown),
      cmocka_unit_test_setup_teardown(test_no_gpu, setup, teardown),
  };
  return chi_test_run("api", tests);
}

/*
 * Helpers shared by the core test programs: status assertions that print the
 * status text and the library's message, a scale factor for iteration counts,
 * temporary YAML files, a gate that a test opens to release blocked handlers,
 * and the reference FNV-1a.  Include it first: it pulls in cmocka.
 */
#ifndef CHI_TESTS_COMMON_H
#define CHI_TESTS_COMMON_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "chimaera.h"

#define CHI_TEST_UNUSED __attribute__((unused))

/* Fails the test with both statuses spelled out and the thread's last message. */
#define assert_status(expected, actual)                                                     \
  do {                                                                                      \
    chi_status_t chi_e_ = (expected), chi_a_ = (actual);                                    \
    if (chi_e_ != chi_a_)                                                                   \
      fail_msg("%s: got %d (%s), want %d (%s); last error: '%s'", #actual, (int)chi_a_,     \
               chi_status_string(chi_a_), (int)chi_e_, chi_status_string(chi_e_),          \
               chi_last_error_message());                                                   \
  } while (0)

/* After a failing call: the thread's message must say something. */
#define assert_has_message()                                                               \
  do {                                                                                      \
    const char *chi_m_ = chi_last_error_message();                                          \
    assert_non_null(chi_m_);                                                                \
    assert_true(chi_m_[0] != '\0');                                                         \
  } while (0)

/* Iteration counts are multiplied by $CHI_TEST_SCALE (default 1; the sanitizer
 * builds set it lower), never below 1. */
static CHI_TEST_UNUSED long chi_test_scaled(long n) {
  const char *s = getenv("CHI_TEST_SCALE");
  double f = s ? atof(s) : 1.0;
  if (f <= 0) f = 1.0;
  long r = (long)((double)n * f);
  return r < 1 ? 1 : r;
}

/* A test must not pick up the settings of whoever runs it: drop CHI_* from the
 * environment, except CHI_TEST_*, CHI_LOG_LEVEL and the three that point a
 * run at a server (CHI_MODE, CHI_SERVER_ADDRESS, CHI_RUNTIME_DIR: the client
 * variants set them, see tests/run_with_server.sh). */
static CHI_TEST_UNUSED void chi_test_clean_env(void) {
  extern char **environ;
  for (;;) {
    char name[256] = {0};
    for (char **e = environ; e && *e; e++) {
      if (strncmp(*e, "CHI_", 4) != 0 || strncmp(*e, "CHI_TEST_", 9) == 0 ||
          strncmp(*e, "CHI_LOG_LEVEL=", 14) == 0 || strncmp(*e, "CHI_MODE=", 9) == 0 ||
          strncmp(*e, "CHI_SERVER_ADDRESS=", 19) == 0 || strncmp(*e, "CHI_RUNTIME_DIR=", 16) == 0)
        continue;
      const char *eq = strchr(*e, '=');
      size_t len = eq ? (size_t)(eq - *e) : strlen(*e);
      if (len >= sizeof name) len = sizeof name - 1;
      memcpy(name, *e, len);
      break;
    }
    if (!name[0]) return;
    unsetenv(name);
  }
}

/* True when the program runs as a client of a server (the *_client ctest
 * variants set CHI_MODE=client); embedded-only cases skip with a reason. */
static CHI_TEST_UNUSED int client_mode(void) {
  const char *m = getenv("CHI_MODE");
  return m && strcasecmp(m, "client") == 0;
}
#define SKIP_IN_CLIENT_MODE(reason)                          \
  do {                                                       \
    if (client_mode()) {                                     \
      print_message("skipped in client mode: %s\n", reason); \
      skip();                                                \
    }                                                        \
  } while (0)

/* Runs a group; $CHI_TEST_FILTER (a cmocka pattern such as "test_nested*")
 * picks the tests to run. */
#define chi_test_run(name, tests)                                          \
  (chi_test_clean_env(),                                                   \
   getenv("CHI_TEST_FILTER") ? cmocka_set_test_filter(getenv("CHI_TEST_FILTER")) : (void)0, \
   cmocka_run_group_tests_name(name, tests, NULL, NULL))

/* Writes text to a new file $TMPDIR/chi-test-XXXXXX.yaml; path receives its
 * name (the caller unlinks it). */
static CHI_TEST_UNUSED void chi_test_write_yaml(const char *text, char *path, size_t cap) {
  const char *dir = getenv("TMPDIR");
  if (!dir || !dir[0]) dir = "/tmp";
  int n = snprintf(path, cap, "%s/chi-test-XXXXXX.yaml", dir);
  assert_true(n > 0 && (size_t)n < cap);
  int fd = mkstemps(path, 5);
  assert_true(fd >= 0);
  size_t len = strlen(text);
  assert_true(write(fd, text, len) == (ssize_t)len);
  assert_int_equal(close(fd), 0);
}

/* An embedded runtime without GPUs, num_workers workers (0: default), and an
 * optional config file. */
static CHI_TEST_UNUSED chi_runtime_t *chi_test_init(int32_t num_workers, const char *config_path) {
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.gpus = 0;
  cfg.num_workers = num_workers;
  cfg.config_path = config_path;
  chi_runtime_t *rt = NULL;
  assert_status(CHI_OK, chi_init(&cfg, &rt));
  assert_non_null(rt);
  return rt;
}

/* Same, with the config given as YAML text. */
static CHI_TEST_UNUSED chi_runtime_t *chi_test_init_yaml(int32_t num_workers, const char *yaml) {
  char path[512];
  chi_test_write_yaml(yaml, path, sizeof path);
  chi_runtime_t *rt = chi_test_init(num_workers, path);
  unlink(path);
  return rt;
}

static CHI_TEST_UNUSED uint64_t chi_test_fnv1a(const void *data, size_t size) {
  const unsigned char *p = (const unsigned char *)data;
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < size; i++) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

/* xorshift64*: cheap, per-thread random bytes. */
static CHI_TEST_UNUSED uint64_t chi_test_rand(uint64_t *state) {
  uint64_t x = *state;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *state = x;
  return x * 0x2545F4914F6CDD1Dull;
}

/* A gate that blocked handlers wait on until the test opens it; `entered`
 * counts the handlers that reached it, so a test can wait until a task is
 * really running. */
typedef struct chi_test_gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int open;
  int entered;
} chi_test_gate_t;

static CHI_TEST_UNUSED void chi_test_gate_init(chi_test_gate_t *g) {
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->cv, NULL);
  g->open = 0;
  g->entered = 0;
}

static CHI_TEST_UNUSED void chi_test_gate_destroy(chi_test_gate_t *g) {
  pthread_cond_destroy(&g->cv);
  pthread_mutex_destroy(&g->mu);
}

/* Called by a handler: counts itself in, then blocks until the gate opens. */
static CHI_TEST_UNUSED void chi_test_gate_pass(chi_test_gate_t *g) {
  pthread_mutex_lock(&g->mu);
  g->entered++;
  pthread_cond_broadcast(&g->cv);
  while (!g->open) pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
}

/* Called by the test: blocks until n handlers have reached the gate. */
static CHI_TEST_UNUSED void chi_test_gate_await(chi_test_gate_t *g, int n) {
  pthread_mutex_lock(&g->mu);
  while (g->entered < n) pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
}

static CHI_TEST_UNUSED void chi_test_gate_open(chi_test_gate_t *g) {
  pthread_mutex_lock(&g->mu);
  g->open = 1;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

#endif /* CHI_TESTS_COMMON_H */

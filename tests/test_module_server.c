/* The example module (examples/module) served by chimaera-server to a client
 * process.  Each test runs its own server as a child, with the module in its
 * config and a private CHI_RUNTIME_DIR; the client connects with no address
 * (this user's default server), looks "example.scale" up by name and submits
 * from several threads, checking every result.  A server killed with SIGKILL
 * turns pending and new calls into CHI_ERR_DISCONNECTED; a module that fails
 * stops the server's start-up with a message naming it.
 *
 * With --gpu the same runs through CHI_ROUTE_GPU_ANY to the module's GPU
 * handler (exit 77 when the server drives no GPU). */
#include "common.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#if !defined(CHI_SERVER_PATH) || !defined(EXAMPLE_MODULE_PATH) || !defined(FAIL_MODULE_PATH)
#error "CMake passes CHI_SERVER_PATH, EXAMPLE_MODULE_PATH and FAIL_MODULE_PATH"
#endif

#define LOCAL_METHOD_BIT 0x40000000u /* a client's own handlers (docs/server.md) */
#define MAX_VALUES 16                /* values per task: 0 .. MAX_VALUES */
#define WINDOW 8                     /* tasks in flight per thread */

static char g_dir[512]; /* this test's private runtime directory */

/* ------------------------------------------------------------ the server */

typedef struct server {
  pid_t pid;  /* 0 once reaped */
  int status; /* wait status once reaped */
  char yaml[600];
  char log[600];
} server_t;

static int setup_dir(void **state) {
  (void)state;
  const char *tmp = getenv("TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/chi-modsrv-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
  if (!mkdtemp(g_dir)) return -1; /* mode 0700 */
  return setenv("CHI_RUNTIME_DIR", g_dir, 1);
}

static int teardown_dir(void **state) {
  (void)state;
  DIR *d = opendir(g_dir);
  if (d) {
    struct dirent *e;
    char path[1024];
    while ((e = readdir(d)) != NULL) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      snprintf(path, sizeof path, "%s/%s", g_dir, e->d_name);
      unlink(path);
    }
    closedir(d);
  }
  rmdir(g_dir);
  unsetenv("CHI_RUNTIME_DIR");
  return 0;
}

/* Files in the runtime directory other than the test's own yaml and log:
 * what a server left behind. */
static int endpoint_files(void) {
  DIR *d = opendir(g_dir);
  assert_non_null(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !strcmp(e->d_name, "server.yaml") ||
        !strcmp(e->d_name, "server.log"))
      continue;
    n++;
  }
  closedir(d);
  return n;
}

static void read_log(const server_t *s, char *buf, size_t cap) {
  buf[0] = '\0';
  FILE *f = fopen(s->log, "r");
  if (!f) return;
  size_t n = fread(buf, 1, cap - 1, f);
  buf[n] = '\0';
  fclose(f);
}

/* Starts chimaera-server --config (yaml) as a child, stdout and stderr to
 * the log, on the default address of this test's runtime directory. */
static void server_spawn(server_t *s, const char *yaml) {
  memset(s, 0, sizeof *s);
  snprintf(s->yaml, sizeof s->yaml, "%s/server.yaml", g_dir);
  snprintf(s->log, sizeof s->log, "%s/server.log", g_dir);
  FILE *f = fopen(s->yaml, "w");
  assert_non_null(f);
  assert_true(fputs(yaml, f) >= 0);
  assert_int_equal(fclose(f), 0);
  s->pid = fork();
  assert_true(s->pid >= 0);
  if (s->pid == 0) {
    int fd = open(s->log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0) _exit(126);
    execl(CHI_SERVER_PATH, "chimaera-server", "--config", s->yaml, "--workers", "2", (char *)NULL);
    _exit(127);
  }
}

/* Waits until the server answers a ping (1) or has exited (0, reaped).  No
 * bound of its own: ctest's timeout is the bound. */
static int server_ready(server_t *s) {
  char reply[256];
  for (;;) {
    if (chi_server_query(NULL, "ping", reply, sizeof reply, NULL) == CHI_OK) return 1;
    if (waitpid(s->pid, &s->status, WNOHANG) == s->pid) {
      s->pid = 0;
      return 0;
    }
    usleep(20 * 1000);
  }
}

static void server_start(server_t *s, const char *yaml) {
  server_spawn(s, yaml);
  if (!server_ready(s)) {
    char log[4096];
    read_log(s, log, sizeof log);
    fail_msg("chimaera-server exited (wait status %#x) before answering:\n%s", s->status, log);
  }
}

/* SIGTERM: the server stops cleanly, exits 0 and removes its endpoint. */
static void server_stop(server_t *s) {
  assert_int_equal(kill(s->pid, SIGTERM), 0);
  assert_int_equal(waitpid(s->pid, &s->status, 0), s->pid);
  s->pid = 0;
  assert_true(WIFEXITED(s->status));
  assert_int_equal(WEXITSTATUS(s->status), 0);
  assert_status(CHI_ERR_DISCONNECTED, chi_server_query(NULL, "ping", NULL, 0, NULL));
  assert_int_equal(endpoint_files(), 0);
}

static void server_kill(server_t *s) {
  assert_int_equal(kill(s->pid, SIGKILL), 0);
  assert_int_equal(waitpid(s->pid, &s->status, 0), s->pid);
  s->pid = 0;
  assert_true(WIFSIGNALED(s->status));
}

/* The config of a server that loads the example module; gpus: -1 all, 0 none. */
static void module_yaml(char *buf, size_t cap, const char *modules_path, int gpus) {
  int n = snprintf(buf, cap, "gpu:\n  devices: %d\nmodules:\n  - \"%s\"\n", gpus, modules_path);
  assert_true(n > 0 && (size_t)n < cap);
}

/* ------------------------------------------------------------- the client */

static chi_runtime_t *client_connect(void) {
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.mode = CHI_MODE_CLIENT; /* no server_address: the default server */
  chi_runtime_t *rt = NULL;
  assert_status(CHI_OK, chi_init(&cfg, &rt));
  assert_non_null(rt);
  return rt;
}

static chi_method_t lookup_scale(chi_runtime_t *rt) {
  chi_method_t m = 0;
  assert_status(CHI_OK, chi_method_lookup(rt, "example.scale", &m));
  assert_true(m != 0);
  assert_true((m & LOCAL_METHOD_BIT) == 0); /* the server's method, not a local one */
  return m;
}

/* Task k of submitter `id`: the factor, then k % (MAX_VALUES + 1) values.
 * Returns the input size. */
static size_t make_task(int id, long k, float in[1 + MAX_VALUES]) {
  const int n = (int)(k % (MAX_VALUES + 1));
  in[0] = 0.5f + (float)(k % 7);
  for (int i = 0; i < n; i++) in[1 + i] = (float)((id * 7919 + k * 31 + i) % 2048) - 1000.25f;
  return sizeof(float) * (size_t)(1 + n);
}

/* Right output of a task: n products, bit for bit (one IEEE multiply each). */
static int task_right(const float *in, size_t in_size, const float *out, size_t out_size) {
  const size_t n = in_size / sizeof(float) - 1;
  if (out_size != n * sizeof(float)) return 0;
  for (size_t i = 0; i < n; i++) {
    const float want = in[0] * in[1 + i];
    if (memcmp(&want, &out[i], sizeof want) != 0) return 0;
  }
  return 1;
}

typedef struct submitter {
  chi_runtime_t *rt;
  chi_method_t method;
  chi_route_t route;
  int id;
  long tasks;
  long checked;      /* results found right */
  char failure[256]; /* first failure, empty if none */
} submitter_t;

/* Threads record failures (cmocka asserts belong to the test's thread). */
static void *submit_loop(void *arg) {
  submitter_t *j = arg;
  float in[WINDOW][1 + MAX_VALUES], out[MAX_VALUES];
  size_t in_size[WINDOW];
  chi_future_t f[WINDOW];
  for (long done = 0; done < j->tasks;) {
    int k = 0;
    for (; k < WINDOW && done + k < j->tasks; k++) {
      in_size[k] = make_task(j->id, done + k, in[k]);
      chi_status_t s = chi_submit(j->rt, j->route, j->method, in[k], in_size[k], &f[k]);
      if (s != CHI_OK) {
        snprintf(j->failure, sizeof j->failure, "chi_submit: %s: %s", chi_status_string(s),
                 chi_last_error_message());
        for (int q = 0; q < k; q++) chi_release(j->rt, f[q]);
        return NULL;
      }
    }
    for (int q = 0; q < k; q++) {
      size_t out_size = 0;
      chi_status_t s = chi_wait(j->rt, f[q], -1, out, sizeof out, &out_size);
      if (s != CHI_OK) {
        if (!j->failure[0])
          snprintf(j->failure, sizeof j->failure, "chi_wait: %s: %s", chi_status_string(s),
                   chi_last_error_message());
      } else if (!task_right(in[q], in_size[q], out, out_size)) {
        if (!j->failure[0])
          snprintf(j->failure, sizeof j->failure, "task %ld of thread %d: wrong result", done + q,
                   j->id);
      } else {
        j->checked++;
      }
    }
    if (j->failure[0]) return NULL;
    done += k;
  }
  return NULL;
}

/* Runs `threads` submitters, routes[i % nroutes] each, and checks that every
 * result came back right. */
static void submit_from_threads(chi_runtime_t *rt, chi_method_t m, const chi_route_t *routes,
                                int nroutes, int threads, long tasks) {
  submitter_t jobs[8];
  pthread_t tids[8];
  assert_true(threads <= 8);
  for (int i = 0; i < threads; i++) {
    memset(&jobs[i], 0, sizeof jobs[i]);
    jobs[i] = (submitter_t){rt, m, routes[i % nroutes], i, tasks, 0, ""};
    assert_int_equal(pthread_create(&tids[i], NULL, submit_loop, &jobs[i]), 0);
  }
  for (int i = 0; i < threads; i++) assert_int_equal(pthread_join(tids[i], NULL), 0);
  for (int i = 0; i < threads; i++) {
    if (jobs[i].failure[0])
      fail_msg("thread %d (route %d): %s", i, (int)jobs[i].route, jobs[i].failure);
    assert_int_equal(jobs[i].checked, tasks);
  }
}

typedef struct waiter {
  chi_runtime_t *rt;
  chi_future_t future;
  chi_status_t status;
} waiter_t;

static void *wait_forever(void *arg) {
  waiter_t *w = arg;
  float out[MAX_VALUES];
  w->status = chi_wait(w->rt, w->future, -1, out, sizeof out, NULL);
  return NULL;
}

/* The server is frozen (SIGSTOP) with tasks of this client queued, threads
 * wait for them without a bound, and the server is killed: every waiter,
 * and every later call, gets CHI_ERR_DISCONNECTED. */
static void kill_with_tasks_pending(server_t *srv, chi_runtime_t *rt, chi_method_t m,
                                    chi_route_t route) {
  enum { kPending = 6 };
  assert_int_equal(kill(srv->pid, SIGSTOP), 0);
  int st = 0;
  assert_int_equal(waitpid(srv->pid, &st, WUNTRACED), srv->pid);
  assert_true(WIFSTOPPED(st));

  float in[1 + MAX_VALUES];
  const size_t in_size = make_task(0, 5, in);
  waiter_t w[kPending];
  pthread_t tids[kPending];
  for (int i = 0; i < kPending; i++) {
    w[i] = (waiter_t){rt, 0, CHI_OK};
    assert_status(CHI_OK, chi_submit(rt, route, m, in, in_size, &w[i].future));
    assert_int_equal(pthread_create(&tids[i], NULL, wait_forever, &w[i]), 0);
  }
  server_kill(srv);
  for (int i = 0; i < kPending; i++) {
    assert_int_equal(pthread_join(tids[i], NULL), 0);
    assert_status(CHI_ERR_DISCONNECTED, w[i].status);
  }
  chi_future_t f = 0;
  assert_status(CHI_ERR_DISCONNECTED, chi_submit(rt, route, m, in, in_size, &f));
  assert_has_message();
  chi_stats_t stats;
  memset(&stats, 0, sizeof stats);
  stats.struct_size = sizeof stats;
  assert_status(CHI_ERR_DISCONNECTED, chi_stats(rt, &stats));
  assert_status(CHI_OK, chi_finalize(rt));
}

/* ----------------------------------------------------------- CPU tests */

static void test_scale_from_threads(void **state) {
  (void)state;
  char yaml[1024];
  module_yaml(yaml, sizeof yaml, EXAMPLE_MODULE_PATH, 0);
  server_t srv;
  server_start(&srv, yaml);
  chi_runtime_t *rt = client_connect();
  const chi_method_t m = lookup_scale(rt);
  const chi_route_t routes[] = {CHI_ROUTE_CPU, CHI_ROUTE_LOCAL};
  submit_from_threads(rt, m, routes, 2, 4, chi_test_scaled(2000));

  /* A malformed input gets the handler's status, and the session goes on. */
  chi_future_t f = 0;
  assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, m, "abc", 3, &f));
  assert_status(CHI_ERR_INVALID, chi_wait(rt, f, -1, NULL, 0, NULL));
  submit_from_threads(rt, m, routes, 1, 1, 10);

  assert_status(CHI_OK, chi_finalize(rt));
  server_stop(&srv);
}

static void test_server_killed(void **state) {
  (void)state;
  char yaml[1024];
  module_yaml(yaml, sizeof yaml, EXAMPLE_MODULE_PATH, 0);
  server_t srv;
  server_start(&srv, yaml);
  chi_runtime_t *rt = client_connect();
  const chi_method_t m = lookup_scale(rt);
  const chi_route_t cpu = CHI_ROUTE_CPU;
  submit_from_threads(rt, m, &cpu, 1, 2, 100);
  kill_with_tasks_pending(&srv, rt, m, CHI_ROUTE_CPU);
}

/* The module's init fails, or the module cannot be loaded at all (also after
 * a good module): the server does not start, exits non-zero, names the
 * module on stderr and leaves no endpoint behind. */
static void test_failing_module_stops_startup(void **state) {
  (void)state;
  const char *missing = "/nonexistent/libchimaera_missing_module.so";
  struct {
    const char *yaml_modules; /* the modules: list */
    const char *named;        /* the module the message must name */
  } cases[] = {
      {"  - \"" FAIL_MODULE_PATH "\"\n", FAIL_MODULE_PATH},
      {"  - \"/nonexistent/libchimaera_missing_module.so\"\n", missing},
      {"  - \"" EXAMPLE_MODULE_PATH "\"\n  - \"" FAIL_MODULE_PATH "\"\n", FAIL_MODULE_PATH},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char yaml[2048];
    snprintf(yaml, sizeof yaml, "gpu:\n  devices: 0\nmodules:\n%s", cases[i].yaml_modules);
    server_t srv;
    server_spawn(&srv, yaml);
    if (server_ready(&srv)) {
      kill(srv.pid, SIGKILL);
      waitpid(srv.pid, NULL, 0);
      fail_msg("chimaera-server started with a failing module:\n%s", yaml);
    }
    char log[4096];
    read_log(&srv, log, sizeof log);
    if (!WIFEXITED(srv.status) || WEXITSTATUS(srv.status) == 0)
      fail_msg("chimaera-server: wait status %#x, want a non-zero exit; log:\n%s", srv.status, log);
    if (!strstr(log, cases[i].named))
      fail_msg("chimaera-server's message does not name '%s':\n%s", cases[i].named, log);
    assert_status(CHI_ERR_DISCONNECTED, chi_server_query(NULL, "ping", NULL, 0, NULL));
    assert_int_equal(endpoint_files(), 0);
  }
}

/* ----------------------------------------------------------- GPU tests */

static void test_gpu_scale_from_threads(void **state) {
  (void)state;
  char yaml[1024];
  module_yaml(yaml, sizeof yaml, EXAMPLE_MODULE_PATH, -1);
  server_t srv;
  server_start(&srv, yaml);
  chi_runtime_t *rt = client_connect();
  int32_t gpus = 0;
  assert_status(CHI_OK, chi_gpu_count(rt, &gpus));
  assert_true(gpus > 0);
  const chi_method_t m = lookup_scale(rt);
  /* One method id, two handlers: GPU threads and CPU threads at once. */
  const chi_route_t routes[] = {CHI_ROUTE_GPU_ANY, CHI_ROUTE_CPU, CHI_ROUTE_GPU(0)};
  submit_from_threads(rt, m, routes, 3, 6, chi_test_scaled(2000));
  assert_status(CHI_OK, chi_finalize(rt));
  server_stop(&srv);
}

static void test_gpu_server_killed(void **state) {
  (void)state;
  char yaml[1024];
  module_yaml(yaml, sizeof yaml, EXAMPLE_MODULE_PATH, -1);
  server_t srv;
  server_start(&srv, yaml);
  chi_runtime_t *rt = client_connect();
  const chi_method_t m = lookup_scale(rt);
  const chi_route_t gpu = CHI_ROUTE_GPU_ANY;
  submit_from_threads(rt, m, &gpu, 1, 2, 100);
  kill_with_tasks_pending(&srv, rt, m, CHI_ROUTE_GPU_ANY);
}

/* Whether a server started here drives a GPU: -1 when it could not be
 * asked (the GPU tests then run and report why). */
static int server_has_gpu(void) {
  if (setup_dir(NULL) != 0) return -1;
  char yaml[1024];
  snprintf(yaml, sizeof yaml, "gpu:\n  devices: -1\n");
  server_t srv;
  int answer = -1;
  FILE *f;
  snprintf(srv.yaml, sizeof srv.yaml, "%s/server.yaml", g_dir);
  if ((f = fopen(srv.yaml, "w")) != NULL && fputs(yaml, f) >= 0 && fclose(f) == 0) {
    srv.pid = fork();
    if (srv.pid == 0) {
      int fd = open("/dev/null", O_WRONLY);
      if (fd >= 0) dup2(fd, 2);
      execl(CHI_SERVER_PATH, "chimaera-server", "--config", srv.yaml, "--workers", "1",
            (char *)NULL);
      _exit(127);
    }
    if (srv.pid > 0 && server_ready(&srv)) {
      chi_config_t cfg;
      chi_config_init(&cfg);
      cfg.mode = CHI_MODE_CLIENT;
      chi_runtime_t *rt = NULL;
      int32_t gpus = 0;
      if (chi_init(&cfg, &rt) == CHI_OK) {
        if (chi_gpu_count(rt, &gpus) == CHI_OK) answer = gpus > 0;
        chi_finalize(rt);
      }
      kill(srv.pid, SIGTERM);
      waitpid(srv.pid, NULL, 0);
    }
  }
  teardown_dir(NULL);
  return answer;
}

int main(int argc, char **argv) {
  /* This program starts its own servers: no inherited client settings. */
  unsetenv("CHI_MODE");
  unsetenv("CHI_SERVER_ADDRESS");
  unsetenv("CHI_RUNTIME_DIR");
  signal(SIGPIPE, SIG_IGN);
  if (argc > 1 && strcmp(argv[1], "--gpu") == 0) {
    chi_test_clean_env();
    if (server_has_gpu() == 0) {
      fprintf(stderr, "test_module_server --gpu: the server drives no GPU; skipped\n");
      return 77;
    }
    const struct CMUnitTest gpu_tests[] = {
        cmocka_unit_test_setup_teardown(test_gpu_scale_from_threads, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_gpu_server_killed, setup_dir, teardown_dir),
    };
    return chi_test_run("module_server_gpu", gpu_tests);
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_scale_from_threads, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_server_killed, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_failing_module_stops_startup, setup_dir, teardown_dir),
  };
  return chi_test_run("module_server", tests);
}

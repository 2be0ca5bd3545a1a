/* chimaera-demo: starts an embedded runtime, sends checked tasks down every
 * route this machine offers, and prints one line per route.  Exits 0 only
 * when every result was right. */
#define _GNU_SOURCE
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chimaera.h"
#include "demo_check.h"
#include "demo_gpu.h"
#include "tool_util.h"

#define MAX_ROWS 64
#define BURST 32
/* Long enough for any sane route on a loaded machine, short enough that a
 * lost task shows up as a failure instead of a hang. */
#define WAIT_TIMEOUT_NS (10LL * 1000 * 1000 * 1000)
#define DEFAULT_TASKS 20000
#define DEFAULT_SEED 0x6368696d61657261ull /* "chimaera" */

static void usage(FILE *out) {
  fprintf(out,
          "usage: chimaera-demo [--tasks N] [--workers N] [--config PATH]\n"
          "\n"
          "Starts an embedded chimaera runtime, registers the demo handler '%s'\n"
          "next to the built-ins (chi.echo, chi.add, chi.checksum), sends N tasks\n"
          "down every route available here (CPU, LOCAL and, with GPUs, GPU_ANY,\n"
          "each GPU, GPU->CPU and GPU->GPU), checks every result and prints\n"
          "route, tasks, p50/p99 round-trip latency and OK/FAIL.\n"
          "\n"
          "  --tasks N      tasks per route (default %d): half one at a time\n"
          "                 (timed), half in bursts of %d outstanding\n"
          "  --workers N    CPU worker threads (default: from config, else one per CPU)\n"
          "  --config PATH  chimaera.yaml to use (default: $CHI_CONFIG, else built-ins)\n"
          "  --help         this text\n"
          "\n"
          "Exit status: 0 all results correct, 1 some task failed, 2 usage or\n"
          "start-up error.\n",
          CHI_DEMO_REVERSE_NAME, DEFAULT_TASKS, BURST);
}

static void fail(struct chi_demo_row *row, const char *fmt, ...) {
  row->failures++;
  if (row->detail[0] != '\0') return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(row->detail, sizeof row->detail, fmt, ap);
  va_end(ap);
}

/* Submits task `index` and records a failure when the submit itself fails. */
static int submit_task(chi_runtime_t *rt, chi_route_t route, const chi_demo_task_t *task,
                       struct chi_demo_row *row, chi_future_t *future) {
  chi_status_t st = chi_submit(rt, route, task->method, task->input, task->input_size, future);
  if (st != CHI_OK) {
    fail(row, "chi_submit: %s: %s", chi_status_string(st), chi_last_error_message());
    return 0;
  }
  return 1;
}

/* Waits for one task and checks its result; returns 1 when it was correct. */
static int finish_task(chi_runtime_t *rt, chi_future_t future, const chi_demo_task_t *task,
                       struct chi_demo_row *row) {
  uint8_t out[CHI_DEMO_MAX_INPUT];
  size_t out_size = 0;
  char why[160];
  chi_status_t st = chi_wait(rt, future, WAIT_TIMEOUT_NS, out, sizeof out, &out_size);
  row->tasks++;
  if (st == CHI_ERR_TIMEOUT || st == CHI_ERR_TOO_LARGE) {
    /* The future is still ours: give it back so its slot is recycled. */
    if (st == CHI_ERR_TIMEOUT)
      fail(row, "chi_wait: no result after %lld ms", (long long)(WAIT_TIMEOUT_NS / 1000000));
    else
      fail(row, "chi_wait: a %zu-byte result does not fit %zu bytes", out_size, sizeof out);
    chi_release(rt, future);
    return 0;
  }
  if (!chi_demo_check(task, st, out, out_size, why, sizeof why)) {
    fail(row, "%s", why);
    return 0;
  }
  return 1;
}

/* One host-submitted route: half the tasks one at a time (timed), then half in
 * bursts waited in reverse order, so results must match their futures rather
 * than their completion order.  *reverse_done counts correct demo.reverse
 * results, to compare with the handler's own count. */
static void run_route(chi_runtime_t *rt, const char *label, chi_route_t route,
                      chi_method_t reverse, int reverse_served,
                      const struct chi_demo_options *opt, uint64_t *reverse_done,
                      struct chi_demo_row *row) {
  memset(row, 0, sizeof *row);
  snprintf(row->route, sizeof row->route, "%s", label);
  row->p50_ns = row->p99_ns = NAN;

  uint64_t timed = (opt->tasks + 1) / 2;
  uint64_t *lat = malloc(sizeof *lat * (timed ? timed : 1));
  size_t nlat = 0;
  chi_demo_task_t *batch = malloc(sizeof *batch * BURST);
  if (lat == NULL || batch == NULL) {
    fail(row, "out of memory");
    free(lat);
    free(batch);
    return;
  }

  int checked_stale = 0;
  for (uint64_t i = 0; i < timed; i++) {
    chi_demo_task_t *task = &batch[0];
    chi_future_t future;
    chi_demo_make_task(opt->seed, i, reverse, reverse_served, task);
    uint64_t t0 = chi_tool_now_ns();
    if (!submit_task(rt, route, task, row, &future)) continue;
    int ok = finish_task(rt, future, task, row);
    lat[nlat++] = chi_tool_now_ns() - t0;
    if (ok && task->method == reverse && task->expect_status == CHI_OK) (*reverse_done)++;
    if (ok && !checked_stale) {
      /* A consumed future must be refused, never reused. */
      checked_stale = 1;
      chi_status_t st = chi_wait(rt, future, 0, NULL, 0, NULL);
      if (st != CHI_ERR_INVALID)
        fail(row, "second chi_wait on a consumed future: %s, expected %s",
             chi_status_string(st), chi_status_string(CHI_ERR_INVALID));
    }
  }

  for (uint64_t i = timed; i < opt->tasks; i += BURST) {
    uint64_t k = opt->tasks - i < BURST ? opt->tasks - i : BURST;
    chi_future_t futures[BURST];
    int live[BURST];
    for (uint64_t j = 0; j < k; j++) {
      chi_demo_make_task(opt->seed, i + j, reverse, reverse_served, &batch[j]);
      live[j] = submit_task(rt, route, &batch[j], row, &futures[j]);
    }
    for (uint64_t j = k; j-- > 0;) {
      if (!live[j]) continue;
      int ok = finish_task(rt, futures[j], &batch[j], row);
      if (ok && batch[j].method == reverse && batch[j].expect_status == CHI_OK) (*reverse_done)++;
    }
  }

  chi_tool_stats_t stats;
  chi_tool_summarize(lat, nlat, &stats);
  row->p50_ns = stats.p50_ns;
  row->p99_ns = stats.p99_ns;
  free(lat);
  free(batch);
}

static void print_us(double ns) {
  if (isnan(ns))
    printf(" %10s", "-");
  else
    printf(" %10.2f", ns / 1000.0);
}

static void print_table(const struct chi_demo_row *rows, int n) {
  printf("%-24s %8s %10s %10s  %s\n", "route", "tasks", "p50 us", "p99 us", "result");
  for (int i = 0; i < n; i++) {
    printf("%-24s %8llu", rows[i].route, (unsigned long long)rows[i].tasks);
    print_us(rows[i].p50_ns);
    print_us(rows[i].p99_ns);
    if (rows[i].failures == 0)
      printf("  OK\n");
    else
      printf("  FAIL (%llu): %s\n", (unsigned long long)rows[i].failures, rows[i].detail);
  }
}

int main(int argc, char **argv) {
  static const struct option longopts[] = {
      {"tasks", required_argument, NULL, 't'},   {"workers", required_argument, NULL, 'w'},
      {"config", required_argument, NULL, 'c'},  {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  struct chi_demo_options opt = {DEFAULT_TASKS, DEFAULT_SEED, 0};
  chi_config_t cfg;
  chi_config_init(&cfg);
  uint64_t value;
  int c;
  while ((c = getopt_long(argc, argv, "t:w:c:h", longopts, NULL)) != -1) {
    switch (c) {
      case 't':
        if (chi_tool_parse_count(optarg, 1, 100000000, &opt.tasks) != 0) {
          fprintf(stderr, "chimaera-demo: --tasks wants a count from 1 to 1e8, not '%s'\n", optarg);
          return 2;
        }
        break;
      case 'w':
        if (chi_tool_parse_count(optarg, 1, 1024, &value) != 0) {
          fprintf(stderr, "chimaera-demo: --workers wants a count from 1 to 1024, not '%s'\n",
                  optarg);
          return 2;
        }
        cfg.num_workers = (int32_t)value;
        break;
      case 'c':
        cfg.config_path = optarg;
        break;
      case 'h':
        usage(stdout);
        return 0;
      default:
        usage(stderr);
        return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "chimaera-demo: unexpected argument '%s'\n", argv[optind]);
    usage(stderr);
    return 2;
  }

  chi_runtime_t *rt = NULL;
  chi_status_t st = chi_init(&cfg, &rt);
  if (st != CHI_OK) {
    fprintf(stderr, "chimaera-demo: chi_init: %s: %s\n", chi_status_string(st),
            chi_last_error_message());
    return 2;
  }

  _Atomic uint64_t reverse_calls = 0;
  chi_method_t reverse = 0;
  st = chi_register_handler(rt, CHI_DEMO_REVERSE_NAME, chi_demo_reverse_handler,
                            (void *)&reverse_calls, &reverse);
  if (st != CHI_OK) {
    fprintf(stderr, "chimaera-demo: chi_register_handler(%s): %s: %s\n", CHI_DEMO_REVERSE_NAME,
            chi_status_string(st), chi_last_error_message());
    chi_finalize(rt);
    return 2;
  }

  int failed = 0;
  static const struct {
    const char *name;
    chi_method_t id;
  } builtins[] = {{"chi.echo", CHI_METHOD_ECHO},
                  {"chi.add", CHI_METHOD_ADD},
                  {"chi.checksum", CHI_METHOD_CHECKSUM}};
  for (size_t i = 0; i < sizeof builtins / sizeof builtins[0]; i++) {
    chi_method_t id = 0;
    st = chi_method_lookup(rt, builtins[i].name, &id);
    if (st != CHI_OK || id != builtins[i].id) {
      fprintf(stderr, "chimaera-demo: chi_method_lookup(%s): %s, id %u, expected id %u\n",
              builtins[i].name, chi_status_string(st), id, builtins[i].id);
      failed = 1;
    }
  }

  int32_t gpus = 0;
  st = chi_gpu_count(rt, &gpus);
  if (st != CHI_OK) {
    fprintf(stderr, "chimaera-demo: chi_gpu_count: %s: %s\n", chi_status_string(st),
            chi_last_error_message());
    failed = 1;
    gpus = 0;
  }
  opt.gpu_count = gpus;

  printf("chimaera %s demo: %d GPU(s), %llu tasks per route\n", chi_version_string(), gpus,
         (unsigned long long)opt.tasks);

  struct chi_demo_row rows[MAX_ROWS];
  int nrows = 0;
  uint64_t reverse_done = 0;
  run_route(rt, "CPU", CHI_ROUTE_CPU, reverse, 1, &opt, &reverse_done, &rows[nrows++]);
  run_route(rt, "LOCAL (host: CPU)", CHI_ROUTE_LOCAL, reverse, 1, &opt, &reverse_done,
            &rows[nrows++]);

  /* The handler ran exactly once per correct reverse task: no task ran twice
   * and none was answered without running it. */
  uint64_t calls = atomic_load(&reverse_calls);
  if (calls != reverse_done) {
    fprintf(stderr, "chimaera-demo: %s ran %llu times for %llu correct results\n",
            CHI_DEMO_REVERSE_NAME, (unsigned long long)calls, (unsigned long long)reverse_done);
    failed = 1;
  }

  if (gpus > 0) {
    /* demo.reverse has no GPU handler: a GPU route must answer NOT_FOUND. */
    run_route(rt, "CPU -> GPU_ANY", CHI_ROUTE_GPU_ANY, reverse, 0, &opt, &reverse_done,
              &rows[nrows++]);
    for (int32_t g = 0; g < gpus && nrows < MAX_ROWS; g++) {
      char label[40];
      snprintf(label, sizeof label, "CPU -> GPU %d", (int)g);
      run_route(rt, label, CHI_ROUTE_GPU(g), reverse, 0, &opt, &reverse_done, &rows[nrows++]);
    }
    nrows += chi_demo_gpu_routes(rt, &opt, &rows[nrows], MAX_ROWS - nrows);
  }

  print_table(rows, nrows);
  for (int i = 0; i < nrows; i++)
    if (rows[i].failures) failed = 1;

  st = chi_finalize(rt);
  if (st != CHI_OK) {
    fprintf(stderr, "chimaera-demo: chi_finalize: %s: %s\n", chi_status_string(st),
            chi_last_error_message());
    failed = 1;
  }
  printf("%s\n", failed ? "FAIL" : "all results correct");
  return failed ? 1 : 0;
}

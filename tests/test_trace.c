/* The round-trip trace of a -DCHI_TRACE=ON build (src/core/trace.h): each
 * chi_finalize writes the CPU->CPU round trips since the last report to
 * $CHI_TRACE_FILE, one table per submitting thread (here one), every stage
 * of them stamped, then a table of each side's steps.  Times are printed,
 * never checked. */
#include "common.h"

enum { kStageLines = 8, kStepLines = 6 };
static const char *const kStages[kStageLines] = {"queued",    "popped", "handler-start", "handler-end",
                                                 "published", "wait",   "seen",          "returned"};
static const char *const kSteps[kStepLines] = {"submit",         "worker.gap",  "worker.run",
                                               "worker.handler", "waiter.wait", "waiter.take"};

typedef struct trace_report {
  long trips;                /* -1: no header line */
  long count[kStageLines];   /* -1: no line for the stage */
  long steps;                /* -1: no header line of the steps table */
  long step[kStepLines];     /* -1: no line for the step */
} trace_report_t;

/* n one-at-a-time chi.echo round trips on a fresh runtime, then its
 * finalize's report, read from a fresh file. */
static trace_report_t traced_run(int n) {
  char path[512];
  const char *dir = getenv("TMPDIR");
  snprintf(path, sizeof path, "%s/chi-trace-XXXXXX", dir && dir[0] ? dir : "/tmp");
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  assert_int_equal(setenv("CHI_TRACE_FILE", path, 1), 0);

  chi_runtime_t *rt = chi_test_init(1, NULL);
  chi_method_t echo = 0;
  assert_status(CHI_OK, chi_method_lookup(rt, "chi.echo", &echo));
  for (int i = 0; i < n; i++) {
    uint64_t in = (uint64_t)i, out = 0;
    size_t size = 0;
    chi_future_t f = 0;
    assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, echo, &in, sizeof in, &f));
    assert_status(CHI_OK, chi_wait(rt, f, -1, &out, sizeof out, &size));
    assert_int_equal(out, in);
  }
  assert_status(CHI_OK, chi_finalize(rt));
  unsetenv("CHI_TRACE_FILE");

  trace_report_t r = {.trips = -1, .steps = -1};
  for (int s = 0; s < kStageLines; s++) r.count[s] = -1;
  for (int s = 0; s < kStepLines; s++) r.step[s] = -1;
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[512];
  while (fgets(line, sizeof line, f)) {
    print_message("%s", line);
    long trips = 0, count = 0;
    char stage[32];
    double p10, p50, p90;
    if (sscanf(line, "# chimaera trace: thread %*u: %ld CPU->CPU round trips", &trips) == 1) {
      assert_int_equal(r.trips, -1);
      r.trips = trips;
    } else if (strncmp(line, "# chimaera trace: each side's steps", 35) == 0) {
      assert_int_equal(r.steps, -1);
      r.steps = 0;
    } else if (line[0] != '#' && sscanf(line, "%31s %lf %lf %lf %ld", stage, &p10, &p50, &p90, &count) == 5) {
      /* The steps table comes last: a line after its header is a step's. */
      if (r.steps < 0) {
        for (int s = 0; s < kStageLines; s++)
          if (strcmp(stage, kStages[s]) == 0) r.count[s] = count;
      } else {
        for (int s = 0; s < kStepLines; s++)
          if (strcmp(stage, kSteps[s]) == 0) r.step[s] = count;
      }
    }
  }
  fclose(f);
  unlink(path);
  return r;
}

/* Every line of a table is there, with 1..n entries. */
static void counts_within(const char *what, const char *const *names, const long *count, int lines, long n) {
  for (int s = 0; s < lines; s++) {
    if (count[s] <= 0) fail_msg("%s %s: %ld", what, names[s], count[s]);
    assert_true(count[s] <= n);
  }
}

static void test_every_stage_stamped(void **state) {
  (void)state;
  const int n = 200;
  trace_report_t r = traced_run(n);
  assert_int_equal(r.trips, n);
  counts_within("stage", kStages, r.count, kStageLines, n);
  /* The waiter's own stages, on the submitter's thread, are in every trip. */
  assert_int_equal(r.count[5], n);
  assert_int_equal(r.count[6], n);
  assert_int_equal(r.count[7], n);
  /* Each side's steps: the submitter's and the waiter's of every task, the
   * worker's of those it kept (its gap needs a task before). */
  assert_int_equal(r.steps, 0);
  counts_within("step", kSteps, r.step, kStepLines, n);
  assert_int_equal(r.step[0], n);
  assert_int_equal(r.step[4], n);
  assert_int_equal(r.step[5], n);
}

/* A second runtime's report holds its own round trips only. */
static void test_report_since_the_last(void **state) {
  (void)state;
  (void)traced_run(50);
  trace_report_t r = traced_run(30);
  assert_int_equal(r.trips, 30);
  assert_int_equal(r.step[0], 30);
  assert_int_equal(r.step[5], 30);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_stage_stamped),
      cmocka_unit_test(test_report_since_the_last),
  };
  return chi_test_run("trace", tests);
}

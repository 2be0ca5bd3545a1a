/* Experiment: N threads, pipelined echo tasks (window 64), like chimaera-bench's
 * pipelined xN row; prints throughput and process CPU per task. */
#include <chimaera.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
static chi_runtime_t *rt;
static long per;
static int W = 64, P = 64;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void *run(void *arg) {
  chi_future_t f[1024];
  unsigned char in[4096], out[4096];
  memset(in, 7, sizeof in);
  long issued = 0, done = 0; int head = 0, n = 0;
  while (done < per) {
    if (issued < per && n < W) {
      chi_future_t x;
      chi_status_t s = chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, in, P, &x);
      if (s == CHI_OK) { f[(head + n) % W] = x; n++; issued++; continue; }
      if (s != CHI_ERR_AGAIN) { fprintf(stderr, "submit %d\n", s); exit(1); }
    }
    size_t got = 0;
    chi_status_t s = chi_wait(rt, f[head], 10000000000LL, out, sizeof out, &got);
    if (s != CHI_OK || got != (size_t)P) { fprintf(stderr, "wait %d\n", s); exit(1); }
    head = (head + 1) % W; n--; done++;
  }
  return NULL;
}
int main(int argc, char **argv) {
  int T = argc > 1 ? atoi(argv[1]) : 16;
  long tasks = argc > 2 ? atol(argv[2]) : 4000000;
  per = tasks / T;
  if (chi_init(NULL, &rt) != CHI_OK) { fprintf(stderr, "init: %s\n", chi_last_error_message()); return 1; }
  pthread_t th[256];
  struct rusage u0, u1;
  getrusage(RUSAGE_SELF, &u0);
  double t0 = now();
  for (int i = 0; i < T; i++) pthread_create(&th[i], NULL, run, NULL);
  for (int i = 0; i < T; i++) pthread_join(th[i], NULL);
  double t1 = now();
  getrusage(RUSAGE_SELF, &u1);
  double cpu = (u1.ru_utime.tv_sec - u0.ru_utime.tv_sec) + (u1.ru_stime.tv_sec - u0.ru_stime.tv_sec) +
               1e-6 * ((u1.ru_utime.tv_usec - u0.ru_utime.tv_usec) + (u1.ru_stime.tv_usec - u0.ru_stime.tv_usec));
  printf("threads %d tasks %ld: %.3f M/s, CPU %.3f us/task, switches %.4f/task\n", T, per * T,
         per * T / (t1 - t0) / 1e6, cpu * 1e6 / (per * T),
         (double)((u1.ru_nvcsw + u1.ru_nivcsw) - (u0.ru_nvcsw + u0.ru_nivcsw)) / (per * T));
  fflush(stdout);
  chi_finalize(rt);
  return 0;
}

#define _GNU_SOURCE
#include "tool_util.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

uint64_t chi_tool_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

double chi_tool_clock_overhead_ns(void) {
  enum { N = 2001 };
  uint64_t delta[N];
  uint64_t prev = chi_tool_now_ns();
  for (int i = 0; i < N; i++) {
    uint64_t now = chi_tool_now_ns();
    delta[i] = now - prev;
    prev = now;
  }
  chi_tool_stats_t s;
  chi_tool_summarize(delta, N, &s);
  return s.p50_ns;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* Nearest rank: the smallest sample with at least p of the samples <= it. */
static double rank(const uint64_t *sorted, size_t n, double p) {
  size_t k = (size_t)ceil(p * (double)n);
  if (k < 1) k = 1;
  if (k > n) k = n;
  return (double)sorted[k - 1];
}

void chi_tool_summarize(uint64_t *samples, size_t n, chi_tool_stats_t *out) {
  memset(out, 0, sizeof *out);
  if (n == 0) {
    out->p50_ns = out->p99_ns = out->mean_ns = out->min_ns = out->max_ns = NAN;
    return;
  }
  qsort(samples, n, sizeof *samples, cmp_u64);
  double sum = 0;
  for (size_t i = 0; i < n; i++) sum += (double)samples[i];
  out->p50_ns = rank(samples, n, 0.50);
  out->p99_ns = rank(samples, n, 0.99);
  out->mean_ns = sum / (double)n;
  out->min_ns = (double)samples[0];
  out->max_ns = (double)samples[n - 1];
  out->count = n;
}

int chi_tool_parse_count(const char *text, uint64_t min, uint64_t max, uint64_t *out) {
  if (text == NULL || *text == '\0' || *text == '-') return -1;
  errno = 0;
  char *end = NULL;
  double value;
  unsigned long long whole = strtoull(text, &end, 10);
  if (errno == 0 && *end == '\0') {
    value = (double)whole;
  } else {
    errno = 0;
    value = strtod(text, &end);
    if (errno != 0 || end == text) return -1;
    if (*end == 'k' || *end == 'K') value *= 1e3, end++;
    else if (*end == 'M') value *= 1e6, end++;
    if (*end != '\0' || value != floor(value)) return -1;
    whole = (unsigned long long)value;
  }
  if (value < (double)min || value > (double)max) return -1;
  *out = (uint64_t)whole;
  return 0;
}

int chi_tool_pin_thread(unsigned cpu) {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return -1;
  int count = CPU_COUNT(&allowed);
  if (count <= 0) return -1;
  unsigned want = cpu % (unsigned)count;
  for (int c = 0; c < CPU_SETSIZE; c++) {
    if (!CPU_ISSET(c, &allowed)) continue;
    if (want-- == 0) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(c, &one);
      return pthread_setaffinity_np(pthread_self(), sizeof one, &one) == 0 ? 0 : -1;
    }
  }
  return -1;
}

unsigned chi_tool_online_cpus(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (unsigned)n : 1u;
}

void chi_tool_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

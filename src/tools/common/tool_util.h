/* Small helpers shared by chimaera-demo and chimaera-bench (and their GPU
 * hooks): a monotonic clock, latency percentiles, option parsing.  Not part
 * of the library. */
#ifndef CHI_TOOL_UTIL_H
#define CHI_TOOL_UTIL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* CLOCK_MONOTONIC in nanoseconds: no rdtsc, so no frequency calibration and
 * no cross-core skew to worry about. */
uint64_t chi_tool_now_ns(void);

/* Median cost of one chi_tool_now_ns() call, from back-to-back readings.
 * Every timed sample includes about one such cost. */
double chi_tool_clock_overhead_ns(void);

/* Summary of a set of latency samples. */
typedef struct chi_tool_stats {
  double p50_ns;
  double p99_ns;
  double mean_ns;
  double min_ns;
  double max_ns;
  uint64_t count;
} chi_tool_stats_t;

/* Sorts samples[0..n) in place and fills *out (nearest-rank percentiles).
 * n == 0 gives NaN everywhere and count 0. */
void chi_tool_summarize(uint64_t *samples, size_t n, chi_tool_stats_t *out);

/* Parses a decimal count in [min, max] ("100000", "1e5" and "100k" accepted).
 * Returns 0 and sets *out, or -1 for anything else. */
int chi_tool_parse_count(const char *text, uint64_t min, uint64_t max, uint64_t *out);

/* Pins the calling thread to CPU `cpu` modulo the CPUs it may run on.
 * Returns 0, or -1 (the thread stays unpinned). */
int chi_tool_pin_thread(unsigned cpu);

/* Number of CPUs online (at least 1). */
unsigned chi_tool_online_cpus(void);

/* A short busy-wait hint for spin loops (pause / yield instruction). */
void chi_tool_cpu_relax(void);

#ifdef __cplusplus
}
#endif

#endif /* CHI_TOOL_UTIL_H */

#include "bench_row.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "tool_util.h"

void chi_bench_row_init(struct chi_bench_row *row, const char *name, int kind) {
  memset(row, 0, sizeof *row);
  snprintf(row->name, sizeof row->name, "%s", name);
  row->kind = kind;
  row->p50_ns = row->p99_ns = row->mean_ns = row->throughput = NAN;
  row->floor_p50_ns = row->floor_throughput = row->ratio = NAN;
  row->target_p50_ns = row->target_throughput = NAN;
  row->cpu_ns_per_op = row->csw_per_op = NAN;
  row->threads = 1;
  row->window = 1;
  row->status = CHI_OK;
}

void chi_bench_row_samples(struct chi_bench_row *row, uint64_t *samples, size_t n) {
  chi_tool_stats_t s;
  chi_tool_summarize(samples, n, &s);
  row->count = s.count;
  row->p50_ns = s.p50_ns;
  row->p99_ns = s.p99_ns;
  row->mean_ns = s.mean_ns;
  row->throughput = (n > 0 && s.mean_ns > 0) ? 1e9 / s.mean_ns : NAN;
}

void chi_bench_row_fail(struct chi_bench_row *row, chi_status_t status, const char *fmt, ...) {
  row->status = status;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(row->error, sizeof row->error, fmt, ap);
  va_end(ap);
}

const char *chi_bench_kind_name(int kind) {
  switch (kind) {
    case CHI_BENCH_FLOOR: return "floor";
    case CHI_BENCH_PEER: return "peer";
    case CHI_BENCH_LATENCY: return "latency";
    case CHI_BENCH_THROUGHPUT: return "throughput";
    case CHI_BENCH_TPUT_FLOOR: return "tput-floor";
    default: return "unknown";
  }
}

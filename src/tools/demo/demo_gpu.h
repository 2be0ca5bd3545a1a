/* The GPU half of chimaera-demo.  Routes that start on a GPU (GPU->CPU,
 * GPU->GPU) need device code, so they live behind this hook: demo_gpu.cu in
 * CUDA builds (when that file exists), demo_gpu_none.c otherwise.  Host->GPU
 * routes need no device code and are run by main.c itself. */
#ifndef CHI_DEMO_GPU_H
#define CHI_DEMO_GPU_H

#include <stdint.h>

#include "chimaera.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One line of the demo's table. */
struct chi_demo_row {
  char route[40];    /* what submitted where, e.g. "GPU 0 -> CPU" */
  uint64_t tasks;    /* tasks whose result was checked */
  uint64_t failures; /* tasks with a wrong status or result (0: OK) */
  double p50_ns;     /* round-trip latency, NaN when not measured */
  double p99_ns;
  char detail[160];  /* first failure, empty when none */
};

/* What the user asked for. */
struct chi_demo_options {
  uint64_t tasks;    /* tasks per route */
  uint64_t seed;     /* chi_demo_make_task seed */
  int32_t gpu_count; /* chi_gpu_count of rt */
};

/* Runs the GPU-originated routes on every GPU of rt, checking each result with
 * chi_demo_check, and fills up to max_rows rows.  Returns the number of rows
 * filled (0 in builds without device code).  A route that cannot even start
 * (kernel launch failed, ...) still fills a row, with failures > 0 and the
 * reason in detail. */
int chi_demo_gpu_routes(chi_runtime_t *rt, const struct chi_demo_options *opt,
                        struct chi_demo_row *rows, int max_rows);

#ifdef __cplusplus
}
#endif

#endif /* CHI_DEMO_GPU_H */

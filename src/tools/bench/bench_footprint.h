/* chimaera-bench's footprint rows (bench_footprint.cu, CUDA builds): what a
 * GPU's orchestrator costs other kernels. */
#ifndef CHI_BENCH_FOOTPRINT_H
#define CHI_BENCH_FOOTPRINT_H

#include "bench_row.h"
#include "chimaera.h"

/* Fills up to max_rows (at least 6) rows for GPU `gpu` (CUDA device
 * `ordinal`): a grid-filling FMA kernel and a 256 MiB copy kernel, each with
 * the orchestrator paused (floor rows), beside the idle orchestrator, and
 * under CPU->GPU load.  Returns the rows filled.  Pauses and resumes the
 * GPU's orchestrator. */
int chi_bench_footprint_rows(chi_runtime_t *rt, int32_t gpu, int ordinal, struct chi_bench_row *rows,
                             int max_rows);

#endif /* CHI_BENCH_FOOTPRINT_H */

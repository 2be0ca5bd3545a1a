/* The GPU half of chimaera-bench.  GPU routes and GPU floors need device code,
 * so they live behind this hook: bench_gpu.cu in CUDA builds (when that file
 * exists), bench_gpu_none.c otherwise. */
#ifndef CHI_BENCH_GPU_H
#define CHI_BENCH_GPU_H

#include "bench_row.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Measures, for every GPU of rt, the GPU routes (CPU->GPU_ANY, CPU->GPU n,
 * GPU->CPU, GPU->GPU: latency and throughput) and the floors and peers they
 * are compared with (flag ping-pongs, kernel launch + sync,
 * cudaLaunchHostFunc), and appends them to rows.  Each route row names its
 * floor in row->floor; the report fills floor_p50_ns and ratio.
 *   rt        a started runtime (chi_gpu_count(rt) may be 0)
 *   opt       iteration counts, window, payload, pinning
 *   rows      [out] room for max_rows rows
 * Returns the number of rows written (0 when the build has no device code or
 * rt drives no GPU).  A measurement that fails still writes its row, with
 * status and error set. */
int chi_bench_gpu_rows(chi_runtime_t *rt, const struct chi_bench_options *opt,
                       struct chi_bench_row *rows, int max_rows);

#ifdef __cplusplus
}
#endif

#endif /* CHI_BENCH_GPU_H */

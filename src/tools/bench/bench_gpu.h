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

/* CUDA devices this process sees; 0 without device code or without a GPU. */
int chi_bench_gpu_visible(void);

/* chimaera-bench --server, before the server starts: in an embedded runtime
 * rt, on its GPU 0, the floors of the routes that start in a kernel
 * (floor.gpu_cpu_pingpong, floor.gpu_block_pingpong) and the latency rows
 * gpu0->cpu and gpu0->local, timed with %globaltimer as the client rows
 * are.  Returns the rows written (0 when the build has no device code or rt
 * drives no GPU). */
int chi_bench_gpu_embedded_rows(chi_runtime_t *rt, const struct chi_bench_options *opt,
                                struct chi_bench_row *rows, int max_rows);

/* The same latency rows from a kernel of this process, a client of a
 * chimaera-server (rt in CHI_MODE_CLIENT), through chi_gpu_context(rt, 0) and
 * the client's relay (docs/server.md, "Client kernels"): "client gpu0->cpu"
 * and "client gpu0->local", naming the same floors, each within a time
 * budget (a row cut short says so on stderr).
 *   rt       the client runtime, or NULL with refused set
 *   refused  CHI_OK to measure; else both rows fail with this status and `why`
 *            (e.g. the server's GPU 0 is not this process's CUDA device 0)
 *   rows     [out] room for max_rows rows
 * Returns the rows written: 0 when the build has no device code or this
 * process sees no CUDA device, else both rows, failed with chi_gpu_context's
 * status when the server drives no GPU. */
int chi_bench_gpu_client_rows(chi_runtime_t *rt, const struct chi_bench_options *opt,
                              chi_status_t refused, const char *why,
                              struct chi_bench_row *rows, int max_rows);

#ifdef __cplusplus
}
#endif

#endif /* CHI_BENCH_GPU_H */

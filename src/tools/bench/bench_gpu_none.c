/* Builds without CUDA: no device code, so no GPU rows. */
#include "bench_gpu.h"

int chi_bench_gpu_rows(chi_runtime_t *rt, const struct chi_bench_options *opt,
                       struct chi_bench_row *rows, int max_rows) {
  (void)rt;
  (void)opt;
  (void)rows;
  (void)max_rows;
  return 0;
}

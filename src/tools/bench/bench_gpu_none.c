/* Builds without CUDA: no device code, so no GPU rows (none in --server runs either). */
#include "bench_gpu.h"

int chi_bench_gpu_rows(chi_runtime_t *rt, const struct chi_bench_options *opt,
                       struct chi_bench_row *rows, int max_rows) {
  (void)rt;
  (void)opt;
  (void)rows;
  (void)max_rows;
  return 0;
}

int chi_bench_gpu_visible(void) { return 0; }

int chi_bench_gpu_embedded_rows(chi_runtime_t *rt, const struct chi_bench_options *opt,
                                struct chi_bench_row *rows, int max_rows) {
  (void)rt;
  (void)opt;
  (void)rows;
  (void)max_rows;
  return 0;
}

int chi_bench_gpu_client_rows(chi_runtime_t *rt, const struct chi_bench_options *opt,
                              chi_status_t refused, const char *why,
                              struct chi_bench_row *rows, int max_rows) {
  (void)rt;
  (void)opt;
  (void)refused;
  (void)why;
  (void)rows;
  (void)max_rows;
  return 0;
}

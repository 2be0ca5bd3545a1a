/* Builds without CUDA: no device code, so no GPU-originated routes. */
#include "demo_gpu.h"

int chi_demo_gpu_routes(chi_runtime_t *rt, const struct chi_demo_options *opt,
                        struct chi_demo_row *rows, int max_rows) {
  (void)rt;
  (void)opt;
  (void)rows;
  (void)max_rows;
  return 0;
}

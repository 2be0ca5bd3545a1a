/* C side of fortran_batch: the C layout of the batch structs that module
 * chimaera_c mirrors, and CHI_BATCH_MAX. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "chimaera.h"

/* sizeof and offsetof of each batch struct, then CHI_BATCH_MAX, in the order
 * the Fortran test lists them; returns how many it wrote (at most cap). */
int ftest_batch_layout(int64_t *out, int cap) {
  const int64_t v[] = {
      sizeof(chi_task_desc_t),
      offsetof(chi_task_desc_t, method),
      offsetof(chi_task_desc_t, input),
      offsetof(chi_task_desc_t, input_size),
      sizeof(chi_task_result_t),
      offsetof(chi_task_result_t, output),
      offsetof(chi_task_result_t, output_capacity),
      offsetof(chi_task_result_t, output_size),
      offsetof(chi_task_result_t, status),
      CHI_BATCH_MAX,
  };
  int n = (int)(sizeof v / sizeof v[0]);
  if (n > cap) n = cap;
  memcpy(out, v, (size_t)n * sizeof v[0]);
  return n;
}

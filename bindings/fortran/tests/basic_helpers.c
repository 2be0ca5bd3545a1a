/* C side of fortran_basic: a handler that blocks until released (for the
 * CHI_ERR_TIMEOUT test, awkward to write in Fortran) and the C layout of the
 * structs that module chimaera_c mirrors. */
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "chimaera.h"

static atomic_int g_released;

/* Echoes its input once ftest_unblock has been called. */
chi_status_t ftest_block_handler(chi_request_t *req, void *user_data) {
  (void)user_data;
  struct timespec pause = {0, 1000000};
  while (!atomic_load(&g_released)) nanosleep(&pause, NULL);
  if (req->input_size > req->output_capacity) return CHI_ERR_TOO_LARGE;
  memcpy(req->output, req->input, req->input_size);
  req->output_size = req->input_size;
  return CHI_OK;
}

void ftest_unblock(void) { atomic_store(&g_released, 1); }

/* sizeof and offsetof of each mirrored struct, in the order the Fortran test
 * lists them; returns how many it wrote (at most cap). */
int ftest_layout(int64_t *out, int cap) {
  const int64_t v[] = {
      sizeof(chi_config_t),
      offsetof(chi_config_t, config_path),
      offsetof(chi_config_t, mode),
      offsetof(chi_config_t, server_address),
      offsetof(chi_config_t, num_workers),
      offsetof(chi_config_t, gpus),
      sizeof(chi_request_t),
      offsetof(chi_request_t, source),
      offsetof(chi_request_t, input),
      offsetof(chi_request_t, input_size),
      offsetof(chi_request_t, output),
      offsetof(chi_request_t, output_capacity),
      offsetof(chi_request_t, output_size),
      sizeof(chi_mem_ref_t),
      offsetof(chi_mem_ref_t, offset),
      offsetof(chi_mem_ref_t, length),
      sizeof(chi_dev_context_t),
      sizeof(chi_gpu_launch_t),
      offsetof(chi_gpu_launch_t, gpu),
      offsetof(chi_gpu_launch_t, stream),
      offsetof(chi_gpu_launch_t, blocks),
      offsetof(chi_gpu_launch_t, threads_per_block),
      offsetof(chi_gpu_launch_t, state),
      sizeof(chi_gpu_orchestrator_t),
      offsetof(chi_gpu_orchestrator_t, launch),
      offsetof(chi_gpu_orchestrator_t, method_names),
      offsetof(chi_gpu_orchestrator_t, method_count),
  };
  int n = (int)(sizeof v / sizeof v[0]);
  if (n > cap) n = cap;
  memcpy(out, v, (size_t)n * sizeof v[0]);
  return n;
}

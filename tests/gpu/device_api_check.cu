/*
 * Compile-only: every device API entry and the orchestrator macro, so that
 * scripts/hip-check.sh (hipcc) and nvcc both see all of chimaera_device.h
 * instantiated.  Not a test program; nothing runs it.
 */
#include "chimaera_device.h"

__device__ chi_status_t check_dispatch(uint32_t index, chi_dev_request_t *req) {
  req->output_size = 0;
  return index == 0 ? CHI_OK : CHI_ERR_NOT_FOUND;
}
static const char *const kCheckNames[] = {"check.noop"};
CHI_DEFINE_ORCHESTRATOR(check_orchestrator, check_dispatch, kCheckNames, 1)

__global__ void check_kernel(chi_dev_context_t ctx, int *result) {
  uint8_t buf[128] = {1, 2, 3};
  chi_future_t f;
  uint32_t n = 0;
  int done = 0;
  void *p = nullptr;
  chi_mem_ref_t ref = {1, 0, 8};
  chi_status_t s = chi_dev_submit(&ctx, CHI_ROUTE_CPU, CHI_METHOD_ECHO, buf, 64, &f);
  s |= chi_dev_test(&ctx, f, &done);
  s |= chi_dev_wait(&ctx, f, 1000000, buf, sizeof buf, &n);
  s |= chi_dev_warp_submit(&ctx, CHI_ROUTE_LOCAL, CHI_METHOD_ADD, buf, 16, 1, &f);
  s |= chi_dev_warp_wait(&ctx, f, 1000000, buf, sizeof buf, &n, 1);
  s |= chi_dev_try_submit(&ctx, CHI_ROUTE_LOCAL, CHI_METHOD_ECHO, buf, 8, &f);
  s |= chi_dev_release(&ctx, f);
  s |= chi_dev_warp_try_submit(&ctx, CHI_ROUTE_CPU, CHI_METHOD_ECHO, buf, 8, 1, &f);
  s |= chi_dev_release(&ctx, f);
  s |= chi_dev_mem_resolve(&ctx, &ref, &p);
  *result = s + (int)n + done + (p != nullptr);
}

// The GPU handler of test_gpu_client's device memory module
// (client_mem_module.c): "test.gpu_mem_sum" runs in the server's
// orchestrator, takes a chi_mem_ref_t to device memory a client registered
// (chi_register_gpu_mem in a client), resolves it with chi_dev_mem_resolve
// through the server's device region table and answers the FNV-1a 64 of those
// bytes, read by the handler from the server's mapping of the client's
// allocation.  A reference the table refuses answers the resolve's status.
#include <string.h>

#include "chimaera.h"
#include "chimaera_device.h"

namespace {

__device__ chi_status_t gpu_mem_sum(chi_dev_request_t *req) {
  if (chi_port::lane_id() != 0) return CHI_OK; /* lane 0's status and output_size count */
  chi_mem_ref_t ref;
  if (req->input_size != sizeof ref || req->output_capacity < 8u) return CHI_ERR_INVALID;
  memcpy(&ref, req->input, sizeof ref);
  void *p = nullptr;
  const chi_status_t s = chi_dev_mem_resolve(req->ctx, &ref, &p);
  if (s != CHI_OK) return s;
  if (ref.length > (1u << 20)) return -1001; /* keep the warp's time short */
  const uint8_t *b = static_cast<const uint8_t *>(p);
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint64_t i = 0; i < ref.length; ++i) {
    h ^= b[i];
    h *= 0x100000001b3ull;
  }
  memcpy(req->output, &h, 8);
  req->output_size = 8;
  return CHI_OK;
}

__device__ chi_status_t mem_dispatch(uint32_t index, chi_dev_request_t *req) {
  return index == 0 ? gpu_mem_sum(req) : CHI_ERR_NOT_FOUND;
}

const char *const kMethods[] = {"test.gpu_mem_sum"};

}  // namespace

CHI_DEFINE_ORCHESTRATOR(client_mem_orchestrator, mem_dispatch, kMethods, 1)

extern "C" chi_status_t client_mem_module_install_gpu(chi_runtime_t *rt) {
  const chi_gpu_orchestrator_t orch = client_mem_orchestrator();
  return chi_gpu_set_orchestrator(rt, -1, &orch);
}

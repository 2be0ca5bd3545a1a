// example_module_gpu: the GPU handler of "example.scale" (see
// example_module.c for the method), served by a user orchestrator made with
// CHI_DEFINE_ORCHESTRATOR.  The orchestrator keeps serving the built-in
// methods; tasks reach it with CHI_ROUTE_GPU_ANY or CHI_ROUTE_GPU(n).
#include <string.h>

#include "chimaera.h"
#include "chimaera_device.h"

namespace {

// Runs on a whole warp, each lane with its own copy of *req: every lane
// scales its share of the values; lane 0's status and output_size count.
__device__ chi_status_t scale_gpu(chi_dev_request_t *req) {
  if (req->input_size < 4 || req->input_size % 4 != 0) return CHI_ERR_INVALID;
  const uint32_t n = req->input_size / 4 - 1;
  if (req->output_capacity < 4 * n) return CHI_ERR_INVALID;
  const uint8_t *in = static_cast<const uint8_t *>(req->input);
  uint8_t *out = static_cast<uint8_t *>(req->output);
  float factor;
  memcpy(&factor, in, 4);
  for (uint32_t i = threadIdx.x % 32u; i < n; i += 32u) {
    float x;
    memcpy(&x, in + 4 * (i + 1), 4);
    x *= factor;
    memcpy(out + 4 * i, &x, 4);
  }
  req->output_size = 4 * n;
  return CHI_OK;
}

// index: position of the method in kMethods.
__device__ chi_status_t example_dispatch(uint32_t index, chi_dev_request_t *req) {
  switch (index) {
    case 0:
      return scale_gpu(req);
    default:
      return CHI_ERR_NOT_FOUND;
  }
}

const char *const kMethods[] = {"example.scale"};

}  // namespace

// The orchestrator kernel, its launcher and example_orchestrator().
CHI_DEFINE_ORCHESTRATOR(example_orchestrator, example_dispatch, kMethods, 1)

// Called by chimaera_module_init when the runtime drives GPUs: "example.scale"
// already has its CPU handler, and gains this GPU handler under the same id.
extern "C" chi_status_t example_module_install_gpu(chi_runtime_t *rt) {
  const chi_gpu_orchestrator_t orch = example_orchestrator();
  return chi_gpu_set_orchestrator(rt, -1, &orch);
}

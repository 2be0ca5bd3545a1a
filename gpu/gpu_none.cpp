// Build without CUDA/HIP: no GPU system, so GPU routes answer CHI_ERR_NO_DEVICE.
#include "base/error.h"
#include "core/client_gpu.h"
#include "core/gpu_system.h"

namespace chi {

chi_status_t create_gpu_system(Runtime &, const Config &cfg, std::unique_ptr<GpuSystem> *out) {
  out->reset();
  if (cfg.gpu.devices > 0)
    return set_error(CHI_ERR_NO_DEVICE, "%d GPU(s) requested but chimaera was built without CUDA/HIP",
                     cfg.gpu.devices);
  return CHI_OK;
}

chi_status_t create_client_gpu(Upstream &, Runtime &, int32_t gpu, int32_t, std::unique_ptr<ClientGpu> *out) {
  out->reset();
  return set_error(CHI_ERR_NO_DEVICE, "GPU %d: chimaera was built without CUDA/HIP", gpu);
}

chi_status_t export_gpu_mem(int32_t gpu, const void *, size_t, void *, size_t, uint64_t *) {
  return set_error(CHI_ERR_NO_DEVICE, "GPU %d: chimaera was built without CUDA/HIP", gpu);
}

bool relay_host_memory() { return false; }

}  // namespace chi

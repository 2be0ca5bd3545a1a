#include "gpu/kernels.h"

namespace chi::gpu {

namespace {

struct NoUserMethods {
  static __device__ __forceinline__ chi_status_t call(uint32_t, chi_dev_request_t *) {
    return CHI_ERR_NOT_FOUND;
  }
};

__global__ void __launch_bounds__(CHI_DEV_ORCH_MAX_WARPS_PER_BLOCK * CHI_WARP_SIZE, 1)
    builtin_orchestrator(const chi_dev_orch_state_t *state) {
  chi_dev_detail::orchestrator_main<NoUserMethods>(state);
}

// One thread: the table is small and changes rarely; readers retry while seq is odd.
__global__ void region_update(chi_dev_regions_t *t, const chi_dev_region_t *staged, uint32_t n,
                              uint32_t clear_to) {
  const uint32_t s = t->seq;
  chi_port::st_relaxed_dev(&t->seq, s + 1u);
  chi_port::fence_release_dev();
  const uint32_t end = n > clear_to ? n : clear_to;
  for (uint32_t i = 0; i < end && i < CHI_DEV_MAX_REGIONS; ++i) {
    chi_dev_region_t r = i < n ? staged[i] : chi_dev_region_t{0, 0, 0, 0};
    chi_port::st_relaxed_dev(&t->r[i].id, r.id);
    chi_port::st_relaxed_dev(&t->r[i].base, r.base);
    chi_port::st_relaxed_dev(&t->r[i].size, r.size);
    chi_port::st_relaxed_dev(&t->r[i].gpu, r.gpu);
  }
  chi_port::st_release_dev(&t->seq, s + 2u);
}

// One warp: frees the GPU->CPU slots released before their reply came (a
// client's relay has no orchestrator to sweep them).
__global__ void sweep_released(chi_dev_context_t ctx) {
  chi_dev_detail::sweep_released(chi_dev_detail::layout(&ctx), chi_port::lane_id());
}

}  // namespace

cudaError_t launch_sweep_released(const chi_dev_context_t &ctx, cudaStream_t stream) {
  sweep_released<<<1, CHI_WARP_SIZE, 0, stream>>>(ctx);
  return cudaGetLastError();
}

cudaError_t sweep_loadable() {
#if CHI_HAVE_HIP
  hipFuncAttributes a;
  return hipFuncGetAttributes(&a, reinterpret_cast<const void *>(sweep_released));
#else
  cudaFuncAttributes a;
  return cudaFuncGetAttributes(&a, sweep_released);
#endif
}

chi_status_t launch_builtin(const chi_gpu_launch_t *launch) {
  builtin_orchestrator<<<launch->blocks, launch->threads_per_block, 0,
                         static_cast<cudaStream_t>(launch->stream)>>>(
      static_cast<const chi_dev_orch_state_t *>(launch->state));
  return chi_port_launch_ok() ? CHI_OK : CHI_ERR_INTERNAL;
}

// Querying a kernel loads it.  Both are loaded before the orchestrator starts:
// loading code later may need a context-wide synchronization, which waits for
// the persistent kernel forever.
cudaError_t builtin_loadable() {
#if CHI_HAVE_HIP
  hipFuncAttributes a;
  hipError_t e = hipFuncGetAttributes(&a, reinterpret_cast<const void *>(builtin_orchestrator));
  if (e == hipSuccess) e = hipFuncGetAttributes(&a, reinterpret_cast<const void *>(region_update));
  return e;
#else
  cudaFuncAttributes a;
  cudaError_t e = cudaFuncGetAttributes(&a, builtin_orchestrator);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, region_update);
  return e;
#endif
}

cudaError_t launch_region_update(chi_dev_regions_t *table, const chi_dev_region_t *staged,
                                 uint32_t n, uint32_t clear_to, cudaStream_t stream) {
  region_update<<<1, 1, 0, stream>>>(table, staged, n, clear_to);
  return cudaGetLastError();
}

}  // namespace chi::gpu

// The library's own kernels (gpu/kernels.cu), callable from host C++.
#pragma once

#include "chimaera_device.h"
#include "gpu/cuda_api.h"

namespace chi::gpu {

// Launcher of the built-in orchestrator (echo, add, checksum).
chi_status_t launch_builtin(const chi_gpu_launch_t *launch);

// cudaSuccess when this build carries code the current device can run; loads
// the library's kernels on it (call before any orchestrator starts).
cudaError_t builtin_loadable();

// Rewrites the device's region table from `staged` (device memory, n entries;
// entries n .. clear_to-1 are cleared) under the table's seqlock.
cudaError_t launch_region_update(chi_dev_regions_t *table, const chi_dev_region_t *staged,
                                 uint32_t n, uint32_t clear_to, cudaStream_t stream);

// Frees released GPU->CPU slots of a relay context (client_gpu.cpp) once
// their replies came; sweep_loadable loads the kernel (call it before the
// process's kernels run: a lazy load later may wait for them).
cudaError_t launch_sweep_released(const chi_dev_context_t &ctx, cudaStream_t stream);
cudaError_t sweep_loadable();

}  // namespace chi::gpu

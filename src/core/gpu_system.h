// What the core needs from the GPU backend (gpu/): one executor per GPU, the
// device context, pause/resume and user orchestrators.  Built without CUDA/HIP,
// create_gpu_system yields no system and GPU routes answer CHI_ERR_NO_DEVICE.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "chimaera.h"
#include "config/config.h"
#include "core/executor.h"

namespace chi {

class Runtime;

class GpuSystem {
 public:
  virtual ~GpuSystem() = default;
  virtual int32_t count() const = 0;
  // Executor of GPU `gpu` (0 <= gpu < count()).
  virtual Executor *executor(int32_t gpu) = 0;
  virtual chi_status_t context(int32_t gpu, chi_dev_context_t *ctx) = 0;
  // gpu == -1: every GPU.
  virtual chi_status_t pause(int32_t gpu) = 0;
  virtual chi_status_t resume(int32_t gpu) = 0;
  virtual chi_status_t set_orchestrator(int32_t gpu, const chi_gpu_orchestrator_t *orch) = 0;
  // Pauses every orchestrator that runs and names those in *paused (for
  // resume), so that new device code can load: with a kernel running, the
  // first CUDA call after dlopen of a library with device code waits for it
  // (the library's module load), i.e. forever for a persistent kernel.
  virtual chi_status_t pause_running(std::vector<int32_t> *paused) = 0;
  // The orchestrator of GPU `gpu` as it is now: "running", "parked" (idle:
  // no kernel resident until the next CPU->GPU task), "paused", "failed" (a
  // launch or the kernel failed; GPU routes answer errors) or "stopped"
  // (shut down); *launches: kernel launches so far (leases); *parks: times
  // it parked.
  virtual const char *orchestrator_state(int32_t gpu, uint64_t *launches, uint64_t *parks) = 0;
  // CHI_OK when [ptr, ptr + size) is device memory of GPU `gpu`, else CHI_ERR_INVALID.
  virtual chi_status_t check_device_pointer(int32_t gpu, const void *ptr, size_t size) = 0;
  // The region table changed (Runtime::regions); make device code see the new one.
  virtual chi_status_t regions_changed() = 0;
  // Client device memory (server/client_mem.h): maps another process's CUDA
  // IPC handle (handle_size bytes, untrusted) on GPU `gpu`; *base and
  // *length: the whole allocation as mapped here.  CHI_ERR_INVALID with the
  // reason when it cannot be opened.
  virtual chi_status_t open_ipc_mem(int32_t gpu, const void *handle, size_t handle_size, void **base,
                                    size_t *length) = 0;
  // Unmaps what open_ipc_mem mapped.
  virtual void close_ipc_mem(int32_t gpu, void *base) = 0;
  // Whether an MPS control daemon of this user answered when the GPUs were
  // set up (its pipe directory in *where): the process's CUDA context is then
  // an MPS client, and other processes' kernels run beside the orchestrator
  // instead of time-sliced against it.
  virtual bool mps_active(std::string *where) const = 0;
  // Device task slots (GPU->GPU and GPU->CPU, every GPU) held now, and in all.
  virtual void device_slots(uint64_t *in_use, uint64_t *total) = 0;
  // chi_finalize: run what is queued, stop orchestrators and pollers, free memory.
  virtual chi_status_t shutdown() = 0;
};

// Creates the GPU backend for cfg.gpu.  *out stays empty (and CHI_OK is
// returned) when the build has no GPU backend, no GPU is visible, or
// cfg.gpu.devices == 0.  CHI_ERR_NO_DEVICE when cfg.gpu.devices asks for more
// GPUs than are usable.
chi_status_t create_gpu_system(Runtime &rt, const Config &cfg, std::unique_ptr<GpuSystem> *out);

}  // namespace chi

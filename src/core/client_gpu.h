// Client kernels that submit (docs/server.md, "Client kernels"): the device
// context chi_gpu_context gives in a client process, and the relay behind it.
// The client allocates, in its own CUDA context, the GPU->CPU layout of a
// runtime's GPU (gpu/d2h_memory.h) marked CHI_DEV_CTX_RELAY, so that every
// route of its kernels goes through the ring; its poller threads run the
// client's own handlers or forward the task to the server over the session
// (Upstream::submit: the client's session, core/upstream.h), many in flight,
// and write each reply when it comes.
// Built without CUDA/HIP, create_client_gpu answers CHI_ERR_NO_DEVICE
// (gpu/gpu_none.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "chimaera.h"
#include "core/upstream.h"

namespace chi {

class Runtime;

class ClientGpu {
 public:
  // Stops the relay's threads and frees its memory (a device-wide CUDA call:
  // it waits for the process's kernels).  Tasks still in the ring are not
  // answered: kernels that use the context must have ended.
  virtual ~ClientGpu() = default;
  virtual void context(chi_dev_context_t *ctx) const = 0;
};

// The relay of server GPU `gpu` (the client's CUDA device of the same
// ordinal) for the session `up`; `local` runs the client's own handlers.
// ngpus: the server's GPU count (CHI_ROUTE_GPU(n >= ngpus): CHI_ERR_NO_DEVICE
// on the device).
chi_status_t create_client_gpu(Upstream &up, Runtime &local, int32_t gpu, int32_t ngpus,
                               std::unique_ptr<ClientGpu> *out);

// Tests only: CHI_RELAY_HOST_MEMORY=1 puts a relay in plain host memory with
// no CUDA call, even without a GPU or a server GPU, so that a test plays the
// kernel's part on its ring (tests/test_client_relay.cpp).  False in a build
// without CUDA/HIP.
bool relay_host_memory();

// chi_register_gpu_mem(gpu >= 0) in a client: checks that [ptr, ptr + size)
// is device memory of the client's CUDA device `gpu` inside one allocation,
// and gives that allocation's CUDA IPC handle (handle_size >= 64 bytes) and
// the region's offset in it, for the server (ipc::GpuMemExport).
// CHI_ERR_INVALID (not such memory), CHI_ERR_NO_DEVICE (no CUDA device
// `gpu`, or a build without CUDA/HIP).
chi_status_t export_gpu_mem(int32_t gpu, const void *ptr, size_t size, void *handle, size_t handle_size,
                            uint64_t *offset);

}  // namespace chi

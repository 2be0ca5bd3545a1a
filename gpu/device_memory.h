// One GPU's memory: a pinned host allocation (the CPU->GPU ring and
// completion records, the GPU->CPU ring and replies, the control and lease
// words) and a device allocation (the orchestrator's state, the dispatch
// table, the GPU->GPU slots, bells and gate), carved once and initialized
// for a fresh orchestrator.  The orchestrator's lifecycle (gpu_device.cpp)
// only reads the pointers; nothing here launches or waits for a kernel.
#pragma once

#include <cstddef>
#include <cstdint>

#include "chimaera_device.h"
#include "gpu/cuda_api.h"
#include "gpu/shape.h"

namespace chi::gpu {

struct DeviceMemory {
  uint8_t *pinned = nullptr;  // host view of the pinned allocation
  uint8_t *dev = nullptr;     // the device allocation
  size_t pinned_bytes = 0;
  size_t dev_bytes = 0;

  // Host views the executor and the pollers use.
  uint64_t *h2d_ring = nullptr;
  uint64_t *h2d_done = nullptr;
  uint8_t *h2d_buf = nullptr;  // nullptr when every payload fits inline
  uint64_t *d2h_ring = nullptr;
  uint64_t *d2h_reply = nullptr;
  uint8_t *d2h_buf = nullptr;

  // Control words (pinned): the source of stop-flag copies, the lease words
  // the kernel reads (launches queued, the next launch, the bell, the lease
  // of the launch being queued) and the diag words.
  uint32_t *stop_src = nullptr;
  uint64_t *host_lease = nullptr;
  uint64_t *diag = nullptr;

  // Device words.
  chi_dev_orch_state_t *state = nullptr;
  uint32_t *control = nullptr;
  int32_t *dispatch = nullptr;
  chi_dev_region_t *region_stage = nullptr;

  // The device context kernels get (chi_gpu_context).
  chi_dev_ctx_layout_t layout{};

  // Allocates both and initializes them on `stream` (waits for it): every
  // bell, slot and generation zero, no user handler in the dispatch table,
  // polling warp p at ticket p.  The caller has made the device current.
  // ndispatch: entries of the dispatch table.  On failure the caller still
  // calls release().
  chi_status_t allocate(const Shape &s, int32_t id, int32_t ngpus, uint32_t ndispatch,
                        cudaStream_t stream);
  // Frees both (the kernel must be gone).  The device must be current.
  void release();
};

}  // namespace chi::gpu

#include "gpu/device_memory.h"

#include <cstring>
#include <vector>

#include "base/error.h"
#include "gpu/d2h_memory.h"
#include "gpu/gpu_device.h"

namespace chi::gpu {

chi_status_t DeviceMemory::allocate(const Shape &s, int32_t id, int32_t ngpus, uint32_t ndispatch,
                                    cudaStream_t stream) {
  const uint64_t rec = CHI_DEV_LL_WORDS * sizeof(uint64_t);
  const bool bufs = s.max_payload > CHI_DEV_LL_INLINE;
  Carver hc;
  const size_t o_h2d_ring = hc.take(s.h2d_ring_entries * rec);
  const size_t o_h2d_done = hc.take(s.h2d_slots * rec);
  const size_t o_h2d_buf = bufs ? hc.take(s.h2d_slots * s.payload_stride) : 0;
  const size_t o_stop = hc.take(128);  // control staging, fault read-back; the lease words at +64
  Carver dc;
  D2hCarve d2h;
  carve_d2h(s, hc, dc, &d2h);
  if (cudaError_t e = cudaHostAlloc(reinterpret_cast<void **>(&pinned), hc.size,
                                    cudaHostAllocPortable | cudaHostAllocMapped);
      e != cudaSuccess) {
    pinned = nullptr;
    return cuda_error(CHI_ERR_NOMEM, id, "allocating pinned host memory", e);
  }
  pinned_bytes = hc.size;
  std::memset(pinned, 0, hc.size);
  uint8_t *pdev = nullptr;
  if (cudaError_t e = cudaHostGetDevicePointer(reinterpret_cast<void **>(&pdev), pinned, 0);
      e != cudaSuccess)
    return cuda_error(CHI_ERR_INTERNAL, id, "mapping pinned memory", e);
  stop_src = reinterpret_cast<uint32_t *>(pinned + o_stop);
  host_lease = reinterpret_cast<uint64_t *>(pinned + o_stop + 64);
  diag = reinterpret_cast<uint64_t *>(pinned + d2h.diag);
  h2d_ring = reinterpret_cast<uint64_t *>(pinned + o_h2d_ring);
  h2d_done = reinterpret_cast<uint64_t *>(pinned + o_h2d_done);
  h2d_buf = bufs ? pinned + o_h2d_buf : nullptr;
  d2h_ring = reinterpret_cast<uint64_t *>(pinned + d2h.ring);
  d2h_reply = reinterpret_cast<uint64_t *>(pinned + d2h.reply);
  d2h_buf = bufs ? pinned + d2h.buf : nullptr;

  const size_t o_state = dc.take(sizeof(chi_dev_orch_state_t));
  const size_t o_control = dc.take(64);
  const size_t o_next = dc.take(s.h2d_pollers * sizeof(uint64_t));
  const size_t o_dispatch = dc.take(ndispatch * sizeof(int32_t));
  const size_t o_scratch = dc.take(s.nwarps * 2 * s.payload_stride);
  const size_t o_d2d_slots = dc.take(s.dslots * (CHI_DEV_SLOT_HEADER + 2 * s.payload_stride));
  const size_t o_d2d_state = dc.take(s.dslots * sizeof(uint32_t));
  const size_t o_d2d_bitmap = dc.take(s.dslots / 8);
  const size_t o_d2d_bell = dc.take(s.dslots / 8);
  const size_t o_d2d_seen = dc.take(s.dslots / 8);
  const size_t o_warp_done = dc.take(s.nwarps * sizeof(uint64_t));
  const size_t o_gate = dc.take(128);
  const size_t o_stage = dc.take(CHI_DEV_MAX_REGIONS * sizeof(chi_dev_region_t));
  const size_t o_peers = dc.take(size_t(ngpus > 0 ? ngpus : 1) * sizeof(chi_dev_ctx_layout_t));
  if (cudaError_t e = cudaMalloc(reinterpret_cast<void **>(&dev), dc.size); e != cudaSuccess) {
    dev = nullptr;
    return cuda_error(CHI_ERR_NOMEM, id, "allocating device memory", e);
  }
  dev_bytes = dc.size;
  state = reinterpret_cast<chi_dev_orch_state_t *>(dev + o_state);
  control = reinterpret_cast<uint32_t *>(dev + o_control);
  dispatch = reinterpret_cast<int32_t *>(dev + o_dispatch);
  region_stage = reinterpret_cast<chi_dev_region_t *>(dev + o_stage);

  chi_dev_ctx_layout_t &l = layout;
  fill_d2h_layout(s, d2h, pdev, dev, id, ngpus, &l);
  l.d2d_slots = dev + o_d2d_slots;
  l.d2d_state = reinterpret_cast<uint32_t *>(dev + o_d2d_state);
  l.d2d_bitmap = reinterpret_cast<uint32_t *>(dev + o_d2d_bitmap);
  l.d2d_bell = reinterpret_cast<uint32_t *>(dev + o_d2d_bell);
  l.d2d_seen = reinterpret_cast<uint32_t *>(dev + o_d2d_seen);
  l.gate = reinterpret_cast<uint64_t *>(dev + o_gate);
  // As orchestrator_main splits its warps (d2d_workers in device_orchestrator.h).
  l.d2d_workers = s.nwarps > s.h2d_pollers ? s.nwarps - s.h2d_pollers : 1;
  l.d2d_first_worker = s.nwarps > s.h2d_pollers ? s.h2d_pollers : 0;
  // Zeroed below (no peer reachable) until the runtime uploads the table.
  l.peers = reinterpret_cast<const chi_dev_ctx_layout_t *>(dev + o_peers);

  chi_dev_orch_state_t os;
  std::memset(&os, 0, sizeof os);
  // The orchestrator's copy (handlers get it as req->ctx) never waits for a slot.
  chi_dev_ctx_layout_t orch_ctx = layout;
  orch_ctx.flags |= CHI_DEV_CTX_ORCHESTRATOR;
  std::memcpy(&os.ctx, &orch_ctx, sizeof orch_ctx);
  os.abi = CHI_DEV_ABI_VERSION;
  os.nwarps = s.nwarps;
  os.h2d_pollers = s.h2d_pollers;
  os.h2d_slots = s.h2d_slots;
  os.h2d_ring_entries = s.h2d_ring_entries;
  os.ndispatch = ndispatch;
  os.h2d_ring = reinterpret_cast<uint64_t *>(pdev + o_h2d_ring);
  os.h2d_done = reinterpret_cast<uint64_t *>(pdev + o_h2d_done);
  os.h2d_buf = bufs ? pdev + o_h2d_buf : nullptr;
  os.control = control;
  os.h2d_next = reinterpret_cast<uint64_t *>(dev + o_next);
  os.dispatch = dispatch;
  os.scratch = dev + o_scratch;
  os.lease_ns = s.lease_ns;
  os.host_lease = reinterpret_cast<const uint64_t *>(pdev + o_stop + 64);
  os.warp_done = reinterpret_cast<uint64_t *>(dev + o_warp_done);

  // Everything starts zero (no bell rung, none served, generation 0); no
  // method has a user handler yet.
  std::vector<int32_t> none(ndispatch, -1);
  // Polling warp p serves tickets p, p + pollers, ...
  std::vector<uint64_t> first(s.h2d_pollers);
  for (uint32_t p = 0; p < s.h2d_pollers; ++p) first[p] = p;
  cudaError_t e = cudaMemsetAsync(dev, 0, dc.size, stream);
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(dispatch, none.data(), none.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream);
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(os.h2d_next, first.data(), first.size() * sizeof(uint64_t), cudaMemcpyHostToDevice,
                        stream);
  if (e == cudaSuccess) e = cudaMemcpyAsync(state, &os, sizeof os, cudaMemcpyHostToDevice, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) return cuda_error(CHI_ERR_INTERNAL, id, "initializing device memory", e);
  return CHI_OK;
}

void DeviceMemory::release() {
  if (dev) (void)cudaFree(dev);
  if (pinned) (void)cudaFreeHost(pinned);
  dev = nullptr;
  pinned = nullptr;
  (void)cudaGetLastError();
}

}  // namespace chi::gpu

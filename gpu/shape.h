// Sizes of one GPU's queues and buffers, derived once from the configuration.
#pragma once

#include <cstddef>
#include <cstdint>

#include "config/config.h"

namespace chi::gpu {

struct Shape {
  uint32_t h2d_slots = 0;         // CPU->GPU slots (gpu.queue_depth)
  uint32_t h2d_pollers = 0;       // orchestrator warps polling the CPU->GPU ring
  uint32_t h2d_ring_entries = 0;  // h2d_slots x h2d_pollers
  uint32_t dslots = 0;            // GPU->GPU and GPU->CPU slots each (gpu.device_slots)
  uint32_t cpu_pollers = 0;       // CPU threads serving GPU->CPU tasks
  uint32_t d2h_ring_entries = 0;  // dslots x cpu_pollers
  uint32_t wait_spin_ns = 0;      // chi_dev_wait polls without a pause this long
  uint32_t submit_timeout_us = 0; // chi_dev_submit waits this long for a slot (gpu.device_submit_timeout_us)
  uint32_t max_payload = 0;       // gpu.max_payload
  uint64_t payload_stride = 0;    // bytes per payload buffer
  uint32_t blocks = 0;
  uint32_t threads = 0;           // per block
  uint32_t nwarps = 0;
  uint64_t lease_ns = 0;          // gpu.lease_us: the orchestrator kernel's lease, 0: never ends
  uint64_t idle_lease_ns = 0;     // gpu.idle_lease_us (>= lease_ns; lease_ns when unset)
};

// sm_count: multiprocessors of the GPU (the grid never covers all of them).
Shape make_shape(const Config &cfg, int sm_count);

// Hands out aligned offsets inside one allocation.
struct Carver {
  size_t size = 0;
  size_t take(size_t n, size_t align = 256) {
    size = (size + align - 1) & ~(align - 1);
    size_t at = size;
    size += n;
    return at;
  }
};

}  // namespace chi::gpu

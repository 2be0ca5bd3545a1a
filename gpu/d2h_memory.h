// The memory of the GPU->CPU route (ring, replies, payload buffers in pinned
// host memory; slot states, bitmap, ticket, wait line in device memory) and
// the words every device context points at (region table, diag), carved out
// of one pinned and one device allocation.  Shared by a GPU of the runtime
// (gpu_device.cpp) and a client process's relay (client_gpu.cpp), so both
// give kernels the same GPU->CPU layout.
#pragma once

#include <cstddef>
#include <cstdint>

#include "chimaera_device.h"
#include "gpu/shape.h"

namespace chi::gpu {

struct D2hCarve {
  // offsets in the pinned allocation
  size_t ring = 0, reply = 0, buf = 0, diag = 0;
  // offsets in the device allocation
  size_t state = 0, bitmap = 0, tail = 0, released = 0, wait_line = 0, regions = 0;
};

// Takes the offsets from the two carvers.
void carve_d2h(const Shape &s, Carver &pinned, Carver &dev, D2hCarve *c);

// Fills the fields of *l that carve_d2h placed and those set by the shape
// (magic, gpu, sizes, timeouts, ngpus); flags 0, GPU->GPU fields and gate
// untouched.  pinned_dev: the pinned allocation as the device sees it; dev:
// the device allocation.
void fill_d2h_layout(const Shape &s, const D2hCarve &c, uint8_t *pinned_dev, uint8_t *dev, int32_t gpu,
                     int32_t ngpus, chi_dev_ctx_layout_t *l);

}  // namespace chi::gpu

// Where a client process's tasks go: the session with its chimaera-server
// (client/client.h implements it over shared memory or ZeroMQ).  The relay
// of client kernels (gpu/client_gpu.cpp) forwards their tasks through it:
// gpu/ needs this much of a client, and client/ reaches the relay only
// through core/client_gpu.h (as the core reaches the GPUs through
// core/gpu_system.h), so neither includes the other.
#pragma once

#include <cstddef>
#include <cstdint>

#include "chimaera.h"

namespace chi {

// Method ids of a client's own handlers carry this bit; the server's ids never do.
constexpr chi_method_t kLocalMethodBit = 0x40000000u;

class Upstream {
 public:
  virtual ~Upstream() = default;
  // chi_submit to the server: the future's slot and generation are the
  // session's (decode_future).
  virtual chi_status_t submit(chi_route_t route, chi_method_t method, const void *input, size_t input_size,
                              chi_future_t *future) = 0;
  virtual chi_status_t wait(uint32_t slot, uint32_t gen, int64_t timeout_ns, void *output,
                            size_t output_capacity, size_t *output_size) = 0;
  virtual chi_status_t test(uint32_t slot, uint32_t gen, int *done) = 0;
  virtual chi_status_t release(uint32_t slot, uint32_t gen) = 0;
  // Whether the task of a live future has finished: one load, no checks
  // beyond the slot's range, no system call (the relay scans its futures
  // with it).
  virtual bool finished(uint32_t slot, uint32_t gen) const = 0;
};

}  // namespace chi

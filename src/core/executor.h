// An executor owns task slots and runs tasks: the CPU worker pool, or one GPU.
// Futures name an executor by its pool number (0: CPU, 1 + g: GPU g).
#pragma once

#include <cstddef>
#include <cstdint>

#include "chimaera.h"

namespace chi {

// Future layout: runtime tag (8) | pool (8) | generation (24) | slot + 1 (24).
// The tag tells futures of different runtimes apart; the generation makes a
// consumed future stale; slot + 1 keeps every valid future non-zero.
struct FutureParts {
  uint32_t tag;
  uint32_t pool;
  uint32_t gen;
  uint32_t slot;
};

constexpr uint32_t kGenMask = 0xFFFFFFu;
constexpr uint32_t kCpuPool = 0;

inline chi_future_t encode_future(uint32_t tag, uint32_t pool, uint32_t gen, uint32_t slot) {
  return (uint64_t(tag & 0xFF) << 56) | (uint64_t(pool & 0xFF) << 48) |
         (uint64_t(gen & kGenMask) << 24) | uint64_t((slot + 1) & 0xFFFFFF);
}

inline bool decode_future(chi_future_t f, FutureParts *p) {
  uint32_t low = uint32_t(f & 0xFFFFFF);
  if (low == 0) return false;
  p->tag = uint32_t(f >> 56);
  p->pool = uint32_t((f >> 48) & 0xFF);
  p->gen = uint32_t((f >> 24) & kGenMask);
  p->slot = low - 1;
  return true;
}

// Threads that must never wait for a free task slot: a server's pollers and
// ZeroMQ I/O threads, which are themselves the ones that reap finished GPU
// tasks (waiting there would wait for itself until submit_timeout_ms, once
// per task).  On such a thread every executor's submit answers
// CHI_ERR_AGAIN at once when it is full; the caller retries later.
void set_submit_never_blocks(bool on);
bool submit_never_blocks();

// Where a task run on behalf of a client process delivers its result (a
// server session): called once, by the thread that ran the task, with the
// output still in the executor's slot.
class RemoteSink {
 public:
  virtual void complete(uint64_t cookie, chi_status_t status, const void *output,
                        size_t output_size) = 0;

 protected:
  ~RemoteSink() = default;
};

// Every method of an executor sets the thread's error message (set_error)
// before it returns a failure of its own; statuses that come from a handler
// are returned unchanged.
class Executor {
 public:
  virtual ~Executor() = default;
  // Copies the input into a free slot and queues it.  *slot and *gen name the task.
  virtual chi_status_t submit(chi_method_t method, const void *input, size_t input_size,
                              uint32_t *slot, uint32_t *gen) = 0;
  // chi_wait semantics (see chimaera.h) for one task of this executor.
  virtual chi_status_t wait(uint32_t slot, uint32_t gen, int64_t timeout_ns, void *output,
                            size_t output_capacity, size_t *output_size) = 0;
  virtual chi_status_t test(uint32_t slot, uint32_t gen, int *done) = 0;
  virtual chi_status_t release(uint32_t slot, uint32_t gen) = 0;
};

}  // namespace chi

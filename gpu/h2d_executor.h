// CPU->GPU tasks: the executor behind CHI_ROUTE_GPU(n).  Slots and the ring
// live in pinned host memory; the orchestrator's polling warps read the ring
// and write an LL completion record per slot, which chi_wait polls.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <mutex>
#include <vector>

#include "core/executor.h"
#include "core/park_gate.h"
#include "core/sharded_free_stack.h"
#include "gpu/shape.h"

namespace chi {
class Runtime;
}

namespace chi::gpu {

class H2dExecutor final : public Executor {
 public:
  H2dExecutor(Runtime &rt, int32_t gpu, const Shape &shape, uint64_t *ring, uint64_t *done,
              uint8_t *buf);

  chi_status_t submit(chi_method_t method, const void *input, size_t input_size, uint32_t *slot,
                      uint32_t *gen) override;
  chi_status_t wait(uint32_t slot, uint32_t gen, int64_t timeout_ns, void *output,
                    size_t output_capacity, size_t *output_size) override;
  chi_status_t test(uint32_t slot, uint32_t gen, int *done) override;
  chi_status_t release(uint32_t slot, uint32_t gen) override;

  // Recycles released slots whose task has finished.
  void reap();
  // Before any submit: every submit tells `gate` after its entry (parking,
  // core/park_gate.h).
  void set_park_gate(ParkGate *gate) { park_ = gate; }
  // A parked GPU is starting: waiters spin until about `until` (now_ns)
  // instead of napping after spin_ns, since the first task after quiet
  // takes a launch on an idle GPU (60-200 us) and a nap overshoots by
  // the timer slack (docs/gpu.md, "Parked GPUs").
  void starting(int64_t until) { starting_until_.store(until, std::memory_order_relaxed); }
  // Tickets taken so far (seq_cst: the parker's side of the handshake).
  uint64_t tail() const { return tail_.load(std::memory_order_seq_cst); }
  // Tasks submitted and not finished yet (released ones included).
  uint32_t in_flight() const;
  // Refuses new tasks from now on (CHI_ERR_SHUTDOWN).
  void close() { open_.store(false, std::memory_order_release); }
  // The orchestrator is gone: waits for unfinished tasks return CHI_ERR_SHUTDOWN.
  void mark_stopped() { stopped_.store(true, std::memory_order_release); }
  // The orchestrator failed (a fault lost the CUDA context): new submits and
  // waits for unfinished tasks return CHI_ERR_INTERNAL with `why`, at once.
  void mark_failed(const std::string &why);

 private:
  chi_status_t check(uint32_t slot, uint32_t gen, uint32_t state) const;
  bool finished(uint32_t slot, uint32_t gen) const;
  void recycle(uint32_t slot);
  bool take_slot(uint32_t *slot);

  Runtime &rt_;
  const int32_t gpu_;
  const Shape shape_;
  uint64_t *const ring_;
  uint64_t *const done_;
  uint8_t *const buf_;
  // Each slot's word (core/slot_word.h): free -> pending (submit) -> claimed
  // (a waiter) or orphan (released; reap() frees it once finished).  It is
  // never done: the GPU tells completion by the slot's LL record carrying
  // the generation (hence begin_nonzero), and waiters poll that record in
  // pinned memory, not the word, so slot::wait and publish are not used.
  std::unique_ptr<std::atomic<uint32_t>[]> state_;
  std::unique_ptr<uint32_t[]> method_;
  // Free slots in shards of threads (thread_index() % kFreeShards): a
  // thread that submits and waits takes and returns slots on a head no other
  // thread writes.  One shared queue made two CASes per task on one line
  // that every submitter moved (H100, 8 submitting threads, lab/journal/gpu-routes.md).
  static constexpr uint32_t kFreeShards = 16;
  ShardedFreeStack free_;
  ParkGate *park_ = nullptr;
  std::atomic<int64_t> starting_until_{0};
  alignas(64) std::atomic<uint64_t> tail_{0};
  alignas(64) std::atomic<bool> open_{true};
  std::atomic<bool> stopped_{false};
  std::atomic<bool> failed_{false};
  std::string failed_why_;  // written once, before failed_ is set
  std::mutex released_mu_;
  std::vector<uint32_t> released_;
  std::atomic<uint32_t> nreleased_{0};
};

}  // namespace chi::gpu

// A client's free task slots: a LIFO of indices, and a futex that submitters
// sleep on when every slot is taken (both client transports use it).
#pragma once

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>

#include "base/futex.h"
#include "core/free_stack.h"

namespace chi {

class SlotPool {
 public:
  void init(uint32_t n) {
    free_.init(n);
    for (uint32_t i = n; i-- > 0;) free_.push(i);
  }

  bool try_acquire(uint32_t *slot) { return free_.pop(slot); }

  // Waits for a slot until deadline_ns (now_ns clock).  Between sleeps
  // (each at most 1 ms) it calls reclaim(), which may free slots, and
  // gives up early once alive() says the server is gone.
  template <class Reclaim, class Alive>
  bool acquire(uint32_t *slot, int64_t deadline_ns, Reclaim reclaim, Alive alive) {
    for (;;) {
      waiters_.fetch_add(1, std::memory_order_seq_cst);
      uint32_t seq = seq_.load(std::memory_order_seq_cst);
      bool got = free_.pop(slot);
      if (!got) {
        int64_t left = std::min<int64_t>(deadline_ns - now_ns(), 1000000);
        if (left > 0) futex_wait(&seq_, seq, left);
        reclaim();
        got = free_.pop(slot);
      }
      waiters_.fetch_sub(1, std::memory_order_relaxed);
      if (got) return true;
      if (now_ns() >= deadline_ns || !alive()) return false;
    }
  }

  void release(uint32_t slot) {
    free_.push(slot);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (waiters_.load(std::memory_order_relaxed) > 0) {
      seq_.fetch_add(1, std::memory_order_release);
      futex_wake(&seq_, 1);
    }
  }

  // Wakes every waiting submitter (the server is gone).
  void wake_all() {
    seq_.fetch_add(1, std::memory_order_release);
    futex_wake(&seq_, INT_MAX);
  }

 private:
  FreeStack free_;
  alignas(64) std::atomic<uint32_t> seq_{0};
  std::atomic<int32_t> waiters_{0};
};

}  // namespace chi

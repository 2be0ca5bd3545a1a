// Bounded lock-free MPMC queue of 32-bit values (Vyukov's sequence-per-cell
// design): one CAS per push or pop, no allocation after init.
#pragma once

#include <sched.h>

#include <atomic>
#include <cstdint>
#include <memory>

namespace chi {

class MpmcQueue {
 public:
  // capacity must be a power of two.
  void init(uint32_t capacity) {
    cells_.reset(new Cell[capacity]);
    mask_ = capacity - 1;
    for (uint32_t i = 0; i < capacity; ++i) cells_[i].seq.store(i, std::memory_order_relaxed);
    head_.store(0, std::memory_order_relaxed);
    tail_.store(0, std::memory_order_relaxed);
  }

  // The caller guarantees that at most capacity values are ever in the
  // queue; push then always succeeds (it may wait for a slow consumer).
  bool push(uint32_t value) {
    uint64_t pos = tail_.load(std::memory_order_relaxed);
    unsigned waits = 0;
    for (;;) {
      Cell &c = cells_[pos & mask_];
      uint64_t seq = c.seq.load(std::memory_order_acquire);
      int64_t diff = int64_t(seq) - int64_t(pos);
      if (diff == 0) {
        if (tail_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          c.value = value;
          c.seq.store(pos + 1, std::memory_order_release);
          return true;
        }
      } else if (diff < 0) {
        // The cell's consumer from the previous lap has claimed it but not
        // handed it back yet (it may be descheduled).  Callers never have
        // more than capacity entries in flight, so it will: wait for it.
        if (++waits % 64 == 0) sched_yield();
        pos = tail_.load(std::memory_order_relaxed);
      } else {
        pos = tail_.load(std::memory_order_relaxed);
      }
    }
  }

  bool pop(uint32_t *value) {
    uint64_t pos = head_.load(std::memory_order_relaxed);
    for (;;) {
      Cell &c = cells_[pos & mask_];
      uint64_t seq = c.seq.load(std::memory_order_acquire);
      int64_t diff = int64_t(seq) - int64_t(pos + 1);
      if (diff == 0) {
        if (head_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          *value = c.value;
          c.seq.store(pos + mask_ + 1, std::memory_order_release);
          return true;
        }
      } else if (diff < 0) {
        return false;  // empty
      } else {
        pos = head_.load(std::memory_order_relaxed);
      }
    }
  }

  // A hint only: another thread may change it at once.
  bool maybe_nonempty() const {
    return tail_.load(std::memory_order_acquire) != head_.load(std::memory_order_acquire);
  }

 private:
  struct Cell {
    std::atomic<uint64_t> seq;
    uint32_t value;
  };
  std::unique_ptr<Cell[]> cells_;
  uint64_t mask_ = 0;
  alignas(64) std::atomic<uint64_t> head_{0};
  alignas(64) std::atomic<uint64_t> tail_{0};
};

}  // namespace chi

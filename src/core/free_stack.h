// Lock-free LIFO of slot indices (a Treiber stack over an index array, with
// a 32-bit tag against ABA).  LIFO keeps recently used task slots, still in
// cache, at the top: a FIFO free list would walk every slot in turn.  The
// index array is zero pages until used: an entry is written only when its
// index is pushed.
#pragma once

#include <atomic>
#include <cstdint>

#include "core/zeroed.h"

namespace chi {

class FreeStack {
 public:
  static constexpr uint32_t kNone = 0xFFFFFFFFu;

  void init(uint32_t capacity) {
    next_.allocate(capacity);
    head_.store(pack(0, kNone), std::memory_order_relaxed);
  }

  void push(uint32_t index) {
    uint64_t old = head_.load(std::memory_order_relaxed);
    for (;;) {
      next_[index].store(index_of(old), std::memory_order_relaxed);
      if (head_.compare_exchange_weak(old, pack(tag_of(old) + 1, index), std::memory_order_release,
                                      std::memory_order_relaxed))
        return;
    }
  }

  bool pop(uint32_t *index) {
    uint64_t old = head_.load(std::memory_order_acquire);
    for (;;) {
      uint32_t top = index_of(old);
      if (top == kNone) return false;
      // May read a stale next if another thread popped meanwhile; the tag
      // then makes the CAS fail, so the stale value is never installed.
      uint32_t next = next_[top].load(std::memory_order_relaxed);
      if (head_.compare_exchange_weak(old, pack(tag_of(old) + 1, next), std::memory_order_acquire,
                                      std::memory_order_acquire)) {
        *index = top;
        return true;
      }
    }
  }

 private:
  static uint64_t pack(uint32_t tag, uint32_t index) { return (uint64_t(tag) << 32) | index; }
  static uint32_t tag_of(uint64_t v) { return uint32_t(v >> 32); }
  static uint32_t index_of(uint64_t v) { return uint32_t(v); }

  ZeroedArray<std::atomic<uint32_t>> next_;
  alignas(64) std::atomic<uint64_t> head_{0};
};

}  // namespace chi

// Bounded lock-free MPMC run queue of tasks (Vyukov's sequence-per-cell
// design) whose cells carry the task header and, up to kInline bytes, the
// input itself: a worker polling the head cell gets the notification, the
// method and the input in the same two cache lines.
#pragma once

#include <sched.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>

namespace chi {

struct QueuedTask {
  uint32_t slot;
  uint32_t method;
  uint32_t input_size;
};

class RunQueue {
 public:
  static constexpr uint32_t kInline = 104;

  // capacity must be a power of two.
  void init(uint32_t capacity) {
    cells_.reset(new Cell[capacity]);
    mask_ = capacity - 1;
    for (uint32_t i = 0; i < capacity; ++i) cells_[i].seq.store(i, std::memory_order_relaxed);
  }

  // input is copied when input_size <= kInline; larger inputs must already
  // be in the slot's input buffer.  The caller guarantees that at most
  // capacity tasks are ever queued; push then always succeeds.
  bool push(const QueuedTask &t, const void *input) {
    uint64_t pos = tail_.load(std::memory_order_relaxed);
    unsigned waits = 0;
    for (;;) {
      Cell &c = cells_[pos & mask_];
      uint64_t seq = c.seq.load(std::memory_order_acquire);
      int64_t diff = int64_t(seq) - int64_t(pos);
      if (diff == 0) {
        if (tail_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          c.task = t;
          if (t.input_size && t.input_size <= kInline) std::memcpy(c.data, input, t.input_size);
          c.seq.store(pos + 1, std::memory_order_release);
          // The next push likely lands on the next cell: own its line before then.
          __builtin_prefetch(&cells_[(pos + 1) & mask_], 1);
          return true;
        }
      } else if (diff < 0) {
        // The cell's consumer from the previous lap has claimed it but not
        // handed it back yet (it may be descheduled).  Callers never have
        // more than capacity entries in flight, so it will: wait for it.
        // Reporting "full" here would drop a task while the queue is nearly
        // empty.
        if (++waits % 64 == 0) sched_yield();
        pos = tail_.load(std::memory_order_relaxed);
      } else {
        pos = tail_.load(std::memory_order_relaxed);
      }
    }
  }

  // Pops a task; an inline input is copied to input_dst (which must hold
  // kInline bytes) before the cell is handed back to producers.
  bool pop(QueuedTask *t, uint8_t *(*input_dst)(void *, uint32_t), void *ctx) {
    uint64_t pos = head_.load(std::memory_order_relaxed);
    for (;;) {
      Cell &c = cells_[pos & mask_];
      uint64_t seq = c.seq.load(std::memory_order_acquire);
      int64_t diff = int64_t(seq) - int64_t(pos + 1);
      if (diff == 0) {
        if (head_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          *t = c.task;
          if (t->input_size && t->input_size <= kInline)
            std::memcpy(input_dst(ctx, t->slot), c.data, t->input_size);
          c.seq.store(pos + mask_ + 1, std::memory_order_release);
          return true;
        }
      } else if (diff < 0) {
        return false;
      } else {
        pos = head_.load(std::memory_order_relaxed);
      }
    }
  }

  // A hint: polls the head cell itself, so the producer's write of that cell
  // is what wakes the poller (no separate tail line to bounce).
  bool maybe_nonempty() const {
    uint64_t pos = head_.load(std::memory_order_relaxed);
    return cells_[pos & mask_].seq.load(std::memory_order_acquire) == pos + 1;
  }

 private:
  struct alignas(128) Cell {
    std::atomic<uint64_t> seq;
    QueuedTask task;
    uint8_t data[kInline];
  };
  static_assert(sizeof(Cell) == 128, "a cell is two cache lines");
  std::unique_ptr<Cell[]> cells_;
  uint64_t mask_ = 0;
  alignas(64) std::atomic<uint64_t> head_{0};
  alignas(64) std::atomic<uint64_t> tail_{0};
};

}  // namespace chi

// Lock-free MPMC run queue of tasks (Vyukov's sequence-per-cell design)
// whose cells carry the task header and, up to kInline bytes, the input
// itself: a worker polling the head cell gets the notification, the method
// and the input in the same two cache lines.
//
// The ring is small and fixed; a task that finds it full spills into a
// FIFO list under a mutex, linked through a per-slot table, so a pool with a
// hundred thousand tasks queued needs no ring that large (a ring's cells are
// all touched as positions cycle, however few tasks are queued at once).
// While the list holds tasks, new ones join its end: tasks leave in the
// order they came.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>

#include "core/zeroed.h"

namespace chi {

struct QueuedTask {
  uint32_t slot;
  uint32_t method;
  uint32_t input_size;
};

// One per task slot of an executor, shared by its queues (a slot is queued
// in at most one of them at a time).
struct SpillLink {
  uint32_t method;
  uint32_t input_size;
  uint32_t next;  // slot + 1 of the next spilled task, 0: none
};

class RunQueue {
 public:
  static constexpr uint32_t kInline = 104;

  // ring_cells must be a power of two.  links has an entry per slot.  Cells
  // start as zero pages: a stored sequence is relative to its cell's index,
  // so the all-zero cell is the free cell of the first lap.
  void init(uint32_t ring_cells, SpillLink *links) {
    cells_.allocate(ring_cells);
    mask_ = ring_cells - 1;
    links_ = links;
  }

  // Queues a task.  An input of at most kInline bytes travels in the ring
  // cell, or is copied to slot_input if the task spills; larger inputs must
  // already be in the slot's input buffer.  Never fails: a full ring spills.
  void push(const QueuedTask &t, const void *input, uint8_t *slot_input) {
    if (!try_push(t, input)) spill(t, input, slot_input);
  }

  // Queues a task in the ring unless the ring is full, its cell at the tail
  // is still held by a consumer of the previous lap (one descheduled between
  // its claim and its hand-back), or tasks wait in the spill list (they go
  // first).  False: nothing was queued; push elsewhere or spill().
  bool try_push(const QueuedTask &t, const void *input) {
    return spilled_.load(std::memory_order_acquire) == 0 && push_ring(t, input);
  }

  // Queues tasks t[0..n) in order in consecutive ring cells claimed with one
  // CAS of the tail; inputs[i] is task i's input (as try_push).  Returns how
  // many were queued, a prefix: 0 when the ring is full, held up at its tail
  // or spilling; fewer than n when only that many cells were free.
  uint32_t try_push_many(const QueuedTask *t, const void *const *inputs, uint32_t n) {
    if (n == 0 || spilled_.load(std::memory_order_acquire) != 0) return 0;
    uint64_t pos = tail_.load(std::memory_order_relaxed);
    for (;;) {
      // Cells free for this lap at pos, pos + 1, ...: no producer can take
      // them before our CAS of the tail (it would move the tail first), and
      // their consumers of the previous lap are done with them.
      uint32_t m = 0;
      while (m < n && seq_at(pos + m) == pos + m) ++m;
      if (m == 0) {
        if (int64_t(seq_at(pos)) - int64_t(pos) < 0) return 0;
        pos = tail_.load(std::memory_order_relaxed);
        continue;
      }
      if (tail_.compare_exchange_weak(pos, pos + m, std::memory_order_relaxed)) {
        for (uint32_t i = 0; i < m; ++i) {
          Cell &c = cells_[(pos + i) & mask_];
          c.task = t[i];
          if (t[i].input_size && t[i].input_size <= kInline) std::memcpy(c.data, inputs[i], t[i].input_size);
          set_seq(pos + i, pos + i + 1);
        }
        __builtin_prefetch(&cells_[(pos + m) & mask_], 1);
        return m;
      }
    }
  }

  // Queues a task at the end of the spill list (see push()).
  void spill(const QueuedTask &t, const void *input, uint8_t *slot_input) {
    if (t.input_size && t.input_size <= kInline) std::memcpy(slot_input, input, t.input_size);
    SpillLink &l = links_[t.slot];
    l.method = t.method;
    l.input_size = t.input_size;
    l.next = 0;
    std::lock_guard<std::mutex> lock(spill_mu_);
    if (spill_tail_) links_[spill_tail_ - 1].next = t.slot + 1;
    else spill_head_ = t.slot + 1;
    spill_tail_ = t.slot + 1;
    spilled_.fetch_add(1, std::memory_order_release);
  }

  // Pops a task; an inline input is copied to input_dst (which must hold
  // kInline bytes) before the cell is handed back to producers.
  bool pop(QueuedTask *t, uint8_t *(*input_dst)(void *, uint32_t), void *ctx) {
    if (pop_ring(t, input_dst, ctx)) return true;
    if (spilled_.load(std::memory_order_acquire) == 0) return false;
    std::lock_guard<std::mutex> lock(spill_mu_);
    if (!spill_head_) return false;
    uint32_t slot = spill_head_ - 1;
    const SpillLink &l = links_[slot];
    spill_head_ = l.next;
    if (!spill_head_) spill_tail_ = 0;
    *t = QueuedTask{slot, l.method, l.input_size};
    spilled_.fetch_sub(1, std::memory_order_release);
    return true;
  }

  // Pops up to `most` (<= kMaxPopMany) tasks of the ring with one CAS of the
  // head: half of the ready run at the head (rounded up), in order, so the
  // rest is left to other consumers.  Inline inputs are copied out before the
  // cells are handed back, then to input_dst, as pop().  Returns how many
  // (0: the ring is empty; the spill list is left to pop()).
  static constexpr uint32_t kMaxPopMany = 8;
  uint32_t pop_many(QueuedTask *t, uint32_t most, uint8_t *(*input_dst)(void *, uint32_t), void *ctx) {
    if (most > kMaxPopMany) most = kMaxPopMany;
    if (most == 0) return 0;
    uint64_t pos = head_.load(std::memory_order_relaxed);
    for (;;) {
      uint32_t m = 0;
      while (m < 2 * most && seq_at(pos + m) == pos + m + 1) ++m;
      if (m == 0) {
        if (int64_t(seq_at(pos)) - int64_t(pos + 1) < 0) return 0;
        pos = head_.load(std::memory_order_relaxed);
        continue;
      }
      m = (m + 1) / 2;
      if (m > most) m = most;
      if (!head_.compare_exchange_weak(pos, pos + m, std::memory_order_relaxed)) continue;
      // As pop_ring: every cell handed back before any slot is touched.
      uint8_t in[kMaxPopMany][kInline];
      for (uint32_t i = 0; i < m; ++i) take_cell(pos + i, &t[i], in[i]);
      for (uint32_t i = 0; i < m; ++i)
        if (t[i].input_size && t[i].input_size <= kInline)
          std::memcpy(input_dst(ctx, t[i].slot), in[i], t[i].input_size);
      return m;
    }
  }

  // A hint: polls the head cell itself, so the producer's write of that cell
  // is what wakes the poller (no separate tail line to bounce).
  bool maybe_nonempty() const {
    uint64_t pos = head_.load(std::memory_order_relaxed);
    return seq_at(pos) == pos + 1 || spilled_.load(std::memory_order_acquire) != 0;
  }

 private:
  struct alignas(128) Cell {
    std::atomic<uint64_t> seq;  // the sequence minus the cell's index
    QueuedTask task;
    uint8_t data[kInline];
  };
  static_assert(sizeof(Cell) == 128, "a cell is two cache lines");

  uint64_t seq_at(uint64_t pos) const {
    return cells_[pos & mask_].seq.load(std::memory_order_acquire) + (pos & mask_);
  }
  void set_seq(uint64_t pos, uint64_t seq) {
    cells_[pos & mask_].seq.store(seq - (pos & mask_), std::memory_order_release);
  }

  bool push_ring(const QueuedTask &t, const void *input) {
    uint64_t pos = tail_.load(std::memory_order_relaxed);
    for (;;) {
      int64_t diff = int64_t(seq_at(pos)) - int64_t(pos);
      if (diff == 0) {
        if (tail_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          Cell &c = cells_[pos & mask_];
          c.task = t;
          if (t.input_size && t.input_size <= kInline) std::memcpy(c.data, input, t.input_size);
          set_seq(pos, pos + 1);
          // The next push likely lands on the next cell: own its line before then.
          __builtin_prefetch(&cells_[(pos + 1) & mask_], 1);
          return true;
        }
      } else if (diff < 0) {
        // Full, or the cell's consumer of the previous lap has not handed it
        // back yet: the task spills either way, nothing waits.
        return false;
      } else {
        pos = tail_.load(std::memory_order_relaxed);
      }
    }
  }

  // Copies the task of the cell at pos (claimed by the caller) and its
  // inline input to `in`, then hands the cell back to producers.
  void take_cell(uint64_t pos, QueuedTask *t, uint8_t *in) {
    Cell &c = cells_[pos & mask_];
    *t = c.task;
    if (t->input_size && t->input_size <= kInline) std::memcpy(in, c.data, t->input_size);
    set_seq(pos, pos + mask_ + 1);  // release: our reads of the cell come first
  }

  bool pop_ring(QueuedTask *t, uint8_t *(*input_dst)(void *, uint32_t), void *ctx) {
    uint64_t pos = head_.load(std::memory_order_relaxed);
    for (;;) {
      int64_t diff = int64_t(seq_at(pos)) - int64_t(pos + 1);
      if (diff == 0) {
        if (head_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          // Until set_seq hands the cell back, a producer a lap ahead cannot
          // use it: copy out to the stack and hand it back before touching
          // the slot (which may miss in cache or fault a fresh page in), so
          // a consumer descheduled here holds up the ring as briefly as can be.
          uint8_t in[kInline];
          take_cell(pos, t, in);
          if (t->input_size && t->input_size <= kInline) std::memcpy(input_dst(ctx, t->slot), in, t->input_size);
          return true;
        }
      } else if (diff < 0) {
        return false;
      } else {
        pos = head_.load(std::memory_order_relaxed);
      }
    }
  }

  ZeroedArray<Cell> cells_;
  uint64_t mask_ = 0;
  SpillLink *links_ = nullptr;
  alignas(64) std::atomic<uint64_t> head_{0};
  alignas(64) std::atomic<uint64_t> tail_{0};
  // Read by every push and by pops that find the ring empty; written only
  // while tasks spill.
  alignas(64) std::atomic<uint32_t> spilled_{0};
  std::mutex spill_mu_;
  uint32_t spill_head_ = 0;  // slot + 1, under spill_mu_
  uint32_t spill_tail_ = 0;
};

}  // namespace chi

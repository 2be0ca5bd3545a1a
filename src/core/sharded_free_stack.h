// Free task slots in shards: a Treiber stack per shard of threads (chosen by
// the caller, e.g. thread_index() % shards()), all linked through one index
// array.  A thread that submits and waits takes and returns slots on its own
// shard's head, a line no other thread writes, instead of a single head that
// every submitter and waiter of the process would CAS on twice per task.  A
// thread whose shard is empty takes from the others (slots freed by another
// thread, e.g. one that only waits), starting where it last found some.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "core/zeroed.h"

namespace chi {

class ShardedFreeStack {
 public:
  static constexpr uint32_t kNone = 0xFFFFFFFFu;

  void init(uint32_t capacity, uint32_t shards) {
    next_.allocate(capacity);
    shards_ = shards;
    heads_.reset(new Head[shards]);
    for (uint32_t i = 0; i < shards; ++i) heads_[i].word.store(pack(0, kNone), std::memory_order_relaxed);
  }
  uint32_t shards() const { return shards_; }

  void push(uint32_t shard, uint32_t index) { push_many(shard, &index, 1); }

  // Pushes indices[0..n) (n >= 1) with one CAS: they are chained among
  // themselves first, so the head's line moves once for the whole group.
  void push_many(uint32_t shard, const uint32_t *indices, uint32_t n) {
    for (uint32_t i = 0; i + 1 < n; ++i) next_[indices[i]].store(indices[i + 1], std::memory_order_relaxed);
    std::atomic<uint64_t> &head = heads_[shard].word;
    uint64_t old = head.load(std::memory_order_relaxed);
    for (;;) {
      next_[indices[n - 1]].store(index_of(old), std::memory_order_relaxed);
      // Release: whoever pops an index sees its link and everything the
      // freeing thread wrote to the slot before (its state word: free).
      if (head.compare_exchange_weak(old, pack(tag_of(old) + 1, indices[0]), std::memory_order_release,
                                     std::memory_order_relaxed))
        return;
    }
  }

  // Up to max free indices in one CAS: from `shard`, else from the first
  // other shard that has some (as pop()).  Returns how many (0: none free).
  uint32_t pop_many(uint32_t shard, uint32_t max, uint32_t *out, uint32_t *hint) {
    if (uint32_t n = pop_chain(shard, max, out)) return n;
    uint32_t s = *hint < shards_ ? *hint : 0;
    for (uint32_t k = 0; k < shards_; ++k, s = s + 1 == shards_ ? 0 : s + 1) {
      if (s == shard) continue;
      // A plain load first: an empty shard costs a shared read, not a CAS.
      if (index_of(heads_[s].word.load(std::memory_order_relaxed)) == kNone) continue;
      if (uint32_t n = pop_chain(s, max, out)) {
        *hint = s;
        return n;
      }
    }
    return 0;
  }

  // A free index from `shard`, else from any other shard.  *hint (per thread,
  // may be shared by several stacks: only a starting point) remembers where
  // the last one came from.
  bool pop(uint32_t shard, uint32_t *index, uint32_t *hint) {
    if (pop_one(shard, index)) return true;
    uint32_t s = *hint < shards_ ? *hint : 0;
    for (uint32_t k = 0; k < shards_; ++k, s = s + 1 == shards_ ? 0 : s + 1) {
      if (s == shard) continue;
      // A plain load first: an empty shard costs a shared read, not a CAS.
      if (index_of(heads_[s].word.load(std::memory_order_relaxed)) == kNone) continue;
      if (pop_one(s, index)) {
        *hint = s;
        return true;
      }
    }
    return false;
  }

 private:
  struct alignas(64) Head {
    std::atomic<uint64_t> word;  // tag (32) | top index (32)
  };
  static uint64_t pack(uint32_t tag, uint32_t index) { return (uint64_t(tag) << 32) | index; }
  static uint32_t tag_of(uint64_t v) { return uint32_t(v >> 32); }
  static uint32_t index_of(uint64_t v) { return uint32_t(v); }

  bool pop_one(uint32_t shard, uint32_t *index) {
    std::atomic<uint64_t> &head = heads_[shard].word;
    uint64_t old = head.load(std::memory_order_acquire);
    for (;;) {
      const uint32_t top = index_of(old);
      if (top == kNone) return false;
      // next_[top] may be stale if another thread popped `top` meanwhile (and
      // perhaps pushed it on another shard, rewriting next_[top]): that pop
      // bumped this head's tag, so the CAS below fails and the stale value is
      // never installed.  next_[top] is written only by a push of `top`, which
      // needs `top` popped from here first.
      const uint32_t next = next_[top].load(std::memory_order_relaxed);
      if (head.compare_exchange_weak(old, pack(tag_of(old) + 1, next), std::memory_order_acquire,
                                     std::memory_order_acquire)) {
        *index = top;
        return true;
      }
    }
  }

  // Up to max indices off the top of one shard.  The walk may read links
  // that change under it (another thread may pop an index meanwhile and push
  // it on another shard, rewriting its link), but any pop or push of this
  // shard meanwhile bumps the tag and fails the CAS, and a link read is
  // always an index or kNone, so a walk that wins the CAS read the chain as
  // it stood.
  uint32_t pop_chain(uint32_t shard, uint32_t max, uint32_t *out) {
    std::atomic<uint64_t> &head = heads_[shard].word;
    uint64_t old = head.load(std::memory_order_acquire);
    for (;;) {
      uint32_t n = 0, at = index_of(old);
      while (n < max && at != kNone) {
        out[n++] = at;
        at = next_[at].load(std::memory_order_relaxed);
      }
      if (n == 0) return 0;
      if (head.compare_exchange_weak(old, pack(tag_of(old) + 1, at), std::memory_order_acquire,
                                     std::memory_order_acquire))
        return n;
    }
  }

  ZeroedArray<std::atomic<uint32_t>> next_;
  std::unique_ptr<Head[]> heads_;
  uint32_t shards_ = 0;
};

}  // namespace chi

// The state word of a task slot behind a future, and the steps that move it:
// one state machine for the CPU pool's slots, a ZeroMQ client's slots, a
// shared-memory client's private words (whose "done" lives in the segment)
// and the CPU->GPU executor's words (whose "done" is the GPU's completion
// record: gpu/h2d_executor.cpp).
//
//   word = generation (24 bits) << 8 | state (low 7 bits) | kSleeper
//
//   free --begin--> pending --publish--> done --claim--> claimed --free--> free
//                      |                   |
//                      +--orphan--> orphan +--orphan (release of a done task)--> claimed
//                                     |
//                                     +--publish: the completer frees it
//
// A client process's task in the CPU pool (no future names it) has its own
// path: remote --start (a worker)--> running, or remote --cancel (its client
// left, or the server stops)--> cancelled; one CAS decides which, so a
// cancelled task never runs and a started one is never cancelled.
//
// One 32-bit word, so that a waiter can futex-sleep on it directly.  Pending
// and done have the values of the shared segment's kSlotSubmitted/kSlotDone
// (ipc/segment.h), so one wait serves both.
#pragma once

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "base/error.h"
#include "base/futex.h"
#include "chimaera.h"
#include "core/executor.h"

namespace chi::slot {

enum : uint32_t {
  kFree = 0,
  kPending = 1,  // queued or running
  kDone = 2,     // the result is in the slot
  kOrphan = 3,   // released before done: the completer frees it
  kClaimed = 4,  // a waiter or chi_release is taking the result
  kRemote = 5,   // CPU pool: a client process's task, no future names it, queued
  kRemoteRunning = 6,    // its worker started it: it runs to the end
  kRemoteCancelled = 7,  // never to run: the worker that pops it frees the slot
  kStateMask = 0x7F,
  kSleeper = 0x80,  // a waiter sleeps on the word: whoever changes it wakes it
};
inline uint32_t word(uint32_t gen, uint32_t st) { return (gen << 8) | st; }
inline uint32_t gen_of(uint32_t w) { return w >> 8; }
inline uint32_t state_of(uint32_t w) { return w & kStateMask; }

// Futures of a slot's current generation may use it while it is pending or done.
inline bool live(uint32_t w, uint32_t gen) {
  return gen_of(w) == gen && (state_of(w) == kPending || state_of(w) == kDone);
}

// Takes a free slot for a new task: the next generation, in state st.
inline uint32_t begin(std::atomic<uint32_t> &s, uint32_t st = kPending) {
  const uint32_t gen = (gen_of(s.load(std::memory_order_relaxed)) + 1) & kGenMask;
  s.store(word(gen, st), std::memory_order_release);
  return gen;
}

// begin() for a slot whose completion is a record that carries the
// generation and starts zeroed (a GPU's LL completion record): generation 0
// would read as done before the task ran, so it is skipped.
inline uint32_t begin_nonzero(std::atomic<uint32_t> &s) {
  uint32_t gen = (gen_of(s.load(std::memory_order_relaxed)) + 1) & kGenMask;
  if (gen == 0) gen = 1;
  s.store(word(gen, kPending), std::memory_order_release);
  return gen;
}

// The generation stays, so that every future of the slot is now stale.
inline void set_free(std::atomic<uint32_t> &s) {
  s.store(word(gen_of(s.load(std::memory_order_relaxed)), kFree), std::memory_order_release);
}

inline void wake(std::atomic<uint32_t> &s, bool shared) {
  if (shared)
    futex_wake_shared(&s);
  else
    futex_wake(&s);
}

// The completer's step, after it wrote the result: pending -> done.  Returns
// kDone, or kOrphan (released meanwhile: the caller frees the slot), or kFree
// when the word holds no pending task of `gen` (a stale result: ignored).
// Wakes a sleeper either way.
inline uint32_t publish(std::atomic<uint32_t> &s, uint32_t gen, bool shared = false) {
  uint32_t cur = s.load(std::memory_order_relaxed);
  for (;;) {
    if (gen_of(cur) != gen) return kFree;
    const uint32_t st = state_of(cur);
    if (st == kOrphan) {
      if (cur & kSleeper) wake(s, shared);  // a waiter raced with chi_release
      return kOrphan;
    }
    if (st != kPending) return kFree;
    // Release: the waiter that sees kDone sees the output and status.
    if (s.compare_exchange_weak(cur, word(gen, kDone), std::memory_order_acq_rel, std::memory_order_relaxed))
      break;
  }
  if (cur & kSleeper) wake(s, shared);
  return kDone;
}

// A remote task's step out of the queue (st: kRemoteRunning when a worker
// starts it, kRemoteCancelled when it is cancelled); false when the other
// step came first, or the word holds no queued task of gen.
inline bool leave_queue(std::atomic<uint32_t> &s, uint32_t gen, uint32_t st) {
  uint32_t w = word(gen, kRemote);
  return s.compare_exchange_strong(w, word(gen, st), std::memory_order_acq_rel, std::memory_order_relaxed);
}

// The waiter's step, from the word it saw finished (`seen`) to claimed: of
// several threads waiting on one future, exactly one consumes it.
inline bool claim(std::atomic<uint32_t> &s, uint32_t seen) {
  return s.compare_exchange_strong(seen, word(gen_of(seen), kClaimed), std::memory_order_acq_rel);
}

// chi_release's step: pending -> orphan (returns kOrphan: the completer frees
// the slot), done -> claimed (returns kClaimed: the caller frees it), or kFree
// when no future of gen holds the slot.
inline uint32_t orphan(std::atomic<uint32_t> &s, uint32_t gen) {
  uint32_t w = s.load(std::memory_order_acquire);
  while (gen_of(w) == gen) {
    const uint32_t st = state_of(w);
    if (st == kPending) {
      if (s.compare_exchange_weak(w, word(gen, kOrphan) | (w & kSleeper), std::memory_order_acq_rel))
        return kOrphan;
    } else if (st == kDone) {
      if (s.compare_exchange_weak(w, word(gen, kClaimed), std::memory_order_acq_rel)) return kClaimed;
    } else {
      break;
    }
  }
  return kFree;
}

// chi_release on a slot whose completer frees orphans: CHI_OK (orphaned, or
// done and freed now by free_slot()), else CHI_ERR_INVALID with the message.
template <class Free>
chi_status_t release(std::atomic<uint32_t> &s, uint32_t gen, Free free_slot) {
  switch (orphan(s, gen)) {
    case kOrphan:
      return CHI_OK;
    case kClaimed:
      free_slot();
      return CHI_OK;
    default:
      return set_error(CHI_ERR_INVALID, "stale future: already waited on or released");
  }
}

// What a wait does besides watching the word; every hook is called at most
// once per clock read (kPollsPerClockRead polls of the word).
//   gone():  cheap: the peer is known to be gone (the wait then ends with
//            CHI_ERR_DISCONNECTED unless the result came just before);
//   help():  a worker's nested wait runs a queued task; true when it did;
//   alive(): may cost a system call: asked only before each sleep.
struct WaitPolicy {
  bool shared = false;    // the word lives in memory shared between processes
  int64_t spin_ns = 0;    // spin this long before the first sleep
  int64_t yield_ns = 0;   // then poll with sched_yield() between looks this long
  int64_t slice_ns = -1;  // sleep at most this long at a time (< 0: no bound)
  bool helper = false;    // help() may run tasks: ask it at every poll
};

constexpr unsigned kPollsPerClockRead = 32;  // a clock read costs ~20-50 ns

// Waits while `s` holds the pending task of gen: spins, then polls giving
// the CPU away (sched_yield) for p.yield_ns, then sets kSleeper and sleeps on
// the word (whoever changes it wakes the sleeper).  A yielding waiter costs
// the one that finishes the task no wake-up: with more waiting processes
// than CPUs, the server's pollers then spend their time on tasks, not on
// futex_wake calls (the 256-client sweep, lab/journal/server.md).  *seen: the word
// that ended the wait.  Returns CHI_OK (the task is no longer pending: done,
// or released by another thread), CHI_ERR_TIMEOUT, or CHI_ERR_DISCONNECTED
// (from gone()/alive()); sets no message.
template <class Gone, class Help, class Alive>
chi_status_t wait(std::atomic<uint32_t> &s, uint32_t gen, int64_t timeout_ns, const WaitPolicy &p, Gone gone,
                  Help help, Alive alive, uint32_t *seen) {
  const uint32_t pending = word(gen, kPending);
  const int64_t start = now_ns();
  const int64_t spin_end = start + p.spin_ns;
  const int64_t yield_end = spin_end + p.yield_ns;
  uint32_t w = s.load(std::memory_order_acquire);
  unsigned polls = 0;
  while ((w & ~kSleeper) == pending) {
    // Between clock reads, poll the word only: completion is seen sooner.
    if (++polls % kPollsPerClockRead != 0 && !p.helper) {
      cpu_relax();
      w = s.load(std::memory_order_acquire);
      continue;
    }
    if (gone()) {
      w = s.load(std::memory_order_acquire);  // the result may have come just before
      if ((w & ~kSleeper) == pending) return CHI_ERR_DISCONNECTED;
      break;
    }
    const int64_t now = now_ns();
    if (timeout_ns >= 0 && now - start >= timeout_ns) return CHI_ERR_TIMEOUT;
    if (help()) {
      w = s.load(std::memory_order_acquire);
      continue;
    }
    if (now < spin_end) {
      cpu_relax();
      w = s.load(std::memory_order_acquire);
      continue;
    }
    if (now < yield_end) {
      sched_yield();
      w = s.load(std::memory_order_acquire);
      continue;
    }
    if (!alive()) {
      w = s.load(std::memory_order_acquire);
      if ((w & ~kSleeper) == pending) return CHI_ERR_DISCONNECTED;
      break;
    }
    const uint32_t want = w | kSleeper;
    if (w != want && !s.compare_exchange_strong(w, want, std::memory_order_acq_rel, std::memory_order_acquire))
      continue;
    int64_t left = p.slice_ns;
    if (timeout_ns >= 0) {
      const int64_t rest = std::max<int64_t>(0, timeout_ns - (now_ns() - start));
      left = left < 0 ? rest : std::min(left, rest);
    }
    if (left != 0) futex_wait_op(&s, want, left < 0 ? -1 : left, p.shared ? FUTEX_WAIT : FUTEX_WAIT_PRIVATE);
    w = s.load(std::memory_order_acquire);
  }
  *seen = w;
  return CHI_OK;
}

}  // namespace chi::slot

// Parking an idle GPU's orchestrator without stranding a task: the
// handshake between the submitters of its CPU->GPU ring and the thread that
// decides to park it (docs/gpu.md, "Parked GPUs").
//
// A submitter takes its ticket with a seq_cst read-modify-write of the ring's
// tail, writes its entry, then loads the gate word (seq_cst).  The parker,
// having seen the tail unchanged for the keep-alive, stores kParked (seq_cst)
// and loads the tail again (seq_cst).  In the single order of seq_cst
// operations either the submitter's ticket comes before the parker's load
// (the parker sees the tail moved and takes the park back) or after it, and
// then the submitter's load of the word comes after the parker's store and
// sees kParked (or kWanted, or kAwake once someone restarted the GPU after
// that store: a start that comes after the entry's ticket).  So every task
// whose ticket was taken is either seen by a parker that stays, or asks for a
// start, or follows a start.
//
// Of the submitters that see kParked, the one whose CAS turns it into kWanted
// calls the waker, which starts the GPU on its own thread or, when it cannot
// (the owner's lock is taken), says so: then the parker's thread, asleep on
// the word while it is kParked, is woken to do it.  The others need nothing
// more: a start is on its way.
//
// No clock, no CUDA: tests/test_park_gate.cpp drives it with threads.
#pragma once

#include <atomic>
#include <cstdint>

#include "base/futex.h"

namespace chi {

class ParkGate {
 public:
  enum : uint32_t { kAwake = 0, kParked = 1, kWanted = 2 };
  // True: it started the GPU (or found it started); false: the parker's
  // thread must.
  using WakeFn = bool (*)(void *arg);

  // Called by the submitter that turned kParked into kWanted, on its thread,
  // after the word changed; set before any submit.
  void set_waker(WakeFn fn, void *arg) {
    fn_ = fn;
    arg_ = arg;
  }

  // A submitter, before it prepares its task: an early start, so that the
  // launch overlaps the rest of the submit.  Optional: after_submit() is
  // what makes the handshake sound.
  void before_submit() {
    if (word_.load(std::memory_order_relaxed) == kParked) ask();
  }

  // A submitter, after its ticket (a seq_cst RMW) and its entry.
  void after_submit() {
    if (word_.load(std::memory_order_seq_cst) == kParked) ask();
  }

  // Asks a parked GPU to start; true if this call won the ask.
  bool ask() {
    uint32_t parked = kParked;
    if (!word_.compare_exchange_strong(parked, kWanted, std::memory_order_seq_cst)) return false;
    asks_.fetch_add(1, std::memory_order_relaxed);
    // The start first: a wake-up of the parker's thread before it would
    // delay the launch on the submitter's thread by a system call.
    if (!fn_ || !fn_(arg_)) futex_wake(&word_);
    return true;
  }

  // The parker, holding the owner's lock, after it saw the ring quiet with
  // tail `quiet_tail` (and nothing in flight): parks unless `tail()` (a
  // seq_cst load of the ring's tail) moved since.  False: took it back.
  template <class Tail>
  bool try_park(uint64_t quiet_tail, Tail &&tail) {
    word_.store(kParked, std::memory_order_seq_cst);
    if (tail() == quiet_tail) return true;
    word_.store(kAwake, std::memory_order_seq_cst);
    return false;
  }

  // The owner, holding its lock, starts the GPU again (asked or not), and
  // wakes the parker's thread (nudge) once the start is under way.
  void unpark() { word_.store(kAwake, std::memory_order_seq_cst); }

  uint32_t state() const { return word_.load(std::memory_order_seq_cst); }
  bool parked() const { return state() != kAwake; }
  bool wanted() const { return state() == kWanted; }

  // The parker's thread: sleeps while the GPU is parked and nobody asked, at
  // most ns (it re-checks its own reasons to wake, such as shutdown).
  void sleep(int64_t ns) { futex_wait(&word_, kParked, ns); }
  // Wakes a sleep() early (a start, shutdown, pause).
  void nudge() { futex_wake(&word_); }

  // Asks won so far (one per start a submitter caused).
  uint64_t asks() const { return asks_.load(std::memory_order_relaxed); }

 private:
  alignas(64) std::atomic<uint32_t> word_{kAwake};
  WakeFn fn_ = nullptr;
  void *arg_ = nullptr;
  std::atomic<uint64_t> asks_{0};
};

}  // namespace chi

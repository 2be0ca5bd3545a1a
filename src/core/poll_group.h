// Poller threads that share one ring, each serving its own part of it (a
// part is a ticket sequence: p, p + parts, p + 2 parts, ...), and that park
// together when idle, so an idle group costs one thread's naps instead of
// every thread's.
//
// A part is served by whoever holds it: its owner while active; while the
// owner is parked, the group's watcher.  The watcher is the one parked
// poller that keeps polling: it passes over every part it can take, serves
// what is published there, naps between passes (IdleBackoff: spin after
// work, then naps growing up to watch_max_ns), and wakes a part's owner only
// when that part keeps it busy (kWakeAfter tasks between two naps), so
// sporadic tasks are served without waking anyone.  The others sleep on a
// futex word of their own part.  When its own part gets busy the watcher
// goes back to work and wakes the sleepers, one of which takes over.
//
// A group may have a bell (PollBell): something outside that can wake the
// watcher when a ticket at or past a given one is taken, such as the GPU's
// orchestrator ending its launch (docs/gpu.md, "Idle GPU->CPU pollers").
// Once the watcher's naps reach watch_max_ns and every other poller sleeps,
// it arms the bell with the first ticket nobody served, looks once more, and
// sleeps until kick() (or bell_check_ns) instead of napping: an idle group
// with a live bell costs no timed wake-ups.
//
// Used by the GPU->CPU pollers (gpu/cpu_poller.cpp); it knows nothing of
// their ring, so tests drive it with any ticket source.
#pragma once

#include <sched.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include "base/futex.h"
#include "core/idle_backoff.h"

namespace chi {

// Wakes a parked PollGroup without timed polls (see above).
class PollBell {
 public:
  virtual ~PollBell() = default;
  // True while a ticket taken at or past an armed one is sure to be
  // followed by PollGroup::kick() (false: the watcher naps instead).
  virtual bool live() const = 0;
  // Arms the bell for tickets >= first; disarm() takes it back.
  virtual void arm(uint64_t first) = 0;
  virtual void disarm() = 0;
  // How long the watcher sleeps on the bell at most, given the group's
  // setting: a bell that knows nothing can ring for a while (a parked GPU:
  // no kernel to take a ticket) may let it sleep longer.
  virtual int64_t check_ns(int64_t dflt) const { return dflt; }
};

class PollGroup {
 public:
  // Tasks the watcher serves from one part between two naps before it
  // wakes the part's owner (its own part: before it goes back to work).
  static constexpr uint32_t kWakeAfter = 32;
  // A sleeper re-checks the group this often even if nobody wakes it (a
  // safety net: every change it waits for also wakes it).
  static constexpr int64_t kSleeperCheckNs = 100000000;
  // The watcher calls on_watch at most this often (e.g. to reap).
  static constexpr int64_t kWatchHookNs = 1000000;

  explicit PollGroup(uint32_t parts) : n_(parts ? parts : 1), parts_(new Part[n_]) {
    for (uint32_t p = 0; p < n_; ++p) parts_[p].next = p;
  }
  uint32_t parts() const { return n_; }

  // Before the pollers start: the bell, and how long the watcher sleeps on
  // it at most (a safety net, and when on_watch runs while it sleeps).
  void set_bell(PollBell *bell, int64_t check_ns) {
    bell_ = bell;
    bell_check_ns_ = check_ns > 0 ? check_ns : kSleeperCheckNs;
  }
  // The bell rang (or stopped being live): the watcher, if it sleeps on it, looks again.
  void kick() {
    kicks_.fetch_add(1, std::memory_order_relaxed);
    kick_seq_.fetch_add(1, std::memory_order_seq_cst);
    futex_wake(&kick_seq_);
  }
  // For tests and diagnostics: times the watcher armed the bell and slept,
  // and kick() calls (stop() included).
  uint64_t bell_sleeps() const { return bell_sleeps_.load(std::memory_order_relaxed); }
  uint64_t kicks() const { return kicks_.load(std::memory_order_relaxed); }

  // The owner takes its part back (waiting while the watcher serves it) and
  // gets the part's next ticket.
  uint64_t take(uint32_t p) {
    Part &q = parts_[p];
    // The watcher holds it for at most kWakeAfter tasks.
    for (unsigned k = 1; q.held.exchange(1, std::memory_order_acquire) != 0; ++k)
      if (k % 64 == 0) sched_yield(); else cpu_relax();
    return q.next;
  }
  // The owner leaves its part, `next` its next ticket.
  void hand_over(uint32_t p, uint64_t next) {
    parts_[p].next = next;
    release(parts_[p]);
  }

  // Parks poller p, which handed its part over, until its part needs it or
  // the group stops.  serve(ticket) serves a published ticket (false: not
  // published yet); it gets the part's next ticket as an lvalue, which a
  // serve whose tickets others may also take (PollClaims::serve_for_group)
  // sets to the one it served, or to the next.  on_watch() runs on the
  // watcher now and then.  on_check() runs on a sleeper each time it wakes
  // on its own (every kSleeperCheckNs); true (it found work, e.g. stole
  // tasks a watcher held up in a handler left behind) ends its park unless
  // the watcher holds its part.
  template <class Serve, class OnWatch, class OnCheck>
  void park(uint32_t p, IdleBackoff &b, Serve &&serve, OnWatch &&on_watch, OnCheck &&on_check) {
    Part &me = parts_[p];
    for (;;) {
      if (stopping()) return;
      if (me.call.exchange(0, std::memory_order_seq_cst)) return;
      int32_t none = -1;
      if (watcher_.compare_exchange_strong(none, int32_t(p), std::memory_order_seq_cst)) {
        watch(p, b, serve, on_watch);
        return;
      }
      const uint32_t seq = me.wake.load(std::memory_order_seq_cst);
      if (stopping() || me.call.load(std::memory_order_seq_cst) ||
          watcher_.load(std::memory_order_seq_cst) < 0)
        continue;
      sleeping_.fetch_add(1, std::memory_order_relaxed);
      futex_wait(&me.wake, seq, kSleeperCheckNs);
      sleeping_.fetch_sub(1, std::memory_order_relaxed);
      // Not rung (its sleep ran out): the check, then back to sleep unless
      // it found work.
      if (me.wake.load(std::memory_order_seq_cst) == seq && !stopping() && on_check() &&
          me.held.load(std::memory_order_acquire) == 0)
        return;
    }
  }
  // park() without a sleeper check.
  template <class Serve, class OnWatch>
  void park(uint32_t p, IdleBackoff &b, Serve &&serve, OnWatch &&on_watch) {
    park(p, b, serve, on_watch, [] { return false; });
  }

  // Sleeps up to ns; stop() ends it early.
  void nap(int64_t ns) { futex_wait(&stop_seq_, stop_seq_.load(std::memory_order_acquire), ns); }

  void stop() {
    stopping_.store(true, std::memory_order_seq_cst);
    stop_seq_.fetch_add(1, std::memory_order_seq_cst);
    futex_wake(&stop_seq_);
    kick();
    for (uint32_t q = 0; q < n_; ++q) ring(parts_[q]);
  }
  bool stopping() const { return stopping_.load(std::memory_order_acquire); }
  // For tests and diagnostics: pollers asleep, and the watcher (-1: none).
  uint32_t sleeping() const { return sleeping_.load(std::memory_order_relaxed); }
  int32_t watcher() const { return watcher_.load(std::memory_order_seq_cst); }

 private:
  struct alignas(64) Part {
    std::atomic<uint32_t> held{0};  // 1 while a thread serves the part
    std::atomic<uint32_t> wake{0};  // futex word its parked owner sleeps on
    std::atomic<uint32_t> call{0};  // 1: its owner is wanted back
    uint64_t next = 0;              // its next ticket, while nobody holds it
  };

  static void release(Part &q) { q.held.store(0, std::memory_order_release); }
  static void ring(Part &q) {
    q.wake.fetch_add(1, std::memory_order_seq_cst);
    futex_wake(&q.wake, 1);
  }

  template <class Serve, class OnWatch>
  void watch(uint32_t p, IdleBackoff &b, Serve &&serve, OnWatch &&on_watch) {
    std::unique_ptr<uint32_t[]> streak(new uint32_t[n_]());
    int64_t last_hook = now_ns();
    bool mine_busy = false;
    while (!stopping() && !mine_busy) {
      bool served = false;
      for (uint32_t k = 0; k < n_; ++k) {
        const uint32_t q = (p + k) % n_;  // its own part first
        Part &part = parts_[q];
        if (part.held.exchange(1, std::memory_order_acquire) != 0) continue;  // its owner is back
        uint32_t got = 0;
        while (got < kWakeAfter && serve(part.next)) {
          part.next += n_;
          ++got;
        }
        release(part);
        if (!got) continue;
        served = true;
        streak[q] += got;
        if (streak[q] < kWakeAfter) continue;
        streak[q] = 0;
        if (q == p) {
          mine_busy = true;
        } else {
          part.call.store(1, std::memory_order_seq_cst);
          ring(part);
        }
      }
      if (served) b.reset();
      const int64_t now = now_ns();
      if (now - last_hook >= kWatchHookNs) {
        on_watch();
        last_hook = now;
      }
      if (served) continue;
      int64_t ns = 0;
      bool longest = false;  // the watcher's longest nap: the bell may replace it
      switch (b.idle(now_ns, &ns)) {
        case IdleBackoff::Step::kSpin:
          cpu_relax();
          continue;
        case IdleBackoff::Step::kNap:
          break;
        case IdleBackoff::Step::kPark:
          ns = b.watch_nap();
          longest = ns >= b.config().watch_max_ns;
          break;
      }
      for (uint32_t q = 0; q < n_; ++q) streak[q] = 0;
      if (longest && bell_sleep(b, serve)) {
        on_watch();
        last_hook = now_ns();
        continue;
      }
      nap(ns);
    }
    // Leaving: a sleeper takes over (the first to see the vacancy).
    watcher_.store(-1, std::memory_order_seq_cst);
    for (uint32_t q = 0; q < n_; ++q)
      if (q != p) ring(parts_[q]);
  }

  // The watcher p, idle for watch_max_ns with every other poller asleep:
  // arms the bell with the first ticket not served, looks at every part once
  // more (a task published before the bell was armed), then sleeps until
  // kick() or bell_check_ns_.  False: no live bell, or a poller is awake.
  template <class Serve>
  bool bell_sleep(IdleBackoff &b, Serve &serve) {
    // The kick count first: a kick after it (the bell no longer live, or
    // rung) ends the sleep below.
    const uint32_t seq = kick_seq_.load(std::memory_order_seq_cst);
    if (!bell_ || !bell_->live() || sleeping_.load(std::memory_order_seq_cst) + 1 < n_) return false;
    uint64_t first = ~uint64_t(0);
    for (uint32_t q = 0; q < n_; ++q) {
      if (parts_[q].held.exchange(1, std::memory_order_acquire) != 0) {
        // Its owner is back: it polls, and the watcher naps as before.
        for (uint32_t r = 0; r < q; ++r) release(parts_[r]);
        return false;
      }
      if (parts_[q].next < first) first = parts_[q].next;
    }
    bell_->arm(first);  // seq_cst: before the looks below
    bool served = false;
    for (uint32_t q = 0; q < n_; ++q) {
      Part &part = parts_[q];
      while (serve(part.next)) {
        part.next += n_;
        served = true;
      }
      release(part);
    }
    bool kicked = served;
    if (!served && !stopping()) {
      bell_sleeps_.fetch_add(1, std::memory_order_relaxed);
      futex_wait(&kick_seq_, seq, bell_->check_ns(bell_check_ns_));
      kicked = kick_seq_.load(std::memory_order_seq_cst) != seq;
    }
    bell_->disarm();
    // Rung (or work found): spin first, since the bell rings when a ticket
    // is taken and its task is published a little later, and an idle look
    // would only arm it again.  A sleep that ran out stays parked: the
    // next look arms the bell again.
    if (kicked) b.reset();
    return true;
  }

  const uint32_t n_;
  std::unique_ptr<Part[]> parts_;
  alignas(64) std::atomic<int32_t> watcher_{-1};
  std::atomic<uint32_t> sleeping_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<uint32_t> stop_seq_{0};
  PollBell *bell_ = nullptr;
  int64_t bell_check_ns_ = kSleeperCheckNs;
  alignas(64) std::atomic<uint32_t> kick_seq_{0};
  std::atomic<uint64_t> bell_sleeps_{0}, kicks_{0};
};

}  // namespace chi

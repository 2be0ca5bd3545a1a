// Work stealing between pollers that share one ring in parts (as PollGroup's
// parts: part p is tickets p, p + parts, p + 2 parts, ...).  Each part's
// next unserved ticket lives only in its claim word, on a cache line of its
// own.  Whoever serves a ticket -- the part's owner, a parked group's
// watcher, or an idle poller stealing it -- first reads the entry, then
// claims the ticket with a CAS of the word from t to t + parts, and serves
// it only if that CAS won: every ticket is served once, none is skipped, and
// a part's tickets are still claimed in order.
//
// Reading before claiming matters where a claimed ticket's entry may be
// reused at once (the GPU->CPU ring: a later ticket's task can write it as
// soon as the tickets between are served), while an unclaimed ticket's
// entry stays as written: a reader that won the claim read that ticket's
// entry, not a later one's.
//
// An idle poller steals (PollStealer) only a ticket it has seen published
// and unclaimed for steal_after_ns: an owner that makes progress moves the
// word on first.  Once it stole from a part, it takes that part's next
// tickets as they come while nobody else claims them.
//
// Used by the GPU->CPU pollers (gpu/cpu_poller.cpp); it knows nothing of
// their ring, so tests drive it with any ticket source.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

namespace chi {

class PollClaims {
 public:
  explicit PollClaims(uint32_t parts) : n_(parts ? parts : 1), words_(new Word[n_]) {
    for (uint32_t p = 0; p < n_; ++p) words_[p].next.store(p, std::memory_order_relaxed);
  }
  uint32_t parts() const { return n_; }

  // Part p's next unclaimed ticket.
  uint64_t next(uint32_t p) const { return words_[p].next.load(std::memory_order_acquire); }

  // Claims ticket t of part p.  True: the caller serves it.  False: another
  // claimed t first, and t becomes the part's next ticket.
  bool claim(uint32_t p, uint64_t &t) {
    return words_[p].next.compare_exchange_strong(t, t + n_, std::memory_order_acq_rel,
                                                  std::memory_order_acquire);
  }

  // Serves part p's next ticket if it is published.  t: the part's next
  // ticket as the caller last saw it (a hint); on return, the next ticket as
  // far as the caller knows.  read(t) reads ticket t's entry into the
  // caller's buffers if it is published and still t's (false if not);
  // serve(t) serves what read(t) read.  retry: after losing a claim, go on
  // with the part's new next ticket (owners, the watcher); else give up (a
  // stealer).  True: one ticket served.
  template <class Read, class Serve>
  bool claim_and_serve(uint32_t p, uint64_t &t, bool retry, Read &&read, Serve &&serve) {
    for (;;) {
      if (!read(t)) {
        const uint64_t c = next(p);
        const bool moved = c != t;
        t = c;
        if (moved && retry) continue;  // served by another meanwhile: look at the new one
        return false;
      }
      if (claim(p, t)) {
        serve(t);
        t += n_;
        return true;
      }
      if (!retry) return false;
    }
  }

  // PollGroup's serve (PollGroup::park) over claim_and_serve: the group
  // hands a part's next ticket as it knows it and moves it on by one part
  // after a task; others may have claimed since, so t is set from the claim
  // word (on a task: to the ticket served).
  template <class Read, class Serve>
  bool serve_for_group(uint64_t &t, Read &&read, Serve &&serve) {
    uint64_t next = t;
    const bool got = claim_and_serve(uint32_t(t % n_), next, true, read, serve);
    t = got ? next - n_ : next;
    return got;
  }

 private:
  struct alignas(64) Word {
    std::atomic<uint64_t> next{0};
  };
  const uint32_t n_;
  std::unique_ptr<Word[]> words_;
};

// One poller's view of the other parts, for stealing (one per poller
// thread; not thread-safe).
class PollStealer {
 public:
  // Tickets taken from one part in a row before the stealer looks at its
  // own part again (PollGroup::kWakeAfter, the watcher's batch).
  static constexpr uint32_t kBatch = 32;

  // `self`: this poller's part, never stolen from.  steal_after_ns <= 0:
  // never steal (look() does nothing).
  PollStealer(PollClaims &claims, uint32_t self, int64_t steal_after_ns)
      : claims_(claims), self_(self), after_ns_(steal_after_ns), seen_(new Seen[claims.parts()]) {}

  bool enabled() const { return after_ns_ > 0 && claims_.parts() > 1; }
  // The steal delay, in ns (<= 0: never steals).
  int64_t delay_ns() const { return after_ns_; }
  // Whether the last look saw some part's next ticket published and
  // unclaimed (a look after the delay would take it unless its owner does).
  bool tracking() const {
    for (uint32_t q = 0; q < claims_.parts(); ++q)
      if (q != self_ && seen_[q].ticket != kNone) return true;
    return false;
  }

  // A parked poller's occasional check (PollGroup::park's on_check): a look
  // now, and if it saw a task waiting, another after the delay (naps with
  // nap(ns)).  Returns the tickets served.
  template <class Nap, class Now, class Published, class Read, class Serve>
  uint32_t check(Nap &&nap, Now &&now, Published &&published, Read &&read, Serve &&serve) {
    if (!enabled()) return 0;
    uint32_t got = look(now(), published, read, serve);
    if (got || !tracking()) return got;
    nap(after_ns_);
    return look(now(), published, read, serve);
  }

  // One look at the other parts at time `now` (ns, any clock that only
  // moves forward; the caller's, so that a look costs no clock read).  A
  // part whose next ticket has been published and unclaimed since a look at
  // least steal_after_ns ago has it stolen, with the tickets after it while
  // they are published and nobody else claims them (up to kBatch).
  // published(t): whether ticket t's entry is published (a cheap check);
  // read and serve as for PollClaims::claim_and_serve.  Returns the tickets
  // served.
  template <class Published, class Read, class Serve>
  uint32_t look(int64_t now, Published &&published, Read &&read, Serve &&serve) {
    if (!enabled()) return 0;
    const uint32_t n = claims_.parts();
    uint32_t got = 0;
    for (uint32_t k = 1; k < n; ++k) {
      const uint32_t q = (self_ + k) % n;
      Seen &s = seen_[q];
      uint64_t t = claims_.next(q);
      if (t != s.ticket) {
        // New to this stealer (or the part moved on): the delay starts now.
        if (published(t)) {
          s.ticket = t;
          s.since = now;
        } else {
          s.ticket = kNone;
        }
        continue;
      }
      if (now - s.since < after_ns_) continue;
      uint32_t took = 0;
      uint64_t want = t;
      while (took < kBatch && claims_.claim_and_serve(q, t, false, read, serve)) {
        ++took;
        want = t;
      }
      got += took;
      // Nobody else claimed: the part stays stalled for this stealer, whose
      // next look takes its next ticket once published.  Else the delay
      // starts over.
      if (t != want) s.ticket = kNone;
      else s.ticket = t;
    }
    return got;
  }

 private:
  static constexpr uint64_t kNone = ~uint64_t(0);
  struct Seen {
    uint64_t ticket = kNone;  // the part's next ticket, seen published and unclaimed
    int64_t since = 0;        // when this stealer first saw it so
  };
  PollClaims &claims_;
  const uint32_t self_;
  const int64_t after_ns_;
  std::unique_ptr<Seen[]> seen_;
};

}  // namespace chi

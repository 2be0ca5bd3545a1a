// What an idle poller does next: spin, nap, or park.  A timed wake-up is
// not free (a few to ~15 us of CPU on a virtualized host), so a poller that
// keeps finding nothing spins briefly, then naps longer and longer, and
// after park_after_ns of idle parks: one poller of a group keeps watching
// (PollGroup), with naps that keep growing up to watch_max_ns, while the
// others sleep until it sees work.  The clock is the caller's, so tests
// drive the policy without waiting.
#pragma once

#include <algorithm>
#include <cstdint>

namespace chi {

struct IdleBackoffConfig {
  int64_t spin_ns = 200000;         // spin this long after the last work
  int64_t nap_max_ns = 50000;       // then nap, doubling from kFirstNapNs up to this
  int64_t park_after_ns = 10000000; // park after this long idle; < 0: never
  int64_t watch_max_ns = 100000;    // a parked group's watcher naps up to this
};

class IdleBackoff {
 public:
  enum class Step { kSpin, kNap, kPark };
  static constexpr int64_t kFirstNapNs = 1000;
  // While spinning, the clock is read once per this many polls.
  static constexpr uint32_t kPollsPerClock = 64;

  explicit IdleBackoff(const IdleBackoffConfig &c) : c_(c) {}

  // Work was found: the next idle poll starts over with spinning.
  void reset() {
    idle_since_ = -1;
    polls_ = 0;
    nap_ = kFirstNapNs;
    napped_ = false;
    watch_ = 0;
  }

  // One poll found nothing.  `clock` is called only when the step depends
  // on the time.  kNap: sleep *nap_ns, then poll again.  kPark: park (see
  // PollGroup); watch_nap() then gives the watcher's naps.
  template <class Clock>
  Step idle(Clock &&clock, int64_t *nap_ns) {
    if (idle_since_ < 0) {
      idle_since_ = clock();
      polls_ = 0;
    }
    if (!napped_ && (++polls_ % kPollsPerClock) != 0) return Step::kSpin;
    const int64_t idle = clock() - idle_since_;
    if (idle < c_.spin_ns) return Step::kSpin;
    if (c_.park_after_ns >= 0 && idle >= c_.park_after_ns) return Step::kPark;
    if (c_.nap_max_ns <= 0) return Step::kSpin;
    *nap_ns = std::min(nap_, c_.nap_max_ns);
    nap_ = std::min(nap_ * 2, c_.nap_max_ns);
    napped_ = true;
    return Step::kNap;
  }

  // The next nap of a parked group's watcher: on from the longest idle nap,
  // doubling up to watch_max_ns.
  int64_t watch_nap() {
    const int64_t top = std::max(c_.watch_max_ns, kFirstNapNs);
    if (watch_ == 0) watch_ = std::min(std::max(c_.nap_max_ns, kFirstNapNs), top);
    const int64_t n = watch_;
    watch_ = std::min(watch_ * 2, top);
    return n;
  }

  const IdleBackoffConfig &config() const { return c_; }

 private:
  IdleBackoffConfig c_;
  int64_t idle_since_ = -1;
  uint32_t polls_ = 0;
  int64_t nap_ = kFirstNapNs;
  bool napped_ = false;  // kNap returned since the last work: read the clock every poll
  int64_t watch_ = 0;    // the watcher's next nap; 0: not watching yet
};

}  // namespace chi

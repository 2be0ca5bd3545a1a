// LeaseClock: when an orchestrator launch started, in the lease thread's
// clock (now_ns()), from the launch's start stamp in the GPU's clock
// (%globaltimer, diag word CHI_DIAG_START_AT).
//
// The two clocks are not the same: on an H200 (2026-11-27) %globaltimer ran
// 563-725 us ahead of the host's CLOCK_REALTIME, drifting by some ppm.  The
// offset is learned from the stamps themselves: the lease thread reads a
// launch's stamp only after that launch started, so every reading
// (sighting - stamp) is the offset plus a delay >= 0, and the least reading
// is the offset plus the least delay.  The kept value may rise by kRiseNs
// per reading, so that drift the other way and a reading that was low by
// chance do not stay forever.  The start it answers is never later than the
// sighting, nor earlier than the true start (as long as the offset grows by
// less than kRiseNs per reading).
#ifndef CHI_CORE_LEASE_CLOCK_H
#define CHI_CORE_LEASE_CLOCK_H

#include <algorithm>
#include <cstdint>

namespace chi {

class LeaseClock {
 public:
  static constexpr int64_t kRiseNs = 1000;

  // A launch's start: `stamp` in the GPU's clock, read at `sighting` in the
  // host's clock (after the launch wrote it).
  int64_t start(int64_t sighting, int64_t stamp) {
    const int64_t d = sighting - stamp;
    offset_ = known_ ? std::min(offset_ + kRiseNs, d) : d;
    known_ = true;
    return std::min(sighting, stamp + offset_);
  }
  bool known() const { return known_; }
  int64_t offset() const { return offset_; }  // host minus GPU clock, plus the least delay

 private:
  int64_t offset_ = 0;
  bool known_ = false;
};

}  // namespace chi

#endif  // CHI_CORE_LEASE_CLOCK_H

// Counters and a latency histogram per route, read by chi_stats.  Writers
// update one of a few cache-line shards picked per thread, so workers that
// finish tasks at millions per second do not meet on one line.
#pragma once

#include <atomic>
#include <cstdint>

#include "chimaera.h"

namespace chi {

class RouteStats {
 public:
  void submitted() { shard().submitted.fetch_add(1, std::memory_order_relaxed); }
  // A task finished with `status`, latency_ns after its submission (< 0: not timed).
  void finished(chi_status_t status, int64_t latency_ns) {
    Shard &s = shard();
    (status == CHI_OK ? s.completed : s.failed).fetch_add(1, std::memory_order_relaxed);
    if (latency_ns >= 0) s.hist[bucket(uint64_t(latency_ns))].fetch_add(1, std::memory_order_relaxed);
  }
  void read(chi_route_stats_t *out) const;

  static constexpr unsigned kBuckets = 256;
  // Log-linear buckets: 4 per power of two (<= 19% above the true value).
  static unsigned bucket(uint64_t v) {
    if (v < 4) return unsigned(v);
    unsigned msb = 63u - unsigned(__builtin_clzll(v));
    return msb * 4 + unsigned((v >> (msb - 2)) & 3);
  }
  // The largest value a bucket holds.
  static uint64_t bucket_upper(unsigned b) {
    if (b < 4) return b;
    unsigned msb = b / 4, sub = b % 4;
    return msb >= 63 && sub == 3 ? UINT64_MAX : ((uint64_t(4 + sub + 1) << (msb - 2)) - 1);
  }

 private:
  static constexpr unsigned kShards = 8;
  struct alignas(64) Shard {
    std::atomic<uint64_t> submitted{0}, completed{0}, failed{0};
    std::atomic<uint64_t> hist[kBuckets] = {};
  };
  Shard &shard();
  Shard shards_[kShards];
};

}  // namespace chi

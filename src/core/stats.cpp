#include "core/stats.h"

#include <cstring>

namespace chi {

RouteStats::Shard &RouteStats::shard() {
  static std::atomic<unsigned> next{0};
  thread_local unsigned mine = next.fetch_add(1, std::memory_order_relaxed);
  return shards_[mine % kShards];
}

void RouteStats::read(chi_route_stats_t *out) const {
  std::memset(out, 0, sizeof *out);
  uint64_t hist[kBuckets] = {};
  uint64_t timed = 0;
  for (const Shard &s : shards_) {
    out->submitted += s.submitted.load(std::memory_order_relaxed);
    out->completed += s.completed.load(std::memory_order_relaxed);
    out->failed += s.failed.load(std::memory_order_relaxed);
    for (unsigned b = 0; b < kBuckets; ++b) {
      uint64_t n = s.hist[b].load(std::memory_order_relaxed);
      hist[b] += n;
      timed += n;
    }
  }
  uint64_t done = out->completed + out->failed;
  out->in_flight = out->submitted > done ? out->submitted - done : 0;
  if (!timed) return;
  uint64_t seen = 0, p50 = (timed + 1) / 2, p99 = timed - timed / 100;
  for (unsigned b = 0; b < kBuckets; ++b) {
    if (!hist[b]) continue;
    uint64_t before = seen;
    seen += hist[b];
    if (before < p50 && seen >= p50) out->latency_p50_ns = bucket_upper(b);
    if (before < p99 && seen >= p99) out->latency_p99_ns = bucket_upper(b);
    out->latency_max_ns = bucket_upper(b);
  }
}

}  // namespace chi

// Counters and a latency histogram per route, read by chi_stats.
//
// Counters: each of the first kOwnLines threads of the process owns a cache
// line and adds to it with a plain load and store (one writer); later
// threads share a few more lines with atomic adds.  Submitters and workers
// finishing millions of tasks per second never meet on a line.
// Latency: one task in kSampleEvery per submitting thread is timed (the
// first one included), so the two clock reads a timed task costs (~50 ns
// each on a KVM guest) stay off the other 63; the sampled histogram lives
// in a few shared shards, touched that rarely.
#pragma once

#include <atomic>
#include <cstdint>

#include "chimaera.h"

namespace chi {

namespace detail {
// initial-exec: read on every submit, wait and finish; the default TLS model
// of a shared library costs a call per access.
extern thread_local __attribute__((tls_model("initial-exec"))) unsigned tls_thread_index;  // index + 1; 0: none yet
unsigned assign_thread_index();  // sets tls_thread_index
}  // namespace detail

// A small number for the calling thread, unique among the live threads of
// the process (an exited thread's number is handed out again): the per-thread
// line of RouteStats, and the shard of the CPU pool's free slots and run
// queues that the thread uses first.
inline unsigned thread_index() {
  const unsigned i = detail::tls_thread_index;
  return __builtin_expect(i != 0, 1) ? i - 1 : detail::assign_thread_index();
}

class RouteStats {
 public:
  // Of the tasks a thread submits, one in kSampleEvery is timed.
  static constexpr uint32_t kSampleEvery = 64;

  void submitted(uint64_t n = 1) { add(&Line::submitted, n); }
  // A task finished with `status`, latency_ns after its submission (< 0: not timed).
  void finished(chi_status_t status, int64_t latency_ns) {
    add(status == CHI_OK ? &Line::completed : &Line::failed);
    if (latency_ns >= 0) record(latency_ns);
  }
  // True for the tasks this thread should time: its first, then one in
  // kSampleEvery.
  static bool sample();
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
  static constexpr unsigned kOwnLines = 64;
  static constexpr unsigned kSharedLines = 8;
  static constexpr unsigned kHistShards = 8;
  struct alignas(64) Line {
    std::atomic<uint64_t> submitted{0}, completed{0}, failed{0};
  };
  struct alignas(64) Hist {
    std::atomic<uint64_t> n[kBuckets] = {};
  };
  void add(std::atomic<uint64_t> Line::*counter, uint64_t n = 1) {
    const unsigned i = thread_index();
    if (i < kOwnLines) {
      std::atomic<uint64_t> &c = lines_[i].*counter;
      c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
    } else {
      (lines_[kOwnLines + i % kSharedLines].*counter).fetch_add(n, std::memory_order_relaxed);
    }
  }
  void record(int64_t latency_ns) {
    hist_[thread_index() % kHistShards].n[bucket(uint64_t(latency_ns))].fetch_add(
        1, std::memory_order_relaxed);
  }
  Line lines_[kOwnLines + kSharedLines];
  Hist hist_[kHistShards];
};

}  // namespace chi

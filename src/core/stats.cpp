#include "core/stats.h"

#include <cstring>
#include <mutex>
#include <vector>

namespace chi {

namespace {
// initial-exec: read on every submit and finish; the default TLS model of a
// shared library costs a call per access.
#define CHI_STATS_TLS thread_local __attribute__((tls_model("initial-exec")))
CHI_STATS_TLS uint32_t tls_sample = 0;

// Indices of exited threads are handed out again, so a process that starts
// and ends many threads keeps its own lines for the live ones.  Never freed:
// thread exits may come after static destructors.
std::mutex &index_mu() {
  static std::mutex *mu = new std::mutex;
  return *mu;
}
std::vector<unsigned> &free_indices() {
  static std::vector<unsigned> *v = new std::vector<unsigned>;
  return *v;
}
unsigned next_index = 0;  // under index_mu()

struct IndexReturn {
  unsigned index = 0;  // + 1; 0: none
  ~IndexReturn() {
    if (!index) return;
    detail::tls_thread_index = 0;
    std::lock_guard<std::mutex> lock(index_mu());
    free_indices().push_back(index - 1);
  }
};

unsigned assign_index() {
  unsigned i;
  {
    std::lock_guard<std::mutex> lock(index_mu());
    std::vector<unsigned> &f = free_indices();
    if (!f.empty()) {
      i = f.back();
      f.pop_back();
    } else {
      i = next_index++;
    }
  }
  static thread_local IndexReturn give_back;
  give_back.index = i + 1;
  return i;
}
}  // namespace

namespace detail {
CHI_STATS_TLS unsigned tls_thread_index = 0;

unsigned assign_thread_index() {
  const unsigned i = assign_index();
  tls_thread_index = i + 1;
  return i;
}
}  // namespace detail

bool RouteStats::sample() {
  return (tls_sample++ % kSampleEvery) == 0;
}

void RouteStats::read(chi_route_stats_t *out) const {
  std::memset(out, 0, sizeof *out);
  for (const Line &l : lines_) {
    out->submitted += l.submitted.load(std::memory_order_relaxed);
    out->completed += l.completed.load(std::memory_order_relaxed);
    out->failed += l.failed.load(std::memory_order_relaxed);
  }
  uint64_t hist[kBuckets] = {};
  uint64_t timed = 0;
  for (const Hist &h : hist_) {
    for (unsigned b = 0; b < kBuckets; ++b) {
      uint64_t n = h.n[b].load(std::memory_order_relaxed);
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

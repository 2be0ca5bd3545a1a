// The round-trip trace's stamps, rings and report (core/trace.h); built
// only with -DCHI_TRACE=ON.
#include "core/trace.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "base/futex.h"

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

namespace chi::trace {

namespace {

// The time stamp counter where there is one: a clock read costs 20-50 ns,
// as much as some of the stages.  report() converts ticks to ns.
inline uint64_t ticks() {
#if defined(__x86_64__) || defined(__i386__)
  return __rdtsc();
#else
  return uint64_t(now_ns());
#endif
}

struct Rec {
  uint64_t at;         // ticks
  uint32_t slot;
  uint32_t gen_stage;  // generation << 8 | stage
};

// 1 MiB a thread: 16384 tasks' worth of one side's stages (at most four).
constexpr uint32_t kRingRecs = 1u << 16;
struct Ring {
  std::atomic<uint32_t> n{0};  // written by its thread only
  uint32_t reported = 0;       // report()'s, under Rings::mu
  Rec rec[kRingRecs];
};

struct Rings {
  std::mutex mu;
  std::vector<std::unique_ptr<Ring>> all;
  uint64_t ticks0 = 0;  // when the first ring was made, for the tick rate
  int64_t ns0 = 0;
};
// Never destroyed: a thread may keep stamps until the process ends.
Rings &rings() {
  static Rings *r = new Rings;
  return *r;
}

thread_local __attribute__((tls_model("initial-exec"))) Ring *tls_ring = nullptr;
thread_local __attribute__((tls_model("initial-exec"))) uint64_t tls_noted[kStages];

Ring *own_ring() {
  if (!tls_ring) {
    auto r = std::make_unique<Ring>();
    Rings &g = rings();
    std::lock_guard<std::mutex> lock(g.mu);
    if (g.all.empty()) {
      g.ticks0 = ticks();
      g.ns0 = now_ns();
    }
    tls_ring = r.get();
    g.all.push_back(std::move(r));
  }
  return tls_ring;
}

const char *const kName[kStages] = {"submit",    "queued",    "popped", "handler-start", "handler-end",
                                    "published", "wait",      "seen",   "returned"};

// A side's own steps: the time between two stamps one thread kept for one
// task (or, for kPopGap, a worker's publish of one task and its pop of the
// next), so they need no whole round trip and no clock shared by threads.
struct Step {
  const char *name;
  Stage from, to;
};
constexpr Step kSteps[] = {
    {"submit", kSubmit, kQueued},                // chi_submit's own time
    {"worker.gap", kPublished, kPopped},         // publish to the next task's pop (idle time included)
    {"worker.run", kPopped, kPublished},         // pop to publish: handler, output, done word
    {"worker.handler", kHandlerStart, kHandlerEnd},
    {"waiter.wait", kWait, kSeen},               // chi_wait entered to the task seen done
    {"waiter.take", kSeen, kReturned},           // claim, output copy, slot freed
};
constexpr size_t kPopGap = 1;  // kSteps' entry that spans two tasks

void print_quantiles(FILE *f, const char *name, std::vector<double> &v) {
  std::sort(v.begin(), v.end());
  auto at = [&](size_t pct) { return v.empty() ? 0.0 : v[v.size() * pct / 100]; };
  std::fprintf(f, "%-15s %9.0f %9.0f %9.0f %8zu\n", name, at(10), at(50), at(90), v.size());
}

}  // namespace

void note(Stage s) { tls_noted[s] = ticks(); }

void keep(Stage first, Stage last, uint32_t slot, uint32_t gen) {
  Ring *r = own_ring();
  uint32_t n = r->n.load(std::memory_order_relaxed);
  for (uint32_t s = first; s <= last; ++s) {
    if (tls_noted[s] == 0) continue;
    if (n < kRingRecs) r->rec[n++] = Rec{tls_noted[s], slot, gen << 8 | s};
    tls_noted[s] = 0;
  }
  r->n.store(n, std::memory_order_release);
}

void report() {
  Rings &g = rings();
  std::lock_guard<std::mutex> lock(g.mu);
  // Ticks per ns over at least 10 ms since the first ring was made.
  int64_t ns = now_ns();
  while (ns - g.ns0 < 10000000) ns = now_ns();
  const double per_ns = g.all.empty() ? 1.0 : double(ticks() - g.ticks0) / double(ns - g.ns0);

  // Every stage kept since the last report, by task (slot, generation), and
  // the thread (ring) that submitted it.
  struct Task {
    std::array<uint64_t, kStages> at{};
    size_t by = 0;
  };
  std::unordered_map<uint64_t, Task> tasks;
  std::vector<uint32_t> first(g.all.size());  // each ring's first record since the last report
  for (size_t k = 0; k < g.all.size(); ++k) {
    Ring &r = *g.all[k];
    const uint32_t n = r.n.load(std::memory_order_acquire);
    first[k] = r.reported;
    for (uint32_t i = r.reported; i < n; ++i) {
      const Rec &e = r.rec[i];
      Task &t = tasks[uint64_t(e.slot) << 32 | (e.gen_stage >> 8)];
      t.at[e.gen_stage & 0xFF] = e.at;
      if ((e.gen_stage & 0xFF) == kSubmit) t.by = k;
    }
    r.reported = n;
  }
  // Each side's steps, from every thread's records in the order it kept
  // them: a keep() writes one task's stamps together, in stage order.
  std::array<std::vector<double>, std::size(kSteps)> steps;
  for (size_t k = 0; k < g.all.size(); ++k) {
    const Ring &r = *g.all[k];
    const uint32_t n = r.reported;  // as far as the join above read
    uint64_t at[kStages] = {};
    uint64_t last_published = 0;  // the previous task's, on this thread
    auto close = [&] {
      for (size_t i = 0; i < std::size(kSteps); ++i) {
        const Step &st = kSteps[i];
        const uint64_t from = i == kPopGap ? last_published : at[st.from];
        if (from && at[st.to] >= from) steps[i].push_back(double(at[st.to] - from) / per_ns);
      }
      if (at[kPublished]) last_published = at[kPublished];
      std::fill(std::begin(at), std::end(at), 0);
    };
    uint32_t key_slot = 0, key_gen = 0, prev_stage = kStages;
    for (uint32_t i = first[k]; i < n; ++i) {
      const Rec &e = r.rec[i];
      const uint32_t stage = e.gen_stage & 0xFF, gen = e.gen_stage >> 8;
      if (prev_stage != kStages && (e.slot != key_slot || gen != key_gen || stage <= prev_stage)) close();
      key_slot = e.slot;
      key_gen = gen;
      prev_stage = stage;
      at[stage] = e.at;
    }
    if (prev_stage != kStages) close();
  }

  // One table per submitting thread: a program's threads often measure
  // different things (chimaera-bench's lone round trips on its main thread,
  // its throughput rows on others).
  std::vector<std::array<std::vector<double>, kStages>> after(g.all.size());
  std::vector<size_t> trips(g.all.size());
  for (const auto &[key, t] : tasks) {
    const uint64_t t0 = t.at[kSubmit];
    if (t0 == 0 || t.at[kReturned] < t0) continue;
    ++trips[t.by];
    // A stamp before the submit is one a thread noted for an earlier task
    // and never kept (a nested wait's help, a batch): left out.  The
    // worker's publish stamp may come after the waiter returned: it counts.
    for (uint32_t s = kQueued; s < kStages; ++s)
      if (t.at[s] >= t0) after[t.by][s].push_back(double(t.at[s] - t0) / per_ns);
  }

  FILE *f = stderr;
  const char *path = std::getenv("CHI_TRACE_FILE");
  if (path && *path) {
    if (FILE *file = std::fopen(path, "a")) f = file;
  }
  for (size_t k = 0; k < g.all.size(); ++k) {
    if (trips[k] == 0) continue;
    std::fprintf(f, "# chimaera trace: thread %zu: %zu CPU->CPU round trips, ns after chi_submit was entered"
                 " (%.3f ticks a ns)\n", k, trips[k], per_ns);
    std::fprintf(f, "# %-13s %9s %9s %9s %8s\n", "stage", "p10", "p50", "p90", "count");
    for (uint32_t s = kQueued; s < kStages; ++s) print_quantiles(f, kName[s], after[k][s]);
  }
  size_t stepped = 0;
  for (const auto &v : steps) stepped += v.size();
  if (stepped) {
    std::fprintf(f, "# chimaera trace: each side's steps, ns, every thread's tasks since the last report"
                 " (whole round trips or not)\n");
    std::fprintf(f, "# %-13s %9s %9s %9s %8s\n", "step", "p10", "p50", "p90", "count");
    for (size_t i = 0; i < std::size(kSteps); ++i) print_quantiles(f, kSteps[i].name, steps[i]);
  }
  if (f != stderr) std::fclose(f);
}

}  // namespace chi::trace

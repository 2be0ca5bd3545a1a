// chimaera-poller-idle: the GPU->CPU pollers' idle policy (IdleBackoff and
// PollGroup, the loop of gpu/cpu_poller.cpp) over a ring in host memory,
// so its CPU cost and wake-up can be measured on any machine:
//
//   chimaera-poller-idle [PARK_AFTER_US [WATCH_INTERVAL_US [POLLERS]]]
//
// (defaults 10000, 100, 4; PARK_AFTER_US 0: never park).  Prints the CPU use
// of the idle pollers over 3 s and the wait of a lone task after 0.5 s of
// quiet (p50 and max of 12): the figures a GPU machine's chimaera-gpu-idle
// gives, without the GPU's part of the round trip.
#include <sched.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "core/idle_backoff.h"
#include "core/poll_group.h"

using namespace chi;

namespace {
constexpr int kSamples = 12;
std::atomic<int64_t> published[kSamples * 64];
std::atomic<int64_t> served_at[kSamples * 64];

double cpu_s() {
  rusage r;
  getrusage(RUSAGE_SELF, &r);
  return r.ru_utime.tv_sec + r.ru_utime.tv_usec * 1e-6 + r.ru_stime.tv_sec + r.ru_stime.tv_usec * 1e-6;
}
}  // namespace

int main(int argc, char **argv) {
  const long park_us = argc > 1 ? atol(argv[1]) : 10000;
  const long watch_us = argc > 2 ? atol(argv[2]) : 100;
  const uint32_t n = argc > 3 ? uint32_t(atoi(argv[3])) : 4;
  if (watch_us < 1 || n < 1 || n > 64) return 2;
  IdleBackoffConfig c;  // gpu.* defaults: poller_spin_ns 200000, poll_interval_us 50
  c.park_after_ns = park_us ? park_us * 1000 : -1;
  c.watch_max_ns = watch_us * 1000;
  PollGroup group(n);
  const uint64_t tickets = kSamples * 64;
  auto serve = [&](uint64_t t) {
    if (t >= tickets || !published[t].load(std::memory_order_acquire)) return false;
    served_at[t].store(now_ns(), std::memory_order_release);
    return true;
  };
  std::vector<std::thread> threads;
  for (uint32_t p = 0; p < n; ++p)
    threads.emplace_back([&, p] {
      prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
      IdleBackoff b(c);
      uint64_t t = group.take(p);
      while (!group.stopping()) {
        if (serve(t)) {
          t += n;
          b.reset();
          continue;
        }
        int64_t nap = 0;
        IdleBackoff::Step s = b.idle(now_ns, &nap);
        if (s == IdleBackoff::Step::kSpin) {
          cpu_relax();
        } else if (s == IdleBackoff::Step::kNap) {
          group.nap(nap);
        } else {
          group.hand_over(p, t);
          group.park(p, b, serve, [] {});
          t = group.take(p);
          b.reset();
        }
      }
    });
  usleep(1000000);
  const double c0 = cpu_s();
  const int64_t t0 = now_ns();
  usleep(3000000);
  const double c1 = cpu_s();
  const int64_t t1 = now_ns();
  std::vector<double> waits;
  for (int i = 0; i < kSamples; ++i) {
    usleep(500000);
    const int64_t at = now_ns();
    published[i].store(at, std::memory_order_release);
    while (!served_at[i].load(std::memory_order_acquire)) sched_yield();
    waits.push_back((served_at[i].load() - at) / 1e3);
  }
  group.stop();
  for (auto &t : threads) t.join();
  std::sort(waits.begin(), waits.end());
  printf("%u pollers, park after %ld us (0: never), watch interval %ld us: idle %.2f%% of one core; "
         "a lone task after 0.5 s of quiet waits p50 %.1f us, max %.1f us\n",
         n, park_us, watch_us, 100 * (c1 - c0) / ((t1 - t0) * 1e-9), waits[(waits.size() - 1) / 2],
         waits.back());
  return 0;
}

// Idle policy of the pollers, on the CPU: IdleBackoff's steps under a fake
// clock (spin, naps doubling to the cap, park, the watcher's growing naps),
// and a PollGroup of threads over a fake ring: every ticket served once and
// in order per part, an idle group settles with one watcher and the others
// asleep, a task of a sleeping poller's part is served while it sleeps, a
// busy part wakes its owner, and stop() ends a parked group.  With a bell
// (PollBell, as the GPU's keeper rings it): the watcher arms it with the
// first ticket nobody served and sleeps without timed looks; a kick after a
// ticket at or past it serves the task; a bell that is not live is never
// armed.
#include <sched.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "core/idle_backoff.h"
#include "core/poll_group.h"

extern "C" {
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
}

namespace {

using chi::IdleBackoff;
using chi::IdleBackoffConfig;
using chi::PollGroup;
using Step = IdleBackoff::Step;

struct FakeClock {
  int64_t t = 1000000;
  int64_t operator()() const { return t; }
};

// Polls until the step is no longer kSpin; returns it.
Step until_not_spin(IdleBackoff &b, FakeClock &c, int64_t *nap) {
  for (int i = 0; i < 1000; ++i) {
    Step s = b.idle(c, nap);
    if (s != Step::kSpin) return s;
  }
  return Step::kSpin;
}

void test_backoff_steps(void **) {
  IdleBackoffConfig cfg;
  cfg.spin_ns = 200000;
  cfg.nap_max_ns = 50000;
  cfg.park_after_ns = 10000000;
  cfg.watch_max_ns = 400000;
  IdleBackoff b(cfg);
  FakeClock c;
  int64_t nap = 0;
  // Spins while the spin window lasts, however many polls.
  for (int i = 0; i < 10000; ++i) assert_int_equal(int(b.idle(c, &nap)), int(Step::kSpin));
  c.t += 200000;
  // Then naps, doubling from 1 us up to the cap.
  int64_t want = IdleBackoff::kFirstNapNs;
  for (int i = 0; i < 10; ++i) {
    assert_int_equal(int(until_not_spin(b, c, &nap)), int(Step::kNap));
    assert_int_equal(nap, want);
    want = want * 2 < cfg.nap_max_ns ? want * 2 : cfg.nap_max_ns;
    c.t += nap;
  }
  assert_int_equal(nap, cfg.nap_max_ns);
  // Parks once idle for park_after_ns; the watcher's naps go on from the
  // cap, doubling to watch_max_ns.
  c.t += cfg.park_after_ns;
  assert_int_equal(int(b.idle(c, &nap)), int(Step::kPark));
  assert_int_equal(b.watch_nap(), 50000);
  assert_int_equal(b.watch_nap(), 100000);
  assert_int_equal(b.watch_nap(), 200000);
  assert_int_equal(b.watch_nap(), 400000);
  assert_int_equal(b.watch_nap(), 400000);
  // Work starts it over.
  b.reset();
  for (int i = 0; i < 1000; ++i) assert_int_equal(int(b.idle(c, &nap)), int(Step::kSpin));
  c.t += 200000;
  assert_int_equal(int(until_not_spin(b, c, &nap)), int(Step::kNap));
  assert_int_equal(nap, IdleBackoff::kFirstNapNs);
}

void test_backoff_never_park_never_nap(void **) {
  IdleBackoffConfig cfg;
  cfg.spin_ns = 0;
  cfg.nap_max_ns = 0;  // never sleeps
  cfg.park_after_ns = -1;
  IdleBackoff b(cfg);
  FakeClock c;
  int64_t nap = 0;
  for (int i = 0; i < 5000; ++i) {
    c.t += 1000000;
    assert_int_equal(int(b.idle(c, &nap)), int(Step::kSpin));
  }
  cfg.nap_max_ns = 50000;  // naps, never parks
  IdleBackoff n(cfg);
  for (int i = 0; i < 100; ++i) {
    c.t += 100000000;
    assert_int_equal(int(until_not_spin(n, c, &nap)), int(Step::kNap));
  }
}

// A ring of tickets: the test publishes, pollers serve (each once).
struct FakeRing {
  explicit FakeRing(uint32_t n) : size(n), published(new std::atomic<uint32_t>[n]), served(new std::atomic<uint32_t>[n]) {
    for (uint32_t i = 0; i < n; ++i) {
      published[i].store(0);
      served[i].store(0);
    }
  }
  bool serve(uint64_t t) {
    if (t >= size || !published[t].load(std::memory_order_acquire)) return false;
    served[t].fetch_add(1, std::memory_order_relaxed);
    // Per part, tickets are served in order.
    if (t >= parts && served[t - parts].load(std::memory_order_relaxed) == 0) out_of_order.store(true);
    done.fetch_add(1, std::memory_order_release);
    return true;
  }
  uint32_t size, parts = 1;
  std::unique_ptr<std::atomic<uint32_t>[]> published, served;
  std::atomic<uint64_t> done{0};
  std::atomic<bool> out_of_order{false};
};

// What the GPU's keeper does, in the test's hands: armed holds 1 + the
// first ticket the parked group has not served, 0 when disarmed.
struct FakeBell : chi::PollBell {
  bool live() const override { return is_live.load(); }
  void arm(uint64_t first) override {
    armed.store(first + 1);
    arms.fetch_add(1);
  }
  void disarm() override { armed.store(0); }
  std::atomic<bool> is_live{true};
  std::atomic<uint64_t> armed{0}, arms{0};
};

struct Group {
  Group(uint32_t n, uint32_t tickets, int64_t park_after_ns, FakeBell *bell = nullptr)
      : group(n), ring(tickets) {
    ring.parts = n;
    // A check long enough that only kick() can end the sleep within a test.
    if (bell) group.set_bell(bell, 100000000000ll);
    cfg.spin_ns = 20000;
    cfg.nap_max_ns = 20000;
    cfg.park_after_ns = park_after_ns;
    cfg.watch_max_ns = 200000;
    for (uint32_t p = 0; p < n; ++p) threads.emplace_back([this, p] { run(p); });
  }
  ~Group() { stop(); }
  void run(uint32_t p) {
    IdleBackoff b(cfg);
    auto serve = [&](uint64_t t) { return ring.serve(t); };
    auto hook = [&] { hooks.fetch_add(1, std::memory_order_relaxed); };
    uint64_t t = group.take(p);
    while (!group.stopping()) {
      if (ring.serve(t)) {
        t += group.parts();
        b.reset();
        continue;
      }
      int64_t nap = 0;
      Step s = b.idle(chi::now_ns, &nap);
      if (s == Step::kSpin) {
        chi::cpu_relax();
      } else if (s == Step::kNap) {
        group.nap(nap);
      } else {
        group.hand_over(p, t);
        parks.fetch_add(1, std::memory_order_relaxed);
        group.park(p, b, serve, hook);
        t = group.take(p);
        b.reset();
      }
    }
  }
  void stop() {
    group.stop();
    for (auto &th : threads) th.join();
    threads.clear();
  }
  void publish(uint64_t from, uint64_t to) {
    for (uint64_t t = from; t < to; ++t) ring.published[t].store(1, std::memory_order_release);
  }
  void wait_done(uint64_t n) {
    while (ring.done.load(std::memory_order_acquire) < n) sched_yield();
  }
  // Until one watches and the others sleep.
  void wait_settled() {
    while (group.watcher() < 0 || group.sleeping() != group.parts() - 1) sched_yield();
  }
  IdleBackoffConfig cfg;
  PollGroup group;
  FakeRing ring;
  std::vector<std::thread> threads;
  std::atomic<uint64_t> parks{0}, hooks{0};
};

void test_group_serves_every_ticket_once(void **) {
  const uint32_t n = 4, tickets = 20000;
  Group g(n, tickets, 1000000);
  // Bursts with quiet spells between them, long enough to park.
  uint64_t at = 0;
  while (at < tickets) {
    uint64_t to = at + 1 + (at * 7919) % 3000;
    if (to > tickets) to = tickets;
    g.publish(at, to);
    g.wait_done(to);
    at = to;
    if ((at / 3000) % 2) g.wait_settled();
  }
  g.stop();
  for (uint32_t t = 0; t < tickets; ++t) assert_int_equal(g.ring.served[t].load(), 1);
  assert_false(g.ring.out_of_order.load());
  assert_true(g.parks.load() > 0);
}

void test_group_idle_one_watcher(void **) {
  const uint32_t n = 4;
  Group g(n, 4096, 1000000);
  g.wait_settled();
  const int32_t w = g.group.watcher();
  assert_true(w >= 0 && w < int32_t(n));
  // A task of a sleeping poller's part: the watcher serves it, nobody wakes.
  const uint32_t sleeper = (uint32_t(w) + 1) % n;
  g.publish(0, sleeper + 1);  // tickets before it too, so its part's order holds
  g.wait_done(sleeper + 1);
  assert_int_equal(g.ring.served[sleeper].load(), 1);
  // The watcher's hook ran (it naps, then calls it at most once a ms).
  while (g.hooks.load() == 0) sched_yield();
  // A busy part wakes its owner: many tickets of one part at once.
  uint64_t first = sleeper + 1, last = first + 64ull * n;
  g.publish(first, last);
  g.wait_done(last);
  for (uint64_t t = 0; t < last; ++t) assert_int_equal(g.ring.served[t].load(), 1);
  assert_false(g.ring.out_of_order.load());
  // And the group settles again.
  g.wait_settled();
  g.stop();
  assert_int_equal(g.group.watcher(), -1);
}

void test_group_stop_while_parked(void **) {
  for (int round = 0; round < 5; ++round) {
    Group g(3, 16, 100000);
    g.wait_settled();
    g.stop();  // joins: every parked thread saw the stop
    assert_int_equal(g.group.sleeping(), 0);
  }
}

void test_group_single_part(void **) {
  Group g(1, 1000, 100000);
  while (g.group.watcher() != 0) sched_yield();
  g.publish(0, 1000);
  g.wait_done(1000);
  g.stop();
  for (uint32_t t = 0; t < 1000; ++t) assert_int_equal(g.ring.served[t].load(), 1);
}

void test_group_bell(void **) {
  const uint32_t n = 4;
  FakeBell bell;
  Group g(n, 4096, 1000000, &bell);
  for (uint64_t t = 0; t < 40; ++t) {
    // Settled on the bell: armed with the next ticket, the watcher about to
    // sleep or asleep (one sleep per task so far: only a kick ends one).
    while (bell.armed.load() != t + 1 || g.group.sleeping() != n - 1 || g.group.bell_sleeps() < t + 1)
      sched_yield();
    g.publish(t, t + 1);
    // The keeper rings once the armed ticket is taken.
    if (bell.armed.load() == t + 1) g.group.kick();
    g.wait_done(t + 1);
  }
  assert_true(g.group.bell_sleeps() >= 40);
  for (uint64_t t = 0; t < 40; ++t) assert_int_equal(g.ring.served[t].load(), 1);
  assert_false(g.ring.out_of_order.load());
  // A bell that is not live: the watcher naps again and never arms it.
  bell.is_live.store(false);
  g.group.kick();
  while (bell.armed.load() != 0) sched_yield();
  const uint64_t arms = bell.arms.load();
  g.publish(40, 41);  // served by a napping watcher: nobody kicks
  g.wait_done(41);
  assert_int_equal(bell.arms.load(), arms);
  g.stop();
  assert_int_equal(bell.armed.load(), 0);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_backoff_steps),
      cmocka_unit_test(test_backoff_never_park_never_nap),
      cmocka_unit_test(test_group_serves_every_ticket_once),
      cmocka_unit_test(test_group_idle_one_watcher),
      cmocka_unit_test(test_group_stop_while_parked),
      cmocka_unit_test(test_group_single_part),
      cmocka_unit_test(test_group_bell),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}

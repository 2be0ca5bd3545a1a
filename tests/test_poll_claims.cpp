// Work stealing between pollers (src/core/poll_claims.h), on the CPU: claim
// words and a stealer's delay under a fake clock (a ticket is stolen only
// after it was seen published and unclaimed for the delay, an owner that
// moves on restarts it, a stolen part's next tickets follow at once, a
// delay of 0 never steals); then threads over a fake ring with the loop of
// gpu/cpu_poller.cpp (owners, stealers, a PollGroup that parks): one
// poller's handler blocks until every other ticket is served, which only
// stealing allows, and every ticket is served exactly once, also by a
// parked group's watcher; with stealing off, nothing of the blocked part is
// served while it blocks.
#include <sched.h>
#include <time.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "core/idle_backoff.h"
#include "core/poll_claims.h"
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
using chi::PollClaims;
using chi::PollGroup;
using chi::PollStealer;

// A fake ring without reuse: entry t is published once it holds t + 1.
struct Ring {
  explicit Ring(uint64_t n) : n(n), words(new std::atomic<uint64_t>[n]) {
    for (uint64_t t = 0; t < n; ++t) words[t].store(0, std::memory_order_relaxed);
  }
  bool published(uint64_t t) const { return t < n && words[t].load(std::memory_order_acquire) == t + 1; }
  void publish(uint64_t t) { words[t].store(t + 1, std::memory_order_release); }
  const uint64_t n;
  std::unique_ptr<std::atomic<uint64_t>[]> words;
};

void test_claim_words(void **) {
  PollClaims c(4);
  assert_int_equal(c.parts(), 4);
  for (uint32_t p = 0; p < 4; ++p) assert_int_equal(c.next(p), p);
  uint64_t t = 1;
  assert_true(c.claim(1, t));
  assert_int_equal(c.next(1), 5);
  t = 1;  // a stale view: the claim fails and t becomes the next ticket
  assert_false(c.claim(1, t));
  assert_int_equal(t, 5);

  Ring ring(64);
  std::vector<uint64_t> served;
  auto read = [&](uint64_t x) { return ring.published(x); };
  auto serve = [&](uint64_t x) { served.push_back(x); };
  // Nothing published: nothing served, the hint stays the next ticket.
  t = 2;
  assert_false(c.claim_and_serve(2, t, true, read, serve));
  assert_int_equal(t, 2);
  ring.publish(2);
  ring.publish(6);
  assert_true(c.claim_and_serve(2, t, true, read, serve));
  assert_int_equal(t, 6);
  // An owner whose hint is stale (6 was taken by another) goes on from the
  // claim word, also when the stale ticket still reads as published.
  uint64_t other = 6;
  assert_true(c.claim(2, other));
  ring.publish(10);
  assert_true(c.claim_and_serve(2, t, true, read, serve));
  assert_int_equal(t, 14);
  assert_int_equal(served.size(), 2);
  assert_int_equal(served[0], 2);
  assert_int_equal(served[1], 10);
  // A stealer (no retry) gives up on a lost claim, t the part's next ticket.
  ring.publish(3);
  uint64_t stale = 3;
  uint64_t owner = 3;
  assert_true(c.claim(3, owner));
  assert_false(c.claim_and_serve(3, stale, false, read, serve));
  assert_int_equal(stale, 7);
  assert_int_equal(served.size(), 2);

  // PollGroup's serve: the group's ticket ends at the one served (the group
  // adds a part), or at the claim word's ticket.
  PollClaims g(2);
  Ring r2(16);
  r2.publish(0);
  r2.publish(2);
  auto read2 = [&](uint64_t x) { return r2.published(x); };
  uint64_t group_next = 0;
  uint64_t taken = 0;
  assert_true(g.claim(0, taken));  // ticket 0 taken by another
  assert_true(g.serve_for_group(group_next, read2, serve));
  assert_int_equal(group_next, 2);
  group_next += 2;
  assert_false(g.serve_for_group(group_next, read2, serve));
  assert_int_equal(group_next, 4);
}

void test_stealer_delay(void **) {
  PollClaims c(4);
  Ring ring(256);
  std::vector<uint64_t> stolen;
  auto published = [&](uint64_t t) { return ring.published(t); };
  auto read = [&](uint64_t t) { return ring.published(t); };
  auto serve = [&](uint64_t t) { stolen.push_back(t); };
  PollStealer s(c, 0, 100);
  assert_true(s.enabled());
  // Its own part is never stolen from; nothing else is published yet.
  ring.publish(0);
  assert_int_equal(s.look(0, published, read, serve), 0);
  assert_int_equal(s.look(1000, published, read, serve), 0);
  // Ticket 1 (part 1) published: the delay runs from the first look that
  // sees it.
  ring.publish(1);
  assert_int_equal(s.look(1000, published, read, serve), 0);
  assert_int_equal(s.look(1099, published, read, serve), 0);
  assert_int_equal(c.next(1), 1);
  ring.publish(5);
  assert_int_equal(s.look(1100, published, read, serve), 2);  // 1 and 5, in a row
  assert_int_equal(stolen.size(), 2);
  assert_int_equal(stolen[0], 1);
  assert_int_equal(stolen[1], 5);
  assert_int_equal(c.next(1), 9);
  // The part stays stalled for this stealer: its next ticket goes at once.
  ring.publish(9);
  assert_int_equal(s.look(1101, published, read, serve), 1);
  assert_int_equal(c.next(1), 13);
  // An owner that moves on restarts the delay: no steal from a part making
  // progress.
  ring.publish(13);
  uint64_t t = 13;
  assert_true(c.claim(1, t));
  ring.publish(17);
  assert_int_equal(s.look(1200, published, read, serve), 0);  // 17 first seen
  t = 17;
  assert_true(c.claim(1, t));  // the owner takes it within the delay
  ring.publish(21);
  assert_int_equal(s.look(1290, published, read, serve), 0);  // 21 first seen
  assert_int_equal(s.look(1389, published, read, serve), 0);
  assert_int_equal(s.look(1390, published, read, serve), 1);
  assert_int_equal(stolen.back(), 21);
  // Losing a claim to another ends the streak: the delay starts over.
  ring.publish(25);
  t = 25;
  assert_true(c.claim(1, t));
  ring.publish(29);
  assert_int_equal(s.look(1400, published, read, serve), 0);
  assert_int_equal(s.look(1499, published, read, serve), 0);
  assert_int_equal(s.look(1500, published, read, serve), 1);
  assert_int_equal(c.next(1), 33);
  // Several parts at once, each on its own clock.
  ring.publish(2);
  assert_int_equal(s.look(2000, published, read, serve), 0);
  ring.publish(3);
  assert_int_equal(s.look(2050, published, read, serve), 0);
  assert_int_equal(s.look(2100, published, read, serve), 1);  // 2
  assert_int_equal(s.look(2149, published, read, serve), 0);
  assert_int_equal(s.look(2150, published, read, serve), 1);  // 3
  assert_int_equal(c.next(0), 0);  // its own part untouched
  assert_int_equal(c.next(2), 6);
  assert_int_equal(c.next(3), 7);
  // A delay of 0 (and a single part) never steals.
  PollClaims c2(2);
  Ring r2(8);
  r2.publish(1);
  auto pub2 = [&](uint64_t x) { return r2.published(x); };
  PollStealer never(c2, 0, 0);
  assert_false(never.enabled());
  assert_int_equal(never.look(0, pub2, pub2, serve), 0);
  assert_int_equal(never.look(int64_t(1) << 40, pub2, pub2, serve), 0);
  assert_int_equal(c2.next(1), 1);
  PollClaims c1(1);
  PollStealer alone(c1, 0, 1);
  assert_false(alone.enabled());
}

// Threads over a fake ring with the GPU->CPU pollers' loop
// (CpuPoller::run): claim_and_serve on its own part, an idle pass that
// reads the clock at most once and looks at the other parts with it, naps,
// and parking, where the watcher serves parked parts through
// serve_for_group and steals in its on_watch hook.
struct Bench {
  Bench(uint32_t parts, uint64_t tickets, int64_t steal_ns)
      : parts(parts), ring(tickets), group(parts), claims(parts), steal_ns(steal_ns),
        count(new std::atomic<uint32_t>[tickets]), by(new std::atomic<int32_t>[tickets]) {
    for (uint64_t t = 0; t < tickets; ++t) {
      count[t].store(0, std::memory_order_relaxed);
      by[t].store(-1, std::memory_order_relaxed);
    }
    cfg.spin_ns = 50000;
    cfg.nap_max_ns = 50000;
    cfg.park_after_ns = 2000000;
    cfg.watch_max_ns = 200000;
  }

  // Ticket 0's handler: set by the test.
  std::function<void()> block;

  void serve(uint32_t poller, uint64_t t, uint64_t entry) {
    if (entry != t + 1) bad.fetch_add(1, std::memory_order_relaxed);
    if (t == 0 && block) block();
    by[t].store(int32_t(poller), std::memory_order_relaxed);
    count[t].fetch_add(1, std::memory_order_relaxed);
    done.fetch_add(1, std::memory_order_release);
  }

  void run(uint32_t p) {
    IdleBackoff b(cfg);
    PollStealer stealer(claims, p, steal_ns);
    uint64_t entry = 0;
    auto published = [&](uint64_t t) { return ring.published(t); };
    auto read = [&](uint64_t t) {
      if (!ring.published(t)) return false;
      entry = ring.words[t].load(std::memory_order_acquire);
      return true;
    };
    auto serve_read = [&](uint64_t t) { serve(p, t, entry); };
    auto serve_parked = [&](uint64_t &t) { return claims.serve_for_group(t, read, serve_read); };
    auto on_watch = [&] {
      if (stealer.enabled() && stealer.look(chi::now_ns(), published, read, serve_read))
        watcher_steals.fetch_add(1, std::memory_order_relaxed);
    };
    group.take(p);
    uint64_t ticket = claims.next(p);
    while (!group.stopping()) {
      if (claims.claim_and_serve(p, ticket, true, read, serve_read)) {
        b.reset();
        continue;
      }
      int64_t now = -1;
      auto clock = [&] { return now = chi::now_ns(); };
      int64_t nap = 0;
      const IdleBackoff::Step what = b.idle(clock, &nap);
      if (now >= 0 && stealer.look(now, published, read, serve_read)) {
        b.reset();
        continue;
      }
      if (what == IdleBackoff::Step::kSpin) {
        chi::cpu_relax();
      } else if (what == IdleBackoff::Step::kNap) {
        group.nap(nap);
      } else {
        group.hand_over(p, ticket);
        auto on_check = [&] {
          const uint32_t got = stealer.check([&](int64_t ns) { group.nap(ns); }, [] { return chi::now_ns(); },
                                             published, read, serve_read);
          if (got) sleeper_steals.fetch_add(got, std::memory_order_relaxed);
          return got != 0;
        };
        group.park(p, b, serve_parked, on_watch, on_check);
        group.take(p);
        ticket = claims.next(p);
        b.reset();
      }
    }
  }

  // Starts pollers [from, to).
  void start(uint32_t from, uint32_t to) {
    for (uint32_t p = from; p < to; ++p) threads.emplace_back([this, p] { run(p); });
  }
  void start() { start(0, parts); }
  void stop() {
    group.stop();
    for (auto &t : threads) t.join();
  }
  // Waits (bounded) until n tickets were served; false if not.
  bool wait_done(uint64_t n) {
    for (int i = 0; i < 600000 && done.load(std::memory_order_acquire) < n; ++i) sleep_us(100);
    return done.load(std::memory_order_acquire) >= n;
  }
  static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, nullptr);
  }

  const uint32_t parts;
  Ring ring;
  PollGroup group;
  PollClaims claims;
  const int64_t steal_ns;
  IdleBackoffConfig cfg;
  std::unique_ptr<std::atomic<uint32_t>[]> count;
  std::unique_ptr<std::atomic<int32_t>[]> by;
  std::atomic<uint64_t> done{0};
  std::atomic<uint64_t> bad{0};
  std::atomic<uint64_t> watcher_steals{0};
  std::atomic<uint64_t> sleeper_steals{0};
  std::vector<std::thread> threads;
};

// Ticket 0's handler blocks poller 0 until every other ticket is served:
// producers publish in bursts with quiet spells (the others park between
// them), and part 0's last tickets come only once every poller but the
// blocked one is parked, so that the watcher steals them.
void test_blocked_poller_stolen_from(void **) {
  constexpr uint32_t kParts = 4;
  constexpr uint64_t kTickets = 4096;  // a multiple of the parts
  Bench b(kParts, kTickets, 50000);
  std::atomic<bool> blocking{false};
  std::atomic<bool> released{false};
  std::atomic<bool> timed_out{false};
  b.block = [&] {
    blocking.store(true);
    // A safety bound, not a timing: without stealing this never ends.
    for (int i = 0; i < 600000; ++i) {
      if (b.done.load(std::memory_order_acquire) >= kTickets - 1) {
        released.store(true);
        return;
      }
      Bench::sleep_us(100);
    }
    timed_out.store(true);
  };
  // Ticket 0 published before poller 0 starts alone: it blocks in it from
  // its own loop (not as a parked group's watcher).
  b.ring.publish(0);
  b.start(0, 1);
  for (int i = 0; i < 600000 && !blocking.load(); ++i) Bench::sleep_us(100);
  assert_true(blocking.load());
  b.start(1, kParts);
  // Part 0's last tickets are published once the group parked: then only
  // the watcher can serve them.
  constexpr uint64_t kLast = 16;
  auto last = [&](uint64_t t) { return t >= kTickets - kLast && t % kParts == 0; };
  std::atomic<uint64_t> next{0};
  std::vector<std::thread> producers;
  for (int k = 0; k < 3; ++k)
    producers.emplace_back([&] {
      for (uint64_t n = 0;; ++n) {
        const uint64_t t = next.fetch_add(1) + 1;
        if (t >= kTickets) return;
        if (last(t)) continue;
        b.ring.publish(t);
        if (n % 256 == 255) Bench::sleep_us(5000);  // past park_after: the group parks
      }
    });
  for (auto &t : producers) t.join();
  // All but those served (the blocked ticket 0 counts once it returns);
  // then every poller but the blocked one parks (one of them watching),
  // and with nothing more to serve the group stays so.
  const bool before = b.wait_done(kTickets - 1 - kLast / kParts);
  bool parked = false;
  for (int i = 0; i < 100000 && !parked; ++i) {
    parked = b.group.sleeping() == kParts - 2 && b.group.watcher() >= 0;
    if (!parked) Bench::sleep_us(100);
  }
  for (uint64_t t = kTickets - kLast; t < kTickets; ++t)
    if (last(t)) b.ring.publish(t);
  const bool all = b.wait_done(kTickets);
  b.stop();
  assert_true(before);
  assert_true(parked);
  assert_true(all);
  assert_false(timed_out.load());
  assert_true(released.load());
  assert_int_equal(b.bad.load(), 0);
  for (uint64_t t = 0; t < kTickets; ++t) assert_int_equal(b.count[t].load(), 1);
  // Poller 0 served ticket 0 and blocked throughout: the rest of its part
  // went to others, the last ones to the watcher (every other poller slept).
  assert_int_equal(b.by[0].load(), 0);
  for (uint64_t t = 1; t < kTickets; ++t) assert_int_not_equal(b.by[t].load(), 0);
  assert_true(b.watcher_steals.load() > 0);
}

// The parked group's watcher blocks in a handler: every poller parked, then
// one ticket, which the watcher serves and blocks in until every other
// ticket is served; those come after it, and only sleepers that wake on
// their own (every PollGroup::kSleeperCheckNs) and steal can serve them.
void test_blocked_watcher(void **) {
  constexpr uint32_t kParts = 4;
  constexpr uint64_t kTickets = 256;
  Bench b(kParts, kTickets, 50000);
  std::atomic<int32_t> blocked_by{-1};
  std::atomic<bool> timed_out{false};
  b.block = [&] {
    blocked_by.store(b.group.watcher());
    // A safety bound, not a timing: without the sleepers' check this never ends.
    for (int i = 0; i < 600000; ++i) {
      if (b.done.load(std::memory_order_acquire) >= kTickets - 1) return;
      Bench::sleep_us(100);
    }
    timed_out.store(true);
  };
  b.start();
  bool parked = false;
  for (int i = 0; i < 100000 && !parked; ++i) {
    parked = b.group.sleeping() == kParts - 1 && b.group.watcher() >= 0;
    if (!parked) Bench::sleep_us(100);
  }
  b.ring.publish(0);
  for (int i = 0; i < 600000 && blocked_by.load() < 0; ++i) Bench::sleep_us(100);
  for (uint64_t t = 1; t < kTickets; ++t) b.ring.publish(t);
  const bool all = b.wait_done(kTickets);
  b.stop();
  assert_true(parked);
  assert_true(blocked_by.load() >= 0);
  assert_true(all);
  assert_false(timed_out.load());
  assert_int_equal(b.bad.load(), 0);
  for (uint64_t t = 0; t < kTickets; ++t) assert_int_equal(b.count[t].load(), 1);
  // Ticket 0 went to the watcher, and the rest to pollers other than it.
  assert_int_equal(b.by[0].load(), blocked_by.load());
  for (uint64_t t = 1; t < kTickets; ++t) assert_int_not_equal(b.by[t].load(), blocked_by.load());
  assert_true(b.sleeper_steals.load() > 0);
}

// Stealing off: ticket 0's handler waits until every ticket of the other
// parts is served; none of its own part may have been served by then.
void test_no_steal_when_off(void **) {
  constexpr uint32_t kParts = 4;
  constexpr uint64_t kTickets = 1024;
  Bench b(kParts, kTickets, 0);
  std::atomic<int64_t> own_served{-1};
  b.block = [&] {
    for (int i = 0; i < 600000 && b.done.load(std::memory_order_acquire) < kTickets - kTickets / kParts; ++i)
      Bench::sleep_us(100);
    int64_t n = 0;
    for (uint64_t t = kParts; t < kTickets; t += kParts) n += b.count[t].load();
    own_served.store(n);
  };
  for (uint64_t t = 0; t < kTickets; ++t) b.ring.publish(t);
  b.start();
  const bool all = b.wait_done(kTickets);
  b.stop();
  assert_true(all);
  assert_int_equal(own_served.load(), 0);
  assert_int_equal(b.bad.load(), 0);
  for (uint64_t t = 0; t < kTickets; ++t) assert_int_equal(b.count[t].load(), 1);
}

// Many tickets, nobody blocked, every poller stealing with a short delay:
// owners and stealers race on every part, each ticket still served once.
void test_race_every_ticket_once(void **) {
  constexpr uint32_t kParts = 4;
  constexpr uint64_t kTickets = 200000;
  Bench b(kParts, kTickets, 1000);
  b.start();
  std::atomic<uint64_t> next{0};
  std::vector<std::thread> producers;
  for (int k = 0; k < 3; ++k)
    producers.emplace_back([&] {
      for (uint64_t n = 0;; ++n) {
        const uint64_t t = next.fetch_add(1);
        if (t >= kTickets) return;
        b.ring.publish(t);
        if (n % 4096 == 4095) sched_yield();
      }
    });
  for (auto &t : producers) t.join();
  const bool all = b.wait_done(kTickets);
  b.stop();
  assert_true(all);
  assert_int_equal(b.bad.load(), 0);
  uint64_t stolen = 0;
  for (uint64_t t = 0; t < kTickets; ++t) {
    assert_int_equal(b.count[t].load(), 1);
    stolen += uint64_t(b.by[t].load()) != t % kParts;
  }
  printf("# %llu of %llu tickets served by another part's poller\n", (unsigned long long)stolen,
         (unsigned long long)kTickets);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_claim_words),
      cmocka_unit_test(test_stealer_delay),
      cmocka_unit_test(test_blocked_poller_stolen_from),
      cmocka_unit_test(test_blocked_watcher),
      cmocka_unit_test(test_no_steal_when_off),
      cmocka_unit_test(test_race_every_ticket_once),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}

// ParkGate (src/core/park_gate.h): the handshake that parks an idle GPU's
// orchestrator.  A simulated ring (a ticket counter), a simulated kernel
// that serves tickets only while resident, a parker that parks after a
// quiet spell and submitter threads that hammer it with bursts separated by
// random gaps, so that submits land before, during and after each park.
// Every ticket must be served: a stranded one (a task left in the ring of a
// parked GPU that nobody asked to start) shows as a ring that never drains.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "core/park_gate.h"

extern "C" {
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>
}

namespace {

struct Sim {
  chi::ParkGate gate;
  std::mutex mu;                      // the owner's lock (GpuDevice::mu_)
  bool parked = false;                // under mu
  std::atomic<bool> resident{true};   // a kernel is there to serve tickets
  std::atomic<uint64_t> tail{0};      // tickets taken
  std::atomic<uint64_t> served{0};    // tickets served, in order
  std::atomic<uint64_t> parks{0}, starts_inline{0}, starts_parker{0};
  std::atomic<bool> stop{false};

  // The owner's start, holding mu: the kernel comes back.
  void start_locked() {
    parked = false;
    gate.unpark();
    resident.store(true, std::memory_order_seq_cst);
  }
};

// The waker, on the submitter that won the ask: starts at once when the
// lock is free, else leaves the start to the parker's thread.
bool wake(void *arg) {
  Sim *s = static_cast<Sim *>(arg);
  std::unique_lock<std::mutex> lock(s->mu, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  if (!s->parked) return true;
  s->start_locked();
  s->gate.nudge();
  s->starts_inline.fetch_add(1);
  return true;
}

void kernel(Sim *s) {
  while (!s->stop.load()) {
    if (s->resident.load(std::memory_order_seq_cst)) {
      const uint64_t t = s->tail.load(std::memory_order_seq_cst);
      uint64_t v = s->served.load();
      if (v < t) s->served.store(v + 1);
      else std::this_thread::yield();
    } else {
      std::this_thread::yield();
    }
  }
}

// Parks after `quiet_looks` looks that saw the same tail and nothing in flight.
void parker(Sim *s, uint32_t quiet_looks) {
  uint64_t quiet_tail = ~0ull;
  uint32_t quiet = 0;
  while (!s->stop.load()) {
    bool parked;
    {
      std::lock_guard<std::mutex> lock(s->mu);
      if (!s->parked) {
        const uint64_t t = s->tail.load(std::memory_order_seq_cst);
        if (t != quiet_tail || s->served.load() != t) {
          quiet_tail = t;
          quiet = 0;
        } else if (++quiet >= quiet_looks &&
                   s->gate.try_park(t, [s] { return s->tail.load(std::memory_order_seq_cst); })) {
          s->parked = true;
          s->parks.fetch_add(1);
          // The launch ends: whatever it did not serve stays in the ring.
          s->resident.store(false, std::memory_order_seq_cst);
          quiet = 0;
        }
      } else if (s->gate.wanted()) {
        s->start_locked();
        s->starts_parker.fetch_add(1);
      }
      parked = s->parked;
    }
    if (parked) s->gate.sleep(1000000);
    else std::this_thread::yield();
  }
}

// Waits (a hang guard only: 20 s of 1 ms naps) until every ticket is served.
bool drained(Sim &s) {
  for (int i = 0; i < 20000; ++i) {
    if (s.served.load() == s.tail.load()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

void run(uint32_t threads, uint32_t rounds, uint32_t burst, uint32_t quiet_looks) {
  Sim s;
  s.gate.set_waker(wake, &s);
  std::thread k(kernel, &s), p(parker, &s, quiet_looks);
  for (uint32_t r = 0; r < rounds; ++r) {
    std::vector<std::thread> subs;
    for (uint32_t t = 0; t < threads; ++t)
      subs.emplace_back([&s, r, t, burst] {
        std::mt19937 rng(r * 131 + t);
        for (uint32_t i = 0; i < burst; ++i) {
          s.tail.fetch_add(1, std::memory_order_seq_cst);  // the ticket
          s.gate.after_submit();
          // Gaps of 0-200 us: some outlast the parker's quiet looks.
          const uint32_t gap = rng() % 8 == 0 ? rng() % 200 : 0;
          if (gap) std::this_thread::sleep_for(std::chrono::microseconds(gap));
        }
      });
    for (std::thread &t : subs) t.join();
    assert_true(drained(s));
    // Every other round starts from a parked GPU.
    if (r % 2 == 0) {
      for (int i = 0; i < 20000 && s.gate.state() != chi::ParkGate::kParked; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      assert_int_equal(s.gate.state(), chi::ParkGate::kParked);
    }
  }
  s.stop.store(true);
  s.gate.nudge();
  k.join();
  p.join();
  assert_int_equal(s.served.load(), s.tail.load());
  assert_int_equal(s.tail.load(), uint64_t(threads) * rounds * burst);
  // Each start after a park came from an ask, taken inline or by the parker.
  assert_true(s.starts_inline.load() + s.starts_parker.load() <= s.parks.load());
  assert_true(s.gate.asks() >= s.starts_inline.load() + s.starts_parker.load());
  print_message("parks %llu, starts on the submitter %llu, by the parker %llu\n",
                (unsigned long long)s.parks.load(), (unsigned long long)s.starts_inline.load(),
                (unsigned long long)s.starts_parker.load());
}

double scale() {
  const char *e = getenv("CHI_TEST_SCALE");
  double v = e ? atof(e) : 1.0;
  return v > 0 ? v : 1.0;
}

}  // namespace

// The word's own transitions, on one thread.
static void test_transitions(void **state) {
  (void)state;
  chi::ParkGate g;
  int woke = 0;
  g.set_waker(
      [](void *a) {
        ++*static_cast<int *>(a);
        return true;
      },
      &woke);
  assert_int_equal(g.state(), chi::ParkGate::kAwake);
  g.after_submit();  // awake: nothing to ask
  assert_int_equal(woke, 0);
  uint64_t tail = 5;
  assert_false(g.try_park(4, [&] { return tail; }));  // moved since the quiet look
  assert_int_equal(g.state(), chi::ParkGate::kAwake);
  assert_true(g.try_park(5, [&] { return tail; }));
  assert_true(g.parked());
  g.after_submit();
  assert_int_equal(woke, 1);
  assert_true(g.wanted());
  g.after_submit();  // asked already: no second waker call
  assert_false(g.ask());
  assert_int_equal(woke, 1);
  g.unpark();
  assert_int_equal(g.state(), chi::ParkGate::kAwake);
  assert_int_equal(g.asks(), 1);
}

// One submitter against the parker: parks at once after every quiet look.
static void test_one_submitter(void **state) {
  (void)state;
  run(1, uint32_t(40 * scale()) + 2, 200, 1);
}

// Four submitters, bursts with gaps, a parker with a longer keep-alive.
static void test_many_submitters(void **state) {
  (void)state;
  run(4, uint32_t(40 * scale()) + 2, 500, 3);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_transitions),
      cmocka_unit_test(test_one_submitter),
      cmocka_unit_test(test_many_submitters),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}

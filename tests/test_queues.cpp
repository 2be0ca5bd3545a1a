// The CPU pool's lock-free structures on their own: ShardedFreeStack (every
// index comes back exactly once, threads taking from their own shard and
// from others), and RunQueue (a full ring refuses try_push, push spills and
// the queue still hands tasks out in order; producers and consumers at once
// move every task exactly once with its inline input intact).
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "core/run_queue.h"
#include "core/sharded_free_stack.h"

extern "C" {
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
}

namespace {

using chi::QueuedTask;
using chi::RunQueue;
using chi::ShardedFreeStack;
using chi::SpillLink;

// Loops scale down under the sanitizers (CHI_TEST_SCALE, as the C tests).
uint32_t scaled(uint32_t n) {
  const char *s = std::getenv("CHI_TEST_SCALE");
  double f = s ? std::atof(s) : 1.0;
  uint32_t v = uint32_t(n * (f > 0 ? f : 1.0));
  return v ? v : 1;
}

void test_free_stack_shards(void **) {
  constexpr uint32_t kSlots = 4096, kShards = 8, kThreads = 4;
  ShardedFreeStack fs;
  fs.init(kSlots, kShards);
  for (uint32_t i = 0; i < kSlots; ++i) fs.push(i % kShards, i);
  // Each thread takes and returns slots on its own shard; thread 0 only
  // takes (from every shard once its own is empty) and thread 1 returns
  // what it takes on another shard, so slots move between shards.
  const uint32_t rounds = scaled(200000);
  std::vector<std::vector<uint32_t>> kept(kThreads);
  std::vector<std::thread> ts;
  for (uint32_t t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      uint32_t hint = 0, idx;
      std::vector<uint32_t> held;
      for (uint32_t r = 0; r < rounds; ++r) {
        if (fs.pop(t, &idx, &hint)) held.push_back(idx);
        if (t != 0 && held.size() > 8) {
          fs.push(t == 1 ? (r % kShards) : t, held.back());
          held.pop_back();
        }
        if (t == 0 && held.size() >= 256) break;
      }
      kept[t] = std::move(held);
    });
  }
  for (auto &th : ts) th.join();
  // Every index is either held by a thread or still free, exactly once.
  std::vector<uint8_t> seen(kSlots, 0);
  for (auto &h : kept)
    for (uint32_t i : h) {
      assert_true(i < kSlots);
      assert_int_equal(seen[i]++, 0);
    }
  uint32_t hint = 0, idx;
  while (fs.pop(0, &idx, &hint)) {
    assert_true(idx < kSlots);
    assert_int_equal(seen[idx]++, 0);
  }
  for (uint32_t i = 0; i < kSlots; ++i) assert_int_equal(seen[i], 1);
}

struct Inputs {
  std::vector<uint8_t> bytes;  // RunQueue::kInline per slot
  static uint8_t *dst(void *self, uint32_t slot) {
    return &static_cast<Inputs *>(self)->bytes[size_t(slot) * RunQueue::kInline];
  }
};

void test_run_queue_full_spills_in_order(void **) {
  constexpr uint32_t kCells = 8, kTasks = 40;
  std::vector<SpillLink> links(kTasks);
  Inputs in{std::vector<uint8_t>(size_t(kTasks) * RunQueue::kInline)};
  RunQueue q;
  q.init(kCells, links.data());
  uint8_t payload[16];
  for (uint32_t i = 0; i < kTasks; ++i) {
    std::memset(payload, int(i), sizeof payload);
    QueuedTask t{i, 100 + i, sizeof payload};
    if (i < kCells) {
      assert_true(q.try_push(t, payload));
    } else {
      // Full ring, then a non-empty spill list: refused, and push spills.
      assert_false(q.try_push(t, payload));
      q.push(t, payload, Inputs::dst(&in, i));
    }
  }
  for (uint32_t i = 0; i < kTasks; ++i) {
    QueuedTask t;
    assert_true(q.pop(&t, &Inputs::dst, &in));
    assert_int_equal(t.slot, i);
    assert_int_equal(t.method, 100 + i);
    assert_int_equal(t.input_size, 16);
    for (uint32_t b = 0; b < 16; ++b) assert_int_equal(Inputs::dst(&in, i)[b], uint8_t(i));
  }
  QueuedTask t;
  assert_false(q.pop(&t, &Inputs::dst, &in));
  assert_false(q.maybe_nonempty());
  // Drained: the ring takes tasks again.
  assert_true(q.try_push(QueuedTask{0, 1, 0}, nullptr));
}

void test_run_queue_mpmc(void **) {
  constexpr uint32_t kProducers = 3, kConsumers = 3, kCells = 64;
  const uint32_t per = scaled(50000);
  const uint32_t total = per * kProducers;
  std::vector<SpillLink> links(total);
  Inputs in{std::vector<uint8_t>(size_t(total) * RunQueue::kInline)};
  RunQueue q;
  q.init(kCells, links.data());
  std::vector<std::atomic<uint8_t>> got(total);
  std::atomic<uint32_t> done{0}, bad{0};
  std::vector<std::thread> ts;
  for (uint32_t p = 0; p < kProducers; ++p)
    ts.emplace_back([&, p] {
      for (uint32_t k = 0; k < per; ++k) {
        const uint32_t slot = p * per + k;
        uint32_t v = slot * 2654435761u;
        q.push(QueuedTask{slot, slot ^ 0x5a5a, sizeof v}, &v, Inputs::dst(&in, slot));
      }
    });
  for (uint32_t c = 0; c < kConsumers; ++c)
    ts.emplace_back([&, c] {
      // Consumer c takes one task at a time (c = 0) or up to 4 or 8 (pop_many).
      const uint32_t most = c == 0 ? 1 : 4 * c;
      while (done.load(std::memory_order_relaxed) < total) {
        QueuedTask t[RunQueue::kMaxPopMany];
        uint32_t n = most > 1 ? q.pop_many(t, most, &Inputs::dst, &in) : 0;
        if (n == 0) n = q.pop(&t[0], &Inputs::dst, &in) ? 1 : 0;  // the spill list is pop()'s
        for (uint32_t i = 0; i < n; ++i) {
          uint32_t v;
          std::memcpy(&v, Inputs::dst(&in, t[i].slot), sizeof v);
          if (t[i].slot >= total || t[i].method != (t[i].slot ^ 0x5a5a) || v != t[i].slot * 2654435761u)
            bad.fetch_add(1);
          else
            got[t[i].slot].fetch_add(1);
          done.fetch_add(1);
        }
      }
    });
  for (auto &th : ts) th.join();
  assert_int_equal(bad.load(), 0);
  for (uint32_t i = 0; i < total; ++i) assert_int_equal(got[i].load(), 1);
}

// pop_many takes half of the ready run at the head (rounded up), at most
// `most`, in order, with inline inputs; an empty ring gives 0.
void test_run_queue_pop_many(void **) {
  constexpr uint32_t kCells = 16, kTasks = 10;
  std::vector<SpillLink> links(kTasks);
  Inputs in{std::vector<uint8_t>(size_t(kTasks) * RunQueue::kInline)};
  RunQueue q;
  q.init(kCells, links.data());
  for (uint32_t slot = 0; slot < kTasks; ++slot) {
    uint32_t v = slot * 2654435761u;
    q.push(QueuedTask{slot, slot + 100, sizeof v}, &v, Inputs::dst(&in, slot));
  }
  const uint32_t want[] = {4, 3, 2, 1};  // runs of 10, 6, 3, 1
  uint32_t next = 0;
  for (uint32_t n : want) {
    QueuedTask t[RunQueue::kMaxPopMany];
    assert_int_equal(q.pop_many(t, 4, &Inputs::dst, &in), n);
    for (uint32_t i = 0; i < n; ++i, ++next) {
      assert_int_equal(t[i].slot, next);
      assert_int_equal(t[i].method, next + 100);
      uint32_t v;
      std::memcpy(&v, Inputs::dst(&in, t[i].slot), sizeof v);
      assert_int_equal(v, next * 2654435761u);
    }
  }
  QueuedTask t[RunQueue::kMaxPopMany];
  assert_int_equal(q.pop_many(t, 8, &Inputs::dst, &in), 0);
  assert_int_equal(q.pop_many(t, 0, &Inputs::dst, &in), 0);
  // Cells wrap round: the ring is used again after its tasks were taken.
  for (uint32_t slot = 0; slot < kTasks; ++slot) q.push(QueuedTask{slot, 7, 0}, nullptr, Inputs::dst(&in, slot));
  assert_int_equal(q.pop_many(t, 8, &Inputs::dst, &in), 5);
  assert_int_equal(t[0].slot, 0);
  assert_int_equal(t[4].slot, 4);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_free_stack_shards),
      cmocka_unit_test(test_run_queue_full_spills_in_order),
      cmocka_unit_test(test_run_queue_mpmc),
      cmocka_unit_test(test_run_queue_pop_many),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}

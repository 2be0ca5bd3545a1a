#include "gpu/h2d_executor.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "base/error.h"
#include "base/futex.h"
#include "core/runtime.h"
#include "core/slot_word.h"
#include "core/stats.h"
#include "gpu/cpu_poller.h"
#include "gpu/ll.h"

namespace chi::gpu {

namespace {

thread_local uint32_t tls_free_hint = 0;  // the shard this thread last took a slot from

// Waits for a condition: spins spin_ns, then sleeps, doubling the nap up to
// max_nap_ns.  Returns false when the deadline (< 0: none) passes first.
template <class F>
bool wait_until(F ready, int64_t timeout_ns, int64_t spin_ns, int64_t max_nap_ns) {
  if (ready()) return true;
  if (timeout_ns == 0) return false;
  const int64_t t0 = now_ns();
  int64_t nap = 1000;
  for (uint32_t i = 1;; ++i) {
    if (ready()) return true;
    if ((i & 63) == 0 || timeout_ns > 0) {
      int64_t elapsed = now_ns() - t0;
      if (timeout_ns > 0 && elapsed >= timeout_ns) return ready();
      if (elapsed >= spin_ns) {
        int64_t d = nap;
        if (timeout_ns > 0 && timeout_ns - elapsed < d) d = timeout_ns - elapsed;
        timespec ts{time_t(d / 1000000000), long(d % 1000000000)};
        nanosleep(&ts, nullptr);
        nap = nap * 2 < max_nap_ns ? nap * 2 : max_nap_ns;
        continue;
      }
    }
    cpu_relax();
  }
}

}  // namespace

H2dExecutor::H2dExecutor(Runtime &rt, int32_t gpu, const Shape &shape, uint64_t *ring,
                         uint64_t *done, uint8_t *buf)
    : rt_(rt),
      gpu_(gpu),
      shape_(shape),
      ring_(ring),
      done_(done),
      buf_(buf),
      state_(new std::atomic<uint32_t>[shape.h2d_slots]),
      method_(new uint32_t[shape.h2d_slots]) {
  free_.init(shape.h2d_slots, kFreeShards);
  // Dealt round the shards, so that every thread starts with some of its own.
  for (uint32_t i = shape.h2d_slots; i-- > 0;) {
    state_[i].store(slot::word(0, slot::kFree), std::memory_order_relaxed);
    method_[i] = 0;
    free_.push(i % kFreeShards, i);
  }
}

chi_status_t H2dExecutor::check(uint32_t slot, uint32_t gen, uint32_t state) const {
  if (slot >= shape_.h2d_slots)
    return set_error(CHI_ERR_INVALID, "GPU %d: future names slot %u of %u", gpu_, slot,
                     shape_.h2d_slots);
  if (state_[slot].load(std::memory_order_acquire) != slot::word(gen, state))
    return set_error(CHI_ERR_INVALID, "GPU %d: stale or already consumed future", gpu_);
  return CHI_OK;
}

bool H2dExecutor::finished(uint32_t slot, uint32_t gen) const {
  return ll_flag(ll_load(done_ + uint64_t(slot) * CHI_DEV_LL_WORDS)) == gen;
}

void H2dExecutor::recycle(uint32_t slot) {
  slot::set_free(state_[slot]);
  free_.push(thread_index() % kFreeShards, slot);
}

void H2dExecutor::reap() {
  if (nreleased_.load(std::memory_order_acquire) == 0) return;
  std::lock_guard<std::mutex> lock(released_mu_);
  size_t keep = 0;
  for (uint32_t slot : released_) {
    uint32_t w = state_[slot].load(std::memory_order_acquire);
    if (slot::state_of(w) == slot::kOrphan && finished(slot, slot::gen_of(w))) {
      recycle(slot);
    } else {
      released_[keep++] = slot;
    }
  }
  released_.resize(keep);
  nreleased_.store(uint32_t(keep), std::memory_order_release);
}

uint32_t H2dExecutor::in_flight() const {
  uint32_t n = 0;
  for (uint32_t i = 0; i < shape_.h2d_slots; ++i) {
    uint32_t w = state_[i].load(std::memory_order_acquire);
    uint32_t st = slot::state_of(w);
    if ((st == slot::kPending || st == slot::kOrphan) && !finished(i, slot::gen_of(w))) ++n;
  }
  return n;
}

bool H2dExecutor::take_slot(uint32_t *slot) {
  const uint32_t shard = thread_index() % kFreeShards;
  if (free_.pop(shard, slot, &tls_free_hint)) return true;
  reap();
  if (free_.pop(shard, slot, &tls_free_hint)) return true;
  const Config &cfg = rt_.config();
  // From a handler, blocking on the queue its own GPU must drain can deadlock.
  bool may_block = cfg.submit_blocking && !rt_.cpu().on_worker_thread() && !on_poller_thread() &&
                   !submit_never_blocks();
  if (!may_block) return false;
  return wait_until(
      [&] {
        if (free_.pop(shard, slot, &tls_free_hint)) return true;
        reap();
        return free_.pop(shard, slot, &tls_free_hint);
      },
      int64_t(cfg.submit_timeout_ms) * 1000000, cfg.spin_ns, 100000);
}

void H2dExecutor::mark_failed(const std::string &why) {
  if (failed_.load(std::memory_order_acquire)) return;
  failed_why_ = why;
  failed_.store(true, std::memory_order_release);
}

chi_status_t H2dExecutor::submit(chi_method_t method, const void *input, size_t input_size,
                                 uint32_t *slot_out, uint32_t *gen_out) {
  if (failed_.load(std::memory_order_acquire))
    return set_error(CHI_ERR_INTERNAL, "GPU %d: orchestrator failed: %s", gpu_, failed_why_.c_str());
  if (!open_.load(std::memory_order_acquire))
    return set_error(CHI_ERR_SHUTDOWN, "GPU %d: runtime is shutting down", gpu_);
  if (input_size > shape_.max_payload)
    return set_error(CHI_ERR_TOO_LARGE, "GPU %d: input of %zu bytes over gpu.max_payload %u", gpu_,
                     input_size, shape_.max_payload);
  if (park_) park_->before_submit();  // a parked GPU's launch overlaps the rest
  uint32_t slot;
  if (!take_slot(&slot))
    return set_error(CHI_ERR_AGAIN, "GPU %d: all %u CPU->GPU slots in use", gpu_,
                     shape_.h2d_slots);
  const uint32_t size = uint32_t(input_size);
  method_[slot] = method;
  const uint32_t gen = slot::begin_nonzero(state_[slot]);
  if (size > CHI_DEV_LL_INLINE) std::memcpy(buf_ + slot * shape_.payload_stride, input, size);

  // The slot is taken before the ticket: with at most h2d_slots tasks queued,
  // an entry is never rewritten before its polling warp has read it.
  // seq_cst: ordered before the look at the park gate below (park_gate.h).
  uint64_t t = tail_.fetch_add(1, std::memory_order_seq_cst);
  uint64_t *e = ring_ + (t & (shape_.h2d_ring_entries - 1)) * CHI_DEV_LL_WORDS;
  const uint32_t flag = uint32_t(t) + 1;
  if (size <= CHI_DEV_LL_INLINE) ll_put_payload(e, input, size, flag);
  ll_store(e + 3, ll_pack(gen, flag));
  ll_store(e + 2, ll_pack(slot, flag));
  ll_store(e + 1, ll_pack(size, flag));
  ll_store(e + 0, ll_pack(method, flag));
  if (park_) park_->after_submit();  // a parked GPU starts for this task
  *slot_out = slot;
  *gen_out = gen;
  return CHI_OK;
}

chi_status_t H2dExecutor::wait(uint32_t slot, uint32_t gen, int64_t timeout_ns, void *output,
                               size_t output_capacity, size_t *output_size) {
  if (chi_status_t s = check(slot, gen, slot::kPending); s != CHI_OK) return s;
  const uint64_t *rec = done_ + uint64_t(slot) * CHI_DEV_LL_WORDS;
  const Config &cfg = rt_.config();
  int64_t max_nap = int64_t(cfg.gpu.poll_interval_us) * 1000;
  if (max_nap < 1000) max_nap = 1000;
  auto ready = [&] {
    return finished(slot, gen) || stopped_.load(std::memory_order_acquire) ||
           failed_.load(std::memory_order_acquire);
  };
  int64_t spin_ns = cfg.spin_ns;
  if (int64_t until = starting_until_.load(std::memory_order_relaxed); until != 0) {
    const int64_t now = now_ns();
    if (now < until) spin_ns = std::max(spin_ns, until - now);
    else starting_until_.compare_exchange_strong(until, 0, std::memory_order_relaxed);
  }
  if (!wait_until(ready, timeout_ns, spin_ns, max_nap))
    return set_error(CHI_ERR_TIMEOUT, "GPU %d: task not finished within %lld ns", gpu_,
                     (long long)timeout_ns);
  if (!finished(slot, gen)) {
    if (failed_.load(std::memory_order_acquire))
      return set_error(CHI_ERR_INTERNAL, "GPU %d: orchestrator failed before the task ran: %s", gpu_,
                       failed_why_.c_str());
    return set_error(CHI_ERR_SHUTDOWN, "GPU %d: runtime shut down before the task ran", gpu_);
  }
  // The header's two words are stored by one lane, back to back.
  // The clock is read only if a word is late (a read costs tens of ns on
  // some virtual machines, as much as the rest of this path).
  uint64_t w1;
  int64_t t0 = 0;
  auto torn = [&] {
    const int64_t now = now_ns();
    if (t0 == 0) t0 = now;
    return now - t0 > 1000000000;
  };
  while (ll_flag(w1 = ll_load(rec + 1)) != gen) {
    if (torn()) return set_error(CHI_ERR_INTERNAL, "GPU %d: torn completion record", gpu_);
    cpu_relax();
  }
  const chi_status_t status = chi_status_t(ll_data(ll_load(rec)));
  const uint32_t osize = ll_data(w1);
  if (output && osize > output_capacity) {
    // Decided before the claim (the future stays valid), so the size read
    // above counts only if the slot still holds this task after it: a
    // waiter that lost the future to another thread, the slot reused since,
    // would report another task's size.
    if (state_[slot].load(std::memory_order_acquire) != slot::word(gen, slot::kPending) || !finished(slot, gen))
      return set_error(CHI_ERR_INVALID, "GPU %d: future consumed by another thread", gpu_);
    if (output_size) *output_size = osize;
    return set_error(CHI_ERR_TOO_LARGE, "GPU %d: output of %u bytes, buffer of %zu", gpu_, osize,
                     output_capacity);
  }
  if (output_size) *output_size = osize;
  if (!slot::claim(state_[slot], slot::word(gen, slot::kPending)))
    return set_error(CHI_ERR_INVALID, "GPU %d: future consumed by another thread", gpu_);
  if (output && osize) {
    if (osize <= CHI_DEV_LL_INLINE) {
      while (!ll_get_payload(rec, output, osize, gen)) {
        if (torn()) {
          recycle(slot);
          return set_error(CHI_ERR_INTERNAL, "GPU %d: torn completion record", gpu_);
        }
        cpu_relax();
      }
    } else {
      std::memcpy(output, buf_ + slot * shape_.payload_stride, osize);
    }
  }
  chi_method_t method = method_[slot];
  recycle(slot);
  if (status != CHI_OK)
    return set_error(status, "GPU %d: method %u returned %d (%s)", gpu_, method, status,
                     chi_status_string(status));
  return CHI_OK;
}

chi_status_t H2dExecutor::test(uint32_t slot, uint32_t gen, int *done) {
  if (chi_status_t s = check(slot, gen, slot::kPending); s != CHI_OK) return s;
  *done = finished(slot, gen) ? 1 : 0;
  return CHI_OK;
}

chi_status_t H2dExecutor::release(uint32_t slot, uint32_t gen) {
  if (chi_status_t s = check(slot, gen, slot::kPending); s != CHI_OK) return s;
  if (slot::orphan(state_[slot], gen) != slot::kOrphan)
    return set_error(CHI_ERR_INVALID, "GPU %d: future consumed by another thread", gpu_);
  if (finished(slot, gen)) {
    recycle(slot);
    return CHI_OK;
  }
  // Still running: the GPU->CPU poller (or a submit short of slots) recycles it later.
  std::lock_guard<std::mutex> lock(released_mu_);
  released_.push_back(slot);
  nreleased_.store(uint32_t(released_.size()), std::memory_order_release);
  return CHI_OK;
}

}  // namespace chi::gpu

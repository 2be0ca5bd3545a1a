#include "gpu/cpu_poller.h"

#include <pthread.h>
#include <sys/prctl.h>
#include <time.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>

#include "base/futex.h"
#include "base/log.h"
#include "core/registry.h"
#include "core/runtime.h"
#include "gpu/h2d_executor.h"
#include "gpu/ll.h"

namespace chi::gpu {

namespace {
thread_local bool t_on_poller = false;
}

bool on_poller_thread() { return t_on_poller; }

CpuPoller::CpuPoller(Runtime &rt, int32_t gpu, const Shape &shape, uint64_t *ring,
                     uint64_t *reply, uint8_t *buf, H2dExecutor *reaper, D2hRelay *relay)
    : rt_(rt), gpu_(gpu), shape_(shape), ring_(ring), reply_(reply), buf_(buf), reaper_(reaper),
      relay_(relay) {}

void CpuPoller::start() {
  stop_.store(false, std::memory_order_relaxed);
  group_ = std::make_unique<PollGroup>(shape_.cpu_pollers);
  claims_ = std::make_unique<PollClaims>(shape_.cpu_pollers);
  served_.reset(new Served[shape_.cpu_pollers]);
  if (bell_.word_) group_->set_bell(&bell_, bell_check_ns_);
  for (uint32_t p = 0; p < shape_.cpu_pollers; ++p) threads_.emplace_back([this, p] { run(p); });
}

void CpuPoller::stop() {
  stop_.store(true, std::memory_order_release);
  if (group_) group_->stop();
  for (auto &t : threads_) t.join();
  threads_.clear();
}

void CpuPoller::set_bell(uint64_t *word, int64_t check_ns) {
  bell_.word_ = word;
  bell_check_ns_ = check_ns;
}

void CpuPoller::set_bell_live(bool live) {
  if (bell_.live_.exchange(live, std::memory_order_seq_cst) == live || live || !group_) return;
  group_->kick();  // back to naps: nothing will ring
}

void CpuPoller::bell_rang(uint64_t rung) {
  if (group_ && bell_.word_ && rung != 0 && __atomic_load_n(bell_.word_, __ATOMIC_SEQ_CST) == rung)
    group_->kick();
}

uint64_t CpuPoller::others_served(uint32_t part) const {
  uint64_t sum = 0;
  for (uint32_t p = 0; p < shape_.cpu_pollers; ++p)
    if (p != part) sum += served_[p].n.load(std::memory_order_relaxed);
  return sum;
}

const uint64_t *CpuPoller::entry(uint64_t ticket) const {
  return ring_ + (ticket & (shape_.d2h_ring_entries - 1)) * CHI_DEV_LL_WORDS;
}

bool CpuPoller::published(uint64_t ticket) const {
  return ll_flag(ll_load(entry(ticket))) == uint32_t(ticket) + 1;
}

bool CpuPoller::read_entry(uint64_t ticket, bool prefetch, Entry *x, unsigned char *in) {
  const uint64_t *e = entry(ticket);
  const uint32_t flag = uint32_t(ticket) + 1;
  const uint64_t w0 = ll_load(e);
  if (ll_flag(w0) != flag) return false;
  if (prefetch) {
    // Under load the next entries of this part are likely written already:
    // start their cache misses now, so they overlap this entry's handler.
    const uint32_t step = shape_.cpu_pollers;
    for (uint32_t k = 1; k <= 2; ++k) {
      const char *n = reinterpret_cast<const char *>(entry(ticket + k * step));
      for (uint32_t b = 0; b < CHI_DEV_LL_WORDS * 8; b += 64) __builtin_prefetch(n + b);
    }
  }
  // The words after the first may still be on their way.  Once another
  // poller claimed the ticket its entry may be rewritten by a later ticket:
  // stop waiting then (the claim word is this part's, cached while nobody steals).
  auto gone = [&] {
    return stop_.load(std::memory_order_relaxed) ||
           claims_->next(uint32_t(ticket % shape_.cpu_pollers)) != ticket;
  };
  // The header's words are one 16-byte store each; the data words came before.
  uint64_t w[4] = {w0, 0, 0, 0};
  for (int i = 1; i < 4; ++i)
    while (ll_flag(w[i] = ll_load(e + i)) != flag)
      if (gone()) return false;
  x->method = ll_data(w[0]);
  x->size = ll_data(w[1]);
  // A relay's entries carry the route above the slot (chimaera/device_layout.h).
  const uint32_t word = ll_data(w[2]);
  x->slot = relay_ ? word & CHI_DEV_SLOT_MASK : word;
  x->route = relay_ ? chi_route_t(word >> CHI_DEV_SLOT_BITS) - CHI_DEV_ROUTE_BIAS : CHI_ROUTE_CPU;
  x->gen = ll_data(w[3]);
  if (x->slot < shape_.dslots && x->size <= shape_.max_payload && x->size <= CHI_DEV_LL_INLINE)
    while (!ll_get_payload(e, in, x->size, flag))
      if (gone()) return false;
  return true;
}

void CpuPoller::serve_entry(const Entry &x, const unsigned char *in, unsigned char *out) {
  if (x.slot >= shape_.dslots) {
    // Nobody can be waiting on such a slot: report and skip the entry.
    log(LogLevel::kError, "GPU %d: GPU->CPU ring entry names slot %u of %u; dropped", gpu_, x.slot,
        shape_.dslots);
    return;
  }
  chi_status_t status;
  size_t osize = 0;
  if (x.size > shape_.max_payload) {
    status = CHI_ERR_PROTOCOL;
  } else {
    // Larger inputs are in the slot's buffer, fenced before the entry.
    const void *input = x.size <= CHI_DEV_LL_INLINE ? static_cast<const void *>(in)
                                                    : buf_ + x.slot * shape_.payload_stride;
    if (relay_) {
      if (relay_->take(x.route, x.method, input, x.size, x.slot, x.gen, &status, out, &osize)) return;
    } else {
      status = run_cpu_handler(rt_.registry(), x.method, gpu_, input, x.size, out, shape_.max_payload,
                               &osize);
    }
  }
  reply(x.slot, x.gen, status, out, osize);
}

void CpuPoller::reply(uint32_t slot, uint32_t gen, chi_status_t status, const void *out, size_t osize) {
  uint64_t *r = reply_ + uint64_t(slot) * CHI_DEV_LL_WORDS;
  if (osize <= CHI_DEV_LL_INLINE) {
    // Dense, after the header words: the device reads it with plain loads
    // after its acquire load of word 0 sees `gen` (docs/gpu.md).
    if (osize) std::memcpy(reinterpret_cast<unsigned char *>(r + CHI_DEV_LL_HEADER), out, osize);
  } else {
    std::memcpy(buf_ + slot * shape_.payload_stride, out, osize);
  }
  // Words 2-3 carry an output of up to 8 bytes as LL words, which a waiter's
  // poll reads beside the header: such a reply is taken in one round trip
  // (device_layout.h).  Written with every reply, zeros (flag 0) when they
  // carry none: a poll may load them before this reply's, and after 2^24-1
  // uses of the slot an older reply's words would carry this generation.
  uint32_t w[2] = {0, 0};
  const bool ll = osize && osize <= CHI_DEV_REPLY_LL_OUTPUT;
  if (ll) std::memcpy(w, out, osize);
  ll_store(r + 2, ll_pack(w[0], ll ? gen : 0));
  ll_store(r + 3, ll_pack(w[1], ll ? gen : 0));
  ll_store(r + 1, ll_pack(uint32_t(osize), gen));
  ll_store(r, ll_pack(uint32_t(status), gen));
}

void CpuPoller::run(uint32_t part) {
  t_on_poller = true;
  pthread_setname_np(pthread_self(), "chi-gpu-poll");  // for top and per-thread CPU figures
  // Naps mean what the configuration says (the default slack of 50 us
  // would stretch a 100 us nap by half).
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  std::unique_ptr<unsigned char[]> in(new unsigned char[shape_.payload_stride]);
  std::unique_ptr<unsigned char[]> out(new unsigned char[shape_.payload_stride]);
  const Config &cfg = rt_.config();
  IdleBackoffConfig bc;
  bc.spin_ns = cfg.gpu.poller_spin_ns;
  bc.nap_max_ns = int64_t(cfg.gpu.poll_interval_us) * 1000;
  // poll_interval_us 0: pollers never sleep, so they never park either.
  bc.park_after_ns = cfg.gpu.poller_park_after_us && bc.nap_max_ns > 0
                         ? int64_t(cfg.gpu.poller_park_after_us) * 1000
                         : -1;
  bc.watch_max_ns = int64_t(cfg.gpu.poller_watch_interval_us) * 1000;
  IdleBackoff backoff(bc);
  PollGroup &group = *group_;
  PollClaims &claims = *claims_;
  PollStealer stealer(claims, part, int64_t(cfg.gpu.poller_steal_us) * 1000);
  // Every ticket is read, then claimed, then served (core/poll_claims.h),
  // whoever serves it: this poller, the parked group's watcher, a stealer.
  Entry entry{};
  auto read_mine = [&](uint64_t t) { return read_entry(t, true, &entry, in.get()); };
  auto read_other = [&](uint64_t t) { return read_entry(t, false, &entry, in.get()); };
  auto serve_read = [&](uint64_t) { serve_entry(entry, in.get(), out.get()); };
  auto is_published = [&](uint64_t t) { return published(t); };
  std::atomic<uint64_t> &served = served_[part].n;
  auto count = [&](uint64_t n) {
    served.store(served.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  };
  auto serve_parked = [&](uint64_t &t) { return claims.serve_for_group(t, read_mine, serve_read); };
  // A look reads every other part's claim word, and each read takes the
  // line from its owner, whose next claim then misses: looks every 64 spins
  // made warp-call rows 25% slower on an H200 (lab/journal/gpu-routes.md).  So an
  // idle poller looks at most every quarter of the steal delay, and every
  // pass only while it is taking a held-up part's tickets.
  const int64_t look_every_ns = std::max<int64_t>(int64_t(cfg.gpu.poller_steal_us) * 250, 1000);
  int64_t last_look = std::numeric_limits<int64_t>::min() / 2;
  bool stealing = false;
  auto steal = [&](int64_t now) -> uint32_t {
    if (!stealing && now - last_look < look_every_ns) return 0;
    last_look = now;
    const uint32_t got = stealer.look(now, is_published, read_other, serve_read);
    stealing = got != 0;
    if (got) count(got);
    return got;
  };
  // The watcher also steals from the parts of pollers that are held up (a
  // parked group's watcher polls the parked parts only).
  auto on_watch = [&] {
    if (reaper_) reaper_->reap();
    if (stealer.enabled()) steal(now_ns());
  };
  group.take(part);
  uint64_t ticket = claims.next(part);
  int64_t last_reap = 0;
  uint32_t spins = 0;
  uint64_t others_seen = others_served(part);
  while (!stop_.load(std::memory_order_acquire)) {
    if (claims.claim_and_serve(part, ticket, true, read_mine, serve_read)) {
      count(1);
      backoff.reset();
      continue;
    }
    // The idle pass reads the clock at most once (every kPollsPerClock
    // polls while spinning); a look at the other parts comes with it.
    int64_t now = -1;
    auto clock = [&] { return now = now_ns(); };
    int64_t nap = 0;
    const IdleBackoff::Step what = backoff.idle(clock, &nap);
    if (now >= 0 && steal(now)) {
      backoff.reset();
      continue;
    }
    // Poller 0 reaps released CPU->GPU slots every ms while idle, also when
    // it never sleeps (poll_interval_us 0).
    if (what == IdleBackoff::Step::kSpin && (part != 0 || (++spins & 1023) != 0)) {
      cpu_relax();
      continue;
    }
    if (part == 0) {
      if (now < 0) now = now_ns();
      if (now - last_reap > PollGroup::kWatchHookNs) {
        if (reaper_) reaper_->reap();
        last_reap = now;
      }
    }
    if (what == IdleBackoff::Step::kSpin) continue;
    // Tickets go round the pollers, so one thread's lone tasks reach this
    // poller once every P round trips (P pollers): with 8 pollers and 1 KiB tasks
    // that is past the spin window, and each task met a napping poller
    // (+10-17 us on an H100).  The spin window therefore runs from the
    // group's last task, not this poller's: while the others serve, spin on.
    if (const uint64_t others = others_served(part); others != others_seen) {
      others_seen = others;
      backoff.reset();
      continue;
    }
    if (what == IdleBackoff::Step::kNap) {
      group.nap(nap);
      continue;
    }
    // Parked: the group's watcher serves this part until it gets busy.
    group.hand_over(part, ticket);
    // A sleeper that wakes on its own looks at the other shares: a watcher
    // held up in a handler leaves the parked shares' tasks to it.
    auto on_check = [&] {
      const uint32_t got = stealer.check([&](int64_t ns) { group.nap(ns); }, now_ns, is_published, read_other,
                                         serve_read);
      if (got) count(got);
      return got != 0;
    };
    group.park(part, backoff, serve_parked, on_watch, on_check);
    group.take(part);
    ticket = claims.next(part);
    backoff.reset();
  }
}

}  // namespace chi::gpu

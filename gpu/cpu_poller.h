// GPU->CPU tasks: CPU threads that read the ring kernels write to (pinned host
// memory), run the CPU handler and write the LL reply the kernel polls.
// Poller p serves tickets t with t % pollers == p, in ticket order.  Idle
// pollers back off and park as one PollGroup (core/poll_group.h): one
// watches every part with naps, the others sleep.  An idle poller steals
// the next ticket of a part whose poller is held up (a blocking handler, a
// descheduled thread) once it has waited gpu.poller_steal_us: every ticket
// is claimed by CAS on its part's claim word first (core/poll_claims.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "chimaera.h"
#include "core/poll_claims.h"
#include "core/poll_group.h"
#include "gpu/shape.h"

namespace chi {
class Runtime;
}

namespace chi::gpu {

class H2dExecutor;

// A client process's relay (client_gpu.cpp): its kernels send every route
// through the ring, and the relay runs or forwards each task.
class D2hRelay {
 public:
  virtual ~D2hRelay() = default;
  // One task read from the ring (input valid during the call only).  True:
  // taken, the relay answers later with CpuPoller::reply; false: *status,
  // out (capacity max_payload) and *osize are the answer now.
  virtual bool take(chi_route_t route, chi_method_t method, const void *input, uint32_t size,
                    uint32_t slot, uint32_t gen, chi_status_t *status, void *out, size_t *osize) = 0;
};

// True on a poller thread (handlers there must not block on a full queue).
bool on_poller_thread();

class CpuPoller {
 public:
  CpuPoller(Runtime &rt, int32_t gpu, const Shape &shape, uint64_t *ring, uint64_t *reply,
            uint8_t *buf, H2dExecutor *reaper, D2hRelay *relay = nullptr);
  ~CpuPoller() { stop(); }
  void start();
  // Joins the threads; tasks not yet read stay in the ring.
  void stop();
  // Writes the reply record of `slot` (osize <= max_payload); from any
  // thread, once per task.
  void reply(uint32_t slot, uint32_t gen, chi_status_t status, const void *out, size_t osize);

  // The GPU's bell (PollGroup, docs/gpu.md "Idle GPU->CPU pollers"), before
  // start(): `word` is the pinned word the orchestrator's keeper reads
  // (host_lease[2]); the parked watcher sleeps on it for at most check_ns.
  void set_bell(uint64_t *word, int64_t check_ns);
  // Whether a leased orchestrator runs and will hear the bell; false wakes a
  // watcher asleep on it (it naps again).
  void set_bell_live(bool live);
  // The GPU is parked (no kernel: no GPU->CPU ticket can be taken until it
  // starts, and its keeper then rings the armed bell): the watcher asleep
  // on the bell looks on its own only every kParkedCheckNs.
  void set_bell_parked(bool parked) { bell_.parked_.store(parked, std::memory_order_relaxed); }
  // A launch ended after its keeper rang for bell value `rung`: wakes the
  // watcher if that is the armed value.
  void bell_rang(uint64_t rung);
  // Whether the parked watcher sleeps on the bell now (no GPU->CPU task for
  // a while).
  bool bell_armed() const { return bell_.word_ && __atomic_load_n(bell_.word_, __ATOMIC_RELAXED) != 0; }
  // For diagnostics and tests: times the watcher slept on the bell.
  uint64_t bell_sleeps() const { return group_ ? group_->bell_sleeps() : 0; }
  uint64_t bell_kicks() const { return group_ ? group_->kicks() : 0; }

 private:
  class Bell : public PollBell {
   public:
    bool live() const override { return live_.load(std::memory_order_seq_cst); }
    void arm(uint64_t first) override { __atomic_store_n(word_, first + 1, __ATOMIC_SEQ_CST); }
    void disarm() override { __atomic_store_n(word_, 0, __ATOMIC_SEQ_CST); }
    int64_t check_ns(int64_t dflt) const override {
      return parked_.load(std::memory_order_relaxed) && dflt < kParkedCheckNs ? kParkedCheckNs : dflt;
    }
    static constexpr int64_t kParkedCheckNs = 1000000000;
    uint64_t *word_ = nullptr;
    std::atomic<bool> live_{false};
    std::atomic<bool> parked_{false};
  };

  // One ring entry as read before its ticket is claimed.
  struct Entry {
    chi_method_t method;
    uint32_t size;
    uint32_t slot;
    chi_route_t route;
    uint32_t gen;
  };

  void run(uint32_t part);
  const uint64_t *entry(uint64_t ticket) const;
  // Whether ticket's entry is published (its first word; the rest may
  // still be on its way).
  bool published(uint64_t ticket) const;
  // Reads ticket's entry into *e and its inline payload into `in`; false if
  // it is not published, or if it stopped being ticket's next to claim (or
  // the poller stops) while its words were on their way.  prefetch: start
  // the cache misses of the part's next two entries (the owner's ones).
  bool read_entry(uint64_t ticket, bool prefetch, Entry *e, unsigned char *in);
  // Runs the handler of an entry read and claimed, and replies.
  void serve_entry(const Entry &e, const unsigned char *in, unsigned char *out);

  Runtime &rt_;
  const int32_t gpu_;
  const Shape shape_;
  uint64_t *const ring_;
  uint64_t *const reply_;
  uint8_t *const buf_;
  H2dExecutor *const reaper_;
  D2hRelay *const relay_;
  std::atomic<bool> stop_{false};
  std::unique_ptr<PollGroup> group_;    // made by start()
  std::unique_ptr<PollClaims> claims_;  // made by start(): each part's next ticket
  // Entries each poller served (its own part's, and those it stole),
  // written by that poller alone: an idle poller keeps spinning while the
  // others' sum moves (see run()).
  struct alignas(64) Served {
    std::atomic<uint64_t> n{0};
  };
  std::unique_ptr<Served[]> served_;  // made by start(), one per poller
  uint64_t others_served(uint32_t part) const;
  Bell bell_;
  int64_t bell_check_ns_ = 0;
  std::vector<std::thread> threads_;
};

}  // namespace chi::gpu

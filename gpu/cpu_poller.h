// GPU->CPU tasks: CPU threads that read the ring kernels write to (pinned host
// memory), run the CPU handler and write the LL reply the kernel polls.
// Poller p serves tickets t with t % pollers == p, in ticket order.  Idle
// pollers back off and park as one PollGroup (core/poll_group.h): one
// watches every part with naps, the others sleep.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "core/poll_group.h"
#include "gpu/shape.h"

namespace chi {
class Runtime;
}

namespace chi::gpu {

class H2dExecutor;

// True on a poller thread (handlers there must not block on a full queue).
bool on_poller_thread();

class CpuPoller {
 public:
  CpuPoller(Runtime &rt, int32_t gpu, const Shape &shape, uint64_t *ring, uint64_t *reply,
            uint8_t *buf, H2dExecutor *reaper);
  ~CpuPoller() { stop(); }
  void start();
  // Joins the threads; tasks not yet read stay in the ring.
  void stop();

 private:
  void run(uint32_t part);
  bool serve(uint64_t ticket, unsigned char *in, unsigned char *out);

  Runtime &rt_;
  const int32_t gpu_;
  const Shape shape_;
  uint64_t *const ring_;
  uint64_t *const reply_;
  uint8_t *const buf_;
  H2dExecutor *const reaper_;
  std::atomic<bool> stop_{false};
  std::unique_ptr<PollGroup> group_;  // made by start()
  std::vector<std::thread> threads_;
};

}  // namespace chi::gpu

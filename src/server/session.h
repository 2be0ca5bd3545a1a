// The server side of one connected client: its socket, its shared segment,
// and the poller code that takes its tasks.  Everything read from the
// segment is copied first and checked before use; a record that cannot be a
// client's honest request ends the session (the reason is logged).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/executor.h"
#include "ipc/segment.h"
#include "server/service.h"

namespace chi {

class Session final : public RemoteSink {
 public:
  Session(Service &service, uint32_t id, int sock, pid_t pid, uid_t uid, uint32_t kind);
  ~Session();
  Session(const Session &) = delete;
  Session &operator=(const Session &) = delete;

  // Makes the segment (a sealed memfd, the service's payload size) and the
  // doorbell (a socket pair: doorbell() is read here, client_doorbell()
  // goes to the client, then close_client_doorbell()).
  chi_status_t create_segment(uint32_t nslots);
  int client_doorbell() const { return client_doorbell_; }
  void close_client_doorbell();

  // Poller: takes up to `budget` queued tasks and hands them to the service
  // (which runs, queues or refuses each).  Returns the number taken; sets
  // dead() with a reason on a protocol violation.
  unsigned poll(unsigned budget);
  // Poller: collects finished GPU tasks; true while some are still pending.
  bool poll_gpu() {
    gpu_.reap();
    return !gpu_.empty();
  }
  bool ring_ready() const;
  void arm_doorbell(bool on) {
    seg_.header()->doorbell_armed.store(on ? 1 : 0, std::memory_order_relaxed);
  }

  // RemoteSink: a CPU worker finished one of this session's tasks.
  void complete(uint64_t cookie, chi_status_t status, const void *output, size_t size) override;

  // Stop: the segment says the server is gone and sleeping waiters wake.
  void announce_server_state(uint32_t state);

  // The client left: the poller takes no more of its tasks.
  void leave() { leaving_.store(true, std::memory_order_release); }
  // Cancels the CPU tasks taken that no worker has started (any thread, any
  // number of times): answered `answer` (stop), or with 0 dropped and counted
  // cancelled (the client left).  Returns how many.
  uint32_t cancel_queued(chi_status_t answer);

  bool dead() const { return dead_.load(std::memory_order_acquire); }
  void kill(const char *why);
  const std::string &reason() const { return reason_; }
  uint32_t in_flight() const { return counters_.in_flight.load(std::memory_order_acquire); }

  uint32_t id() const { return id_; }
  int sock() const { return sock_; }
  int doorbell() const { return doorbell_; }
  int segment_fd() const { return memfd_; }
  pid_t pid() const { return pid_; }
  uid_t uid() const { return uid_; }
  uint32_t kind() const { return kind_; }
  uint64_t submitted() const { return counters_.submitted.load(std::memory_order_relaxed); }
  uint64_t finished() const { return counters_.finished.load(std::memory_order_relaxed); }
  const ipc::SegmentLayout &layout() const { return seg_.layout; }
  uint8_t *segment_base() const { return seg_.base; }

  // Bookkeeping of the server (control thread).
  uint32_t poller = 0;
  uint64_t removed_epoch = 0;
  bool detached = false;
  bool registered = false;  // with a poller (task sessions)

 private:
  void finish(uint32_t slot, uint32_t gen, chi_status_t status, const void *output, size_t size);

  Service &svc_;
  const uint32_t id_;
  const int sock_;
  const pid_t pid_;
  const uid_t uid_;
  const uint32_t kind_;
  int memfd_ = -1;
  int doorbell_ = -1;
  int client_doorbell_ = -1;
  ipc::SegmentView seg_;
  uint32_t head_ = 0;  // next ring position to consume (poller only)
  // Per slot, server-private: 1 while the task is with the server, and when
  // it was taken (latency statistics).
  std::unique_ptr<std::atomic<uint8_t>[]> busy_;
  std::unique_ptr<int64_t[]> taken_ns_;  // when a timed task was taken; -1: not timed
  // Per slot, a CPU task's executor slot and generation for cancel_queued
  // (kTicket | eslot << 32 | egen; 0: none), and the client slot's generation.
  std::unique_ptr<std::atomic<uint64_t>[]> ticket_;
  std::unique_ptr<std::atomic<uint32_t>[]> cgen_;
  std::atomic<bool> leaving_{false};
  GpuTasks gpu_;  // poller only
  ClientCounters counters_;
  std::atomic<bool> dead_{false};
  std::string reason_;
};

}  // namespace chi

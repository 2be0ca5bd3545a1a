// The shared-memory transport of a client (shm://NAME): the session socket
// for control requests, the session's segment (ipc/segment.h) for tasks.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "client/client.h"
#include "client/slot_pool.h"
#include "ipc/segment.h"

namespace chi {

class ShmClient final : public Client {
 public:
  // control: an administrative session (no segment, control requests only).
  static chi_status_t connect(const Config &cfg, bool control, std::unique_ptr<Client> *out);
  ~ShmClient() override;

  chi_status_t submit(chi_route_t route, chi_method_t method, const void *input, size_t input_size,
                      chi_future_t *future) override;
  chi_status_t wait(uint32_t slot, uint32_t gen, int64_t timeout_ns, void *output,
                    size_t output_capacity, size_t *output_size) override;
  chi_status_t test(uint32_t slot, uint32_t gen, int *done) override;
  chi_status_t release(uint32_t slot, uint32_t gen) override;
  bool finished(uint32_t slot, uint32_t gen) const override;
  chi_status_t control(ipc::Op op, uint16_t flags, const void *payload, uint32_t length, void *reply,
                       uint32_t capacity, uint32_t *reply_length) override;

 private:
  ShmClient() = default;
  chi_status_t handshake(const std::string &address, uint32_t kind);
  // False (and the runtime marked disconnected) once the server is gone.
  bool server_alive();
  chi_status_t disconnected(const char *where) override;
  bool acquire_slot(uint32_t *slot) override;
  bool gone() const override { return gone_.load(std::memory_order_acquire); }
  void free_slot(uint32_t slot);
  void reap_orphans();
  chi_status_t check(uint32_t slot, uint32_t gen) const;

  int sock_ = -1;
  int memfd_ = -1;
  int doorbell_ = -1;
  ipc::SegmentView seg_;
  std::atomic<bool> gone_{false};
  std::mutex control_mu_;
  // Client-private slot states (the segment's words are the server's to
  // write): generation << 8 | state.
  std::unique_ptr<std::atomic<uint32_t>[]> mine_;
  SlotPool slots_free_;
  std::atomic<uint32_t> orphans_{0};
};

}  // namespace chi

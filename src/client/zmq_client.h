// The ZeroMQ transport of a client (ipc://PATH, tcp://HOST:PORT): one DEALER
// socket owned by one I/O thread per client runtime (zmq sockets are not
// thread-safe).  Caller threads fill a private slot and queue its index; the
// I/O thread sends it, matches replies by request id and wakes the waiter.
// While requests are out (and for spin_ns after its last work) the I/O
// thread polls without blocking, so neither a submit nor a reply has to wake
// it: a round trip then costs the wake-ups of raw libzmq REQ/REP, not two
// more (lab/journal/server.md, ZeroMQ).
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "client/slot_pool.h"
#include "ipc/frame.h"

namespace chi {

class ZmqClient final : public Client {
 public:
  static chi_status_t connect(const Config &cfg, bool control, std::unique_ptr<Client> *out);
  ~ZmqClient() override;

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
  struct Slot {
    std::atomic<uint32_t> word{0};  // generation << 8 | state | sleeper bit
    uint32_t method = 0;
    int32_t route = 0;
    int32_t status = 0;
    std::vector<uint8_t> data;  // the input until sent, then the output
    // The output's size, for a waiter that looks before its claim (data is
    // then not its to read: the slot may hold the next task's input).
    std::atomic<uint32_t> output_size{0};
  };
  // The one control request in flight (control() calls are serialized).
  struct Control {
    uint64_t id = 0;
    bool done = false;
    int32_t status = 0;
    std::string payload;
  };

  ZmqClient() = default;
  chi_status_t open(bool control);
  void io_main();
  // Both return how many submits / results they moved.
  uint32_t io_send_queued();
  uint32_t io_receive();
  bool io_frame(const ipc::Frame &f);
  void io_monitor();
  void mark_gone(const char *why);
  void wake_io();
  chi_status_t disconnected(const char *where) override;
  bool acquire_slot(uint32_t *slot) override;
  bool gone() const override { return gone_.load(std::memory_order_acquire); }
  void free_slot(uint32_t slot);
  chi_status_t check(uint32_t slot, uint32_t gen) const;

  void *ctx_ = nullptr;
  void *dealer_ = nullptr;
  void *monitor_ = nullptr;
  int wake_fd_ = -1;
  // The I/O thread polls without blocking: submits need not write wake_fd_.
  std::atomic<bool> io_awake_{false};
  // Submits queued since the I/O thread last took the queue.
  std::atomic<bool> out_ready_{false};
  int64_t io_busy_spin_ns_ = 0;  // polling while results are due: client_yield_ns
  int64_t io_idle_spin_ns_ = 0;  // ... and after its last work: spin_ns
  uint32_t io_outstanding_ = 0;  // submits sent, results not yet seen (I/O thread only)
  std::thread io_;
  std::atomic<bool> quit_{false};
  std::atomic<bool> gone_{false};
  std::string gone_why_;
  uint32_t max_payload_ = 0;
  // Set once after the handshake; the I/O thread may read it earlier (a
  // broken server's early result, a lost connection): published by nslots_.
  std::atomic<uint32_t> nslots_{0};
  std::unique_ptr<Slot[]> slots_;
  SlotPool slots_free_;
  // Caller threads -> I/O thread.
  std::mutex out_mu_;
  std::vector<uint32_t> out_slots_;
  std::string out_control_;             // an encoded control frame waiting to be sent
  // Frames the DEALER refused (high-water mark): sent first, in order.
  std::vector<std::string> backlog_;
  std::mutex control_mu_;  // one control request at a time
  std::mutex reply_mu_;
  std::condition_variable reply_cv_;
  Control ctl_;
  uint64_t next_control_id_ = 1;
  int connect_events_ = 0;  // handshake: failures seen by the monitor
  std::string connect_failure_;
  // ipc://: whether the first message's sender was checked to be this user
  // (I/O thread only).
  bool peer_checked_ = false;
};

}  // namespace chi

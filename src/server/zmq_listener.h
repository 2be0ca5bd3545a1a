// A server endpoint over ZeroMQ (ipc://PATH or tcp://HOST:PORT): one ROUTER
// socket owned by one I/O thread.  Every frame is decoded and checked
// (ipc/frame.h) before anything runs; CPU tasks go to the runtime's workers
// (their results come back through RemoteSink), GPU tasks to its GPU
// executors.  tcp:// off loopback requires CURVE with an allow-list of
// client keys, enforced by a ZAP handler.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "ipc/frame.h"
#include <unordered_map>
#include <vector>

#include "core/executor.h"

namespace chi {

class Runtime;

class ZmqListener final : public RemoteSink {
 public:
  struct Hooks {
    std::atomic<uint32_t> *clients;               // the server's client count (max_clients)
    std::function<std::string(bool json)> status; // chimaera-ctl status
    std::function<void()> stop_requested;         // chimaera-ctl stop
  };
  static chi_status_t open(Runtime &rt, const std::string &address, Hooks hooks,
                           std::unique_ptr<ZmqListener> *out);
  ~ZmqListener();
  // Starts the I/O (and ZAP) threads.  Separate from open() so that the
  // server is fully built before a request can reach its hooks.
  chi_status_t start();

  // New submissions answer CHI_ERR_SHUTDOWN from now on.
  void begin_stop() { stopping_.store(true, std::memory_order_release); }
  uint64_t in_flight() const { return in_flight_.load(std::memory_order_acquire); }
  // Tells every session the server is gone, closes the socket, joins the threads.
  void finish();
  const std::string &address() const { return address_; }
  // One "id pid uid submitted finished in-flight" row per session (status).
  struct Row {
    uint32_t id;
    uint64_t submitted, finished;
    uint32_t in_flight;
  };
  std::vector<Row> rows();

  void complete(uint64_t cookie, chi_status_t status, const void *output, size_t size) override;

 private:
  struct Session {
    uint32_t id = 0;
    int fd = -1;
    uint64_t ino = 0;  // the connection's socket inode: tells a reused descriptor apart
    bool tasks = false;
    uint64_t submitted = 0, finished = 0;
    uint32_t in_flight = 0;
  };
  struct Task;
  struct GpuTask;

  ZmqListener(Runtime &rt, std::string address, Hooks hooks);
  chi_status_t bind();
  void io_main();
  void zap_main();
  void receive();
  // One message part (one frame or a batch): handles its frames in order and
  // returns the bytes used; fewer than size when a submit found no free slot
  // (the rest is parked and retried).
  size_t handle(const std::string &identity, int fd, const uint8_t *data, size_t size);
  // One frame; false: a submit that found no free slot (not taken).
  // *end: the session ended with it (the rest of the part is ignored).
  bool handle_frame(const std::string &identity, int fd, const ipc::Frame &f, bool *end);
  // Sends the replies reply() gathered, one message part per client.
  void flush_replies();
  void send_batch(const std::string &identity, std::string *batch);
  void handle_hello(const std::string &identity, int fd, uint64_t id, const uint8_t *p, uint32_t n);
  void handle_control(Session &s, const std::string &identity, uint64_t id, uint32_t op, uint32_t flags,
                      const uint8_t *p, uint32_t n);
  // false: no server slot free (the frame is parked and retried).
  bool handle_submit(Session &s, const std::string &identity, uint64_t id, uint32_t method, int32_t route,
                     const uint8_t *p, uint32_t n);
  void reply(const std::string &identity, int kind, uint64_t id, int32_t status, const void *p, size_t n);
  void send_completions();
  void poll_gpu_tasks();
  void monitor_events();
  // Drops sessions whose connection is gone (descriptor closed, or reused by
  // another connection); `only_fd` >= 0 limits the sweep to one descriptor.
  void sweep_sessions(int only_fd);
  void evict(const std::string &identity, const char *why);

  Runtime &rt_;
  std::string address_;
  Hooks hooks_;
  bool curve_ = false;
  std::string secret_;
  std::set<std::string> allowed_;
  void *ctx_ = nullptr;
  void *router_ = nullptr;
  void *monitor_ = nullptr;
  void *zap_ = nullptr;
  int wake_fd_ = -1;
  int lock_fd_ = -1;  // ipc://: PATH.lock, held while serving
  std::thread io_, zap_thread_;
  std::atomic<bool> quit_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> in_flight_{0};
  std::mutex sessions_mu_;  // sessions_: I/O thread writes, rows() reads
  std::unordered_map<std::string, Session> sessions_;
  uint32_t next_session_ = 1;
  uint32_t max_in_flight_ = 1;
  int64_t next_sweep_ns_ = 0;
  std::mutex done_mu_;
  std::vector<unsigned char> inline_out_;  // output of a built-in run on the I/O thread
  std::vector<Task *> done_;  // finished CPU tasks, sent by the I/O thread
  std::vector<GpuTask> gpu_tasks_;
  std::deque<std::pair<std::string, std::string>> parked_;  // identity, frames not yet taken
  // Replies gathered by reply() until flush_replies(): identity, batch.
  std::vector<std::pair<std::string, std::string>> out_;
  std::unordered_map<std::string, size_t> out_index_;  // identity -> its entry in out_
};

}  // namespace chi

// ipc://PATH and tcp://HOST:PORT: one ROUTER socket owned by one I/O thread.
// Every frame is decoded and checked (ipc/frame.h) before anything runs, and
// every decision (admission, control requests, tasks, GPU results) is the
// Service's; CPU results come back through RemoteSink.  tcp:// off loopback
// requires CURVE with an allow-list of client keys (curve_auth.h).
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/executor.h"
#include "ipc/frame.h"
#include "server/curve_auth.h"
#include "server/listener.h"
#include "server/service.h"

namespace chi {

class ZmqListener final : public Listener, public RemoteSink {
 public:
  static chi_status_t open(Service &service, const std::string &address, std::unique_ptr<Listener> *out);
  ~ZmqListener() override;

  chi_status_t start() override;
  // The I/O thread answers the tasks no worker started (it owns them).
  void begin_stop() override { wake(); }
  void cancel_queued() override { wake(); }
  uint64_t in_flight() override { return in_flight_.load(std::memory_order_acquire); }
  // Tells every session the server is gone, closes the socket, joins the threads.
  void finish() override;
  const std::string &address() const override { return address_; }
  void rows(std::vector<ClientRow> *out) override;

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
  // A task with the server: who gets its result (cookie of the executors).
  struct Task {
    std::string identity;
    uint32_t session = 0;  // the session that submitted it (a peer's next hello makes another)
    uint64_t id = 0;
    int64_t taken_ns = 0;
    chi_status_t status = CHI_OK;
    std::string output;
    // On the CPU pool: its executor slot (for Service::cancel), and its
    // place in queued_ (I/O thread only).
    uint32_t eslot = 0, egen = 0;
    Task *prev = nullptr, *next = nullptr;
  };

  ZmqListener(Service &service, std::string address);
  chi_status_t bind();
  void io_main();
  void wake();
  void receive();
  // One message part (one frame or a batch): handles its frames in order and
  // returns the bytes used; fewer than size when a submit found no free slot
  // (the rest is parked and retried).
  size_t handle(const std::string &identity, int fd, const uint8_t *data, size_t size);
  // One frame; false: a submit that found no free slot (not taken).
  // *end: the session ended with it (the rest of the part is ignored).
  bool handle_frame(const std::string &identity, int fd, const ipc::Frame &f, bool *end);
  void handle_hello(const std::string &identity, int fd, uint64_t id, const uint8_t *p, uint32_t n);
  // false: no server slot free (the frame is parked and retried).
  bool handle_submit(Session &s, const std::string &identity, const ipc::Frame &f);
  void reply(const std::string &identity, ipc::Kind kind, uint64_t id, int32_t status, const void *p, size_t n);
  // Sends the replies reply() gathered, one message part per client.
  void flush_replies();
  void send_batch(const std::string &identity, std::string *batch);
  void send_completions();
  Task *new_task();
  void recycle(Task *t);
  void monitor_events();
  // Drops sessions whose connection is gone (descriptor closed, or reused by
  // another connection); `only_fd` >= 0 limits the sweep to one descriptor.
  void sweep_sessions(int only_fd);
  void evict(const std::string &identity, const char *why);
  // A frame under a session's routing id came on another connection.
  void drop_session_of_other_connection(const std::string &identity);
  // Connections without a session (see zmq_sessions.cpp): a new one, one
  // that said hello, one that closed, those too old; cut() shuts one down.
  struct Pending {
    int fd;
    uint64_t ino;
    int64_t since_ns;
  };
  void accepted(int fd);
  void enforce_connection_caps();
  static constexpr int64_t kPendingGraceNs = 250 * 1000000;
  void settled(int fd, uint64_t ino);
  void forget_pending(int fd);
  void expire_pending();
  void cut(const Pending &p, const char *why);
  // libzmq retries a failed accept at once, forever: out of descriptors, a
  // tcp:// listener unbinds for kAcceptPauseMs, then binds again.
  void accept_failed(int error);
  void resume_listening();
  // A task of session `session` (of peer `identity`) ended: its counters
  // move.  False when that session ended meanwhile: its result goes to no
  // one, and with its last task what it registered goes (evict()).
  bool answered(const std::string &identity, uint32_t session);
  void track(Task *t);
  void untrack(Task *t);
  // Cancels the CPU tasks no worker started: those of one session that left
  // (dropped, counted cancelled), or every one at stop (session 0: answered
  // CHI_ERR_SHUTDOWN).  Returns how many.
  uint32_t cancel_tasks(uint32_t session);

  Service &svc_;
  std::string address_;
  CurveAuth curve_;
  void *ctx_ = nullptr;
  void *router_ = nullptr;
  void *monitor_ = nullptr;
  int wake_fd_ = -1;
  int lock_fd_ = -1;  // ipc://: PATH.lock, held while serving
  std::string bound_;  // tcp://: the endpoint libzmq bound (ZMQ_LAST_ENDPOINT)
  int64_t resume_ns_ = 0;  // I/O thread: > 0 while unbound after running out of descriptors
  int64_t accept_quiet_ns_ = 0;  // I/O thread: failures before this are part of the last pause
  uint64_t accept_failures_ = 0, rebind_failures_ = 0;
  std::thread io_;
  std::atomic<bool> quit_{false};
  std::atomic<uint64_t> in_flight_{0};
  std::mutex sessions_mu_;  // sessions_ and ended_: I/O thread writes, rows() reads
  std::unordered_map<std::string, Session> sessions_;
  // Sessions evicted while tasks of theirs ran, by id, until the last ends.
  std::unordered_map<uint32_t, Session> ended_;
  int64_t next_sweep_ns_ = 0;
  int quick_sweeps_ = 0;  // sweeps left at 5 ms intervals after a disconnect event
  std::mutex done_mu_;
  std::vector<Task *> done_;       // finished CPU tasks, sent by the I/O thread
  std::vector<Task *> spare_;      // I/O thread: tasks to reuse (no allocation per task)
  Task queued_;                    // I/O thread: the CPU tasks taken, a ring through prev/next
  std::vector<unsigned char> out_buf_;  // I/O thread: output of a built-in run here, or of a GPU task
  GpuTasks gpu_;
  std::deque<std::pair<std::string, std::string>> parked_;  // identity, frames not yet taken
  // Replies gathered by reply() until flush_replies(): identity, batch.
  std::vector<std::pair<std::string, std::string>> out_;
  std::unordered_map<std::string, size_t> out_index_;  // identity -> its entry in out_
  std::vector<Pending> pending_;  // I/O thread: oldest first
  uint64_t cuts_ = 0;             // connections cut, counted and logged now and then
  uint64_t drops_ = 0;  // replies libzmq refused (peer gone or full), counted and logged
  static constexpr size_t kKeptReplyBytes = 16 * 1024;  // a reply buffer kept between turns
};

}  // namespace chi

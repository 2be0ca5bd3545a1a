// The server's rules, written once for every transport: who is admitted,
// what a control request answers, how a client's task is taken and where it
// goes, how finished GPU tasks are collected, and the per-client limits.
// A Listener (listener.h) moves bytes; everything it decides, it asks here.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "chimaera.h"
#include "core/executor.h"
#include "ipc/wire.h"
#include "server/client_mem.h"

namespace chi {

class Listener;
class Runtime;
class RouteStats;
struct ServerConfig;

// One client's task counts, as chimaera-ctl status shows them.
struct ClientCounters {
  std::atomic<uint64_t> submitted{0}, finished{0};
  std::atomic<uint32_t> in_flight{0};
};

// GPU tasks one transport thread queued; the same thread collects them
// (never blocking: a full GPU queue answers AGAIN, and this frees its slots).
class GpuTasks {
 public:
  // out(cookie): the buffer (capacity bytes) a finished task's output goes
  // to; done(cookie, status, output size) then delivers it.
  GpuTasks(size_t capacity, std::function<void *(uint64_t)> out,
           std::function<void(uint64_t, chi_status_t, size_t)> done)
      : capacity_(capacity), out_(std::move(out)), done_(std::move(done)) {}
  void add(uint64_t cookie, Executor *exec, uint32_t slot, uint32_t gen) {
    tasks_.push_back(Task{cookie, exec, slot, gen});
  }
  bool empty() const { return tasks_.empty(); }
  // Collects the finished ones; true when it collected any.
  bool reap();

 private:
  struct Task {
    uint64_t cookie;
    Executor *exec;
    uint32_t slot, gen;
  };
  size_t capacity_;
  std::function<void *(uint64_t)> out_;
  std::function<void(uint64_t, chi_status_t, size_t)> done_;
  std::vector<Task> tasks_;
};

class Service {
 public:
  explicit Service(Runtime &rt);

  Runtime &runtime() { return rt_; }
  const ServerConfig &config() const;

  // ---- admission
  // Checks a hello (payload as received) from a peer whose uid the transport
  // knows (peer_uid) or not (nullptr: tcp://).  CHI_OK: *hello holds it, and
  // a task session holds one of server.max_clients seats until left(); else
  // the status of the refusal and *why (logged here).
  chi_status_t admit(const std::string &where, const void *payload, size_t size, const uid_t *peer_uid,
                     ipc::Hello *hello, std::string *why);
  // The Welcome of a new session (the shm listener adds its segment's shape).
  ipc::Welcome welcome(uint32_t session_id) const;
  // The Welcome's payload: `w` and, with ipc::kWelcomeMpsDir in its flags
  // (set here when the GPUs are MPS clients), the daemon's pipe directory.
  std::string welcome_body(ipc::Welcome w) const;
  uint32_t next_session_id() { return next_id_.fetch_add(1, std::memory_order_relaxed); }
  // A task session admitted earlier ends (or could not be served after all).
  void left();
  uint32_t clients() const { return clients_.load(std::memory_order_relaxed); }
  // Connections a listener holds at once, of every kind (task and control
  // sessions, and those whose hello has not come yet): server.max_clients
  // plus room for chimaera-ctl and handshakes.  Beyond it a listener refuses
  // (shm) or cuts (ZeroMQ) new connections, so that no peer can take the
  // descriptors every transport shares.
  uint32_t max_connections() const;
  // Connections without a hello yet the shm listener holds at once; beyond
  // it, it accepts no more until one ends (the kernel's backlog holds them).
  // Also the room max_connections() leaves beside max_clients.
  static constexpr uint32_t kMaxPendingConnections = 64;
  // A peer without a hello after this long is closed (hello_timeout_ms
  // counts from the end of the ZeroMQ handshake, this from the accept).
  static constexpr int kHandshakeMs = 5000;

  // ---- control requests
  // Answers one request of session `session`: CHI_OK and the reply's bytes,
  // or a failure and its text.  `who` names the asking session in the log (stop).
  chi_status_t control(uint32_t session, ipc::Op op, uint32_t flags, const void *payload, size_t size,
                       std::string *reply, const std::string &who);
  // Any session ended (task or control): what it registered goes (client device memory).
  void session_ended(uint32_t session) { client_mem_.session_ended(session); }
  ClientMemory &client_memory() { return client_mem_; }

  // ---- tasks
  uint32_t max_in_flight() const { return max_in_flight_; }
  // A client with this many tasks in flight waits (its next task stays
  // queued); once stopping, its queued tasks are taken (and refused).
  bool over_limit(uint32_t in_flight) const { return in_flight >= max_in_flight_ && !stopping(); }
  uint32_t max_payload() const { return max_payload_; }
  struct Take {
    enum What { kRan, kQueued, kBusy, kFailed } what;
    chi_status_t status;  // kRan: the handler's; kFailed: why
    size_t output_size;   // kRan
    // kQueued on the CPU pool: the task, for cancel(); else cpu is false.
    bool cpu;
    uint32_t eslot, egen;
  };
  // Takes one task of a client: refuses it (stopping, too large, unknown
  // method, no executor for the route: kFailed), runs a bounded built-in
  // here into out (kRan), or queues it: CPU tasks report to sink(cookie),
  // GPU tasks join gpu (kQueued).  kBusy: every slot of the executor is in
  // use; the caller keeps the task and offers it again later.  shared_input:
  // the input lies in memory the client may rewrite (copied before a
  // handler runs on it).  Every take but kBusy counts as submitted.
  Take take(uint32_t method, int32_t route, const void *input, uint32_t size, bool shared_input, void *out,
            size_t out_capacity, RemoteSink *sink, uint64_t cookie, GpuTasks *gpu);
  // A task's result reached its client (taken_ns: when take() had it; < 0:
  // the task was not timed, see RouteStats::sample).
  void finished(chi_status_t status, int64_t taken_ns);
  // Cancels a CPU task (Take::eslot/egen) that no worker has started: true
  // when it will never run and the sink never hears of it; the caller then
  // answers it (stop) or counts it with cancelled() (its client left).
  bool cancel(uint32_t eslot, uint32_t egen);
  // A task of a client that left was dropped unstarted (chi_stats
  // tasks_cancelled; failed in the client route, so it leaves in_flight).
  void cancelled();

  // ---- stopping
  void begin_stop() { stopping_.store(true, std::memory_order_seq_cst); }
  bool stopping() const { return stopping_.load(std::memory_order_acquire); }
  void request_stop();
  chi_status_t wait_stop_request(int64_t timeout_ms);

  // The listeners, for status (set by the server before any starts).
  void set_listeners(std::vector<Listener *> l) { listeners_ = std::move(l); }
  const std::vector<Listener *> &listeners() const { return listeners_; }

 private:
  Runtime &rt_;
  RouteStats &stats_;
  uint32_t max_in_flight_;
  uint32_t max_payload_;
  std::atomic<uint32_t> clients_{0};
  std::atomic<uint32_t> next_id_{1};
  ClientMemory client_mem_;
  std::atomic<bool> stopping_{false};
  std::vector<Listener *> listeners_;
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_requested_ = false;
};

}  // namespace chi

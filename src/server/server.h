// A runtime served to client processes over shared memory: the listening
// socket, the handshake, the control requests, and the poller threads that
// move tasks from client rings to the executors (docs/server.md).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "chimaera.h"
#include "ipc/channel.h"

namespace chi {

class Runtime;
class Session;
class ZmqListener;

class Server {
 public:
  // Binds the endpoints and starts the control and poller threads.
  static chi_status_t start(Runtime &rt, const std::vector<std::string> &addresses, Server **out);
  ~Server();
  chi_status_t stop(uint32_t drain_timeout_ms);
  chi_status_t wait_stop_request(int64_t timeout_ms);

  // chi_stats / chimaera-ctl status.
  uint32_t clients() const { return clients_.load(std::memory_order_relaxed); }

 private:
  struct Poller;
  struct Listener {
    ipc::Endpoint ep;
    int lock_fd = -1;
    int fd = -1;
  };
  explicit Server(Runtime &rt);
  chi_status_t bind_endpoint(const std::string &address, Listener *l);
  void control_main();
  void poller_main(Poller *p);
  // A connection whose hello has not arrived yet: in the control thread's
  // epoll set until it does (or server.hello_timeout_ms passes), so that a
  // silent peer delays no one.
  struct PendingHello {
    int fd;
    int64_t deadline_ns;
  };
  void accept_client(int listen_fd);
  // The pending connection whose epoll tag is `tag`, taken out of the set; -1 if none.
  int take_pending(void *tag);
  void expire_pending();
  void handshake(int fd);
  void serve_request(Session *s);
  void detach(Session *s, const char *why);
  void reclaim();
  std::string status_text(bool json);

  Runtime &rt_;
  void close_listeners();
  std::vector<std::unique_ptr<Listener>> listeners_;
  std::vector<std::unique_ptr<ZmqListener>> zmq_;  // ipc:// and tcp:// endpoints
  int epoll_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: wakes the control thread
  std::thread control_;
  std::vector<std::unique_ptr<Poller>> pollers_;
  std::atomic<bool> stopping_{false};   // refuse new tasks, answer queued ones SHUTDOWN
  std::atomic<bool> quit_{false};       // threads exit
  std::atomic<uint32_t> clients_{0};
  uint32_t next_id_ = 1;
  uint32_t next_poller_ = 0;
  uint32_t max_in_flight_ = 0;
  std::vector<std::unique_ptr<PendingHello>> pending_;  // control thread only
  std::mutex sessions_mu_;              // sessions_ (control thread writes; status reads)
  std::vector<Session *> sessions_;     // live, connected sessions
  std::vector<Session *> detached_;     // gone, waiting for their tasks to finish
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_requested_ = false;
  bool stopped_ = false;
};

}  // namespace chi

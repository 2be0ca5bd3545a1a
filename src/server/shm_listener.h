// shm://NAME: the listening Unix socket, the handshake (the segment memfd
// and the doorbell eventfd go to the client with SCM_RIGHTS), the control
// requests on each session's socket, and the sessions' lives.  One control
// thread runs all of it; a PollerPool takes the tasks from the segments.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "ipc/channel.h"
#include "server/listener.h"
#include "server/shm_pollers.h"

namespace chi {

class Session;

class ShmListener final : public Listener {
 public:
  static chi_status_t open(Service &service, const std::string &address, std::unique_ptr<Listener> *out);
  ~ShmListener() override;

  chi_status_t start() override;
  void begin_stop() override;
  void cancel_queued() override;
  uint64_t in_flight() override;
  void finish() override;
  const std::string &address() const override { return shown_; }
  void rows(std::vector<ClientRow> *out) override;
  size_t pollers() const override { return pollers_ ? pollers_->size() : 0; }

 private:
  // A connection whose hello has not arrived yet: in the control thread's
  // epoll set until it does (or server.hello_timeout_ms passes), so that a
  // silent peer delays no one.
  struct PendingHello {
    int fd;
    int64_t deadline_ns;
    std::string buf;  // what has come of the hello so far
  };
  explicit ShmListener(Service &service) : svc_(service) {}
  chi_status_t bind(const std::string &address);
  void control_main();
  void accept_clients();
  // Takes the listening socket out of the epoll set for a while (out of
  // descriptors: accepting again at once would only fail again; or enough
  // connections wait for their hello), and back.
  void pause_accepting();
  void resume_accepting();
  // Reads what came on a pending connection (tag: its PendingHello);
  // false if `tag` is not one.  A whole hello goes on to handshake().
  bool pending_input(void *tag);
  void expire_pending();
  void handshake(int fd, const ipc::MsgHeader &h, const char *payload);
  void serve_request(Session *s);
  void detach(Session *s, const char *why);
  void reclaim();
  void stop_listening();
  void close_files();

  Service &svc_;
  ipc::Endpoint ep_;
  std::string shown_;  // shm://NAME
  int lock_fd_ = -1;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: wakes the control thread
  std::unique_ptr<PollerPool> pollers_;
  std::thread control_;
  std::atomic<bool> quit_{false};
  bool finished_ = false;
  std::vector<std::unique_ptr<PendingHello>> pending_;  // control thread only
  std::unordered_map<Session *, std::string> partial_;  // control thread: requests still arriving
  bool accept_paused_ = false;                          // control thread
  int64_t accept_resume_ns_ = 0;
  uint64_t accept_failures_ = 0, refusals_ = 0;  // logged at 1, 2, 4, 8...
  std::mutex sessions_mu_;           // sessions_, detached_ (control thread writes; status reads)
  std::vector<Session *> sessions_;  // live, connected sessions
  std::vector<Session *> detached_;  // gone, waiting for their tasks to finish
};

}  // namespace chi

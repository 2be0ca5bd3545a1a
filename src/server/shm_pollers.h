// The threads that take tasks from shm:// clients' rings: each serves its
// share of the sessions round-robin, spins briefly when idle (4+ CPUs), then
// sleeps on the sessions' doorbells (eventfds a client rings only while the
// poller's doorbell_armed flag says it sleeps).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "chimaera.h"

namespace chi {

class Service;
class Session;

class PollerPool {
 public:
  // control_wake_fd: signalled when a poller sees a session die.
  PollerPool(Service &service, int control_wake_fd);
  ~PollerPool();
  // Makes n pollers (0: one per CPU, 1..64) and starts their threads.
  chi_status_t start(unsigned n);
  // Gives the session to the poller with the fewest sessions (ties: the
  // next in turn), so that clients that come and go leave no poller with
  // many while another has none; its doorbell joins that poller's epoll
  // set.  Sets the thread's message on failure.
  chi_status_t add(Session *s);
  // Takes the session back; it may be freed once dropped() says so.
  void remove(Session *s);
  // The session's poller has moved past its removal: no poller holds it.
  bool dropped(const Session *s) const;
  void wake_all();
  void stop();  // ends and joins the threads
  size_t size() const { return pollers_.size(); }

 private:
  struct Poller;
  void main(Poller *p);

  Service &svc_;
  const int control_wake_;
  std::vector<std::unique_ptr<Poller>> pollers_;
  std::atomic<bool> quit_{false};
  uint32_t next_ = 0;  // control thread only
};

}  // namespace chi

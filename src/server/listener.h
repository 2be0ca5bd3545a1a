// One transport's endpoint, as the server sees it: shm:// (shm_listener.h)
// and ipc:// / tcp:// (zmq_listener.h).  A listener moves bytes between its
// clients and the Service, which decides everything; the server only
// starts, stops and waits for listeners.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "chimaera.h"

namespace chi {

class Service;

// One connected client, for chimaera-ctl status (pid and uid -1 when unknown).
struct ClientRow {
  uint32_t id;
  int pid;
  unsigned uid;
  uint64_t submitted, finished;
  uint32_t in_flight;
  int poller;  // the shm poller that serves it; -1: none (ZeroMQ)
  // Gone, with tasks still running: what it registered (device memory)
  // stays until they end.
  bool gone = false;
};

class Listener {
 public:
  virtual ~Listener() = default;
  // Starts serving (its threads).  Separate from opening, so that every
  // listener is bound before a request can reach any.
  virtual chi_status_t start() = 0;
  // Stop, step 1: no new clients; queued tasks answer CHI_ERR_SHUTDOWN
  // (Service::stopping() says so already); sleeping threads wake.
  virtual void begin_stop() = 0;
  // Stop, while draining: answers CHI_ERR_SHUTDOWN to the tasks taken that
  // no worker has started yet (begin_stop did so once; a task taken while
  // the stop began may come after it).
  virtual void cancel_queued() = 0;
  // Tasks taken and not yet answered.
  virtual uint64_t in_flight() = 0;
  // Stop, step 2: clients learn the server is gone, threads end, files go.
  virtual void finish() = 0;
  virtual const std::string &address() const = 0;
  // Connected clients, then those gone whose tasks still run (gone rows).
  virtual void rows(std::vector<ClientRow> *out) = 0;
  // Threads that poll clients (status: "pollers").
  virtual size_t pollers() const { return 0; }
};

// Binds address (shm://NAME or empty, ipc://PATH, tcp://HOST:PORT).
chi_status_t open_listener(Service &service, const std::string &address, std::unique_ptr<Listener> *out);

}  // namespace chi

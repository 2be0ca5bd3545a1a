#include "server/server.h"

#include <unistd.h>

#include "base/error.h"
#include "base/futex.h"
#include "base/log.h"
#include "core/runtime.h"
#include "ipc/address.h"
#include "server/shm_listener.h"
#include "server/zmq_listener.h"

namespace chi {

chi_status_t open_listener(Service &service, const std::string &address, std::unique_ptr<Listener> *out) {
  if (ipc::served_by_zmq(address)) return ZmqListener::open(service, address, out);
  return ShmListener::open(service, address, out);
}

chi_status_t Server::start(Runtime &rt, const std::vector<std::string> &addresses, Server **out) {
  std::unique_ptr<Server> srv(new Server(rt));
  for (const std::string &a : addresses) {
    std::unique_ptr<Listener> l;
    if (chi_status_t s = open_listener(srv->service_, a, &l); s != CHI_OK) return s;
    srv->listeners_.push_back(std::move(l));
  }
  std::vector<Listener *> all;
  for (auto &l : srv->listeners_) all.push_back(l.get());
  srv->service_.set_listeners(all);
  // Every listener is bound before any serves: a request that reaches one
  // (status lists them all) finds the server whole.
  for (auto &l : srv->listeners_)
    if (chi_status_t s = l->start(); s != CHI_OK) return s;
  *out = srv.release();
  return CHI_OK;
}

Server::~Server() { stop(0); }

chi_status_t Server::stop(uint32_t drain_timeout_ms) {
  if (stopped_) return CHI_OK;
  stopped_ = true;
  if (drain_timeout_ms == UINT32_MAX) drain_timeout_ms = service_.config().shutdown_timeout_ms;
  // 1. Refuse: new submits answer CHI_ERR_SHUTDOWN, and so does every task
  //    still queued.
  service_.begin_stop();
  for (auto &l : listeners_) l->begin_stop();
  // 2. Let the tasks that already run finish, within the bound.
  const int64_t deadline = now_ns() + int64_t(drain_timeout_ms) * 1000000;
  chi_status_t result = CHI_OK;
  for (unsigned turn = 1;; ++turn) {
    uint64_t busy = 0;
    for (auto &l : listeners_) busy += l->in_flight();
    if (busy == 0) break;
    // A task taken just as the stop began may have missed begin_stop's pass.
    if (turn % 16 == 0)
      for (auto &l : listeners_) l->cancel_queued();
    if (now_ns() >= deadline) {
      log(LogLevel::kWarn, "stop: %llu client task(s) still running after %u ms", (unsigned long long)busy,
          drain_timeout_ms);
      result = set_error(CHI_ERR_TIMEOUT, "%llu client task(s) still running after %u ms", (unsigned long long)busy,
                         drain_timeout_ms);
      break;
    }
    usleep(1000);
  }
  // 3. Gone: every client learns it, the listeners' threads end, files go.
  for (auto &l : listeners_) l->finish();
  return result;
}

}  // namespace chi

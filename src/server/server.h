// A runtime served to client processes: the Service with the rules, and one
// Listener per address (docs/server.md).  The server starts, stops and
// waits for its listeners; nothing else.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "chimaera.h"
#include "server/listener.h"
#include "server/service.h"

namespace chi {

class Runtime;

class Server {
 public:
  // Binds every address, then starts serving them.
  static chi_status_t start(Runtime &rt, const std::vector<std::string> &addresses, Server **out);
  ~Server();
  // Refuses new work, lets running tasks finish within drain_timeout_ms
  // (UINT32_MAX: server.shutdown_timeout_ms), then ends every session.
  chi_status_t stop(uint32_t drain_timeout_ms);
  chi_status_t wait_stop_request(int64_t timeout_ms) { return service_.wait_stop_request(timeout_ms); }
  uint32_t clients() const { return service_.clients(); }

 private:
  explicit Server(Runtime &rt) : service_(rt) {}

  Service service_;
  std::vector<std::unique_ptr<Listener>> listeners_;
  bool stopped_ = false;
};

}  // namespace chi

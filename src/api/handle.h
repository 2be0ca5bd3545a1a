// The handle behind chi_runtime_t: an embedded engine, or a client of a
// server (exactly one of the two is set).  Only the C boundary (src/api)
// sees it; nothing below knows the handle exists.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

namespace chi {
class Client;
class Runtime;
class Server;
}  // namespace chi

struct chi_runtime {
  uint64_t magic;
  chi::Runtime *engine;
  chi::Client *client;
  // Servers started on this runtime (chi_server_start), stopped by chi_finalize.
  std::mutex servers_mu;
  std::vector<chi::Server *> servers;
};

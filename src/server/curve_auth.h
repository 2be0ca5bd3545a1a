// CURVE on a server's tcp:// ROUTER: the keys from server.curve_key_file and
// server.curve_allowed_keys_file, the socket options, and the ZAP handler
// (RFC 27, inproc://zeromq.zap.01) that admits allow-listed client keys only.
// Every step is checked: a libzmq without CURVE, or an option it refuses,
// stops the server from starting, never from authenticating.
#pragma once

#include <atomic>
#include <set>
#include <string>
#include <thread>

#include "chimaera.h"

namespace chi {

struct ServerConfig;

class CurveAuth {
 public:
  ~CurveAuth() { stop(); }
  // From the config: CHI_OK with enabled() false (no keys: only a loopback
  // address may then listen), CHI_OK with the keys read, or a refusal
  // (CHI_ERR_CONFIG: half a configuration, keys beyond loopback missing,
  // libzmq without CURVE; CHI_ERR_PERMISSION: a key file open to others).
  chi_status_t configure(const ServerConfig &sc, const std::string &address, bool loopback);
  bool enabled() const { return enabled_; }
  // Binds the ZAP handler in ctx (before the CURVE socket takes a client).
  chi_status_t bind_zap(void *ctx);
  // Makes socket a CURVE server with the secret key.
  chi_status_t apply(void *socket);
  chi_status_t start();
  void stop();

 private:
  void zap_main();

  bool enabled_ = false;
  std::string address_;
  std::string secret_;
  std::set<std::string> allowed_;
  void *zap_ = nullptr;
  std::thread thread_;
  std::atomic<bool> quit_{false};
};

}  // namespace chi

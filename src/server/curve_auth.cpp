#include "server/curve_auth.h"

#include <errno.h>
#include <zmq.h>

#include <vector>

#include "base/error.h"
#include "base/log.h"
#include "config/config.h"
#include "ipc/curve.h"
#include "ipc/zmq_events.h"

namespace chi {

chi_status_t CurveAuth::configure(const ServerConfig &sc, const std::string &address, bool loopback) {
  address_ = address;
  if (sc.curve_key_file.empty() && sc.curve_allowed_keys_file.empty()) {
    if (loopback) return CHI_OK;
    return set_error(CHI_ERR_CONFIG,
                     "%s listens beyond this host: set server.curve_key_file and "
                     "server.curve_allowed_keys_file (chimaera-ctl keygen makes keys), or listen on 127.0.0.1",
                     address.c_str());
  }
  if (sc.curve_key_file.empty() || sc.curve_allowed_keys_file.empty())
    return set_error(CHI_ERR_CONFIG, "%s: CURVE needs both server.curve_key_file and server.curve_allowed_keys_file",
                     address.c_str());
  // Without CURVE, libzmq refuses the options and would admit peers with the
  // NULL mechanism: the keys would protect nothing.
  if (!ipc::zmq_has_curve())
    return set_error(CHI_ERR_CONFIG,
                     "%s: CURVE keys are configured but this libzmq (%s) has no CURVE support "
                     "(zmq_has(\"curve\") is 0): refusing to serve without it",
                     address.c_str(), ipc::zmq_version_text().c_str());
  if (chi_status_t s = ipc::read_secret_key(sc.curve_key_file, &secret_); s != CHI_OK) return s;
  if (chi_status_t s = ipc::read_allowed_keys(sc.curve_allowed_keys_file, &allowed_); s != CHI_OK) return s;
  enabled_ = true;
  return CHI_OK;
}

chi_status_t CurveAuth::bind_zap(void *ctx) {
  zap_ = zmq_socket(ctx, ZMQ_REP);
  if (!zap_) return set_error(CHI_ERR_INTERNAL, "cannot start the ZAP handler: %s", zmq_strerror(errno));
  const int timeout = 100;  // the handler looks at quit_ this often
  if (chi_status_t s = ipc::set_zmq_option(zap_, ZMQ_RCVTIMEO, &timeout, sizeof timeout, "ZMQ_RCVTIMEO"); s != CHI_OK)
    return s;
  if (zmq_bind(zap_, "inproc://zeromq.zap.01") != 0)
    return set_error(CHI_ERR_INTERNAL, "cannot start the ZAP handler: %s", zmq_strerror(errno));
  return CHI_OK;
}

chi_status_t CurveAuth::apply(void *socket) {
  const int one = 1;
  if (chi_status_t s = ipc::set_zmq_option(socket, ZMQ_CURVE_SERVER, &one, sizeof one, "ZMQ_CURVE_SERVER"); s != CHI_OK)
    return s;
  return ipc::set_zmq_option(socket, ZMQ_CURVE_SECRETKEY, secret_.c_str(), 40, "ZMQ_CURVE_SECRETKEY");
}

chi_status_t CurveAuth::start() {
  try {
    thread_ = std::thread(&CurveAuth::zap_main, this);
  } catch (const std::exception &e) {
    return set_error(CHI_ERR_NOMEM, "cannot start the ZAP handler thread: %s", e.what());
  }
  return CHI_OK;
}

void CurveAuth::stop() {
  quit_.store(true, std::memory_order_release);
  if (thread_.joinable()) thread_.join();
  if (zap_) zmq_close(zap_);
  zap_ = nullptr;
}

// Every CURVE handshake asks here; only allow-listed keys pass.
void CurveAuth::zap_main() {
  while (!quit_.load(std::memory_order_acquire)) {
    std::vector<std::string> parts;
    int more = 1;
    while (more) {
      zmq_msg_t m;
      zmq_msg_init(&m);
      if (zmq_msg_recv(&m, zap_, 0) < 0) {
        zmq_msg_close(&m);
        if (parts.empty()) break;
        continue;
      }
      parts.emplace_back(static_cast<char *>(zmq_msg_data(&m)), zmq_msg_size(&m));
      more = zmq_msg_more(&m);
      zmq_msg_close(&m);
    }
    if (parts.size() < 6) continue;
    // version, request id, domain, address, identity, mechanism, credentials...
    const bool ok = parts[0] == "1.0" && parts[5] == "CURVE" && parts.size() >= 7 && parts[6].size() == 32 &&
                    allowed_.count(parts[6]);
    if (!ok) {
      char z85[41] = "?";
      if (parts.size() >= 7 && parts[6].size() == 32)
        zmq_z85_encode(z85, reinterpret_cast<const uint8_t *>(parts[6].data()), 32);
      log(LogLevel::kWarn, "%s: refused a client from %s with key %s (not in the allow-list)", address_.c_str(),
          parts[3].c_str(), z85);
    }
    const std::string answer[6] = {"1.0", parts[1], ok ? "200" : "400", ok ? "OK" : "key not allowed", "", ""};
    for (int i = 0; i < 6; ++i) {
      if (zmq_send(zap_, answer[i].data(), answer[i].size(), i < 5 ? ZMQ_SNDMORE : 0) < 0) {
        // The peer's handshake then fails (no answer): logged, nothing admitted.
        log(LogLevel::kError, "%s: ZAP reply: %s", address_.c_str(), zmq_strerror(errno));
        break;
      }
    }
  }
}

}  // namespace chi

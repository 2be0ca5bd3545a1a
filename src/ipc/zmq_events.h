// Small libzmq helpers both ends of the ZeroMQ transport use: checked socket
// options, CURVE support, and reading a socket monitor (zmq_socket_monitor).
#pragma once

#include <errno.h>
#include <zmq.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "base/error.h"
#include "chimaera.h"

namespace chi::ipc {

// zmq_setsockopt, checked: a refused option is a failure with its name.
inline chi_status_t set_zmq_option(void *socket, int option, const void *value, size_t size, const char *name) {
  if (zmq_setsockopt(socket, option, value, size) == 0) return CHI_OK;
  return set_error(errno == ENOMEM ? CHI_ERR_NOMEM : CHI_ERR_CONFIG, "libzmq refused %s: %s", name,
                   zmq_strerror(errno));
}

// Whether this libzmq has CURVE.  CHI_TEST_NO_CURVE=1 answers no, so that the
// refusal is testable with a libzmq that has it.
inline bool zmq_has_curve() {
  const char *no = std::getenv("CHI_TEST_NO_CURVE");
  if (no && std::strcmp(no, "1") == 0) return false;
  return zmq_has("curve") != 0;
}

inline std::string zmq_version_text() {
  int major = 0, minor = 0, patch = 0;
  zmq_version(&major, &minor, &patch);
  return "libzmq " + std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

// Takes the next event without blocking: false when none is queued.  An
// event is two parts: {uint16 event, uint32 value} and the endpoint address.
inline bool next_monitor_event(void *monitor, uint16_t *event, uint32_t *value) {
  zmq_msg_t ev, addr;
  zmq_msg_init(&ev);
  if (zmq_msg_recv(&ev, monitor, ZMQ_DONTWAIT) < 0) {
    zmq_msg_close(&ev);
    return false;
  }
  *event = 0;
  *value = 0;
  if (zmq_msg_size(&ev) >= 6) {
    std::memcpy(event, zmq_msg_data(&ev), 2);
    std::memcpy(value, static_cast<char *>(zmq_msg_data(&ev)) + 2, 4);
  }
  zmq_msg_close(&ev);
  zmq_msg_init(&addr);
  zmq_msg_recv(&addr, monitor, 0);
  zmq_msg_close(&addr);
  return true;
}

}  // namespace chi::ipc

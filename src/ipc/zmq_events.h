// Reading a ZeroMQ socket monitor (zmq_socket_monitor): both ends of the
// ZeroMQ transport watch their socket's connection events this way.
#pragma once

#include <zmq.h>

#include <cstdint>
#include <cstring>

namespace chi::ipc {

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

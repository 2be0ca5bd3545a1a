// Wake-ups through an eventfd, as the server's threads use them.
#pragma once

namespace chi {

// Signals an eventfd (base/eventfd.h) and logs a failure.
void signal_fd(int fd);
// Empties a session's doorbell (a datagram socket a client writes to) without
// ever waiting, whatever the client did to its own end.
void drain_doorbell(int fd);

}  // namespace chi

// Wake-ups through an eventfd, as the server's threads use them.
#pragma once

namespace chi {

// Writes 1 to an eventfd; a full counter is a wake-up pending too, any other
// failure is logged.
void signal_fd(int fd);
// Reads an eventfd's counter to zero.
void drain_fd(int fd);
// Empties a session's doorbell (a datagram socket a client writes to) without
// ever waiting, whatever the client did to its own end.
void drain_doorbell(int fd);

}  // namespace chi

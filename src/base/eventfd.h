// Wake-ups through an eventfd: the one place that creates, signals and
// drains one, for every thread that sleeps in poll/epoll/zmq_poll on it.
#pragma once

#include "chimaera.h"

namespace chi {

// Makes a non-blocking, close-on-exec eventfd in *fd; CHI_ERR_INTERNAL (with
// the detail recorded) when the kernel refuses.
chi_status_t eventfd_open(int *fd);
// Adds 1 to the counter.  A full counter (EAGAIN) is a wake-up pending too;
// false, with errno set, only on another failure, which the caller reports.
bool eventfd_signal(int fd);
// Reads the counter to zero; the fd is non-blocking, so this never waits.
void eventfd_drain(int fd);

}  // namespace chi

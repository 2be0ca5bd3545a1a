#include "base/eventfd.h"

#include <errno.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

#include "base/error.h"

namespace chi {

chi_status_t eventfd_open(int *fd) {
  *fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (*fd < 0) return set_error(CHI_ERR_INTERNAL, "eventfd: %s", strerror(errno));
  return CHI_OK;
}

bool eventfd_signal(int fd) {
  uint64_t one = 1;
  return write(fd, &one, sizeof one) >= 0 || errno == EAGAIN;
}

void eventfd_drain(int fd) {
  uint64_t v;
  while (read(fd, &v, sizeof v) > 0) {
  }
}

}  // namespace chi

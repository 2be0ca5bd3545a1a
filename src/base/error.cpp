#include "base/error.h"

#include <cstdarg>
#include <cstdio>

namespace chi {

namespace {
thread_local char tls_message[1024];
}

chi_status_t set_error(chi_status_t status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tls_message, sizeof tls_message, fmt, ap);
  va_end(ap);
  return status;
}

void clear_error() { tls_message[0] = '\0'; }

const char *last_error() { return tls_message; }

}  // namespace chi

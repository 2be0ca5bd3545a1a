// Thread-local error detail behind chi_last_error_message: a base service
// below core/ and ipc/, which record their failures here; src/api reads it.
#pragma once

#include "chimaera.h"

namespace chi {

// Records a printf-style message for this thread and returns status, so that
// failure paths read `return set_error(CHI_ERR_INVALID, "...", ...);`.
chi_status_t set_error(chi_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void clear_error();
const char *last_error();

}  // namespace chi

// Minimal leveled logging to stderr, filtered by the configured log_level.
#pragma once

#include "config/config.h"

namespace chi {

void set_log_level(LogLevel level);
void log(LogLevel level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace chi

// Minimal leveled logging to stderr, filtered by the configured log_level.
// A base service: everything above (core, ipc, server, client, gpu) logs here.
#pragma once

namespace chi {

enum class LogLevel : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

void set_log_level(LogLevel level);
void log(LogLevel level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace chi

#include "base/log.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>

namespace chi {

namespace {
std::atomic<int> g_level{int(LogLevel::kWarn)};
const char *const kNames[] = {"error", "warn", "info", "debug"};
}  // namespace

void set_log_level(LogLevel level) { g_level.store(int(level), std::memory_order_relaxed); }

void log(LogLevel level, const char *fmt, ...) {
  if (int(level) > g_level.load(std::memory_order_relaxed)) return;
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  // One fprintf per line keeps lines from different threads whole.
  fprintf(stderr, "chimaera[%s]: %s\n", kNames[int(level)], line);
}

}  // namespace chi

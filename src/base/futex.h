// Futex wait/wake on a 32-bit atomic, and the clock the engine measures with.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace chi {

inline int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Sleeps while *word == expected, at most timeout_ns (< 0: no bound), with
// futex operation op.  Its result is not needed: it returns early (spurious
// wake-ups, EINTR, EAGAIN when the word changed, ETIMEDOUT) and callers
// re-check their condition.
inline void futex_wait_op(std::atomic<uint32_t> *word, uint32_t expected, int64_t timeout_ns, int op) {
  timespec ts, *tsp = nullptr;
  if (timeout_ns >= 0) {
    ts.tv_sec = timeout_ns / 1000000000;
    ts.tv_nsec = timeout_ns % 1000000000;
    tsp = &ts;
  }
  syscall(SYS_futex, reinterpret_cast<uint32_t *>(word), op, expected, tsp, nullptr, 0);
}

inline void futex_wait(std::atomic<uint32_t> *word, uint32_t expected, int64_t timeout_ns) {
  futex_wait_op(word, expected, timeout_ns, FUTEX_WAIT_PRIVATE);
}

inline void futex_wake(std::atomic<uint32_t> *word, int count = INT_MAX) {
  syscall(SYS_futex, reinterpret_cast<uint32_t *>(word), FUTEX_WAKE_PRIVATE, count, nullptr,
          nullptr, 0);
}

// The same on a word in memory shared between processes (MAP_SHARED): the
// kernel keys these by the page, not by the address space.
inline void futex_wait_shared(std::atomic<uint32_t> *word, uint32_t expected, int64_t timeout_ns) {
  futex_wait_op(word, expected, timeout_ns, FUTEX_WAIT);
}

inline void futex_wake_shared(std::atomic<uint32_t> *word, int count = INT_MAX) {
  syscall(SYS_futex, reinterpret_cast<uint32_t *>(word), FUTEX_WAKE, count, nullptr, nullptr, 0);
}

}  // namespace chi

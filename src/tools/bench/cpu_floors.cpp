#include "cpu_floors.h"

#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>
#include <thread>
#include <vector>

#include "tool_util.h"

namespace chi_bench {
namespace {

// Spin until *flag == want.  After ~20 us without progress the spinner also
// yields: on a machine with fewer free CPUs than spinners, pure spinning would
// cost a scheduler tick per round trip; with enough CPUs it never triggers.
void spin_until(const std::atomic<uint64_t> &flag, uint64_t want) {
  uint64_t start = 0;
  for (unsigned n = 0; flag.load(std::memory_order_acquire) != want; n++) {
    chi_tool_cpu_relax();
    if ((n & 255) == 255) {
      uint64_t now = chi_tool_now_ns();
      if (start == 0) start = now;
      else if (now - start > 20000) sched_yield();
    }
  }
}

struct alignas(64) Line {
  std::atomic<uint64_t> flag{0};
  char pad[64 - sizeof(std::atomic<uint64_t>)];
};

bool write_all(int fd, const void *buf, size_t n) {
  const char *p = static_cast<const char *>(buf);
  while (n > 0) {
    ssize_t k = write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= size_t(k);
  }
  return true;
}

bool read_all(int fd, void *buf, size_t n) {
  char *p = static_cast<char *>(buf);
  while (n > 0) {
    ssize_t k = read(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= size_t(k);
  }
  return true;
}

}  // namespace

void cpu_pingpong_floor(const chi_bench_options &opt, chi_bench_row *row) {
  chi_bench_row_init(row, kCpuFloor, CHI_BENCH_FLOOR);
  row->payload_bytes = 0;
  const uint64_t total = opt.warmup + opt.iters;
  std::vector<uint64_t> samples(opt.iters);
  Line line;

  std::thread responder([&] {
    if (opt.pin) chi_tool_pin_thread(1);
    for (uint64_t i = 0; i < total; i++) {
      spin_until(line.flag, 2 * i + 1);
      line.flag.store(2 * i + 2, std::memory_order_release);
    }
  });
  if (opt.pin) chi_tool_pin_thread(0);
  for (uint64_t i = 0; i < total; i++) {
    uint64_t t0 = chi_tool_now_ns();
    line.flag.store(2 * i + 1, std::memory_order_release);
    spin_until(line.flag, 2 * i + 2);
    uint64_t t1 = chi_tool_now_ns();
    if (i >= opt.warmup) samples[i - opt.warmup] = t1 - t0;
  }
  responder.join();
  chi_bench_row_samples(row, samples.data(), samples.size());
}

void xproc_pingpong_floor(const chi_bench_options &opt, chi_bench_row *row) {
  chi_bench_row_init(row, kXprocFloor, CHI_BENCH_FLOOR);
  row->payload_bytes = 0;
  static_assert(std::atomic<uint64_t>::is_always_lock_free, "a lock-free word crosses processes");
  // Two lines: the flag, and the responder's "alive" word (0 until it runs).
  void *mem = mmap(nullptr, 2 * sizeof(Line), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                   -1, 0);
  if (mem == MAP_FAILED) {
    chi_bench_row_fail(row, CHI_ERR_INTERNAL, "mmap: %s", std::strerror(errno));
    return;
  }
  Line *line = new (mem) Line[2];
  const uint64_t total = opt.warmup + opt.iters;
  std::vector<uint64_t> samples(opt.iters);
  std::fflush(nullptr);
  pid_t child = fork();
  if (child < 0) {
    chi_bench_row_fail(row, CHI_ERR_INTERNAL, "fork: %s", std::strerror(errno));
    munmap(mem, 2 * sizeof(Line));
    return;
  }
  if (child == 0) {
    if (opt.pin) chi_tool_pin_thread(1);
    line[1].flag.store(1, std::memory_order_release);
    for (uint64_t i = 0; i < total; i++) {
      spin_until(line[0].flag, 2 * i + 1);
      line[0].flag.store(2 * i + 2, std::memory_order_release);
    }
    _exit(0);
  }
  if (opt.pin) chi_tool_pin_thread(0);
  // A responder that died (it should not) must not hang the benchmark.
  uint64_t deadline = chi_tool_now_ns() + 10'000'000'000ull;
  uint64_t done = 0;
  bool lost = false;
  while (line[1].flag.load(std::memory_order_acquire) == 0 && !lost) {
    sched_yield();
    lost = chi_tool_now_ns() > deadline;
  }
  for (uint64_t i = 0; i < total && !lost; i++) {
    uint64_t t0 = chi_tool_now_ns();
    line[0].flag.store(2 * i + 1, std::memory_order_release);
    // spin_until, plus a look at the responder every ~10 ms of waiting.
    uint64_t start = 0, checked = 0;
    for (unsigned n = 0; line[0].flag.load(std::memory_order_acquire) != 2 * i + 2; n++) {
      chi_tool_cpu_relax();
      if ((n & 255) != 255) continue;
      uint64_t now = chi_tool_now_ns();
      if (start == 0) {
        start = checked = now;
        continue;
      }
      if (now - start > 20000) sched_yield();
      if (now - checked > 10'000'000) {
        checked = now;
        if (waitpid(child, nullptr, WNOHANG) == child) {
          child = -1;
          lost = true;
          break;
        }
      }
    }
    uint64_t t1 = chi_tool_now_ns();
    if (!lost && i >= opt.warmup) samples[done++] = t1 - t0;
  }
  if (child > 0) {
    if (lost) kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
  }
  munmap(mem, 2 * sizeof(Line));
  if (lost || done != opt.iters) {
    chi_bench_row_fail(row, CHI_ERR_INTERNAL, "responder process lost after %llu round trips",
                       static_cast<unsigned long long>(done));
    return;
  }
  chi_bench_row_samples(row, samples.data(), samples.size());
}

void pipe_pingpong_peer(const chi_bench_options &opt, chi_bench_row *row) {
  chi_bench_row_init(row, "peer.pipe", CHI_BENCH_PEER);
  row->payload_bytes = opt.payload;
  std::snprintf(row->floor, sizeof row->floor, "%s", kCpuFloor);
  int ping[2], pong[2];
  if (pipe(ping) != 0) {
    chi_bench_row_fail(row, CHI_ERR_INTERNAL, "pipe: %s", std::strerror(errno));
    return;
  }
  if (pipe(pong) != 0) {
    chi_bench_row_fail(row, CHI_ERR_INTERNAL, "pipe: %s", std::strerror(errno));
    close(ping[0]);
    close(ping[1]);
    return;
  }
  const uint64_t total = opt.warmup + opt.iters;
  const size_t n = opt.payload ? opt.payload : 1;
  std::vector<uint64_t> samples(opt.iters);
  std::atomic<bool> broken{false};

  std::thread responder([&] {
    if (opt.pin) chi_tool_pin_thread(1);
    std::vector<char> buf(n);
    for (uint64_t i = 0; i < total; i++) {
      if (!read_all(ping[0], buf.data(), n) || !write_all(pong[1], buf.data(), n)) {
        broken = true;
        break;
      }
    }
    // The initiator then reads EOF instead of blocking forever.
    close(pong[1]);
  });
  if (opt.pin) chi_tool_pin_thread(0);
  std::vector<char> out(n, 'x'), in(n);
  uint64_t done = 0;
  for (uint64_t i = 0; i < total; i++) {
    uint64_t t0 = chi_tool_now_ns();
    if (!write_all(ping[1], out.data(), n) || !read_all(pong[0], in.data(), n)) break;
    uint64_t t1 = chi_tool_now_ns();
    if (i >= opt.warmup) samples[done++] = t1 - t0;
  }
  // Closing the write ends lets a responder blocked in read() see EOF.
  close(ping[1]);
  responder.join();
  close(ping[0]);
  close(pong[0]);
  if (broken || done != opt.iters) {
    chi_bench_row_fail(row, CHI_ERR_INTERNAL, "pipe ping-pong stopped after %llu round trips",
                       static_cast<unsigned long long>(done));
    return;
  }
  chi_bench_row_samples(row, samples.data(), samples.size());
}

}  // namespace chi_bench

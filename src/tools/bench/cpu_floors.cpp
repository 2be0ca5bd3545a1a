#include "cpu_floors.h"

#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
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

/*
 * chimaera-wake-probe: what one wake-up costs on this host, the floors under
 * an idle runtime's CPU use and its first task after a quiet spell (issue
 * 22; lab/journal/idle-wakeup.md, "Idle cost and wake-up").  No chimaera code runs:
 * only the mechanisms the runtime can use.
 *
 *   chimaera-wake-probe [--seconds S] [--period-us P]
 *
 * Each part runs for S seconds (default 2) with one wake-up per P us
 * (default 1000, the default lease), and reports the CPU time per wake-up
 * (the process's, every thread: the CUDA runtime's own threads count) and
 * the wake-up's latency (p50 / p90 / max):
 *
 * 1. timed:   a thread sleeps P us with clock_nanosleep (1 us timer slack);
 *             latency = how late it wakes.
 * 2. futex:   a thread sleeps on a futex, another wakes it every P us;
 *             latency = waker's clock before futex_wake to the sleeper's after.
 * 3. event:   a one-thread kernel runs P us and ends; a host thread waits in
 *             cudaEventSynchronize on a cudaEventBlockingSync event (it
 *             sleeps until the GPU's interrupt); latency = the kernel's
 *             %globaltimer at its end to the host's CLOCK_REALTIME after the
 *             wait (the two clocks agree to a few us; the offset is printed).
 *             The kernels are launched back to back, so the CPU per wake-up
 *             includes one launch and one event record.
 * 4. launch:  CPU time of one cudaLaunchKernel + cudaEventRecord (no wait).
 *
 * Exit 77 without a GPU.
 */
#include <getopt.h>
#include <linux/futex.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

namespace {

int64_t mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

int64_t real_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Sleeps until CLOCK_MONOTONIC reads `due` (ns).
void sleep_until(int64_t due) {
  timespec ts{time_t(due / 1000000000), long(due % 1000000000)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) != 0) {
  }
}

double process_cpu_ns() {
  rusage r;
  getrusage(RUSAGE_SELF, &r);
  return (r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1e9 + (r.ru_utime.tv_usec + r.ru_stime.tv_usec) * 1e3;
}

void report(const char *what, std::vector<int64_t> lat, double cpu_ns, size_t wakes, double secs) {
  if (lat.empty() || wakes == 0) {
    printf("%-8s no samples\n", what);
    return;
  }
  std::sort(lat.begin(), lat.end());
  auto at = [&](double q) { return lat[std::min(lat.size() - 1, size_t(q * lat.size()))] / 1000.0; };
  printf("%-8s %7zu wake-ups  CPU %6.2f us each (%5.2f%% of a core)  latency p50 %7.1f  p90 %7.1f  max %8.1f us\n",
         what, wakes, cpu_ns / wakes / 1000.0, 100.0 * cpu_ns / (secs * 1e9), at(0.5), at(0.9),
         lat.back() / 1000.0);
}

__global__ void k_spin(uint64_t ns, unsigned long long *end) {
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
  *reinterpret_cast<volatile unsigned long long *>(end) = t;
  __threadfence_system();
}

__global__ void k_empty() {}

bool ck(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return true;
  fprintf(stderr, "chimaera-wake-probe: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

}  // namespace

int main(int argc, char **argv) {
  double seconds = 2.0;
  int64_t period_us = 1000;
  static const option opts[] = {{"seconds", required_argument, nullptr, 's'},
                                {"period-us", required_argument, nullptr, 'p'},
                                {"help", no_argument, nullptr, 'h'},
                                {nullptr, 0, nullptr, 0}};
  for (int c; (c = getopt_long(argc, argv, "s:p:h", opts, nullptr)) != -1;) {
    if (c == 's') seconds = atof(optarg);
    else if (c == 'p') period_us = atoll(optarg);
    else {
      printf("usage: chimaera-wake-probe [--seconds S] [--period-us P]\n");
      return c == 'h' ? 0 : 2;
    }
  }
  if (seconds <= 0 || seconds > 60 || period_us < 10 || period_us > 1000000) {
    fprintf(stderr, "chimaera-wake-probe: --seconds in (0, 60], --period-us in [10, 1000000]\n");
    return 2;
  }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    printf("chimaera-wake-probe: no CUDA device\n");
    return 77;
  }
  setvbuf(stdout, nullptr, _IOLBF, 0);
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  const int64_t period = period_us * 1000;
  const size_t wakes = size_t(seconds * 1e9 / period);
  printf("chimaera-wake-probe: %ld CPUs, %zu wake-ups of each kind, one per %lld us\n",
         sysconf(_SC_NPROCESSORS_ONLN), wakes, (long long)period_us);

  // CUDA first, so its threads exist in every part's CPU figure alike.
  cudaStream_t st;
  cudaEvent_t ev;
  unsigned long long *end = nullptr;
  if (!ck(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream") ||
      !ck(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventBlockingSync), "event") ||
      !ck(cudaHostAlloc(reinterpret_cast<void **>(&end), 64, cudaHostAllocMapped), "pinned memory"))
    return 1;
  k_spin<<<1, 1, 0, st>>>(1000, end);
  if (!ck(cudaStreamSynchronize(st), "warm-up")) return 1;

  // 1. Timed sleeps.
  {
    std::vector<int64_t> lat;
    lat.reserve(wakes);
    const double c0 = process_cpu_ns();
    const int64_t t0 = mono_ns();
    for (size_t i = 0; i < wakes; ++i) {
      const int64_t due = t0 + int64_t(i + 1) * period;
      sleep_until(due);
      lat.push_back(mono_ns() - due);
    }
    report("timed", lat, process_cpu_ns() - c0, wakes, (mono_ns() - t0) * 1e-9);
  }

  // 2. Futex wake of a sleeping thread by another.
  {
    std::atomic<uint32_t> word{0};
    std::atomic<int64_t> sent{0};
    std::vector<int64_t> lat;
    lat.reserve(wakes);
    std::thread sleeper([&] {
      prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
      // Two wake-ups that land before the sleeper runs count as one sample.
      uint32_t seen = 0;
      while (seen < wakes) {
        while (word.load(std::memory_order_acquire) == seen)
          syscall(SYS_futex, reinterpret_cast<uint32_t *>(&word), FUTEX_WAIT_PRIVATE, seen, nullptr, nullptr, 0);
        lat.push_back(mono_ns() - sent.load(std::memory_order_acquire));
        seen = word.load(std::memory_order_acquire);
      }
    });
    const double c0 = process_cpu_ns();
    const int64_t t0 = mono_ns();
    for (size_t i = 0; i < wakes; ++i) {
      const int64_t due = t0 + int64_t(i + 1) * period;
      sleep_until(due);
      sent.store(mono_ns(), std::memory_order_release);
      word.fetch_add(1, std::memory_order_release);
      syscall(SYS_futex, reinterpret_cast<uint32_t *>(&word), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
    }
    sleeper.join();
    // Both threads' CPU: the waker's timed sleeps are part 1's figure again.
    report("futex", lat, process_cpu_ns() - c0, wakes, (mono_ns() - t0) * 1e-9);
  }

  // 3. Kernel end -> host thread blocked on a blocking-sync event.
  {
    std::vector<int64_t> lat;
    lat.reserve(wakes);
    const double c0 = process_cpu_ns();
    const int64_t t0 = mono_ns();
    int64_t off_min = INT64_MAX;
    for (size_t i = 0; i < wakes; ++i) {
      *reinterpret_cast<volatile unsigned long long *>(end) = 0;
      k_spin<<<1, 1, 0, st>>>(uint64_t(period), end);
      if (!ck(cudaEventRecord(ev, st), "event record") || !ck(cudaEventSynchronize(ev), "event wait")) return 1;
      const int64_t host = real_ns();
      const int64_t dev = int64_t(*reinterpret_cast<volatile unsigned long long *>(end));
      lat.push_back(host - dev);
      off_min = std::min(off_min, host - dev);
    }
    report("event", lat, process_cpu_ns() - c0, wakes, (mono_ns() - t0) * 1e-9);
    printf("         (host clock minus %%globaltimer, smallest: %.1f us; the latency includes the clocks' offset)\n",
           off_min / 1000.0);
  }

  // 4. What a launch and an event record cost the CPU.
  {
    const size_t n_launch = 2000;
    const double c0 = process_cpu_ns();
    for (size_t i = 0; i < n_launch; ++i) {
      k_empty<<<1, 32, 0, st>>>();
      (void)cudaEventRecord(ev, st);
      if (i % 64 == 63 && !ck(cudaStreamSynchronize(st), "launches")) return 1;
    }
    if (!ck(cudaStreamSynchronize(st), "launches")) return 1;
    printf("launch   CPU %.2f us per cudaLaunchKernel + cudaEventRecord (%zu, a sync per 64)\n",
           (process_cpu_ns() - c0) / n_launch / 1000.0, n_launch);
  }
  cudaFreeHost(end);
  return 0;
}

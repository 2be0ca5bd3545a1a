#include "gpu/gpu_device.h"

#include <pthread.h>
#include <sys/prctl.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "chimaera/device_diag.h"
#include "base/error.h"
#include "base/futex.h"
#include "base/log.h"
#include "core/registry.h"
#include "core/runtime.h"
#include "gpu/d2h_memory.h"
#include "gpu/kernels.h"

namespace chi::gpu {

namespace {

// How long pause waits for the orchestrator to exit before declaring it hung.
constexpr int64_t kStopTimeoutNs = 60ll * 1000000000;
// How long chi_finalize waits for queued CPU->GPU tasks.
constexpr int64_t kDrainTimeoutNs = 10ll * 1000000000;
// The lease thread queues the successor this long before a lease ends (a
// sleep overshoots by some microseconds even with 1 us slack, more on a busy
// or virtualized host); a device-wide call made in this window also waits for
// the successor's lease.
constexpr int64_t kLeaseWakeEarlyNs = 100000;
// The lease thread sleeps at most this long between looks at a launch (the
// bell thread wakes it as soon as one ends).
constexpr int64_t kLeaseLookNs = 1000000;
// ... and at most this long while it sleeps towards a lease's end (a wake-up
// per lease is all an idle runtime should pay).
constexpr int64_t kLeaseSleepLookNs = 100000000;
// Waiters of CPU->GPU tasks spin this long after a parked GPU starts (its
// first launch after quiet: p99 about 120-280 us on an H200).
constexpr int64_t kStartSpinNs = 400000;
// A parked GPU's lease thread looks at it this often even if no submit asks
// (an ask wakes it at once).
constexpr int64_t kParkedLookNs = 1000000000;
// The bell thread looks for a new launch this often even if none is announced.
constexpr int64_t kBellIdleNs = 100000000;
// Shutdown waits this long for the bell thread, which waits in the driver
// for the last launch to end (forever if the kernel never stops).
constexpr int64_t kBellJoinNs = 2000000000;

}  // namespace

// The bell thread's link to its device: shutdown leaves it behind
// (orphaned) if it stays blocked in the driver, on a kernel that never
// stopped; it then returns without touching the device when it wakes.
struct BellLife {
  std::mutex mu;  // held by the thread except while it waits
  bool orphaned = false;
  std::atomic<bool> done{false};
};

namespace {

void sleep_ns(long ns) {
  timespec ts{0, ns};
  nanosleep(&ts, nullptr);
}

}  // namespace

DeviceGuard::DeviceGuard(int ordinal) : want_(ordinal) {
  if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = -1;
  if (prev_ != want_) (void)cudaSetDevice(want_);
}

DeviceGuard::~DeviceGuard() {
  if (prev_ >= 0 && prev_ != want_) (void)cudaSetDevice(prev_);
}

bool allocation_range(const void *ptr, uintptr_t *base_out, size_t *len_out) {
#if CHI_HAVE_HIP
  void *base = nullptr;
  size_t len = 0;
  if (hipMemGetAddressRange(reinterpret_cast<hipDeviceptr_t *>(&base), &len, const_cast<void *>(ptr)) != hipSuccess) {
    (void)hipGetLastError();
    return false;
  }
  *base_out = reinterpret_cast<uintptr_t>(base);
#else
  // The allocation's extent comes from the driver; fetched through the runtime
  // so that the library never links libcuda (it must load without a driver).
  using range_fn = int (*)(unsigned long long *, size_t *, unsigned long long);
  static range_fn range = [] {
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<range_fn>(fn);
  }();
  unsigned long long base = 0;
  size_t len = 0;
  if (!range || range(&base, &len, reinterpret_cast<unsigned long long>(ptr)) != 0) return false;
  *base_out = uintptr_t(base);
#endif
  *len_out = len;
  return true;
}

chi_status_t cuda_error(chi_status_t status, int32_t gpu, const char *what, cudaError_t e) {
  return set_error(status, "GPU %d: %s: %s", gpu, what, cudaGetErrorString(e));
}

GpuDevice::GpuDevice(Runtime &rt, int32_t id, int ordinal, int32_t ngpus)
    : rt_(rt), id_(id), ordinal_(ordinal), ngpus_(ngpus) {}

GpuDevice::~GpuDevice() {
  shutdown();
  if (kernel_gone_) release_memory();
}

chi_status_t GpuDevice::allocate() {
  DeviceGuard guard(ordinal_);
  int sms = 0;
  if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ordinal_);
      e != cudaSuccess)
    return cuda_error(CHI_ERR_INTERNAL, id_, "reading the SM count", e);
  shape_ = make_shape(rt_.config(), sms);
  const Shape &s = shape_;
  // The orchestrator's stream has the highest priority: after a lease, its
  // relaunched blocks go before blocks of other kernels still waiting for an SM.
  int prio_least = 0, prio_greatest = 0;
  if (cudaDeviceGetStreamPriorityRange(&prio_least, &prio_greatest) != cudaSuccess) {
    (void)cudaGetLastError();
    prio_greatest = 0;
  }
  if (cudaError_t e = cudaStreamCreateWithPriority(&orch_stream_, cudaStreamNonBlocking, prio_greatest);
      e != cudaSuccess)
    return cuda_error(CHI_ERR_INTERNAL, id_, "creating a stream", e);
  if (cudaError_t e = cudaStreamCreateWithFlags(&ctl_stream_, cudaStreamNonBlocking); e != cudaSuccess)
    return cuda_error(CHI_ERR_INTERNAL, id_, "creating a stream", e);

  // With a lease, the bell thread waits on these in the driver: blocking
  // sync, so it sleeps until the GPU's interrupt instead of spinning.
  const unsigned ev_flags = cudaEventDisableTiming | (s.lease_ns ? cudaEventBlockingSync : 0u);
  for (cudaEvent_t *ev : {&ended_[0], &ended_[1]})
    if (cudaError_t e = cudaEventCreateWithFlags(ev, ev_flags); e != cudaSuccess)
      return cuda_error(CHI_ERR_INTERNAL, id_, "creating an event", e);
  if (chi_status_t st = mem_.allocate(s, id_, ngpus_, kMaxMethods, ctl_stream_); st != CHI_OK) return st;

  exec_ = std::make_unique<H2dExecutor>(rt_, id_, s, mem_.h2d_ring, mem_.h2d_done, mem_.h2d_buf);
  exec_->set_park_gate(&park_);
  poller_ = std::make_unique<CpuPoller>(rt_, id_, s, mem_.d2h_ring, mem_.d2h_reply, mem_.d2h_buf, exec_.get());
  if (s.lease_ns && rt_.config().gpu.poller_bell_check_us)
    poller_->set_bell(&mem_.host_lease[2], int64_t(rt_.config().gpu.poller_bell_check_us) * 1000);
  log(LogLevel::kInfo,
      "GPU %d (CUDA device %d): orchestrator %u x %u threads, %u polling warps, lease %llu us%s; "
      "%u CPU->GPU slots, %u device slots, %u CPU pollers; %.1f MiB pinned, %.1f MiB device",
      id_, ordinal_, s.blocks, s.threads, s.h2d_pollers, (unsigned long long)(s.lease_ns / 1000),
      s.lease_ns ? "" : " (persistent)", s.h2d_slots, s.dslots, s.cpu_pollers,
      mem_.pinned_bytes / 1048576.0, mem_.dev_bytes / 1048576.0);
  return CHI_OK;
}

chi_status_t GpuDevice::start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (chi_status_t s = allocate(); s != CHI_OK) return s;
  poller_->start();
  launcher_ = launch_builtin;
  // Parking needs the lease: a persistent kernel never ends on its own.
  keep_alive_ns_ = shape_.lease_ns ? uint64_t(rt_.config().gpu.keep_alive_us) * 1000 : 0;
  park_.set_waker(wake_cb, this);
  if (chi_status_t s = launch_locked(); s != CHI_OK) return s;
  if (shape_.lease_ns) {
    bell_life_ = std::make_shared<BellLife>();
    bell_thread_ = std::thread([this, life = bell_life_] { bell_loop(life); });
    lease_thread_ = std::thread([this] { lease_loop(); });
  }
  bell_live_locked();
  return CHI_OK;
}

void GpuDevice::bell_live_locked() {
  if (poller_) poller_->set_bell_live(shape_.lease_ns && running_ && !broken_ && !shut_ && bell_life_);
}

uint64_t GpuDevice::next_lease() const {
  if (shape_.idle_lease_ns > shape_.lease_ns && poller_ && poller_->bell_armed() && exec_ &&
      exec_->in_flight() == 0)
    return shape_.idle_lease_ns;
  return shape_.lease_ns;
}

bool GpuDevice::wait_launch_end(uint64_t n, int64_t deadline, cudaError_t *err, int64_t look_ns,
                                uint64_t phase) {
  for (;;) {
    const uint32_t seq = end_seq_.load(std::memory_order_seq_cst);
    // A CUDA call: a GPU->GPU submitter waiting for the next launch gives
    // up after two leases in it (gate_wait), as it may be held back by a
    // device-wide call that waits for the submitter's kernel.
    // The phase word alone: CHI_DIAG_LEASE_AT keeps when `phase` began.
    __atomic_store_n(&mem_.diag[CHI_DIAG_LEASE_PHASE], uint64_t(CHI_DIAG_PHASE_QUERY), __ATOMIC_SEQ_CST);
    *err = cudaEventQuery(ended_[n & 1]);
    __atomic_store_n(&mem_.diag[CHI_DIAG_LEASE_PHASE], phase, __ATOMIC_RELEASE);
    if (*err != cudaErrorNotReady) return true;
    if (lease_quit_.load(std::memory_order_relaxed)) return false;
    const int64_t left = deadline - now_ns();
    if (left <= 0) return false;
    futex_wait(&end_seq_, seq, std::min(left, look_ns));
  }
}

void GpuDevice::bell_loop(std::shared_ptr<BellLife> life) {
  pthread_setname_np(pthread_self(), "chi-gpu-bell");
  (void)cudaSetDevice(ordinal_);
  std::unique_lock<std::mutex> hold(life->mu);
  uint64_t k = 0;  // the launch whose end it waits for next
  uint64_t last_rung = 0;
  for (;;) {
    const uint32_t seq = launch_seq_.load(std::memory_order_seq_cst);
    if (lease_quit_.load()) break;
    const uint64_t n = launches_.load();
    if (k >= n) {
      hold.unlock();
      futex_wait(&launch_seq_, seq, kBellIdleNs);
      hold.lock();
      if (life->orphaned) return;
      continue;
    }
    // Launches end in order; a late look finds launch k's event recorded
    // again for k + 2, and waits for that one.
    if (k + 2 < n) k = n - 2;
    const cudaEvent_t ev = ended_[k & 1];
    hold.unlock();
    const cudaError_t e = cudaEventSynchronize(ev);
    hold.lock();
    if (life->orphaned) return;
    ++k;
    if (e == cudaSuccess) ended_n_.store(k, std::memory_order_release);
    end_seq_.fetch_add(1, std::memory_order_seq_cst);
    futex_wake(&end_seq_);
    if (e != cudaSuccess) {
      // A fault: the lease thread reports it and launches nothing more.
      hold.unlock();
      sleep_ns(1000000);
      hold.lock();
      if (life->orphaned) return;
      continue;
    }
    const uint64_t rung = __atomic_load_n(&mem_.diag[CHI_DIAG_BELL], __ATOMIC_ACQUIRE);
    if (rung != 0 && rung != last_rung) {
      last_rung = rung;
      bell_rings_.fetch_add(1, std::memory_order_relaxed);
      poller_->bell_rang(rung);
    }
  }
  life->done.store(true);
}

void GpuDevice::lease_loop() {
  pthread_setname_np(pthread_self(), "chi-gpu-lease");
  // Wake-ups on time: the default 50 us slack would delay every successor.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  // The launchers (ours, or a user's with its own CUDA runtime instance) use
  // the context current to this thread.
  (void)cudaSetDevice(ordinal_);
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    lease_phase(CHI_DIAG_PHASE_IDLE, launches_.load());
    lease_cv_.wait(lock, [this] { return lease_quit_.load() || (running_ && !broken_); });
    if (lease_quit_.load()) return;
    if (parked_) {
      // No launch to queue: sleeps until a submit asks (the submitter may
      // start the GPU itself, then this thread finds it unparked).
      lease_phase(CHI_DIAG_PHASE_IDLE, launches_.load());
      lock.unlock();
      park_.sleep(kParkedLookNs);
      lock.lock();
      if (lease_quit_.load()) return;
      if (parked_ && running_ && !broken_ && park_.wanted()) unpark_locked();
      continue;
    }
    // Launch n is the only one queued (the successor is queued only below,
    // and pause/resume/set_orchestrator launch on an idle stream).
    const uint64_t n = launches_.load() - 1;
    // It may have ended already: it steps aside when its successor is not
    // queued in time (this thread held back in a CUDA call by another
    // thread's device-wide call), and GPU->GPU submits wait for the next
    // launch meanwhile.  Then the next one goes at once.
    lock.unlock();
    const cudaError_t done = cudaEventQuery(ended_[n & 1]);
    lock.lock();
    if (lease_quit_.load()) return;
    if (!running_ || broken_ || launches_.load() - 1 != n) continue;
    if (done == cudaSuccess) {
      lease_phase(CHI_DIAG_PHASE_QUEUE, n);
      if (launch_locked() != CHI_OK) fail_locked("relaunching the orchestrator");
      continue;
    }
    if (done != cudaErrorNotReady) {
      cuda_error(CHI_ERR_INTERNAL, id_, "orchestrator kernel failed", done);
      fail_locked(nullptr);
      continue;
    }
    const int64_t due = launched_at_ + int64_t(lease_of_[n & 1]);
    // Tells launch n which launch comes next.  Past its lease it ends as soon
    // as that one is queued; while it is not (a device-wide call in another
    // thread may hold this thread back in any CUDA call, or the holder of
    // mu_), it stays as long as kernels use the device routes.
    __atomic_store_n(&mem_.host_lease[1], n + 2, __ATOMIC_RELEASE);
    lock.unlock();
    lease_phase(CHI_DIAG_PHASE_SLEEP, n);
    cudaError_t early;
    if (wait_launch_end(n, due - kLeaseWakeEarlyNs, &early, kLeaseSleepLookNs, CHI_DIAG_PHASE_SLEEP)) {
      // Ended before its lease: the bell (docs/gpu.md), or the keeper
      // stepped aside.  The top relaunches at once.
      lock.lock();
      if (lease_quit_.load()) return;
      continue;
    }
    // Queue the successor behind launch n: it starts as soon as n ends.
    if (now_ns() - (due - kLeaseWakeEarlyNs) > 50000) ++lease_woke_late_;
    lease_phase(CHI_DIAG_PHASE_LOCK, n);
    lock.lock();
    if (lease_quit_.load()) return;
    if (!running_ || broken_ || launches_.load() - 1 != n) continue;  // paused, or launched anew
    if (park_due_locked()) {
      // No successor: launch n's keeper ends it past its lease (stepping
      // aside), and the GPU stays empty until a CPU->GPU task asks.
      log(LogLevel::kDebug, "GPU %d: parked after launch %llu", id_, (unsigned long long)n);
      continue;
    }
    lease_phase(CHI_DIAG_PHASE_QUEUE, n);
    if (launch_locked(true) != CHI_OK) {
      fail_locked("queuing the orchestrator's next lease");
      continue;
    }
    {
      const int64_t ahead = due - now_ns();
      ++lease_ahead_[ahead < 0 ? 0 : ahead < 50000 ? 1 : ahead < 100000 ? 2 : 3];
    }
    __atomic_store_n(&mem_.host_lease[1], n + 3, __ATOMIC_RELEASE);
    lock.unlock();
    lease_phase(CHI_DIAG_PHASE_WAIT_END, n);
    // Wait for launch n to end (about when its lease does; later while
    // kernels use the device routes, if it started late or a handler runs
    // long): its successor starts then, and that start times the
    // successor's lease.  The bell thread wakes this one at the end.
    cudaError_t e = cudaErrorNotReady;
    while (!wait_launch_end(n, now_ns() + kLeaseLookNs, &e, kLeaseLookNs, CHI_DIAG_PHASE_WAIT_END))
      if (lease_quit_.load(std::memory_order_relaxed) || launches_.load() != n + 2) break;
    lease_phase(CHI_DIAG_PHASE_LOCK, n);
    lock.lock();
    if (lease_quit_.load()) return;
    if (e != cudaSuccess && e != cudaErrorNotReady) {
      cuda_error(CHI_ERR_INTERNAL, id_, "orchestrator kernel failed", e);
      fail_locked(nullptr);
      continue;
    }
    if (e == cudaSuccess && launches_.load() == n + 2) launched_at_ = started_at(n + 1);
  }
}

bool GpuDevice::park_due_locked() {
  if (!keep_alive_ns_ || held_awake_ || shut_ || !exec_) return false;
  const int64_t now = now_ns();
  const uint64_t tail = exec_->tail();
  if (tail != quiet_tail_) {
    quiet_tail_ = tail;
    quiet_since_ = now;
    return false;
  }
  if (now - quiet_since_ < int64_t(keep_alive_ns_)) return false;
  // A task still running (a long handler) or unclaimed keeps the GPU: looks
  // again a keep-alive later.
  if (exec_->in_flight() != 0) {
    quiet_since_ = now;
    return false;
  }
  if (!park_.try_park(tail, [this] { return exec_->tail(); })) return false;
  parked_ = true;
  if (poller_) poller_->set_bell_parked(true);
  parks_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void GpuDevice::unpark_locked() {
  if (!parked_) return;
  parked_ = false;
  park_.unpark();
  quiet_tail_ = ~0ull;
  if (running_ && !broken_) {
    // The last launch ended (the usual case: the GPU parked a while ago, and
    // the bell thread saw the end): the next goes now, from this thread,
    // before anything else (each CUDA call or system call on a host that
    // was idle costs 5-20 us, measured on an H200 host).  Still ending: the
    // lease thread queues the next behind it, as after any lease.
    if (exec_) exec_->starting(now_ns() + kStartSpinNs);
    const uint64_t n = launches_.load() - 1;
    const bool ended = ended_n_.load(std::memory_order_acquire) > n || cudaEventQuery(ended_[n & 1]) == cudaSuccess;
    if (ended && launch_locked() != CHI_OK) fail_locked("starting the parked orchestrator");
  }
  if (poller_) poller_->set_bell_parked(false);
  lease_cv_.notify_all();
  park_.nudge();
}

bool GpuDevice::wake() {
  // On the submitter that won the ask.  mu_ held elsewhere (a status read,
  // a pause, the lease thread): false, and the ask wakes the lease thread,
  // which starts the GPU once it has the lock.
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  if (parked_ && park_.wanted()) unpark_locked();
  return true;
}

void GpuDevice::hold_awake() {
  std::lock_guard<std::mutex> lock(mu_);
  held_awake_ = true;
  unpark_locked();
}

void GpuDevice::fail_locked(const char *what) {
  broken_ = true;
  running_ = false;
  parked_ = false;
  park_.unpark();
  park_.nudge();
  bell_live_locked();
  failure_ = what ? std::string("GPU ") + std::to_string(id_) + ": " + what + ": " + last_error()
                  : std::string(last_error());
  // A fault in a kernel loses the process's CUDA context: nothing on this GPU
  // runs again.  Waiters of CPU->GPU tasks get the reason at once instead of
  // their timeout; CPU routes go on.
  log(LogLevel::kError, "%s; GPU routes of GPU %d answer errors from now on (docs/reliability.md)",
      failure_.c_str(), id_);
  if (exec_) exec_->mark_failed(failure_);
}

// When launch k started, in now_ns() time.  Its first warp stamps the
// start in the diag words (%globaltimer); this thread sees the end of launch
// k - 1 later, by up to the time it slept: timing the next lease from that
// sighting made each lease's successor later than the one before, until a
// keeper found none queued at its lease's end and stepped aside (a submit
// that then waited over two leases for the next launch answered
// CHI_ERR_AGAIN: chimaera-bench's 1 and 4 KiB GPU->GPU rows, the GPU soak).
// %globaltimer is not the host's clock (563-725 us ahead of CLOCK_REALTIME
// on an H200, drifting): read against the host's clock, 19,966 of 20,376
// stamps looked like starts in the future and those launches fell back to
// the sighting.  LeaseClock learns the offset from the stamps.  Falls back to
// now when the stamp is not launch k's.
int64_t GpuDevice::started_at(uint64_t k) {
  const int64_t now = now_ns();
  if (__atomic_load_n(&mem_.diag[CHI_DIAG_START_EPOCH], __ATOMIC_ACQUIRE) != k) {
    ++start_unstamped_;
    return now;
  }
  return start_clock_.start(now, int64_t(__atomic_load_n(&mem_.diag[CHI_DIAG_START_AT], __ATOMIC_RELAXED)));
}

void GpuDevice::lease_phase(uint64_t phase, uint64_t n) {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  __atomic_store_n(&mem_.diag[CHI_DIAG_LEASE_AT], uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec),
                   __ATOMIC_RELAXED);
  __atomic_store_n(&mem_.diag[CHI_DIAG_LEASE_N], n, __ATOMIC_RELAXED);
  __atomic_store_n(&mem_.diag[CHI_DIAG_LEASE_PHASE], phase, __ATOMIC_RELEASE);
}

void GpuDevice::context(chi_dev_context_t *ctx) const {
  std::memset(ctx, 0, sizeof *ctx);
  std::memcpy(ctx, &mem_.layout, sizeof mem_.layout);
}

chi_status_t GpuDevice::write_stop(uint32_t value) {
  DeviceGuard guard(ordinal_);
  mem_.stop_src[0] = value;
  mem_.stop_src[1] = 0;  // the fault word
  mem_.stop_src[2] = mem_.stop_src[3] = 0;
  // Clearing the flag precedes a launch on an idle stream: the arrival
  // counter then restarts at that launch's index (a kernel of another ABI
  // never arrived), so the lease epochs stay the launch indices.
  const uint64_t arrivals = launches_.load() * shape_.nwarps;
  std::memcpy(mem_.stop_src + 4, &arrivals, sizeof arrivals);
  // The last lease over, and the exit counter (control[10..11], counted
  // from 0 in whole launches: orchestrator_main's exit_barrier).
  for (int i = 6; i < 12; ++i) mem_.stop_src[i] = 0;
  const size_t bytes = value == 0 ? 12 * sizeof(uint32_t) : 2 * sizeof(uint32_t);
  cudaError_t e = cudaMemcpyAsync(mem_.control, mem_.stop_src, bytes, cudaMemcpyHostToDevice, ctl_stream_);
  if (e == cudaSuccess) e = cudaStreamSynchronize(ctl_stream_);
  if (e != cudaSuccess) {
    broken_ = true;
    return cuda_error(CHI_ERR_INTERNAL, id_, "writing the stop flag", e);
  }
  return CHI_OK;
}

chi_status_t GpuDevice::launch_locked(bool behind) {
  DeviceGuard guard(ordinal_);
  const uint64_t index = launches_.load();
  // Its lease, read by its keeper at its start (launch n, running, read its own).
  const uint64_t lease = next_lease();
  __atomic_store_n(&mem_.host_lease[3], lease, __ATOMIC_RELEASE);
  lease_of_[index & 1] = lease;
  chi_gpu_launch_t l;
  l.struct_size = sizeof l;
  l.gpu = id_;
  l.stream = orch_stream_;
  l.blocks = shape_.blocks;
  l.threads_per_block = shape_.threads;
  l.state = mem_.state;
  chi_status_t s = launcher_(&l);
  if (s != CHI_OK) {
    cudaError_t e = cudaGetLastError();
    return set_error(CHI_ERR_INTERNAL, "GPU %d: orchestrator launch failed (%d): %s", id_, s,
                     cudaGetErrorString(e));
  }
  // Ends with the launch: the lease thread waits on it before the next one.
  cudaError_t e = cudaEventRecord(ended_[index & 1], orch_stream_);
  running_ = true;
  launches_.store(index + 1);
  __atomic_store_n(&mem_.host_lease[0], index + 1, __ATOMIC_RELEASE);
  if (!behind) launched_at_ = now_ns();
  lease_cv_.notify_all();
  launch_seq_.fetch_add(1, std::memory_order_seq_cst);
  futex_wake(&launch_seq_);
  if (!behind) bell_live_locked();
  if (e != cudaSuccess) return cuda_error(CHI_ERR_INTERNAL, id_, "recording the launch's event", e);
  return CHI_OK;
}

chi_status_t GpuDevice::pause_locked() {
  if (!running_) return CHI_OK;
  if (broken_) return set_error(CHI_ERR_INTERNAL, "GPU %d: orchestrator failed earlier", id_);
  if (chi_status_t s = write_stop(1); s != CHI_OK) return s;
  DeviceGuard guard(ordinal_);
  const int64_t t0 = now_ns();
  for (long nap = 2000;; nap = nap < 200000 ? nap * 2 : nap) {
    cudaError_t e = cudaStreamQuery(orch_stream_);
    if (e == cudaSuccess) break;
    if (e != cudaErrorNotReady) {
      const chi_status_t s = cuda_error(CHI_ERR_INTERNAL, id_, "orchestrator kernel failed", e);
      fail_locked(nullptr);
      return set_error(s, "%s", failure_.c_str());
    }
    if (now_ns() - t0 > kStopTimeoutNs) {
      broken_ = true;
      return set_error(CHI_ERR_INTERNAL,
                       "GPU %d: orchestrator did not stop within %lld s (a device handler that "
                       "never returns?)",
                       id_, (long long)(kStopTimeoutNs / 1000000000));
    }
    sleep_ns(nap);
  }
  running_ = false;
  parked_ = false;
  park_.unpark();
  park_.nudge();  // tasks queued while paused wait for resume
  park_.nudge();
  bell_live_locked();
  return CHI_OK;
}

chi_status_t GpuDevice::resume_locked() {
  if (running_) return CHI_OK;
  if (broken_) return set_error(CHI_ERR_INTERNAL, "GPU %d: orchestrator failed earlier", id_);
  if (chi_status_t s = write_stop(0); s != CHI_OK) return s;
  return launch_locked();
}

chi_status_t GpuDevice::pause() {
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_) return set_error(CHI_ERR_SHUTDOWN, "GPU %d: runtime is shutting down", id_);
  return pause_locked();
}

const char *GpuDevice::orchestrator_state(uint64_t *launches, uint64_t *parks) {
  std::lock_guard<std::mutex> lock(mu_);
  *launches = launches_.load();
  if (parks) *parks = parks_.load(std::memory_order_relaxed);
  return shut_ ? "stopped" : broken_ ? "failed" : !running_ ? "paused" : parked_ ? "parked" : "running";
}

chi_status_t GpuDevice::pause_if_running(bool *was_running) {
  std::lock_guard<std::mutex> lock(mu_);
  *was_running = false;
  if (shut_) return set_error(CHI_ERR_SHUTDOWN, "GPU %d: runtime is shutting down", id_);
  if (!running_) return CHI_OK;
  if (chi_status_t s = pause_locked(); s != CHI_OK) return s;
  *was_running = true;
  return CHI_OK;
}

chi_status_t GpuDevice::resume() {
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_) return set_error(CHI_ERR_SHUTDOWN, "GPU %d: runtime is shutting down", id_);
  return resume_locked();
}

chi_status_t GpuDevice::set_orchestrator(chi_gpu_launch_fn launch,
                                         const std::vector<int32_t> &dispatch) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_) return set_error(CHI_ERR_SHUTDOWN, "GPU %d: runtime is shutting down", id_);
  const bool was_running = running_;
  if (chi_status_t s = pause_locked(); s != CHI_OK) return s;
  DeviceGuard guard(ordinal_);
  cudaError_t e = cudaMemcpyAsync(mem_.dispatch, dispatch.data(), dispatch.size() * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, ctl_stream_);
  if (e == cudaSuccess) e = cudaStreamSynchronize(ctl_stream_);
  if (e != cudaSuccess) return cuda_error(CHI_ERR_INTERNAL, id_, "uploading the dispatch table", e);
  chi_gpu_launch_fn previous = launcher_;
  launcher_ = launch;
  if (!was_running) return CHI_OK;  // a paused GPU starts the new orchestrator at resume
  chi_status_t s = write_stop(0);
  if (s == CHI_OK) s = launch_locked();
  if (s == CHI_OK) {
    // A kernel built against another chimaera_device.h exits at once and
    // says so in the fault word (write_stop cleared it).  A kernel that ended
    // within this time because its lease did leaves it clear.
    sleep_ns(2000000);
    uint32_t fault = 0;
    e = cudaMemcpyAsync(mem_.stop_src + 8, mem_.control + 1, sizeof fault, cudaMemcpyDefault, ctl_stream_);
    if (e == cudaSuccess) e = cudaStreamSynchronize(ctl_stream_);
    if (e != cudaSuccess) return cuda_error(CHI_ERR_INTERNAL, id_, "reading the fault word", e);
    fault = mem_.stop_src[8];
    if (fault == 0) return CHI_OK;
    (void)pause_locked();  // it has exited: waits for the stream
    s = set_error(CHI_ERR_INTERNAL, "GPU %d: user orchestrator exited at once (fault %u%s)", id_,
                  fault, fault == CHI_DEV_FAULT_ABI ? ": built against another chimaera_device.h" : "");
  }
  std::string why = last_error();
  launcher_ = previous;
  if (write_stop(0) == CHI_OK) launch_locked();
  return set_error(CHI_ERR_INTERNAL, "%s", why.c_str());
}

chi_status_t GpuDevice::check_pointer(const void *ptr, size_t size) {
  DeviceGuard guard(ordinal_);
  cudaPointerAttributes a;
  std::memset(&a, 0, sizeof a);
  if (cudaError_t e = cudaPointerGetAttributes(&a, ptr); e != cudaSuccess) {
    (void)cudaGetLastError();
    return set_error(CHI_ERR_INVALID, "GPU %d: %p is not memory the CUDA runtime knows (%s)", id_,
                     ptr, cudaGetErrorString(e));
  }
  if (CHI_POINTER_TYPE(a) != cudaMemoryTypeDevice)
    return set_error(CHI_ERR_INVALID, "GPU %d: %p is not device memory (memory type %d)", id_, ptr,
                     int(CHI_POINTER_TYPE(a)));
  if (a.device != ordinal_)
    return set_error(CHI_ERR_INVALID, "GPU %d: %p belongs to CUDA device %d, not %d", id_, ptr,
                     a.device, ordinal_);
  uintptr_t b = 0;
  size_t len = 0;
  if (allocation_range(ptr, &b, &len)) {
    uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    if (p - b > len || size > len - (p - b))
      return set_error(CHI_ERR_INVALID,
                       "GPU %d: %zu bytes at %p run past the end of their allocation (%zu bytes "
                       "left)",
                       id_, size, ptr, size_t(len - (p - b)));
  }
  return CHI_OK;
}

chi_status_t GpuDevice::upload_regions(const std::vector<Region> &snapshot) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_ || broken_) return CHI_OK;
  uint32_t n = uint32_t(snapshot.size() < CHI_DEV_MAX_REGIONS ? snapshot.size() : CHI_DEV_MAX_REGIONS);
  std::vector<chi_dev_region_t> staged(n);
  for (uint32_t i = 0; i < n; ++i) {
    const Region &r = snapshot[i];
    staged[i] = chi_dev_region_t{r.id, uint64_t(r.base), r.size, int64_t(r.gpu)};
  }
  DeviceGuard guard(ordinal_);
  cudaError_t e = cudaSuccess;
  if (n)
    e = cudaMemcpyAsync(mem_.region_stage, staged.data(), n * sizeof(chi_dev_region_t),
                        cudaMemcpyHostToDevice, ctl_stream_);
  if (e == cudaSuccess) e = launch_region_update(mem_.layout.regions, mem_.region_stage, n, region_count_, ctl_stream_);
  if (e == cudaSuccess) e = cudaStreamSynchronize(ctl_stream_);
  if (e != cudaSuccess) return cuda_error(CHI_ERR_INTERNAL, id_, "updating the region table", e);
  region_count_ = n;
  return CHI_OK;
}

chi_status_t GpuDevice::upload_peers(const std::vector<chi_dev_ctx_layout_t> &table) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_ || broken_ || table.size() != size_t(ngpus_)) return CHI_OK;
  DeviceGuard guard(ordinal_);
  cudaError_t e = cudaMemcpyAsync(const_cast<chi_dev_ctx_layout_t *>(mem_.layout.peers), table.data(),
                                  table.size() * sizeof(chi_dev_ctx_layout_t), cudaMemcpyHostToDevice, ctl_stream_);
  if (e == cudaSuccess) e = cudaStreamSynchronize(ctl_stream_);
  if (e != cudaSuccess) return cuda_error(CHI_ERR_INTERNAL, id_, "uploading the peer table", e);
  return CHI_OK;
}

void GpuDevice::device_slots(uint64_t *in_use, uint64_t *total) {
  std::lock_guard<std::mutex> lock(mu_);
  *total += 2ull * shape_.dslots;
  if (shut_ || broken_ || !mem_.dev) return;
  const size_t words = shape_.dslots / 32;
  std::vector<uint32_t> bits(2 * words);
  DeviceGuard guard(ordinal_);
  cudaError_t e = cudaMemcpyAsync(bits.data(), mem_.layout.d2d_bitmap, words * 4, cudaMemcpyDefault, ctl_stream_);
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(bits.data() + words, mem_.layout.d2h_bitmap, words * 4, cudaMemcpyDefault, ctl_stream_);
  if (e == cudaSuccess) e = cudaStreamSynchronize(ctl_stream_);
  if (e != cudaSuccess) {
    log(LogLevel::kWarn, "GPU %d: reading the device slot bitmaps: %s", id_, cudaGetErrorString(e));
    (void)cudaGetLastError();
    return;
  }
  for (uint32_t w : bits) *in_use += uint64_t(__builtin_popcount(w));
}

chi_status_t GpuDevice::shutdown() {
  std::unique_lock<std::mutex> lock(mu_);
  if (shut_) return CHI_OK;
  shut_ = true;
  chi_status_t status = CHI_OK;
  if (exec_ && !broken_) {
    // chi_finalize runs what is queued: a paused GPU resumes for that.
    if (chi_status_t s = resume_locked(); s != CHI_OK) status = s;
    const int64_t t0 = now_ns();
    uint32_t left;
    while (running_ && (left = exec_->in_flight()) != 0) {
      unpark_locked();  // a task asked and its start is still to come
      if (now_ns() - t0 > kDrainTimeoutNs) {
        log(LogLevel::kWarn, "GPU %d: %u CPU->GPU task(s) unfinished at shutdown", id_, left);
        break;
      }
      // Unlocked, so the lease thread can relaunch the kernel (shut_ keeps
      // every other caller out).
      lock.unlock();
      sleep_ns(100000);
      lock.lock();
    }
  }
  if (exec_) exec_->close();
  if (running_) {
    if (chi_status_t s = pause_locked(); s != CHI_OK) {
      status = s;
      kernel_gone_ = !running_;  // still running: its memory must stay
    }
  }
  if (poller_) poller_->stop();
  // Waiters still blocked on this GPU give up now; the memory itself is freed
  // with the device object, after the CPU workers (which may still read
  // finished results) have stopped.
  if (exec_) exec_->mark_stopped();
  if (!kernel_gone_) log(LogLevel::kError, "GPU %d: orchestrator still running; its memory is leaked", id_);
  log(LogLevel::kDebug, "GPU %d: orchestrator launched %llu times; pollers' bell: %llu sleeps, %llu rings, %llu kicks",
      id_, (unsigned long long)launches_.load(), (unsigned long long)(poller_ ? poller_->bell_sleeps() : 0),
      (unsigned long long)bell_rings_.load(), (unsigned long long)(poller_ ? poller_->bell_kicks() : 0));
  lease_quit_.store(true);
  lease_cv_.notify_all();
  park_.nudge();
  launch_seq_.fetch_add(1, std::memory_order_seq_cst);
  futex_wake(&launch_seq_);
  end_seq_.fetch_add(1, std::memory_order_seq_cst);
  futex_wake(&end_seq_);
  lock.unlock();
  if (lease_thread_.joinable()) lease_thread_.join();
  if (shape_.lease_ns) log(LogLevel::kDebug,
      "GPU %d: successors queued ahead of the lease's end: late %llu, < 50 us %llu, < 100 us %llu, "
      "more %llu; lease thread woke over 50 us late %llu times; starts without their stamp %llu",
      id_, (unsigned long long)lease_ahead_[0], (unsigned long long)lease_ahead_[1],
      (unsigned long long)lease_ahead_[2], (unsigned long long)lease_ahead_[3],
      (unsigned long long)lease_woke_late_, (unsigned long long)start_unstamped_);
  if (bell_thread_.joinable()) {
    const int64_t t0 = now_ns();
    while (!bell_life_->done.load() && now_ns() - t0 < kBellJoinNs) sleep_ns(1000000);
    if (bell_life_->done.load()) {
      bell_thread_.join();
    } else {
      std::lock_guard<std::mutex> g(bell_life_->mu);
      bell_life_->orphaned = true;
      bell_thread_.detach();
      log(LogLevel::kError, "GPU %d: the bell thread still waits for the orchestrator's last launch; left behind", id_);
    }
  }
  return status;
}

void GpuDevice::release_memory() {
  DeviceGuard guard(ordinal_);
  mem_.release();
  for (cudaEvent_t &ev : ended_)
    if (ev) (void)cudaEventDestroy(ev);
  ended_[0] = ended_[1] = nullptr;
  if (orch_stream_) (void)cudaStreamDestroy(orch_stream_);
  if (ctl_stream_) (void)cudaStreamDestroy(ctl_stream_);
  orch_stream_ = ctl_stream_ = nullptr;
  (void)cudaGetLastError();
}

}  // namespace chi::gpu

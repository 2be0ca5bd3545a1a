// One GPU's orchestrator: its launch/pause/resume, the lease thread that
// relaunches the kernel when its lease ends, parking (no kernel while the
// GPU's routes are idle: the state machine below, the handshake in
// core/park_gate.h), the bell thread, the CPU->GPU executor and the GPU->CPU
// pollers.  Its memory is gpu/device_memory.h.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "chimaera_device.h"
#include "core/lease_clock.h"
#include "core/memory_regions.h"
#include "core/park_gate.h"
#include "gpu/cpu_poller.h"
#include "gpu/cuda_api.h"
#include "gpu/device_memory.h"
#include "gpu/h2d_executor.h"
#include "gpu/shape.h"

namespace chi {
class Runtime;
}

namespace chi::gpu {

// Makes a CUDA device current for a scope and restores the caller's device,
// so chimaera calls never change which device the user's thread works on.
class DeviceGuard {
 public:
  explicit DeviceGuard(int ordinal);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard &) = delete;
  DeviceGuard &operator=(const DeviceGuard &) = delete;

 private:
  int prev_ = -1;
  int want_;
};

// The allocation that holds device pointer `ptr` (from the driver); false
// where it cannot tell.
bool allocation_range(const void *ptr, uintptr_t *base, size_t *len);

// Sets the thread's message for a failed CUDA call and returns `status`.
chi_status_t cuda_error(chi_status_t status, int32_t gpu, const char *what, cudaError_t e);

class GpuDevice {
 public:
  // ngpus: GPUs of the runtime (device code refuses CHI_ROUTE_GPU(n >= ngpus)).
  GpuDevice(Runtime &rt, int32_t id, int ordinal, int32_t ngpus);
  ~GpuDevice();

  // Allocates and initializes everything, starts the pollers and the built-in orchestrator.
  chi_status_t start();
  Executor *executor() { return exec_.get(); }
  void context(chi_dev_context_t *ctx) const;
  chi_status_t pause();
  chi_status_t resume();
  // pause(), and whether the orchestrator was running before.
  chi_status_t pause_if_running(bool *was_running);
  int32_t id() const { return id_; }
  int ordinal() const { return ordinal_; }
  // "running", "parked", "paused", "failed" or "stopped"; *launches:
  // launches so far; *parks (may be NULL): times it parked.
  const char *orchestrator_state(uint64_t *launches, uint64_t *parks = nullptr);
  // A device context of this GPU was handed out (chi_gpu_context): kernels
  // may submit to its device routes at any time, so it never parks again.
  void hold_awake();
  // Pauses, installs the method-id -> dispatch-index table, relaunches with `launch`.
  chi_status_t set_orchestrator(chi_gpu_launch_fn launch, const std::vector<int32_t> &dispatch);
  chi_status_t check_pointer(const void *ptr, size_t size);
  chi_status_t upload_regions(const std::vector<Region> &snapshot);
  // This GPU's context as another GPU's kernels reach it (peer memory).
  const chi_dev_ctx_layout_t &layout() const { return mem_.layout; }
  // Writes the table of every GPU's context as this GPU's kernels reach them
  // (entry n: GPU n; magic 0 where there is no peer access).
  chi_status_t upload_peers(const std::vector<chi_dev_ctx_layout_t> &table);
  // Adds this GPU's device slots held now (bits set in both bitmaps, read
  // back from device memory) and in all to *in_use and *total.
  void device_slots(uint64_t *in_use, uint64_t *total);
  // Drains CPU->GPU tasks (bounded), stops kernel and pollers, frees memory.
  chi_status_t shutdown();

 private:
  chi_status_t allocate();
  // Parking (docs/gpu.md, "Parked GPUs").  States, all under mu_:
  //   running_ && !parked_: launched lease after lease (the lease thread);
  //   running_ && parked_: no launch queued and none until a CPU->GPU
  //     submit asks through park_ (the last launch may still be ending);
  //   !running_: paused, failed or shut down (parked_ is false).
  // The lease thread parks (park_due_locked) when it would queue a
  // successor; unpark_locked starts the GPU again, from the submitter that
  // won the ask (wake, when mu_ is free) or from the lease thread.
  bool park_due_locked();
  void unpark_locked();
  bool wake();
  static bool wake_cb(void *self) { return static_cast<GpuDevice *>(self)->wake(); }
  // behind: queued behind the running launch (the lease thread's successor).
  chi_status_t launch_locked(bool behind = false);
  chi_status_t pause_locked();
  chi_status_t resume_locked();
  // Writes the stop flag and clears the fault word.
  chi_status_t write_stop(uint32_t value);
  void release_memory();
  // The lease thread: relaunches the orchestrator each time its lease ends,
  // until pause (waits for resume) or shutdown.
  void lease_loop();
  // Until launch n's event completes (true, *err its status), `deadline`
  // (now_ns) passes or the thread must quit (false); sleeps between looks
  // until the bell thread says a launch ended.  `phase` (CHI_DIAG_PHASE_*)
  // is the lease thread's phase between its CUDA calls.
  bool wait_launch_end(uint64_t n, int64_t deadline, cudaError_t *err, int64_t look_ns, uint64_t phase);
  // The next launch's lease: idle_lease_ns while the pollers sleep on the
  // bell and no CPU->GPU task is in flight, else lease_ns.
  uint64_t next_lease() const;
  // The bell thread (with a lease): waits for each launch's end in the
  // driver (a blocking-sync event: it sleeps until the GPU's interrupt),
  // tells the lease thread, and wakes the parked pollers when the keeper
  // rang their bell (docs/gpu.md, "Idle GPU->CPU pollers").
  void bell_loop(std::shared_ptr<struct BellLife> life);
  // Whether the parked pollers may sleep on the bell now.
  void bell_live_locked();
  // The kernel or a launch failed: marks the GPU failed (broken_), logs why
  // (what, and the thread's last error), fails CPU->GPU submits and waits.
  void fail_locked(const char *what);
  // Where the lease thread is (diag words CHI_DIAG_LEASE_*), for watchdogs.
  void lease_phase(uint64_t phase, uint64_t n);
  // now_ns() when launch k started, from the device's own stamp (diag words).
  int64_t started_at(uint64_t k);  // the lease thread only (counts start_unstamped_)

  Runtime &rt_;
  const int32_t id_;
  const int ordinal_;
  const int32_t ngpus_;
  Shape shape_;
  cudaStream_t orch_stream_ = nullptr;  // the orchestrator's, non-blocking
  cudaStream_t ctl_stream_ = nullptr;   // control writes and uploads, non-blocking
  DeviceMemory mem_;
  cudaEvent_t ended_[2] = {nullptr, nullptr};  // recorded after launch i into ended_[i & 1]
  std::unique_ptr<H2dExecutor> exec_;
  std::unique_ptr<CpuPoller> poller_;
  std::mutex mu_;  // serializes pause/resume/set_orchestrator/regions/shutdown and every launch
  std::condition_variable lease_cv_;  // running_ became true, or lease_quit_
  std::thread lease_thread_;          // only with a lease (gpu.lease_us > 0)
  std::thread bell_thread_;           // with a lease too
  std::shared_ptr<struct BellLife> bell_life_;
  std::atomic<uint32_t> launch_seq_{0};  // futex: bumped by every launch, and at shutdown
  std::atomic<uint32_t> end_seq_{0};     // futex: bumped by the bell thread when a launch ended
  std::atomic<uint64_t> bell_rings_{0};  // rings the bell thread passed on (diagnostics)
  // The lease thread's timing (diagnostics, logged at shutdown at debug
  // level): successors queued, by how far ahead of their predecessor's lease
  // end (late, < 50 us, < 100 us, more), how late it woke for them (> 50 us),
  // and starts it could not read from the launch's stamp.
  uint64_t lease_ahead_[4] = {0, 0, 0, 0};
  uint64_t lease_woke_late_ = 0;
  uint64_t start_unstamped_ = 0;
  LeaseClock start_clock_;  // started_at's clock offset (the lease thread only)
  std::atomic<bool> lease_quit_{false};
  std::atomic<uint64_t> launches_{0};  // kernel launches so far
  int64_t launched_at_ = 0;            // now_ns() when the newest launch started, about
  uint64_t lease_of_[2] = {0, 0};      // lease of launch i in [i & 1], ns
  bool running_ = false;  // the orchestrator is on: launched, or about to be relaunched
  bool broken_ = false;  // the kernel faulted or would not stop: no more CUDA work
  std::string failure_;  // why, once broken_ by a failure
  bool shut_ = false;
  bool kernel_gone_ = true;  // false: the kernel would not stop, so its memory stays
  chi_gpu_launch_fn launcher_ = nullptr;
  ParkGate park_;
  uint64_t keep_alive_ns_ = 0;  // gpu.keep_alive_us (0: never parks)
  bool parked_ = false;
  bool held_awake_ = false;     // hold_awake() was called
  uint64_t quiet_tail_ = ~0ull;  // the CPU->GPU tail the lease thread last saw...
  int64_t quiet_since_ = 0;      // ... and since when (now_ns)
  std::atomic<uint64_t> parks_{0};
  std::atomic<uint64_t> ended_n_{0};  // launches 0..n-1 seen ended by the bell thread
  uint32_t region_count_ = 0;
};

}  // namespace chi::gpu

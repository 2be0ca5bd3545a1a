// The relay of a client process's kernels (core/client_gpu.h): the
// GPU->CPU layout of gpu/d2h_memory.h in the client's own CUDA context, a
// CpuPoller whose D2hRelay is this object, and a completion thread that
// writes the reply of each forwarded task when the server answers it.
#include "core/client_gpu.h"

#include <pthread.h>
#include <time.h>

#include <algorithm>
#include <cstdlib>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/futex.h"
#include "base/log.h"
#include "core/executor.h"
#include "core/mps.h"
#include "core/registry.h"
#include "core/runtime.h"
#include "gpu/cpu_poller.h"
#include "gpu/d2h_memory.h"
#include "gpu/gpu_device.h"
#include "gpu/kernels.h"

namespace chi {
namespace gpu {
namespace {

// How often the sweep thread looks for released slots whose reply came.
constexpr long kSweepEveryNs = 2000000;
// A client kernel's GPU->GPU submit at a closed gate gives up after twice
// this many of its orchestrator's leases with the lease thread unseen (a
// runtime's kernels: 2 leases).
constexpr uint32_t kClientGateLeases = 10;
// A completion thread with tasks out naps at most this long between scans.
constexpr int64_t kNapMaxNs = 50000;

void nap(int64_t ns) {
  timespec ts{time_t(ns / 1000000000), long(ns % 1000000000)};
  nanosleep(&ts, nullptr);
}

class RelayGpu final : public ClientGpu, public D2hRelay {
 public:
  RelayGpu(Upstream &client, Runtime &local, int32_t gpu, int32_t ngpus)
      : client_(client), local_(local), id_(gpu), ngpus_(ngpus) {}

  ~RelayGpu() override {
    // The client's orchestrator first: its kernel ends, and with it the
    // GPU->GPU tasks of the context (kernels that use it have ended).
    if (orch_) (void)orch_->shutdown();
    orch_.reset();
    if (poller_) poller_->stop();
    quit_.store(true);
    {
      std::lock_guard<std::mutex> lock(mu_);
      cv_.notify_all();
    }
    if (done_thread_.joinable()) done_thread_.join();
    if (sweep_thread_.joinable()) sweep_thread_.join();
    // Forwarded tasks nobody will read: their server slots are freed.
    for (const Pending &p : incoming_) (void)client_.release(p.slot, p.gen);
    for (const Pending &p : out_) (void)client_.release(p.slot, p.gen);
    poller_.reset();
    if (host_only_) {
      std::free(pinned_);
      std::free(dev_);
      return;
    }
    DeviceGuard guard(id_);
    if (dev_) (void)cudaFree(dev_);
    if (pinned_) (void)cudaFreeHost(pinned_);
    if (stream_) (void)cudaStreamDestroy(stream_);
    (void)cudaGetLastError();
  }

  chi_status_t start() {
    if (relay_host_memory()) return start_host_only();
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || id_ >= n) {
      (void)cudaGetLastError();
      return set_error(CHI_ERR_NO_DEVICE,
                       "GPU %d: this client process sees %d CUDA device(s); a client's GPU n is its "
                       "CUDA device n (the same CUDA_VISIBLE_DEVICES as the server)",
                       id_, n);
    }
    DeviceGuard guard(id_);
    int sms = 0;
    if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, id_); e != cudaSuccess)
      return cuda_error(CHI_ERR_NO_DEVICE, id_, "reading the SM count", e);
    shape_ = make_shape(local_.config(), sms);
    if (cudaError_t e = sweep_loadable(); e != cudaSuccess)
      return cuda_error(CHI_ERR_NO_DEVICE, id_, "loading the relay's kernel (no code for this GPU?)", e);
    if (cudaError_t e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); e != cudaSuccess)
      return cuda_error(CHI_ERR_INTERNAL, id_, "creating a stream", e);
    Carver hc, dc;
    D2hCarve c;
    carve_d2h(shape_, hc, dc, &c);
    const size_t staging = hc.take(64);  // d2h_released read back here
    if (cudaError_t e = cudaHostAlloc(reinterpret_cast<void **>(&pinned_), hc.size,
                                      cudaHostAllocPortable | cudaHostAllocMapped);
        e != cudaSuccess) {
      pinned_ = nullptr;
      return cuda_error(CHI_ERR_NOMEM, id_, "allocating pinned host memory", e);
    }
    std::memset(pinned_, 0, hc.size);
    released_copy_ = reinterpret_cast<uint32_t *>(pinned_ + staging);
    uint8_t *pdev = nullptr;
    if (cudaError_t e = cudaHostGetDevicePointer(reinterpret_cast<void **>(&pdev), pinned_, 0); e != cudaSuccess)
      return cuda_error(CHI_ERR_INTERNAL, id_, "mapping pinned memory", e);
    if (cudaError_t e = cudaMalloc(reinterpret_cast<void **>(&dev_), dc.size); e != cudaSuccess) {
      dev_ = nullptr;
      return cuda_error(CHI_ERR_NOMEM, id_, "allocating device memory", e);
    }
    cudaError_t e = cudaMemsetAsync(dev_, 0, dc.size, stream_);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream_);
    if (e != cudaSuccess) return cuda_error(CHI_ERR_INTERNAL, id_, "initializing device memory", e);
    mps_ = mps::control_answers(mps::pipe_directory());  // this process's contexts are MPS clients
    if (local_.config().gpu.client_orchestrator) start_orchestrator();
    run(c, pdev);
    sweep_thread_ = std::thread([this] { sweep_loop(); });
    log(LogLevel::kInfo,
        "GPU %d: client kernels' relay: %u device slots, %u pollers; %.1f MiB pinned, %.1f MiB device", id_,
        shape_.dslots, shape_.cpu_pollers, hc.size / 1048576.0, dc.size / 1048576.0);
    return CHI_OK;
  }

  // The client's own orchestrator on this GPU (gpu.client_orchestrator): a
  // runtime's GpuDevice on the client's local runtime, so that the context's
  // GPU->GPU built-ins run in this process's CUDA context beside its kernels
  // instead of crossing to the server's (time-sliced without MPS).  Held
  // awake: kernels may submit to it at any time.  If it cannot start, every
  // route goes through the relay as before, with a warning.
  void start_orchestrator() {
    auto d = std::make_unique<GpuDevice>(local_, id_, id_, ngpus_);
    if (chi_status_t s = d->start(); s != CHI_OK) {
      log(LogLevel::kWarn,
          "GPU %d: the client's own orchestrator did not start (%s): client kernels' GPU->GPU tasks "
          "cross to the server",
          id_, last_error());
      return;
    }
    const chi_dev_ctx_layout_t &o = d->layout();
    if (o.slots != shape_.dslots || o.max_payload != shape_.max_payload ||
        o.payload_stride != shape_.payload_stride) {
      log(LogLevel::kWarn, "GPU %d: the client's orchestrator has another shape than its relay; not used", id_);
      (void)d->shutdown();
      return;
    }
    d->hold_awake();
    orch_ = std::move(d);
  }

  // CHI_RELAY_HOST_MEMORY=1 (tests only): the same relay over plain host
  // memory, no CUDA call at all, so that a test without a GPU plays the
  // kernel's part on the ring (tests/test_client_relay.cpp).  No kernel can
  // use such a context; released slots are never swept.
  chi_status_t start_host_only() {
    host_only_ = true;
    shape_ = make_shape(local_.config(), 1024);  // no GPU to size for: the sizes of the configuration
    Carver hc, dc;
    D2hCarve c;
    carve_d2h(shape_, hc, dc, &c);
    pinned_ = static_cast<uint8_t *>(std::aligned_alloc(4096, (hc.size + 4095) & ~size_t(4095)));
    dev_ = static_cast<uint8_t *>(std::aligned_alloc(4096, (dc.size + 4095) & ~size_t(4095)));
    if (!pinned_ || !dev_) return set_error(CHI_ERR_NOMEM, "GPU %d: relay memory", id_);
    std::memset(pinned_, 0, hc.size);
    std::memset(dev_, 0, dc.size);
    run(c, pinned_);
    return CHI_OK;
  }

  // Fills the context and starts the pollers and the completion thread.
  void run(const D2hCarve &c, uint8_t *pinned_dev) {
    std::memset(&layout_, 0, sizeof layout_);
    fill_d2h_layout(shape_, c, pinned_dev, dev_, id_, ngpus_, &layout_);
    layout_.flags = CHI_DEV_CTX_RELAY;
    layout_.lease_us = 0;  // no orchestrator here: nothing steps aside
    if (orch_) {
      // GPU->GPU built-ins to the client's orchestrator (CHI_DEV_CTX_CLIENT_ORCH):
      // its slots, gate, lease and diagnostics; its wait line too, whose
      // GPU->CPU half ([16..17]) the relay's ring then shares with the
      // orchestrator's own GPU->CPU slots (a line of waiting submitters
      // only: an order, never a slot).
      const chi_dev_ctx_layout_t &o = orch_->layout();
      layout_.d2d_slots = o.d2d_slots;
      layout_.d2d_state = o.d2d_state;
      layout_.d2d_bitmap = o.d2d_bitmap;
      layout_.d2d_bell = o.d2d_bell;
      layout_.d2d_seen = o.d2d_seen;
      layout_.gate = o.gate;
      layout_.wait_line = o.wait_line;
      layout_.diag = o.diag;
      // Device code reads lease_us only for how long a submit waits at a
      // closed gate with the lease thread unseen (gate_wait: two leases).  A
      // client's orchestrator shares the GPU and the CPUs with other
      // processes (the server's orchestrator, other clients': time slices
      // of about 2 ms each without MPS), so its kernels wait longer before
      // CHI_ERR_AGAIN: kClientGateLeases leases.
      layout_.lease_us = o.lease_us * kClientGateLeases;
      layout_.d2d_workers = o.d2d_workers;
      layout_.d2d_first_worker = o.d2d_first_worker;
      layout_.flags |= CHI_DEV_CTX_CLIENT_ORCH;
    }
    const bool bufs = shape_.max_payload > CHI_DEV_LL_INLINE;
    poller_ = std::make_unique<CpuPoller>(local_, id_, shape_, reinterpret_cast<uint64_t *>(pinned_ + c.ring),
                                          reinterpret_cast<uint64_t *>(pinned_ + c.reply),
                                          bufs ? pinned_ + c.buf : nullptr, nullptr, this);
    done_thread_ = std::thread([this] { complete_loop(); });
    poller_->start();
  }

  void context(chi_dev_context_t *ctx) const override {
    std::memset(ctx, 0, sizeof *ctx);
    std::memcpy(ctx, &layout_, sizeof layout_);
  }

  bool take(chi_route_t route, chi_method_t method, const void *input, uint32_t size, uint32_t slot,
            uint32_t gen, chi_status_t *status, void *out, size_t *osize) override {
    *osize = 0;
    if (route < CHI_ROUTE_LOCAL || route > CHI_DEV_ROUTE_MAX) {
      *status = CHI_ERR_PROTOCOL;  // device code never writes this
      return false;
    }
    if (method & kLocalMethodBit) {
      // The client's own handler: CPU only, run here as a runtime's poller would.
      if (route != CHI_ROUTE_CPU) {
        *status = CHI_ERR_NOT_FOUND;
        return false;
      }
      *status = run_cpu_handler(local_.registry(), method & ~kLocalMethodBit, id_, input, size, out,
                                shape_.max_payload, osize);
      return false;
    }
    // LOCAL from a kernel is its own GPU's orchestrator: the server's GPU id.
    const chi_route_t to = route == CHI_ROUTE_LOCAL ? id_ : route;
    if (to != CHI_ROUTE_CPU) note_crossing(method);
    chi_future_t f = 0;
    if (chi_status_t s = client_.submit(to, method, input, size, &f); s != CHI_OK) {
      *status = s;
      return false;
    }
    FutureParts p{};
    decode_future(f, &p);
    {
      std::lock_guard<std::mutex> lock(mu_);
      incoming_.push_back(Pending{p.slot, p.gen, slot, gen});
      incoming_n_.store(incoming_.size(), std::memory_order_release);
      if (idle_) cv_.notify_one();
    }
    return true;
  }

 private:
  // A task for the server's orchestrator: without MPS the GPU time-slices
  // this process's context against the server's while this process's
  // kernels run, so say once per process what that costs and what avoids it.
  void note_crossing(chi_method_t method) {
    static std::atomic<bool> said{false};
    if (mps_ || said.load(std::memory_order_relaxed) || said.exchange(true)) return;  // a load per task, an RMW once
    log(LogLevel::kWarn,
        "GPU %d: a client kernel's task (method %u) runs on the server's orchestrator, in another CUDA "
        "context: without MPS the GPU time-slices the two while this process's kernels run (about 4.5 ms a "
        "round trip on an H200). Built-ins run on this process's own orchestrator (gpu.client_orchestrator%s); "
        "for the server's module GPU methods, run MPS (server.mps: true in the server's configuration, or "
        "scripts/mps.sh) before this process initializes CUDA",
        id_, unsigned(method), orch_ ? "" : ": off or not started");
  }

  struct Pending {
    uint32_t slot, gen;          // the client's future
    uint32_t dev_slot, dev_gen;  // the device task it answers
  };

  // Answers forwarded tasks as their results come, in any order; a server
  // found gone answers every one CHI_ERR_DISCONNECTED (checked every
  // disconnect_check_ms while tasks are out).
  void complete_loop() {
    pthread_setname_np(pthread_self(), "chi-relay-done");
    std::vector<unsigned char> out(shape_.payload_stride);
    const int64_t spin_ns = std::thread::hardware_concurrency() >= 4 ? local_.config().spin_ns : 0;
    const int64_t check_ns = int64_t(local_.config().disconnect_check_ms) * 1000000;
    int64_t last_progress = now_ns(), nap_ns = 0;
    while (!quit_.load(std::memory_order_acquire)) {
      if (out_.empty() && incoming_n_.load(std::memory_order_acquire) == 0) {
        // A kernel's next task tends to follow at once: spin a while before
        // sleeping (a futex wake-up would add to every round trip).
        const int64_t t0 = now_ns();
        while (incoming_n_.load(std::memory_order_acquire) == 0 && now_ns() - t0 < spin_ns &&
               !quit_.load(std::memory_order_relaxed))
          cpu_relax();
      }
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (out_.empty() && incoming_.empty()) {
          idle_ = true;
          cv_.wait_for(lock, std::chrono::milliseconds(100));
          idle_ = false;
          last_progress = now_ns();
          nap_ns = 0;
        }
        out_.insert(out_.end(), incoming_.begin(), incoming_.end());
        incoming_.clear();
        incoming_n_.store(0, std::memory_order_relaxed);
      }
      bool progress = false;
      for (size_t i = 0; i < out_.size();) {
        const Pending p = out_[i];
        if (!client_.finished(p.slot, p.gen)) {
          ++i;
          continue;
        }
        size_t n = 0;
        chi_status_t s = client_.wait(p.slot, p.gen, 0, out.data(), shape_.max_payload, &n);
        if (s == CHI_ERR_TIMEOUT) {  // not claimable yet (a torn look): next pass
          ++i;
          continue;
        }
        if (s == CHI_ERR_TOO_LARGE) (void)client_.release(p.slot, p.gen);
        if (s == CHI_ERR_TOO_LARGE || n > shape_.max_payload) n = 0;
        poller_->reply(p.dev_slot, p.dev_gen, s, out.data(), n);
        out_[i] = out_.back();
        out_.pop_back();
        progress = true;
      }
      const int64_t now = now_ns();
      if (progress || out_.empty()) {
        last_progress = now;
        nap_ns = 0;
        continue;
      }
      if (now - last_progress >= check_ns) {
        // One look at the session (a system call on shm): gone means every task out is lost.
        int done = 0;
        last_progress = now;
        if (client_.test(out_.front().slot, out_.front().gen, &done) == CHI_ERR_DISCONNECTED) {
          for (const Pending &p : out_) {
            (void)client_.release(p.slot, p.gen);
            poller_->reply(p.dev_slot, p.dev_gen, CHI_ERR_DISCONNECTED, nullptr, 0);
          }
          out_.clear();
          continue;
        }
      }
      if (now - last_progress < spin_ns) {
        cpu_relax();
        continue;
      }
      nap_ns = std::min<int64_t>(kNapMaxNs, nap_ns ? nap_ns * 2 : 1000);
      nap(nap_ns);
    }
  }

  // chi_dev_release of a GPU->CPU future whose reply had not come leaves the
  // slot to a sweep (the orchestrator's job in a runtime): while any is
  // counted, a one-warp kernel frees those whose reply came since.
  void sweep_loop() {
    pthread_setname_np(pthread_self(), "chi-relay-sweep");
    DeviceGuard guard(id_);
    while (!quit_.load(std::memory_order_acquire)) {
      nap(kSweepEveryNs);
      cudaError_t e = cudaMemcpyAsync(released_copy_, layout_.d2h_released, sizeof(uint32_t),
                                      cudaMemcpyDeviceToHost, stream_);
      if (e == cudaSuccess) e = cudaStreamSynchronize(stream_);
      if (e == cudaSuccess && *released_copy_ != 0) {
        chi_dev_context_t ctx;
        context(&ctx);
        e = launch_sweep_released(ctx, stream_);
        if (e == cudaSuccess) e = cudaStreamSynchronize(stream_);
      }
      if (e != cudaSuccess) {
        log(LogLevel::kError, "GPU %d: client relay's sweep: %s; released device slots stay taken", id_,
            cudaGetErrorString(e));
        return;
      }
    }
  }

  Upstream &client_;  // the session the tasks are forwarded over
  Runtime &local_;
  const int32_t id_;
  const int32_t ngpus_;
  Shape shape_;
  cudaStream_t stream_ = nullptr;
  uint8_t *pinned_ = nullptr;
  uint8_t *dev_ = nullptr;
  uint32_t *released_copy_ = nullptr;  // pinned
  bool host_only_ = false;             // start_host_only: malloc'd, no CUDA
  chi_dev_ctx_layout_t layout_{};
  std::unique_ptr<CpuPoller> poller_;
  std::unique_ptr<GpuDevice> orch_;  // the client's own orchestrator, or none
  bool mps_ = false;                  // an MPS daemon answered when the relay started
  std::atomic<bool> quit_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool idle_ = false;               // under mu_: the completion thread waits on cv_
  std::vector<Pending> incoming_;   // under mu_: taken by pollers, not yet seen
  std::atomic<size_t> incoming_n_{0};  // its size, for the completion thread's spin
  std::vector<Pending> out_;        // the completion thread's own
  std::thread done_thread_;
  std::thread sweep_thread_;
};

}  // namespace
}  // namespace gpu

bool relay_host_memory() {
  const char *e = std::getenv("CHI_RELAY_HOST_MEMORY");
  return e && std::strcmp(e, "1") == 0;
}

chi_status_t create_client_gpu(Upstream &client, Runtime &local, int32_t gpu, int32_t ngpus,
                               std::unique_ptr<ClientGpu> *out) {
  out->reset();
  auto r = std::make_unique<gpu::RelayGpu>(client, local, gpu, ngpus);
  if (chi_status_t s = r->start(); s != CHI_OK) return s;
  *out = std::move(r);
  return CHI_OK;
}

chi_status_t export_gpu_mem(int32_t gpu, const void *ptr, size_t size, void *handle, size_t handle_size,
                            uint64_t *offset) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || gpu >= n) {
    (void)cudaGetLastError();
    return set_error(CHI_ERR_NO_DEVICE, "GPU %d: this client process sees %d CUDA device(s)", gpu, n);
  }
  gpu::DeviceGuard guard(gpu);
  cudaPointerAttributes a;
  std::memset(&a, 0, sizeof a);
  if (cudaError_t e = cudaPointerGetAttributes(&a, ptr); e != cudaSuccess) {
    (void)cudaGetLastError();
    return set_error(CHI_ERR_INVALID, "GPU %d: %p is not memory the CUDA runtime knows (%s)", gpu, ptr,
                     cudaGetErrorString(e));
  }
  if (CHI_POINTER_TYPE(a) != cudaMemoryTypeDevice || a.device != gpu)
    return set_error(CHI_ERR_INVALID, "GPU %d: %p is not device memory of CUDA device %d", gpu, ptr, gpu);
  uintptr_t base = 0;
  size_t len = 0;
  if (!gpu::allocation_range(ptr, &base, &len))
    return set_error(CHI_ERR_INVALID, "GPU %d: the allocation holding %p is unknown", gpu, ptr);
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  if (p - base > len || size > len - (p - base))
    return set_error(CHI_ERR_INVALID, "GPU %d: %zu bytes at %p run past the end of their allocation", gpu, size, ptr);
  cudaIpcMemHandle_t h;
  if (handle_size < sizeof h) return set_error(CHI_ERR_INTERNAL, "IPC handle buffer too small");
  if (cudaError_t e = cudaIpcGetMemHandle(&h, reinterpret_cast<void *>(base)); e != cudaSuccess) {
    (void)cudaGetLastError();
    return set_error(CHI_ERR_INVALID, "GPU %d: no IPC handle for %p (%s; memory from cudaMalloc only)", gpu, ptr,
                     cudaGetErrorString(e));
  }
  std::memset(handle, 0, handle_size);
  std::memcpy(handle, &h, sizeof h);
  *offset = p - base;
  return CHI_OK;
}

}  // namespace chi

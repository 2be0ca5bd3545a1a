// The CUDA (or HIP) GpuSystem: one GpuDevice per usable GPU, plus what spans
// GPUs: user orchestrators' method names and the region table.
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "base/error.h"
#include "core/gpu_system.h"
#include "core/mps.h"
#include "base/log.h"
#include "core/registry.h"
#include "core/runtime.h"
#include "gpu/gpu_device.h"
#include "gpu/kernels.h"

namespace chi {

namespace gpu {
namespace {

class DeviceGpuSystem final : public GpuSystem {
 public:
  explicit DeviceGpuSystem(Runtime &rt) : rt_(rt) {}
  ~DeviceGpuSystem() override { shutdown(); }

  // ngpus: how many GPUs this system will drive (device code's CHI_ROUTE_GPU bound).
  chi_status_t add(int ordinal, int32_t ngpus) {
    auto d = std::make_unique<GpuDevice>(rt_, int32_t(devs_.size()), ordinal, ngpus);
    if (chi_status_t s = d->start(); s != CHI_OK) return s;
    devs_.push_back(std::move(d));
    return CHI_OK;
  }

  int32_t count() const override { return int32_t(devs_.size()); }
  Executor *executor(int32_t gpu) override { return devs_[gpu]->executor(); }

  // GPU->GPU across GPUs (docs/gpu.md, "GPU->GPU across GPUs"): peer access
  // between every pair that has it, and each GPU's table of the others'
  // contexts.  A pair without it gets CHI_ERR_NO_DEVICE from device code.
  chi_status_t connect_peers() {
    const size_t n = devs_.size();
    if (n < 2) return CHI_OK;
    for (size_t i = 0; i < n; ++i) {
      std::vector<chi_dev_ctx_layout_t> table(n);
      std::memset(table.data(), 0, n * sizeof(chi_dev_ctx_layout_t));
      for (size_t j = 0; j < n; ++j) {
        bool reach = i == j;
        if (!reach) {
          int can = 0;
          DeviceGuard guard(devs_[i]->ordinal());
          if (cudaDeviceCanAccessPeer(&can, devs_[i]->ordinal(), devs_[j]->ordinal()) == cudaSuccess && can) {
            const cudaError_t e = cudaDeviceEnablePeerAccess(devs_[j]->ordinal(), 0);
            reach = e == cudaSuccess || e == cudaErrorPeerAccessAlreadyEnabled;
          }
          (void)cudaGetLastError();
          if (!reach)
            log(LogLevel::kWarn, "GPU %zu cannot reach GPU %zu's memory (no peer access): device code on it "
                "gets CHI_ERR_NO_DEVICE for CHI_ROUTE_GPU(%zu)", i, j, j);
        }
        if (!reach) continue;
        table[j] = devs_[j]->layout();
        table[j].flags = 0;  // never the orchestrator's: a handler on GPU i serves no bell of GPU j
      }
      if (chi_status_t s = devs_[i]->upload_peers(table); s != CHI_OK) return s;
    }
    return CHI_OK;
  }

  chi_status_t context(int32_t gpu, chi_dev_context_t *ctx) override {
    if (!ctx) return set_error(CHI_ERR_INVALID, "ctx is NULL");
    // Kernels may now submit to this GPU's device routes at any time (and,
    // with gpu.peer_routes, to every other GPU's): they park no more
    // (docs/gpu.md, "Parked GPUs").
    if (rt_.config().gpu.peer_routes)
      for (auto &d : devs_) d->hold_awake();
    else
      devs_[gpu]->hold_awake();
    devs_[gpu]->context(ctx);
    return CHI_OK;
  }

  chi_status_t pause(int32_t gpu) override {
    return each(gpu, [](GpuDevice &d) { return d.pause(); });
  }
  chi_status_t resume(int32_t gpu) override {
    return each(gpu, [](GpuDevice &d) { return d.resume(); });
  }

  const char *orchestrator_state(int32_t gpu, uint64_t *launches, uint64_t *parks) override {
    return devs_[gpu]->orchestrator_state(launches, parks);
  }

  chi_status_t pause_running(std::vector<int32_t> *paused) override {
    paused->clear();
    for (auto &d : devs_) {
      bool was = false;
      if (chi_status_t s = d->pause_if_running(&was); s != CHI_OK) {
        for (int32_t g : *paused) (void)devs_[g]->resume();
        paused->clear();
        return s;
      }
      if (was) paused->push_back(d->id());
    }
    return CHI_OK;
  }

  chi_status_t set_orchestrator(int32_t gpu, const chi_gpu_orchestrator_t *orch) override {
    if (!orch || !orch->launch) return set_error(CHI_ERR_INVALID, "orchestrator launch function is NULL");
    if (orch->method_count && !orch->method_names)
      return set_error(CHI_ERR_INVALID, "orchestrator has %u methods but no names", orch->method_count);
    if (orch->method_count >= kMaxMethods)
      return set_error(CHI_ERR_INVALID, "orchestrator has %u methods (at most %u)", orch->method_count,
                       kMaxMethods - 1);
    std::lock_guard<std::mutex> lock(orch_mu_);
    Registry &reg = rt_.registry();
    // Check every name before registering any, so a refusal changes nothing.
    std::set<std::string> seen;
    for (uint32_t i = 0; i < orch->method_count; ++i) {
      const char *name = orch->method_names[i];
      if (chi_status_t s = check_method_name(name); s != CHI_OK) return s;
      if (!seen.insert(name).second)
        return set_error(CHI_ERR_INVALID, "orchestrator lists method '%s' twice", name);
      chi_method_t id;
      if (reg.lookup(name, &id) == CHI_OK && reg.get(id)->gpu.load() && !ours_.count(id))
        return set_error(CHI_ERR_INVALID, "method '%s' is already a GPU method", name);
    }
    clear_error();
    std::vector<int32_t> dispatch(kMaxMethods, -1);
    for (uint32_t i = 0; i < orch->method_count; ++i) {
      const char *name = orch->method_names[i];
      chi_method_t id;
      // A name an earlier user orchestrator registered keeps its id.
      if (reg.lookup(name, &id) != CHI_OK || !reg.get(id)->gpu.load()) {
        if (chi_status_t s = reg.add_gpu(name, &id); s != CHI_OK) return s;
      }
      ours_.insert(id);
      dispatch[id] = int32_t(i);
    }
    clear_error();
    return each(gpu, [&](GpuDevice &d) { return d.set_orchestrator(orch->launch, dispatch); });
  }

  chi_status_t check_device_pointer(int32_t gpu, const void *ptr, size_t size) override {
    return devs_[gpu]->check_pointer(ptr, size);
  }

  chi_status_t open_ipc_mem(int32_t gpu, const void *handle, size_t handle_size, void **base,
                            size_t *length) override {
    if (gpu < 0 || gpu >= count()) return set_error(CHI_ERR_INVALID, "GPU %d out of range", gpu);
    cudaIpcMemHandle_t h;
    static_assert(sizeof h <= 64, "an IPC handle fits the message");
    if (handle_size < sizeof h) return set_error(CHI_ERR_INVALID, "IPC handle of %zu bytes", handle_size);
    std::memcpy(&h, handle, sizeof h);
    DeviceGuard guard(devs_[gpu]->ordinal());
    void *p = nullptr;
    if (cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess); e != cudaSuccess) {
      (void)cudaGetLastError();
      return set_error(CHI_ERR_INVALID, "GPU %d: the client's memory handle does not open here: %s", gpu,
                       cudaGetErrorString(e));
    }
    uintptr_t b = 0;
    size_t len = 0;
    // The handle names a whole allocation, mapped at p: its length bounds every region.
    if (!allocation_range(p, &b, &len) || b != reinterpret_cast<uintptr_t>(p)) {
      (void)cudaIpcCloseMemHandle(p);
      return set_error(CHI_ERR_INVALID, "GPU %d: the size of the client's allocation is unknown", gpu);
    }
    *base = p;
    *length = len;
    return CHI_OK;
  }

  void close_ipc_mem(int32_t gpu, void *base) override {
    DeviceGuard guard(devs_[gpu]->ordinal());
    if (cudaIpcCloseMemHandle(base) != cudaSuccess) (void)cudaGetLastError();
  }

  chi_status_t regions_changed() override {
    // The snapshot is taken under the lock: the last upload always holds
    // every registration that finished before it.
    std::lock_guard<std::mutex> lock(regions_mu_);
    std::vector<Region> snap = rt_.regions().snapshot();
    return each(-1, [&](GpuDevice &d) { return d.upload_regions(snap); });
  }

  bool mps_active(std::string *where) const override {
    *where = mps_dir_;
    return mps_;
  }
  void set_mps(bool on, const std::string &dir) {
    mps_ = on;
    mps_dir_ = dir;
  }

  void device_slots(uint64_t *in_use, uint64_t *total) override {
    *in_use = *total = 0;
    for (auto &d : devs_) d->device_slots(in_use, total);
  }

  chi_status_t shutdown() override {
    return each(-1, [](GpuDevice &d) { return d.shutdown(); });
  }

 private:
  bool mps_ = false;
  std::string mps_dir_;
  // Runs f on one GPU or (gpu == -1) on all; returns the first failure.
  template <class F>
  chi_status_t each(int32_t gpu, F f) {
    if (gpu >= 0) return f(*devs_[gpu]);
    chi_status_t first = CHI_OK;
    std::string why;
    for (auto &d : devs_) {
      chi_status_t s = f(*d);
      if (s != CHI_OK && first == CHI_OK) {
        first = s;
        why = last_error();
      }
    }
    if (first != CHI_OK) set_error(first, "%s", why.c_str());
    return first;
  }

  Runtime &rt_;
  std::vector<std::unique_ptr<GpuDevice>> devs_;
  std::mutex orch_mu_;
  std::set<chi_method_t> ours_;  // GPU methods registered by user orchestrators
  std::mutex regions_mu_;
};

// Why a CUDA device cannot host an orchestrator, or nullptr if it can.
const char *unusable(int ordinal, std::string *detail) {
  DeviceGuard guard(ordinal);
  int major = 0, uva = 0;
  (void)cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ordinal);
  (void)cudaDeviceGetAttribute(&uva, cudaDevAttrUnifiedAddressing, ordinal);
  if (major < 7) return "compute capability below 7.0 (no independent thread scheduling)";
  if (!uva) return "no unified addressing";
  if (cudaError_t e = builtin_loadable(); e != cudaSuccess) {
    (void)cudaGetLastError();
    *detail = cudaGetErrorString(e);
    return "this build has no code for it (see CHI_CUDA_ARCHITECTURES)";
  }
  return nullptr;
}

// Warns when kernels still load lazily (CUDA was initialized before chi_init
// without CUDA_MODULE_LOADING=EAGER) and the orchestrator has no lease
// (gpu.lease_us: 0): see docs/gpu.md.
void warn_if_lazy_loading() {
#if !CHI_HAVE_HIP
  using mode_fn = int (*)(int *);
  void *fn = nullptr;
  cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion("cuModuleGetLoadingMode", &fn, 12000, cudaEnableDefault,
                                       &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess || !fn) {
    (void)cudaGetLastError();
    return;
  }
  int mode = 0;
  constexpr int kLazy = 2;  // CU_MODULE_LAZY_LOADING
  if (reinterpret_cast<mode_fn>(fn)(&mode) == 0 && mode == kLazy)
    log(LogLevel::kWarn,
        "CUDA loads modules lazily and gpu.lease_us is 0: the first launch of a kernel while "
        "the persistent orchestrator runs can hang; set CUDA_MODULE_LOADING=EAGER before the "
        "process's first CUDA call, launch each kernel once before chi_init, or keep a lease "
        "(docs/gpu.md)");
#endif
}

}  // namespace
}  // namespace gpu

chi_status_t create_gpu_system(Runtime &rt, const Config &cfg, std::unique_ptr<GpuSystem> *out) {
  out->reset();
  if (cfg.gpu.devices == 0) return CHI_OK;
  // Lazy module loading (CUDA's default) loads a kernel at its first launch,
  // and that may wait for every running kernel: with a leased orchestrator
  // about one lease, with a persistent one (gpu.lease_us: 0) forever.  For
  // the latter eager loading avoids it; it only takes effect if CUDA is not
  // initialized yet, and an explicit choice is kept.
  if (cfg.gpu.lease_us == 0) setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  int n = 0;
  // Without a driver this fails (cudart loads libcuda lazily): no GPU, not an error.
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n <= 0) {
    (void)cudaGetLastError();
    const char *why = e != cudaSuccess ? cudaGetErrorString(e) : "no device";
    if (cfg.gpu.devices > 0)
      return set_error(CHI_ERR_NO_DEVICE, "%d GPU(s) requested but none is usable: %s",
                       cfg.gpu.devices, why);
    log(LogLevel::kInfo, "no usable GPU (%s): GPU routes answer CHI_ERR_NO_DEVICE", why);
    return CHI_OK;
  }
  std::vector<int> use;
  for (int d = 0; d < n && (cfg.gpu.devices < 0 || int(use.size()) < cfg.gpu.devices); ++d) {
    std::string detail;
    if (const char *why = gpu::unusable(d, &detail)) {
      log(LogLevel::kWarn, "CUDA device %d skipped: %s%s%s", d, why, detail.empty() ? "" : ": ",
          detail.c_str());
      continue;
    }
    use.push_back(d);
  }
  if (cfg.gpu.devices > 0 && int(use.size()) < cfg.gpu.devices)
    return set_error(CHI_ERR_NO_DEVICE, "%d GPU(s) requested but %zu usable", cfg.gpu.devices,
                     use.size());
  if (use.empty()) return CHI_OK;
  if (cfg.gpu.lease_us == 0) gpu::warn_if_lazy_loading();
  auto sys = std::make_unique<gpu::DeviceGpuSystem>(rt);
  const std::string mps_dir = mps::pipe_directory();
  const bool mps = mps::control_answers(mps_dir);
  sys->set_mps(mps, mps_dir);
  log(LogLevel::kInfo, "MPS %s (control pipe directory %s)", mps ? "active" : "not active",
      mps_dir.c_str());
  for (int d : use)
    if (chi_status_t s = sys->add(d, int32_t(use.size())); s != CHI_OK) return s;
  if (cfg.gpu.peer_routes)
    if (chi_status_t s = sys->connect_peers(); s != CHI_OK) return s;
  *out = std::move(sys);
  return CHI_OK;
}

}  // namespace chi

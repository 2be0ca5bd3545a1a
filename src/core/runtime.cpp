#include "core/runtime.h"

#include <dlfcn.h>
#include <unistd.h>

#include <bitset>
#include <cstring>
#include <mutex>
#include <thread>

#include "base/error.h"
#include "base/futex.h"
#include "base/log.h"
#include "chimaera/config.h"
#include "core/mps.h"

namespace chi {

namespace {

// Tags of the live runtimes of this process: each gets one no other live
// runtime has (while fewer than 256 live at once), so a future handed to the
// wrong runtime is always refused.
std::mutex g_tags_mu;
std::bitset<256> g_tags_used;
uint32_t g_tag_next = uint32_t(getpid());

}  // namespace

uint32_t acquire_tag() {
  std::lock_guard<std::mutex> lock(g_tags_mu);
  for (uint32_t k = 0; k < 256; ++k) {
    uint32_t t = (g_tag_next + k) & 0xFFu;
    if (!g_tags_used.test(t)) {
      g_tags_used.set(t);
      g_tag_next = t + 1;
      return t;
    }
  }
  return g_tag_next++ & 0xFFu;  // 256 live runtimes: share a tag
}

void release_tag(uint32_t tag) {
  std::lock_guard<std::mutex> lock(g_tags_mu);
  g_tags_used.reset(tag & 0xFFu);
}

Runtime::Runtime(Config cfg) : cfg_(std::move(cfg)), tag_(acquire_tag()) {
  if (cfg_.workers == 0) cfg_.workers = std::max(2u, std::thread::hardware_concurrency());
}

Runtime::~Runtime() {
  shutdown();
  release_tag(tag_);
}

chi_status_t Runtime::start() {
  set_log_level(cfg_.log_level);
  register_builtins(registry_);
  cpu_ = std::make_unique<CpuExecutor>(cfg_, registry_, stats_[CHI_STATS_CPU]);
  if (chi_status_t s = cpu_->start(); s != CHI_OK) return s;
#if CHI_HAVE_CUDA
  // server.mps: this user's MPS daemon before the first CUDA context, so
  // that the GPUs' contexts are its clients (docs/server.md).
  if (cfg_.server.mps && cfg_.gpu.devices != 0) {
    auto d = std::make_unique<mps::Daemon>();
    if (chi_status_t s = d->join(); s != CHI_OK) return s;
    mps_ = std::move(d);
  }
#else
  if (cfg_.server.mps) log(LogLevel::kWarn, "server.mps: this build of chimaera has no CUDA backend; ignored");
#endif
  if (chi_status_t s = create_gpu_system(*this, cfg_, &gpu_); s != CHI_OK) return s;
  log(LogLevel::kInfo, "runtime up: %u workers, %u slots, %u-byte payloads, %d GPU(s)",
      cfg_.workers, cfg_.queue_depth, cfg_.max_inline_payload, gpu_ ? gpu_->count() : 0);
  return CHI_OK;
}

chi_status_t Runtime::shutdown() {
  if (stopping_.exchange(true, std::memory_order_acq_rel)) return CHI_OK;
  chi_status_t status = CHI_OK;
  if (gpu_) status = gpu_->shutdown();
  // CPU workers last: GPU pollers may still have run CPU handlers until now.
  if (cpu_) cpu_->shutdown();
  gpu_.reset();
  mps_.reset();  // leaves the daemon (stopped by the last chimaera process out, if one started it)
  for (void *m : modules_) dlclose(m);
  modules_.clear();
  return status;
}

void Runtime::read_stats(chi_stats_t *out) {
  std::memset(out, 0, sizeof *out);
  out->struct_size = sizeof *out;
  for (int r = 0; r < CHI_STATS_ROUTES; ++r) stats_[r].read(&out->routes[r]);
  out->workers = cfg_.workers;
  out->clients = clients_.load(std::memory_order_relaxed);
  out->tasks_cancelled = client_cancelled_.load(std::memory_order_relaxed);
  out->gpus = gpu_ ? gpu_->count() : 0;
  if (cpu_) {
    out->slots_in_use = cpu_->slots_in_use();
    out->slots_total = cpu_->slot_count();
  }
  if (gpu_) {
    gpu_->device_slots(&out->device_slots_in_use, &out->device_slots_total);
    for (int32_t g = 0; g < gpu_->count(); ++g) {
      uint64_t launches = 0, parks = 0;
      const char *state = gpu_->orchestrator_state(g, &launches, &parks);
      if (g < 64 && std::strcmp(state, "parked") == 0) out->gpus_parked |= uint64_t(1) << g;
      out->gpu_launches += launches;
      out->gpu_parks += parks;
    }
  }
}

Executor *Runtime::pool(uint32_t pool) {
  if (pool == kCpuPool) return cpu_.get();
  if (gpu_ && pool >= 1 && int64_t(pool) - 1 < gpu_->count()) return gpu_->executor(pool - 1);
  return nullptr;
}

chi_status_t Runtime::route_executor(chi_route_t route, Executor **exec, uint32_t *pool) {
  if (route == CHI_ROUTE_CPU || route == CHI_ROUTE_LOCAL) {
    *exec = cpu_.get();
    *pool = kCpuPool;
    return CHI_OK;
  }
  if (route < CHI_ROUTE_LOCAL) return set_error(CHI_ERR_INVALID, "unknown route %d", route);
  int32_t n = gpu_ ? gpu_->count() : 0;
  if (n == 0) return set_error(CHI_ERR_NO_DEVICE, "route %d needs a GPU and this runtime has none", route);
  int32_t g = route;
  if (route == CHI_ROUTE_GPU_ANY) {
    g = int32_t(next_gpu_.fetch_add(1, std::memory_order_relaxed) % uint32_t(n));
  } else if (route >= n) {
    return set_error(CHI_ERR_INVALID, "GPU %d out of range: this runtime drives %d GPU(s)", route, n);
  }
  *exec = gpu_->executor(g);
  *pool = uint32_t(g) + 1;
  return CHI_OK;
}

}  // namespace chi

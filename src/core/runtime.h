// The engine behind chi_runtime_t: configuration, methods, memory regions,
// the CPU pool and the optional GPU system.  Only src/api touches it from C.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "config/config.h"
#include "core/cpu_executor.h"
#include "core/gpu_system.h"
#include "core/memory_regions.h"
#include "core/registry.h"
#include "core/stats.h"

namespace chi {

namespace mps {
class Daemon;
}

class Runtime {
 public:
  explicit Runtime(Config cfg);
  ~Runtime();
  chi_status_t start();
  chi_status_t shutdown();

  // The executor behind a future's pool number, or nullptr.
  Executor *pool(uint32_t pool);
  // The executor for a submit route, with the status for a bad route.
  chi_status_t route_executor(chi_route_t route, Executor **exec, uint32_t *pool);

  const Config &config() const { return cfg_; }
  Registry &registry() { return registry_; }
  MemoryRegions &regions() { return regions_; }
  GpuSystem *gpu() { return gpu_.get(); }
  // The MPS daemon this runtime joined for server.mps, or nullptr.
  const mps::Daemon *mps() const { return mps_.get(); }
  CpuExecutor &cpu() { return *cpu_; }
  uint32_t tag() const { return tag_; }
  bool stopping() const { return stopping_.load(std::memory_order_acquire); }
  RouteStats &stats(int route) { return stats_[route]; }
  void read_stats(chi_stats_t *out);
  // Live client sessions of this runtime's servers (chi_stats).
  std::atomic<uint32_t> &client_count() { return clients_; }
  // Client tasks dropped unstarted because their client left (chi_stats).
  std::atomic<uint64_t> &client_cancelled() { return client_cancelled_; }
  std::mutex &modules_mutex() { return modules_mu_; }
  std::vector<void *> &modules() { return modules_; }

 private:
  Config cfg_;
  Registry registry_;
  MemoryRegions regions_;
  std::unique_ptr<CpuExecutor> cpu_;
  std::unique_ptr<GpuSystem> gpu_;
  std::unique_ptr<mps::Daemon> mps_;
  uint32_t tag_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint32_t> next_gpu_{0};
  std::atomic<uint32_t> clients_{0};
  std::atomic<uint64_t> client_cancelled_{0};
  RouteStats stats_[CHI_STATS_ROUTES];
  std::mutex modules_mu_;
  std::vector<void *> modules_;
};

}  // namespace chi

namespace chi {
// Tags of live runtimes (see runtime.cpp): futures carry their runtime's tag.
uint32_t acquire_tag();
void release_tag(uint32_t tag);
}  // namespace chi

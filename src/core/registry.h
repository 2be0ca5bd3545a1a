// Method table: names to ids, ids to handlers.  Ids are dense, start at 1, and
// never change; lookups by id are lock-free so workers and pollers never block.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "chimaera.h"

namespace chi {

constexpr uint32_t kMaxMethods = 4096;
constexpr size_t kMaxMethodName = 127;

struct MethodEntry {
  std::atomic<chi_handler_t> cpu_fn{nullptr};
  std::atomic<void *> user_data{nullptr};
  std::atomic<bool> gpu{false};  // some GPU orchestrator serves it
  char name[kMaxMethodName + 1] = {};
};

class Registry {
 public:
  Registry();
  // A new CPU method, or a CPU handler for a name that so far has only a GPU handler.
  chi_status_t add_cpu(const char *name, chi_handler_t fn, void *user_data, chi_method_t *id);
  // A GPU method, or a GPU handler for a name that so far has only a CPU handler.
  chi_status_t add_gpu(const char *name, chi_method_t *id);
  chi_status_t lookup(const char *name, chi_method_t *id) const;
  // The entry of a registered id, else nullptr.  Lock-free.
  const MethodEntry *get(chi_method_t id) const {
    return (id >= 1 && id < count_.load(std::memory_order_acquire)) ? &entries_[id] : nullptr;
  }
  // One past the largest id handed out.
  uint32_t limit() const { return count_.load(std::memory_order_acquire); }

 private:
  chi_status_t add(const char *name, bool cpu, chi_handler_t fn, void *user_data, chi_method_t *id);

  std::unique_ptr<MethodEntry[]> entries_;
  std::atomic<uint32_t> count_{1};
  mutable std::mutex mu_;
  std::unordered_map<std::string, chi_method_t> by_name_;
};

// Checks a method name (1..127 printable ASCII bytes); sets the error message.
chi_status_t check_method_name(const char *name);

// Runs the CPU handler of `method` over one task, with every check a handler's
// caller needs: unknown method or no CPU handler (CHI_ERR_NOT_FOUND), output
// size over capacity or positive status (CHI_ERR_INTERNAL).  Used by the CPU
// workers and by GPU->CPU pollers alike.  *output_size is set in every case.
chi_status_t run_cpu_handler(const Registry &reg, chi_method_t method, chi_route_t source,
                             const void *input, size_t input_size, void *output,
                             size_t output_capacity, size_t *output_size);

// The built-in methods' CPU handlers (chi.echo, chi.add, chi.checksum).
void register_builtins(Registry &reg);

// 64-bit FNV-1a, the chi.checksum function (the GPU side computes the same).
uint64_t fnv1a64(const void *data, size_t size);

}  // namespace chi

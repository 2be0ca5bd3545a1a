// Method table: names to ids, ids to handlers.  Ids never change while the
// runtime lives and lookups by id are lock-free, so workers and pollers never
// block.  Ids of registered methods are unique among the live runtimes of a
// process (one process-wide allocator): an id handed to another runtime is
// not in that runtime's table and is refused instead of running whatever it
// registered under the same number.  The built-in ids 1..3 belong to every
// runtime.  Ids stay below kMaxMethods, so GPU dispatch tables index them
// directly, and never set the client-local bit 0x40000000.
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
  std::atomic<bool> gpu{false};   // some GPU orchestrator serves it
  std::atomic<bool> live{false};  // registered on this runtime; publishes the rest
  // The CPU handler's work is bounded by its payload (the built-ins): a
  // server may run it on the I/O thread that took the task.
  std::atomic<bool> bounded{false};
  char name[kMaxMethodName + 1] = {};
};

// True when some live runtime of this process holds `id` (for messages only).
bool method_id_in_use(chi_method_t id);

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry &) = delete;
  Registry &operator=(const Registry &) = delete;
  // A new CPU method, or a CPU handler for a name that so far has only a GPU handler.
  chi_status_t add_cpu(const char *name, chi_handler_t fn, void *user_data, chi_method_t *id);
  // A GPU method, or a GPU handler for a name that so far has only a CPU handler.
  chi_status_t add_gpu(const char *name, chi_method_t *id);
  chi_status_t lookup(const char *name, chi_method_t *id) const;
  // Marks a registered method's CPU handler bounded (MethodEntry::bounded).
  void mark_bounded(chi_method_t id);
  // The entry of an id this registry handed out, else nullptr.  Lock-free.
  const MethodEntry *get(chi_method_t id) const {
    if (id == 0 || id >= kMaxMethods) return nullptr;
    const MethodEntry *chunk = chunks_[id / kChunk].load(std::memory_order_acquire);
    if (!chunk) return nullptr;
    const MethodEntry *e = &chunk[id % kChunk];
    return e->live.load(std::memory_order_acquire) ? e : nullptr;
  }
  // One past the largest id handed out.
  uint32_t limit() const { return limit_.load(std::memory_order_acquire); }
  // Bits the ids carry outside this registry (a client's local pool: its ids
  // are seen with kLocalMethodBit); handlers see chi_request_t.method with them.
  void set_id_bits(uint32_t bits) { id_bits_ = bits; }
  uint32_t id_bits() const { return id_bits_; }

 private:
  // Entries come in chunks made on first use: an idle runtime with a few
  // methods holds one or two chunks, not the whole table.
  static constexpr uint32_t kChunk = 64;
  chi_status_t add(const char *name, bool cpu, chi_handler_t fn, void *user_data, chi_method_t *id);
  MethodEntry *entry_for(chi_method_t id);  // under mu_; makes the chunk

  std::atomic<MethodEntry *> chunks_[kMaxMethods / kChunk] = {};
  std::atomic<uint32_t> limit_{1};
  uint32_t builtins_ = 1;  // the next built-in id, under mu_
  uint32_t id_bits_ = 0;   // set before any handler runs
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

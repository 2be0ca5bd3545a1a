// Registered memory regions that tasks reference by (region, offset, length).
#pragma once

#include <cstdint>
#include <shared_mutex>
#include <vector>

#include "chimaera.h"

namespace chi {

struct Region {
  uint64_t id = 0;   // 0: free entry
  int32_t gpu = CHI_ROUTE_CPU;
  uintptr_t base = 0;
  uint64_t size = 0;
};

class MemoryRegions {
 public:
  static constexpr size_t kMaxRegions = 1024;
  chi_status_t add(int32_t gpu, void *base, size_t size, uint64_t *id);
  chi_status_t remove(uint64_t id);
  chi_status_t resolve(const chi_mem_ref_t &ref, void **ptr, int32_t *gpu) const;
  // A copy of the table, indexed by (id & 0xFFFFFFFF) - 1, for device upload.
  std::vector<Region> snapshot() const;
  // Ids given from now on carry generations from `first` up: a client's own
  // regions start at 0x40000000 so that they never equal the ids of regions
  // it registered with its server (docs/server.md, "Client device memory").
  void set_first_generation(uint32_t first);

 private:
  mutable std::shared_mutex mu_;
  std::vector<Region> table_;
  uint32_t next_gen_ = 1;
};

}  // namespace chi

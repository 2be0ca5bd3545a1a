#include "core/memory_regions.h"

#include <mutex>

#include "base/error.h"

namespace chi {

chi_status_t MemoryRegions::add(int32_t gpu, void *base, size_t size, uint64_t *id) {
  std::unique_lock lock(mu_);
  size_t index = table_.size();
  for (size_t i = 0; i < table_.size(); ++i) {
    if (table_[i].id == 0) {
      index = i;
      break;
    }
  }
  if (index == table_.size()) {
    if (table_.size() >= kMaxRegions)
      return set_error(CHI_ERR_NOMEM, "region table full (%zu regions)", kMaxRegions);
    table_.emplace_back();
  }
  // The generation makes an unregistered id stale even when its entry is reused.
  uint32_t gen = next_gen_++;
  if (next_gen_ == 0) next_gen_ = 1;
  Region &r = table_[index];
  r.id = (uint64_t(gen) << 32) | uint64_t(index + 1);
  r.gpu = gpu;
  r.base = reinterpret_cast<uintptr_t>(base);
  r.size = size;
  *id = r.id;
  return CHI_OK;
}

chi_status_t MemoryRegions::remove(uint64_t id) {
  std::unique_lock lock(mu_);
  uint64_t index = (id & 0xFFFFFFFFu) - 1;
  if ((id & 0xFFFFFFFFu) == 0 || index >= table_.size() || table_[index].id != id)
    return set_error(CHI_ERR_INVALID, "unknown memory region %#llx", (unsigned long long)id);
  table_[index] = Region{};
  return CHI_OK;
}

chi_status_t MemoryRegions::resolve(const chi_mem_ref_t &ref, void **ptr, int32_t *gpu) const {
  std::shared_lock lock(mu_);
  uint64_t index = (ref.region & 0xFFFFFFFFu) - 1;
  if ((ref.region & 0xFFFFFFFFu) == 0 || index >= table_.size() || table_[index].id != ref.region)
    return set_error(CHI_ERR_INVALID, "unknown memory region %#llx",
                     (unsigned long long)ref.region);
  const Region &r = table_[index];
  // offset + length may overflow: compare without adding.
  if (ref.offset > r.size || ref.length > r.size - ref.offset)
    return set_error(CHI_ERR_INVALID,
                     "reference [%llu, +%llu) outside region %#llx of %llu bytes",
                     (unsigned long long)ref.offset, (unsigned long long)ref.length,
                     (unsigned long long)ref.region, (unsigned long long)r.size);
  *ptr = reinterpret_cast<void *>(r.base + ref.offset);
  if (gpu) *gpu = r.gpu;
  return CHI_OK;
}

std::vector<Region> MemoryRegions::snapshot() const {
  std::shared_lock lock(mu_);
  return table_;
}

void MemoryRegions::set_first_generation(uint32_t first) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  if (next_gen_ < first) next_gen_ = first;
}

}  // namespace chi

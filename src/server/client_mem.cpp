#include "server/client_mem.h"

#include <cstring>

#include "base/error.h"
#include "base/log.h"
#include "core/gpu_system.h"
#include "core/runtime.h"
#include "ipc/wire.h"

namespace chi {

namespace {
chi_status_t fail(std::string *reply, chi_status_t st, const std::string &msg) {
  *reply = msg;
  return st;
}
}  // namespace

ClientMemory::~ClientMemory() {
  std::lock_guard<std::mutex> lock(mu_);
  Closes closes;
  while (!owned_.empty()) drop_locked(owned_.begin()->first, &closes);
  close_after_upload(closes);
}

void ClientMemory::close_after_upload(const Closes &closes) {
  GpuSystem *g = rt_.gpu();
  if (!g) return;
  // Device code sees the table without the regions before their memory goes.
  (void)g->regions_changed();
  for (const auto &c : closes) g->close_ipc_mem(c.first, c.second);
}

chi_status_t ClientMemory::add(uint32_t session, const void *payload, size_t size, std::string *reply) {
  // Copied out first, then checked: nothing of the client's is read twice.
  ipc::GpuMemExport x;
  if (size != sizeof x)
    return fail(reply, CHI_ERR_PROTOCOL,
                "device memory registration of " + std::to_string(size) + " bytes (want " + std::to_string(sizeof x) + ")");
  std::memcpy(&x, payload, sizeof x);
  if (x.version != ipc::kGpuMemVersion)
    return fail(reply, CHI_ERR_PROTOCOL,
                "device memory registration version " + std::to_string(x.version) + " (this server: " +
                    std::to_string(ipc::kGpuMemVersion) + ")");
  if (x.size == 0) return fail(reply, CHI_ERR_INVALID, "region size is 0");
  if (x.offset + x.size < x.offset) return fail(reply, CHI_ERR_INVALID, "region wraps around");
  GpuSystem *g = rt_.gpu();
  if (!g) return fail(reply, CHI_ERR_NO_DEVICE, "the server drives no GPU");
  if (x.gpu < 0 || x.gpu >= g->count())
    return fail(reply, CHI_ERR_INVALID,
                "GPU " + std::to_string(x.gpu) + " out of range: the server drives " + std::to_string(g->count()) +
                    " GPU(s)");
  const std::string handle(reinterpret_cast<const char *>(x.handle), sizeof x.handle);
  std::lock_guard<std::mutex> lock(mu_);
  // One mapping per session and allocation: a handle is opened once.
  uint64_t key = 0;
  for (const auto &kv : mappings_)
    if (kv.second.session == session && kv.second.gpu == x.gpu && kv.second.handle == handle) key = kv.first;
  bool opened = false;
  if (!key) {
    void *base = nullptr;
    size_t length = 0;
    if (chi_status_t s = g->open_ipc_mem(x.gpu, x.handle, sizeof x.handle, &base, &length); s != CHI_OK)
      return fail(reply, s, last_error());
    key = next_mapping_++;
    mappings_[key] = Mapping{session, x.gpu, handle, base, length, 0};
    opened = true;
  }
  Mapping &m = mappings_[key];
  auto undo = [&] {
    if (opened) {
      g->close_ipc_mem(m.gpu, m.base);
      mappings_.erase(key);
    }
  };
  if (x.offset > m.length || x.size > m.length - x.offset) {
    const std::string msg = "region [" + std::to_string(x.offset) + ", +" + std::to_string(x.size) +
                            ") runs past its allocation of " + std::to_string(m.length) + " bytes";
    undo();
    return fail(reply, CHI_ERR_INVALID, msg);
  }
  ipc::RegionReply r{};
  if (chi_status_t s = rt_.regions().add(x.gpu, static_cast<uint8_t *>(m.base) + x.offset, size_t(x.size), &r.region);
      s != CHI_OK) {
    const std::string msg = last_error();
    undo();
    return fail(reply, s, msg);
  }
  ++m.regions;
  owned_[r.region] = Owned{session, key};
  if (chi_status_t s = g->regions_changed(); s != CHI_OK) {
    const std::string msg = last_error();
    Closes closes;
    drop_locked(r.region, &closes);
    close_after_upload(closes);
    return fail(reply, s, msg);
  }
  log(LogLevel::kDebug, "client %u: region %#llx of %llu bytes on GPU %d", session, (unsigned long long)r.region,
      (unsigned long long)x.size, x.gpu);
  reply->assign(reinterpret_cast<const char *>(&r), sizeof r);
  return CHI_OK;
}

chi_status_t ClientMemory::remove(uint32_t session, const void *payload, size_t size, std::string *reply) {
  ipc::RegionReply r;
  if (size != sizeof r)
    return fail(reply, CHI_ERR_PROTOCOL, "unregister request of " + std::to_string(size) + " bytes");
  std::memcpy(&r, payload, sizeof r);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = owned_.find(r.region);
  if (it == owned_.end() || it->second.session != session)
    return fail(reply, CHI_ERR_INVALID, "region " + std::to_string(r.region) + " is not one this client registered");
  Closes closes;
  drop_locked(r.region, &closes);
  close_after_upload(closes);
  reply->clear();
  return CHI_OK;
}

void ClientMemory::session_ended(uint32_t session) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<uint64_t> gone;
  for (const auto &kv : owned_)
    if (kv.second.session == session) gone.push_back(kv.first);
  if (gone.empty()) return;
  Closes closes;
  for (uint64_t region : gone) drop_locked(region, &closes);
  close_after_upload(closes);
  log(LogLevel::kInfo, "client %u gone: %zu device memory region(s) unregistered", session, gone.size());
}

size_t ClientMemory::regions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return owned_.size();
}

void ClientMemory::drop_locked(uint64_t region, Closes *closes) {
  auto it = owned_.find(region);
  if (it == owned_.end()) return;
  (void)rt_.regions().remove(region);
  auto m = mappings_.find(it->second.mapping);
  owned_.erase(it);
  if (m != mappings_.end() && --m->second.regions == 0) {
    // Handlers that resolved a reference before this may still read it: the
    // same rule as chi_unregister_mem in an embedded runtime.
    closes->emplace_back(m->second.gpu, m->second.base);
    mappings_.erase(m);
  }
}

}  // namespace chi

#include "client/client.h"

#include <cstddef>
#include <cstring>
#include <thread>

#include "base/error.h"
#include "base/log.h"
#include "client/shm_client.h"
#include "client/zmq_client.h"
#include "core/client_gpu.h"
#include "core/mps.h"
#include "core/runtime.h"
#include "ipc/address.h"
#include "ipc/handshake.h"

namespace chi {

Client::Client() : tag_(acquire_tag()) {}

Client::~Client() {
  shutdown_local();
  release_tag(tag_);
}

void Client::shutdown_local() {
  std::lock_guard<std::mutex> lock(local_mu_);
  gpus_relay_.clear();  // their pollers run handlers on local_ and forward over the transport
  if (local_) local_->shutdown();
  local_ptr_.store(nullptr, std::memory_order_release);
  local_.reset();
}

chi_status_t Client::local(bool create, Runtime **rt) {
  std::lock_guard<std::mutex> lock(local_mu_);
  if (!local_ && create) {
    Config c = cfg_;
    c.mode = CHI_MODE_EMBEDDED;
    c.gpu.devices = 0;
    c.modules.clear();
    if (c.workers == 0) c.workers = 2;  // a client's own handlers: a small pool
    auto r = std::make_unique<Runtime>(std::move(c));
    r->registry().set_id_bits(kLocalMethodBit);  // handlers see the ids the client hands out
    r->regions().set_first_generation(0x40000000u);  // never a server region's id
    if (chi_status_t s = r->start(); s != CHI_OK) return s;
    local_ = std::move(r);
    local_ptr_.store(local_.get(), std::memory_order_release);
  }
  *rt = local_.get();
  return *rt ? CHI_OK : set_error(CHI_ERR_NOT_FOUND, "this client has no local handlers");
}

chi_status_t Client::gpu_context(int32_t gpu, chi_dev_context_t *ctx) {
  // A test's host-memory relay stands for GPU 0 of a server without one.
  const int32_t gpus = relay_host_memory() && gpus_ == 0 ? 1 : gpus_;
  if (gpus == 0)
    return set_error(CHI_ERR_NO_DEVICE, "the server %s drives no GPU (or gpu.devices is 0)", address_.c_str());
  if (gpu < 0 || gpu >= gpus)
    return set_error(CHI_ERR_INVALID, "GPU %d out of range: the server drives %d GPU(s)", gpu, gpus);
  Runtime *l;
  if (chi_status_t s = local(true, &l); s != CHI_OK) return s;
  std::lock_guard<std::mutex> lock(local_mu_);
  if (gpus_relay_.size() < size_t(gpus)) gpus_relay_.resize(size_t(gpus));
  if (!gpus_relay_[gpu])
    if (chi_status_t s = create_client_gpu(*this, *l, gpu, gpus, &gpus_relay_[gpu]); s != CHI_OK) return s;
  gpus_relay_[gpu]->context(ctx);
  return CHI_OK;
}

chi_status_t Client::register_gpu_mem(int32_t gpu, void *ptr, size_t size, uint64_t *region) {
  if (gpus_ == 0)
    return set_error(CHI_ERR_NO_DEVICE, "the server %s drives no GPU (or gpu.devices is 0)", address_.c_str());
  if (gpu >= gpus_) return set_error(CHI_ERR_INVALID, "GPU %d out of range: the server drives %d GPU(s)", gpu, gpus_);
  ipc::GpuMemExport x{};
  x.version = ipc::kGpuMemVersion;
  x.gpu = gpu;
  x.size = size;
  if (chi_status_t s = export_gpu_mem(gpu, ptr, size, x.handle, sizeof x.handle, &x.offset); s != CHI_OK) return s;
  ipc::RegionReply r{};
  uint32_t n = 0;
  if (chi_status_t s = control(ipc::Op::kRegisterGpuMem, 0, &x, sizeof x, &r, sizeof r, &n); s != CHI_OK) return s;
  if (n != sizeof r || r.region == 0)
    return set_error(CHI_ERR_PROTOCOL, "%s answered a registration with a bad region", address_.c_str());
  std::lock_guard<std::mutex> lock(regions_mu_);
  server_regions_.insert(r.region);
  *region = r.region;
  return CHI_OK;
}

bool Client::server_region(uint64_t region) const {
  std::lock_guard<std::mutex> lock(regions_mu_);
  return server_regions_.count(region) != 0;
}

chi_status_t Client::unregister_server_mem(uint64_t region) {
  {
    std::lock_guard<std::mutex> lock(regions_mu_);
    if (!server_regions_.erase(region))
      return set_error(CHI_ERR_INVALID, "unknown region %llu", (unsigned long long)region);
  }
  ipc::RegionReply r{region};
  // Gone from the client's set either way: a server that is gone dropped it too.
  return control(ipc::Op::kUnregisterMem, 0, &r, sizeof r, nullptr, 0, nullptr);
}

int64_t Client::wait_spin_ns() const {
  static const unsigned cpus = std::thread::hardware_concurrency();
  return cpus >= cfg_.client_spin_min_cpus ? cfg_.spin_ns : 0;
}

int64_t Client::wait_yield_ns() const {
  static const unsigned cpus = std::thread::hardware_concurrency();
  return cpus >= cfg_.client_spin_min_cpus ? cfg_.client_yield_ns : 0;
}

void Client::note_method_limit(uint32_t limit) {
  uint32_t lim = method_limit_.load(std::memory_order_relaxed);
  while (limit > lim && !method_limit_.compare_exchange_weak(lim, limit)) {
  }
}

chi_status_t Client::lookup(const char *name, chi_method_t *method) {
  if (Runtime *l = local_if_any()) {
    chi_method_t id;
    if (l->registry().lookup(name, &id) == CHI_OK && id > CHI_METHOD_CHECKSUM) {
      *method = id | kLocalMethodBit;
      return CHI_OK;
    }
  }
  // As embedded: a name that cannot be registered is simply not found.
  if (check_method_name(name) != CHI_OK)
    return set_error(CHI_ERR_NOT_FOUND, "no method named '%.64s' (not a valid method name)", name);
  ipc::MethodReply r{};
  uint32_t n = 0;
  if (chi_status_t s = control(ipc::Op::kLookup, 0, name, uint32_t(std::strlen(name)), &r, sizeof r, &n);
      s != CHI_OK)
    return s;
  if (n < sizeof r || r.method == 0 || (r.method & kLocalMethodBit))
    return set_error(CHI_ERR_PROTOCOL, "%s answered a lookup with a bad method id", address_.c_str());
  *method = r.method;
  note_method_limit(r.method + 1);
  return CHI_OK;
}

chi_status_t Client::register_handler(const char *name, chi_handler_t fn, void *user_data,
                                      chi_method_t *method) {
  if (chi_status_t s = check_method_name(name); s != CHI_OK) return s;
  if (!fn) return set_error(CHI_ERR_INVALID, "handler is NULL");
  chi_method_t server_id;
  chi_status_t s = lookup(name, &server_id);
  if (s == CHI_OK && !(server_id & kLocalMethodBit))
    return set_error(CHI_ERR_INVALID, "method '%s' is registered in the server %s", name, address_.c_str());
  if (s != CHI_OK && s != CHI_ERR_NOT_FOUND) return s;
  Runtime *l;
  if (chi_status_t ls = local(true, &l); ls != CHI_OK) return ls;
  chi_method_t id;
  if (chi_status_t rs = l->registry().add_cpu(name, fn, user_data, &id); rs != CHI_OK) return rs;
  if (method) *method = id | kLocalMethodBit;
  return CHI_OK;
}

chi_status_t Client::stats(chi_stats_t *out) {
  chi_stats_t st;
  uint32_t n = 0;
  if (chi_status_t s = control(ipc::Op::kStats, 0, nullptr, 0, &st, sizeof st, &n); s != CHI_OK) return s;
  // A server of an earlier minor version sends the fields it has.
  if (n < offsetof(chi_stats_t, gpus_parked))
    return set_error(CHI_ERR_PROTOCOL, "%s sent short statistics", address_.c_str());
  if (n < sizeof st) std::memset(reinterpret_cast<char *>(&st) + n, 0, sizeof st - n);
  size_t keep = std::min(out->struct_size, sizeof st);
  st.struct_size = out->struct_size;
  std::memcpy(out, &st, keep);
  return CHI_OK;
}

chi_status_t Client::accept_welcome(int32_t status, const void *payload, size_t size, uint32_t kind,
                                    ipc::Welcome *w) {
  std::string mps_dir;
  if (chi_status_t s = ipc::check_welcome(status, payload, size, kind, address_, w, &mps_dir); s != CHI_OK)
    return s;
  if (kind == ipc::kSessionControl) return CHI_OK;
  // The server's GPUs are clients of an MPS daemon: so are this process's
  // contexts, if CUDA is not initialized yet (else a warning with the fix).
  if (!mps_dir.empty() && cfg_.gpu.devices != 0) mps::adopt(mps_dir);
  if (chi_status_t s = apply_gpu_setting(w->gpus); s != CHI_OK) return s;
  note_method_limit(w->method_limit);
  log(LogLevel::kInfo, "connected to %s as session %u (%u slots, %u-byte payloads, %d GPU(s))", address_.c_str(),
      w->session_id, w->nslots, w->max_payload, gpus_);
  return CHI_OK;
}

chi_status_t Client::apply_gpu_setting(int32_t server_gpus) {
  // gpu.devices as embedded: -1 all the server has, 0 none, n at least n.
  const int32_t want = cfg_.gpu.devices;
  if (want > server_gpus)
    return set_error(CHI_ERR_NO_DEVICE, "%d GPU(s) requested but the server %s drives %d", want,
                     address_.c_str(), server_gpus);
  gpus_ = want < 0 ? server_gpus : want;
  return CHI_OK;
}

chi_status_t Client::take_slot(chi_route_t route, chi_method_t method, size_t input_size, uint32_t max_payload,
                               uint32_t nslots, uint32_t *slot) {
  if (chi_status_t s = check_submit(route, method, input_size, max_payload); s != CHI_OK)
    return gone() ? disconnected("chi_submit") : s;
  if (acquire_slot(slot)) return CHI_OK;
  if (gone()) return disconnected("chi_submit");
  return set_error(CHI_ERR_AGAIN,
                   cfg_.submit_blocking ? "all %u client slots stayed in use for %u ms" : "all %u client slots are in use",
                   nslots, cfg_.submit_timeout_ms);
}

chi_status_t Client::check_submit(chi_route_t route, chi_method_t method, size_t input_size,
                                  uint32_t max_payload) {
  if (route < CHI_ROUTE_LOCAL) return set_error(CHI_ERR_INVALID, "unknown route %d", route);
  if (route >= 0 || route == CHI_ROUTE_GPU_ANY) {
    if (gpus_ == 0)
      return set_error(CHI_ERR_NO_DEVICE, "route %d needs a GPU and the server %s has none", route,
                       address_.c_str());
    if (route >= gpus_)
      return set_error(CHI_ERR_INVALID, "GPU %d out of range: the server drives %d GPU(s)", route, gpus_);
  }
  if (method == 0 || method >= method_limit_.load(std::memory_order_relaxed)) {
    // Modules may have registered methods since we connected: ask once.
    ipc::MethodReply r{};
    uint32_t n = 0;
    if (method != 0 && control(ipc::Op::kMethodLimit, 0, nullptr, 0, &r, sizeof r, &n) == CHI_OK &&
        n >= sizeof r && !(r.method & kLocalMethodBit))
      note_method_limit(r.method);
    if (method == 0) return set_error(CHI_ERR_INVALID, "method 0 is never a valid method id");
    if (method >= method_limit_.load(std::memory_order_relaxed))
      return set_error(CHI_ERR_NOT_FOUND, "method %u was never registered in the server %s", method,
                       address_.c_str());
  }
  if (input_size > max_payload)
    return set_error(CHI_ERR_TOO_LARGE, "input of %zu bytes over the server's max_inline_payload %u",
                     input_size, max_payload);
  return CHI_OK;
}

chi_status_t connect_client(const Config &cfg, std::unique_ptr<Client> *out) {
  const std::string &a = cfg.server_address;
  if (ipc::served_by_zmq(a)) return ZmqClient::connect(cfg, false, out);
  return ShmClient::connect(cfg, false, out);
}

chi_status_t connect_control(const std::string &address, std::unique_ptr<Client> *out) {
  // $CHI_CONFIG and CHI_* (CURVE keys, disconnect_check_ms) apply here too.
  Config cfg;
  std::string err;
  if (chi_status_t s = load_config(nullptr, &cfg, &err); s != CHI_OK) return set_error(s, "%s", err.c_str());
  cfg.server_address = address;
  if (ipc::served_by_zmq(address)) return ZmqClient::connect(cfg, true, out);
  return ShmClient::connect(cfg, true, out);
}

}  // namespace chi

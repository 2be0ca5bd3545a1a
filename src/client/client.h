// A runtime that is a client of a chimaera-server: the calls of the embedded
// engine, carried by a transport (shm_client.h: shared memory; zmq_client.h:
// ZeroMQ ipc:// and tcp://).  What every transport shares lives here: the
// runtime tag of its futures, method lookups, and the local pool that runs
// the client's own handlers (docs/server.md, "What a client gets").
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "chimaera.h"
#include "config/config.h"
#include "core/upstream.h"
#include "ipc/wire.h"

namespace chi {

class Runtime;
class ClientGpu;

// Pool number of a client future (the local pool's futures carry its own tag).
constexpr uint32_t kClientPool = 0xFE;

// The bound both transports use for one control request (connecting has
// its own, the config's connect_timeout_ms).
constexpr int kControlTimeoutMs = 10000;

class Client : public Upstream {
 public:
  ~Client() override;

  uint32_t tag() const { return tag_; }
  int32_t gpus() const { return gpus_; }

  // submit, wait, test, release, finished: the session (core/upstream.h),
  // each transport's own.
  // One control request (lookups, stats, status, ping, stop); replies come in order.
  virtual chi_status_t control(ipc::Op op, uint16_t flags, const void *payload, uint32_t length,
                               void *reply, uint32_t capacity, uint32_t *reply_length) = 0;

  // The client's own handlers first, then the server's methods.
  chi_status_t lookup(const char *name, chi_method_t *method);
  chi_status_t register_handler(const char *name, chi_handler_t fn, void *user_data,
                                chi_method_t *method);
  chi_status_t stats(chi_stats_t *out);

  // chi_gpu_context in a client: the device context of the client's relay
  // for GPU `gpu` (made on first use; core/client_gpu.h).
  chi_status_t gpu_context(int32_t gpu, chi_dev_context_t *ctx);

  // chi_register_gpu_mem(gpu >= 0) in a client: the memory's CUDA IPC handle
  // goes to the server, which maps it and registers the region in its own
  // table (server/client_mem.h); *region is the server's id.
  chi_status_t register_gpu_mem(int32_t gpu, void *ptr, size_t size, uint64_t *region);
  // Whether `region` is one this client registered with its server.
  bool server_region(uint64_t region) const;
  // chi_unregister_mem of such a region.
  chi_status_t unregister_server_mem(uint64_t region);

  // The local pool for the client's own handlers, modules and memory
  // regions (made on first use when create is true).
  chi_status_t local(bool create, Runtime **rt);
  Runtime *local_if_any() const { return local_ptr_.load(std::memory_order_acquire); }

 protected:
  Client();
  // Derived destructors call this first: local handlers may still use the transport.
  void shutdown_local();
  // chi_submit's steps before a transport writes the task: the checks that
  // need no round trip (method ids refreshed once), then a free slot of the
  // transport's (acquire_slot, nslots of them).  A server found gone on the
  // way answers CHI_ERR_DISCONNECTED.
  chi_status_t take_slot(chi_route_t route, chi_method_t method, size_t input_size, uint32_t max_payload,
                         uint32_t nslots, uint32_t *slot);
  // A free slot, waiting up to submit_timeout_ms when submit_blocking.
  virtual bool acquire_slot(uint32_t *slot) = 0;
  virtual bool gone() const = 0;
  // Marks the runtime disconnected; CHI_ERR_DISCONNECTED with the message.
  virtual chi_status_t disconnected(const char *where) = 0;
  void note_method_limit(uint32_t limit);
  // The one Welcome check of every transport: the server's answer to the
  // hello (status and payload), then, for a task session, its GPUs
  // (gpu.devices) and method ids taken over.  Sets the message on failure.
  chi_status_t accept_welcome(int32_t status, const void *payload, size_t size, uint32_t kind, ipc::Welcome *w);
  // Applies gpu.devices (chi_config_t.gpus) to the server's GPU count.
  chi_status_t apply_gpu_setting(int32_t server_gpus);
  // How long a waiter spins before it sleeps: spin_ns, or 0 on a machine of
  // fewer than client_spin_min_cpus (4) CPUs, where a spinning client takes the CPU that the
  // server's poller and worker need (measured: 168 us vs 23 us per round
  // trip on 2 cores).
  int64_t wait_spin_ns() const;
  // ... then polls with sched_yield this long (client_yield_ns; 0 below
  // client_spin_min_cpus).  Over ZeroMQ the I/O thread polls without
  // blocking as long (results due) and as long as spin_ns after its work.
  int64_t wait_yield_ns() const;

  Config cfg_;
  uint32_t tag_ = 0;
  int32_t gpus_ = 0;
  std::atomic<uint32_t> method_limit_{0};
  std::string address_;

 private:
  chi_status_t check_submit(chi_route_t route, chi_method_t method, size_t input_size, uint32_t max_payload);

  mutable std::mutex regions_mu_;
  std::set<uint64_t> server_regions_;  // under regions_mu_
  std::mutex local_mu_;
  std::vector<std::unique_ptr<ClientGpu>> gpus_relay_;  // by GPU, under local_mu_; stopped before local_
  std::unique_ptr<Runtime> local_;
  std::atomic<Runtime *> local_ptr_{nullptr};  // local_, published for lock-free readers
};

// Connects by the scheme of cfg.server_address: shm:// (or empty: the
// default server), ipc:// or tcp://.
chi_status_t connect_client(const Config &cfg, std::unique_ptr<Client> *out);
// An administrative session (chimaera-ctl): control requests only.
chi_status_t connect_control(const std::string &address, std::unique_ptr<Client> *out);

}  // namespace chi

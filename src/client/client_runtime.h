// A runtime that is a client of a chimaera-server: the same calls as the
// embedded engine, carried over the session socket (control) and the shared
// segment (tasks).  Handlers registered in a client run in the client, on a
// small local pool made on first use (docs/server.md, "Client mode").
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "chimaera.h"
#include "config/config.h"
#include "core/free_stack.h"
#include "ipc/segment.h"
#include "ipc/wire.h"

namespace chi {

class Runtime;

// Method ids of a client's own handlers carry this bit; the server's ids never do.
constexpr chi_method_t kLocalMethodBit = 0x40000000u;
// Pool number of a client future (the local pool's futures carry its own tag).
constexpr uint32_t kClientPool = 0xFE;

class ClientRuntime {
 public:
  static chi_status_t connect(const Config &cfg, std::unique_ptr<ClientRuntime> *out);
  // An administrative session (chimaera-ctl): control requests only, no segment.
  static chi_status_t connect_control(const std::string &address, std::unique_ptr<ClientRuntime> *out);
  ~ClientRuntime();

  uint32_t tag() const { return tag_; }
  chi_status_t submit(chi_route_t route, chi_method_t method, const void *input, size_t input_size,
                      chi_future_t *future);
  chi_status_t wait(uint32_t slot, uint32_t gen, int64_t timeout_ns, void *output,
                    size_t output_capacity, size_t *output_size);
  chi_status_t test(uint32_t slot, uint32_t gen, int *done);
  chi_status_t release(uint32_t slot, uint32_t gen);
  chi_status_t lookup(const char *name, chi_method_t *method);
  chi_status_t register_handler(const char *name, chi_handler_t fn, void *user_data,
                                chi_method_t *method);
  chi_status_t stats(chi_stats_t *out);
  int32_t gpus() const { return gpus_; }

  // The local pool for the client's own handlers, modules and memory
  // regions (made on first use when create is true).
  chi_status_t local(bool create, Runtime **rt);
  Runtime *local_if_any() const { return local_.get(); }

  // Control request: one at a time per client (replies come in order).
  chi_status_t control(ipc::Op op, uint16_t flags, const void *payload, uint32_t length,
                       void *reply, uint32_t capacity, uint32_t *reply_length);
  // False (and the runtime marked disconnected) once the server is gone.
  bool server_alive();

 private:
  ClientRuntime() = default;
  chi_status_t handshake(const std::string &address, uint32_t kind);
  chi_status_t disconnected(const char *where);
  bool acquire_slot(uint32_t *slot);
  void free_slot(uint32_t slot);
  void reap_orphans();
  chi_status_t check(uint32_t slot, uint32_t gen) const;

  Config cfg_;
  uint32_t tag_ = 0;
  bool has_tag_ = false;
  int sock_ = -1;
  int memfd_ = -1;
  int doorbell_ = -1;
  ipc::SegmentView seg_;
  int32_t gpus_ = 0;
  std::atomic<uint32_t> method_limit_{0};
  std::string address_;
  std::atomic<bool> gone_{false};
  std::mutex control_mu_;
  // Client-private slot states (the segment's words are the server's to write):
  // generation << 8 | state.
  std::unique_ptr<std::atomic<uint32_t>[]> mine_;
  FreeStack free_;
  alignas(64) std::atomic<uint32_t> free_seq_{0};
  std::atomic<int32_t> free_waiters_{0};
  std::atomic<uint32_t> orphans_{0};
  std::mutex local_mu_;
  std::unique_ptr<Runtime> local_;
};

}  // namespace chi

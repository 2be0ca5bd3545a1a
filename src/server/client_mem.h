// Client device memory (docs/server.md, "Client device memory"): the
// server's side of chi_register_gpu_mem with a GPU in a client process.  A
// session sends a CUDA IPC handle and the region inside its allocation
// (ipc::GpuMemExport); the server checks every field, opens the handle once
// per session and allocation, checks the range against what it opened, and
// registers the region in its own table, so its CPU and GPU handlers resolve
// the client's chi_mem_ref_t.  The region is unregistered, and the mapping
// closed with its last region, at kUnregisterMem and when the session ends.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "chimaera.h"

namespace chi {

class Runtime;

class ClientMemory {
 public:
  explicit ClientMemory(Runtime &rt) : rt_(rt) {}
  ~ClientMemory();
  // kRegisterGpuMem from `session`: payload as received.  CHI_OK and the
  // RegionReply's bytes in *reply, or a status and its text.
  chi_status_t add(uint32_t session, const void *payload, size_t size, std::string *reply);
  // kUnregisterMem: a region this session registered.
  chi_status_t remove(uint32_t session, const void *payload, size_t size, std::string *reply);
  // The session ended: all its regions go, and their mappings.
  void session_ended(uint32_t session);
  // Regions registered by clients now (chimaera-ctl, tests).
  size_t regions() const;

 private:
  struct Mapping {
    uint32_t session;
    int32_t gpu;
    std::string handle;  // the IPC handle's bytes
    void *base;          // the server's mapping of the allocation
    size_t length;
    uint32_t regions;    // regions that use it
  };
  struct Owned {
    uint32_t session;
    uint64_t mapping;  // key in mappings_
  };
  using Closes = std::vector<std::pair<int32_t, void *>>;  // (gpu, mapping) to close
  // Unregisters one region; its mapping, with its last region, goes to *closes (mu_ held).
  void drop_locked(uint64_t region, Closes *closes);
  // Uploads the region table, then closes the mappings.
  void close_after_upload(const Closes &closes);

  Runtime &rt_;
  mutable std::mutex mu_;
  uint64_t next_mapping_ = 1;
  std::map<uint64_t, Mapping> mappings_;
  std::map<uint64_t, Owned> owned_;  // region id -> owner
};

}  // namespace chi

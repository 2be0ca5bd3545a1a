// Messages of the session socket (a Unix stream socket): the handshake and
// the control requests (lookups, stats, status, ping, stop).  Tasks never
// travel here: they go through the shared segment (ipc/segment.h).  Both
// ends run on one host, so fields are in host byte order.
#pragma once

#include <cstdint>

namespace chi::ipc {

// Bumped on any change of this file or of segment.h.
constexpr uint32_t kProtocolVersion = 2;  // 2: ZeroMQ messages may batch frames
constexpr uint32_t kMsgMagic = 0x4D494843u;  // "CHIM"
constexpr uint32_t kMaxMsgPayload = 64 * 1024;

enum class Op : uint16_t {
  kHello = 1,    // client -> server: Hello
  kWelcome = 2,  // server -> client: Welcome (+ segment fd), or a refusal
  kLookup = 3,   // name -> MethodReply
  kMethodLimit = 4,  // -> MethodReply (one past the largest method id)
  kStats = 5,    // -> chi_stats_t
  kStatus = 6,   // flags 1: JSON; -> text
  kPing = 7,     // -> empty
  kStop = 8,     // -> empty; the server then stops
  kReply = 9,    // generic reply op (status in the header)
};

struct MsgHeader {
  uint32_t magic;
  uint16_t op;
  uint16_t flags;
  uint32_t length;  // payload bytes after the header, <= kMaxMsgPayload
  int32_t status;   // replies: CHI_OK or the failure (payload: message text)
};
static_assert(sizeof(MsgHeader) == 16, "fixed header");

enum : uint32_t { kSessionTasks = 1, kSessionControl = 2 };

struct Hello {
  uint32_t protocol;
  uint32_t library_version;
  uint32_t kind;  // kSessionTasks (a client runtime) or kSessionControl (chimaera-ctl)
  uint32_t reserved;
};

struct Welcome {
  uint32_t protocol;
  uint32_t library_version;
  uint32_t nslots;
  uint32_t max_payload;
  uint64_t segment_size;
  uint32_t method_limit;
  int32_t gpus;
  uint32_t session_id;
  uint32_t reserved;
};

struct MethodReply {
  uint32_t method;
  uint32_t reserved;
};

}  // namespace chi::ipc

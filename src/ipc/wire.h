// The messages of both channels: their types, the protocol version, the
// handshake's payloads, and the header of the shm:// session socket (a Unix
// stream socket: the handshake and control requests; both ends run on one
// host, so its fields are in host byte order).  ZeroMQ frames: frame.h.
#pragma once

#include <cstdint>

namespace chi::ipc {

// One protocol version for both channels.  The rule: bump it with any change
// to bytes that a peer reads (this file's structs and enums, the segment's
// layout and state values in segment.h, the frame header in frame.h), and say
// in a word here what changed.  Peers refuse each other's hello/welcome unless
// the versions are equal (ipc/handshake.h), with a message naming both.
// 2: ZeroMQ messages may batch frames; 3: one message-type enum for both
// channels, the frame header carries this version; 4: kRegisterGpuMem and
// kUnregisterMem (client device memory).
constexpr uint32_t kProtocolVersion = 4;
constexpr uint32_t kMsgMagic = 0x4D494843u;  // "CHIM"
constexpr uint32_t kMaxMsgPayload = 64 * 1024;

// The type of every message, on the session socket (MsgHeader.kind) and in
// ZeroMQ frames (Frame.kind) alike.  The session socket carries the hello,
// the welcome and control requests; tasks go through the shared segment.
enum class Kind : uint16_t {
  kHello = 1,         // client -> server: Hello
  kWelcome = 2,       // server -> client: Welcome (+ segment and doorbell fds), or a refusal
  kSubmit = 3,        // client -> server (ZeroMQ): id, method, route, input
  kResult = 4,        // server -> client (ZeroMQ): id, status, output
  kControl = 5,       // client -> server: an Op and its payload
  kControlReply = 6,  // server -> client: status, payload (a failure's message text)
  kBye = 7,           // client -> server (ZeroMQ): the client runtime is finalizing
  kGone = 8,          // server -> client (ZeroMQ): the server stops; nothing more will come
};
constexpr uint16_t kFirstKind = 1, kLastKind = 8;

// What a control message asks.
enum class Op : uint16_t {
  kLookup = 3,       // name -> MethodReply
  kMethodLimit = 4,  // -> MethodReply (one past the largest method id)
  kStats = 5,        // -> chi_stats_t
  kStatus = 6,       // flags kStatusJson: JSON; -> text
  kPing = 7,         // -> empty
  kStop = 8,         // -> empty; the server then stops
  kRegisterGpuMem = 9,  // GpuMemExport -> RegionReply (task sessions only)
  kUnregisterMem = 10,  // RegionReply -> empty (a region this session registered)
};
constexpr uint32_t kStatusJson = 1;

struct MsgHeader {
  uint32_t magic;
  uint16_t kind;    // Kind
  uint16_t op;      // kControl: the Op
  uint32_t flags;   // kControl: the Op's flags
  uint32_t length;  // payload bytes after the header, <= kMaxMsgPayload
  int32_t status;   // replies: CHI_OK or the failure (payload: message text)
};
static_assert(sizeof(MsgHeader) == 20, "fixed header");

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
  uint32_t flags;  // kWelcome* (0 from a server of library 0.1 before it)
};
// Welcome.flags: the payload goes on after the Welcome with the pipe
// directory of the MPS daemon whose clients the server's GPU contexts are
// (at most kMaxMpsDirBytes, an absolute path); a client that has not
// initialized CUDA joins it (docs/server.md, "GPUs shared by processes").
// A client of an earlier library ignores the flag and the bytes.
constexpr uint32_t kWelcomeMpsDir = 1u;
constexpr size_t kMaxMpsDirBytes = 100;  // dir + "/control" fits a Unix socket path

struct MethodReply {
  uint32_t method;
  uint32_t reserved;
};

// Client device memory (chi_register_gpu_mem with a GPU in a client): a CUDA
// IPC handle of the allocation, and the region inside it.  The server opens
// the handle once per session and allocation, checks the range against the
// allocation it opened, and answers the region id.
constexpr uint32_t kGpuMemVersion = 1;
constexpr uint32_t kIpcHandleBytes = 64;  // cudaIpcMemHandle_t, hipIpcMemHandle_t
struct GpuMemExport {
  uint32_t version;  // kGpuMemVersion
  int32_t gpu;       // the server's GPU (the client's CUDA device of the same ordinal)
  uint64_t offset;   // of the region in the allocation
  uint64_t size;     // of the region, > 0
  uint8_t handle[kIpcHandleBytes];
};
static_assert(sizeof(GpuMemExport) == 88, "fixed layout");

struct RegionReply {
  uint64_t region;
};

}  // namespace chi::ipc

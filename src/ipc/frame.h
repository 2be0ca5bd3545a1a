// The ZeroMQ wire format (ipc:// and tcp://): every request and reply is a
// frame, a fixed 32-byte little-endian header and a payload; a message part
// carries one frame or several back to back.  Clients
// may run on other hosts, so the byte order is fixed.  docs/protocol.md
// describes it; decode_frame is the only code that reads a peer's bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "chimaera.h"
#include "ipc/wire.h"

// Hello, Welcome, MethodReply and chi_stats_t travel as their in-memory
// bytes: fixed-width fields, natural alignment, little-endian on every
// supported host (x86-64, aarch64).
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the wire format is little-endian");
static_assert(sizeof(void *) == 8, "the wire format assumes an LP64 host");

namespace chi::ipc {

constexpr uint32_t kFrameMagic = 0x46494843u;  // "CHIF"
constexpr size_t kFrameHeader = 32;
// The largest payload any frame may carry: a task input or output of the
// largest max_inline_payload (1 MiB), or a control reply (64 KiB).
constexpr uint32_t kMaxFramePayload = 1u << 20;

struct Frame {
  Kind kind = Kind::kHello;
  uint64_t id = 0;
  uint32_t method = 0;
  int32_t route = 0;
  int32_t status = 0;
  const uint8_t *payload = nullptr;  // decode: points into the caller's buffer
  uint32_t size = 0;
};

// Writes header and payload (f.size bytes from f.payload) to out.
void encode_frame(const Frame &f, std::string *out);
// The same into a buffer of kFrameHeader + f.size bytes.
void encode_frame(const Frame &f, uint8_t *out);

// Checks and parses one message part: length >= header, magic, version,
// a known kind, size == length - header, size <= kMaxFramePayload.
// Returns CHI_OK or CHI_ERR_PROTOCOL with *why set.
chi_status_t decode_frame(const void *data, size_t length, Frame *f, std::string *why);

// A message part may also carry several frames back to back (a batch: the
// submits a client had queued, the results ready for one client).  Parses
// the frame at the start of data with the checks above, except that bytes
// may follow it (size <= length - header); *used = header + size.
chi_status_t decode_next_frame(const void *data, size_t length, Frame *f, size_t *used, std::string *why);
// Decodes the frames of one message part in order, calling fn(frame, offset
// of the frame in data) for each until it returns false.  CHI_OK, or
// CHI_ERR_PROTOCOL with *why at the first malformed frame (those before it
// were handed to fn).  An empty part is malformed too.
template <class Fn>
chi_status_t for_each_frame(const uint8_t *data, size_t size, std::string *why, Fn fn) {
  size_t off = 0;
  do {
    Frame f;
    size_t used = 0;
    if (chi_status_t s = decode_next_frame(data + off, size - off, &f, &used, why); s != CHI_OK) return s;
    if (!fn(f, off)) return CHI_OK;
    off += used;
  } while (off < size);
  return CHI_OK;
}
// Appends one frame to a batch under construction.
void append_frame(const Frame &f, std::string *out);
// A sender closes a batch (sends the message) once it holds this many bytes.
constexpr size_t kBatchBytes = 64 * 1024;
// The largest message part a peer sends when its frames carry at most
// max_payload bytes: a batch closes once it holds kBatchBytes, so its last
// frame may cross that line by a whole frame.  256 bytes cover CURVE's box
// around a part.  Each end sets ZMQ_MAXMSGSIZE to it: libzmq then refuses a
// larger frame from its header, before allocating it or any handshake.
constexpr size_t max_message_part(size_t max_payload) { return kBatchBytes + kFrameHeader + max_payload + 256; }

}  // namespace chi::ipc

#include "ipc/frame.h"

#include <cstring>

namespace chi::ipc {

namespace {

void put16(uint8_t *p, uint16_t v) {
  p[0] = uint8_t(v);
  p[1] = uint8_t(v >> 8);
}
void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i));
}
void put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = uint8_t(v >> (8 * i));
}
uint16_t get16(const uint8_t *p) { return uint16_t(p[0] | (p[1] << 8)); }
uint32_t get32(const uint8_t *p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}
uint64_t get64(const uint8_t *p) { return uint64_t(get32(p)) | (uint64_t(get32(p + 4)) << 32); }

}  // namespace

void encode_frame(const Frame &f, uint8_t *out) {
  put32(out, kFrameMagic);
  put16(out + 4, uint16_t(kProtocolVersion));
  put16(out + 6, uint16_t(f.kind));
  put64(out + 8, f.id);
  put32(out + 16, f.method);
  put32(out + 20, uint32_t(f.route));
  put32(out + 24, uint32_t(f.status));
  put32(out + 28, f.size);
  if (f.size) std::memcpy(out + kFrameHeader, f.payload, f.size);
}

void encode_frame(const Frame &f, std::string *out) {
  out->resize(kFrameHeader + f.size);
  encode_frame(f, reinterpret_cast<uint8_t *>(out->data()));
}

void append_frame(const Frame &f, std::string *out) {
  const size_t at = out->size();
  out->resize(at + kFrameHeader + f.size);
  encode_frame(f, reinterpret_cast<uint8_t *>(out->data()) + at);
}

chi_status_t decode_frame(const void *data, size_t length, Frame *f, std::string *why) {
  size_t used = 0;
  if (chi_status_t s = decode_next_frame(data, length, f, &used, why); s != CHI_OK) return s;
  if (used != length) {
    *why = "frame says " + std::to_string(f->size) + " payload bytes but carries " +
           std::to_string(length - kFrameHeader);
    return CHI_ERR_PROTOCOL;
  }
  return CHI_OK;
}

chi_status_t decode_next_frame(const void *data, size_t length, Frame *f, size_t *used, std::string *why) {
  const uint8_t *p = static_cast<const uint8_t *>(data);
  if (length < kFrameHeader) {
    *why = "frame of " + std::to_string(length) + " bytes is shorter than its header";
    return CHI_ERR_PROTOCOL;
  }
  if (get32(p) != kFrameMagic) {
    *why = "frame without the chimaera magic";
    return CHI_ERR_PROTOCOL;
  }
  uint16_t version = get16(p + 4);
  if (version != kProtocolVersion) {
    *why = "frame of protocol " + std::to_string(version) + ", this side speaks " + std::to_string(kProtocolVersion);
    return CHI_ERR_PROTOCOL;
  }
  uint16_t kind = get16(p + 6);
  if (kind < kFirstKind || kind > kLastKind) {
    *why = "unknown frame kind " + std::to_string(kind);
    return CHI_ERR_PROTOCOL;
  }
  uint32_t size = get32(p + 28);
  if (size > kMaxFramePayload || size > length - kFrameHeader) {
    *why = "frame says " + std::to_string(size) + " payload bytes but carries " +
           std::to_string(length - kFrameHeader);
    return CHI_ERR_PROTOCOL;
  }
  *used = kFrameHeader + size;
  f->kind = Kind(kind);
  f->id = get64(p + 8);
  f->method = get32(p + 16);
  f->route = int32_t(get32(p + 20));
  f->status = int32_t(get32(p + 24));
  f->size = size;
  f->payload = size ? p + kFrameHeader : nullptr;
  return CHI_OK;
}

}  // namespace chi::ipc

// Host side of the LL records shared with device code (chimaera_device.h):
// 8-byte words of {4 bytes of data, 4-byte flag}, each written by one store,
// so a reader that sees the flag it expects sees the data of that write.
#pragma once

#include <cstdint>
#include <cstring>

#include "chimaera_device.h"

namespace chi::gpu {

inline uint64_t ll_pack(uint32_t data, uint32_t flag) { return (uint64_t(flag) << 32) | data; }
inline uint32_t ll_flag(uint64_t w) { return uint32_t(w >> 32); }
inline uint32_t ll_data(uint64_t w) { return uint32_t(w); }
inline uint64_t ll_load(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
inline void ll_store(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

// Generations are 24 bits (a future's field) and never 0: device_protocol.h's
// rule, for host code that writes as a kernel would (tests/test_client_relay.cpp).
// The CPU->GPU executor's own words take theirs from slot::begin_nonzero.
inline uint32_t next_gen(uint32_t g) {
  g = (g + 1) & 0xFFFFFFu;
  return g ? g : 1;
}

inline uint32_t ll_words(uint32_t bytes) { return (bytes + 3) / 4; }

// Writes n (<= CHI_DEV_LL_INLINE) payload bytes into the data words of rec.
inline void ll_put_payload(uint64_t *rec, const void *src, uint32_t n, uint32_t flag) {
  const unsigned char *s = static_cast<const unsigned char *>(src);
  for (uint32_t j = 0, nw = ll_words(n); j < nw; ++j) {
    uint32_t w = 0;
    uint32_t take = n - 4 * j < 4 ? n - 4 * j : 4;
    std::memcpy(&w, s + 4 * j, take);
    ll_store(rec + CHI_DEV_LL_HEADER + j, ll_pack(w, flag));
  }
}

// Reads n payload bytes from the data words of rec; false if some word does
// not carry `flag` yet (the writer's stores are still on their way).
inline bool ll_get_payload(const uint64_t *rec, void *dst, uint32_t n, uint32_t flag) {
  unsigned char *d = static_cast<unsigned char *>(dst);
  for (uint32_t j = 0, nw = ll_words(n); j < nw; ++j) {
    uint64_t w = ll_load(rec + CHI_DEV_LL_HEADER + j);
    if (ll_flag(w) != flag) return false;
    uint32_t v = ll_data(w);
    uint32_t take = n - 4 * j < 4 ? n - 4 * j : 4;
    if (d) std::memcpy(d + 4 * j, &v, take);
  }
  return true;
}

// A GPU->CPU reply record's output of n (<= CHI_DEV_LL_INLINE) bytes: dense
// after the header words, complete once word 0 carries the generation (the
// writer stores it last, with release).
inline void reply_get_inline(const uint64_t *rec, void *dst, uint32_t n) {
  std::memcpy(dst, rec + CHI_DEV_LL_HEADER, n);
}

}  // namespace chi::gpu

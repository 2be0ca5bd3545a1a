#include "gpu/d2h_memory.h"

namespace chi::gpu {

void carve_d2h(const Shape &s, Carver &pinned, Carver &dev, D2hCarve *c) {
  const uint64_t rec = CHI_DEV_LL_WORDS * sizeof(uint64_t);
  const bool bufs = s.max_payload > CHI_DEV_LL_INLINE;
  c->ring = pinned.take(s.d2h_ring_entries * rec);
  c->reply = pinned.take(s.dslots * rec);
  c->buf = bufs ? pinned.take(s.dslots * s.payload_stride) : 0;
  c->diag = pinned.take(CHI_DEV_DIAG_WORDS * sizeof(uint64_t));
  c->state = dev.take(s.dslots * sizeof(uint32_t));
  c->bitmap = dev.take(s.dslots / 8);
  c->tail = dev.take(128);
  c->released = dev.take(128);
  c->wait_line = dev.take(256);
  c->regions = dev.take(sizeof(chi_dev_regions_t));
}

void fill_d2h_layout(const Shape &s, const D2hCarve &c, uint8_t *pinned_dev, uint8_t *dev, int32_t gpu,
                     int32_t ngpus, chi_dev_ctx_layout_t *l) {
  const bool bufs = s.max_payload > CHI_DEV_LL_INLINE;
  l->magic = CHI_DEV_CTX_MAGIC;
  l->gpu = gpu;
  l->max_payload = s.max_payload;
  l->slots = s.dslots;
  l->payload_stride = s.payload_stride;
  l->d2h_ring = reinterpret_cast<uint64_t *>(pinned_dev + c.ring);
  l->d2h_reply = reinterpret_cast<uint64_t *>(pinned_dev + c.reply);
  l->d2h_buf = bufs ? pinned_dev + c.buf : nullptr;
  l->d2h_state = reinterpret_cast<uint32_t *>(dev + c.state);
  l->d2h_bitmap = reinterpret_cast<uint32_t *>(dev + c.bitmap);
  l->d2h_tail = reinterpret_cast<uint64_t *>(dev + c.tail);
  l->regions = reinterpret_cast<chi_dev_regions_t *>(dev + c.regions);
  l->d2h_ring_entries = s.d2h_ring_entries;
  l->wait_spin_ns = s.wait_spin_ns;
  l->flags = 0;
  l->submit_timeout_us = s.submit_timeout_us;
  l->d2h_released = reinterpret_cast<uint32_t *>(dev + c.released);
  l->wait_line = reinterpret_cast<uint64_t *>(dev + c.wait_line);
  l->diag = reinterpret_cast<uint64_t *>(pinned_dev + c.diag);
  l->lease_us = uint32_t(s.lease_ns / 1000);
  l->ngpus = ngpus;
}

}  // namespace chi::gpu

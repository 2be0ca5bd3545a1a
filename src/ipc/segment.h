// The shared-memory segment of one client session: a header, a submission
// ring of slot indices (client threads produce, one server poller consumes)
// and the client's task slots.  Both sides compile this file; the server
// trusts nothing it reads here (see server/session.cpp).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace chi::ipc {

constexpr uint32_t kSegmentMagic = 0x53494843u;  // "CHIS"

// Server state word of the segment header.
enum : uint32_t { kServing = 1, kStopping = 2, kGone = 3 };

// Slot state word: generation (24 bits) << 8 | state (low 7 bits) | kSleeper.
enum : uint32_t {
  kSlotFree = 0,
  kSlotSubmitted = 1,  // written by the client before it queues the slot
  kSlotDone = 2,       // written by the server with the result
  kSlotStateMask = 0x7F,
  kSlotSleeper = 0x80,  // a client thread sleeps on the word: the server wakes it
};
constexpr uint32_t kSlotGenMask = 0xFFFFFFu;

inline uint32_t slot_word(uint32_t gen, uint32_t st) { return (gen << 8) | st; }
inline uint32_t slot_gen(uint32_t w) { return w >> 8; }
inline uint32_t slot_state(uint32_t w) { return w & kSlotStateMask; }

struct SegmentHeader {
  uint32_t magic;
  uint32_t protocol;
  uint32_t nslots;       // slots and ring cells, a power of two
  uint32_t max_payload;  // bytes of input and of output per slot
  uint64_t slot_stride;
  uint64_t ring_offset;
  uint64_t slots_offset;
  uint64_t size;
  // Written by the server only.
  alignas(64) std::atomic<uint32_t> server_state;
  // 1 while the session's poller sleeps: a client that queues a task must
  // then ring the session's doorbell.  Written by the server.
  alignas(64) std::atomic<uint32_t> doorbell_armed;
  // Ticket of the client's producers (never read by the server).
  alignas(64) std::atomic<uint32_t> tail;
};

// One ring cell (Vyukov): seq == pos: free for the producer of position pos;
// seq == pos + 1: holds a slot index for the consumer; the consumer hands it
// back with seq = pos + nslots.  Positions wrap at 2^32.
struct RingCell {
  std::atomic<uint32_t> seq;
  uint32_t slot;
};

struct SlotHeader {
  std::atomic<uint32_t> state;
  uint32_t method;      // client -> server
  int32_t route;        // client -> server
  uint32_t input_size;  // client -> server
  int32_t status;       // server -> client
  uint32_t output_size; // server -> client
  uint32_t reserved[10];
};
static_assert(sizeof(SlotHeader) == 64, "a slot header is one cache line");

// The layout both sides derive from (nslots, max_payload).
struct SegmentLayout {
  uint32_t nslots;
  uint32_t max_payload;
  uint64_t slot_stride;
  uint64_t ring_offset;
  uint64_t slots_offset;
  uint64_t size;
};

inline uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) & ~(a - 1); }

inline SegmentLayout segment_layout(uint32_t nslots, uint32_t max_payload) {
  SegmentLayout l;
  l.nslots = nslots;
  l.max_payload = max_payload;
  // [header | output | input]: the output starts on the header's line pair.
  l.slot_stride = align_up(sizeof(SlotHeader) + align_up(max_payload, 64) + align_up(max_payload, 64), 128);
  l.ring_offset = align_up(sizeof(SegmentHeader), 4096);
  l.slots_offset = align_up(l.ring_offset + uint64_t(nslots) * sizeof(RingCell), 4096);
  l.size = align_up(l.slots_offset + uint64_t(nslots) * l.slot_stride, 4096);
  return l;
}

// Typed views of a mapped segment (base is the mapping, layout its shape).
struct SegmentView {
  uint8_t *base = nullptr;
  SegmentLayout layout{};

  SegmentHeader *header() const { return reinterpret_cast<SegmentHeader *>(base); }
  RingCell *ring() const { return reinterpret_cast<RingCell *>(base + layout.ring_offset); }
  SlotHeader *slot(uint32_t i) const {
    return reinterpret_cast<SlotHeader *>(base + layout.slots_offset + uint64_t(i) * layout.slot_stride);
  }
  uint8_t *output(uint32_t i) const { return reinterpret_cast<uint8_t *>(slot(i)) + sizeof(SlotHeader); }
  uint8_t *input(uint32_t i) const { return output(i) + align_up(layout.max_payload, 64); }
};

// Fills a fresh (zeroed) segment: header, ring sequence numbers, free slots.
inline void init_segment(const SegmentView &v, uint32_t protocol) {
  SegmentHeader *h = v.header();
  h->magic = kSegmentMagic;
  h->protocol = protocol;
  h->nslots = v.layout.nslots;
  h->max_payload = v.layout.max_payload;
  h->slot_stride = v.layout.slot_stride;
  h->ring_offset = v.layout.ring_offset;
  h->slots_offset = v.layout.slots_offset;
  h->size = v.layout.size;
  h->server_state.store(kServing, std::memory_order_relaxed);
  h->doorbell_armed.store(0, std::memory_order_relaxed);
  h->tail.store(0, std::memory_order_relaxed);
  for (uint32_t i = 0; i < v.layout.nslots; ++i) v.ring()[i].seq.store(i, std::memory_order_relaxed);
}

}  // namespace chi::ipc

// Both sides of the shared-memory task protocol, as steps over a mapped
// segment (ipc/segment.h): the client posts a task and queues its slot, the
// server takes it and publishes the result, the client reads it.  One header
// that both sides compile, so that the steps are tested in one process
// (tests/test_ipc.cpp) and the two sides cannot drift apart.
//
// The server trusts nothing in the segment: every step it runs copies what it
// reads first and returns the copy for checking (no double fetch).
#pragma once

#include <sched.h>

#include <atomic>
#include <cstring>

#include "base/futex.h"
#include "chimaera.h"
#include "ipc/segment.h"

namespace chi::ipc {

// ---- client side

// Writes a task into its slot and marks it submitted with generation gen.
inline void post_task(const SegmentView &v, uint32_t slot, uint32_t gen, uint32_t method, int32_t route,
                      const void *input, uint32_t input_size) {
  SlotHeader *h = v.slot(slot);
  h->method = method;
  h->route = route;
  h->input_size = input_size;
  if (input_size) std::memcpy(v.input(slot), input, input_size);
  h->state.store(slot_word(gen, kSlotSubmitted), std::memory_order_relaxed);
}

// Queues a slot index (Vyukov producer; the ring never holds more than
// nslots, so a cell is only ever busy for the moment between the server's
// take and its hand-back).  alive() is asked now and then while it waits for
// that; false ends the push (returns false).  Returns true when queued and
// *ring says whether the server's poller sleeps (the client must then ring
// the session's doorbell).
template <class Alive>
bool ring_push(const SegmentView &v, uint32_t slot, Alive alive, bool *ring) {
  SegmentHeader *sh = v.header();
  const uint32_t mask = v.layout.nslots - 1;
  const uint32_t pos = sh->tail.fetch_add(1, std::memory_order_relaxed);
  RingCell &cell = v.ring()[pos & mask];
  for (unsigned spins = 1; cell.seq.load(std::memory_order_acquire) != pos; ++spins) {
    cpu_relax();
    if (spins % 4096 == 0) {
      if (!alive()) return false;
      sched_yield();
    }
  }
  cell.slot = slot;
  cell.seq.store(pos + 1, std::memory_order_release);
  // The poller arms the doorbell, then looks at the ring once more: with a
  // fence on both sides, one of us sees the other.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  *ring = sh->doorbell_armed.load(std::memory_order_relaxed) != 0;
  return true;
}

// What a finished task left in its slot (a copy of the header's fields).
struct TaskResult {
  chi_status_t status = CHI_OK;
  uint32_t size = 0;
  const uint8_t *output = nullptr;  // in the segment
};

// Reads the result of a slot whose state word said done; false when the
// output size is over the slot's payload (a broken server).
inline bool read_result(const SegmentView &v, uint32_t slot, TaskResult *r) {
  const SlotHeader *h = v.slot(slot);
  r->size = h->output_size;
  r->status = h->status;
  r->output = v.output(slot);
  return r->size <= v.layout.max_payload;
}

// ---- server side

// True when the cell at ring position head holds a queued slot.
inline bool ring_ready(const SegmentView &v, uint32_t head) {
  return v.ring()[head & (v.layout.nslots - 1)].seq.load(std::memory_order_acquire) == head + 1;
}

// The slot index queued at head (a copy: unchecked); false when none is.
inline bool ring_peek(const SegmentView &v, uint32_t head, uint32_t *slot) {
  const RingCell &cell = v.ring()[head & (v.layout.nslots - 1)];
  if (cell.seq.load(std::memory_order_acquire) != head + 1) return false;
  *slot = cell.slot;
  return true;
}

// Hands the cell at *head back to the producers and moves on.
inline void ring_pop(const SegmentView &v, uint32_t *head) {
  v.ring()[*head & (v.layout.nslots - 1)].seq.store(*head + v.layout.nslots, std::memory_order_release);
  ++*head;
}

// A copy of a queued slot's request, to check before use.
struct TaskRecord {
  uint32_t word;
  uint32_t method;
  int32_t route;
  uint32_t input_size;
};

inline TaskRecord read_task(const SegmentView &v, uint32_t slot) {
  const SlotHeader *h = v.slot(slot);
  TaskRecord r;
  r.word = h->state.load(std::memory_order_acquire);
  r.method = h->method;
  r.route = h->route;
  r.input_size = h->input_size;
  return r;
}

// Writes a result into the slot and marks it done; wakes a client thread that
// sleeps on the word.  An output over the slot's payload (a handler that broke
// its contract) becomes CHI_ERR_INTERNAL, never an overflow.
inline void publish_result(const SegmentView &v, uint32_t slot, uint32_t gen, chi_status_t status,
                           const void *output, size_t size) {
  SlotHeader *h = v.slot(slot);
  if (size > v.layout.max_payload) {
    status = CHI_ERR_INTERNAL;
    size = 0;
  }
  if (size && output != v.output(slot)) std::memcpy(v.output(slot), output, size);
  h->status = status;
  h->output_size = uint32_t(size);
  const uint32_t old = h->state.exchange(slot_word(gen, kSlotDone), std::memory_order_acq_rel);
  if (old & kSlotSleeper) futex_wake_shared(&h->state);
}

}  // namespace chi::ipc

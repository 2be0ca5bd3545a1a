/*
 * chimaera/device_protocol.h -- the protocol behind the device API: how a
 * thread takes a task slot, what a device future encodes, the GPU->GPU
 * slots and bells, the GPU->CPU ring and its LL records, and the reply reads.
 *
 * Included by chimaera_device.h; not meant for direct use.  Everything is in
 * namespace chi_dev_detail and runs on the device.  The layout it works on is
 * in chimaera/device_layout.h, every cross-thread access goes through
 * chimaera/gpu_port.h; the orchestrator's side (running the tasks) is in
 * chimaera/device_orchestrator.h.
 *
 * A task's life on either route: a bit of the route's slot bitmap is taken
 * (bitmap_alloc), the slot's state word gets a new generation and SUBMITTED,
 * the task is published (local_publish: the slot's LL words and a flip of
 * its bell bit; cpu_publish: a ring entry), the orchestrator or a CPU
 * poller answers, and the waiter claims the slot (WAITING, SUBMITTED or
 * DONE -> CLAIMED) and frees its bit.
 */
#ifndef CHIMAERA_DEVICE_PROTOCOL_H
#define CHIMAERA_DEVICE_PROTOCOL_H

#include <stdint.h>

#include "chimaera/gpu_port.h"
#include "chimaera/device_diag.h"
#include "chimaera/device_layout.h"

#if defined(CHI_GPU_COMPILER) && defined(__cplusplus)

namespace chi_dev_detail {

using chi_dev_layout = chi_dev_ctx_layout_t;

constexpr uint32_t kFutureTag = 0xD7u;
constexpr uint32_t kKindLocal = 1u;
constexpr uint32_t kKindCpu = 2u;
constexpr uint32_t kKindPeer = 3u; /* GPU->GPU on another GPU of the runtime (its number in the future) */

CHI_DEVICE const chi_dev_layout *layout(const chi_dev_context_t *ctx) {
  return reinterpret_cast<const chi_dev_layout *>(ctx);
}
CHI_DEVICE uint64_t ll_pack(uint32_t data, uint32_t flag) {
  return (static_cast<uint64_t>(flag) << 32) | data;
}
CHI_DEVICE uint32_t ll_flag(uint64_t w) { return static_cast<uint32_t>(w >> 32); }
CHI_DEVICE uint32_t ll_data(uint64_t w) { return static_cast<uint32_t>(w); }
CHI_DEVICE uint32_t next_gen(uint32_t g) {
  g = (g + 1u) & 0xFFFFFFu;
  return g ? g : 1u;
}
CHI_DEVICE uint32_t prev_gen(uint32_t g) { return g > 1u ? g - 1u : 0xFFFFFFu; }
/* Device futures: tag (8) | kind (4) | GPU of a peer future (4) | generation (24) | slot + 1 (24). */
constexpr int32_t kMaxPeerGpus = 16;
CHI_DEVICE chi_future_t make_future(uint32_t kind, uint32_t gen, uint32_t slot, uint32_t gpu = 0u) {
  return (static_cast<uint64_t>(kFutureTag) << 56) | (static_cast<uint64_t>(kind) << 52) |
         (static_cast<uint64_t>(gpu & 0xFu) << 48) | (static_cast<uint64_t>(gen & 0xFFFFFFu) << 24) |
         ((slot + 1u) & 0xFFFFFFu);
}
CHI_DEVICE bool split_future(chi_future_t f, uint32_t slots, uint32_t *kind, uint32_t *gen,
                             uint32_t *slot, uint32_t *gpu) {
  uint32_t low = static_cast<uint32_t>(f & 0xFFFFFFu);
  if ((f >> 56) != kFutureTag || low == 0 || low > slots) return false;
  *kind = static_cast<uint32_t>((f >> 52) & 0xFu);
  *gpu = static_cast<uint32_t>((f >> 48) & 0xFu);
  *gen = static_cast<uint32_t>((f >> 24) & 0xFFFFFFu);
  *slot = low - 1u;
  return *kind == kKindLocal || *kind == kKindCpu || *kind == kKindPeer;
}
/* GPU n's context as this GPU's kernels reach it, or NULL (no such entry,
 * or no peer access). */
CHI_DEVICE const chi_dev_layout *peer_layout(const chi_dev_layout *l, int32_t n) {
  if (l->peers == nullptr || n < 0 || n >= l->ngpus || n >= kMaxPeerGpus) return nullptr;
  const chi_dev_layout *p = l->peers + n;
  return chi_port::ld_relaxed_dev(&p->magic) == CHI_DEV_CTX_MAGIC ? p : nullptr;
}

/* Where a thread starts its slot search: warp-specific (GPU-NOTES: a scan
 * from 0 by every warp is measurably slower), lanes of a warp apart. */
CHI_DEVICE uint32_t search_start(uint32_t nwords) {
  uint64_t block = (static_cast<uint64_t>(blockIdx.z) * gridDim.y + blockIdx.y) * gridDim.x +
                   blockIdx.x;
  uint32_t tid = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
  uint64_t warp = (block * (blockDim.x * blockDim.y * blockDim.z) + tid) / CHI_WARP_SIZE;
  uint32_t lane = chi_port::lane_id();
  return static_cast<uint32_t>(warp * 0x9E3779B1u + lane * 7u) & (nwords - 1u);
}

/* One bit per slot; device-memory atomics only. */
CHI_DEVICE int32_t bitmap_alloc(uint32_t *bm, uint32_t nslots) {
  const uint32_t nwords = nslots >> 5;
  const uint32_t start = search_start(nwords);
  /* First a guess (one atomic, no read before it): mostly free when few slots are in use. */
  const uint32_t guess = (start * 7u + chi_port::lane_id()) & 31u;
  uint32_t v = chi_port::fetch_or_acquire_dev(bm + start, 1u << guess);
  if (!(v & (1u << guess))) return static_cast<int32_t>(start * 32u + guess);
  v |= 1u << guess;
  for (uint32_t i = 0; i < nwords; ++i) {
    uint32_t w = (start + i) & (nwords - 1u);
    if (i) v = chi_port::ld_relaxed_dev(bm + w);
    while (v != 0xFFFFFFFFu) {
      uint32_t bit = static_cast<uint32_t>(chi_port::ffs32(~v) - 1);
      uint32_t old = chi_port::fetch_or_acquire_dev(bm + w, 1u << bit);
      if (!(old & (1u << bit))) return static_cast<int32_t>(w * 32u + bit);
      v = old | (1u << bit);
    }
  }
  return -1;
}
/* One look at `span` (<= 8) words from `start`, loaded together: a waiting
 * submit retries with this instead of a full scan, whose dependent loads
 * take tens of microseconds when every slot is taken. */
CHI_DEVICE int32_t bitmap_alloc_window(uint32_t *bm, uint32_t nwords, uint32_t start, uint32_t span) {
  uint32_t v[8];
#pragma unroll
  for (uint32_t k = 0; k < 8u; ++k)
    v[k] = k < span ? chi_port::ld_relaxed_dev(bm + ((start + k) & (nwords - 1u))) : 0xFFFFFFFFu;
#pragma unroll
  for (uint32_t k = 0; k < 8u; ++k) {
    const uint32_t w = (start + k) & (nwords - 1u);
    uint32_t x = v[k];
    while (x != 0xFFFFFFFFu) {
      const uint32_t bit = static_cast<uint32_t>(chi_port::ffs32(~x) - 1);
      const uint32_t old = chi_port::fetch_or_acquire_dev(bm + w, 1u << bit);
      if (!(old & (1u << bit))) return static_cast<int32_t>(w * 32u + bit);
      x = old | (1u << bit);
    }
  }
  return -1;
}

/* Whether a submit may wait (for a slot, or for the gate): chi_dev_submit,
 * not a try, not the orchestrator's own handlers, a timeout set. */
CHI_DEVICE bool may_wait(const chi_dev_layout *l, bool wait) {
  return wait && !(l->flags & CHI_DEV_CTX_ORCHESTRATOR) && l->submit_timeout_us != 0;
}

/* A slot of a route for a submit.  wait: chi_dev_submit, which waits up to
 * the context's submit_timeout_us for a slot to be freed; never in the
 * orchestrator's own context (CHI_DEV_CTX_ORCHESTRATOR): a handler that
 * waited there could wait for slots held by kernels that wait for the very
 * orchestrator it blocks.
 * Waiting submits stand in line (line[0]: tickets taken, line[1]: served):
 * only the oldest `allowed` look for a freed slot, and a newcomer goes
 * straight in only while nobody waits (or with one random bit).  Without
 * the line, a thread that just freed a slot took it again at once (its
 * search starts where it found the last one) and others waited up to
 * 0.23 s for a turn (H100, 1056 warps x 32 lanes over 8192 slots).  Those
 * allowed look at a few words from a new place each round, with short naps,
 * so they neither flood the bitmap nor starve the tasks that free slots. */
CHI_DEVICE int32_t slot_alloc(const chi_dev_ctx_layout_t *l, uint32_t *bm, uint64_t *line, bool wait) {
  if (!may_wait(l, wait)) return bitmap_alloc(bm, l->slots);
  const uint32_t nwords = l->slots >> 5;
  uint32_t start = (search_start(nwords) + static_cast<uint32_t>(chi_port::timer_ns() >> 7)) & (nwords - 1u);
  const uint32_t bit = (start * 7u + chi_port::lane_id()) & 31u;
  if (!(chi_port::fetch_or_acquire_dev(bm + start, 1u << bit) & (1u << bit)))
    return static_cast<int32_t>(start * 32u + bit);
  if (chi_port::ld_relaxed_dev(line) == chi_port::ld_relaxed_dev(line + 1)) {
    const int32_t s = bitmap_alloc(bm, l->slots);
    if (s >= 0) return s;
  }
  const uint64_t ticket = chi_port::fetch_add_dev(line, static_cast<uint64_t>(1));
  const uint64_t allowed = l->slots >> 3; /* >= 4: enough searchers that a freed bit is found at once */
  const uint32_t span = nwords < 8u ? nwords : 8u;
  const uint64_t t0 = chi_port::timer_ns();
  const uint64_t limit = static_cast<uint64_t>(l->submit_timeout_us) * 1000u;
  for (uint32_t round = 1;; ++round) {
    /* Signed: others served out of turn may have moved `served` past this ticket. */
    const int64_t ahead = static_cast<int64_t>(ticket - chi_port::ld_relaxed_dev(line + 1));
    if (ahead < static_cast<int64_t>(allowed)) {
      start = (start + 0x9E3779B1u * round + static_cast<uint32_t>(chi_port::timer_ns() >> 6)) & (nwords - 1u);
      const int32_t s = bitmap_alloc_window(bm, nwords, start, span);
      if (s >= 0) {
        chi_port::fetch_add_dev(line + 1, static_cast<uint64_t>(1));
        return s;
      }
      chi_port::nanosleep(128);
    } else {
      /* Far back in the line: look again about when the turn may come (a
       * slot goes round in some 100 ns at full load), so thousands of
       * waiters do not hammer the served counter. */
      const uint64_t far = static_cast<uint64_t>(ahead - static_cast<int64_t>(allowed)) * 64u;
      chi_port::nanosleep(far < 1024u ? 1024u : far > 200000u ? 200000u : static_cast<uint32_t>(far));
    }
    if (chi_port::timer_ns() - t0 >= limit) {
      chi_port::fetch_add_dev(line + 1, static_cast<uint64_t>(1)); /* out of the line */
      return bitmap_alloc(bm, l->slots);
    }
  }
}

CHI_DEVICE void bitmap_free(uint32_t *bm, uint32_t slot) {
  chi_port::fetch_and_release_dev(bm + (slot >> 5), ~(1u << (slot & 31u)));
}
/* Without the release: for a thread whose only accesses to the slot that
 * the next owner must see are loads it has already used the values of. */
CHI_DEVICE void bitmap_free_relaxed(uint32_t *bm, uint32_t slot) {
  chi_port::red_and_dev(bm + (slot >> 5), ~(1u << (slot & 31u)));
}

/* Byte copy by one thread, with plain (weak) loads.  Out of the runtime's
 * padded buffers (src_padded), and from 16-byte aligned user input past 64
 * bytes, 16-byte pieces go kCopyBatch at a time: all the loads first, then
 * all the stores.  A load-store loop waits for each load before issuing the next
 * (the compiler must assume dst may alias src), so it pays one memory round
 * trip per 16 bytes: measured on an H100 (gpu_breakdown's probes), one
 * thread copying 4 KiB took 330 us out of pinned host memory that way and
 * 47 us with 8 loads in flight; 40 us and 7.4 us between device buffers.
 * The batch costs registers in every kernel that submits or waits (an 8-deep
 * batch took chimaera-bench's throughput kernel from 156 to 189-240
 * registers), so the default is 4; define CHI_DEV_COPY_BATCH before including
 * chimaera_device.h to change it.  src_padded: src may be read up to n
 * rounded up to 16 (the runtime's slot buffers), so the tail comes from the
 * last vector, not from up to 15 byte loads.  Reading host memory, the
 * caller orders it after the flag it polled (fence_acquire_sys). */
#ifndef CHI_DEV_COPY_BATCH
#define CHI_DEV_COPY_BATCH 4
#endif
constexpr uint32_t kCopyBatch = CHI_DEV_COPY_BATCH;
static_assert(kCopyBatch >= 1u && kCopyBatch <= 16u, "CHI_DEV_COPY_BATCH: 1 to 16");
/* The first m (<= 16) bytes of v to d, any alignment. */
CHI_DEVICE void store_bytes16(uint8_t *d, uint4 v, uint32_t m) {
  const uint32_t x[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (uint32_t b = 0; b < 16u; ++b)
    if (b < m) d[b] = static_cast<uint8_t>(x[b / 4u] >> (8u * (b & 3u)));
}
CHI_DEVICE void thread_copy(void *dst, const void *src, uint32_t n, bool src_padded = false) {
  uint8_t *d = static_cast<uint8_t *>(dst);
  const uint8_t *s = static_cast<const uint8_t *>(src);
  const bool s16 = (reinterpret_cast<uintptr_t>(s) & 15u) == 0;
  const bool d16 = (reinterpret_cast<uintptr_t>(d) & 15u) == 0;
  uint32_t i = 0;
  if (s16 && (src_padded || (d16 && n > 64u))) {
    const uint4 *s4 = reinterpret_cast<const uint4 *>(s);
    const uint32_t nv = src_padded ? (n + 15u) / 16u : n / 16u; /* vectors to load */
    for (uint32_t j = 0; j < nv; j += kCopyBatch) {
      uint4 v[kCopyBatch];
#pragma unroll
      for (uint32_t k = 0; k < kCopyBatch; ++k)
        if (j + k < nv) v[k] = s4[j + k];
#pragma unroll
      for (uint32_t k = 0; k < kCopyBatch; ++k) {
        const uint32_t o = 16u * (j + k);
        if (j + k >= nv) break;
        if (d16 && o + 16u <= n) *reinterpret_cast<uint4 *>(d + o) = v[k];
        else store_bytes16(d + o, v[k], n - o < 16u ? n - o : 16u);
      }
    }
    if (src_padded) return;
    i = 16u * nv;
  } else if (s16 && d16) {
    for (; i + 16u <= n; i += 16u) *reinterpret_cast<uint4 *>(d + i) = *reinterpret_cast<const uint4 *>(s + i);
  } else if (((reinterpret_cast<uintptr_t>(d) | reinterpret_cast<uintptr_t>(s)) & 3u) == 0) {
    for (; i + 4u <= n; i += 4u) *reinterpret_cast<uint32_t *>(d + i) = *reinterpret_cast<const uint32_t *>(s + i);
  }
  for (; i < n; ++i) d[i] = s[i];
}

/* The first n (<= 64) bytes of v0..v3 to d, any alignment: an output read
 * together with its header, written out of registers. */
CHI_DEVICE void put_first64(void *dst, uint32_t n, uint4 v0, uint4 v1, uint4 v2, uint4 v3) {
  uint8_t *d = static_cast<uint8_t *>(dst);
  const bool d16 = (reinterpret_cast<uintptr_t>(d) & 15u) == 0;
  const uint4 v[4] = {v0, v1, v2, v3};
#pragma unroll
  for (uint32_t k = 0; k < 4u; ++k) {
    const uint32_t o = 16u * k;
    if (o >= n) break;
    if (d16 && o + 16u <= n) *reinterpret_cast<uint4 *>(d + o) = v[k];
    else store_bytes16(d + o, v[k], n - o < 16u ? n - o : 16u);
  }
}

/* Reads 4 bytes of a payload as an LL data word (zero padded past n). */
CHI_DEVICE uint32_t load_word(const uint8_t *p, uint32_t off, uint32_t n) {
  if (off + 4u <= n && (reinterpret_cast<uintptr_t>(p + off) & 3u) == 0)
    return *reinterpret_cast<const uint32_t *>(p + off);
  uint32_t w = 0;
  for (uint32_t b = 0; b < 4u && off + b < n; ++b) w |= static_cast<uint32_t>(p[off + b]) << (8u * b);
  return w;
}
CHI_DEVICE void store_word(uint8_t *p, uint32_t off, uint32_t n, uint32_t w) {
  if (off + 4u <= n && (reinterpret_cast<uintptr_t>(p + off) & 3u) == 0) {
    *reinterpret_cast<uint32_t *>(p + off) = w;
    return;
  }
  for (uint32_t b = 0; b < 4u && off + b < n; ++b) p[off + b] = static_cast<uint8_t>(w >> (8u * b));
}

CHI_DEVICE uint64_t round_words(uint32_t bytes) { return (bytes + 3u) / 4u; }

/* The GPU->GPU gate (docs/gpu.md, "Coexisting with other CUDA code"):
 * every submitter holds it from its slot to its bell; an orchestrator that
 * steps aside sets kGateAway, waits for those inside, serves every bell and
 * ends.  One word, so the submitter's add and the orchestrator's or are
 * ordered: either the submitter sees the bit, or the orchestrator sees the
 * submitter and waits for its bell. */
constexpr uint64_t kGateAway = 1ull << 63;
CHI_DEVICE bool gate_enter(const chi_dev_layout *l) {
  if (!(chi_port::fetch_add_dev(l->gate, static_cast<uint64_t>(1)) & kGateAway)) return true;
  chi_port::fetch_add_dev(l->gate, ~static_cast<uint64_t>(0));
  return false;
}
CHI_DEVICE void gate_leave(const chi_dev_layout *l) {
  chi_port::fetch_add_release_dev(l->gate, ~static_cast<uint64_t>(0)); /* the task and its bell before it */
}
/* Whether the lease thread is on its way to the next launch and in no CUDA
 * call (CHI_DIAG_LEASE_PHASE: sleeping towards the lease's end, or waiting
 * for the running launch to end behind a queued successor): then no
 * device-wide call can be holding it back.  A read of pinned host memory. */
CHI_DEVICE bool lease_thread_coming(const chi_dev_layout *l, uint64_t *phase) {
  if (l->diag == nullptr) return false;
  *phase = chi_port::ll_load8(l->diag + CHI_DIAG_LEASE_PHASE);
  return *phase == CHI_DIAG_PHASE_SLEEP || *phase == CHI_DIAG_PHASE_WAIT_END;
}

/* A submitter that found the gate closed: waits for the next launch to open
 * it, or never (try, or the orchestrator's own handlers).  The device-wide
 * call that made the orchestrator step aside may be waiting for this very
 * kernel: the wait ends after two leases in which the lease thread was not
 * seen on its way (lease_thread_coming: it may be held in a CUDA call), and
 * after gpu.device_submit_timeout_us in any case.  A lease thread that the
 * host's scheduler runs late, or a successor that waits for another
 * process's time slice on the GPU (a relaunch over two leases after a
 * step-aside: docs/gpu.md), no longer makes the submit give up.
 * True when the gate opened. */
CHI_DEVICE bool gate_wait(const chi_dev_layout *l, bool wait) {
  if (!may_wait(l, wait)) return false;
  const uint64_t timeout = static_cast<uint64_t>(l->submit_timeout_us) * 1000u;
  uint64_t bound = 2ull * l->lease_us * 1000u;
  if (bound == 0 || bound > timeout) bound = timeout;
  const uint64_t t0 = chi_port::timer_ns();
  uint64_t held_since = t0; /* since when the lease thread was not seen coming */
  uint64_t phase = 0;
  for (uint32_t i = 0; chi_port::ld_relaxed_dev(l->gate) & kGateAway; ++i) {
    const uint64_t now = chi_port::timer_ns();
    /* A look every 16 naps (~20-40 us): thousands of waiting warps must not
     * fill PCIe with it. */
    if ((i & 15u) == 0u && lease_thread_coming(l, &phase)) held_since = now;
    /* A fresh look before giving up: the kernel may have been off the GPU
     * since the last one (another process's time slice, no MPS). */
    if (now - held_since >= bound && (i & 15u) != 0u && lease_thread_coming(l, &phase)) held_since = now;
    if (now - held_since >= bound || now - t0 >= timeout) {
      if (l->diag) { /* for the watchdogs and the CHI_ERR_AGAIN reports (device_diag.h) */
        chi_port::ll_store8(l->diag + CHI_DIAG_GATE_GAVE_UP_WHY,
                            ((now - t0) / 1000u) << 32 | (now - t0 >= timeout ? 1u << 8 : 0u) | (phase & 0xFFu));
        chi_port::ll_store8(l->diag + CHI_DIAG_GATE_GAVE_UP_AT, now);
      }
      return false;
    }
    chi_port::nanosleep(1024);
  }
  return true;
}

/* GPU->GPU slots (docs/gpu.md, "GPU->GPU: bells and LL slots";
 * device_layout.h): the header's LL words, the plain input at
 * +CHI_DEV_SLOT_HEADER, the plain output one payload_stride further. */
CHI_DEVICE uint8_t *d2d_slot(const chi_dev_layout *l, uint32_t slot) {
  return l->d2d_slots + static_cast<uint64_t>(slot) * (CHI_DEV_SLOT_HEADER + 2u * l->payload_stride);
}
CHI_DEVICE uint64_t *d2d_words(const chi_dev_layout *l, uint32_t slot) {
  return reinterpret_cast<uint64_t *>(d2d_slot(l, slot));
}
CHI_DEVICE uint64_t *d2d_in_ll(const chi_dev_layout *l, uint32_t slot) {
  return reinterpret_cast<uint64_t *>(d2d_slot(l, slot) + CHI_DEV_D2D_IN_LL);
}
CHI_DEVICE uint64_t *d2d_out_ll(const chi_dev_layout *l, uint32_t slot) {
  return reinterpret_cast<uint64_t *>(d2d_slot(l, slot) + CHI_DEV_D2D_OUT_LL);
}
CHI_DEVICE uint8_t *d2d_in(const chi_dev_layout *l, uint32_t slot) {
  return d2d_slot(l, slot) + CHI_DEV_SLOT_HEADER;
}
CHI_DEVICE uint8_t *d2d_out(const chi_dev_layout *l, uint32_t slot) {
  return d2d_slot(l, slot) + CHI_DEV_SLOT_HEADER + l->payload_stride;
}
constexpr uint32_t kD2dLlWords = CHI_DEV_D2D_LL_BYTES / 4u;

/* A slot's LL areas (input, output) never hold a word that carries the
 * generation of the task about to use them (docs/gpu.md, "Why a repeated
 * generation is harmless"): each writer stores its payload's words with its
 * generation and zeros (flag 0, never a generation) into the words the
 * slot's previous task left beyond them.  So any word that carries a task's
 * generation is that task's, whenever a reader loaded it.  ll_extent: the
 * words a task of `bytes` leaves (written in pairs; none for a plain
 * payload over CHI_DEV_D2D_LL_BYTES, whose writer cleared them).  ll_left:
 * those of the slot's previous task, from its size word `w` (request word 1
 * for the input, reply word 3 for the output), which carries the previous
 * generation `prev`; any other flag: all of them. */
CHI_DEVICE uint32_t ll_extent(uint32_t bytes) {
  return bytes > CHI_DEV_D2D_LL_BYTES ? 0u : static_cast<uint32_t>(round_words(bytes) + 1u) & ~1u;
}
CHI_DEVICE uint32_t ll_left(uint64_t w, uint32_t prev) {
  return ll_flag(w) == prev ? ll_extent(ll_data(w)) : kD2dLlWords;
}

/* load_word and store_word out of line, for the unaligned and partial
 * words of the LL copies below: those stay short inlined (code a waiting
 * kernel runs once per task is fetched anew each time; on an H200 the
 * 64-byte wait's last stage took 1.44 us with the byte loops inline and
 * volatile LL accesses, 0.90 us out of line and relaxed). */
CHI_DEVICE_NOINLINE uint32_t ll_word_slow(const uint8_t *p, uint32_t j, uint32_t n) {
  return load_word(p, 4u * j, n);
}
CHI_DEVICE_NOINLINE void ll_bytes_slow(uint8_t *d, uint32_t x, uint32_t m) { store_word(d, 0u, m, x); }

/* Writes n (<= CHI_DEV_D2D_LL_BYTES) bytes of src to dst as LL words with
 * `flag`: every data word loaded first (plain loads, in flight at once),
 * then 16-byte stores; the words from there up to `left` (the previous
 * writer's ll_extent) get zeros. */
CHI_DEVICE void ll_put(uint64_t *dst, const void *src, uint32_t n, uint32_t flag, uint32_t left = 0u) {
  const uint8_t *in = static_cast<const uint8_t *>(src);
  const uint32_t nw = static_cast<uint32_t>(round_words(n));
  const bool a4 = (reinterpret_cast<uintptr_t>(in) & 3u) == 0;
  uint32_t v[kD2dLlWords + 1u];
#pragma unroll
  for (uint32_t j = 0; j < kD2dLlWords + 1u; ++j)
    v[j] = j >= nw ? 0u : a4 && 4u * j + 4u <= n ? reinterpret_cast<const uint32_t *>(in)[j] : ll_word_slow(in, j, n);
#pragma unroll
  for (uint32_t j = 0; j < kD2dLlWords; j += 2u)
    if (j < nw) chi_port::ll_store16_dev(dst + j, ll_pack(v[j], flag), ll_pack(v[j + 1u], flag));
    else if (j < left) chi_port::ll_store16_dev(dst + j, 0u, 0u);
}
/* The first n (<= CHI_DEV_D2D_LL_BYTES) bytes of LL words w to dst. */
CHI_DEVICE void ll_get(void *dst, const uint64_t *w, uint32_t n) {
  uint8_t *d = static_cast<uint8_t *>(dst);
  const bool a4 = (reinterpret_cast<uintptr_t>(d) & 3u) == 0;
#pragma unroll
  for (uint32_t j = 0; j < kD2dLlWords; ++j) {
    if (4u * j >= n) break;
    if (a4 && 4u * j + 4u <= n) reinterpret_cast<uint32_t *>(d)[j] = ll_data(w[j]);
    else ll_bytes_slow(d + 4u * j, ll_data(w[j]), n - 4u * j < 4u ? n - 4u * j : 4u);
  }
}

/* A handler's submit (the orchestrator's context): whether `slot`'s bell
 * word is served by the calling warp, which could not run the task while
 * its handler waits for it. */
CHI_DEVICE bool d2d_own_bell(const chi_dev_layout *l, uint32_t slot) {
  if (!(l->flags & CHI_DEV_CTX_ORCHESTRATOR) || l->d2d_workers < 2u) return false;
  const uint32_t gw = (blockIdx.x * blockDim.x + threadIdx.x) / CHI_WARP_SIZE;
  return gw >= l->d2d_first_worker && (slot >> 5) % l->d2d_workers == gw - l->d2d_first_worker;
}
/* Instead of slot s (freed here), a free slot whose bell another worker
 * serves: one look at each of the next 8 bitmap words.  -1: none. */
CHI_DEVICE int32_t d2d_other_bell(const chi_dev_layout *l, int32_t s) {
  const uint32_t nw = l->slots >> 5;
  int32_t got = -1;
  for (uint32_t k = 1; k <= 8u && k < nw && got < 0; ++k) {
    got = bitmap_alloc_window(l->d2d_bitmap, nw, ((static_cast<uint32_t>(s) >> 5) + k) & (nw - 1u), 1u);
    if (got >= 0 && d2d_own_bell(l, static_cast<uint32_t>(got))) {
      bitmap_free(l->d2d_bitmap, static_cast<uint32_t>(got));
      got = -1;
    }
  }
  bitmap_free(l->d2d_bitmap, static_cast<uint32_t>(s));
  return got;
}

/* GPU->GPU, step 1, called outside the gate: a free slot, its next
 * generation and how far its previous task's LL input reached (*left, for
 * local_publish; its request word is loaded beside the state word, in the
 * same round trip).  CHI_OK: the caller is inside the gate and publishes
 * (local_publish), then calls gate_leave.  Any other status: outside,
 * nothing taken (CHI_ERR_AGAIN: no slot in time, or the orchestrator stepped
 * aside and did not come back in time).  A submit that waits for a slot
 * waits outside the gate, so that an orchestrator stepping aside never waits
 * for it.  A handler's submit takes a slot that another worker serves. */
CHI_DEVICE chi_status_t local_prepare(const chi_dev_layout *l, uint32_t *slot, uint32_t *gen, uint32_t *left,
                                      bool wait) {
  int32_t s;
  for (;;) {
    /* The gate and the first slot guess in one round trip. */
    const uint64_t g = chi_port::fetch_add_dev(l->gate, static_cast<uint64_t>(1));
    s = bitmap_alloc(l->d2d_bitmap, l->slots);
    if (s >= 0 && d2d_own_bell(l, static_cast<uint32_t>(s))) s = d2d_other_bell(l, s);
    if (!(g & kGateAway) && s >= 0) break;
    gate_leave(l);
    if (!(g & kGateAway)) { /* no free slot: wait for one outside the gate */
      if (!may_wait(l, wait)) return CHI_ERR_AGAIN;
      s = slot_alloc(l, l->d2d_bitmap, l->wait_line, wait);
      if (s < 0) return CHI_ERR_AGAIN;
      if (gate_enter(l)) break;
    }
    if (s >= 0) bitmap_free(l->d2d_bitmap, static_cast<uint32_t>(s));
    if (!gate_wait(l, wait)) return CHI_ERR_AGAIN;
  }
  *slot = static_cast<uint32_t>(s);
  const uint32_t last = chi_port::ld_relaxed_dev(l->d2d_state + s) >> 8;
  const uint64_t req = chi_port::ll_load8_dev(d2d_words(l, *slot) + CHI_DEV_D2D_REQ_WORD + 1u);
  *gen = next_gen(last);
  *left = ll_left(req, last);
  return CHI_OK;
}

/* GPU->GPU, step 2, inside the gate: the task in the slot (the input, then
 * the request words, all flagged with gen: no fence up to 64 bytes; the LL
 * input words the previous task left past this input cleared, `left` from
 * local_prepare), the state word, and the bell, fire and forget.  The
 * orchestrator worker that serves the slot's bell word sees the bit flip,
 * then the request words. */
CHI_DEVICE void local_publish(const chi_dev_layout *l, uint32_t slot, uint32_t gen, uint32_t left,
                              chi_method_t method, const void *input, uint32_t input_size, bool peer = false) {
  if (input_size <= CHI_DEV_D2D_LL_BYTES) {
    if (input_size || left) ll_put(d2d_in_ll(l, slot), input, input_size, gen, left);
  } else {
    uint64_t *w = d2d_in_ll(l, slot);
    for (uint32_t j = 0; j < left; j += 2u) chi_port::ll_store16_dev(w + j, 0u, 0u);
    thread_copy(d2d_in(l, slot), input, input_size);
    /* the bytes before the request words (another GPU's slot: system scope) */
    if (peer) chi_port::fence_sys();
    else chi_port::fence_release_dev();
  }
  chi_port::st_relaxed_dev(l->d2d_state + slot, (gen << 8) | CHI_DEV_SLOT_SUBMITTED);
  chi_port::ll_store16_dev(d2d_words(l, slot) + CHI_DEV_D2D_REQ_WORD, ll_pack(method, gen), ll_pack(input_size, gen));
  chi_port::red_xor_dev(l->d2d_bell + (slot >> 5), 1u << (slot & 31u));
}

/* A GPU->GPU reply as a waiter's polls read it: the header words and the
 * LL words of an output of up to CHI_DEV_D2D_LL_BYTES. */
struct d2d_reply {
  uint64_t h0, h1;
  uint64_t w[kD2dLlWords];
};
/* Whether LL words [0, nw) of r all carry gen. */
CHI_DEVICE bool ll_all(const d2d_reply *r, uint32_t nw, uint32_t gen) {
  bool ok = true;
#pragma unroll
  for (uint32_t j = 0; j < kD2dLlWords; ++j)
    if (j < nw && ll_flag(r->w[j]) != gen) ok = false;
  return ok;
}
/* One poll: the header words and the output words of up to `want` bytes
 * (<= CHI_DEV_D2D_LL_BYTES) that do not carry gen yet, all loads in flight
 * at once.  True once the header words carry gen and, for an output of up
 * to `want` bytes, every word of it does.  A word kept from an earlier poll,
 * while the task was still queued, is this task's if it carries gen: no
 * older word of the slot does (ll_left). */
CHI_DEVICE bool local_poll(const chi_dev_layout *l, uint32_t slot, uint32_t gen, uint32_t want, d2d_reply *r) {
  const uint64_t *hw = d2d_words(l, slot) + CHI_DEV_D2D_REPLY_WORD;
  const uint64_t *ow = d2d_out_ll(l, slot);
  const uint32_t pairs = static_cast<uint32_t>(round_words(want) + 1u) / 2u;
#pragma unroll
  for (uint32_t j = 0; j < kD2dLlWords / 2u; ++j)
    if (j < pairs && (ll_flag(r->w[2u * j]) != gen || ll_flag(r->w[2u * j + 1u]) != gen))
      chi_port::ll_load16_dev(ow + 2u * j, &r->w[2u * j], &r->w[2u * j + 1u]);
  chi_port::ll_load16_dev(hw, &r->h0, &r->h1);
  if (ll_flag(r->h0) != gen || ll_flag(r->h1) != gen) return false;
  const uint32_t osize = ll_data(r->h1);
  return osize > want || ll_all(r, static_cast<uint32_t>(round_words(osize)), gen);
}
/* The LL output words of a reply whose header words carry gen, read again
 * (all at once) until each carries gen too (the orchestrator stores them
 * before the header words, with no fence: they may land after them). */
CHI_DEVICE void ll_finish(const chi_dev_layout *l, uint32_t slot, uint32_t gen, d2d_reply *r, uint32_t osize) {
  const uint64_t *ow = d2d_out_ll(l, slot);
  const uint32_t nw = static_cast<uint32_t>(round_words(osize));
  while (!ll_all(r, nw, gen)) {
#pragma unroll
    for (uint32_t j = 0; j < kD2dLlWords; ++j)
      if (j < nw && ll_flag(r->w[j]) != gen) r->w[j] = chi_port::ll_load8_dev(ow + j);
  }
}
/* An output of over CHI_DEV_D2D_LL_BYTES, once the reply words carry the
 * generation: plain bytes the orchestrator wrote before them (acquire). */
CHI_DEVICE void local_plain_output(const chi_dev_layout *l, uint32_t slot, uint32_t osize, void *out,
                                   bool peer = false) {
  if (peer) chi_port::fence_sys();
  else chi_port::fence_acquire_dev();
  thread_copy(out, d2d_out(l, slot), osize, true);
}

/* GPU->CPU, step 1: a slot, and a large payload written to host memory.
 * ticket: as for local_prepare (the ring's ticket). */
CHI_DEVICE chi_status_t cpu_prepare(const chi_dev_layout *l, const void *input, uint32_t input_size,
                                    uint32_t *slot, uint32_t *gen, bool wait, uint64_t *ticket = nullptr) {
  int32_t s = slot_alloc(l, l->d2h_bitmap, l->wait_line + 16, wait);
  if (s < 0) return CHI_ERR_AGAIN;
  *slot = static_cast<uint32_t>(s);
  const uint32_t old = chi_port::ld_relaxed_dev(l->d2h_state + s);
  if (ticket) *ticket = chi_port::fetch_add_dev(l->d2h_tail, static_cast<uint64_t>(1));
  *gen = next_gen(old >> 8);
  chi_port::st_relaxed_dev(l->d2h_state + s, (*gen << 8) | CHI_DEV_SLOT_SUBMITTED);
  if (input_size > CHI_DEV_LL_INLINE) {
    thread_copy(l->d2h_buf + static_cast<uint64_t>(s) * l->payload_stride, input, input_size);
    chi_port::fence_sys(); /* the payload lands before the ring entry that names it */
  }
  return CHI_OK;
}

/* GPU->CPU, step 2: the ring entry of ticket t, data words first, header last. */
CHI_DEVICE void cpu_publish(const chi_dev_layout *l, uint64_t t, chi_method_t method, const void *input,
                            uint32_t input_size, uint32_t slot, uint32_t gen, bool fence = false) {
  uint64_t *e = l->d2h_ring + (t & (l->d2h_ring_entries - 1u)) * CHI_DEV_LL_WORDS;
  const uint32_t flag = static_cast<uint32_t>(t) + 1u;
  if (input_size <= CHI_DEV_LL_INLINE) {
    /* Every input word first, then the stores: the volatile stores would
     * otherwise make each load wait for the store before it. */
    const uint8_t *in = static_cast<const uint8_t *>(input);
    const uint32_t nw = static_cast<uint32_t>(round_words(input_size));
    uint32_t v[CHI_DEV_LL_INLINE / 4u + 1u];
#pragma unroll
    for (uint32_t j = 0; j < CHI_DEV_LL_INLINE / 4u + 1u; ++j) v[j] = j < nw ? load_word(in, 4u * j, input_size) : 0u;
#pragma unroll
    for (uint32_t j = 0; j < CHI_DEV_LL_INLINE / 4u; j += 2u)
      if (j < nw) chi_port::ll_store16(e + CHI_DEV_LL_HEADER + j, ll_pack(v[j], flag), ll_pack(v[j + 1u], flag));
  }
  chi_port::ll_store16(e + 2, ll_pack(slot, flag), ll_pack(gen, flag));
  chi_port::ll_store16(e, ll_pack(method, flag), ll_pack(input_size, flag));
  /* No fence: the flags order the entry, and the stores are volatile, so
   * they leave at once.  A system fence here once made an H100's GPU->CPU
   * round trip 10.4 us instead of 14.7 (plain stores lingered); with
   * volatile stores it cost the submitting thread 1.4 us and the round trip
   * nothing (gpu_breakdown, H100 2026-11-27: 7.58 | 7.42 us at 8 B, 8.51 |
   * 8.48 at 64 B, fence | none).  `fence`: gpu_breakdown's rows with it. */
  if (fence) chi_port::fence_sys();
}

CHI_DEVICE chi_status_t check_submit(const chi_dev_context_t *ctx, chi_route_t route, chi_method_t method,
                                     const void *input, uint32_t input_size, uint32_t *kind) {
  if (!ctx) return CHI_ERR_INVALID;
  const chi_dev_layout *l = layout(ctx);
  if (l->magic != CHI_DEV_CTX_MAGIC || method == 0 || (!input && input_size)) return CHI_ERR_INVALID;
  if (input_size > l->max_payload) return CHI_ERR_TOO_LARGE;
  if (l->flags & CHI_DEV_CTX_RELAY) { /* a client's context: through the ring, but for ... */
    if (route < CHI_ROUTE_LOCAL) return CHI_ERR_INVALID;
    if (route >= 0 && route >= l->ngpus) return CHI_ERR_NO_DEVICE;
    *kind = kKindCpu;
    /* ... a built-in on this GPU, which the client's own orchestrator serves */
    if ((l->flags & CHI_DEV_CTX_CLIENT_ORCH) && method <= CHI_DEV_CLIENT_ORCH_METHODS &&
        (route == CHI_ROUTE_LOCAL || route == CHI_ROUTE_GPU_ANY || route == l->gpu))
      *kind = kKindLocal;
    return CHI_OK;
  }
  if (route == CHI_ROUTE_LOCAL || route == CHI_ROUTE_GPU_ANY || route == l->gpu) *kind = kKindLocal;
  else if (route == CHI_ROUTE_CPU) *kind = kKindCpu;
  else if (route >= 0 && route >= l->ngpus) return CHI_ERR_NO_DEVICE; /* no such GPU */
  else if (route >= 0 && peer_layout(l, route)) *kind = kKindPeer; /* another GPU, over peer memory */
  else if (route >= 0) return CHI_ERR_NO_DEVICE; /* another GPU without peer access */
  else return CHI_ERR_INVALID;
  return CHI_OK;
}

/* Header word 2 of a GPU->CPU ring entry: the slot, and in a relay context
 * the route for the client's relay (CHI_DEV_ROUTE_BIAS, device_layout.h). */
CHI_DEVICE uint32_t ring_slot_word(const chi_dev_layout *l, uint32_t slot, chi_route_t route) {
  if (!(l->flags & CHI_DEV_CTX_RELAY)) return slot;
  return slot | (static_cast<uint32_t>(route + CHI_DEV_ROUTE_BIAS) << CHI_DEV_SLOT_BITS);
}

/* A GPU->CPU slot released before its reply came, once the reply is there:
 * whoever wins the RELEASED -> CLAIMED claim (the releaser or the
 * orchestrator's sweep) frees it. */
CHI_DEVICE bool reclaim_released(const chi_dev_layout *l, uint32_t slot, uint32_t gen) {
  uint32_t expect = (gen << 8) | CHI_DEV_SLOT_RELEASED;
  if (!chi_port::cas_relaxed_dev(l->d2h_state + slot, &expect, (gen << 8) | CHI_DEV_SLOT_CLAIMED)) return false;
  chi_port::fetch_add_dev(l->d2h_released, 0xFFFFFFFFu);
  bitmap_free(l->d2h_bitmap, slot);
  return true;
}
CHI_DEVICE bool reply_arrived(const chi_dev_layout *l, uint32_t slot, uint32_t gen) {
  uint64_t a, b;
  chi_port::ll_load16(l->d2h_reply + static_cast<uint64_t>(slot) * CHI_DEV_LL_WORDS, &a, &b);
  return ll_flag(a) == gen && ll_flag(b) == gen;
}

/* A GPU->CPU reply's output, once an acquire load of its word 0 found the
 * generation: the host wrote the output before that word, dense after the
 * header (device_layout.h), so plain loads see it, all kCopyBatch in flight
 * at once (one PCIe round trip for 64 bytes).  Strong loads of host memory
 * would not be: measured on an H100 (gpu_breakdown's probes), a thread keeps
 * about two volatile, relaxed.sys or .cv loads of host memory in flight, 8
 * plain ones. */
CHI_DEVICE void take_reply_output(const chi_dev_layout *l, uint32_t slot, uint8_t *out, uint32_t osize) {
  const uint8_t *src = osize > CHI_DEV_LL_INLINE
                           ? l->d2h_buf + static_cast<uint64_t>(slot) * l->payload_stride
                           : reinterpret_cast<const uint8_t *>(l->d2h_reply + static_cast<uint64_t>(slot) * CHI_DEV_LL_WORDS +
                                                               CHI_DEV_LL_HEADER);
  /* Both sources are 16-byte aligned and readable up to the next 16 bytes. */
  thread_copy(out, src, osize, true);
}

/* Back-off of a waiting thread that has waited `waited` ns: none for the
 * first spin_ns (a nap's granularity and its 0..2x range would add to every
 * round trip), then naps, so that thousands of waiters do not flood the
 * memory system while a long task runs. */
CHI_DEVICE void wait_pause(uint64_t waited, uint32_t spin_ns) {
  if (waited < spin_ns) return;
  chi_port::nanosleep(waited < 8ull * spin_ns ? 256u : 1024u);
}

}  // namespace chi_dev_detail

#endif /* CHI_GPU_COMPILER && __cplusplus */

#endif /* CHIMAERA_DEVICE_PROTOCOL_H */

/*
 * chimaera_device.h -- device-side API of chimaera for CUDA/HIP kernels.
 *
 * Header-only: include it in a .cu file (nvcc or hipcc), no -rdc needed.
 * A kernel receives a chi_dev_context_t by value (from chi_gpu_context) and
 * submits tasks from any thread:
 *
 *   __global__ void k(chi_dev_context_t ctx, ...) {
 *     chi_future_t f;
 *     if (chi_dev_submit(&ctx, CHI_ROUTE_CPU, method, in, n, &f) == CHI_OK)
 *       st = chi_dev_wait(&ctx, f, 1000000000, out, sizeof out, &out_n);
 *   }
 *
 * Routes from device code:
 *   CHI_ROUTE_LOCAL     this GPU's orchestrator (GPU->GPU, device memory only);
 *                       CHI_ROUTE_GPU_ANY and CHI_ROUTE_GPU(own id) mean the same.
 *   CHI_ROUTE_CPU       a CPU poller thread of the runtime runs the method's CPU
 *                       handler (GPU->CPU); the handler sees source = GPU id.
 *   CHI_ROUTE_GPU(n)    another GPU: not supported, CHI_ERR_INVALID (see docs/gpu.md).
 *
 * Warp semantics: every function below is per thread.  Any subset of a warp's
 * lanes may call it, diverged or not, each with its own task and future; no
 * function uses a warp-collective operation, so lanes that do not call need
 * not participate.  Slots are per GPU and per route (gpu.device_slots each);
 * when every slot is in use chi_dev_submit returns CHI_ERR_AGAIN at once (it
 * never waits for a slot), so thousands of warps can call without deadlock:
 * retry after a back-off or after waiting for an earlier future.
 * chi_dev_warp_* variants at the end are warp-collective and cheaper per task.
 *
 * Device futures must be consumed by chi_dev_wait on the same GPU (any
 * thread, any kernel); a future never waited for keeps its slot until
 * chi_finalize.  Host futures and device futures do not mix.
 *
 * User orchestrators: CHI_DEFINE_ORCHESTRATOR at the end of this file.
 */
#ifndef CHIMAERA_DEVICE_H
#define CHIMAERA_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "chimaera.h"
#include "chimaera/gpu_port.h"

/* ------------------------------------------------------------ shared layout
 * The structures the library sets up in pinned host and device memory.  The
 * library and user kernels compile the same definitions; CHI_DEV_ABI_VERSION
 * changes whenever one of them does. */

#define CHI_DEV_ABI_VERSION 3u
#define CHI_DEV_CTX_MAGIC 0x43484944u /* "CHID" */

/* An LL record: 32 eight-byte words, each {uint32 data, uint32 flag}.  Words
 * 0..3 are a header, words 4..31 carry up to 112 bytes inline. */
#define CHI_DEV_LL_WORDS 32u
#define CHI_DEV_LL_HEADER 4u
#define CHI_DEV_LL_INLINE 112u

/* GPU->GPU slot: this header, then the input at +CHI_DEV_SLOT_HEADER, the output at
 * +CHI_DEV_SLOT_HEADER + payload_stride. */
#define CHI_DEV_SLOT_HEADER 64u
typedef struct chi_dev_slot_header {
  uint32_t method;
  uint32_t input_size;
  int32_t status;
  uint32_t output_size;
} chi_dev_slot_header_t;

/* Slot state word: (generation << 8) | state. */
#define CHI_DEV_SLOT_FREE 0u
#define CHI_DEV_SLOT_SUBMITTED 1u
#define CHI_DEV_SLOT_DONE 2u
#define CHI_DEV_SLOT_CLAIMED 3u

#define CHI_DEV_MAX_REGIONS 1024u
typedef struct chi_dev_region {
  uint64_t id; /* 0: free entry */
  uint64_t base;
  uint64_t size;
  int64_t gpu;
} chi_dev_region_t;

/* Registered memory as device code sees it: a seqlock (seq odd while the
 * runtime rewrites entries) over a table indexed like MemoryRegions. */
typedef struct chi_dev_regions {
  uint32_t seq;
  uint32_t pad[15];
  chi_dev_region_t r[CHI_DEV_MAX_REGIONS];
} chi_dev_regions_t;

/* What chi_dev_context_t holds (at most 32 words). */
typedef struct chi_dev_ctx_layout {
  uint32_t magic;
  int32_t gpu;
  uint32_t max_payload;    /* inline payload limit, bytes */
  uint32_t slots;          /* GPU->GPU and GPU->CPU slots each, power of two >= 32 */
  uint64_t payload_stride; /* bytes reserved per payload buffer (max_payload rounded up) */
  /* GPU->GPU, device memory */
  uint8_t *d2d_slots; /* slots x (CHI_DEV_SLOT_HEADER + 2 x payload_stride) */
  uint32_t *d2d_state;
  uint32_t *d2d_bitmap;
  uint64_t *d2d_cells; /* run queue: slots cells of (sequence << 32 | slot) */
  uint64_t *d2d_head;
  uint64_t *d2d_tail;
  /* GPU->CPU: ring, replies and large payloads in pinned host memory;
   * slot states, bitmap and ticket counter in device memory. */
  uint64_t *d2h_ring; /* d2h_ring_entries LL records */
  uint64_t *d2h_reply; /* slots LL records */
  uint8_t *d2h_buf;    /* slots x payload_stride */
  uint32_t *d2h_state;
  uint32_t *d2h_bitmap;
  uint64_t *d2h_tail;
  chi_dev_regions_t *regions;
  uint32_t d2h_ring_entries; /* slots x CPU pollers */
  uint32_t wait_spin_ns;     /* chi_dev_wait polls without a pause this long, then backs off */
} chi_dev_ctx_layout_t;

/* The orchestrator's state in device memory, passed to its kernel. */
typedef struct chi_dev_orch_state {
  chi_dev_context_t ctx; /* this GPU's context, handed to handlers */
  uint32_t abi;
  uint32_t nwarps;       /* orchestrator warps (grid x block / warp size) */
  uint32_t h2d_pollers;  /* warps that poll the CPU->GPU ring (power of two) */
  uint32_t h2d_slots;    /* CPU->GPU slots (gpu.queue_depth) */
  uint32_t h2d_ring_entries;
  uint32_t ndispatch;    /* entries of dispatch */
  uint64_t *h2d_ring;    /* pinned: CPU->GPU ring of LL records */
  uint64_t *h2d_done;    /* pinned: one LL completion record per slot */
  uint8_t *h2d_buf;      /* pinned: slots x payload_stride, payloads over 112 bytes */
  uint32_t *control;     /* device, 16 words: [0] stop request, [1] fault code, [4..5] warp
                          * arrivals (uint64, lease epochs), [6..7] last lease over (uint64) */
  uint64_t *h2d_next;    /* device: next ticket of each polling warp */
  int32_t *dispatch;     /* device: method id -> user dispatch index, -1: none */
  uint8_t *scratch;      /* device: per warp, input then output, payload_stride each */
  /* Fields added after ABI 2 go here, after `control`: a kernel of another ABI
   * still finds `abi` and `control` where it expects them and reports itself. */
  uint64_t lease_ns;     /* the kernel's lease (0: never ends); see orchestrator_main */
  const uint64_t *host_lease; /* pinned, written by the runtime's lease thread: [0] launches
                               * queued so far, [1] index + 1 of the next launch it will
                               * queue (it may be held back in a CUDA call) */
} chi_dev_orch_state_t;

#define CHI_DEV_FAULT_ABI 1u /* kernel compiled against another chimaera_device.h */

/* A task as a device handler sees it. */
typedef struct chi_dev_request {
  chi_method_t method;
  chi_route_t source; /* CHI_ROUTE_CPU: submitted by host code; else the GPU id of a kernel */
  const void *input;
  uint32_t input_size;
  void *output;
  uint32_t output_capacity;
  uint32_t output_size; /* set by the handler (lane 0's value counts) */
  const chi_dev_context_t *ctx; /* the GPU's context: handlers may submit and resolve memory */
} chi_dev_request_t;

#if defined(__cplusplus)
static_assert(sizeof(chi_dev_ctx_layout_t) <= sizeof(chi_dev_context_t),
              "device context layout must fit chi_dev_context_t");
#endif

#if defined(CHI_GPU_COMPILER) && defined(__cplusplus)

/* ------------------------------------------------------- internal helpers */
namespace chi_dev_detail {

using chi_dev_layout = chi_dev_ctx_layout_t;

constexpr uint32_t kFutureTag = 0xD7u;
constexpr uint32_t kKindLocal = 1u;
constexpr uint32_t kKindCpu = 2u;

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
/* Device futures: tag (8) | kind (4) | reserved (4) | generation (24) | slot + 1 (24). */
CHI_DEVICE chi_future_t make_future(uint32_t kind, uint32_t gen, uint32_t slot) {
  return (static_cast<uint64_t>(kFutureTag) << 56) | (static_cast<uint64_t>(kind) << 52) |
         (static_cast<uint64_t>(gen & 0xFFFFFFu) << 24) | ((slot + 1u) & 0xFFFFFFu);
}
CHI_DEVICE bool split_future(chi_future_t f, uint32_t slots, uint32_t *kind, uint32_t *gen,
                             uint32_t *slot) {
  uint32_t low = static_cast<uint32_t>(f & 0xFFFFFFu);
  if ((f >> 56) != kFutureTag || low == 0 || low > slots) return false;
  *kind = static_cast<uint32_t>((f >> 52) & 0xFu);
  *gen = static_cast<uint32_t>((f >> 24) & 0xFFFFFFu);
  *slot = low - 1u;
  return *kind == kKindLocal || *kind == kKindCpu;
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
CHI_DEVICE void bitmap_free(uint32_t *bm, uint32_t slot) {
  chi_port::fetch_and_release_dev(bm + (slot >> 5), ~(1u << (slot & 31u)));
}

/* Byte copy by one thread, 16 bytes at a time when both sides allow it. */
CHI_DEVICE void thread_copy(void *dst, const void *src, uint32_t n) {
  uint8_t *d = static_cast<uint8_t *>(dst);
  const uint8_t *s = static_cast<const uint8_t *>(src);
  uint32_t i = 0;
  if (((reinterpret_cast<uintptr_t>(d) | reinterpret_cast<uintptr_t>(s)) & 15u) == 0) {
    for (; i + 16u <= n; i += 16u)
      *reinterpret_cast<uint4 *>(d + i) = *reinterpret_cast<const uint4 *>(s + i);
  } else if (((reinterpret_cast<uintptr_t>(d) | reinterpret_cast<uintptr_t>(s)) & 3u) == 0) {
    for (; i + 4u <= n; i += 4u)
      *reinterpret_cast<uint32_t *>(d + i) = *reinterpret_cast<const uint32_t *>(s + i);
  }
  for (; i < n; ++i) d[i] = s[i];
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

/* GPU->GPU run queue (Vyukov's bounded MPMC, one 64-bit word per cell).  It
 * has a cell per slot and a task holds its slot while queued, so a push
 * never finds its cell occupied for long; the wait is bounded anyway.  The
 * ticket t comes from d2d_tail (one fetch_add, maybe for a whole warp). */
CHI_DEVICE bool queue_push_at(const chi_dev_layout *l, uint64_t t, uint32_t value) {
  uint64_t *cell = l->d2d_cells + (t & (l->slots - 1u));
  uint64_t t0 = 0;
  while (static_cast<uint32_t>(chi_port::ld_acquire_dev(cell) >> 32) != static_cast<uint32_t>(t)) {
    uint64_t now = chi_port::timer_ns();
    if (t0 == 0) t0 = now;
    else if (now - t0 > 1000000000ull) return false;
    chi_port::nanosleep(64);
  }
  chi_port::st_release_dev(cell, (static_cast<uint64_t>(static_cast<uint32_t>(t + 1u)) << 32) | value);
  return true;
}
/* Warp-collective pop of up to `most` (<= warp size) consecutive tasks in one
 * round trip: lane i reads the cell of ticket *head + i, lane 0 claims the
 * ready prefix with one CAS.  *head is the warp's guess of the queue head
 * (the same in all lanes): polling an empty queue costs one read of the
 * cells, not a read of the head first; a guess found stale (the cell is a
 * lap ahead, or the CAS failed) is refreshed.  Returns the number taken
 * (0: empty or lost the race); lane i < count holds its slot index in *slot. */
CHI_DEVICE uint32_t queue_pop_warp(const chi_dev_layout *l, uint32_t lane, uint32_t most, uint64_t *head,
                                   uint32_t *slot) {
  const uint64_t mask = l->slots - 1u;
  const uint64_t h = *head;
  const uint64_t t = h + lane;
  uint64_t *cell = l->d2d_cells + (t & mask);
  const uint64_t c = lane < most ? chi_port::ld_acquire_dev(cell) : 0u;
  const int32_t diff = static_cast<int32_t>(static_cast<uint32_t>(c >> 32) - static_cast<uint32_t>(t + 1u));
  const bool ready = lane < most && diff == 0;
  const chi_port::lanemask_t got = chi_port::ballot(ready);
  /* Only the ready prefix: tickets are served in order. */
  const uint32_t n = ~got == 0 ? CHI_WARP_SIZE : static_cast<uint32_t>(chi_port::ffs_mask(~got) - 1);
  if (n == 0) {
    /* Ticket h already popped (its cell is handed back or refilled): another warp moved the head. */
    if (chi_port::shfl(diff, 0) > 0) {
      uint64_t now = lane == 0 ? chi_port::ld_relaxed_dev(l->d2d_head) : 0u;
      *head = chi_port::shfl(now, 0);
    }
    return 0;
  }
  /* The acquire loads ordered the slots' contents; the CAS only picks the
   * winner (head only grows: no ABA), and the hand-back publishes nothing
   * (the next pusher writes its own slot): no fences on this path. */
  uint64_t now = h;
  uint32_t won = 0;
  if (lane == 0) {
    won = chi_port::cas_relaxed_dev(l->d2d_head, &now, h + n) ? 1u : 0u;
    if (won) now = h + n;
  }
  *head = chi_port::shfl(now, 0); /* on a lost race, the current head */
  if (!chi_port::shfl(won, 0)) return 0;
  if (lane < n) {
    chi_port::st_relaxed_dev(cell, static_cast<uint64_t>(static_cast<uint32_t>(t + mask + 1u)) << 32);
    *slot = static_cast<uint32_t>(c);
  }
  return n;
}

CHI_DEVICE uint64_t round_words(uint32_t bytes) { return (bytes + 3u) / 4u; }

/* Reads the header and up to `ndata` inline words of a reply record in one
 * round trip (w[0..27] data, w[28..29] header).  True when the header carries `gen`. */
CHI_DEVICE bool read_reply(const uint64_t *rec, uint32_t gen, uint32_t ndata, uint64_t *w) {
  uint64_t a, b;
  chi_port::ll_load16(rec, &a, &b);
#pragma unroll
  for (uint32_t k = 0; k < (CHI_DEV_LL_WORDS - CHI_DEV_LL_HEADER) / 2u; ++k)
    if (2u * k < ndata) chi_port::ll_load16(rec + CHI_DEV_LL_HEADER + 2u * k, &w[2u * k], &w[2u * k + 1u]);
  w[28] = a;
  w[29] = b;
  return ll_flag(a) == gen && ll_flag(b) == gen;
}

CHI_DEVICE uint8_t *d2d_slot(const chi_dev_layout *l, uint32_t slot) {
  return l->d2d_slots + static_cast<uint64_t>(slot) * (CHI_DEV_SLOT_HEADER + 2u * l->payload_stride);
}

/* GPU->GPU, step 1: a slot with the task written in it (not queued yet).
 * ticket: if not NULL, also takes the run-queue ticket, in the same memory
 * round trip as the slot's state word (both depend only on the slot). */
CHI_DEVICE chi_status_t local_prepare(const chi_dev_layout *l, chi_method_t method, const void *input,
                                      uint32_t input_size, uint32_t *slot, uint32_t *gen,
                                      uint64_t *ticket = nullptr) {
  int32_t s = bitmap_alloc(l->d2d_bitmap, l->slots);
  if (s < 0) return CHI_ERR_AGAIN;
  *slot = static_cast<uint32_t>(s);
  const uint32_t old = chi_port::ld_relaxed_dev(l->d2d_state + s);
  if (ticket) *ticket = chi_port::fetch_add_dev(l->d2d_tail, static_cast<uint64_t>(1));
  *gen = next_gen(old >> 8);
  uint8_t *base = d2d_slot(l, *slot);
  chi_dev_slot_header_t *h = reinterpret_cast<chi_dev_slot_header_t *>(base);
  h->method = method;
  h->input_size = input_size;
  if (input_size) thread_copy(base + CHI_DEV_SLOT_HEADER, input, input_size);
  chi_port::st_relaxed_dev(l->d2d_state + s, (*gen << 8) | CHI_DEV_SLOT_SUBMITTED);
  return CHI_OK;
}

/* GPU->CPU, step 1: a slot, and a large payload written to host memory.
 * ticket: as for local_prepare (the ring's ticket). */
CHI_DEVICE chi_status_t cpu_prepare(const chi_dev_layout *l, const void *input, uint32_t input_size,
                                    uint32_t *slot, uint32_t *gen, uint64_t *ticket = nullptr) {
  int32_t s = bitmap_alloc(l->d2h_bitmap, l->slots);
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
                            uint32_t input_size, uint32_t slot, uint32_t gen) {
  uint64_t *e = l->d2h_ring + (t & (l->d2h_ring_entries - 1u)) * CHI_DEV_LL_WORDS;
  const uint32_t flag = static_cast<uint32_t>(t) + 1u;
  if (input_size <= CHI_DEV_LL_INLINE) {
    const uint8_t *in = static_cast<const uint8_t *>(input);
    uint32_t nw = static_cast<uint32_t>(round_words(input_size));
    for (uint32_t j = 0; j < nw; j += 2u)
      chi_port::ll_store16(e + CHI_DEV_LL_HEADER + j, ll_pack(load_word(in, 4u * j, input_size), flag),
                           ll_pack(load_word(in, 4u * j + 4u, input_size), flag));
  }
  chi_port::ll_store16(e + 2, ll_pack(slot, flag), ll_pack(gen, flag));
  chi_port::ll_store16(e, ll_pack(method, flag), ll_pack(input_size, flag));
  /* Not for ordering (the flags do that) but for speed: without it the
   * stores can linger on the GPU side; measured on an H100, a GPU->CPU round
   * trip took 14.7 us at p50 without and 10.4 us with this fence. */
  chi_port::fence_sys();
}

CHI_DEVICE chi_status_t check_submit(const chi_dev_context_t *ctx, chi_route_t route, chi_method_t method,
                                     const void *input, uint32_t input_size, uint32_t *kind) {
  if (!ctx) return CHI_ERR_INVALID;
  const chi_dev_layout *l = layout(ctx);
  if (l->magic != CHI_DEV_CTX_MAGIC || method == 0 || (!input && input_size)) return CHI_ERR_INVALID;
  if (input_size > l->max_payload) return CHI_ERR_TOO_LARGE;
  if (route == CHI_ROUTE_LOCAL || route == CHI_ROUTE_GPU_ANY || route == l->gpu) *kind = kKindLocal;
  else if (route == CHI_ROUTE_CPU) *kind = kKindCpu;
  else return CHI_ERR_INVALID;
  return CHI_OK;
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

/* --------------------------------------------------------------- the API */

/* Submits a task from device code.
 *   ctx         [in] this GPU's context (from chi_gpu_context, passed to the kernel).
 *   route       CHI_ROUTE_LOCAL / CHI_ROUTE_GPU_ANY / own GPU id (GPU->GPU) or CHI_ROUTE_CPU.
 *   input       [in] input_size bytes, copied before the call returns.
 *   future      [out] for chi_dev_wait / chi_dev_test.
 * Returns CHI_OK, CHI_ERR_INVALID (NULL future, bad context, method 0, NULL input
 * with a size, route to another GPU), CHI_ERR_TOO_LARGE (input_size over
 * gpu.max_payload), CHI_ERR_AGAIN (all slots of that route in use; nothing was
 * queued), CHI_ERR_INTERNAL (run queue broken).  An unknown method is not an
 * error here: chi_dev_wait returns CHI_ERR_NOT_FOUND.
 * Thread safety: any thread of any kernel on this GPU, concurrently. */
CHI_DEVICE chi_status_t chi_dev_submit(const chi_dev_context_t *ctx, chi_route_t route,
                                       chi_method_t method, const void *input,
                                       uint32_t input_size, chi_future_t *future) {
  using namespace chi_dev_detail;
  if (!future) return CHI_ERR_INVALID;
  *future = 0;
  uint32_t kind, slot, gen;
  chi_status_t s = check_submit(ctx, route, method, input, input_size, &kind);
  if (s != CHI_OK) return s;
  const chi_dev_layout *l = layout(ctx);
  uint64_t t;
  if (kind == kKindLocal) {
    if ((s = local_prepare(l, method, input, input_size, &slot, &gen, &t)) != CHI_OK) return s;
    if (!queue_push_at(l, t, slot)) return CHI_ERR_INTERNAL;
  } else {
    if ((s = cpu_prepare(l, input, input_size, &slot, &gen, &t)) != CHI_OK) return s;
    cpu_publish(l, t, method, input, input_size, slot, gen);
  }
  *future = make_future(kind, gen, slot);
  return CHI_OK;
}

/* Waits for a device future and takes its result.
 *   timeout_ns       < 0: no bound (avoid in kernels); 0: poll once; > 0: at most that long.
 *   output           [out] buffer, or NULL to discard the result.
 *   output_size      [out] bytes of output, or bytes needed (may be NULL).
 * Returns the handler's status once the task ran (future consumed), or leaves
 * the future valid and returns CHI_ERR_TIMEOUT (not finished in time) or
 * CHI_ERR_TOO_LARGE (output too small: *output_size says the size needed).
 * CHI_ERR_INVALID: bad context, future 0, stale, consumed or never issued.
 * Thread safety: any thread of any kernel on the future's GPU; concurrent
 * waiters of one future: one gets the result, the others CHI_ERR_INVALID. */
CHI_DEVICE chi_status_t chi_dev_wait(const chi_dev_context_t *ctx, chi_future_t future,
                                     int64_t timeout_ns, void *output, uint32_t output_capacity,
                                     uint32_t *output_size) {
  using namespace chi_dev_detail;
  if (!ctx) return CHI_ERR_INVALID;
  const chi_dev_layout *l = layout(ctx);
  uint32_t kind, gen, slot;
  if (l->magic != CHI_DEV_CTX_MAGIC || !split_future(future, l->slots, &kind, &gen, &slot))
    return CHI_ERR_INVALID;
  const uint64_t t0 = chi_port::timer_ns();
  const uint32_t spin_ns = l->wait_spin_ns;
  uint32_t polls = 0;
  if (kind == kKindLocal) {
    uint32_t *state = l->d2d_state + slot;
    for (;;) {
      uint32_t s = chi_port::ld_acquire_dev(state);
      if ((s >> 8) != gen) return CHI_ERR_INVALID;
      if ((s & 0xFFu) == CHI_DEV_SLOT_DONE) break;
      if ((s & 0xFFu) != CHI_DEV_SLOT_SUBMITTED) return CHI_ERR_INVALID;
      const uint64_t waited = chi_port::timer_ns() - t0;
      if (timeout_ns == 0 || (timeout_ns > 0 && waited >= static_cast<uint64_t>(timeout_ns)))
        return CHI_ERR_TIMEOUT;
      wait_pause(waited, spin_ns);
    }
    const uint8_t *base = l->d2d_slots + static_cast<uint64_t>(slot) * (CHI_DEV_SLOT_HEADER + 2u * l->payload_stride);
    const uint4 *obuf = reinterpret_cast<const uint4 *>(base + CHI_DEV_SLOT_HEADER + l->payload_stride);
    /* The header and the first 64 output bytes in one round trip (the
     * slot is 16-byte aligned and its output area at least 128 bytes). */
    const uint4 hv = *reinterpret_cast<const uint4 *>(base);
    uint4 v0 = obuf[0], v1 = obuf[1], v2 = obuf[2], v3 = obuf[3];
    const chi_status_t status = static_cast<chi_status_t>(hv.z);
    const uint32_t osize = hv.w;
    if (output && osize > output_capacity) {
      if (output_size) *output_size = osize;
      return CHI_ERR_TOO_LARGE;
    }
    /* DONE was acquired above, so what was read is this task's output as
     * long as nobody else claims the slot: the claim only arbitrates. */
    uint32_t expect = (gen << 8) | CHI_DEV_SLOT_DONE;
    if (!chi_port::cas_relaxed_dev(state, &expect, (gen << 8) | CHI_DEV_SLOT_CLAIMED)) return CHI_ERR_INVALID;
    if (output && osize) {
      if (osize <= 64u && (reinterpret_cast<uintptr_t>(output) & 15u) == 0) {
        uint4 *o = static_cast<uint4 *>(output);
        const uint32_t full = osize / 16u;
        if (full > 0u) o[0] = v0;
        if (full > 1u) o[1] = v1;
        if (full > 2u) o[2] = v2;
        if (full > 3u) o[3] = v3;
        if (osize & 15u) {
          const uint4 t = full == 0u ? v0 : full == 1u ? v1 : full == 2u ? v2 : v3;
          const uint32_t tw[4] = {t.x, t.y, t.z, t.w};
          uint8_t *ob = static_cast<uint8_t *>(output) + 16u * full;
          for (uint32_t b = 0; b < (osize & 15u); ++b) ob[b] = static_cast<uint8_t>(tw[b / 4u] >> (8u * (b & 3u)));
        }
      } else {
        thread_copy(output, obuf, osize);
      }
    }
    if (output_size) *output_size = osize;
    /* The slot stays CLAIMED (a consumed future reads as such) until the
     * next submit takes it: one release, the bitmap's, frees it. */
    bitmap_free(l->d2d_bitmap, slot);
    return status;
  }

  /* GPU->CPU: the reply is in host memory.  The first polls also read the
   * inline output, so a quick reply costs one PCIe round trip; later polls
   * read the header only, to spare the bus when thousands of warps wait. */
  uint32_t *state = l->d2h_state + slot;
  const uint64_t *rec = l->d2h_reply + static_cast<uint64_t>(slot) * CHI_DEV_LL_WORDS;
  const uint32_t want = output ? static_cast<uint32_t>(round_words(output_capacity < CHI_DEV_LL_INLINE ? output_capacity : CHI_DEV_LL_INLINE)) : 0u;
  uint64_t w[30] = {};
  uint32_t have = 0;
  /* The state check (device memory) overlaps the first read of the reply (host memory). */
  const uint32_t s = chi_port::ld_relaxed_dev(state);
  uint32_t nd = want;
  bool got = read_reply(rec, gen, nd, w);
  if (s != ((gen << 8) | CHI_DEV_SLOT_SUBMITTED)) return CHI_ERR_INVALID;
  while (!got) {
    const uint64_t waited = chi_port::timer_ns() - t0;
    if (timeout_ns == 0 || (timeout_ns > 0 && waited >= static_cast<uint64_t>(timeout_ns)))
      return CHI_ERR_TIMEOUT;
    wait_pause(waited, spin_ns);
    ++polls;
    nd = polls < 16u ? want : 0u;
    got = read_reply(rec, gen, nd, w);
  }
  have = nd;
  const chi_status_t status = static_cast<chi_status_t>(ll_data(w[28]));
  const uint32_t osize = ll_data(w[29]);
  if (output && osize > output_capacity) {
    if (output_size) *output_size = osize;
    return CHI_ERR_TOO_LARGE;
  }
  uint32_t expect = (gen << 8) | CHI_DEV_SLOT_SUBMITTED;
  if (!chi_port::cas_relaxed_dev(state, &expect, (gen << 8) | CHI_DEV_SLOT_CLAIMED)) return CHI_ERR_INVALID;
  if (output && osize) {
    uint8_t *out = static_cast<uint8_t *>(output);
    if (osize <= CHI_DEV_LL_INLINE) {
      const uint32_t nw = static_cast<uint32_t>(round_words(osize));
      /* Seen on a header-only poll: all data words in one round trip, not one per pair. */
      if (have < nw) {
        read_reply(rec, gen, want, w);
        have = want;
      }
#pragma unroll
      for (uint32_t k = 0; k < (CHI_DEV_LL_WORDS - CHI_DEV_LL_HEADER) / 2u; ++k) {
        if (2u * k >= nw) break;
        uint64_t a = w[2u * k], b = w[2u * k + 1u];
        bool ok = 2u * k < have && ll_flag(a) == gen && (2u * k + 1u >= nw || ll_flag(b) == gen);
        /* Words not read yet, or read before they landed: read them (again). */
        while (!ok) {
          chi_port::ll_load16(rec + CHI_DEV_LL_HEADER + 2u * k, &a, &b);
          ok = ll_flag(a) == gen && (2u * k + 1u >= nw || ll_flag(b) == gen);
        }
        store_word(out, 8u * k, osize, ll_data(a));
        if (2u * k + 1u < nw) store_word(out, 8u * k + 4u, osize, ll_data(b));
      }
    } else {
      chi_port::fence_acquire_sys();
      const uint64_t *src = reinterpret_cast<const uint64_t *>(l->d2h_buf + static_cast<uint64_t>(slot) * l->payload_stride);
      uint32_t i = 0;
      for (; i + 16u <= osize; i += 16u) {
        uint64_t a, b;
        chi_port::ll_load16(src + i / 8u, &a, &b);
        store_word(out, i, osize, static_cast<uint32_t>(a));
        store_word(out, i + 4u, osize, static_cast<uint32_t>(a >> 32));
        store_word(out, i + 8u, osize, static_cast<uint32_t>(b));
        store_word(out, i + 12u, osize, static_cast<uint32_t>(b >> 32));
      }
      for (; i < osize; i += 8u) {
        uint64_t a = chi_port::ll_load8(src + i / 8u);
        store_word(out, i, osize, static_cast<uint32_t>(a));
        if (i + 4u < osize) store_word(out, i + 4u, osize, static_cast<uint32_t>(a >> 32));
      }
    }
  }
  if (output_size) *output_size = osize;
  bitmap_free(l->d2h_bitmap, slot); /* the slot stays CLAIMED until reused */
  return status;
}

/* Reports whether a device future has finished (*done = 1) without consuming it.
 * Returns CHI_OK or CHI_ERR_INVALID (NULL argument, stale or unknown future).
 * Thread safety: any thread. */
CHI_DEVICE chi_status_t chi_dev_test(const chi_dev_context_t *ctx, chi_future_t future, int *done) {
  using namespace chi_dev_detail;
  if (!ctx || !done) return CHI_ERR_INVALID;
  const chi_dev_layout *l = layout(ctx);
  uint32_t kind, gen, slot;
  if (l->magic != CHI_DEV_CTX_MAGIC || !split_future(future, l->slots, &kind, &gen, &slot))
    return CHI_ERR_INVALID;
  if (kind == kKindLocal) {
    uint32_t s = chi_port::ld_acquire_dev(l->d2d_state + slot);
    if ((s >> 8) != gen || ((s & 0xFFu) != CHI_DEV_SLOT_SUBMITTED && (s & 0xFFu) != CHI_DEV_SLOT_DONE))
      return CHI_ERR_INVALID;
    *done = (s & 0xFFu) == CHI_DEV_SLOT_DONE;
    return CHI_OK;
  }
  uint32_t s = chi_port::ld_acquire_dev(l->d2h_state + slot);
  if (s != ((gen << 8) | CHI_DEV_SLOT_SUBMITTED)) return CHI_ERR_INVALID;
  uint64_t a, b;
  chi_port::ll_load16(l->d2h_reply + static_cast<uint64_t>(slot) * CHI_DEV_LL_WORDS, &a, &b);
  *done = ll_flag(a) == gen && ll_flag(b) == gen;
  return CHI_OK;
}

/* Resolves a reference to memory registered for THIS GPU (chi_register_gpu_mem):
 * *ptr = region start + offset after checking [offset, offset + length) lies
 * inside the region.  Returns CHI_OK, CHI_ERR_INVALID (NULL argument, unknown
 * or unregistered region, region of another GPU or of the host, range outside),
 * CHI_ERR_AGAIN (the table was being rewritten for over a millisecond).
 * Thread safety: any thread; sees registrations finished before the kernel
 * observed them (chi_register_gpu_mem returns after the device table changed). */
CHI_DEVICE chi_status_t chi_dev_mem_resolve(const chi_dev_context_t *ctx, const chi_mem_ref_t *ref,
                                            void **ptr) {
  using namespace chi_dev_detail;
  if (!ctx || !ref || !ptr) return CHI_ERR_INVALID;
  const chi_dev_layout *l = layout(ctx);
  if (l->magic != CHI_DEV_CTX_MAGIC) return CHI_ERR_INVALID;
  const uint64_t low = ref->region & 0xFFFFFFFFull;
  if (low == 0 || low > CHI_DEV_MAX_REGIONS) return CHI_ERR_INVALID;
  const chi_dev_regions_t *t = l->regions;
  const chi_dev_region_t *r = &t->r[low - 1u];
  const uint64_t t0 = chi_port::timer_ns();
  for (;;) {
    uint32_t s1 = chi_port::ld_acquire_dev(&t->seq);
    if (!(s1 & 1u)) {
      uint64_t id = chi_port::ld_relaxed_dev(&r->id);
      uint64_t base = chi_port::ld_relaxed_dev(&r->base);
      uint64_t size = chi_port::ld_relaxed_dev(&r->size);
      int64_t gpu = chi_port::ld_relaxed_dev(&r->gpu);
      chi_port::fence_acquire_dev();
      if (chi_port::ld_relaxed_dev(&t->seq) == s1) {
        if (id != ref->region || gpu != l->gpu) return CHI_ERR_INVALID;
        if (ref->offset > size || ref->length > size - ref->offset) return CHI_ERR_INVALID;
        *ptr = reinterpret_cast<void *>(base + ref->offset);
        return CHI_OK;
      }
    }
    if (chi_port::timer_ns() - t0 > 1000000ull) return CHI_ERR_AGAIN;
    chi_port::nanosleep(128);
  }
}

/* -------------------------------------------------- warp-level variants
 * Warp-collective: every lane of the warp calls, converged (all 32 lanes on
 * CUDA, the whole wavefront on HIP).  Each lane brings its own task, or none
 * (active == 0); the ticket counter of each route is bumped once per warp
 * instead of once per task.  Results as the per-thread calls. */

/* chi_dev_submit for a warp: returns this lane's status; an inactive lane
 * gets CHI_OK with *future == 0. */
CHI_DEVICE chi_status_t chi_dev_warp_submit(const chi_dev_context_t *ctx, chi_route_t route,
                                            chi_method_t method, const void *input,
                                            uint32_t input_size, int active, chi_future_t *future) {
  using namespace chi_dev_detail;
  chi_port::syncwarp();
  const uint32_t lane = chi_port::lane_id();
  uint32_t kind = 0, slot = 0, gen = 0;
  chi_status_t s = CHI_OK;
  if (future) *future = 0;
  if (active) {
    s = future ? check_submit(ctx, route, method, input, input_size, &kind) : CHI_ERR_INVALID;
    if (s == CHI_OK) {
      const chi_dev_layout *l = layout(ctx);
      s = kind == kKindLocal ? local_prepare(l, method, input, input_size, &slot, &gen)
                             : cpu_prepare(l, input, input_size, &slot, &gen);
    }
  }
  const bool ready = active && s == CHI_OK;
  for (uint32_t k = kKindLocal; k <= kKindCpu; ++k) {
    const chi_port::lanemask_t group = chi_port::ballot(ready && kind == k);
    if (!group) continue;
    const int leader = chi_port::ffs_mask(group) - 1;
    uint64_t base = 0;
    if (static_cast<int>(lane) == leader) {
      const chi_dev_layout *l = layout(ctx);
      base = chi_port::fetch_add_dev(k == kKindLocal ? l->d2d_tail : l->d2h_tail,
                                     static_cast<uint64_t>(chi_port::popc(group)));
    }
    base = chi_port::shfl(base, leader);
    if (ready && kind == k) {
      const chi_dev_layout *l = layout(ctx);
      const uint64_t t = base + chi_port::popc(group & chi_port::lanes_below(lane));
      if (k == kKindLocal) {
        if (!queue_push_at(l, t, slot)) s = CHI_ERR_INTERNAL;
      } else {
        cpu_publish(l, t, method, input, input_size, slot, gen);
      }
      if (s == CHI_OK) *future = make_future(k, gen, slot);
    }
  }
  chi_port::syncwarp();
  return s;
}

/* chi_dev_wait for a warp: each active lane waits for its own future; an
 * inactive lane returns CHI_OK at once. */
CHI_DEVICE chi_status_t chi_dev_warp_wait(const chi_dev_context_t *ctx, chi_future_t future,
                                          int64_t timeout_ns, void *output, uint32_t output_capacity,
                                          uint32_t *output_size, int active) {
  chi_port::syncwarp();
  chi_status_t s = CHI_OK;
  if (active) s = chi_dev_wait(ctx, future, timeout_ns, output, output_capacity, output_size);
  chi_port::syncwarp();
  return s;
}

/* ------------------------------------------------------- the orchestrator
 * One loop, shared by the library's built-in orchestrator and by every user
 * orchestrator made with CHI_DEFINE_ORCHESTRATOR, so built-in methods always
 * work.  Warps 0 .. h2d_pollers-1 poll the CPU->GPU ring (each its share of
 * tickets) and run what they find; the other warps run the GPU->GPU queue
 * (with a single warp, it does both).  Handlers run on a whole warp.  The
 * kernel ends after its lease (state->lease_ns) or at the stop flag and is
 * relaunched by the runtime; a launch picks up where the last one stopped. */
namespace chi_dev_detail {

CHI_DEVICE void warp_copy(uint8_t *dst, const uint8_t *src, uint32_t n, uint32_t lane) {
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15u) == 0) {
    uint32_t n16 = n & ~15u;
    for (uint32_t i = lane * 16u; i < n16; i += 16u * CHI_WARP_SIZE)
      *reinterpret_cast<uint4 *>(dst + i) = *reinterpret_cast<const uint4 *>(src + i);
    for (uint32_t i = n16 + lane; i < n; i += CHI_WARP_SIZE) dst[i] = src[i];
  } else {
    for (uint32_t i = lane; i < n; i += CHI_WARP_SIZE) dst[i] = src[i];
  }
}
/* Copy out of pinned host memory: volatile 16-byte loads, many in flight. */
CHI_DEVICE void warp_copy_from_host(uint8_t *dst, const uint8_t *src, uint32_t n, uint32_t lane) {
  const uint64_t *s = reinterpret_cast<const uint64_t *>(src);
  uint64_t *d = reinterpret_cast<uint64_t *>(dst);
  uint32_t nw = (n + 7u) / 8u;
  for (uint32_t i = 2u * lane; i < nw; i += 2u * CHI_WARP_SIZE) {
    uint64_t a, b;
    chi_port::ll_load16(s + i, &a, &b);
    d[i] = a;
    if (i + 1u < nw) d[i + 1u] = b;
  }
}

CHI_DEVICE chi_status_t builtin_echo(chi_dev_request_t *r, uint32_t lane) {
  if (r->input_size > r->output_capacity) return CHI_ERR_TOO_LARGE;
  warp_copy(static_cast<uint8_t *>(r->output), static_cast<const uint8_t *>(r->input), r->input_size, lane);
  r->output_size = r->input_size;
  return CHI_OK;
}
CHI_DEVICE chi_status_t builtin_add(chi_dev_request_t *r, uint32_t lane) {
  if (r->input_size != 16u || r->output_capacity < 8u) return CHI_ERR_INVALID;
  if (lane == 0) {
    const uint8_t *in = static_cast<const uint8_t *>(r->input);
    uint64_t a = 0, b = 0;
    for (int i = 7; i >= 0; --i) {
      a = (a << 8) | in[i];
      b = (b << 8) | in[8 + i];
    }
    uint64_t sum = a + b;
    uint8_t *out = static_cast<uint8_t *>(r->output);
    for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(sum >> (8 * i));
  }
  r->output_size = 8;
  return CHI_OK;
}
/* FNV-1a is sequential: lane 0 hashes, reading words where it can. */
CHI_DEVICE uint64_t fnv1a64(const void *data, uint32_t n) {
  const uint8_t *p = static_cast<const uint8_t *>(data);
  uint64_t h = 0xcbf29ce484222325ull;
  uint32_t i = 0;
  if ((reinterpret_cast<uintptr_t>(p) & 3u) == 0) {
    for (; i + 4u <= n; i += 4u) {
      uint32_t w = *reinterpret_cast<const uint32_t *>(p + i);
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        h ^= (w >> (8 * b)) & 0xFFu;
        h *= 0x100000001b3ull;
      }
    }
  }
  for (; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}
CHI_DEVICE chi_status_t builtin_checksum(chi_dev_request_t *r, uint32_t lane) {
  if (r->output_capacity < 8u) return CHI_ERR_TOO_LARGE;
  if (lane == 0) {
    uint64_t h = fnv1a64(r->input, r->input_size);
    uint8_t *out = static_cast<uint8_t *>(r->output);
    for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(h >> (8 * i));
  }
  r->output_size = 8;
  return CHI_OK;
}

/* Runs one task on the whole warp; returns lane 0's status, with
 * r->output_size set to lane 0's value (checked against the capacity). */
template <class D>
CHI_DEVICE_NOINLINE chi_status_t run_handler(const chi_dev_orch_state_t *st, chi_dev_request_t *r,
                                             uint32_t lane) {
  chi_status_t s;
  const chi_method_t m = r->method;
  if (m == CHI_METHOD_ECHO) {
    s = builtin_echo(r, lane);
  } else if (m == CHI_METHOD_ADD) {
    s = builtin_add(r, lane);
  } else if (m == CHI_METHOD_CHECKSUM) {
    s = builtin_checksum(r, lane);
  } else {
    int32_t idx = m < st->ndispatch ? chi_port::ld_relaxed_dev(st->dispatch + m) : -1;
    s = idx < 0 ? CHI_ERR_NOT_FOUND : D::call(static_cast<uint32_t>(idx), r);
  }
  chi_port::syncwarp();
  s = chi_port::shfl(s, 0);
  r->output_size = chi_port::shfl(r->output_size, 0);
  if (r->output_size > r->output_capacity) {
    s = CHI_ERR_INTERNAL;
    r->output_size = 0;
  }
  return s;
}

template <class D>
CHI_DEVICE_NOINLINE void run_device_task(const chi_dev_orch_state_t *st, uint32_t slot, uint32_t lane) {
  const chi_dev_layout *l = layout(&st->ctx);
  uint8_t *base = l->d2d_slots + static_cast<uint64_t>(slot) * (CHI_DEV_SLOT_HEADER + 2u * l->payload_stride);
  chi_dev_slot_header_t *h = reinterpret_cast<chi_dev_slot_header_t *>(base);
  /* The state word (for its generation) in the same round trip as the header. */
  const uint32_t w = lane == 0 ? chi_port::ld_relaxed_dev(l->d2d_state + slot) : 0u;
  chi_dev_request_t r;
  r.method = h->method;
  r.source = l->gpu;
  r.input = base + CHI_DEV_SLOT_HEADER;
  r.input_size = h->input_size;
  r.output = base + CHI_DEV_SLOT_HEADER + l->payload_stride;
  r.output_capacity = l->max_payload;
  r.output_size = 0;
  r.ctx = &st->ctx;
  chi_status_t s = r.input_size > l->max_payload ? CHI_ERR_PROTOCOL : run_handler<D>(st, &r, lane);
  if (lane == 0) {
    h->status = s;
    h->output_size = r.output_size;
    chi_port::st_release_dev(l->d2d_state + slot, (w & ~0xFFu) | CHI_DEV_SLOT_DONE);
  }
  chi_port::syncwarp();
}

/* v: this lane's word of a complete ring entry (lanes >= 32 hold nothing). */
template <class D>
CHI_DEVICE_NOINLINE void run_host_task(const chi_dev_orch_state_t *st, uint64_t v, uint32_t lane,
                                       uint8_t *in, uint8_t *out) {
  const chi_dev_layout *l = layout(&st->ctx);
  const uint32_t method = chi_port::shfl(ll_data(v), 0);
  const uint32_t size = chi_port::shfl(ll_data(v), 1);
  const uint32_t slot = chi_port::shfl(ll_data(v), 2);
  const uint32_t gen = chi_port::shfl(ll_data(v), 3);
  if (slot >= st->h2d_slots) return; /* cannot answer: nobody waits on such a slot */
  chi_dev_request_t r;
  r.method = method;
  r.source = CHI_ROUTE_CPU;
  r.input = in;
  r.input_size = size;
  r.output = out;
  r.output_capacity = l->max_payload;
  r.output_size = 0;
  r.ctx = &st->ctx;
  chi_status_t s;
  if (size > l->max_payload) {
    s = CHI_ERR_PROTOCOL;
  } else {
    if (size <= CHI_DEV_LL_INLINE) {
      if (lane >= CHI_DEV_LL_HEADER && lane < CHI_DEV_LL_WORDS && (lane - CHI_DEV_LL_HEADER) * 4u < size)
        reinterpret_cast<uint32_t *>(in)[lane - CHI_DEV_LL_HEADER] = ll_data(v);
    } else {
      chi_port::fence_acquire_sys();
      warp_copy_from_host(in, st->h2d_buf + static_cast<uint64_t>(slot) * l->payload_stride, size, lane);
    }
    chi_port::syncwarp();
    s = run_handler<D>(st, &r, lane);
  }
  uint64_t *rec = st->h2d_done + static_cast<uint64_t>(slot) * CHI_DEV_LL_WORDS;
  const uint32_t osize = r.output_size;
  if (osize <= CHI_DEV_LL_INLINE) {
    /* One coalesced 256-byte store; the flags make a fence unnecessary. */
    if (lane >= CHI_DEV_LL_HEADER && lane < CHI_DEV_LL_WORDS && (lane - CHI_DEV_LL_HEADER) * 4u < osize)
      chi_port::ll_store8(rec + lane, ll_pack(reinterpret_cast<const uint32_t *>(out)[lane - CHI_DEV_LL_HEADER], gen));
  } else {
    uint64_t *dst = reinterpret_cast<uint64_t *>(st->h2d_buf + static_cast<uint64_t>(slot) * l->payload_stride);
    const uint64_t *src = reinterpret_cast<const uint64_t *>(out);
    for (uint32_t i = 2u * lane; i < (osize + 7u) / 8u; i += 2u * CHI_WARP_SIZE)
      chi_port::ll_store16(dst + i, src[i], src[i + 1u]);
    chi_port::fence_sys();
    chi_port::syncwarp();
  }
  if (lane == 0) chi_port::ll_store16(rec, ll_pack(static_cast<uint32_t>(s), gen), ll_pack(osize, gen));
  chi_port::syncwarp();
}

/* Polls this warp's share of the CPU->GPU ring: the entries of tickets next,
 * next + P, ... (up to 4 at once when busy, in one round trip) and runs those
 * that are complete, in order.  Returns the number run. */
template <class D>
CHI_DEVICE_NOINLINE uint32_t poll_host(const chi_dev_orch_state_t *st, uint64_t *next, uint32_t batch,
                                       uint32_t lane, uint8_t *in, uint8_t *out) {
  const uint32_t P = st->h2d_pollers;
  const uint64_t mask = st->h2d_ring_entries - 1u;
  const bool reader = lane < CHI_DEV_LL_WORDS;
  uint64_t v[4] = {0, 0, 0, 0};
#pragma unroll
  for (uint32_t k = 0; k < 4u; ++k)
    if (k < batch && reader)
      v[k] = chi_port::ll_load8(st->h2d_ring + ((*next + k * P) & mask) * CHI_DEV_LL_WORDS + lane);
  uint32_t ran = 0;
  for (uint32_t k = 0; k < batch; ++k) {
    uint64_t x = k == 0 ? v[0] : k == 1 ? v[1] : k == 2 ? v[2] : v[3];
    const uint64_t ticket = *next + k * P;
    const uint32_t flag = static_cast<uint32_t>(ticket) + 1u;
    if ((chi_port::ballot(lane < CHI_DEV_LL_HEADER && ll_flag(x) == flag) & 0xFu) != 0xFu) break;
    const uint32_t size = chi_port::shfl(ll_data(x), 1);
    const uint32_t words =
        CHI_DEV_LL_HEADER + (size <= CHI_DEV_LL_INLINE ? static_cast<uint32_t>(round_words(size)) : 0u);
    /* Header seen before all data words landed: read those words again. */
    const uint64_t *mine = st->h2d_ring + (ticket & mask) * CHI_DEV_LL_WORDS + lane;
    while (chi_port::ballot(lane < words && ll_flag(x) != flag) != 0)
      if (lane < words && ll_flag(x) != flag) x = chi_port::ll_load8(mine);
    run_host_task<D>(st, x, lane, in, out);
    ++ran;
  }
  *next += static_cast<uint64_t>(ran) * P;
  return ran;
}

constexpr uint64_t kWorkerSpinNs = 50000;
/* Past its lease the keeper warp looks at the device routes this often. */
constexpr uint64_t kKeeperSampleNs = 4000;
/* A task slot held with no device-route activity keeps the kernel at most this long
 * (a future never waited for must not keep it forever). */
constexpr uint64_t kKeeperHoldNs = 20000000;
/* A successor launch still being queued after this long is held back by
 * another thread's device-wide call. */
constexpr uint64_t kKeeperBlockedNs = 30000;
/* With no successor queued or being queued this long after the lease (the
 * lease thread is not running), the kernel ends anyway. */
constexpr uint64_t kKeeperHostLateNs = 20000000;

/* The keeper's view of the device routes (warp-collective): a signature that
 * changes with every submission (the tickets) and every slot taken or freed
 * (the bitmaps), and whether any slot is in use. */
CHI_DEVICE_NOINLINE uint64_t route_signature(const chi_dev_layout *l, uint32_t lane, bool *in_use) {
  const uint32_t nw = l->slots >> 5;
  uint64_t h = 0;
  uint32_t any = 0;
  for (uint32_t i = lane; i < nw; i += CHI_WARP_SIZE) {
    const uint32_t a = chi_port::ld_relaxed_dev(l->d2d_bitmap + i);
    const uint32_t b = chi_port::ld_relaxed_dev(l->d2h_bitmap + i);
    any |= a | b;
    h += (static_cast<uint64_t>(a) * 0x9E3779B97F4A7C15ull) ^
         ((static_cast<uint64_t>(b) + i) * 0xBF58476D1CE4E5B9ull) ^ i;
  }
  for (int d = 1; d < CHI_WARP_SIZE; d <<= 1) {
    h += chi_port::shfl(h, static_cast<int>(lane ^ static_cast<uint32_t>(d)));
    any |= chi_port::shfl(any, static_cast<int>(lane ^ static_cast<uint32_t>(d)));
  }
  *in_use = any != 0;
  uint64_t tails = lane == 0 ? chi_port::ld_relaxed_dev(l->d2d_tail) * 0x100000001B3ull +
                                   chi_port::ld_relaxed_dev(l->d2h_tail)
                             : 0u;
  return h ^ chi_port::shfl(tails, 0);
}
/* Tasks a worker takes at once: one pop round trip for several tasks, few
 * enough that a burst still spreads over the workers. */
constexpr uint32_t kPopBatch = 8;

template <class D>
CHI_DEVICE void orchestrator_main(const chi_dev_orch_state_t *st) {
  const uint32_t lane = chi_port::lane_id();
  const uint32_t wpb = blockDim.x / CHI_WARP_SIZE;
  const uint32_t gw = blockIdx.x * wpb + threadIdx.x / CHI_WARP_SIZE;
  if (st->abi != CHI_DEV_ABI_VERSION) {
    if (gw == 0 && lane == 0) chi_port::st_relaxed_dev(st->control + 1, CHI_DEV_FAULT_ABI);
    return;
  }
  if (gw >= st->nwarps) return;
  const chi_dev_layout *l = layout(&st->ctx);
  const bool poller = gw < st->h2d_pollers;
  const bool worker = !poller || st->nwarps == 1u;
  uint8_t *in = st->scratch + static_cast<uint64_t>(gw) * 2u * l->payload_stride;
  uint8_t *out = in + l->payload_stride;
  uint64_t next = poller ? st->h2d_next[gw] : 0;
  uint32_t batch = 1;
  uint64_t idle_since = 0;
  uint64_t qhead = 0; /* the worker's guess of the run queue's head */
  if (worker) {
    uint64_t h = lane == 0 ? chi_port::ld_relaxed_dev(l->d2d_head) : 0u;
    qhead = chi_port::shfl(h, 0);
  }
  /* The lease (docs/gpu.md, "Coexisting with other CUDA code").  The kernel
   * ends after lease_ns, so that device-wide synchronization by other code
   * (cudaFree, cudaDeviceSynchronize, module loading) waits about one lease.
   * All in-flight state is in device memory (the polling warps' next
   * tickets, the run queue, the slots), so the next launch goes on from
   * there.  The runtime's lease thread queues that launch on the same stream
   * shortly before the lease ends, so it starts as soon as this one ends.
   * The last warp, the keeper, decides when the launch ends, once past the
   * lease: at once when the successor is queued; if queuing it takes longer
   * than kKeeperBlockedNs (another thread's cudaFree or the like holds
   * launches back until the device is idle, kernels that wait for tasks
   * included), only once no device task was submitted, taken or consumed for
   * a lease and no slot is in use (or slots were held with no activity for
   * kKeeperHoldNs), so that those kernels finish and the call returns;
   * without a successor or an attempt, after kKeeperHostLateNs.  Its
   * decision reaches the other warps through control[6..7], compared with
   * the launch's epoch (= launch index, from the arrival counter). */
  const uint64_t lease_ns = st->lease_ns;
  const uint64_t t_start = chi_port::shfl(chi_port::timer_ns(), 0); /* warp-uniform decisions */
  const uint64_t lease_end = lease_ns ? t_start + lease_ns : ~0ull;
  uint64_t *const arrivals = reinterpret_cast<uint64_t *>(st->control + 4);
  uint64_t *const lease_over = reinterpret_cast<uint64_t *>(st->control + 6);
  uint64_t epoch = 0;
  const bool keeper = lease_ns != 0 && gw == st->nwarps - 1u;
  uint64_t keep_sig = 0, keep_since = t_start, keep_sampled = 0, trying_since = 0;
  if (lease_ns) {
    const uint64_t a = lane == 0 ? chi_port::fetch_add_dev(arrivals, static_cast<uint64_t>(1)) : 0u;
    epoch = chi_port::shfl(a, 0) / st->nwarps; /* launches never overlap: exact */
    /* A launch queued behind one that pause stopped: nothing to do. */
    const uint32_t stop0 = lane == 0 ? chi_port::ld_relaxed_dev(st->control) : 0u;
    if (chi_port::shfl(stop0, 0)) return;
    bool in_use;
    if (keeper) keep_sig = route_signature(l, lane, &in_use);
  }
  for (;;) {
    /* The stop flag's load overlaps this round's polls; it is looked at after them. */
    const uint32_t stop = lane == 0 ? chi_port::ld_relaxed_dev(st->control) : 0u;
    const uint64_t now0 = lane == 0 && lease_ns ? chi_port::timer_ns() : 0u;
    uint32_t expired = 0u;
    if (lease_ns && !keeper && lane == 0 && now0 >= lease_end)
      expired = chi_port::ld_relaxed_dev(lease_over) > epoch ? 1u : 0u;
    uint32_t ran = 0;
    if (poller) {
      ran = poll_host<D>(st, &next, batch, lane, in, out);
      batch = ran ? 4u : 1u;
    }
    if (worker) {
      uint32_t mine = 0;
      const uint32_t n = queue_pop_warp(l, lane, kPopBatch, &qhead, &mine);
      chi_port::syncwarp(); /* orders the lanes' acquires before the other lanes' reads */
      for (uint32_t k = 0; k < n; ++k) run_device_task<D>(st, chi_port::shfl(mine, static_cast<int>(k)), lane);
      ran += n;
    }
    if (keeper) {
      const uint64_t now = chi_port::shfl(now0, 0);
      if (now >= lease_end && now - keep_sampled >= kKeeperSampleNs) {
        keep_sampled = now;
        uint64_t queued = 0, trying = 0;
        if (lane == 0) chi_port::ll_load16(st->host_lease, &queued, &trying);
        queued = chi_port::shfl(queued, 0);
        trying = chi_port::shfl(trying, 0);
        bool leave = false;
        if (queued >= epoch + 2u) {
          leave = true; /* the successor is queued: it starts when this launch ends */
        } else if (trying == epoch + 2u) { /* being queued, or the lease thread is held back */
          if (trying_since == 0) trying_since = now;
          if (now - trying_since >= kKeeperBlockedNs) {
            bool in_use;
            const uint64_t sig = route_signature(l, lane, &in_use);
            if (sig != keep_sig) {
              keep_sig = sig;
              keep_since = now;
            }
            const uint64_t quiet = now - keep_since;
            leave = quiet >= lease_ns && (!in_use || quiet >= kKeeperHoldNs);
          }
        } else {
          trying_since = 0;
          leave = now - lease_end >= kKeeperHostLateNs;
        }
        if (leave) {
          if (lane == 0) chi_port::st_relaxed_dev(lease_over, epoch + 1u);
          expired = 1u;
        }
      }
    }
    if (chi_port::shfl(stop | expired, 0)) break;
    if (ran) {
      idle_since = 0;
    } else if (!poller) {
      /* A worker idle for a while naps (it shares its SM with user
       * kernels); before that it spins, so a task that comes within
       * kWorkerSpinNs of the last one waits for no nap. */
      const uint64_t now = chi_port::timer_ns();
      if (idle_since == 0) idle_since = now;
      else if (now - idle_since > kWorkerSpinNs) chi_port::nanosleep(256u);
    }
  }
  if (poller && lane == 0) st->h2d_next[gw] = next;
}

}  // namespace chi_dev_detail

/* ------------------------------------------------------ user orchestrators
 * CHI_DEFINE_ORCHESTRATOR(name, dispatch_fn, names_array, count), at file
 * scope of the user's .cu file, defines
 *   - a __global__ orchestrator kernel running the loop above, whose dispatch
 *     calls   __device__ chi_status_t dispatch_fn(uint32_t index, chi_dev_request_t *req)
 *     for methods names_array[0 .. count-1] (index = position in the array);
 *   - its host launcher (in the user's file, so the kernel is launched by the
 *     CUDA runtime instance that registered it);
 *   - chi_gpu_orchestrator_t name(void), to pass to chi_gpu_set_orchestrator.
 * dispatch_fn is called by all lanes of one warp, converged, each with its
 * own copy of *req: lane 0's return value and req->output_size count; write
 * at most req->output_capacity bytes to req->output.  Keep handlers short:
 * while one runs, its warp serves no other task.  Built-in methods (echo, add,
 * checksum) keep working; a method the dispatch does not serve gives
 * CHI_ERR_NOT_FOUND at the waiter.  The kernel follows the same lease as the
 * built-in one (gpu.lease_us): it ends after the lease and the runtime
 * relaunches it through the launcher, from its own thread, so a handler
 * must not keep state in registers or shared memory across tasks. */
#define CHI_DEFINE_ORCHESTRATOR(name, dispatch_fn, names_array, count)                           \
  struct name##_chi_dispatch {                                                                  \
    static __device__ __forceinline__ chi_status_t call(uint32_t index, chi_dev_request_t *req) { \
      return dispatch_fn(index, req);                                                           \
    }                                                                                           \
  };                                                                                            \
  __global__ void name##_chi_kernel(const chi_dev_orch_state_t *state) {                        \
    chi_dev_detail::orchestrator_main<name##_chi_dispatch>(state);                              \
  }                                                                                             \
  static chi_status_t name##_chi_launch(const chi_gpu_launch_t *launch) {                       \
    if (!launch || launch->struct_size < sizeof(chi_gpu_launch_t)) return CHI_ERR_INVALID;      \
    name##_chi_kernel<<<launch->blocks, launch->threads_per_block, 0,                           \
                        (chi_port_stream_t)launch->stream>>>(                                   \
        (const chi_dev_orch_state_t *)launch->state);                                           \
    return chi_port_launch_ok() ? CHI_OK : CHI_ERR_INTERNAL;                                    \
  }                                                                                             \
  chi_gpu_orchestrator_t name(void) {                                                           \
    chi_gpu_orchestrator_t o;                                                                   \
    o.struct_size = sizeof(o);                                                                  \
    o.launch = name##_chi_launch;                                                               \
    o.method_names = (names_array);                                                             \
    o.method_count = (uint32_t)(count);                                                         \
    return o;                                                                                   \
  }

#endif /* CHI_GPU_COMPILER && __cplusplus */

#endif /* CHIMAERA_DEVICE_H */

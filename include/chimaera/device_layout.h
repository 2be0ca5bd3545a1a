/*
 * chimaera/device_layout.h -- the memory chimaera's runtime and device code
 * share: the structures the library sets up in pinned host and device memory,
 * their constants, and the request a device handler receives.
 *
 * Included by chimaera_device.h; not meant for direct use.  Plain C (the
 * static_assert aside), so host code and device code compile the same
 * definitions.  CHI_DEV_ABI_VERSION changes whenever one of them does: an
 * orchestrator kernel built against another version reports
 * CHI_DEV_FAULT_ABI instead of running.
 */
#ifndef CHIMAERA_DEVICE_LAYOUT_H
#define CHIMAERA_DEVICE_LAYOUT_H

#include <stdint.h>

#include "chimaera.h"

#define CHI_DEV_ABI_VERSION 11u
/* The context's first word: "CH" and the ABI version (since ABI 9; it was
 * "CHID" before), so a kernel built against another chimaera_device.h gets
 * CHI_ERR_INVALID from every device call instead of running an older
 * protocol over this layout. */
#define CHI_DEV_CTX_MAGIC (0x43480000u | CHI_DEV_ABI_VERSION)

/* An LL record: 32 eight-byte words, each {uint32 data, uint32 flag}.  Words
 * 0..3 are a header, words 4..31 carry up to 112 bytes inline.  Exception,
 * since ABI 6: a GPU->CPU reply (d2h_reply) carries its inline output dense
 * (bytes from word 4 on, no flags), complete once word 0 carries the
 * generation; word 1 is {output size, generation}, written before word 0.
 * An output of up to CHI_DEV_REPLY_LL_OUTPUT bytes is also in words 2-3 as
 * LL words, written before word 1, so that a waiter's poll can take it with
 * the header; a reader that finds them without the generation uses the dense
 * copy.  Since ABI 11 words 2-3 are written with every reply, zeros (flag 0)
 * when they carry no output, so they never keep an older reply's flag. */
#define CHI_DEV_LL_WORDS 32u
#define CHI_DEV_LL_HEADER 4u
#define CHI_DEV_LL_INLINE 112u
#define CHI_DEV_REPLY_LL_OUTPUT 8u

/* GPU->GPU slot (since ABI 9, docs/gpu.md "GPU->GPU: bells and LL slots"):
 * CHI_DEV_SLOT_HEADER bytes of header, then the plain input at
 * +CHI_DEV_SLOT_HEADER and the plain output at +CHI_DEV_SLOT_HEADER +
 * payload_stride.  The header holds LL words (eight bytes each, {uint32 data,
 * uint32 flag}, the flag the task's generation): word 0 {method} and word 1
 * {input size}, the request, written by the submitter; words 2 {status} and
 * 3 {output size}, the reply, written by the orchestrator; an input of up to
 * CHI_DEV_D2D_LL_BYTES at byte CHI_DEV_D2D_IN_LL and an output of up to that
 * at CHI_DEV_D2D_OUT_LL, 4 bytes per word.  A reader that sees every flag
 * has it all, with no fence on either side.  A larger input or output is
 * plain bytes, written before a release fence and the request or reply
 * words.  The LL words have their own place: plain bytes of an earlier task
 * could carry any flag.  Since ABI 11 a writer of an LL area also zeroes
 * (flag 0) the words the slot's previous task left past its own payload, so
 * no word keeps a flag that its slot's generation could come back to. */
#define CHI_DEV_SLOT_HEADER 320u
#define CHI_DEV_D2D_LL_BYTES 64u
#define CHI_DEV_D2D_REQ_WORD 0u
#define CHI_DEV_D2D_REPLY_WORD 2u
#define CHI_DEV_D2D_IN_LL 64u
#define CHI_DEV_D2D_OUT_LL 192u

/* Slot state word: (generation << 8) | state. */
#define CHI_DEV_SLOT_FREE 0u
#define CHI_DEV_SLOT_SUBMITTED 1u
#define CHI_DEV_SLOT_CLAIMED 3u
/* GPU->GPU, since ABI 8: the orchestrator marks a task that ran by setting
 * this bit, whoever holds the future, so DONE is SUBMITTED with the bit; a
 * waiter that claimed the future before it ran (WAITING) may see WAITING
 * with the bit.  Since ABI 9 the bit comes after the reply words (a CAS
 * that checks the generation): a waiter takes the result from the reply
 * words, and the bit tells chi_dev_release who frees the slot. */
#define CHI_DEV_SLOT_DONE_BIT 0x80u
#define CHI_DEV_SLOT_DONE (CHI_DEV_SLOT_SUBMITTED | CHI_DEV_SLOT_DONE_BIT)
#define CHI_DEV_SLOT_WAITING 5u
/* chi_dev_release came first: whoever finishes the task (the orchestrator for
 * GPU->GPU, the orchestrator's sweep for GPU->CPU) frees the slot. */
#define CHI_DEV_SLOT_RELEASED 4u

/* chi_dev_ctx_layout_t.flags */
#define CHI_DEV_CTX_ORCHESTRATOR 1u /* the orchestrator's own copy: submits never wait for a slot */
/* A client process's context (docs/server.md, "Client kernels"): routes go
 * through the GPU->CPU ring and the client's relay forwards them; without
 * CHI_DEV_CTX_CLIENT_ORCH every route does, and d2d_* and gate are NULL. */
#define CHI_DEV_CTX_RELAY 2u
/* With CHI_DEV_CTX_RELAY, since ABI 11 (a flag older device code ignores:
 * it relays everything): the client runs an orchestrator of its own on this
 * GPU (gpu.client_orchestrator), and d2d_*, gate, wait_line[0..1] and diag
 * are its.  A GPU->GPU task for this GPU (CHI_ROUTE_LOCAL, CHI_ROUTE_GPU_ANY
 * or the context's GPU) whose method that orchestrator serves (a built-in,
 * CHI_DEV_CLIENT_ORCH_METHODS) goes to it directly, in the client's own CUDA
 * context; any other task still goes through the ring. */
#define CHI_DEV_CTX_CLIENT_ORCH 4u
/* Methods a client's own orchestrator serves: the built-ins, ids 1..3
 * (chimaera.h), which every runtime registers with the same ids. */
#define CHI_DEV_CLIENT_ORCH_METHODS 3u

/* GPU->CPU ring entry, header word 2: the slot in the low 24 bits; in a
 * relay context the route, plus CHI_DEV_ROUTE_BIAS, in the high 8 (0 in a
 * runtime's own context: the CPU route).  Routes -3 .. 251 fit. */
#define CHI_DEV_SLOT_BITS 24u
#define CHI_DEV_SLOT_MASK 0xFFFFFFu
#define CHI_DEV_ROUTE_BIAS 4
#define CHI_DEV_ROUTE_MAX 251

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
  uint32_t *d2d_bell;  /* slots / 32 words: a submit flips its slot's bit */
  uint32_t *d2d_seen;  /* slots / 32 words: the orchestrator's copy of the bells it served */
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
  uint32_t flags;            /* CHI_DEV_CTX_* */
  uint32_t submit_timeout_us; /* chi_dev_submit waits this long for a free slot (gpu.device_submit_timeout_us) */
  uint32_t *d2h_released;    /* GPU->CPU slots released before their reply came: the orchestrator sweeps them */
  uint64_t *wait_line;       /* submits waiting for a slot, [0] tickets taken, [1] served: GPU->GPU;
                              * [16], [17]: GPU->CPU (device memory) */
  uint64_t *diag;            /* pinned, CHI_DEV_DIAG_WORDS: the orchestrator's and the lease
                              * thread's state, for watchdogs and tests (chimaera/device_diag.h) */
  uint64_t *gate;            /* GPU->GPU gate (device): bit 63 set while the orchestrator has
                              * stepped aside, low bits the submitters between slot and bell */
  uint32_t lease_us;         /* gpu.lease_us */
  int32_t ngpus;             /* GPUs the runtime drives (CHI_ROUTE_GPU(n >= ngpus): CHI_ERR_NO_DEVICE) */
  uint32_t d2d_workers;      /* since ABI 9: orchestrator warps serving GPU->GPU bells ... */
  uint32_t d2d_first_worker; /* ... from this warp on; worker i serves bell words i, i + workers, ... */
  /* Since ABI 10: device memory of this GPU, ngpus entries: entry n is GPU
   * n's context as this GPU's kernels reach it (its GPU->GPU slots over peer
   * memory, docs/gpu.md "GPU->GPU across GPUs"); magic 0 where this GPU has
   * no peer access to GPU n.  NULL in a client's relay context. */
  const struct chi_dev_ctx_layout *peers;
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
                          * arrivals (uint64, lease epochs), [6..7] last lease over (uint64),
                          * [10..11] warp exits (uint64, exit_barrier; the runtime zeroes
                          * [6..11] before a launch on an idle stream) */
  uint64_t *h2d_next;    /* device: next ticket of each polling warp */
  int32_t *dispatch;     /* device: method id -> user dispatch index, -1: none */
  uint8_t *scratch;      /* device: per warp, input then output, payload_stride each */
  /* Fields added after ABI 2 go here, after `control`: a kernel of another ABI
   * still finds `abi` and `control` where it expects them and reports itself. */
  uint64_t lease_ns;     /* the kernel's lease (0: never ends); see orchestrator_main */
  const uint64_t *host_lease; /* pinned, written by the runtime's lease thread: [0] launches
                               * queued so far, [1] index + 1 of the next launch it will
                               * queue (it may be held back in a CUDA call); since ABI 7,
                               * [2] the pollers' bell: 0, or 1 + the first GPU->CPU
                               * ticket the parked pollers have not served (the keeper
                               * ends its launch once d2h_tail reaches it), [3] the
                               * lease of the launch queued last, in ns (lease_ns, or
                               * gpu.idle_lease_us while the routes are idle) */
  uint64_t *warp_done;   /* device, since ABI 9: per warp, 1 + the index of the last
                          * launch it finished (a keeper that steps aside waits for the
                          * other GPU->GPU workers before it serves every bell) */
} chi_dev_orch_state_t;

/* Largest orchestrator block, in warps: the orchestrator kernels are
 * compiled for it (__launch_bounds__), so they always fit the register file. */
#define CHI_DEV_ORCH_MAX_WARPS_PER_BLOCK 16u

/* Words at chi_dev_ctx_layout_t.diag; what each holds: chimaera/device_diag.h. */
#define CHI_DEV_DIAG_WORDS 32u

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

#endif /* CHIMAERA_DEVICE_LAYOUT_H */

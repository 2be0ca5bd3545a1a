/*
 * chimaera_device.h -- device-side API of chimaera for CUDA/HIP kernels.
 *
 * The one header a kernel author includes, in a .cu file (nvcc or hipcc).
 * Header-only: no -rdc, nothing to link beyond libchimaera.  A kernel
 * receives a chi_dev_context_t by value (from chi_gpu_context in chimaera.h)
 * and submits tasks from any thread:
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
 *   CHI_ROUTE_GPU(n)    another GPU of the runtime: not supported yet, CHI_ERR_INVALID;
 *                       n not a GPU of the runtime: CHI_ERR_NO_DEVICE (see docs/gpu.md).
 * With the context of a client process (chi_gpu_context of a client runtime)
 * every route goes through the client's relay to its server: CHI_ROUTE_CPU to
 * the server's CPU handlers (or the client's own), the GPU routes to the
 * server's orchestrators, CHI_ROUTE_GPU(n) for any GPU n of the server
 * (docs/server.md, "Client kernels").
 *
 * Warp semantics: every function below is per thread, except the
 * chi_dev_warp_* variants.  Any subset of a warp's lanes may call a
 * per-thread function, diverged or not, each with its own task and future;
 * none uses a warp-collective operation, so lanes that do not call need not
 * participate.  Slots are per GPU and per route (gpu.device_slots each).
 * When every slot of a route is in use, chi_dev_submit waits for one, up to
 * gpu.device_submit_timeout_us (then CHI_ERR_AGAIN), as chi_submit does on
 * the host; chi_dev_try_submit answers CHI_ERR_AGAIN at once instead.  A
 * slot is freed when its future is consumed (chi_dev_wait) or released
 * (chi_dev_release), so a grid far larger than the slots works as long as
 * each thread waits for (or releases) what it submitted: a thread that
 * holds futures while it waits for a slot may wait out the timeout.
 * Handlers running in the orchestrator never wait for a slot (their context,
 * req->ctx, makes every submit a try): they would wait for slots held by
 * kernels that wait for that very orchestrator.  The chi_dev_warp_* variants
 * are warp-collective and cheaper per task.
 *
 * Device futures must be consumed by chi_dev_wait or chi_dev_release on the
 * same GPU (any thread, any kernel); a future never consumed keeps its slot
 * until chi_finalize.  Host futures and device futures do not mix.
 *
 * The rest of the device code lives in headers of its own, included from
 * here at the point it is needed; none is meant to be included directly:
 *   chimaera/gpu_port.h             the CUDA/HIP differences: scoped atomics,
 *                                   LL loads and stores, timer, warp intrinsics
 *   chimaera/device_layout.h        the structures and constants the runtime
 *                                   and device code share (CHI_DEV_ABI_VERSION)
 *   chimaera/device_diag.h          what the diag words hold (CHI_DIAG_*): the
 *                                   lease's state, for watchdogs and tests
 *   chimaera/device_protocol.h      slots, futures, the GPU->GPU bells and
 *                                   the GPU->CPU ring behind the calls below
 *   chimaera/device_orchestrator.h  the orchestrator loop, the built-in
 *                                   methods, CHI_DEFINE_ORCHESTRATOR's body
 */
#ifndef CHIMAERA_DEVICE_H
#define CHIMAERA_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "chimaera.h"
#include "chimaera/gpu_port.h"
#include "chimaera/device_layout.h"

#if defined(CHI_GPU_COMPILER) && defined(__cplusplus)

#include "chimaera/device_protocol.h"

namespace chi_dev_detail {
/* The context's layout and a future's kind, generation and slot; false for a
 * NULL or foreign context or a future this context never issued.  A future
 * of another GPU's GPU->GPU route comes back as kKindLocal with that GPU's
 * layout in *l and *peer set: the same protocol, over peer memory. */
CHI_DEVICE bool open_future(const chi_dev_context_t *ctx, chi_future_t future, const chi_dev_layout **l,
                            uint32_t *kind, uint32_t *gen, uint32_t *slot, bool *peer = nullptr) {
  if (!ctx) return false;
  *l = layout(ctx);
  uint32_t gpu = 0;
  if ((*l)->magic != CHI_DEV_CTX_MAGIC || !split_future(future, (*l)->slots, kind, gen, slot, &gpu)) return false;
  if (peer) *peer = false;
  if (*kind != kKindPeer) return true;
  if ((*l)->flags & CHI_DEV_CTX_RELAY) return false;
  const chi_dev_layout *p = peer_layout(*l, static_cast<int32_t>(gpu));
  if (p == nullptr || *slot >= p->slots) return false;
  *l = p;
  *kind = kKindLocal;
  if (peer) *peer = true;
  return true;
}

/* GPU->GPU on GPU `route` (another GPU, kKindPeer): local_prepare and
 * local_publish over that GPU's slots, with system-scope fences (its
 * orchestrator reads them through its own L2).  A handler (the
 * orchestrator's context) never waits, there as here. */
CHI_DEVICE chi_status_t peer_submit(const chi_dev_layout *l, chi_route_t route, chi_method_t method,
                                    const void *input, uint32_t input_size, bool wait, uint32_t *slot,
                                    uint32_t *gen) {
  const chi_dev_layout *p = peer_layout(l, route);
  if (p == nullptr) return CHI_ERR_NO_DEVICE;
  if (l->flags & CHI_DEV_CTX_ORCHESTRATOR) wait = false;
  uint32_t left;
  chi_status_t s = local_prepare(p, slot, gen, &left, wait);
  if (s != CHI_OK) return s;
  local_publish(p, *slot, *gen, left, method, input, input_size, true);
  chi_port::fence_sys(); /* the task and its bell before the gate's count drops */
  gate_leave(p);
  return CHI_OK;
}

CHI_DEVICE chi_status_t submit_one(const chi_dev_context_t *ctx, chi_route_t route, chi_method_t method,
                                   const void *input, uint32_t input_size, chi_future_t *future,
                                   bool wait) {
  if (!future) return CHI_ERR_INVALID;
  *future = 0;
  uint32_t kind, slot, gen, left;
  chi_status_t s = check_submit(ctx, route, method, input, input_size, &kind);
  if (s != CHI_OK) return s;
  const chi_dev_layout *l = layout(ctx);
  uint64_t t;
  if (kind == kKindLocal) {
    if ((s = local_prepare(l, &slot, &gen, &left, wait)) != CHI_OK) return s;
    local_publish(l, slot, gen, left, method, input, input_size);
    gate_leave(l);
  } else if (kind == kKindPeer) {
    if ((s = peer_submit(l, route, method, input, input_size, wait, &slot, &gen)) != CHI_OK) return s;
    *future = make_future(kind, gen, slot, static_cast<uint32_t>(route));
    return CHI_OK;
  } else {
    if ((s = cpu_prepare(l, input, input_size, &slot, &gen, wait, &t)) != CHI_OK) return s;
    cpu_publish(l, t, method, input, input_size, ring_slot_word(l, slot, route), gen);
  }
  *future = make_future(kind, gen, slot);
  return CHI_OK;
}

/* GPU->GPU, the end of a wait: the reply's header words carry gen (r, as
 * local_poll read them).  held: this wait claimed the future before
 * (WAITING); else `seen` is the state word it read: CLAIMED when the wait
 * claimed the finished task already (chi_dev_wait's second CAS), else
 * SUBMITTED or DONE, claimed now.  Takes the output, marks the future
 * consumed and frees the slot; on CHI_ERR_TOO_LARGE the future stays valid. */
CHI_DEVICE chi_status_t local_take(const chi_dev_layout *l, uint32_t slot, uint32_t gen, bool held, uint32_t seen,
                                   d2d_reply *r, void *output, uint32_t output_capacity, uint32_t *output_size,
                                   bool peer = false) {
  uint32_t *state = l->d2d_state + slot;
  const uint32_t g8 = gen << 8;
  const chi_status_t status = static_cast<chi_status_t>(ll_data(r->h0));
  const uint32_t osize = ll_data(r->h1);
  const bool took = !held && seen == (g8 | CHI_DEV_SLOT_CLAIMED);
  if (output && osize > output_capacity) {
    if (held) { /* give the future back, DONE if the orchestrator marked it meanwhile */
      uint32_t expect = g8 | CHI_DEV_SLOT_WAITING;
      if (!chi_port::cas_relaxed_dev(state, &expect, g8 | CHI_DEV_SLOT_SUBMITTED))
        chi_port::st_relaxed_dev(state, g8 | CHI_DEV_SLOT_DONE);
    } else if (took) {
      chi_port::st_relaxed_dev(state, g8 | CHI_DEV_SLOT_DONE);
    }
    if (output_size) *output_size = osize;
    return CHI_ERR_TOO_LARGE;
  }
  /* A held future stays WAITING once consumed (a later wait, test or
   * release of it answers CHI_ERR_INVALID, as for CLAIMED), so this wait
   * stores nothing the next owner must see: its free needs no release.  A
   * claim made now is an RMW whose result this thread has seen; the free
   * after it is a release anyway.  The slot keeps that state until the next
   * submit takes it.  An LL output is in registers once complete: the slot
   * is freed first, so the free does not wait for the stores into the
   * caller's buffer. */
  if (!held && !took) {
    /* The orchestrator may set DONE between the read and the claim: once more then. */
    uint32_t expect = seen;
    if (!chi_port::cas_relaxed_dev(state, &expect, g8 | CHI_DEV_SLOT_CLAIMED) &&
        (expect != (g8 | CHI_DEV_SLOT_DONE) || !chi_port::cas_relaxed_dev(state, &expect, g8 | CHI_DEV_SLOT_CLAIMED)))
      return CHI_ERR_INVALID;
  }
  const bool ll = output && osize && osize <= CHI_DEV_D2D_LL_BYTES;
  if (ll) ll_finish(l, slot, gen, r, osize);
  else if (output && osize) local_plain_output(l, slot, osize, output, peer);
  if (held) bitmap_free_relaxed(l->d2d_bitmap, slot);
  else bitmap_free(l->d2d_bitmap, slot);
  if (ll) ll_get(output, r->w, osize);
  if (output_size) *output_size = osize;
  return status;
}
}  // namespace chi_dev_detail

/* Submits a task from device code, waiting for a free slot if need be.
 *   ctx         [in] this GPU's context (from chi_gpu_context, passed to the kernel).
 *   route       CHI_ROUTE_LOCAL / CHI_ROUTE_GPU_ANY / own GPU id (GPU->GPU), another GPU id
 *               (GPU->GPU across GPUs, with gpu.peer_routes) or CHI_ROUTE_CPU.
 *   method      a method id (chi_method_lookup on the host, or CHI_METHOD_*).
 *   input       [in] input_size bytes, copied before the call returns (may be
 *               NULL when input_size is 0).
 *   input_size  at most gpu.max_payload bytes.
 *   future      [out] for chi_dev_wait / chi_dev_test / chi_dev_release; 0 on any error.
 * When every slot of the route is in use, waits until one is freed, at most
 * gpu.device_submit_timeout_us (default 1 s; 0: never waits); a handler in
 * the orchestrator (req->ctx) never waits (see above).
 * Returns CHI_OK, CHI_ERR_INVALID (NULL future, bad context, method 0, NULL input
 * with a size), CHI_ERR_NO_DEVICE (CHI_ROUTE_GPU(n) with no GPU n in the
 * runtime; another GPU n unless the runtime's gpu.peer_routes is on and this
 * GPU has peer access to it: docs/gpu.md, "GPU->GPU across GPUs"),
 * CHI_ERR_TOO_LARGE (input_size over
 * gpu.max_payload), CHI_ERR_AGAIN (no slot freed within the timeout; or, on
 * the GPU->GPU route, the orchestrator stepped aside and did not come back:
 * the runtime's lease thread spent two leases in a CUDA call, where a
 * device-wide CUDA call in another thread may hold it, or the timeout
 * passed.  Do not retry in a loop: that call waits for this kernel; nothing
 * was queued).
 * An unknown method is not
 * an error here: chi_dev_wait returns CHI_ERR_NOT_FOUND.
 * Ownership: the future must be consumed by chi_dev_wait or chi_dev_release
 * on this GPU; otherwise its slot stays in use until chi_finalize.
 * Thread safety: any thread of any kernel on this GPU, concurrently, diverged
 * or not; handlers inside an orchestrator included. */
CHI_DEVICE chi_status_t chi_dev_submit(const chi_dev_context_t *ctx, chi_route_t route,
                                       chi_method_t method, const void *input,
                                       uint32_t input_size, chi_future_t *future) {
  return chi_dev_detail::submit_one(ctx, route, method, input, input_size, future, true);
}

/* chi_dev_submit that never waits for a slot: CHI_ERR_AGAIN at once when
 * every slot of the route is in use (nothing queued).  Parameters, other
 * statuses, ownership and thread safety as chi_dev_submit. */
CHI_DEVICE chi_status_t chi_dev_try_submit(const chi_dev_context_t *ctx, chi_route_t route,
                                           chi_method_t method, const void *input,
                                           uint32_t input_size, chi_future_t *future) {
  return chi_dev_detail::submit_one(ctx, route, method, input, input_size, future, false);
}

/* Waits for a device future and takes its result.
 *   ctx              [in] the context of the GPU the future was submitted on.
 *   future           from chi_dev_submit or chi_dev_warp_submit.
 *   timeout_ns       < 0: no bound (avoid in kernels); 0: poll once; > 0: at most that long.
 *   output           [out] buffer of output_capacity bytes, or NULL to discard the result.
 *   output_capacity  bytes of output.
 *   output_size      [out] bytes of output, or bytes needed (may be NULL).
 * Returns the handler's status once the task ran (future consumed; a method
 * no handler serves gives CHI_ERR_NOT_FOUND), or leaves the future valid and
 * returns CHI_ERR_TIMEOUT (not finished in time) or CHI_ERR_TOO_LARGE (output
 * too small: *output_size says the size needed).
 * CHI_ERR_INVALID: bad context, future 0, stale, consumed, released or never issued.
 * Ownership: a result returned consumes the future and frees its slot.
 * Thread safety: any thread of any kernel on the future's GPU; concurrent
 * waiters of one future: one gets the result, the others CHI_ERR_INVALID.
 * A future is claimed for the whole wait (timeout_ns != 0): while one
 * thread waits on it, chi_dev_wait, chi_dev_test and chi_dev_release of it
 * in other threads return CHI_ERR_INVALID.  A poll (timeout_ns == 0) claims
 * it only when the result is there. */
CHI_DEVICE chi_status_t chi_dev_wait(const chi_dev_context_t *ctx, chi_future_t future,
                                     int64_t timeout_ns, void *output, uint32_t output_capacity,
                                     uint32_t *output_size) {
  using namespace chi_dev_detail;
  const chi_dev_layout *l;
  uint32_t kind, gen, slot;
  bool peer = false;
  if (!open_future(ctx, future, &l, &kind, &gen, &slot, &peer)) return CHI_ERR_INVALID;
  const uint64_t t0 = chi_port::timer_ns();
  const uint32_t spin_ns = l->wait_spin_ns;
  if (kind == kKindLocal) {
    /* GPU->GPU: the reply is in the slot, flagged with the generation
     * (docs/gpu.md, "GPU->GPU: bells and LL slots"): a poll reads its header
     * words and, while the wait is young, an output of up to 64 bytes, all
     * in one round trip, and the reply is there once the flags are. */
    uint32_t *state = l->d2d_state + slot;
    const uint32_t g8 = gen << 8;
    const uint32_t want = output == nullptr ? 0u
                          : output_capacity < CHI_DEV_D2D_LL_BYTES ? output_capacity
                                                                   : CHI_DEV_D2D_LL_BYTES;
    d2d_reply r = {};
    uint32_t s;
    bool held = false; /* this wait claimed the future before the task ended (WAITING) */
    bool took = false; /* ... or after it ended (CLAIMED) */
    if (timeout_ns != 0) {
      /* Claim first: the CAS is in flight beside the first poll, while the
       * task runs.  A second CAS goes with it, not after its answer: a task
       * that ended already (DONE: a future waited for late, a fast task) is
       * claimed in the same round trip, where a claim after the poll
       * (local_take) would take one more.  On one word, in this order: at
       * most one of them succeeds. */
      uint32_t expect = g8 | CHI_DEV_SLOT_SUBMITTED, expect_done = g8 | CHI_DEV_SLOT_DONE;
      held = chi_port::cas_relaxed_dev(state, &expect, g8 | CHI_DEV_SLOT_WAITING);
      took = chi_port::cas_relaxed_dev(state, &expect_done, g8 | CHI_DEV_SLOT_CLAIMED);
      s = took ? g8 | CHI_DEV_SLOT_CLAIMED : expect;
    } else {
      s = chi_port::ld_relaxed_dev(state);
    }
    bool got = local_poll(l, slot, gen, want, &r);
    /* Not claimed: not done (a poll), or not this future's (another
     * generation, another waiter, consumed). */
    if (!held && !took &&
        ((s >> 8) != gen || ((s & 0xFFu) != CHI_DEV_SLOT_SUBMITTED && (s & 0xFFu) != CHI_DEV_SLOT_DONE)))
      return CHI_ERR_INVALID;
    while (!got) {
      const uint64_t waited = chi_port::timer_ns() - t0;
      if (timeout_ns == 0 || (timeout_ns > 0 && waited >= static_cast<uint64_t>(timeout_ns))) {
        if (held) { /* give the future back; DONE if the orchestrator marked it meanwhile */
          uint32_t expect = g8 | CHI_DEV_SLOT_WAITING;
          if (!chi_port::cas_relaxed_dev(state, &expect, g8 | CHI_DEV_SLOT_SUBMITTED))
            chi_port::st_relaxed_dev(state, g8 | CHI_DEV_SLOT_DONE);
        } else if (took) { /* done, its reply words not seen yet: back to DONE */
          chi_port::st_relaxed_dev(state, g8 | CHI_DEV_SLOT_DONE);
        }
        return CHI_ERR_TIMEOUT;
      }
      wait_pause(waited, spin_ns);
      /* Past the spin, polls read the header words alone. */
      got = local_poll(l, slot, gen, waited < spin_ns ? want : 0u, &r);
    }
    return local_take(l, slot, gen, held, s, &r, output, output_capacity, output_size, peer);
  }

  /* GPU->CPU: the reply is in host memory.  A wait with a timeout claims the
   * future first: the claim (a device-memory atomic) is then in flight beside
   * the first poll instead of after the reply, and is undone on a timeout or
   * a buffer too small (a single poll claims only once the reply is there).  A poll is one round trip over PCIe: an acquire load of header
   * words 0-1 ({status, gen}, {output size, gen}).  When the buffer takes at
   * most CHI_DEV_REPLY_LL_OUTPUT bytes, a volatile load of words 2-3, which
   * carry such an output as LL words, is issued just before it while the
   * wait is young, and the reply is complete when the poll sees it.  With a
   * larger buffer the poll stays one load: on an H100 the pair made every
   * wait for a 64-byte result about 1 us slower (lab/journal/gpu-routes.md).  An
   * output that the poll did not bring is read after the acquire with plain
   * loads, all in flight at once: one more round trip up to 64 bytes
   * (take_reply_output past that). */
  uint32_t *state = l->d2h_state + slot;
  const uint64_t *rec = l->d2h_reply + static_cast<uint64_t>(slot) * CHI_DEV_LL_WORDS;
  uint32_t expect = (gen << 8) | CHI_DEV_SLOT_SUBMITTED;
  const bool want_ll = output != nullptr && output_capacity > 0u && output_capacity <= CHI_DEV_REPLY_LL_OUTPUT;
  uint64_t w0, w1, x2 = 0, x3 = 0;
  bool claimed;
  if (timeout_ns == 0) {
    /* Poll once: a kernel that polls in a loop must not pay a claim and its
     * undoing per poll.  The state is read beside the poll and the claim is
     * made only once the reply is there. */
    const uint32_t s = chi_port::ld_relaxed_dev(state);
    if (want_ll) chi_port::ll_load16(rec + 2, &x2, &x3);
    chi_port::ll_load16_acquire_sys(rec, &w0, &w1);
    if (s != expect) return CHI_ERR_INVALID;
    if (ll_flag(w0) != gen) return CHI_ERR_TIMEOUT;
    claimed = chi_port::cas_relaxed_dev(state, &expect, (gen << 8) | CHI_DEV_SLOT_CLAIMED);
  } else {
    claimed = chi_port::cas_relaxed_dev(state, &expect, (gen << 8) | CHI_DEV_SLOT_CLAIMED);
    if (want_ll) chi_port::ll_load16(rec + 2, &x2, &x3);
    chi_port::ll_load16_acquire_sys(rec, &w0, &w1);
  }
  if (!claimed) return CHI_ERR_INVALID;
  while (ll_flag(w0) != gen) {
    const uint64_t waited = chi_port::timer_ns() - t0;
    if (timeout_ns == 0 || (timeout_ns > 0 && waited >= static_cast<uint64_t>(timeout_ns))) {
      chi_port::st_relaxed_dev(state, (gen << 8) | CHI_DEV_SLOT_SUBMITTED); /* the future stays valid */
      return CHI_ERR_TIMEOUT;
    }
    wait_pause(waited, spin_ns);
    /* Past the spin, polls read the header alone: each load is PCIe
     * bandwidth when thousands of warps wait. */
    const bool young = want_ll && waited < spin_ns;
    if (young) chi_port::ll_load16(rec + 2, &x2, &x3);
    chi_port::ll_load16_acquire_sys(rec, &w0, &w1);
  }
  /* Word 1 is written before word 0; its half of the load may still be old. */
  if (ll_flag(w1) != gen) w1 = chi_port::ll_load8(rec + 1);
  if (ll_flag(w1) != gen) { /* cannot happen: see above */
    bitmap_free(l->d2h_bitmap, slot);
    return CHI_ERR_INTERNAL;
  }
  const chi_status_t status = static_cast<chi_status_t>(ll_data(w0));
  const uint32_t osize = ll_data(w1);
  if (output && osize > output_capacity) {
    chi_port::st_relaxed_dev(state, (gen << 8) | CHI_DEV_SLOT_SUBMITTED); /* the caller may wait again */
    if (output_size) *output_size = osize;
    return CHI_ERR_TOO_LARGE;
  }
  if (output && osize) {
    /* Words 2-3 loaded before word 0 are still this reply's if they carry
     * gen: the host rewrites them with every reply (flag 0 when they carry
     * no output), so they never hold an older reply of this generation. */
    if (osize <= CHI_DEV_REPLY_LL_OUTPUT && ll_flag(x2) == gen && ll_flag(x3) == gen) {
      const uint4 v = make_uint4(ll_data(x2), ll_data(x3), 0u, 0u);
      store_bytes16(static_cast<uint8_t *>(output), v, osize);
    } else if (osize <= 64u) {
      /* Only the pieces the output needs: each is PCIe bandwidth when
       * thousands of warps wait. */
      const uint4 *r4 = reinterpret_cast<const uint4 *>(rec) + CHI_DEV_LL_HEADER / 2u;
      const uint32_t take = (osize + 15u) / 16u;
      uint4 v0 = r4[0], v1 = {}, v2 = {}, v3 = {};
      if (take > 1u) v1 = r4[1];
      if (take > 2u) v2 = r4[2];
      if (take > 3u) v3 = r4[3];
      put_first64(output, osize, v0, v1, v2, v3);
    } else {
      take_reply_output(l, slot, static_cast<uint8_t *>(output), osize);
    }
  }
  if (output_size) *output_size = osize;
  bitmap_free(l->d2h_bitmap, slot); /* the slot stays CLAIMED until reused */
  return status;
}

/* Reports whether a device future has finished, without consuming it.
 *   ctx     [in] the context of the future's GPU.
 *   future  from chi_dev_submit or chi_dev_warp_submit.
 *   done    [out] 1: finished, 0: not yet.
 * Returns CHI_OK or CHI_ERR_INVALID (NULL argument, stale or unknown future,
 * or one another thread is waiting on: see chi_dev_wait).
 * Thread safety: any thread. */
CHI_DEVICE chi_status_t chi_dev_test(const chi_dev_context_t *ctx, chi_future_t future, int *done) {
  using namespace chi_dev_detail;
  const chi_dev_layout *l;
  uint32_t kind, gen, slot;
  if (!done || !open_future(ctx, future, &l, &kind, &gen, &slot)) return CHI_ERR_INVALID;
  if (kind == kKindLocal) {
    /* WAITING: another thread waits on it (CHI_ERR_INVALID, as for GPU->CPU).
     * Done: the reply words are there (the DONE bit comes after them). */
    const uint32_t s = chi_port::ld_relaxed_dev(l->d2d_state + slot);
    d2d_reply r = {};
    const bool got = local_poll(l, slot, gen, 0u, &r);
    if ((s >> 8) != gen || ((s & 0xFFu) != CHI_DEV_SLOT_SUBMITTED && (s & 0xFFu) != CHI_DEV_SLOT_DONE))
      return CHI_ERR_INVALID;
    *done = got || (s & 0xFFu) == CHI_DEV_SLOT_DONE;
    return CHI_OK;
  }
  uint32_t s = chi_port::ld_acquire_dev(l->d2h_state + slot);
  if (s != ((gen << 8) | CHI_DEV_SLOT_SUBMITTED)) return CHI_ERR_INVALID;
  uint64_t a, b;
  chi_port::ll_load16(l->d2h_reply + static_cast<uint64_t>(slot) * CHI_DEV_LL_WORDS, &a, &b);
  *done = ll_flag(a) == gen && ll_flag(b) == gen;
  return CHI_OK;
}

/* Gives up a device future: the task still runs (its result is dropped),
 * its slot is freed once it finished, and the future is consumed.
 *   ctx     [in] the context of the future's GPU.
 *   future  from chi_dev_submit, chi_dev_try_submit or a warp variant.
 * A GPU->GPU slot is freed by the orchestrator when the task ends (at once
 * when it already has); a GPU->CPU slot by the releasing thread when the
 * reply is already in, else by the orchestrator's next sweep after the reply
 * comes (while the orchestrator is paused, such slots stay taken until it
 * resumes).
 * Returns CHI_OK, or CHI_ERR_INVALID (NULL context, future 0, stale, consumed,
 * released or never issued).  A later chi_dev_wait or chi_dev_test of the
 * future returns CHI_ERR_INVALID.
 * Thread safety: any thread of any kernel on the future's GPU, handlers
 * included; with concurrent waiters or releasers of one future, one wins and
 * the others get CHI_ERR_INVALID. */
CHI_DEVICE chi_status_t chi_dev_release(const chi_dev_context_t *ctx, chi_future_t future) {
  using namespace chi_dev_detail;
  const chi_dev_layout *l;
  uint32_t kind, gen, slot;
  if (!open_future(ctx, future, &l, &kind, &gen, &slot)) return CHI_ERR_INVALID;
  if (kind == kKindLocal) {
    uint32_t *state = l->d2d_state + slot;
    uint32_t expect = (gen << 8) | CHI_DEV_SLOT_SUBMITTED;
    /* Still queued or running: the orchestrator frees it when the task ends. */
    if (chi_port::cas_relaxed_dev(state, &expect, (gen << 8) | CHI_DEV_SLOT_RELEASED)) return CHI_OK;
    if (expect != ((gen << 8) | CHI_DEV_SLOT_DONE) ||
        !chi_port::cas_relaxed_dev(state, &expect, (gen << 8) | CHI_DEV_SLOT_CLAIMED))
      return CHI_ERR_INVALID;
    bitmap_free(l->d2d_bitmap, slot);
    return CHI_OK;
  }
  uint32_t expect = (gen << 8) | CHI_DEV_SLOT_SUBMITTED;
  if (!chi_port::cas_relaxed_dev(l->d2h_state + slot, &expect, (gen << 8) | CHI_DEV_SLOT_RELEASED))
    return CHI_ERR_INVALID;
  /* Counted before the claim below can happen: the sweep runs while it is non-zero. */
  chi_port::fetch_add_dev(l->d2h_released, 1u);
  if (reply_arrived(l, slot, gen)) reclaim_released(l, slot, gen);
  return CHI_OK;
}

/* Resolves a reference to memory registered for THIS GPU (chi_register_gpu_mem):
 * *ptr = region start + offset after checking [offset, offset + length) lies
 * inside the region.
 *   ctx  [in] this GPU's context.
 *   ref  [in] the reference (region, offset, length).
 *   ptr  [out] a device pointer into the region.
 * Returns CHI_OK, CHI_ERR_INVALID (NULL argument, unknown or unregistered
 * region, region of another GPU or of the host, range outside), CHI_ERR_AGAIN
 * (the table was being rewritten for over a millisecond).
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

/* Warp-collective variants: every lane of the warp calls, converged (all 32
 * lanes on CUDA, the whole wavefront on HIP).  Each lane brings its own task,
 * or none (active == 0); the GPU->CPU ticket counter is bumped once per
 * warp instead of once per task.  Results as the per-thread calls. */

namespace chi_dev_detail {
CHI_DEVICE chi_status_t warp_submit(const chi_dev_context_t *ctx, chi_route_t route, chi_method_t method,
                                    const void *input, uint32_t input_size, int active,
                                    chi_future_t *future, bool wait) {
  chi_port::syncwarp();
  const uint32_t lane = chi_port::lane_id();
  uint32_t kind = 0, slot = 0, gen = 0;
  chi_status_t s = CHI_OK;
  if (future) *future = 0;
  if (active) {
    s = future ? check_submit(ctx, route, method, input, input_size, &kind) : CHI_ERR_INVALID;
    if (s == CHI_OK) {
      const chi_dev_layout *l = layout(ctx);
      if (kind == kKindLocal) {
        /* GPU->GPU needs no ticket: each lane publishes its slot and rings its bell. */
        uint32_t left;
        s = local_prepare(l, &slot, &gen, &left, wait);
        if (s == CHI_OK) {
          local_publish(l, slot, gen, left, method, input, input_size);
          gate_leave(l);
          *future = make_future(kind, gen, slot);
        }
      } else if (kind == kKindPeer) {
        s = peer_submit(l, route, method, input, input_size, wait, &slot, &gen);
        if (s == CHI_OK) *future = make_future(kind, gen, slot, static_cast<uint32_t>(route));
      } else {
        s = cpu_prepare(l, input, input_size, &slot, &gen, wait);
      }
    }
  }
  /* Lanes that waited for a slot meet the others again here. */
  chi_port::syncwarp();
  const bool ready = active && s == CHI_OK && kind == kKindCpu;
  const chi_port::lanemask_t group = chi_port::ballot(ready);
  if (group) {
    const int leader = chi_port::ffs_mask(group) - 1;
    uint64_t base = 0;
    if (static_cast<int>(lane) == leader)
      base = chi_port::fetch_add_dev(layout(ctx)->d2h_tail, static_cast<uint64_t>(chi_port::popc(group)));
    base = chi_port::shfl(base, leader);
    if (ready) {
      const uint64_t t = base + chi_port::popc(group & chi_port::lanes_below(lane));
      cpu_publish(layout(ctx), t, method, input, input_size, ring_slot_word(layout(ctx), slot, route), gen);
      *future = make_future(kind, gen, slot);
    }
  }
  chi_port::syncwarp();
  return s;
}
}  // namespace chi_dev_detail

/* chi_dev_submit for a warp: each active lane waits for a slot as
 * chi_dev_submit does, up to gpu.device_submit_timeout_us.
 *   active  this lane's task counts (non-zero) or the lane only takes part (0).
 *   other parameters as chi_dev_submit, per lane.
 * Returns this lane's status, as chi_dev_submit; an inactive lane gets CHI_OK
 * with *future == 0.
 * Thread safety: warp-collective (every lane, converged); warps call
 * concurrently, as for chi_dev_submit. */
CHI_DEVICE chi_status_t chi_dev_warp_submit(const chi_dev_context_t *ctx, chi_route_t route,
                                            chi_method_t method, const void *input,
                                            uint32_t input_size, int active, chi_future_t *future) {
  return chi_dev_detail::warp_submit(ctx, route, method, input, input_size, active, future, true);
}

/* chi_dev_warp_submit that never waits for a slot: a lane that finds none
 * gets CHI_ERR_AGAIN at once.  As chi_dev_warp_submit otherwise. */
CHI_DEVICE chi_status_t chi_dev_warp_try_submit(const chi_dev_context_t *ctx, chi_route_t route,
                                                chi_method_t method, const void *input,
                                                uint32_t input_size, int active,
                                                chi_future_t *future) {
  return chi_dev_detail::warp_submit(ctx, route, method, input, input_size, active, future, false);
}

/* chi_dev_wait for a warp: each active lane waits for its own future.
 *   active  this lane waits (non-zero) or only takes part (0).
 *   other parameters as chi_dev_wait, per lane.
 * Returns this lane's status, as chi_dev_wait; an inactive lane returns
 * CHI_OK at once.
 * Thread safety: warp-collective (every lane, converged). */
CHI_DEVICE chi_status_t chi_dev_warp_wait(const chi_dev_context_t *ctx, chi_future_t future,
                                          int64_t timeout_ns, void *output, uint32_t output_capacity,
                                          uint32_t *output_size, int active) {
  chi_port::syncwarp();
  chi_status_t s = CHI_OK;
  if (active) s = chi_dev_wait(ctx, future, timeout_ns, output, output_capacity, output_size);
  chi_port::syncwarp();
  return s;
}

/* User orchestrators.
 * CHI_DEFINE_ORCHESTRATOR(name, dispatch_fn, names_array, count), at file
 * scope of the user's .cu file, defines
 *   - a __global__ orchestrator kernel running the loop of
 *     chimaera/device_orchestrator.h, whose dispatch calls
 *       __device__ chi_status_t dispatch_fn(uint32_t index, chi_dev_request_t *req)
 *     for methods names_array[0 .. count-1] (index = position in the array);
 *   - its host launcher (in the user's file, so the kernel is launched by the
 *     CUDA runtime instance that registered it);
 *   - chi_gpu_orchestrator_t name(void), to pass to chi_gpu_set_orchestrator.
 * dispatch_fn is called by all lanes of one warp, converged, each with its
 * own copy of *req (chi_dev_request_t, chimaera/device_layout.h): lane 0's
 * return value and req->output_size count; write at most
 * req->output_capacity bytes to req->output.  Keep handlers short: while one
 * runs, its warp serves no other task.  Built-in methods (echo, add,
 * checksum) keep working; a method the dispatch does not serve gives
 * CHI_ERR_NOT_FOUND at the waiter.  The kernel follows the same lease as the
 * built-in one (gpu.lease_us): it ends after the lease and the runtime
 * relaunches it through the launcher, from its own thread, so a handler
 * must not keep state in registers or shared memory across tasks.
 * Thread safety: handlers may call the per-thread functions above with
 * req->ctx (there chi_dev_submit never waits for a slot: CHI_ERR_AGAIN at
 * once when none is free). */
#include "chimaera/device_orchestrator.h"

#endif /* CHI_GPU_COMPILER && __cplusplus */

#endif /* CHIMAERA_DEVICE_H */

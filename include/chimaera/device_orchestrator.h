/*
 * chimaera/device_orchestrator.h -- the orchestrator kernel's body and the
 * CHI_DEFINE_ORCHESTRATOR machinery (its contract is documented in
 * chimaera_device.h).
 *
 * Included by chimaera_device.h; not meant for direct use.
 *
 * One loop, shared by the library's built-in orchestrator and by every user
 * orchestrator made with CHI_DEFINE_ORCHESTRATOR, so built-in methods always
 * work.  Warps 0 .. h2d_pollers-1 poll the CPU->GPU ring (each its share of
 * tickets) and run what they find; the other warps serve the GPU->GPU
 * bells (with a single warp, it does both).  Handlers run on a whole warp,
 * except built-ins of up to 64 bytes (run_solo_task).  The
 * kernel ends after its lease (state->lease_ns) or at the stop flag and is
 * relaunched by the runtime; a launch picks up where the last one stopped.
 */
#ifndef CHIMAERA_DEVICE_ORCHESTRATOR_H
#define CHIMAERA_DEVICE_ORCHESTRATOR_H

#include <stdint.h>

#include "chimaera/gpu_port.h"
#include "chimaera/device_diag.h"
#include "chimaera/device_layout.h"
#include "chimaera/device_protocol.h"

#if defined(CHI_GPU_COMPILER) && defined(__cplusplus)

namespace chi_dev_detail {

/* Warp copies: each lane moves 16-byte pieces 32 apart, kWarpCopyBatch of
 * them per round (loads first, then stores: see thread_copy). */
constexpr uint32_t kWarpCopyBatch = 2u;
CHI_DEVICE void warp_copy(uint8_t *dst, const uint8_t *src, uint32_t n, uint32_t lane) {
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15u) == 0) {
    const uint32_t n16 = n & ~15u;
    constexpr uint32_t kStep = 16u * CHI_WARP_SIZE;
    for (uint32_t i0 = lane * 16u; i0 < n16; i0 += kStep * kWarpCopyBatch) {
      uint4 v[kWarpCopyBatch];
#pragma unroll
      for (uint32_t k = 0; k < kWarpCopyBatch; ++k)
        if (i0 + k * kStep < n16) v[k] = *reinterpret_cast<const uint4 *>(src + i0 + k * kStep);
#pragma unroll
      for (uint32_t k = 0; k < kWarpCopyBatch; ++k)
        if (i0 + k * kStep < n16) *reinterpret_cast<uint4 *>(dst + i0 + k * kStep) = v[k];
    }
    for (uint32_t i = n16 + lane; i < n; i += CHI_WARP_SIZE) dst[i] = src[i];
  } else {
    for (uint32_t i = lane; i < n; i += CHI_WARP_SIZE) dst[i] = src[i];
  }
}
/* Copy out of pinned host memory, after the caller's acquire fence: plain
 * 16-byte loads, kWarpCopyBatch per lane in flight (one PCIe round trip per
 * 1 KiB; strong loads of host memory would go one at a time per thread).
 * Two, not more: four made the orchestrator spill registers. */
CHI_DEVICE void warp_copy_from_host(uint8_t *dst, const uint8_t *src, uint32_t n, uint32_t lane) {
  const uint4 *s = reinterpret_cast<const uint4 *>(src);
  uint4 *d = reinterpret_cast<uint4 *>(dst);
  const uint32_t nv = (n + 15u) / 16u; /* both buffers are padded to 16 bytes */
  for (uint32_t i0 = lane; i0 < nv; i0 += CHI_WARP_SIZE * kWarpCopyBatch) {
    uint4 v[kWarpCopyBatch];
#pragma unroll
    for (uint32_t k = 0; k < kWarpCopyBatch; ++k)
      if (i0 + k * CHI_WARP_SIZE < nv) v[k] = s[i0 + k * CHI_WARP_SIZE];
#pragma unroll
    for (uint32_t k = 0; k < kWarpCopyBatch; ++k)
      if (i0 + k * CHI_WARP_SIZE < nv) d[i0 + k * CHI_WARP_SIZE] = v[k];
  }
}

/* The built-ins' checks, the same on every path (run_handler's and
 * run_builtin_solo's): echo needs room for its input; add two 8-byte
 * numbers and 8 bytes of room; checksum 8 bytes of room. */
CHI_DEVICE chi_status_t builtin_check(uint32_t m, uint32_t input_size, uint32_t capacity) {
  if (m == CHI_METHOD_ECHO) return input_size > capacity ? CHI_ERR_TOO_LARGE : CHI_OK;
  if (m == CHI_METHOD_ADD) return input_size != 16u || capacity < 8u ? CHI_ERR_INVALID : CHI_OK;
  return capacity < 8u ? CHI_ERR_TOO_LARGE : CHI_OK;
}
/* FNV-1a (chi.checksum), one byte at a time. */
constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
CHI_DEVICE uint64_t fnv_byte(uint64_t h, uint32_t byte) { return (h ^ (byte & 0xFFu)) * 0x100000001b3ull; }

CHI_DEVICE chi_status_t builtin_echo(chi_dev_request_t *r, uint32_t lane) {
  if (const chi_status_t s = builtin_check(CHI_METHOD_ECHO, r->input_size, r->output_capacity)) return s;
  warp_copy(static_cast<uint8_t *>(r->output), static_cast<const uint8_t *>(r->input), r->input_size, lane);
  r->output_size = r->input_size;
  return CHI_OK;
}
CHI_DEVICE chi_status_t builtin_add(chi_dev_request_t *r, uint32_t lane) {
  if (const chi_status_t s = builtin_check(CHI_METHOD_ADD, r->input_size, r->output_capacity)) return s;
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
  uint64_t h = kFnvOffset;
  uint32_t i = 0;
  if ((reinterpret_cast<uintptr_t>(p) & 3u) == 0) {
    for (; i + 4u <= n; i += 4u) {
      uint32_t w = *reinterpret_cast<const uint32_t *>(p + i);
#pragma unroll
      for (int b = 0; b < 4; ++b) h = fnv_byte(h, w >> (8 * b));
    }
  }
  for (; i < n; ++i) h = fnv_byte(h, p[i]);
  return h;
}
CHI_DEVICE chi_status_t builtin_checksum(chi_dev_request_t *r, uint32_t lane) {
  if (const chi_status_t s = builtin_check(CHI_METHOD_CHECKSUM, r->input_size, r->output_capacity)) return s;
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

/* GPU->GPU (docs/gpu.md, "GPU->GPU: bells and LL slots").  One thread,
 * after the reply words of the task of generation `gen` in `slot` are
 * written: sets the state word's DONE bit with a CAS that checks the
 * generation, so a slot whose waiter already took the reply (and freed it,
 * maybe for the next task) is left alone.  A future released meanwhile
 * (chi_dev_release) has nobody to take the result: the slot is freed here.
 * A state word one generation behind is the submitter's store of SUBMITTED
 * not seen yet: it is read again. */
CHI_DEVICE void finish_local(const chi_dev_layout *l, uint32_t slot, uint32_t gen) {
  uint32_t *state = l->d2d_state + slot;
  const uint32_t g8 = gen << 8;
  uint32_t cur = g8 | CHI_DEV_SLOT_SUBMITTED;
  for (uint32_t spins = 0;; ++spins) {
    if ((cur >> 8) != gen) {
      if (next_gen(cur >> 8) != gen || spins > 100000u) return; /* reused since */
      chi_port::nanosleep(64);
      cur = chi_port::ld_relaxed_dev(state);
      continue;
    }
    const uint32_t k = cur & 0xFFu;
    if ((k & CHI_DEV_SLOT_DONE_BIT) || k == CHI_DEV_SLOT_CLAIMED) return;
    if (k == CHI_DEV_SLOT_RELEASED) {
      if (chi_port::cas_relaxed_dev(state, &cur, g8 | CHI_DEV_SLOT_CLAIMED)) {
        bitmap_free(l->d2d_bitmap, slot); /* a release: the reply words before it */
        return;
      }
      continue;
    }
    if (chi_port::cas_relaxed_dev(state, &cur, cur | CHI_DEV_SLOT_DONE_BIT)) return;
  }
}

/* How long a worker waits for a request's input words once its request
 * words are there (they were stored before, so this is the memory system's
 * reordering; past it the task gets CHI_ERR_PROTOCOL instead of a hung
 * orchestrator). */
constexpr uint64_t kInputWaitNs = 100000000ull;

/* Runs the GPU->GPU task of generation gen in `slot` (warp-collective):
 * the input from its LL words into `in` (lane j brings word j as the scan
 * read it, `mine`, and reads it again if it did not carry gen yet), or past
 * 64 bytes in place after an acquire; the handler with its output in the
 * slot's plain output area.  An output of up to 64 bytes then goes into LL
 * words, the LL output words the slot's previous task left past it (up to
 * `oleft`, ll_left) are zeroed, and the reply words follow here (returns 0);
 * a larger one stays in place and the reply words wait for serve_bells' one
 * release fence per pass (returns {output size} << 32 | {status}). */
template <class D>
CHI_DEVICE_NOINLINE uint64_t run_local_task(const chi_dev_orch_state_t *st, uint32_t slot, uint32_t gen,
                                            uint32_t method, uint32_t input_size, uint64_t mine, uint32_t oleft,
                                            uint32_t lane, uint8_t *in) {
  const chi_dev_layout *l = layout(&st->ctx);
  chi_dev_request_t r;
  r.method = method;
  r.source = l->gpu;
  r.input = in;
  r.input_size = input_size;
  /* The handler writes straight into the slot's plain output area (this
   * task's until its reply is published): an output over 64 bytes is then
   * already where the waiter reads it; one of 64 or less is read back from
   * there into LL words. */
  uint8_t *const dst = d2d_out(l, slot);
  r.output = dst;
  r.output_capacity = l->max_payload;
  r.output_size = 0;
  r.ctx = &st->ctx;
  chi_status_t s = CHI_OK;
  if (input_size > l->max_payload) {
    s = CHI_ERR_PROTOCOL;
  } else if (input_size <= CHI_DEV_D2D_LL_BYTES) {
    bool late = false;
    if (lane < round_words(input_size)) {
      const uint64_t *iw = d2d_in_ll(l, slot) + lane;
      const uint64_t t0 = ll_flag(mine) == gen ? 0u : chi_port::timer_ns();
      while (ll_flag(mine) != gen) {
        if (chi_port::timer_ns() - t0 > kInputWaitNs) {
          late = true;
          break;
        }
        mine = chi_port::ll_load8_dev(iw);
      }
      reinterpret_cast<uint32_t *>(in)[lane] = ll_data(mine);
    }
    if (chi_port::ballot(late)) s = CHI_ERR_PROTOCOL;
  } else {
    chi_port::fence_acquire_dev(); /* the bytes came before the request words */
    r.input = d2d_in(l, slot);
  }
  chi_port::syncwarp();
  if (s == CHI_OK) s = run_handler<D>(st, &r, lane);
  const uint32_t osize = s == CHI_ERR_PROTOCOL ? 0u : r.output_size;
  const uint32_t onw = osize <= CHI_DEV_D2D_LL_BYTES ? static_cast<uint32_t>(round_words(osize)) : 0u;
  if (lane < onw)
    chi_port::ll_store8_dev(d2d_out_ll(l, slot) + lane, ll_pack(reinterpret_cast<const uint32_t *>(dst)[lane], gen));
  else if (lane < oleft)
    chi_port::ll_store8_dev(d2d_out_ll(l, slot) + lane, 0u);
  if (osize > CHI_DEV_D2D_LL_BYTES) {
    /* Plain bytes, in place: the reply words wait for the pass's one release
     * fence (serve_bells), so a pass of large tasks pays one fence, not one each. */
    return (static_cast<uint64_t>(osize) << 32) | static_cast<uint32_t>(s);
  }
  chi_port::syncwarp();
  if (lane == 0)
    chi_port::ll_store16_dev(d2d_words(l, slot) + CHI_DEV_D2D_REPLY_WORD, ll_pack(static_cast<uint32_t>(s), gen),
                         ll_pack(osize, gen));
  chi_port::syncwarp();
  return 0;
}

/* Built-in methods run by the task's own lane (GPU->GPU, input and output
 * of up to 64 bytes): a round's tasks of these then run side by side, not
 * one after another on the whole warp (on an H100 the 1056-warp echo row
 * went from 35 to 70 M tasks/s at 64 B; lab/journal/gpu-routes.md, "Solo
 * built-ins").  The same checks (builtin_check) and results as
 * builtin_echo, builtin_add and builtin_checksum; FNV-1a here works on the
 * input in registers, fnv1a64 on memory (both through fnv_byte). */
CHI_DEVICE bool solo_builtin(uint32_t m, uint32_t input_size) {
  return (m == CHI_METHOD_ECHO || m == CHI_METHOD_ADD || m == CHI_METHOD_CHECKSUM) &&
         input_size <= CHI_DEV_D2D_LL_BYTES;
}
/* One thread, in registers (in and out: the 16 words of up to 64 bytes,
 * indexed only by constants once unrolled). */
CHI_DEVICE chi_status_t run_builtin_solo(uint32_t m, const uint32_t (&in)[kD2dLlWords], uint32_t input_size,
                                         uint32_t (&out)[kD2dLlWords], uint32_t capacity, uint32_t *output_size) {
  *output_size = 0;
  if (const chi_status_t s = builtin_check(m, input_size, capacity)) return s;
  if (m == CHI_METHOD_ECHO) {
#pragma unroll
    for (uint32_t j = 0; j < kD2dLlWords; ++j) out[j] = in[j];
    *output_size = input_size;
    return CHI_OK;
  }
  if (m == CHI_METHOD_ADD) {
    const uint64_t a = in[0] | (static_cast<uint64_t>(in[1]) << 32);
    const uint64_t b = in[2] | (static_cast<uint64_t>(in[3]) << 32);
    out[0] = static_cast<uint32_t>(a + b);
    out[1] = static_cast<uint32_t>((a + b) >> 32);
    *output_size = 8;
    return CHI_OK;
  }
  /* CHI_METHOD_CHECKSUM: FNV-1a over the input's bytes, as fnv1a64. */
  uint64_t h = kFnvOffset;
#pragma unroll
  for (uint32_t j = 0; j < kD2dLlWords; ++j)
#pragma unroll
    for (uint32_t b = 0; b < 4u; ++b)
      if (4u * j + b < input_size) h = fnv_byte(h, in[j] >> (8u * b));
  out[0] = static_cast<uint32_t>(h);
  out[1] = static_cast<uint32_t>(h >> 32);
  *output_size = 8;
  return CHI_OK;
}
/* A word of a request's LL input that did not carry gen when the scan
 * read it, read again until it does (or kInputWaitNs: *late). */
CHI_DEVICE_NOINLINE uint64_t wait_ll_word(const uint64_t *w, uint32_t gen, bool *late) {
  const uint64_t t0 = chi_port::timer_ns();
  for (;;) {
    const uint64_t v = chi_port::ll_load8_dev(w);
    if (ll_flag(v) == gen) return v;
    if (chi_port::timer_ns() - t0 > kInputWaitNs) {
      *late = true;
      return v;
    }
  }
}
/* One thread: the GPU->GPU task of generation gen in `slot`, a solo
 * built-in (solo_builtin), whose input LL words the scan read into x: the
 * handler, then its output's LL words (zeros past them up to `oleft`, as
 * run_local_task) and the reply words, straight from the thread's own
 * registers (no look back at device memory). */
CHI_DEVICE void run_solo_task(const chi_dev_layout *l, uint32_t slot, uint32_t gen, uint32_t method,
                              uint32_t input_size, const uint64_t *x, uint32_t oleft) {
  uint32_t in[kD2dLlWords], out[kD2dLlWords];
  const uint32_t nw = static_cast<uint32_t>(round_words(input_size));
  bool late = false;
#pragma unroll
  for (uint32_t j = 0; j < kD2dLlWords; ++j) {
    out[j] = 0;
    uint64_t v = x[j];
    if (j < nw && ll_flag(v) != gen) v = wait_ll_word(d2d_in_ll(l, slot) + j, gen, &late);
    in[j] = j < nw ? ll_data(v) : 0u;
  }
  const uint32_t capacity = l->max_payload < CHI_DEV_D2D_LL_BYTES ? static_cast<uint32_t>(l->max_payload)
                                                                    : CHI_DEV_D2D_LL_BYTES;
  uint32_t osize = 0;
  chi_status_t s = late || input_size > l->max_payload
                       ? CHI_ERR_PROTOCOL
                       : run_builtin_solo(method, in, input_size, out, capacity, &osize);
  if (s == CHI_ERR_PROTOCOL || osize > capacity) {
    if (s != CHI_ERR_PROTOCOL) s = CHI_ERR_INTERNAL;
    osize = 0;
  }
  const uint32_t onw = static_cast<uint32_t>(round_words(osize));
  uint64_t *ow = d2d_out_ll(l, slot);
#pragma unroll
  for (uint32_t j = 0; j < kD2dLlWords; j += 2u)
    if (j < onw) chi_port::ll_store16_dev(ow + j, ll_pack(out[j], gen), ll_pack(out[j + 1u], gen));
    else if (j < oleft) chi_port::ll_store16_dev(ow + j, 0u, 0u);
  chi_port::ll_store16_dev(d2d_words(l, slot) + CHI_DEV_D2D_REPLY_WORD, ll_pack(static_cast<uint32_t>(s), gen),
                           ll_pack(osize, gen));
}

/* The k-th (from 0) set bit of m, which has more than k. */
CHI_DEVICE uint32_t nth_set_bit(uint32_t m, uint32_t k) {
  for (; k; --k) m &= m - 1u;
  return static_cast<uint32_t>(chi_port::ffs32(m) - 1);
}

/* serve_bells' round when some lane's word holds more than one waiting task
 * (warp-collective): the warp's waiting tasks, in lane order and bit order
 * within a word, are dealt out one per lane, so that a worker serving a few
 * busy bell words runs a warp's worth of tasks a round, not one per word.
 * Lane j takes task j: its word (*tw), bit (*bit) and the lane whose word it
 * is (*owner).  Each lane's todo loses the bits dealt out.  True when this
 * lane took a task. */
CHI_DEVICE bool deal_tasks(uint32_t lane, uint32_t w, uint32_t *todo, uint32_t *tw, uint32_t *bit,
                           uint32_t *owner) {
  const uint32_t cnt = chi_port::popc(*todo);
  uint32_t incl = cnt; /* tasks of lanes 0..lane */
  for (uint32_t d = 1; d < CHI_WARP_SIZE; d <<= 1) {
    const uint32_t t = chi_port::shfl(incl, static_cast<int>(lane >= d ? lane - d : lane));
    if (lane >= d) incl += t;
  }
  const uint32_t excl = incl - cnt;
  const uint32_t total = chi_port::shfl(incl, CHI_WARP_SIZE - 1);
  /* Task `lane` belongs to the first lane whose incl passes it. */
  uint32_t pos = 0;
  for (uint32_t step = CHI_WARP_SIZE / 2u; step >= 1u; step >>= 1)
    if (chi_port::shfl(incl, static_cast<int>(pos + step - 1u)) <= lane) pos += step;
  const bool has = lane < total;
  const uint32_t from = has ? pos : lane;
  const uint32_t m = chi_port::shfl(*todo, static_cast<int>(from));
  const uint32_t k = lane - chi_port::shfl(excl, static_cast<int>(from));
  const uint32_t fw = chi_port::shfl(w, static_cast<int>(from));
  for (uint32_t give = excl >= CHI_WARP_SIZE ? 0u : (cnt < CHI_WARP_SIZE - excl ? cnt : CHI_WARP_SIZE - excl); give;
       --give)
    *todo &= *todo - 1u;
  if (has) {
    *tw = fw;
    *bit = nth_set_bit(m, k);
    *owner = from;
  }
  return has;
}

/* Serves the GPU->GPU bells of words first, first + stride, ... (warp-
 * collective; lane i looks at every 32nd of them from word first + i x
 * stride): a bit that differs from the served copy (d2d_seen) is a new
 * request.  Each lane takes one such slot at a time (its own word's, or one
 * dealt out over the warp while a word holds several: deal_tasks) and reads
 * its request words, its reply words and its input's LL words, all lanes' loads in one
 * round trip; a request is there once both its words carry one generation
 * that is not the reply's (the slot's last task).  Solo built-ins
 * (solo_builtin) run on their own lanes, side by side; the warp runs the
 * other tasks one after another, then marks them all DONE (finish_local, one CAS per
 * lane, in flight at once) and updates its copy.  A bit whose request is
 * not there yet stays for the next call.  Relaxed loads throughout: the LL
 * flags tell what is there (an input word loaded before its submitter's
 * store landed carries an older flag, never gen: ll_left), and an input in
 * plain bytes is read after an acquire fence.  Returns the tasks run;
 * *left: bits left so (may be NULL).
 * hot (may be NULL; this lane's, kept by the caller across calls): 1 + the
 * slot of the lane's first bell word whose task it ran last alone.  A
 * thread that submits again mostly gets the same slot (its search starts at
 * the same bit), so the lane loads that slot's request, reply and input
 * words beside its bell and served words: when the bell rings for it, the
 * request is already in registers, one dependent trip fewer from the bell
 * to the handler.  Loaded in the same round trip as the bell they are what
 * the round's own loads would be (the LL flags say what is there), so a
 * request not there yet waits for the next call, as without them.
 * CHI_DEV_ORCH_PROBE(what, slot, gen, pass_start_ns, preloaded), when a
 * measurement defines it before including this header (gpu_breakdown), is
 * called with what 0 when a lane found a ready request (pass_start_ns: the
 * timer at the start of the pass that found it; preloaded: found in the hot
 * slot's words), and 1 once its reply words are stored, before the DONE
 * mark.  Not defined: no code. */
template <class D>
CHI_DEVICE_NOINLINE uint32_t serve_bells(const chi_dev_orch_state_t *st, uint32_t first, uint32_t stride,
                                         uint32_t lane, uint8_t *in, uint32_t *left, uint32_t *hot = nullptr) {
  const chi_dev_layout *l = layout(&st->ctx);
  const uint32_t nwords = l->slots >> 5;
  uint32_t ran = 0, waiting = 0;
  for (uint32_t w0 = first; w0 < nwords; w0 += stride * CHI_WARP_SIZE) {
#ifdef CHI_DEV_ORCH_PROBE
    const uint64_t probe_pass = chi_port::timer_ns(); /* before this pass's loads */
#endif
    const uint32_t w = w0 + lane * stride;
    /* The hot slot's words (w0 == first only: hot names a slot of that word). */
    const uint32_t pre = hot != nullptr && w0 == first && *hot != 0u && ((*hot - 1u) >> 5) == w ? *hot : 0u;
    uint64_t q0 = 0, q1 = 0, p0 = 0, p1 = 0, x[kD2dLlWords];
#pragma unroll
    for (uint32_t j = 0; j < kD2dLlWords; ++j) x[j] = 0;
    if (pre) {
      const uint64_t *hw = d2d_words(l, pre - 1u);
      const uint64_t *iw = d2d_in_ll(l, pre - 1u);
      chi_port::ll_load16_dev(hw + CHI_DEV_D2D_REQ_WORD, &q0, &q1);
      chi_port::ll_load16_dev(hw + CHI_DEV_D2D_REPLY_WORD, &p0, &p1);
#pragma unroll
      for (uint32_t j = 0; j < kD2dLlWords; j += 2u) chi_port::ll_load16_dev(iw + j, &x[j], &x[j + 1u]);
    }
    uint32_t seen = 0, todo = 0;
    if (w < nwords) {
      seen = chi_port::ld_relaxed_dev(l->d2d_seen + w);
      todo = chi_port::ld_relaxed_dev(l->d2d_bell + w) ^ seen;
    }
    /* A request in the hot slot runs now, whether or not its bell flip has
     * landed: every task flips its bell bit once and every run flips the
     * served copy once, so a flip still on its way later shows the bit as
     * waiting, its request words as served (not ready), until it lands. */
    if (pre) {
      const uint32_t g = ll_flag(q0);
      if (g != 0u && ll_flag(q1) == g && ll_flag(p0) != g && ll_flag(p1) != g) todo |= 1u << ((pre - 1u) & 31u);
    }
    if (!chi_port::ballot(todo != 0u)) continue;
    const uint32_t seen0 = seen;
    bool preloaded = pre != 0u; /* q0..x hold slot pre - 1's words (first round only) */
    for (;;) {
      if (!chi_port::ballot(todo != 0u)) break;
      /* The round's tasks: each lane its own word's next one while no word
       * holds more than one; else dealt out over the warp (deal_tasks).  One
       * per word left most lanes idle once 1056 warps kept 90% of the slots
       * busy (H200: 72 M tasks/s with 8192 slots, 107 with 16384 and the
       * same tasks in flight: lab/journal/gpu-routes.md). */
      const bool dealt = chi_port::ballot(chi_port::popc(todo) > 1u) != 0;
      uint32_t tw = w, bit = 0u, owner = lane;
      bool has;
      if (!dealt) {
        has = todo != 0u;
        bit = has ? static_cast<uint32_t>(chi_port::ffs32(todo) - 1) : 0u;
        todo &= has ? todo - 1u : 0u; /* looked at in this round */
      } else {
        has = deal_tasks(lane, w, &todo, &tw, &bit, &owner);
      }
      const uint32_t slot = tw * 32u + bit;
      /* The hot slot's words, loaded beside the bell, for its own round. */
      const bool use_pre = preloaded && has && !dealt && slot == pre - 1u;
      preloaded = false;
      if (has && !use_pre) {
        const uint64_t *hw = d2d_words(l, slot);
        const uint64_t *iw = d2d_in_ll(l, slot);
        chi_port::ll_load16_dev(hw + CHI_DEV_D2D_REQ_WORD, &q0, &q1);
        chi_port::ll_load16_dev(hw + CHI_DEV_D2D_REPLY_WORD, &p0, &p1);
#pragma unroll
        for (uint32_t j = 0; j < kD2dLlWords; j += 2u) chi_port::ll_load16_dev(iw + j, &x[j], &x[j + 1u]);
      }
      const uint32_t gen = ll_flag(q0);
      const bool ready = has && gen != 0u && ll_flag(q1) == gen && ll_flag(p0) != gen && ll_flag(p1) != gen;
      /* How far the slot's last task wrote its LL output (reply word 3). */
      const uint32_t oleft = ll_left(p1, prev_gen(gen));
      if (has && !ready) ++waiting;
      /* Solo built-ins run on their own lanes, a lone one too: from the
       * scan's registers, with no trip through the scratch input and the
       * slot's plain output that the warp path makes (H200, 2026-11-27:
       * the lone echo's p50 0.26-0.28 us lower at 8 and 64 bytes). */
      const bool solo = ready && solo_builtin(ll_data(q0), ll_data(q1));
#ifdef CHI_DEV_ORCH_PROBE
      if (ready) CHI_DEV_ORCH_PROBE(0u, slot, gen, probe_pass, use_pre);
#endif
      if (solo) run_solo_task(l, slot, gen, ll_data(q0), ll_data(q1), x, oleft);
      const chi_port::lanemask_t go = chi_port::ballot(ready && !solo);
      uint64_t held = 0; /* lane k: task k's {output size, status} when its reply words wait */
      for (chi_port::lanemask_t m = go; m; m &= m - 1u) {
        const int k = chi_port::ffs_mask(m) - 1;
        /* Lane j takes word j of lane k's input. */
        uint64_t mine = 0;
#pragma unroll
        for (uint32_t j = 0; j < kD2dLlWords; ++j) {
          const uint64_t v = chi_port::shfl(x[j], k);
          if (lane == j) mine = v;
        }
        const uint64_t r = run_local_task<D>(st, chi_port::shfl(slot, k), chi_port::shfl(gen, k),
                                             chi_port::shfl(ll_data(q0), k), chi_port::shfl(ll_data(q1), k), mine,
                                             chi_port::shfl(oleft, k), lane, in);
        if (static_cast<int>(lane) == k) held = r;
      }
      if (chi_port::ballot(held != 0u)) {
        /* Every lane's plain output bytes before any of these reply words. */
        chi_port::fence_release_dev();
        chi_port::syncwarp();
        if (held)
          chi_port::ll_store16_dev(d2d_words(l, slot) + CHI_DEV_D2D_REPLY_WORD,
                                   ll_pack(static_cast<uint32_t>(held), gen), ll_pack(static_cast<uint32_t>(held >> 32), gen));
      }
#ifdef CHI_DEV_ORCH_PROBE
      if (ready) CHI_DEV_ORCH_PROBE(1u, slot, gen, 0u, false);
#endif
      if (ready) finish_local(l, slot, gen);
      if (hot != nullptr && ready && !dealt && w0 == first) *hot = slot + 1u;
      /* The word's owner marks its tasks seen. */
      const uint32_t mark = ready ? 1u << bit : 0u;
      if (!dealt) {
        seen ^= mark;
      } else if (chi_port::ballot(mark != 0u)) {
        for (uint32_t d = 0; d < CHI_WARP_SIZE; ++d) {
          const uint32_t v = chi_port::shfl(mark, static_cast<int>(d));
          if (chi_port::shfl(owner, static_cast<int>(d)) == lane) seen ^= v;
        }
      }
      ran += chi_port::popc(chi_port::ballot(ready));
    }
    if (seen != seen0) chi_port::st_relaxed_dev(l->d2d_seen + w, seen);
  }
  for (int d = 1; d < CHI_WARP_SIZE; d <<= 1)
    waiting += chi_port::shfl(waiting, static_cast<int>(lane ^ static_cast<uint32_t>(d)));
  if (left) *left = waiting;
  return ran;
}

/* Frees the GPU->CPU slots whose futures were released before their reply
 * came and whose reply has come since (warp-collective; the state words in
 * batches of 4 loads per lane). */
CHI_DEVICE_NOINLINE void sweep_released(const chi_dev_layout *l, uint32_t lane) {
  for (uint32_t base = lane * 4u; base < l->slots; base += 4u * CHI_WARP_SIZE) {
    uint32_t v[4];
#pragma unroll
    for (uint32_t k = 0; k < 4u; ++k) v[k] = chi_port::ld_relaxed_dev(l->d2h_state + base + k);
#pragma unroll
    for (uint32_t k = 0; k < 4u; ++k)
      if ((v[k] & 0xFFu) == CHI_DEV_SLOT_RELEASED && reply_arrived(l, base + k, v[k] >> 8))
        reclaim_released(l, base + k, v[k] >> 8);
  }
}
/* The sweeping warp looks for released GPU->CPU slots at most this often. */
constexpr uint64_t kSweepEveryNs = 5000;

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
/* With no successor queued past the lease, the keeper stays while the
 * device routes change, and steps aside (see orchestrator_main) once they
 * were quiet this long with no slot in use ... */
constexpr uint64_t kKeeperQuietNs = 20000;
/* ... or this long with slots in use (futures held, never waited for, must
 * not keep it forever). */
constexpr uint64_t kKeeperHoldNs = 20000000;
/* An idle keeper gives a late successor this long past the lease before it
 * steps aside.  On an H200 (2026-11-27) a third of the launches of a 4 KiB
 * GPU->GPU latency run (routes idle between tasks while the kernel checked
 * each echo) stepped aside at the lease's end, the successor not yet queued,
 * and one relaunch in some thousands took over two leases, so that a submit
 * answered CHI_ERR_AGAIN.  A device-wide call in another thread waits this
 * much longer at most. */
constexpr uint64_t kKeeperLateNs = 200000;
/* The pollers' bell (docs/gpu.md, "Idle GPU->CPU pollers"): the keeper looks
 * at it this often while it finds no task, and at least this often while it
 * does (a look is one read of pinned host memory, ~1.3 us on PCIe). */
constexpr uint64_t kBellIdleSampleNs = 2000;
constexpr uint64_t kBellBusySampleNs = 20000;

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
    const uint32_t c = chi_port::ld_relaxed_dev(l->d2d_bell + i);
    any |= a | b;
    h += (static_cast<uint64_t>(a) * 0x9E3779B97F4A7C15ull) ^
         ((static_cast<uint64_t>(b) + i) * 0xBF58476D1CE4E5B9ull) ^ (static_cast<uint64_t>(c) << 32) ^ i;
  }
  for (int d = 1; d < CHI_WARP_SIZE; d <<= 1) {
    h += chi_port::shfl(h, static_cast<int>(lane ^ static_cast<uint32_t>(d)));
    any |= chi_port::shfl(any, static_cast<int>(lane ^ static_cast<uint32_t>(d)));
  }
  *in_use = any != 0;
  const uint64_t tail = lane == 0 ? chi_port::ld_relaxed_dev(l->d2h_tail) : 0u;
  return h ^ chi_port::shfl(tail, 0);
}

/* The GPU->GPU workers: every warp that does not poll the CPU->GPU ring (the
 * one warp of a one-warp orchestrator does both).  Worker i serves bell
 * words i, i + workers, ...  (Measured on an H200, 2026-11-27: runs of
 * consecutive words per worker, coalesced, made the 64-byte GPU->GPU p50
 * 0.5 us slower and the 1056-warp row 15% slower; which worker, and so
 * which SM, serves a slot matters more than how the words are read.) */
CHI_DEVICE uint32_t d2d_workers(const chi_dev_orch_state_t *st) {
  return st->nwarps > st->h2d_pollers ? st->nwarps - st->h2d_pollers : 1u;
}
CHI_DEVICE uint32_t d2d_first_worker(const chi_dev_orch_state_t *st) {
  return st->nwarps > st->h2d_pollers ? st->h2d_pollers : 0u;
}

/* Whether any of the bell words first, first + stride, ... has a bit its
 * worker has not served (warp-collective; relaxed loads, a hint). */
CHI_DEVICE bool bells_pending(const chi_dev_layout *l, uint32_t first, uint32_t stride, uint32_t lane) {
  const uint32_t nwords = l->slots >> 5;
  uint32_t any = 0;
  for (uint32_t w = first + lane * stride; w < nwords; w += stride * CHI_WARP_SIZE)
    any |= chi_port::ld_relaxed_dev(l->d2d_bell + w) ^ chi_port::ld_relaxed_dev(l->d2d_seen + w);
  return chi_port::ballot(any != 0u) != 0u;
}

/* Leaving a launch (every warp, warp-collective, at the stop flag or the
 * lease's end).  A handler may be waiting for a GPU->GPU task it submitted,
 * which another worker's bell words hold (d2d_own_bell), and the next launch
 * cannot start before that handler's warp ends this one.  So each warp
 * counts itself out (control[10..11], zeroed by the runtime before a launch
 * on an idle stream: it grows by nwarps per launch), and a GPU->GPU worker
 * stays until every warp of the launch is out.  While it stays it serves its
 * bells, counting itself back in around each pass that has work (a CAS that
 * fails once all are out: the work then waits for the next launch, or for
 * close_and_drain), so a handler it runs there is covered too.  Once all are
 * out the count stays so: no handler of this launch runs any more.  A
 * CPU->GPU poller leaves at once (it serves no bell).  Without this, 4-5 of
 * 512 handler waits timed out after 100 ms on an H200 (test_handler_waits_gpu),
 * and 1 with a barrier whose workers ran handlers while counted out. */
template <class D>
CHI_DEVICE_NOINLINE void exit_barrier(const chi_dev_orch_state_t *st, uint32_t lane, bool worker, uint32_t first,
                                      uint32_t stride, uint8_t *in) {
  const chi_dev_layout *l = layout(&st->ctx);
  uint64_t *const exits = reinterpret_cast<uint64_t *>(st->control + 10);
  /* Release: this warp's replies before its count. */
  const uint64_t a = lane == 0 ? chi_port::fetch_add_release_dev(exits, static_cast<uint64_t>(1)) : 0u;
  if (!worker) return;
  const uint64_t all = (chi_port::shfl(a, 0) / st->nwarps + 1u) * st->nwarps;
  for (;;) {
    uint64_t n = lane == 0 ? chi_port::ld_acquire_dev(exits) : 0u;
    n = chi_port::shfl(n, 0);
    if (n >= all) break;
    if (!bells_pending(l, first, stride, lane)) {
      chi_port::nanosleep(128);
      continue;
    }
    uint32_t in_again = 0;
    if (lane == 0) {
      while (n < all && !chi_port::cas_acq_rel_dev(exits, &n, n - 1u)) {
      }
      in_again = n < all ? 1u : 0u;
    }
    if (!chi_port::shfl(in_again, 0)) break;
    serve_bells<D>(st, first, stride, lane, in, nullptr);
    if (lane == 0) chi_port::fetch_add_release_dev(exits, static_cast<uint64_t>(1));
  }
}

/* Stepping aside (the keeper, warp-collective): closes the GPU->GPU gate,
 * waits for the submitters already inside it to ring their bells and for
 * the other workers to end this launch (warp_done), then serves every
 * bell.  After it no task waits and none can be submitted until the next
 * launch opens the gate. */
template <class D>
CHI_DEVICE_NOINLINE void close_and_drain(const chi_dev_orch_state_t *st, uint32_t lane, uint32_t gw,
                                         uint64_t epoch, uint8_t *in) {
  const chi_dev_layout *l = layout(&st->ctx);
  if (lane == 0) {
    chi_port::fetch_or_acq_rel_dev(l->gate, kGateAway);
    /* Submitters inside ring their bells and leave in a few hundred ns. */
    while ((chi_port::ld_acquire_dev(l->gate) & ~kGateAway) != 0) chi_port::nanosleep(100);
  }
  for (uint32_t w = d2d_first_worker(st) + lane; w < st->nwarps; w += CHI_WARP_SIZE)
    if (w != gw)
      while (chi_port::ld_acquire_dev(st->warp_done + w) <= epoch) chi_port::nanosleep(128);
  chi_port::syncwarp();
  for (;;) {
    uint32_t left = 0;
    const uint32_t ran = serve_bells<D>(st, 0u, 1u, lane, in, &left);
    if (ran == 0u && left == 0u) break;
    if (ran == 0u) chi_port::nanosleep(128);
  }
}

/* The keeper's diag words (one thread; pinned memory, read by tools):
 * a step-aside, counted where chimaera-bench and tests see it (one pinned
 * read per step-aside, about one per lease at most) ... */
CHI_DEVICE_NOINLINE void diag_step_aside(const chi_dev_layout *l, bool bell, bool in_use, uint64_t quiet_since) {
  const uint64_t t = chi_port::timer_ns();
  const uint64_t quiet_us = (t - quiet_since) / 1000u;
  chi_port::ll_store8(l->diag + CHI_DIAG_ASIDE_WHY, (bell ? 1u : 0u) | (in_use ? 2u : 0u) | (quiet_us << 32));
  chi_port::ll_store8(l->diag + CHI_DIAG_ASIDE_AT, t);
  uint64_t by_bell = 0, with_slots = 0;
  chi_port::ll_load16(l->diag + CHI_DIAG_ASIDE_BELL, &by_bell, &with_slots);
  const uint64_t n = chi_port::ll_load8(l->diag + CHI_DIAG_ASIDE_N);
  chi_port::ll_store16(l->diag + CHI_DIAG_ASIDE_BELL, by_bell + (bell ? 1u : 0u), with_slots + (in_use ? 1u : 0u));
  chi_port::ll_store8(l->diag + CHI_DIAG_ASIDE_N, n + 1u);
}
/* ... and the end of a launch: when, why, and its time added up. */
CHI_DEVICE_NOINLINE void diag_launch_end(const chi_dev_layout *l, uint64_t t_start, uint64_t epoch, uint32_t why) {
  const uint64_t t_end = chi_port::timer_ns();
  chi_port::ll_store8(l->diag + CHI_DIAG_END_AT, t_end);
  uint64_t sum = 0, count = 0;
  chi_port::ll_load16(l->diag + CHI_DIAG_LAUNCH_NS, &sum, &count);
  chi_port::ll_store16(l->diag + CHI_DIAG_LAUNCH_NS, sum + (t_end - t_start), count + 1u);
  chi_port::ll_store8(l->diag + CHI_DIAG_END, (epoch << 8) | why);
}

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
  uint32_t hot = 0; /* serve_bells: this lane's hot slot */
  /* GPU->GPU: this worker's share of the bell words. */
  const uint32_t bell_first = gw - d2d_first_worker(st), bell_stride = d2d_workers(st);
  /* The lease (docs/gpu.md, "Coexisting with other CUDA code").  The kernel
   * ends after lease_ns, so that device-wide synchronization by other code
   * (cudaFree, cudaDeviceSynchronize, module loading) waits about one lease.
   * All in-flight state is in device memory (the polling warps' next
   * tickets, the GPU->GPU bells served, the slots), so the next launch goes on from
   * there.  The runtime's lease thread queues that launch on the same stream
   * shortly before the lease ends, so it starts as soon as this one ends.
   * The last warp, the keeper, decides when the launch ends, once past the
   * lease.  When the successor is queued: at once.  When it is not, the
   * lease thread is held back (a device-wide call in another thread holds
   * the driver's launch lock until the device is idle, and may even start
   * this very launch before its launch call returns) or late: the keeper
   * stays while the device routes change or hold slots (kernels that use
   * them run, and a device-wide call waits for those anyway), then steps
   * aside (kKeeperQuietNs, kKeeperHoldNs): it closes the GPU->GPU gate (away bit), waits for the
   * submitters inside it and the other workers, runs every task whose bell
   * rang, and ends.  Submitters that find the gate closed submit nothing
   * (they wait a bounded time for the next launch, or answer
   * CHI_ERR_AGAIN), so no task is ever left waiting with no orchestrator to come: a kernel that waits for a
   * GPU->GPU task cannot hold a device-wide call forever.  The next launch
   * opens the gate.  The keeper also ends a launch early, in the same way,
   * when it hears the pollers' bell (kBellIdleSampleNs).  The keeper's
   * decision reaches the other warps through control[6..7], compared with
   * the launch's epoch (= launch index, from the arrival counter). */
  const uint64_t lease_ns = st->lease_ns;
  const uint64_t t_start = chi_port::shfl(chi_port::timer_ns(), 0); /* warp-uniform decisions */
  uint64_t lease_end = lease_ns ? t_start + lease_ns : ~0ull;
  uint64_t *const arrivals = reinterpret_cast<uint64_t *>(st->control + 4);
  uint64_t *const lease_over = reinterpret_cast<uint64_t *>(st->control + 6);
  uint64_t epoch = 0;
  const bool keeper = lease_ns != 0 && gw == st->nwarps - 1u;
  uint64_t keep_sig = 0, keep_since = t_start, keep_sampled = 0;
  bool keep_in_use = false, step_aside = false, rang = false;
  uint64_t bell_sampled = 0;
  /* The keeper's last look at the bell and at d2h_tail, loaded at one sample
   * and used at the next: the keeper is a GPU->GPU worker too, and a
   * pinned-memory read it waited for (~1.3 us on PCIe) would hold up the
   * tasks of its bell words. */
  uint64_t armed_seen = 0, tail_seen = 0;
  /* The last warp also frees released GPU->CPU slots (sweep_released). */
  const bool sweeper = gw == st->nwarps - 1u;
  uint64_t swept_at = 0;
  if (lease_ns) {
    const uint64_t a = lane == 0 ? chi_port::fetch_add_dev(arrivals, static_cast<uint64_t>(1)) : 0u;
    epoch = chi_port::shfl(a, 0) / st->nwarps; /* launches never overlap: exact */
    /* A launch queued behind one that pause stopped: nothing to do. */
    const uint32_t stop0 = lane == 0 ? chi_port::ld_relaxed_dev(st->control) : 0u;
    if (chi_port::shfl(stop0, 0)) {
      exit_barrier<D>(st, lane, false, 0u, 1u, in); /* counted out: the others may be serving */
      return;
    }
    bool in_use;
    if (keeper) {
      keep_sig = route_signature(l, lane, &in_use);
      /* This launch's lease: longer while the routes are idle (the runtime's
       * gpu.idle_lease_us); anything implausible keeps lease_ns. */
      uint64_t mine = lane == 0 ? chi_port::ll_load8(st->host_lease + 3) : 0u;
      mine = chi_port::shfl(mine, 0);
      if (mine >= lease_ns && mine <= 1000000000ull) lease_end = t_start + mine;
    }
    if (gw == 0 && lane == 0) {
      /* Back: the GPU->GPU gate opens (if the last launch stepped aside). */
      chi_port::fetch_and_release_dev(l->gate, ~kGateAway);
      if (l->diag) {
        /* The time first: the lease thread takes it as this launch's once it
         * reads the epoch (GpuDevice::started_at). */
        chi_port::ll_store8(l->diag + CHI_DIAG_START_AT, t_start);
        chi_port::fence_sys();
        chi_port::ll_store8(l->diag + CHI_DIAG_START_EPOCH, epoch);
      }
    }
  }
  for (;;) {
    /* The stop flag's load overlaps this round's polls; it is looked at after them. */
    const uint32_t stop = lane == 0 ? chi_port::ld_relaxed_dev(st->control) : 0u;
    const uint32_t released = sweeper && lane == 1 ? chi_port::ld_relaxed_dev(l->d2h_released) : 0u;
    const uint64_t now0 = lane == 0 && keeper ? chi_port::timer_ns() : 0u;
    /* The keeper's decision, read every round (the bell may end a launch
     * before its lease); the load overlaps the polls. */
    const uint64_t over = lease_ns && !keeper && lane == 0 ? chi_port::ld_relaxed_dev(lease_over) : 0u;
    uint32_t ran = 0;
    if (poller) {
      ran = poll_host<D>(st, &next, batch, lane, in, out);
      batch = ran ? 4u : 1u;
    }
    if (worker) ran += serve_bells<D>(st, bell_first, bell_stride, lane, in, nullptr, &hot);
    if (sweeper && chi_port::shfl(released, 1) != 0u) {
      const uint64_t t = lane == 0 ? chi_port::timer_ns() : 0u;
      const uint64_t now = chi_port::shfl(t, 0);
      if (now - swept_at >= kSweepEveryNs) {
        swept_at = now;
        sweep_released(l, lane);
      }
    }
    uint32_t expired = over > epoch ? 1u : 0u;
    if (keeper) {
      const uint64_t now = chi_port::shfl(now0, 0);
      /* The bell: parked host pollers sleep until a launch ends, so once a
       * GPU->CPU ticket at or past the one they armed is taken, this launch
       * ends now (stepping aside unless its successor is queued); the lease
       * thread relaunches at once. */
      if (now - bell_sampled >= (ran ? kBellBusySampleNs : kBellIdleSampleNs) && l->diag) {
        bell_sampled = now;
        uint64_t armed = armed_seen, tail = tail_seen, queued = 0, trying = 0;
        if (lane == 0) {
          if (armed != 0u && tail >= armed) chi_port::ll_load16(st->host_lease, &queued, &trying);
          armed_seen = chi_port::ll_load8(st->host_lease + 2);
          tail_seen = chi_port::ld_relaxed_dev(l->d2h_tail);
        }
        const bool ring = chi_port::shfl(armed != 0u && tail >= armed ? 1u : 0u, 0) != 0u;
        if (ring) {
          queued = chi_port::shfl(queued, 0);
          step_aside = queued < epoch + 2u;
          rang = true;
          if (lane == 0) {
            chi_port::ll_store8(l->diag + CHI_DIAG_BELL_AT, now);
            chi_port::ll_store8(l->diag + CHI_DIAG_BELL, armed);
            chi_port::st_relaxed_dev(lease_over, epoch + 1u);
          }
          expired = 1u;
        }
      }
      if (!expired && now >= lease_end && now - keep_sampled >= kKeeperSampleNs) {
        keep_sampled = now;
        uint64_t queued = 0, trying = 0;
        if (lane == 0) chi_port::ll_load16(st->host_lease, &queued, &trying);
        queued = chi_port::shfl(queued, 0);
        trying = chi_port::shfl(trying, 0);
        bool leave = false;
        if (queued >= epoch + 2u) {
          leave = true; /* the successor is queued: it starts when this launch ends */
        } else {
          bool in_use;
          const uint64_t sig = route_signature(l, lane, &in_use);
          keep_in_use = in_use;
          if (sig != keep_sig) {
            keep_sig = sig;
            keep_since = now;
          }
          const uint64_t quiet = now - keep_since;
          leave = step_aside =
              in_use ? quiet >= kKeeperHoldNs : quiet >= kKeeperQuietNs && now - lease_end >= kKeeperLateNs;
        }
        if (lane == 0 && l->diag) {
          const uint32_t branch = queued >= epoch + 2u                        ? CHI_DIAG_BRANCH_QUEUED
                                  : trying >= epoch + 1u && queued < trying ? CHI_DIAG_BRANCH_TRYING
                                                                            : CHI_DIAG_BRANCH_LATE;
          chi_port::ll_store16(l->diag + CHI_DIAG_KEEP_AT, now, epoch);
          chi_port::ll_store16(l->diag + CHI_DIAG_KEEP_HOST, (queued << 32) | (trying & 0xFFFFFFFFull),
                               now - keep_since);
          chi_port::ll_store8(l->diag + CHI_DIAG_KEEP_STATE,
                              (keep_in_use ? 1u : 0u) | (branch << 8) | ((leave ? 1u : 0u) << 16));
        }
        if (leave) {
          if (lane == 0) chi_port::st_relaxed_dev(lease_over, epoch + 1u);
          expired = 1u;
        }
      }
    }
    if (chi_port::shfl(stop | expired, 0)) {
      exit_barrier<D>(st, lane, worker, bell_first, bell_stride, in);
      if (step_aside && !stop && lane == 0 && l->diag) diag_step_aside(l, rang, keep_in_use, keep_since);
      if (step_aside && !stop) close_and_drain<D>(st, lane, gw, epoch, in);
      if (keeper && lane == 0 && l->diag)
        diag_launch_end(l, t_start, epoch, stop ? CHI_DIAG_END_STOP : rang ? CHI_DIAG_END_BELL : CHI_DIAG_END_LEASE);
      break;
    }
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
  /* This warp is done with the launch (a keeper stepping aside waits for it;
   * the release orders its served bells and replies before). */
  if (lane == 0 && lease_ns) chi_port::st_release_dev(st->warp_done + gw, epoch + 1u);
}

}  // namespace chi_dev_detail

/* CHI_DEFINE_ORCHESTRATOR(name, dispatch_fn, names_array, count): a
 * dispatch struct whose call() forwards to dispatch_fn, a __global__ kernel
 * that runs orchestrator_main with it, a host launcher next to that kernel (so
 * the CUDA runtime instance that registered the kernel launches it), and
 * chi_gpu_orchestrator_t name(void), which hands the launcher and the method
 * names to chi_gpu_set_orchestrator. */
#define CHI_DEFINE_ORCHESTRATOR(name, dispatch_fn, names_array, count)                           \
  struct name##_chi_dispatch {                                                                  \
    static __device__ __forceinline__ chi_status_t call(uint32_t index, chi_dev_request_t *req) { \
      return dispatch_fn(index, req);                                                           \
    }                                                                                           \
  };                                                                                            \
  __global__ void __launch_bounds__(CHI_DEV_ORCH_MAX_WARPS_PER_BLOCK * CHI_WARP_SIZE, 1)            \
      name##_chi_kernel(const chi_dev_orch_state_t *state) {                                    \
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

#endif /* CHIMAERA_DEVICE_ORCHESTRATOR_H */

/*
 * gpu_breakdown: where the time of one GPU round trip goes, stage by stage,
 * for GPU->CPU, GPU->GPU and CPU->GPU, at several payload sizes
 * (lab/journal/gpu-routes.md, "Where the time goes").  A measurement, not a test:
 * it asserts no time and fails only if a task fails.  Exit 77 without a GPU.
 *
 *   gpu_breakdown [round_trips [payload ...]]     (default 20000 8 64 1024 4096)
 *
 * Each route runs one task at a time from one thread.  The submitter stamps
 * %globaltimer (device code) or CLOCK_REALTIME (host code) between the
 * steps of the real submit path (the chi_dev_detail functions that
 * chi_dev_submit calls, in the same order), and the handler ("bd.stamp",
 * one method with a CPU handler and a device handler, both echo) stamps its
 * start and end.  A second GPU->GPU row ("gpu->gpu echo") sends chi.echo,
 * the solo built-in of chimaera-bench's gpu0->local row, which the
 * orchestrator runs on one lane from registers: no handler stamps there, so
 * stages 3-5 are one figure.  Both GPU->GPU rows also print the
 * orchestrator worker's side ("w" stages), from a probe that this file
 * compiles into its own orchestrator (CHI_DEV_ORCH_PROBE): when the pass that
 * found the request began, how long that pass took, and when the reply
 * words were stored.  Host and device stamps meet through an offset measured
 * first: a host<->kernel ping-pong over mapped memory, the offset of the
 * round trip with the least time (its half-width is printed: the error of
 * every stage that crosses the bus).  The probes at the end time a 4 KiB
 * copy by one thread, load-store loop against loads in batches, out of host
 * and device memory: the cost that made large payloads slow; and a GPU->CPU
 * waiter's poll of pinned memory that would also bring a 64-byte output as
 * LL words, with each kind of load (k_poll_probe).
 */
/* The orchestrator's probe (chimaera/device_orchestrator.h, serve_bells):
 * bd_orchestrator below is compiled here, with it; the library's built-in
 * orchestrator is not.  Declared before the headers: the template calls it. */
#include <stdint.h>
__device__ void bd_probe(uint32_t what, uint32_t slot, uint32_t gen, uint64_t pass_ns, bool pre);
#define CHI_DEV_ORCH_PROBE(what, slot, gen, pass_ns, pre) bd_probe(what, slot, gen, pass_ns, pre)
#include "gpu_common.h"

#include <time.h>

#include <algorithm>
#include <vector>

#define BD_CHECK(x)                                                                   \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      fprintf(stderr, "gpu_breakdown: %s: %s\n", #x, cudaGetErrorString(e_));         \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

static constexpr uint32_t kMaxPayload = 4096;
static constexpr uint32_t kMaxSamples = 1u << 20;

/* Handler stamps, by sample id (the input's first 4 bytes): device handler
 * in device memory, CPU handler in host memory. */
__device__ uint64_t *g_dev_stamps; /* [2 * kMaxSamples]: start, end */
static uint64_t *g_host_stamps;

static inline uint64_t host_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

/* The worker's side of a GPU->GPU task, by generation (the breakdown's
 * thread keeps one slot, so its generations follow each other): the start
 * of the pass that found the request, when it was found, when its reply
 * words were stored, and {slot, found in the hot slot's preloaded words}. */
__device__ uint64_t *g_probe; /* [4 * kMaxSamples] */
__device__ void bd_probe(uint32_t what, uint32_t slot, uint32_t gen, uint64_t pass_ns, bool pre) {
  const uint64_t now = chi_port::timer_ns();
  uint64_t *p = g_probe + 4u * (gen % kMaxSamples);
  if (what == 0u) {
    p[0] = pass_ns;
    p[1] = now;
    p[3] = (uint64_t(pre ? 1u : 0u) << 32) | slot;
  } else {
    p[2] = now;
  }
}

/* bd.stamp, device: echo, all lanes copying; lane 0 stamps. */
__device__ chi_status_t bd_stamp_dev(chi_dev_request_t *r) {
  const uint32_t lane = chi_port::lane_id();
  const uint64_t t0 = chi_port::timer_ns();
  if (r->input_size > r->output_capacity || r->input_size < 4) return CHI_ERR_INVALID;
  chi_dev_detail::warp_copy(static_cast<uint8_t *>(r->output), static_cast<const uint8_t *>(r->input),
                            r->input_size, lane);
  r->output_size = r->input_size;
  const uint32_t id = *static_cast<const uint32_t *>(r->input) % kMaxSamples;
  const uint64_t t1 = chi_port::timer_ns();
  if (lane == 0) {
    g_dev_stamps[2u * id] = t0;
    g_dev_stamps[2u * id + 1u] = t1;
  }
  return CHI_OK;
}
__device__ chi_status_t bd_dispatch(uint32_t index, chi_dev_request_t *r) {
  return index == 0 ? bd_stamp_dev(r) : CHI_ERR_NOT_FOUND;
}
static const char *const kNames[] = {"bd.stamp"};
CHI_DEFINE_ORCHESTRATOR(bd_orchestrator, bd_dispatch, kNames, 1)

/* bd.stamp, CPU: echo, stamped. */
static chi_status_t bd_stamp_cpu(chi_request_t *req, void *ud) {
  (void)ud;
  const uint64_t t0 = host_ns();
  if (req->input_size > req->output_capacity || req->input_size < 4) return CHI_ERR_INVALID;
  memcpy(req->output, req->input, req->input_size);
  req->output_size = req->input_size;
  uint32_t id;
  memcpy(&id, req->input, 4);
  id %= kMaxSamples;
  g_host_stamps[2u * id] = t0;
  g_host_stamps[2u * id + 1u] = host_ns();
  return CHI_OK;
}

/* ------------------------------------------------------------ clock offset */

/* Answers `rounds` pings: waits for seq, stamps, writes stamp then ack. */
__global__ void k_clock_pong(volatile uint64_t *box, uint32_t rounds) {
  for (uint32_t i = 1; i <= rounds; ++i) {
    const uint64_t t_begin = chi_port::timer_ns();
    while (box[0] != i)
      if (chi_port::timer_ns() - t_begin > 2000000000ull) return; /* host gone: stop */
    box[2] = chi_port::timer_ns();
    __threadfence_system();
    box[1] = i;
    __threadfence_system();
  }
}

struct Offset {
  int64_t gpu_minus_host; /* add to a host stamp to get device time */
  uint64_t half_rtt;      /* +- error */
  uint64_t at;            /* host time of the measurement */
};
/* The offset at host time h, between two measurements: the two clocks
 * drift apart by some ppm (tens of us over a few seconds). */
static int64_t offset_at(const Offset &a, const Offset &b, uint64_t h) {
  if (b.at == a.at) return a.gpu_minus_host;
  const double f = (double(int64_t(h - a.at))) / double(int64_t(b.at - a.at));
  return a.gpu_minus_host + int64_t(f * double(b.gpu_minus_host - a.gpu_minus_host));
}

static Offset clock_offset(uint32_t rounds) {
  volatile uint64_t *box;
  BD_CHECK(cudaHostAlloc((void **)&box, 64, cudaHostAllocMapped));
  box[0] = box[1] = box[2] = 0;
  uint64_t *dbox;
  BD_CHECK(cudaHostGetDevicePointer((void **)&dbox, (void *)box, 0));
  cudaStream_t s;
  BD_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  k_clock_pong<<<1, 1, 0, s>>>(dbox, rounds);
  BD_CHECK(cudaGetLastError());
  Offset best{0, ~0ull, 0};
  for (uint32_t i = 1; i <= rounds; ++i) {
    const uint64_t t0 = host_ns();
    __atomic_store_n(const_cast<uint64_t *>(&box[0]), uint64_t(i), __ATOMIC_RELEASE);
    const uint64_t begin = t0;
    while (__atomic_load_n(const_cast<uint64_t *>(&box[1]), __ATOMIC_ACQUIRE) != i)
      if (host_ns() - begin > 1000000000ull) {
        fprintf(stderr, "gpu_breakdown: clock ping-pong got no answer\n");
        exit(1);
      }
    const uint64_t t1 = host_ns();
    const uint64_t g = box[2];
    if (t1 - t0 < 2 * best.half_rtt || best.half_rtt == ~0ull) {
      best.half_rtt = (t1 - t0) / 2;
      best.gpu_minus_host = int64_t(g) - int64_t(t0 + (t1 - t0) / 2);
      best.at = t0;
    }
  }
  BD_CHECK(cudaStreamSynchronize(s));
  BD_CHECK(cudaStreamDestroy(s));
  BD_CHECK(cudaFreeHost((void *)box));
  return best;
}

/* ------------------------------------------------------------ device routes */

/* Stamps per round trip (device clock, ns), and {slot, generation} of a GPU->GPU one. */
enum { kT0, kPrepared, kPublished, kSeen, kTaken, kSlotGen, kStamps };

/* One thread: n round trips of bd.stamp over `route` (CPU or LOCAL), through
 * the real submit path with stamps between its steps; then chi_dev_wait. */
__global__ void k_device_route(chi_dev_context_t ctx, chi_route_t route, chi_method_t method,
                               uint32_t payload, uint32_t n, uint8_t *buf, uint64_t *st,
                               int32_t *bad, bool fence) {
  using namespace chi_dev_detail;
  uint8_t *in = buf, *out = buf + kMaxPayload;
  for (uint32_t i = 0; i < payload; ++i) in[i] = static_cast<uint8_t>(i * 7u);
  const chi_dev_layout *l = layout(&ctx);
  for (uint32_t i = 0; i < n; ++i) {
    *reinterpret_cast<uint32_t *>(in) = i;
    uint64_t *t = st + static_cast<uint64_t>(i) * kStamps;
    uint32_t kind = 0, slot = 0, gen = 0;
    uint64_t ticket = 0;
    bool held = false;
    t[kT0] = chi_port::timer_ns();
    chi_status_t s = check_submit(&ctx, route, method, in, payload, &kind);
    if (s != CHI_OK) {
      atomicAdd(bad, 1);
      return;
    }
    d2d_reply r = {};
    uint32_t seen = 0;
    if (kind == kKindLocal) {
      uint32_t left = 0;
      s = local_prepare(l, &slot, &gen, &left, true);
      t[kPrepared] = chi_port::timer_ns();
      t[kSlotGen] = (uint64_t(slot) << 32) | gen;
      if (s == CHI_OK) {
        local_publish(l, slot, gen, left, method, in, payload);
        gate_leave(l);
      }
      t[kPublished] = chi_port::timer_ns();
      if (s == CHI_OK) { /* as chi_dev_wait: its claim (WAITING) beside the first poll, then polls */
        uint32_t expect = (gen << 8) | CHI_DEV_SLOT_SUBMITTED;
        held = chi_port::cas_relaxed_dev(l->d2d_state + slot, &expect, (gen << 8) | CHI_DEV_SLOT_WAITING);
        seen = expect;
        const uint32_t want = payload < CHI_DEV_D2D_LL_BYTES ? payload : CHI_DEV_D2D_LL_BYTES;
        while (!local_poll(l, slot, gen, want, &r)) {
        }
      }
    } else {
      s = cpu_prepare(l, in, payload, &slot, &gen, true, &ticket);
      t[kPrepared] = chi_port::timer_ns();
      if (s == CHI_OK) cpu_publish(l, ticket, method, in, payload, slot, gen, fence); /* embedded: the slot alone */
      t[kPublished] = chi_port::timer_ns();
      if (s == CHI_OK) /* header-only polls, as chi_dev_wait's later ones */
        while (!reply_arrived(l, slot, gen)) {
        }
    }
    t[kSeen] = chi_port::timer_ns();
    uint32_t osz = 0;
    if (s == CHI_OK)
      s = kind == kKindLocal ? local_take(l, slot, gen, held, seen, &r, out, kMaxPayload, &osz)
                             : chi_dev_wait(&ctx, make_future(kind, gen, slot), GT_WAIT_NS, out, kMaxPayload, &osz);
    t[kTaken] = chi_port::timer_ns();
    if (s != CHI_OK || osz != payload) {
      atomicAdd(bad, 1);
      return;
    }
    for (uint32_t b = 4; b < payload; b += 61)
      if (out[b] != in[b]) {
        atomicAdd(bad, 1);
        return;
      }
  }
}

/* --------------------------------------------------------------- the probes */

/* One thread copies 4 KiB, `reps` times: mode 0 a 16-byte load-store loop
 * through volatile loads (so nothing reorders them: the old copy), mode 1
 * chi_dev_detail::thread_copy (plain loads in batches); modes 2-4 batches
 * of 8 16-byte loads with ld.volatile, ld.relaxed.sys and ld.global.cv
 * (which of them a thread keeps in flight at once).  *ns: total. */
/* One 16-byte load of kind K: 0 ld.acquire.sys, 1 ld.volatile, 2
 * ld.relaxed.sys, 3 ld.global.cv, 4 ld.global.cg, 5 ld.global.L1::no_allocate. */
template <int K>
__device__ void load16(const void *p, uint64_t *a, uint64_t *b) {
  if (K == 0)
    asm volatile("ld.acquire.sys.global.v2.u64 {%0, %1}, [%2];" : "=l"(*a), "=l"(*b) : "l"(p) : "memory");
  else if (K == 1)
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(*a), "=l"(*b) : "l"(p) : "memory");
  else if (K == 2)
    asm volatile("ld.relaxed.sys.global.v2.u64 {%0, %1}, [%2];" : "=l"(*a), "=l"(*b) : "l"(p) : "memory");
  else if (K == 3)
    asm volatile("ld.global.cv.v2.u64 {%0, %1}, [%2];" : "=l"(*a), "=l"(*b) : "l"(p) : "memory");
  else if (K == 4)
    asm volatile("ld.global.cg.v2.u64 {%0, %1}, [%2];" : "=l"(*a), "=l"(*b) : "l"(p) : "memory");
  else
    asm volatile("ld.global.L1::no_allocate.v2.u64 {%0, %1}, [%2];" : "=l"(*a), "=l"(*b) : "l"(p) : "memory");
}
template <int kMode>
__device__ void batch_copy(const uint8_t *src, uint8_t *dst, uint32_t bytes) {
  for (uint32_t i = 0; i < bytes; i += 128u) {
    uint64_t a[8], b[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) load16<kMode - 1>(src + i + 16u * k, &a[k], &b[k]);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      reinterpret_cast<uint64_t *>(dst + i + 16u * k)[0] = a[k];
      reinterpret_cast<uint64_t *>(dst + i + 16u * k)[1] = b[k];
    }
  }
}
__global__ void k_copy_probe(const uint8_t *src, uint8_t *dst, uint32_t bytes, uint32_t reps, int mode,
                             uint64_t *ns) {
  const uint64_t t0 = chi_port::timer_ns();
  for (uint32_t r = 0; r < reps; ++r) {
    if (mode == 0) {
      for (uint32_t i = 0; i < bytes; i += 16u) {
        uint64_t a, b;
        chi_port::ll_load16(reinterpret_cast<const uint64_t *>(src + i), &a, &b);
        reinterpret_cast<uint64_t *>(dst + i)[0] = a;
        reinterpret_cast<uint64_t *>(dst + i)[1] = b;
      }
    } else if (mode == 1) {
      chi_dev_detail::thread_copy(dst, src, bytes);
    } else if (mode == 2) {
      batch_copy<2>(src, dst, bytes);
    } else if (mode == 3) {
      batch_copy<3>(src, dst, bytes);
    } else {
      batch_copy<4>(src, dst, bytes);
    }
    __threadfence();
  }
  *ns = chi_port::timer_ns() - t0;
}
/* One thread: `reps` system-scope fences, or acquire loads of host memory. */
__global__ void k_fence_probe(const uint64_t *host, uint32_t reps, int mode, uint64_t *ns) {
  uint64_t sink = 0;
  const uint64_t t0 = chi_port::timer_ns();
  for (uint32_t r = 0; r < reps; ++r) {
    if (mode == 0) {
      chi_port::fence_acquire_sys();
    } else if (mode == 1) {
      __threadfence_system();
    } else {
      uint64_t v;
      asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(host) : "memory");
      sink += v;
    }
  }
  *ns = chi_port::timer_ns() - t0 + (sink == 1234567 ? 1 : 0);
}

/* One thread, `reps` polls of a GPU->CPU reply record in pinned host memory
 * (static here: the time of the loads alone), each poll's loads in flight
 * together and each poll dependent on the last one's values, so that the
 * time per poll is one poll's round trip.  What a poll that also brings a
 * 64-byte output as LL words (9 x 16 bytes) costs with each kind of load:
 * mode 0, ld.acquire.sys of words 0-1 alone (today's header poll); 1, with a
 * volatile load of words 2-3 (today's young poll for 8 bytes); 2, with 8
 * volatile loads; 3, with 8 ld.global.cg; 4, with 8 ld.global.L1::no_allocate
 * (weak); 5, 9 ld.global.cg and no acquire; 6, 9 ld.relaxed.sys. */
__global__ void k_poll_probe(const uint64_t *rec, uint32_t reps, int mode, uint64_t *ns) {
  uint64_t sink = 0;
  const uint64_t t0 = chi_port::timer_ns();
  for (uint32_t r = 0; r < reps; ++r) {
    const uint64_t *p = rec + (sink == 0x1234567890ull ? 2u : 0u); /* the last poll's values first */
    uint64_t a[9] = {}, b[9] = {};
    const uint32_t extra = mode == 0 ? 0u : mode == 1 ? 1u : 8u;
    if (mode <= 4) {
      load16<0>(p, &a[0], &b[0]);
      for (uint32_t j = 1; j <= extra; ++j) {
        const uint64_t *q = p + (j == 1u ? 2u : 14u + 2u * j); /* words 2-3, then 18-31 */
        if (mode <= 2) load16<1>(q, &a[j], &b[j]);
        else if (mode == 3) load16<4>(q, &a[j], &b[j]);
        else load16<5>(q, &a[j], &b[j]);
      }
    } else {
      for (uint32_t j = 0; j < 9u; ++j) {
        const uint64_t *q = p + (j == 0u ? 0u : j == 1u ? 2u : 14u + 2u * j);
        if (mode == 5) load16<4>(q, &a[j], &b[j]);
        else load16<2>(q, &a[j], &b[j]);
      }
    }
    for (uint32_t j = 0; j < 9u; ++j) sink += a[j] ^ b[j];
  }
  *ns = chi_port::timer_ns() - t0 + (sink == 1234567 ? 1 : 0);
}

/* One thread, `reps` times: the pieces of a GPU->GPU task's data path on
 * their own (device memory), each closed by what makes it wait, so that
 * the time of each is its cost on the path.  mode 0/1: ll_put of 8 / 64
 * bytes, then a release add (gate_leave); 2: the 64-byte LL stores alone
 * (8 x st.relaxed.gpu.v2) and the release add; 3: the same with plain
 * stores; 4: one LL store and the release add; 5: the release add alone;
 * 6: 16 4-byte loads of an input just stored to (a submit's input read);
 * 7: 9 x ld.relaxed.gpu.v2 (a waiter's poll of a 64-byte reply); 8: 16
 * 4-byte stores of an output (ll_get) and the release add.  *ns: total. */
__global__ void k_path_probe(uint64_t *slot, uint8_t *in, uint8_t *out, uint32_t *word, uint32_t reps, int mode,
                             uint64_t *ns) {
  using namespace chi_dev_detail;
  uint64_t sink = 0;
  const uint64_t t0 = chi_port::timer_ns();
  for (uint32_t r = 0; r < reps; ++r) {
    const uint32_t flag = r + 1u;
    if (mode == 0 || mode == 1) {
      ll_put(slot, in, mode == 0 ? 8u : 64u, flag);
      chi_port::fetch_add_release_dev(word, 1u);
    } else if (mode == 2 || mode == 4) {
      for (uint32_t j = 0; j < (mode == 2 ? 16u : 2u); j += 2u)
        chi_port::ll_store16_dev(slot + j, ll_pack(j, flag), ll_pack(j + 1u, flag));
      chi_port::fetch_add_release_dev(word, 1u);
    } else if (mode == 3) {
#pragma unroll
      for (uint32_t j = 0; j < 16u; j += 2u)
        *reinterpret_cast<ulonglong2 *>(slot + j) = make_ulonglong2(ll_pack(j, flag), ll_pack(j + 1u, flag));
      chi_port::fetch_add_release_dev(word, 1u);
    } else if (mode == 5) {
      chi_port::fetch_add_release_dev(word, 1u);
    } else if (mode == 6) {
      *reinterpret_cast<uint32_t *>(in) = r;
      uint32_t v[16];
#pragma unroll
      for (uint32_t j = 0; j < 16u; ++j) v[j] = reinterpret_cast<const uint32_t *>(in)[j];
#pragma unroll
      for (uint32_t j = 0; j < 16u; ++j) sink += v[j];
    } else if (mode == 7) {
      /* No dependence between iterations: a lower bound if the GPU
       * overlapped them (one poll's round trip, where it did not). */
      uint64_t a[9], b[9];
#pragma unroll
      for (uint32_t j = 0; j < 9u; ++j) chi_port::ll_load16_dev(slot + 2u * j, &a[j], &b[j]);
#pragma unroll
      for (uint32_t j = 0; j < 9u; ++j) sink += a[j] ^ b[j];
    } else {
      uint64_t w[kD2dLlWords];
#pragma unroll
      for (uint32_t j = 0; j < kD2dLlWords; ++j) w[j] = ll_pack(j + r, flag);
      ll_get(out, w, 64u);
      chi_port::fetch_add_release_dev(word, 1u);
    }
  }
  *ns = chi_port::timer_ns() - t0 + (sink == 1234567 ? 1 : 0);
}

/* One thread, `reps` GPU->GPU echo round trips (chi_dev_submit, then
 * chi_dev_wait) of `payload` bytes, with the input prepared as a program
 * might: mode 0 in a local array; 1 in global memory written just before
 * with byte stores (as chimaera-bench's latency kernel did); 2 the same
 * with 4-byte stores; 3 global memory written once, before the loop.  The
 * output goes to a local array (modes 0) or to global memory.  *ns: total;
 * *bad: failed round trips. */
__global__ void k_rt_probe(chi_dev_context_t ctx, uint8_t *gin, uint8_t *gout, uint32_t payload, uint32_t reps,
                           int mode, uint64_t *ns, int32_t *bad) {
  uint8_t lin[64], lout[64];
  uint8_t *in = mode == 0 ? lin : gin, *out = mode == 0 ? lout : gout;
  for (uint32_t i = 0; i < payload; ++i) in[i] = static_cast<uint8_t>(i * 7u);
  const uint64_t t0 = chi_port::timer_ns();
  for (uint32_t r = 0; r < reps; ++r) {
    if (mode == 1) {
      for (uint32_t i = 0; i < payload; ++i) in[i] = static_cast<uint8_t>(i * 7u + r);
    } else if (mode != 3) {
      for (uint32_t i = 0; i < payload; i += 4u) *reinterpret_cast<uint32_t *>(in + i) = i * 7u + r;
    }
    chi_future_t f = 0;
    uint32_t n = 0;
    chi_status_t s = chi_dev_submit(&ctx, CHI_ROUTE_LOCAL, CHI_METHOD_ECHO, in, payload, &f);
    if (s == CHI_OK) s = chi_dev_wait(&ctx, f, GT_WAIT_NS, out, 64u, &n);
    if (s != CHI_OK || n != payload || out[payload - 1u] != in[payload - 1u]) atomicAdd(bad, 1);
  }
  *ns = chi_port::timer_ns() - t0;
}

/* ---------------------------------------------------------------- reporting */

static double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}
static double mean(const std::vector<double> &v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / v.size();
}
static void row(const char *route, uint32_t payload, const char *stage, const std::vector<double> &ns) {
  printf("%-8s %6u  %-44s %9.3f %9.3f\n", route, payload, stage, median(ns) / 1e3, mean(ns) / 1e3);
}

/* The orchestrator worker's side of the GPU->GPU round trips just run (its
 * probe, g_probe), beside the thread's stamps: a "w" stage is the worker's.
 * Rows only for the round trips the probe saw whole (slot and generation
 * match, found after the submit began). */
static void worker_rows(const char *route, uint32_t payload, const std::vector<uint64_t> &t,
                        const uint64_t *dev_probe, std::vector<uint64_t> &probe, uint32_t n) {
  BD_CHECK(cudaMemcpy(probe.data(), dev_probe, probe.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
  std::vector<double> to_pass, pass, run, back;
  uint32_t pre = 0;
  for (uint32_t i = 0; i < n; ++i) {
    const uint64_t *x = &t[uint64_t(i) * kStamps];
    const uint32_t slot = uint32_t(x[kSlotGen] >> 32), gen = uint32_t(x[kSlotGen]);
    const uint64_t *p = &probe[4u * (gen % kMaxSamples)];
    if (p[1] == 0 || p[2] == 0 || uint32_t(p[3]) != slot || p[1] < x[kT0]) continue;
    to_pass.push_back(double(int64_t(p[0] - x[kPublished])));
    pass.push_back(double(p[1] - p[0]));
    run.push_back(double(p[2] - p[1]));
    back.push_back(double(int64_t(x[kSeen] - p[2])));
    pre += (p[3] >> 32) != 0;
  }
  if (to_pass.empty()) {
    printf("%-8s %6u  (the orchestrator's probe saw none of these round trips)\n", route, payload);
    return;
  }
  row(route, payload, "w1 gate leave -> start of the finding pass", to_pass);
  row(route, payload, "w2 that pass: loads to request ready", pass);
  row(route, payload, "w3 request ready -> reply words stored", run);
  row(route, payload, "w4 reply stored -> the waiter's poll sees it", back);
  printf("%-8s %6u  %-44s %9u of %zu\n", route, payload, "w  found in the hot slot's preloaded words", pre,
         to_pass.size());
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  uint32_t n = argc > 1 ? uint32_t(strtoul(argv[1], NULL, 10)) : 20000u;
  if (n == 0 || n > kMaxSamples) n = 20000u;
  std::vector<uint32_t> payloads;
  for (int i = 2; i < argc; ++i) {
    const unsigned long p = strtoul(argv[i], NULL, 10);
    if (p >= 4 && p <= kMaxPayload) payloads.push_back(uint32_t(p));
  }
  if (payloads.empty()) payloads = {8, 64, 1024, 4096};
  if (!gt_have_cuda()) return 77;

  chi_config_t cfg;
  chi_config_init(&cfg);
  chi_runtime_t *rt = NULL;
  if (chi_init(&cfg, &rt) != CHI_OK) {
    fprintf(stderr, "chi_init: %s\n", chi_last_error_message());
    return 1;
  }
  int32_t count = 0;
  chi_gpu_count(rt, &count);
  if (count == 0) {
    chi_finalize(rt);
    return 77;
  }
  g_host_stamps = static_cast<uint64_t *>(calloc(2u * kMaxSamples, sizeof(uint64_t)));
  uint64_t *dev_stamps = NULL;
  BD_CHECK(cudaMalloc((void **)&dev_stamps, 2u * kMaxSamples * sizeof(uint64_t)));
  BD_CHECK(cudaMemcpyToSymbol(g_dev_stamps, &dev_stamps, sizeof dev_stamps));
  uint64_t *dev_probe = NULL;
  BD_CHECK(cudaMalloc((void **)&dev_probe, 4u * kMaxSamples * sizeof(uint64_t)));
  BD_CHECK(cudaMemcpyToSymbol(g_probe, &dev_probe, sizeof dev_probe));
  std::vector<uint64_t> probe(4u * kMaxSamples);
  chi_gpu_orchestrator_t o = bd_orchestrator();
  chi_method_t m = 0;
  chi_dev_context_t ctx;
  if (chi_gpu_set_orchestrator(rt, -1, &o) != CHI_OK ||
      chi_register_handler(rt, "bd.stamp", bd_stamp_cpu, NULL, &m) != CHI_OK ||
      chi_gpu_context(rt, 0, &ctx) != CHI_OK) {
    fprintf(stderr, "gpu_breakdown: set-up: %s\n", chi_last_error_message());
    chi_finalize(rt);
    return 1;
  }
  uint8_t *buf;
  uint64_t *st;
  int32_t *bad;
  BD_CHECK(cudaMalloc((void **)&buf, 2 * kMaxPayload));
  BD_CHECK(cudaMalloc((void **)&st, uint64_t(n) * kStamps * sizeof(uint64_t)));
  BD_CHECK(cudaHostAlloc((void **)&bad, sizeof(int32_t), cudaHostAllocMapped));
  *bad = 0;
  cudaStream_t stream;
  BD_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<uint64_t> t(uint64_t(n) * kStamps), hs(2u * n);
  const uint32_t warm = n / 10 + 1;
  int failed = 0;

  printf("gpu_breakdown: %u round trips per row after %u warm-up; median and mean in us\n", n, warm);
  Offset off = clock_offset(2000);
  printf("clock offset: host<->GPU ping-pong, least round trip %.3f us (stages that cross the bus: +- %.3f us); "
         "%%globaltimer - host clock %+.1f us\n\n",
         2 * off.half_rtt / 1e3, off.half_rtt / 1e3, double(off.gpu_minus_host) / 1e3);
  printf("%-8s %6s  %-44s %9s %9s\n", "route", "bytes", "stage", "median", "mean");

  for (uint32_t payload : payloads) {
    /* ---- GPU->CPU and GPU->GPU, from a kernel */
    for (int r = 0; r < 4; ++r) {
      /* r 2: GPU->CPU with a system fence after the publish (cpu_publish's comment);
       * r 3: GPU->GPU with chi.echo, a solo built-in as chimaera-bench's row (no handler stamps) */
      const chi_route_t route = r == 1 || r == 3 ? CHI_ROUTE_LOCAL : CHI_ROUTE_CPU;
      const char *name = r == 0 ? "gpu->cpu" : r == 1 ? "gpu->gpu" : r == 2 ? "gpu->cpu fence" : "gpu->gpu echo";
      const bool fence = r == 2;
      const chi_method_t method = r == 3 ? CHI_METHOD_ECHO : m;
      k_device_route<<<1, 1, 0, stream>>>(ctx, route, method, payload, warm, buf, st, bad, fence);
      BD_CHECK(cudaStreamSynchronize(stream));
      BD_CHECK(cudaMemset(dev_probe, 0, probe.size() * sizeof(uint64_t)));
      const Offset before = clock_offset(500); /* around the run: the clocks drift apart */
      k_device_route<<<1, 1, 0, stream>>>(ctx, route, method, payload, n, buf, st, bad, fence);
      BD_CHECK(cudaStreamSynchronize(stream));
      const Offset after = clock_offset(500);
      if (*bad) {
        fprintf(stderr, "gpu_breakdown: %s at %u bytes: a task failed\n", name, payload);
        failed = 1;
        break;
      }
      BD_CHECK(cudaMemcpy(t.data(), st, t.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
      if (route == CHI_ROUTE_LOCAL) worker_rows(name, payload, t, dev_probe, probe, n);
      /* The submitting thread's stages, every route. */
      std::vector<double> prep, pub, take, total;
      for (uint32_t i = 0; i < n; ++i) {
        const uint64_t *x = &t[uint64_t(i) * kStamps];
        prep.push_back(double(x[kPrepared] - x[kT0]));
        pub.push_back(double(x[kPublished] - x[kPrepared]));
        take.push_back(double(x[kTaken] - x[kSeen]));
        total.push_back(double(x[kTaken] - x[kT0]));
      }
      const bool local = route == CHI_ROUTE_LOCAL;
      row(name, payload, local ? "1 gate + slot, then its generation" : "1 slot + payload to host buffer (>112 B)",
          prep);
      row(name, payload,
          local ? "2 LL request words, bell, gate leave"
                : r == 2 ? "2 ring entry write + system fence" : "2 ring entry write",
          pub);
      if (r == 3) { /* chi.echo: no handler stamps */
        std::vector<double> reply;
        for (uint32_t i = 0; i < n; ++i) {
          const uint64_t *x = &t[uint64_t(i) * kStamps];
          reply.push_back(double(x[kSeen] - x[kPublished]));
        }
        row(name, payload, "3-5 to the reply seen (solo echo)", reply);
      } else {
        if (!local) {
          memcpy(hs.data(), g_host_stamps, hs.size() * sizeof(uint64_t));
          for (uint32_t i = 0; i < n; ++i) { /* to device time */
            const int64_t o = offset_at(before, after, hs[2 * i]);
            hs[2 * i] += o;
            hs[2 * i + 1] += o;
          }
        } else {
          BD_CHECK(cudaMemcpy(hs.data(), dev_stamps, hs.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
        }
        std::vector<double> to_h, hand, back;
        for (uint32_t i = 0; i < n; ++i) {
          const uint64_t *x = &t[uint64_t(i) * kStamps];
          to_h.push_back(double(int64_t(hs[2 * i] - x[kPublished])));
          hand.push_back(double(hs[2 * i + 1] - hs[2 * i]));
          back.push_back(double(int64_t(x[kSeen] - hs[2 * i + 1])));
        }
        row(name, payload,
            local ? "3 to handler: bell seen, request + input read" : "3 to handler: bus, host poll, payload read",
            to_h);
        row(name, payload, local ? "4 device handler (echo, one warp)" : "4 CPU handler (echo)", hand);
        row(name, payload,
            local ? "5 reply words written, waiter's poll sees them" : "5 reply write, bus, device header poll",
            back);
      }
      row(name, payload, local ? "6 chi_dev_wait: claim, output, slot freed" : "6 chi_dev_wait: output read + copy",
          take);
      row(name, payload, "= round trip", total);
    }
    if (failed) break;

    /* ---- CPU->GPU, from this thread */
    Offset before{0, 0, 0};
    std::vector<uint8_t> in(payload), out(payload);
    for (uint32_t i = 0; i < payload; ++i) in[i] = uint8_t(i * 5u);
    std::vector<double> sub, to_d, hand, back, total;
    std::vector<uint64_t> h(3u * n);
    for (uint32_t i = 0; i < warm + n; ++i) {
      if (i == warm) before = clock_offset(500);
      const uint32_t id = i % n;
      memcpy(in.data(), &id, 4);
      chi_future_t f;
      size_t osz = 0;
      const uint64_t t0 = host_ns();
      chi_status_t s = chi_submit(rt, CHI_ROUTE_GPU(0), m, in.data(), payload, &f);
      const uint64_t t1 = host_ns();
      if (s == CHI_OK) s = chi_wait(rt, f, GT_WAIT_NS, out.data(), payload, &osz);
      const uint64_t t2 = host_ns();
      if (s != CHI_OK || osz != payload || memcmp(in.data(), out.data(), payload) != 0) {
        fprintf(stderr, "gpu_breakdown: cpu->gpu at %u bytes: %s\n", payload, chi_status_string(s));
        failed = 1;
        break;
      }
      if (i >= warm) {
        h[3 * id] = t0;
        h[3 * id + 1] = t1;
        h[3 * id + 2] = t2;
      }
    }
    if (failed) break;
    const Offset after = clock_offset(500);
    BD_CHECK(cudaMemcpy(hs.data(), dev_stamps, hs.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
    for (uint32_t i = 0; i < n; ++i) {
      const int64_t o = offset_at(before, after, h[3 * i + 1]);
      const int64_t g0 = int64_t(hs[2 * i]) - o, g1 = int64_t(hs[2 * i + 1]) - o;
      sub.push_back(double(h[3 * i + 1] - h[3 * i]));
      to_d.push_back(double(g0 - int64_t(h[3 * i + 1])));
      hand.push_back(double(g1 - g0));
      back.push_back(double(int64_t(h[3 * i + 2]) - g1));
      total.push_back(double(h[3 * i + 2] - h[3 * i]));
    }
    row("cpu->gpu", payload, "1 chi_submit (slot, ring entry, host buffer)", sub);
    row("cpu->gpu", payload, "2 to handler: bus, orchestrator poll, read", to_d);
    row("cpu->gpu", payload, "3 device handler (echo, one warp)", hand);
    row("cpu->gpu", payload, "4 reply write, bus, chi_wait poll + copy", back);
    row("cpu->gpu", payload, "= round trip", total);
    printf("\n");
  }

  /* ---- copy probes: 4 KiB by one thread */
  if (!failed) {
    uint8_t *hbuf, *hdev, *dsrc, *ddst;
    uint64_t *ns;
    BD_CHECK(cudaHostAlloc((void **)&hbuf, 4096, cudaHostAllocMapped));
    BD_CHECK(cudaHostGetDevicePointer((void **)&hdev, hbuf, 0));
    BD_CHECK(cudaMalloc((void **)&dsrc, 4096));
    BD_CHECK(cudaMalloc((void **)&ddst, 4096));
    BD_CHECK(cudaHostAlloc((void **)&ns, sizeof(uint64_t), cudaHostAllocMapped));
    const uint32_t reps = 200;
    const char *names[5] = {"16-byte volatile load-store loop", "thread_copy (plain loads, batched)",
                            "8 x ld.volatile in flight", "8 x ld.relaxed.sys in flight", "8 x ld.global.cv in flight"};
    printf("%-8s %6s  %-44s %9s\n", "probe", "bytes", "one thread copies", "us each");
    for (int from = 0; from < 2; ++from)
      for (int mode = 0; mode < 5; ++mode) {
        k_copy_probe<<<1, 1, 0, stream>>>(from == 0 ? hdev : dsrc, ddst, 4096, reps, mode, ns);
        BD_CHECK(cudaStreamSynchronize(stream));
        printf("%-8s %6u  %-44s %9.3f\n", from == 0 ? "host" : "device", 4096u, names[mode], double(*ns) / reps / 1e3);
      }
    const char *fnames[3] = {"fence.acq_rel.sys (fence_acquire_sys)", "__threadfence_system()",
                             "ld.acquire.sys of a host word"};
    for (int mode = 0; mode < 3; ++mode) {
      k_fence_probe<<<1, 1, 0, stream>>>(reinterpret_cast<const uint64_t *>(hdev), 10000, mode, ns);
      BD_CHECK(cudaStreamSynchronize(stream));
      printf("%-8s %6s  %-44s %9.3f\n", "fence", "-", fnames[mode], double(*ns) / 10000 / 1e3);
    }
    /* A GPU->CPU waiter's poll with the output as LL words (k_poll_probe). */
    const char *qnames[7] = {"poll: acquire 16 B (header)", "poll: acquire + 1 volatile 16 B",
                             "poll: acquire + 8 volatile 16 B", "poll: acquire + 8 ld.global.cg 16 B",
                             "poll: acquire + 8 L1::no_allocate 16 B", "poll: 9 ld.global.cg 16 B, no acquire",
                             "poll: 9 ld.relaxed.sys 16 B"};
    for (int mode = 0; mode < 7; ++mode) {
      k_poll_probe<<<1, 1, 0, stream>>>(reinterpret_cast<const uint64_t *>(hdev), 2000, mode, ns);
      BD_CHECK(cudaStreamSynchronize(stream));
      printf("%-8s %6s  %-44s %9.3f\n", "poll", "-", qnames[mode], double(*ns) / 2000 / 1e3);
    }
    /* The data path's pieces in device memory (k_path_probe). */
    uint8_t *pslot;
    BD_CHECK(cudaMalloc((void **)&pslot, 1024));
    BD_CHECK(cudaMemset(pslot, 0, 1024));
    const char *pnames[9] = {"ll_put 8 B + release add",        "ll_put 64 B + release add",
                             "8 x st.relaxed.gpu.v2 + release add", "8 x plain st.v2 + release add",
                             "1 x st.relaxed.gpu.v2 + release add", "release add alone",
                             "16 x 4-byte loads of fresh input", "9 x ld.relaxed.gpu.v2 (a poll)",
                             "ll_get 64 B + release add"};
    for (int mode = 0; mode < 9; ++mode) {
      k_path_probe<<<1, 1, 0, stream>>>(reinterpret_cast<uint64_t *>(pslot), pslot + 256, pslot + 512,
                                        reinterpret_cast<uint32_t *>(pslot + 768), 10000, mode, ns);
      BD_CHECK(cudaStreamSynchronize(stream));
      printf("%-8s %6s  %-44s %9.3f\n", "path", "-", pnames[mode], double(*ns) / 10000 / 1e3);
    }
    /* Whole GPU->GPU round trips, the input prepared in four ways (k_rt_probe). */
    int32_t *pbad;
    BD_CHECK(cudaHostAlloc((void **)&pbad, sizeof(int32_t), cudaHostAllocMapped));
    const char *rnames[4] = {"round trip, local arrays", "round trip, input byte-stored just before",
                             "round trip, input word-stored just before", "round trip, input stored once"};
    for (uint32_t payload : {8u, 64u})
      for (int mode = 0; mode < 4; ++mode) {
        *pbad = 0;
        k_rt_probe<<<1, 1, 0, stream>>>(ctx, pslot + 256, pslot + 512, payload, 5000, mode, ns, pbad);
        BD_CHECK(cudaStreamSynchronize(stream));
        printf("%-8s %6u  %-44s %9.3f%s\n", "rt", payload, rnames[mode], double(*ns) / 5000 / 1e3,
               *pbad ? "  (failed round trips)" : "");
        if (*pbad) failed = 1;
      }
  }
  BD_CHECK(cudaStreamSynchronize(stream));
  chi_finalize(rt);
  return failed;
}

/*
 * GPU->GPU across GPUs from device code (docs/gpu.md, "GPU->GPU across
 * GPUs"): a kernel on GPU a submits to CHI_ROUTE_GPU(b) and its task runs on
 * GPU b's orchestrator, both directions.  Every payload size class, the
 * waiting and try submits, test, wait with a timeout and a poll, release,
 * the warp variants, errors (an unknown GPU, a method only the other GPU
 * lacks, a released future), a user handler on GPU 1 that submits back to
 * GPU 0 and to the CPU, and a storm from a full grid on both GPUs at once
 * with every result checked.  Needs two GPUs with peer access: exit 77 with
 * fewer (or without peer access between the first two).  Runs with
 * gpu.peer_routes on (experimental, off by default).  The storm runs only
 * with CHI_TEST_PEER_STORM=1: on a 2 x H200 host it did not finish in 240 s
 * (docs/gpu.md, "GPU->GPU across GPUs").
 */
#include "gpu_common.h"

#include <vector>

#define PEER_SIZES 6
__constant__ uint32_t kPeerSizes[PEER_SIZES] = {0, 8, 64, 100, 1000, 4096};

/* Round trips of echo to GPU `to`, one per size class, then the other calls.
 * st[i]: statuses; bad[0]: wrong outputs. */
__global__ void k_peer_basic(chi_dev_context_t ctx, chi_route_t to, uint8_t *scratch, int32_t *st, int32_t *bad,
                             chi_method_t relay, chi_method_t cpu_inc, chi_method_t lacking) {
  uint8_t *in = scratch, *out = scratch + 4096;
  uint32_t n = 0;
  chi_future_t f = 0;
  for (int k = 0; k < PEER_SIZES; ++k) {
    const uint32_t size = kPeerSizes[k];
    gt_fill(in, size, 1000u + k);
    st[k] = chi_dev_submit(&ctx, to, CHI_METHOD_ECHO, in, size, &f);
    if (st[k] == CHI_OK) st[k] = chi_dev_wait(&ctx, f, GT_WAIT_NS, out, 4096, &n);
    if (st[k] == CHI_OK && (n != size || gt_fnv(out, size) != gt_fnv(in, size))) ++bad[0];
  }
  /* try submit, test until done, then a wait with a too small buffer, then the result. */
  gt_fill(in, 64, 7);
  st[6] = chi_dev_try_submit(&ctx, to, CHI_METHOD_ECHO, in, 64, &f);
  int done = 0;
  for (int i = 0; i < 100000000 && st[6] == CHI_OK && !done; ++i) st[6] = chi_dev_test(&ctx, f, &done);
  st[7] = chi_dev_wait(&ctx, f, GT_WAIT_NS, out, 8, &n); /* TOO_LARGE, future stays */
  st[8] = n == 64 ? CHI_OK : CHI_ERR_INTERNAL;
  st[9] = chi_dev_wait(&ctx, f, GT_WAIT_NS, out, 4096, &n);
  if (st[9] == CHI_OK && gt_fnv(out, 64) != gt_fnv(in, 64)) ++bad[0];
  st[10] = chi_dev_wait(&ctx, f, 0, out, 4096, &n); /* consumed */
  /* release: the task still runs, the future is gone. */
  st[11] = chi_dev_submit(&ctx, to, CHI_METHOD_ECHO, in, 64, &f);
  if (st[11] == CHI_OK) st[11] = chi_dev_release(&ctx, f);
  st[12] = chi_dev_wait(&ctx, f, 0, out, 4096, &n); /* INVALID */
  /* no such GPU; method 0 */
  st[13] = chi_dev_submit(&ctx, CHI_ROUTE_GPU(9), CHI_METHOD_ECHO, in, 8, &f);
  st[14] = chi_dev_submit(&ctx, to, 0, in, 8, &f);
  /* a method the other GPU's orchestrator lacks: NOT_FOUND at the wait */
  st[15] = chi_dev_submit(&ctx, to, lacking, in, 8, &f);
  if (st[15] == CHI_OK) st[15] = chi_dev_wait(&ctx, f, GT_WAIT_NS, out, 4096, &n);
  /* peer.relay on the other GPU: x -> (x + 1 from the CPU) + echo back here */
  if (relay) {
    uint8_t r[16] = {0};
    uint64_t x = 41;
    memcpy(r, &x, 8);
    memcpy(r + 8, &cpu_inc, 4);
    st[16] = chi_dev_submit(&ctx, to, relay, r, 16, &f);
    uint64_t y = 0;
    if (st[16] == CHI_OK) st[16] = chi_dev_wait(&ctx, f, GT_WAIT_NS, &y, 8, &n);
    if (st[16] == CHI_OK && (n != 8 || y != 42)) ++bad[0];
  } else {
    st[16] = CHI_OK;
  }
  /* a wait with a short timeout on a task that is done by then or not: either */
  st[17] = chi_dev_submit(&ctx, to, CHI_METHOD_ECHO, in, 8, &f);
  if (st[17] == CHI_OK) {
    chi_status_t w = chi_dev_wait(&ctx, f, 1, out, 4096, &n);
    if (w == CHI_ERR_TIMEOUT) w = chi_dev_wait(&ctx, f, GT_WAIT_NS, out, 4096, &n);
    st[17] = w;
  }
}

/* A full grid on each GPU: every thread sends `rounds` tasks to the other
 * GPU, odd warps through the warp variants; bad counts wrong results. */
__global__ void k_peer_storm(chi_dev_context_t ctx, chi_route_t to, uint32_t rounds, unsigned long long *ok,
                             unsigned long long *bad) {
  const uint32_t tid = blockIdx.x * blockDim.x + threadIdx.x;
  const bool warp_api = ((tid / 32u) & 1u) != 0u;
  for (uint32_t r = 0; r < rounds; ++r) {
    uint64_t in[2] = {((uint64_t)tid << 20) ^ r, (uint64_t)to * 1000003u + r}, out[2] = {0, 0};
    chi_future_t f = 0;
    uint32_t n = 0;
    chi_status_t s;
    if (warp_api) {
      /* Warp-collective: every lane calls each time, those still without a
       * slot active. */
      int need = 1;
      s = CHI_ERR_AGAIN;
      while (__any_sync(0xffffffffu, need)) {
        chi_future_t g = 0;
        const chi_status_t t = chi_dev_warp_submit(&ctx, to, CHI_METHOD_ECHO, in, 16, need, &g);
        if (need && t != CHI_ERR_AGAIN) {
          s = t;
          f = g;
          need = 0;
        }
      }
      const chi_status_t w = chi_dev_warp_wait(&ctx, f, GT_WAIT_NS, out, 16, &n, s == CHI_OK);
      if (s == CHI_OK) s = w;
    } else {
      do {
        s = chi_dev_submit(&ctx, to, CHI_METHOD_ECHO, in, 16, &f);
      } while (s == CHI_ERR_AGAIN);
      if (s == CHI_OK) s = chi_dev_wait(&ctx, f, GT_WAIT_NS, out, 16, &n);
    }
    if (s == CHI_OK && n == 16 && out[0] == in[0] && out[1] == in[1]) atomicAdd(ok, 1ull);
    else atomicAdd(bad, 1ull);
  }
}

/* peer.relay (GPU 1's user orchestrator): input {u64 x, u32 cpu method,
 * u32 pad}; lane 0 sends x to the CPU method (x + 1) and the result back to
 * GPU 0 as an echo; output that. */
__device__ chi_status_t peer_relay(chi_dev_request_t *r) {
  if (r->input_size != 16 || r->output_capacity < 8) return CHI_ERR_INVALID;
  chi_status_t st = CHI_OK;
  if (chi_port::lane_id() == 0) {
    const uint8_t *in = (const uint8_t *)r->input;
    uint32_t method = 0;
    memcpy(&method, in + 8, 4);
    chi_future_t f = 0;
    uint32_t n = 0;
    uint64_t y = 0, z = 0;
    for (int tries = 0; tries < 100000 && (st = chi_dev_submit(r->ctx, CHI_ROUTE_CPU, method, in, 8, &f)) == CHI_ERR_AGAIN; ++tries) {
    }
    if (st == CHI_OK) st = chi_dev_wait(r->ctx, f, GT_WAIT_NS, &y, 8, &n);
    if (st == CHI_OK)
      for (int tries = 0; tries < 100000 && (st = chi_dev_submit(r->ctx, CHI_ROUTE_GPU(0), CHI_METHOD_ECHO, &y, 8, &f)) == CHI_ERR_AGAIN; ++tries) {
      }
    if (st == CHI_OK) st = chi_dev_wait(r->ctx, f, GT_WAIT_NS, &z, 8, &n);
    if (st == CHI_OK) memcpy(r->output, &z, 8);
  }
  st = __shfl_sync(0xffffffffu, st, 0);
  r->output_size = 8;
  return st;
}
__device__ chi_status_t peer_dispatch(uint32_t index, chi_dev_request_t *r) {
  return index == 0 ? peer_relay(r) : CHI_ERR_NOT_FOUND;
}
static const char *const kNames[] = {"peer.relay"};
CHI_DEFINE_ORCHESTRATOR(peer_orchestrator, peer_dispatch, kNames, 1)


static chi_runtime_t *g_rt;
static chi_dev_context_t g_ctx[2];
static chi_method_t g_inc, g_relay;
static GtWatchdog g_wd;

struct OnGpu {
  int dev;
  cudaStream_t stream = nullptr;
  uint8_t *scratch = nullptr;
  int32_t *st = nullptr, *bad = nullptr;
  unsigned long long *ok = nullptr, *sbad = nullptr;
};
static OnGpu g_gpu[2];

static void basic(int from, int to, chi_method_t relay, chi_method_t lacking, const chi_status_t *want) {
  OnGpu &g = g_gpu[from];
  CK(cudaSetDevice(g.dev));
  memset(g.st, 0x7F, 32 * sizeof(int32_t));
  *g.bad = 0;
  k_peer_basic<<<1, 1, 0, g.stream>>>(g_ctx[from], to, g.scratch, g.st, g.bad, relay, g_inc, lacking);
  CK(cudaStreamSynchronize(g.stream));
  for (int i = 0; i < 18; ++i)
    if (g.st[i] != want[i])
      fail_msg("GPU %d -> GPU %d, step %d: got %d (%s), want %d", from, to, i, g.st[i], chi_status_string(g.st[i]),
               want[i]);
  assert_int_equal(*g.bad, 0);
}

/* GPU 0 -> GPU 1: GPU 1's peer.relay (back to the CPU and to GPU 0);
 * peer.inc, a CPU-only method, has no handler on GPU 1. */
static void test_gpu0_to_gpu1(void **state) {
  (void)state;
  g_wd.enter("gpu0 -> gpu1");
  const chi_status_t want[18] = {CHI_OK, CHI_OK, CHI_OK, CHI_OK, CHI_OK, CHI_OK, CHI_OK, CHI_ERR_TOO_LARGE,
                                 CHI_OK, CHI_OK, CHI_ERR_INVALID, CHI_OK, CHI_ERR_INVALID, CHI_ERR_NO_DEVICE,
                                 CHI_ERR_INVALID, CHI_ERR_NOT_FOUND, CHI_OK, CHI_OK};
  basic(0, 1, g_relay, g_inc, want);
}

/* GPU 1 -> GPU 0: GPU 0's orchestrator (built-in) lacks peer.relay. */
static void test_gpu1_to_gpu0(void **state) {
  (void)state;
  g_wd.enter("gpu1 -> gpu0");
  const chi_status_t want[18] = {CHI_OK, CHI_OK, CHI_OK, CHI_OK, CHI_OK, CHI_OK, CHI_OK, CHI_ERR_TOO_LARGE,
                                 CHI_OK, CHI_OK, CHI_ERR_INVALID, CHI_OK, CHI_ERR_INVALID, CHI_ERR_NO_DEVICE,
                                 CHI_ERR_INVALID, CHI_ERR_NOT_FOUND, CHI_OK, CHI_OK};
  basic(1, 0, 0, g_relay, want);
}

/* Both GPUs' full grids at once, each to the other. */
static void test_storm(void **state) {
  (void)state;
  const char *on = getenv("CHI_TEST_PEER_STORM");
  if (!on || strcmp(on, "1") != 0) {
    printf("# storm skipped (CHI_TEST_PEER_STORM=1 runs it)\n");
    return;
  }
  g_wd.enter("storm");
  const uint32_t rounds = gt_env_count("CHI_TEST_PEER_ROUNDS", 8);
  uint32_t threads[2] = {0, 0};
  for (int a = 0; a < 2; ++a) {
    OnGpu &g = g_gpu[a];
    CK(cudaSetDevice(g.dev));
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, g.dev));
    *g.ok = *g.sbad = 0;
    threads[a] = (uint32_t)sms * 256u;
    k_peer_storm<<<sms, 256, 0, g.stream>>>(g_ctx[a], 1 - a, rounds, g.ok, g.sbad);
  }
  for (int a = 0; a < 2; ++a) {
    CK(cudaSetDevice(g_gpu[a].dev));
    CK(cudaStreamSynchronize(g_gpu[a].stream));
    printf("# GPU %d -> GPU %d: %llu right, %llu wrong\n", a, 1 - a, *g_gpu[a].ok, *g_gpu[a].sbad);
    assert_int_equal(*g_gpu[a].sbad, 0);
    assert_int_equal(*g_gpu[a].ok, (unsigned long long)threads[a] * rounds);
  }
}

int main(void) {
  setvbuf(stdout, NULL, _IONBF, 0);
  if (!gt_have_cuda()) return 77;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) {
    printf("# fewer than two GPUs\n");
    return 77;
  }
  int can01 = 0, can10 = 0;
  cudaDeviceCanAccessPeer(&can01, 0, 1);
  cudaDeviceCanAccessPeer(&can10, 1, 0);
  if (!can01 || !can10) {
    printf("# GPUs 0 and 1 have no peer access\n");
    return 77;
  }
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.settings = "gpu.peer_routes: true";
  if (chi_init(&cfg, &g_rt) != CHI_OK) {
    fprintf(stderr, "chi_init: %s\n", chi_last_error_message());
    return 1;
  }
  int32_t count = 0;
  chi_gpu_count(g_rt, &count);
  if (count < 2) {
    chi_finalize(g_rt);
    return 77;
  }
  chi_gpu_orchestrator_t o = peer_orchestrator();
  if (chi_register_handler(g_rt, "peer.inc", gt_inc_handler, NULL, &g_inc) != CHI_OK ||
      chi_gpu_set_orchestrator(g_rt, 1, &o) != CHI_OK || chi_method_lookup(g_rt, "peer.relay", &g_relay) != CHI_OK ||
      chi_gpu_context(g_rt, 0, &g_ctx[0]) != CHI_OK || chi_gpu_context(g_rt, 1, &g_ctx[1]) != CHI_OK) {
    fprintf(stderr, "setup: %s\n", chi_last_error_message());
    chi_finalize(g_rt);
    return 1;
  }
  for (int a = 0; a < 2; ++a) {
    OnGpu &g = g_gpu[a];
    g.dev = a;
    if (cudaSetDevice(a) != cudaSuccess || cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaMalloc(&g.scratch, 8192) != cudaSuccess ||
        cudaHostAlloc((void **)&g.st, 64 * sizeof(int32_t), cudaHostAllocMapped) != cudaSuccess ||
        cudaHostAlloc((void **)&g.bad, sizeof(int32_t), cudaHostAllocMapped) != cudaSuccess ||
        cudaHostAlloc((void **)&g.ok, sizeof(unsigned long long), cudaHostAllocMapped) != cudaSuccess ||
        cudaHostAlloc((void **)&g.sbad, sizeof(unsigned long long), cudaHostAllocMapped) != cudaSuccess) {
      fprintf(stderr, "setup: CUDA\n");
      return 1;
    }
  }
  g_wd.start(&g_ctx[0], 240);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gpu0_to_gpu1),
      cmocka_unit_test(test_gpu1_to_gpu0),
      cmocka_unit_test(test_storm),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  g_wd.stop();
  for (int a = 0; a < 2; ++a) {
    cudaSetDevice(a);
    cudaStreamSynchronize(g_gpu[a].stream);
  }
  if (chi_finalize(g_rt) != CHI_OK) {
    fprintf(stderr, "chi_finalize: %s\n", chi_last_error_message());
    return 1;
  }
  return failed ? 1 : 0;
}

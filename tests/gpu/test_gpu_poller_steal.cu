/*
 * GPU->CPU pollers steal from a held-up poller (docs/gpu.md, "GPU->CPU
 * pollers"): one kernel thread submits a task whose CPU handler blocks its
 * poller until N other GPU->CPU tasks have completed; 256 other kernel
 * threads submit those N echo tasks, one at a time each, and wait for them.
 * About N / P of them get tickets of the blocked poller's part: only other
 * pollers stealing them lets the count reach N.  Passes iff the blocking
 * task returns CHI_OK and every echo returned its bytes.  Without stealing
 * (CHI_GPU_POLLER_STEAL_US=0) the handler gives up after 60 s with
 * CHI_ERR_TIMEOUT and the test fails.
 *
 * Runs with 4 pollers (CHI_GPU_POLLERS; a value >= 2 in the environment is
 * kept): with one poller nobody could steal.  By default the pollers never
 * park (CHI_GPU_POLLER_PARK_AFTER_US=0), so the blocking task meets a poller
 * in its own loop.  With the argument `parked` they park (the default
 * gpu.poller_park_after_us, 10 ms) and the task comes after 100 ms of quiet:
 * the parked group's watcher serves it and blocks, and the echoes of the
 * parked shares complete only if the sleepers, which wake every 100 ms,
 * steal them (docs/gpu.md).  Exit 77 without a usable GPU.
 */
#include "gpu_common.h"

#include <string.h>
#include <time.h>

#include <atomic>

static chi_runtime_t *g_rt;
static chi_dev_context_t g_ctx;
static chi_method_t g_block_method, g_echo_method;
static int32_t *g_st;             /* mapped pinned: the blocking task's statuses */
static unsigned long long *g_cnt; /* mapped pinned: echo counters */
static std::atomic<uint64_t> g_echoes{0};
static std::atomic<bool> g_blocking{false};
static bool g_parked; /* argument `parked`: the pollers park before the blocking task */

#define ECHO_BLOCKS 8
#define ECHO_THREADS 32
#define ECHO_PER_THREAD 16
/* A multiple of any power-of-two poller count up to 16. */
#define ECHO_TASKS ((uint64_t)ECHO_BLOCKS * ECHO_THREADS * ECHO_PER_THREAD)
#define ECHO_BYTES 16
#define BLOCK_BOUND_NS 60000000000ll
/* Device waits outlast the handler's bound: a missing steal fails through
 * the blocking task's status, not an echo's timeout. */
#define WAIT_NS 120000000000ll

static int64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

/* Blocks its poller until every echo completed (a safety bound: 60 s). */
static chi_status_t h_block(chi_request_t *req, void *ud) {
  (void)ud;
  req->output_size = 0;
  g_blocking.store(true);
  const int64_t t0 = mono_ns();
  while (g_echoes.load() < ECHO_TASKS) {
    if (mono_ns() - t0 > BLOCK_BOUND_NS) return CHI_ERR_TIMEOUT;
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
  }
  return CHI_OK;
}

static chi_status_t h_echo(chi_request_t *req, void *ud) {
  (void)ud;
  if (req->output_capacity < req->input_size) return CHI_ERR_TOO_LARGE;
  memcpy(req->output, req->input, req->input_size);
  req->output_size = req->input_size;
  g_echoes.fetch_add(1);
  return CHI_OK;
}

/* One thread: the blocking task.  st[0] submit, st[1] wait (the handler's status). */
__global__ void k_block(chi_dev_context_t ctx, chi_method_t m, int32_t *st) {
  chi_future_t f;
  uint32_t n = 0;
  st[0] = chi_dev_submit(&ctx, CHI_ROUTE_CPU, m, NULL, 0, &f);
  st[1] = st[0] == CHI_OK ? chi_dev_wait(&ctx, f, WAIT_NS, NULL, 0, &n) : -100;
}

/* Every thread: ECHO_PER_THREAD echo tasks, one at a time.  cnt[0] wrong
 * results, cnt[1] right ones, cnt[2] first bad status. */
__global__ void k_echoes(chi_dev_context_t ctx, chi_method_t m, unsigned long long *cnt) {
  const uint64_t me = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
  uint8_t in[ECHO_BYTES], out[ECHO_BYTES];
  for (uint32_t i = 0; i < ECHO_PER_THREAD; ++i) {
    gt_fill(in, ECHO_BYTES, me * 1009ull + i);
    chi_future_t f;
    chi_status_t s;
    while ((s = chi_dev_submit(&ctx, CHI_ROUTE_CPU, m, in, ECHO_BYTES, &f)) == CHI_ERR_AGAIN) __nanosleep(1000);
    uint32_t n = 0;
    if (s == CHI_OK) s = chi_dev_wait(&ctx, f, WAIT_NS, out, ECHO_BYTES, &n);
    int ok = s == CHI_OK && n == ECHO_BYTES;
    for (uint32_t b = 0; ok && b < ECHO_BYTES; ++b) ok = out[b] == in[b];
    if (ok) {
      atomicAdd(&cnt[1], 1ull);
    } else if (atomicAdd(&cnt[0], 1ull) == 0) {
      cnt[2] = (unsigned long long)(uint32_t)s;
    }
  }
}

static void test_blocked_poller(void **state) {
  (void)state;
  cudaStream_t sb, se;
  CK(cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&se, cudaStreamNonBlocking));
  g_st[0] = g_st[1] = -1;
  for (int i = 0; i < 3; ++i) g_cnt[i] = 0;
  if (g_parked) {
    /* Quiet past gpu.poller_park_after_us: the group parks, one watching. */
    struct timespec ts = {0, 100000000};
    nanosleep(&ts, NULL);
  }
  k_block<<<1, 1, 0, sb>>>(g_ctx, g_block_method, g_st);
  CK(cudaGetLastError());
  /* The echoes start once a poller is held up by the blocking handler. */
  while (!g_blocking.load()) {
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
  }
  k_echoes<<<ECHO_BLOCKS, ECHO_THREADS, 0, se>>>(g_ctx, g_echo_method, g_cnt);
  CK(cudaGetLastError());
  CK(cudaStreamSynchronize(se));
  CK(cudaStreamSynchronize(sb));
  printf("# %llu echoes right, %llu wrong (first status %llu); blocking task: submit %d, wait %d\n",
         g_cnt[1], g_cnt[0], g_cnt[2], g_st[0], g_st[1]);
  assert_status(CHI_OK, g_st[0]);
  assert_status(CHI_OK, g_st[1]); /* CHI_ERR_TIMEOUT: the echoes behind it waited */
  assert_int_equal(g_cnt[0], 0);
  assert_int_equal(g_cnt[1], ECHO_TASKS);
  assert_int_equal(g_echoes.load(), ECHO_TASKS);
  CK(cudaStreamDestroy(sb));
  CK(cudaStreamDestroy(se));
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  g_parked = argc > 1 && strcmp(argv[1], "parked") == 0;
  if (!gt_have_cuda()) {
    printf("# no CUDA device\n");
    return 77;
  }
  const char *pollers = getenv("CHI_GPU_POLLERS");
  if (!pollers || atoi(pollers) < 2) setenv("CHI_GPU_POLLERS", "4", 1);
  setenv("CHI_GPU_POLLER_STEAL_US", "50", 0);
  if (!g_parked) setenv("CHI_GPU_POLLER_PARK_AFTER_US", "0", 1);
  printf("# CHI_GPU_POLLERS=%s CHI_GPU_POLLER_STEAL_US=%s CHI_GPU_POLLER_PARK_AFTER_US=%s%s\n",
         getenv("CHI_GPU_POLLERS"), getenv("CHI_GPU_POLLER_STEAL_US"),
         getenv("CHI_GPU_POLLER_PARK_AFTER_US") ? getenv("CHI_GPU_POLLER_PARK_AFTER_US") : "(default)",
         g_parked ? ", parked before the blocking task" : "");
  if (cudaHostAlloc((void **)&g_st, 8 * sizeof(int32_t), cudaHostAllocMapped) != cudaSuccess ||
      cudaHostAlloc((void **)&g_cnt, 8 * sizeof(unsigned long long), cudaHostAllocMapped) != cudaSuccess)
    return 1;
  if (int rc = gt_start(&g_rt, &g_ctx)) return rc;
  static GtWatchdog wd;
  wd.start(&g_ctx, 280);
  if (chi_register_handler(g_rt, "test.block_poller", h_block, NULL, &g_block_method) != CHI_OK ||
      chi_register_handler(g_rt, "test.counted_echo", h_echo, NULL, &g_echo_method) != CHI_OK)
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_blocked_poller),
  };
  int failed = chi_test_run("gpu_poller_steal", tests);
  wd.stop();
  failed += gt_finalize(g_rt);
  cudaFreeHost(g_st);
  cudaFreeHost(g_cnt);
  return failed ? 1 : 0;
}

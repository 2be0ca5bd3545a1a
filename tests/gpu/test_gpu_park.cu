/*
 * Parked GPUs (docs/gpu.md, "Parked GPUs"), embedded, with a short
 * keep-alive (gpu.keep_alive_us: 2000) and a user orchestrator whose handler
 * submits to the CPU and waits:
 *   - an idle GPU parks, and while parked nothing is launched;
 *   - the first task starts it again, and its result is right;
 *   - four threads hammer park and start with bursts of tasks separated by
 *     gaps longer and shorter than the keep-alive, every round starting
 *     from a parked GPU: echo tasks of random sizes, tasks whose device
 *     handler submits GPU->CPU and waits (the GPU->CPU pollers asleep on a
 *     parked GPU must serve them), released tasks; every result is checked;
 *   - pause and resume of a parked GPU; finalize of a parked GPU;
 *   - chi_gpu_context keeps the GPU from parking from then on.
 * No wall-clock bound: a watchdog aborts with the GPU's state if one phase
 * hangs.  Exit 77 without a usable GPU.
 */
#include "gpu_common.h"

#include <atomic>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

/* park.via_cpu: input {u32 cpu method, u32 pad, u64 x}; lane 0 submits x to
 * the CPU method (GPU->CPU) and waits; output its 8-byte answer. */
__device__ chi_status_t park_via_cpu(chi_dev_request_t *r) {
  if (r->input_size != 16 || r->output_capacity < 8) return CHI_ERR_INVALID;
  chi_status_t st = CHI_OK;
  if (chi_port::lane_id() == 0) {
    const uint8_t *in = (const uint8_t *)r->input;
    uint32_t method = 0;
    memcpy(&method, in, 4);
    chi_future_t f = 0;
    uint32_t n = 0;
    /* Handlers never wait for a slot: retry a bounded number of times. */
    for (int tries = 0; tries < 100000; ++tries) {
      st = chi_dev_submit(r->ctx, CHI_ROUTE_CPU, method, in + 8, 8, &f);
      if (st != CHI_ERR_AGAIN) break;
    }
    if (st == CHI_OK) st = chi_dev_wait(r->ctx, f, GT_WAIT_NS, r->output, 8, &n);
    if (st == CHI_OK && n != 8) st = CHI_ERR_INTERNAL;
  }
  st = __shfl_sync(0xffffffffu, st, 0);
  r->output_size = 8;
  return st;
}

__device__ chi_status_t park_dispatch(uint32_t index, chi_dev_request_t *r) {
  return index == 0 ? park_via_cpu(r) : CHI_ERR_NOT_FOUND;
}

static const char *const kNames[] = {"park.via_cpu"};
CHI_DEFINE_ORCHESTRATOR(park_orchestrator, park_dispatch, kNames, 1)


static chi_runtime_t *g_rt;
static chi_method_t g_inc, g_via_cpu;

/* Aborts with the GPU's state when one phase lasts over `seconds`. */
struct Watchdog {
  std::mutex mu;
  std::string phase = "start";
  std::atomic<int64_t> since{0};
  std::atomic<bool> quit{false};
  std::thread th;
  void start(int64_t seconds) {
    since = (int64_t)gt_realtime_ns();
    th = std::thread([this, seconds] {
      while (!quit.load()) {
        struct timespec ts = {0, 100000000};
        nanosleep(&ts, NULL);
        if ((int64_t)gt_realtime_ns() - since.load() < seconds * 1000000000ll) continue;
        chi_stats_t st;
        memset(&st, 0, sizeof st);
        st.struct_size = sizeof st;
        chi_stats(g_rt, &st);
        std::lock_guard<std::mutex> lock(mu);
        fprintf(stderr, "watchdog: still in '%s' after %lld s; parked mask %llx, launches %llu, parks %llu\n",
                phase.c_str(), (long long)seconds, (unsigned long long)st.gpus_parked,
                (unsigned long long)st.gpu_launches, (unsigned long long)st.gpu_parks);
        abort();
      }
    });
  }
  void enter(const char *what) {
    std::lock_guard<std::mutex> lock(mu);
    phase = what;
    since = (int64_t)gt_realtime_ns();
  }
  void stop() {
    quit = true;
    if (th.joinable()) th.join();
  }
};
static Watchdog g_wd;

static chi_stats_t stats(void) {
  chi_stats_t st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  assert_int_equal(chi_stats(g_rt, &st), CHI_OK);
  return st;
}

static bool parked(void) { return (stats().gpus_parked & 1) != 0; }

/* Waits until GPU 0 parks (the watchdog bounds it). */
static void wait_parked(void) {
  while (!parked()) {
    struct timespec ts = {0, 500000};
    nanosleep(&ts, NULL);
  }
}

static void sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

static void check_echo(uint64_t seed, uint32_t size) {
  std::vector<uint8_t> in(size ? size : 1), out(4096);
  gt_fill(in.data(), size, seed);
  chi_future_t f;
  size_t n = 0;
  assert_int_equal(chi_submit(g_rt, 0, CHI_METHOD_ECHO, in.data(), size, &f), CHI_OK);
  assert_int_equal(chi_wait(g_rt, f, GT_WAIT_NS, out.data(), out.size(), &n), CHI_OK);
  assert_int_equal(n, size);
  assert_memory_equal(out.data(), in.data(), size);
}

static void check_via_cpu(uint64_t x) {
  uint8_t in[16] = {0};
  memcpy(in, &g_inc, 4);
  memcpy(in + 8, &x, 8);
  uint64_t y = 0;
  chi_future_t f;
  size_t n = 0;
  assert_int_equal(chi_submit(g_rt, 0, g_via_cpu, in, sizeof in, &f), CHI_OK);
  chi_status_t s = chi_wait(g_rt, f, GT_WAIT_NS, &y, sizeof y, &n);
  if (s != CHI_OK) fail_msg("park.via_cpu: %s: %s", chi_status_string(s), chi_last_error_message());
  assert_int_equal(n, 8);
  assert_int_equal(y, x + 1);
}

/* Parked, nothing is launched; the first task starts the GPU again. */
static void test_parks_and_starts(void **state) {
  (void)state;
  g_wd.enter("first park");
  wait_parked();
  const chi_stats_t a = stats();
  assert_true(a.gpu_parks >= 1);
  sleep_us(50000);
  const chi_stats_t b = stats();
  assert_int_equal(b.gpu_launches, a.gpu_launches); /* no kernel while parked */
  assert_true(b.gpus_parked & 1);
  g_wd.enter("first task after a park");
  check_echo(1, 64);
  const chi_stats_t c = stats();
  assert_true(c.gpu_launches > b.gpu_launches);
  check_via_cpu(41);
}

/* Threads against the parker: every round starts from a parked GPU. */
static void test_hammer(void **state) {
  (void)state;
  const int threads = 4;
  const int rounds = (int)gt_env_count("CHI_TEST_PARK_ROUNDS", 40);
  std::atomic<uint64_t> done{0};
  const uint64_t parks0 = stats().gpu_parks;
  for (int r = 0; r < rounds; ++r) {
    g_wd.enter("park before a round");
    wait_parked();
    g_wd.enter("round");
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([r, t, &done] {
        std::mt19937 rng((uint32_t)(r * 977 + t));
        for (int i = 0; i < 24; ++i) {
          const uint32_t kind = rng() % 4;
          if (kind == 0) {
            check_via_cpu(((uint64_t)r << 32) | (uint64_t)(t * 1000 + i));
          } else if (kind == 1) {
            /* Released while it may still run: its slot must come back. */
            chi_future_t f;
            uint8_t in[32];
            gt_fill(in, sizeof in, (uint64_t)i);
            assert_int_equal(chi_submit(g_rt, 0, CHI_METHOD_ECHO, in, sizeof in, &f), CHI_OK);
            assert_int_equal(chi_release(g_rt, f), CHI_OK);
          } else {
            check_echo(((uint64_t)r << 40) ^ (uint64_t)(t << 20) ^ (uint64_t)i, rng() % 4097);
          }
          done.fetch_add(1);
          /* Gaps around the 2 ms keep-alive: parks land between tasks. */
          const uint32_t gap = rng() % 6;
          if (gap == 0) sleep_us(1000 + rng() % 4000);
        }
      });
    for (std::thread &th : ts) th.join();
  }
  const chi_stats_t s = stats();
  printf("# %d rounds, %llu tasks, %llu parks, %llu launches\n", rounds, (unsigned long long)done.load(),
         (unsigned long long)(s.gpu_parks - parks0), (unsigned long long)s.gpu_launches);
  assert_true(s.gpu_parks - parks0 >= (uint64_t)rounds);
  assert_int_equal(s.routes[CHI_STATS_GPU].failed, 0);
}

/* Pause and resume of a parked GPU: a task queued while paused runs at resume. */
static void test_pause_parked(void **state) {
  (void)state;
  g_wd.enter("park before pause");
  wait_parked();
  assert_int_equal(chi_gpu_pause(g_rt, 0), CHI_OK);
  assert_false(parked()); /* paused, not parked */
  uint8_t in[8] = {1, 2, 3, 4, 5, 6, 7, 8}, out[8];
  chi_future_t f;
  size_t n = 0;
  assert_int_equal(chi_submit(g_rt, 0, CHI_METHOD_ECHO, in, sizeof in, &f), CHI_OK);
  assert_int_equal(chi_wait(g_rt, f, 0, out, sizeof out, &n), CHI_ERR_TIMEOUT);
  g_wd.enter("resume");
  assert_int_equal(chi_gpu_resume(g_rt, 0), CHI_OK);
  assert_int_equal(chi_wait(g_rt, f, GT_WAIT_NS, out, sizeof out, &n), CHI_OK);
  assert_memory_equal(in, out, sizeof in);
  g_wd.enter("park after resume");
  wait_parked();
}

/* A device context handed out: the GPU stays awake from then on. */
static void test_context_holds(void **state) {
  (void)state;
  g_wd.enter("park before the context");
  wait_parked();
  chi_dev_context_t ctx;
  assert_int_equal(chi_gpu_context(g_rt, 0, &ctx), CHI_OK);
  assert_false(parked());
  const uint64_t parks = stats().gpu_parks;
  sleep_us(50000); /* 25 keep-alives */
  assert_false(parked());
  assert_int_equal(stats().gpu_parks, parks);
  check_echo(7, 100);
}

int main(void) {
  setvbuf(stdout, NULL, _IONBF, 0);
  if (!gt_have_cuda()) return 77;
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.settings = "gpu.keep_alive_us: 2000";
  if (chi_init(&cfg, &g_rt) != CHI_OK) {
    fprintf(stderr, "chi_init: %s\n", chi_last_error_message());
    return 1;
  }
  int32_t count = 0;
  chi_gpu_count(g_rt, &count);
  if (count == 0) {
    chi_finalize(g_rt);
    return 77;
  }
  chi_gpu_orchestrator_t o = park_orchestrator();
  if (chi_register_handler(g_rt, "park.inc", gt_inc_handler, NULL, &g_inc) != CHI_OK ||
      chi_gpu_set_orchestrator(g_rt, -1, &o) != CHI_OK || chi_method_lookup(g_rt, "park.via_cpu", &g_via_cpu) != CHI_OK) {
    fprintf(stderr, "setup: %s\n", chi_last_error_message());
    chi_finalize(g_rt);
    return 1;
  }
  g_wd.start(gt_env_count("CHI_TEST_WATCHDOG_S", 120));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parks_and_starts),
      cmocka_unit_test(test_hammer),
      cmocka_unit_test(test_pause_parked),
      cmocka_unit_test(test_context_holds),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  /* Finalize of a GPU that may be parked. */
  g_wd.enter("finalize");
  chi_status_t s = chi_finalize(g_rt);
  g_wd.stop();
  if (s != CHI_OK) {
    fprintf(stderr, "chi_finalize: %s\n", chi_last_error_message());
    return 1;
  }
  return failed ? 1 : 0;
}

/*
 * Helpers of the GPU test programs (CUDA only): a CUDA status check, payload
 * patterns both sides compute, the device FNV-1a, and the exit-77 rule.
 * Most tests sync their own stream and free memory after chi_finalize, as
 * programs had to with a persistent orchestrator (gpu.lease_us: 0);
 * test_gpu_coexist calls cudaFree and cudaDeviceSynchronize beside the
 * leased one.
 */
#ifndef CHI_TESTS_GPU_COMMON_H
#define CHI_TESTS_GPU_COMMON_H

/* cmocka.h has no C++ linkage guards: include it as C before common.h does. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include "../common.h"

#include <cuda_runtime.h>

#include "chimaera_device.h"
#include "chimaera/device_diag.h"

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t ck_e_ = (x);                                                                   \
    if (ck_e_ != cudaSuccess) fail_msg("%s: %s", #x, cudaGetErrorString(ck_e_));              \
  } while (0)

/* Device timeouts: generous, so a slow sanitizer run still passes, finite, so
 * a broken runtime fails the test instead of hanging the GPU. */
#define GT_WAIT_NS 20000000000ll

/* Byte i of pattern `seed`. */
__host__ __device__ static inline uint8_t gt_byte(uint64_t seed, uint32_t i) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull;
  return (uint8_t)(x >> 56);
}

__host__ __device__ static inline void gt_fill(uint8_t *p, uint32_t n, uint64_t seed) {
  for (uint32_t i = 0; i < n; ++i) p[i] = gt_byte(seed, i);
}

__host__ __device__ static inline uint64_t gt_fnv(const uint8_t *p, uint32_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint32_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

__host__ __device__ static inline uint64_t gt_load64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

/* An unsigned count from the environment (tests scale their work down for
 * sanitizer runs), else `dflt`. */
static inline uint32_t gt_env_count(const char *name, uint32_t dflt) {
  const char *s = getenv(name);
  long v = s ? strtol(s, NULL, 10) : 0;
  return v > 0 ? (uint32_t)v : dflt;
}

/* 0 (exit 77, skipped) unless a CUDA device is there.  Initializes CUDA the
 * way docs/gpu.md asks of programs with an orchestrator: eager module
 * loading, and the context (so every kernel of this program) loaded before
 * chi_init, since loading code later can wait for the persistent kernel. */
static inline int gt_have_cuda(void) {
  setenv("CUDA_MODULE_LOADING", "EAGER", 1);
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0 || cudaFree(0) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return 1;
}

/* chi_init with the built-in configuration (and the environment's
 * settings), then GPU 0's context.  Returns 0; 77 when the runtime found no
 * usable GPU (it is finalized then: the test is skipped); 1 on an error
 * (printed). */
static inline int gt_start(chi_runtime_t **rt, chi_dev_context_t *ctx) {
  chi_config_t cfg;
  chi_config_init(&cfg);
  chi_status_t s = chi_init(&cfg, rt);
  if (s != CHI_OK) {
    fprintf(stderr, "chi_init: %s: %s\n", chi_status_string(s), chi_last_error_message());
    return 1;
  }
  int32_t count = 0;
  chi_gpu_count(*rt, &count);
  if (count == 0) {
    printf("# chimaera found no usable GPU\n");
    chi_finalize(*rt);
    return 77;
  }
  if (chi_gpu_context(*rt, 0, ctx) != CHI_OK) {
    fprintf(stderr, "chi_gpu_context: %s\n", chi_last_error_message());
    return 1;
  }
  return 0;
}

/* chi_finalize: 0, or 1 with the error printed (add it to the failures). */
static inline int gt_finalize(chi_runtime_t *rt) {
  const chi_status_t s = chi_finalize(rt);
  if (s == CHI_OK) return 0;
  fprintf(stderr, "chi_finalize: %s: %s\n", chi_status_string(s), chi_last_error_message());
  return 1;
}

/* ------------------------------------------------ orchestrator state (diag) */

#ifdef __cplusplus
#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

/* The diag words of a GPU (chimaera/device_diag.h, CHI_DIAG_*), host-readable. */
static inline const volatile uint64_t *gt_diag(const chi_dev_context_t *ctx) {
  const chi_dev_ctx_layout_t *l = (const chi_dev_ctx_layout_t *)ctx;
  if (!l->diag) return NULL;
  cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, l->diag) != cudaSuccess || !a.hostPointer) {
    cudaGetLastError();
    return NULL;
  }
  return (const volatile uint64_t *)a.hostPointer;
}

static inline uint64_t gt_realtime_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* One line with every diag word decoded; `now` (host realtime) gives ages.
 * The launch and keeper ages compare %globaltimer stamps with the host's
 * clock: they are off by the clocks' offset (hundreds of us on an H200,
 * device_diag.h); compare them with each other. */
static inline std::string gt_diag_line(const volatile uint64_t *d, uint64_t now) {
  if (!d) return "(no diag words)";
  static const char *const phases[] = CHI_DIAG_PHASE_NAMES;
  static const char *const branches[] = {"-", "queued", "trying", "late"};
  const uint64_t host = d[CHI_DIAG_KEEP_HOST], st = d[CHI_DIAG_KEEP_STATE], end = d[CHI_DIAG_END];
  const uint64_t ph = d[CHI_DIAG_LEASE_PHASE];
  char buf[512];
  snprintf(buf, sizeof buf,
           "lease thread: %s for launch %llu since %.1f us | newest launch %llu started %.1f us ago | "
           "last end: launch %llu (%s) %.1f us ago | keeper of %llu %.1f us ago: host queued %llu trying %llu, "
           "quiet %.1f us, in use %d, %s%s",
           phases[ph < CHI_DIAG_PHASE_COUNT ? ph : 0], (unsigned long long)d[CHI_DIAG_LEASE_N],
           (double)(now - d[CHI_DIAG_LEASE_AT]) / 1e3, (unsigned long long)d[CHI_DIAG_START_EPOCH],
           (double)(int64_t)(now - d[CHI_DIAG_START_AT]) / 1e3, (unsigned long long)(end >> 8),
           (end & 0xFF) == CHI_DIAG_END_STOP ? "stop" : (end & 0xFF) == CHI_DIAG_END_LEASE ? "lease" : "-",
           (double)(int64_t)(now - d[CHI_DIAG_END_AT]) / 1e3, (unsigned long long)d[CHI_DIAG_KEEP_EPOCH],
           (double)(int64_t)(now - d[CHI_DIAG_KEEP_AT]) / 1e3, (unsigned long long)(host >> 32),
           (unsigned long long)(host & 0xFFFFFFFFull), (double)d[CHI_DIAG_KEEP_QUIET] / 1e3, (int)(st & 1),
           branches[((st >> 8) & 0xFF) < 4 ? (st >> 8) & 0xFF : 0], (st >> 16) & 1 ? ", leaving" : "");
  return buf;
}

/* A CPU handler for GPU->CPU tests: the input's first 8 bytes (a uint64) + 1. */
static inline chi_status_t gt_inc_handler(chi_request_t *req, void *) {
  if (req->input_size < 8 || req->output_capacity < 8) return CHI_ERR_INVALID;
  uint64_t x;
  memcpy(&x, req->input, 8);
  ++x;
  memcpy(req->output, &x, 8);
  req->output_size = 8;
  return CHI_OK;
}

/* A watchdog for GPU test programs: if the program is still in one phase
 * after `seconds`, it prints the phase and the orchestrator's state (the
 * diag words: the kernel's last decisions, the lease thread's phase) and
 * aborts, so a hang fails with a reason instead of waiting for ctest's
 * timeout.  CHI_TEST_WATCHDOG_S overrides `seconds`. */
struct GtWatchdog {
  const volatile uint64_t *diag = NULL;
  std::atomic<uint64_t> since{0};
  std::mutex mu;
  std::string phase = "start";
  std::atomic<bool> quit{false};
  std::thread th;
  void start(const chi_dev_context_t *ctx, uint32_t seconds) {
    diag = gt_diag(ctx);
    seconds = gt_env_count("CHI_TEST_WATCHDOG_S", seconds);
    since = gt_realtime_ns();
    th = std::thread([this, seconds] {
      while (!quit.load()) {
        struct timespec ts = {0, 100000000};
        nanosleep(&ts, NULL);
        const uint64_t now = gt_realtime_ns();
        if (now - since.load() < (uint64_t)seconds * 1000000000ull) continue;
        std::lock_guard<std::mutex> lock(mu);
        fprintf(stderr, "watchdog: still in '%s' after %u s; orchestrator: %s\n", phase.c_str(), seconds,
                gt_diag_line(diag, now).c_str());
        fflush(stderr);
        abort();
      }
    });
  }
  void enter(const char *what) {
    std::lock_guard<std::mutex> lock(mu);
    phase = what;
    since = gt_realtime_ns();
  }
  void stop() {
    quit = true;
    if (th.joinable()) th.join();
  }
};
#endif /* __cplusplus */

#endif /* CHI_TESTS_GPU_COMMON_H */

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

#endif /* CHI_TESTS_GPU_COMMON_H */

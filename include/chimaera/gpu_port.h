/*
 * chimaera/gpu_port.h -- the CUDA/HIP differences of chimaera's device code,
 * in one place.  Included by chimaera_device.h; not meant for direct use.
 *
 * Every cross-thread access in chimaera's device code goes through these
 * wrappers, each with an explicit scope: _dev (one GPU: device memory that
 * only that GPU's threads touch) or _sys (memory that a CPU also reads or
 * writes).  Read-modify-writes exist only at device scope: chimaera never
 * does an atomic RMW across PCIe (GPU-NOTES: not coherent with CPU atomics,
 * missing on some platforms).  Host memory is crossed with plain 8- or
 * 16-byte loads and stores of single-writer words ("LL" words: 4 bytes of
 * data and a 4-byte flag written by one 8-byte store, so a reader that sees
 * the flag sees the data too; NCCL's LL protocol relies on the same).
 *
 * CUDA: libcu++ cuda::atomic_ref and inline PTX.  HIP: __hip_atomic_* with
 * __HIP_MEMORY_SCOPE_AGENT / _SYSTEM (compile-checked only, scripts/hip-check.sh).
 */
#ifndef CHIMAERA_GPU_PORT_H
#define CHIMAERA_GPU_PORT_H

#include <stdint.h>

#if defined(__CUDACC__)
#define CHI_GPU_CUDA 1
#include <cuda/atomic>
#include <cuda_runtime.h>
#elif defined(__HIPCC__)
#define CHI_GPU_HIP 1
#include <hip/hip_runtime.h>
#endif

#if defined(CHI_GPU_CUDA) || defined(CHI_GPU_HIP)
#define CHI_DEVICE __device__ __forceinline__
#define CHI_DEVICE_NOINLINE __device__ __noinline__
#define CHI_GPU_COMPILER 1
#else
#define CHI_DEVICE inline
#define CHI_DEVICE_NOINLINE inline
#endif

#if defined(CHI_GPU_COMPILER) && defined(__cplusplus)

#if defined(CHI_GPU_CUDA)
#define CHI_WARP_SIZE 32
typedef cudaStream_t chi_port_stream_t;
/* Peeks, so that the caller can still read (and clear) the launch error. */
#define chi_port_launch_ok() (cudaPeekAtLastError() == cudaSuccess)
#else
#define CHI_WARP_SIZE 64
typedef hipStream_t chi_port_stream_t;
#define chi_port_launch_ok() (hipPeekAtLastError() == hipSuccess)
#endif

namespace chi_port {

#if defined(CHI_GPU_CUDA)

template <class T>
using atom_dev = cuda::atomic_ref<T, cuda::thread_scope_device>;
template <class T>
using atom_sys = cuda::atomic_ref<T, cuda::thread_scope_system>;

template <class T> CHI_DEVICE T ld_relaxed_dev(const T *p) {
  return atom_dev<T>(*const_cast<T *>(p)).load(cuda::memory_order_relaxed);
}
template <class T> CHI_DEVICE T ld_acquire_dev(const T *p) {
  return atom_dev<T>(*const_cast<T *>(p)).load(cuda::memory_order_acquire);
}
template <class T> CHI_DEVICE void st_relaxed_dev(T *p, T v) {
  atom_dev<T>(*p).store(v, cuda::memory_order_relaxed);
}
template <class T> CHI_DEVICE void st_release_dev(T *p, T v) {
  atom_dev<T>(*p).store(v, cuda::memory_order_release);
}
template <class T> CHI_DEVICE T fetch_add_dev(T *p, T v) {
  return atom_dev<T>(*p).fetch_add(v, cuda::memory_order_relaxed);
}
template <class T> CHI_DEVICE T fetch_add_release_dev(T *p, T v) {
  return atom_dev<T>(*p).fetch_add(v, cuda::memory_order_release);
}
template <class T> CHI_DEVICE T fetch_or_acq_rel_dev(T *p, T v) {
  return atom_dev<T>(*p).fetch_or(v, cuda::memory_order_acq_rel);
}
template <class T> CHI_DEVICE T fetch_or_acquire_dev(T *p, T v) {
  return atom_dev<T>(*p).fetch_or(v, cuda::memory_order_acquire);
}
template <class T> CHI_DEVICE T fetch_and_release_dev(T *p, T v) {
  return atom_dev<T>(*p).fetch_and(v, cuda::memory_order_release);
}
/* Fire and forget (a reduction: the thread does not wait for the old value). */
template <class T> CHI_DEVICE void red_xor_dev(T *p, T v) {
  atom_dev<T>(*p).fetch_xor(v, cuda::memory_order_relaxed);
}
template <class T> CHI_DEVICE void red_and_dev(T *p, T v) {
  atom_dev<T>(*p).fetch_and(v, cuda::memory_order_relaxed);
}
/* On failure *expected receives the current value. */
template <class T> CHI_DEVICE bool cas_acq_rel_dev(T *p, T *expected, T desired) {
  return atom_dev<T>(*p).compare_exchange_strong(*expected, desired, cuda::memory_order_acq_rel,
                                                 cuda::memory_order_acquire);
}
/* Arbitration only (the data was acquired before): no fence around it. */
template <class T> CHI_DEVICE bool cas_relaxed_dev(T *p, T *expected, T desired) {
  return atom_dev<T>(*p).compare_exchange_strong(*expected, desired, cuda::memory_order_relaxed,
                                                 cuda::memory_order_relaxed);
}
template <class T> CHI_DEVICE T ld_acquire_sys(const T *p) {
  return atom_sys<T>(*const_cast<T *>(p)).load(cuda::memory_order_acquire);
}
CHI_DEVICE void fence_acquire_dev() {
  cuda::atomic_thread_fence(cuda::memory_order_acquire, cuda::thread_scope_device);
}
CHI_DEVICE void fence_acquire_sys() {
  cuda::atomic_thread_fence(cuda::memory_order_acquire, cuda::thread_scope_system);
}
CHI_DEVICE void fence_release_dev() {
  cuda::atomic_thread_fence(cuda::memory_order_release, cuda::thread_scope_device);
}
/* Orders this thread's earlier stores (to host memory too) before its later ones, as the CPU sees them. */
CHI_DEVICE void fence_sys() { __threadfence_system(); }

/* Host-visible words: volatile accesses, each 8-byte half single-copy atomic. */
CHI_DEVICE uint64_t ll_load8(const uint64_t *p) {
  uint64_t v;
  asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
CHI_DEVICE void ll_load16(const uint64_t *p, uint64_t *a, uint64_t *b) {
  uint64_t x, y;
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(x), "=l"(y) : "l"(p) : "memory");
  *a = x;
  *b = y;
}
/* Two host-visible words with acquire: later loads see what their writer
 * stored before either (each 8-byte half single-copy atomic, as ll_load16).
 * A volatile load issued before it stays in flight beside it. */
CHI_DEVICE void ll_load16_acquire_sys(const uint64_t *p, uint64_t *a, uint64_t *b) {
  uint64_t x, y;
  asm volatile("ld.acquire.sys.global.v2.u64 {%0, %1}, [%2];" : "=l"(x), "=l"(y) : "l"(p) : "memory");
  *a = x;
  *b = y;
}
CHI_DEVICE void ll_store8(uint64_t *p, uint64_t v) {
  asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
CHI_DEVICE void ll_store16(uint64_t *p, uint64_t a, uint64_t b) {
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b) : "memory");
}
/* Device-memory LL words (GPU->GPU slots): relaxed at GPU scope, each
 * 8-byte half single-copy atomic; unlike volatile accesses they need not
 * stay in order with each other. */
CHI_DEVICE uint64_t ll_load8_dev(const uint64_t *p) {
  uint64_t v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
CHI_DEVICE void ll_load16_dev(const uint64_t *p, uint64_t *a, uint64_t *b) {
  uint64_t x, y;
  asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(x), "=l"(y) : "l"(p) : "memory");
  *a = x;
  *b = y;
}
CHI_DEVICE void ll_store8_dev(uint64_t *p, uint64_t v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
CHI_DEVICE void ll_store16_dev(uint64_t *p, uint64_t a, uint64_t b) {
  asm volatile("st.relaxed.gpu.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b) : "memory");
}

CHI_DEVICE uint64_t timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
CHI_DEVICE void nanosleep(uint32_t ns) { __nanosleep(ns); }
CHI_DEVICE uint32_t lane_id() {
  uint32_t l;
  asm("mov.u32 %0, %%laneid;" : "=r"(l));
  return l;
}
typedef uint32_t lanemask_t;
CHI_DEVICE lanemask_t ballot(bool p) { return __ballot_sync(0xFFFFFFFFu, p); }
template <class T> CHI_DEVICE T shfl(T v, int src) { return __shfl_sync(0xFFFFFFFFu, v, src); }
CHI_DEVICE void syncwarp() { __syncwarp(); }
CHI_DEVICE int ffs32(uint32_t v) { return __ffs(static_cast<int>(v)); }
CHI_DEVICE int ffs_mask(lanemask_t m) { return __ffs(static_cast<int>(m)); }
CHI_DEVICE uint32_t popc(lanemask_t m) { return static_cast<uint32_t>(__popc(m)); }
CHI_DEVICE lanemask_t lanes_below(uint32_t lane) { return (1u << lane) - 1u; }

#else /* HIP */

template <class T> CHI_DEVICE T ld_relaxed_dev(const T *p) {
  return __hip_atomic_load(const_cast<T *>(p), __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
template <class T> CHI_DEVICE T ld_acquire_dev(const T *p) {
  return __hip_atomic_load(const_cast<T *>(p), __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_AGENT);
}
template <class T> CHI_DEVICE void st_relaxed_dev(T *p, T v) {
  __hip_atomic_store(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
template <class T> CHI_DEVICE void st_release_dev(T *p, T v) {
  __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_AGENT);
}
template <class T> CHI_DEVICE T fetch_add_dev(T *p, T v) {
  return __hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
template <class T> CHI_DEVICE T fetch_add_release_dev(T *p, T v) {
  return __hip_atomic_fetch_add(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_AGENT);
}
template <class T> CHI_DEVICE T fetch_or_acq_rel_dev(T *p, T v) {
  return __hip_atomic_fetch_or(p, v, __ATOMIC_ACQ_REL, __HIP_MEMORY_SCOPE_AGENT);
}
template <class T> CHI_DEVICE T fetch_or_acquire_dev(T *p, T v) {
  return __hip_atomic_fetch_or(p, v, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_AGENT);
}
template <class T> CHI_DEVICE T fetch_and_release_dev(T *p, T v) {
  return __hip_atomic_fetch_and(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_AGENT);
}
template <class T> CHI_DEVICE void red_xor_dev(T *p, T v) {
  (void)__hip_atomic_fetch_xor(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
template <class T> CHI_DEVICE void red_and_dev(T *p, T v) {
  (void)__hip_atomic_fetch_and(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
template <class T> CHI_DEVICE bool cas_acq_rel_dev(T *p, T *expected, T desired) {
  return __hip_atomic_compare_exchange_strong(p, expected, desired, __ATOMIC_ACQ_REL,
                                              __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_AGENT);
}
template <class T> CHI_DEVICE bool cas_relaxed_dev(T *p, T *expected, T desired) {
  return __hip_atomic_compare_exchange_strong(p, expected, desired, __ATOMIC_RELAXED,
                                              __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
template <class T> CHI_DEVICE T ld_acquire_sys(const T *p) {
  return __hip_atomic_load(const_cast<T *>(p), __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM);
}
CHI_DEVICE void fence_acquire_dev() { __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "agent"); }
CHI_DEVICE void fence_acquire_sys() { __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, ""); }
CHI_DEVICE void fence_release_dev() { __builtin_amdgcn_fence(__ATOMIC_RELEASE, "agent"); }
CHI_DEVICE void fence_sys() { __threadfence_system(); }

CHI_DEVICE uint64_t ll_load8(const uint64_t *p) {
  return __hip_atomic_load(const_cast<uint64_t *>(p), __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
}
CHI_DEVICE void ll_load16(const uint64_t *p, uint64_t *a, uint64_t *b) {
  *a = ll_load8(p);
  *b = ll_load8(p + 1);
}
CHI_DEVICE void ll_load16_acquire_sys(const uint64_t *p, uint64_t *a, uint64_t *b) {
  *a = __hip_atomic_load(const_cast<uint64_t *>(p), __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM);
  *b = ll_load8(p + 1);
}
CHI_DEVICE void ll_store8(uint64_t *p, uint64_t v) {
  __hip_atomic_store(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
}
CHI_DEVICE void ll_store16(uint64_t *p, uint64_t a, uint64_t b) {
  ll_store8(p, a);
  ll_store8(p + 1, b);
}
CHI_DEVICE uint64_t ll_load8_dev(const uint64_t *p) {
  return __hip_atomic_load(const_cast<uint64_t *>(p), __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
CHI_DEVICE void ll_load16_dev(const uint64_t *p, uint64_t *a, uint64_t *b) {
  *a = ll_load8_dev(p);
  *b = ll_load8_dev(p + 1);
}
CHI_DEVICE void ll_store8_dev(uint64_t *p, uint64_t v) {
  __hip_atomic_store(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
CHI_DEVICE void ll_store16_dev(uint64_t *p, uint64_t a, uint64_t b) {
  ll_store8_dev(p, a);
  ll_store8_dev(p + 1, b);
}

/* s_memrealtime counts at 100 MHz on the gfx9 family. */
CHI_DEVICE uint64_t timer_ns() { return __builtin_amdgcn_s_memrealtime() * 10u; }
/* s_sleep takes a constant: about 64 clocks per unit. */
CHI_DEVICE void nanosleep(uint32_t ns) {
  if (ns >= 1024) __builtin_amdgcn_s_sleep(15);
  else if (ns >= 256) __builtin_amdgcn_s_sleep(4);
  else __builtin_amdgcn_s_sleep(1);
}
CHI_DEVICE uint32_t lane_id() { return __lane_id(); }
typedef uint64_t lanemask_t;
CHI_DEVICE lanemask_t ballot(bool p) { return __ballot(p); }
template <class T> CHI_DEVICE T shfl(T v, int src) { return __shfl(v, src); }
CHI_DEVICE void syncwarp() { __builtin_amdgcn_wave_barrier(); }
CHI_DEVICE int ffs32(uint32_t v) { return __ffs(v); }
CHI_DEVICE int ffs_mask(lanemask_t m) { return __ffsll(static_cast<unsigned long long>(m)); }
CHI_DEVICE uint32_t popc(lanemask_t m) { return static_cast<uint32_t>(__popcll(m)); }
CHI_DEVICE lanemask_t lanes_below(uint32_t lane) { return (static_cast<uint64_t>(1) << lane) - 1u; }

#endif

}  // namespace chi_port

#endif /* CHI_GPU_COMPILER && __cplusplus */

#endif /* CHIMAERA_GPU_PORT_H */

// <cuda_runtime.h> of the HIP build (-DCHI_ENABLE_HIP=ON): chimaera's CUDA
// test programs and examples are compiled by hipcc unchanged, with the CUDA
// runtime names they use mapped to HIP here (on top of gpu/cuda_api.h, the
// library's own list).  gpu/CMakeLists.txt (chi_hip_target) puts this
// directory on their include path; nothing else includes it.
#pragma once

#include <hip/hip_runtime.h>

#include "chimaera/gpu_port.h"
#include "gpu/cuda_api.h"

#define cudaMemcpy hipMemcpy
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define cudaMemset hipMemset
#define cudaDeviceSynchronize hipDeviceSynchronize
#define cudaMallocHost(ptr, size) hipHostMalloc((ptr), (size), hipHostMallocDefault)
#define cudaDeviceProp hipDeviceProp_t
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaFuncAttributes hipFuncAttributes
#define cudaEventCreate hipEventCreate
#define cudaEventElapsedTime hipEventElapsedTime
// HIP takes the symbol's address where CUDA takes the symbol.
#define cudaMemcpyToSymbolAsync(sym, src, n, off, kind, stream) \
  hipMemcpyToSymbolAsync(HIP_SYMBOL(sym), (src), (n), (off), (kind), (stream))
#define cudaMemcpyFromSymbolAsync(dst, sym, n, off, kind, stream) \
  hipMemcpyFromSymbolAsync((dst), HIP_SYMBOL(sym), (n), (off), (kind), (stream))

// CUDA's runtime takes the kernel itself; HIP's takes its address.
template <class F>
static inline hipError_t cudaFuncGetAttributes(hipFuncAttributes *attr, F *kernel) {
  return hipFuncGetAttributes(attr, reinterpret_cast<const void *>(kernel));
}

// Device functions of CUDA that HIP 5.2 lacks.  A wavefront is 64 lanes and
// runs in lockstep: the 32-bit lane masks of the CUDA code name the whole
// wavefront's vote here.
static __device__ inline void __nanosleep(unsigned ns) { chi_port::nanosleep(ns); }
static __device__ inline int __any_sync(unsigned, int pred) { return __any(pred); }
static __device__ inline void __syncwarp() { chi_port::syncwarp(); }

// The GPU handler of test_gpu_client's device memory module
// (client_mem_module.c): "test.gpu_mem_sum" runs in the server's
// orchestrator, takes a chi_mem_ref_t to device memory a client registered
// (chi_register_gpu_mem in a client), resolves it with chi_dev_mem_resolve
// through the server's device region table and answers the FNV-1a 64 of those
// bytes, read by the handler from the server's mapping of the client's
// allocation.  A reference the table refuses answers the resolve's status.
// "test.gpu_mem_hold" keeps reading a client's range for a while, and
// client_mem_module_touch is the kernel of the CPU handler test.mem_hold.
#include <string.h>

#include <cuda_runtime.h>

#include "chimaera.h"
#include "chimaera_device.h"

namespace {

__device__ chi_status_t gpu_mem_sum(chi_dev_request_t *req) {
  if (chi_port::lane_id() != 0) return CHI_OK; /* lane 0's status and output_size count */
  chi_mem_ref_t ref;
  if (req->input_size != sizeof ref || req->output_capacity < 8u) return CHI_ERR_INVALID;
  memcpy(&ref, req->input, sizeof ref);
  void *p = nullptr;
  const chi_status_t s = chi_dev_mem_resolve(req->ctx, &ref, &p);
  if (s != CHI_OK) return s;
  if (ref.length > (1u << 20)) return -1001; /* keep the warp's time short */
  const uint8_t *b = static_cast<const uint8_t *>(p);
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint64_t i = 0; i < ref.length; ++i) {
    h ^= b[i];
    h *= 0x100000001b3ull;
  }
  memcpy(req->output, &h, 8);
  req->output_size = 8;
  return CHI_OK;
}

/* Bytes [8, n) summed, and `pass` written to bytes [0, 8): the client sees
 * there that a handler is at work on its memory. */
__device__ uint64_t touch(uint8_t *p, uint64_t n, uint64_t pass) {
  *reinterpret_cast<volatile uint64_t *>(p) = pass;
  __threadfence_system();
  uint64_t sum = 0;
  for (uint64_t i = 8; i < n; ++i) sum += static_cast<volatile uint8_t *>(p)[i];
  return sum;
}

/* test.gpu_mem_hold: {chi_mem_ref_t, uint64_t ns}: touches the client's
 * range over and over for ns (a handler still at work when its client
 * dies: test_gpu_client's mem-kill case); answers the sum, or -1003 when a
 * pass read other bytes than the first. */
__device__ chi_status_t gpu_mem_hold(chi_dev_request_t *req) {
  if (chi_port::lane_id() != 0) return CHI_OK;
  struct { chi_mem_ref_t ref; uint64_t ns; } a;
  if (req->input_size != sizeof a || req->output_capacity < 8u) return CHI_ERR_INVALID;
  memcpy(&a, req->input, sizeof a);
  void *p = nullptr;
  const chi_status_t s = chi_dev_mem_resolve(req->ctx, &a.ref, &p);
  if (s != CHI_OK) return s;
  if (a.ref.length < 16 || a.ref.length > (1u << 16)) return -1001;
  const uint64_t t0 = chi_port::timer_ns();
  uint64_t first = 0;
  for (uint64_t pass = 1; pass == 1 || chi_port::timer_ns() - t0 < a.ns; ++pass) {
    const uint64_t sum = touch(static_cast<uint8_t *>(p), a.ref.length, pass);
    if (pass == 1) first = sum;
    else if (sum != first) return -1003;
    chi_port::nanosleep(10000);
  }
  memcpy(req->output, &first, 8);
  req->output_size = 8;
  return CHI_OK;
}

__device__ chi_status_t mem_dispatch(uint32_t index, chi_dev_request_t *req) {
  switch (index) {
    case 0: return gpu_mem_sum(req);
    case 1: return gpu_mem_hold(req);
  }
  return CHI_ERR_NOT_FOUND;
}

const char *const kMethods[] = {"test.gpu_mem_sum", "test.gpu_mem_hold"};

__global__ void k_touch(uint8_t *p, uint64_t n, uint64_t pass, uint64_t *sum) { *sum = touch(p, n, pass); }

uint64_t *g_sum; /* device memory for k_touch's answer */

}  // namespace

CHI_DEFINE_ORCHESTRATOR(client_mem_orchestrator, mem_dispatch, kMethods, 2)

/* test.mem_hold's kernel (client_mem_module.c): one touch of [p, p + n) on
 * `stream`, waited for.  0, or the CUDA error. */
extern "C" int client_mem_module_touch(void *p, uint64_t n, uint64_t pass, uint64_t *sum, cudaStream_t stream) {
  if (!g_sum) {
    const cudaError_t e = cudaMalloc(&g_sum, sizeof *g_sum);
    if (e != cudaSuccess) return e;
  }
  k_touch<<<1, 1, 0, stream>>>(static_cast<uint8_t *>(p), n, pass, g_sum);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaMemcpyAsync(sum, g_sum, sizeof *sum, cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  return e;
}

extern "C" chi_status_t client_mem_module_install_gpu(chi_runtime_t *rt) {
  const chi_gpu_orchestrator_t orch = client_mem_orchestrator();
  return chi_gpu_set_orchestrator(rt, -1, &orch);
}

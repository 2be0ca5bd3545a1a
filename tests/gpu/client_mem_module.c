/*
 * A module for test_gpu_client's device memory case, loaded by its
 * chimaera-server: "test.memsum" takes a chi_mem_ref_t to device memory a
 * client registered (chi_register_gpu_mem in a client), resolves it in the
 * server and answers the FNV-1a 64 of those bytes (read with cudaMemcpy on
 * a stream of its own: the server maps the client's allocation).
 * "test.gpu_mem_sum" (client_mem_module_gpu.cu) answers the same from the
 * server's orchestrator: a GPU handler that resolves the reference with
 * chi_dev_mem_resolve.
 */
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "chimaera.h"

chi_status_t client_mem_module_install_gpu(chi_runtime_t *rt); /* client_mem_module_gpu.cu */

static chi_runtime_t *g_rt;
static cudaStream_t g_stream;

static chi_status_t memsum(chi_request_t *req, void *user_data) {
  (void)user_data;
  chi_mem_ref_t ref;
  if (req->input_size != sizeof ref || req->output_capacity < 8) return CHI_ERR_INVALID;
  memcpy(&ref, req->input, sizeof ref);
  void *p = NULL;
  int32_t gpu = CHI_ROUTE_CPU;
  chi_status_t s = chi_mem_resolve(g_rt, &ref, &p, &gpu);
  if (s != CHI_OK) return s;
  if (!g_stream) return CHI_ERR_NO_DEVICE;
  if (gpu < 0 || ref.length > (1u << 20)) return -1001;
  unsigned char *buf = malloc(ref.length ? ref.length : 1);
  if (!buf) return CHI_ERR_NOMEM;
  cudaError_t e = cudaMemcpyAsync(buf, p, ref.length, cudaMemcpyDeviceToHost, g_stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(g_stream);
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint64_t i = 0; i < ref.length; ++i) {
    h ^= buf[i];
    h *= 0x100000001b3ull;
  }
  free(buf);
  if (e != cudaSuccess) return -1002;
  memcpy(req->output, &h, 8);
  req->output_size = 8;
  return CHI_OK;
}

__attribute__((visibility("default"))) chi_status_t chimaera_module_init(chi_runtime_t *rt, uint32_t version) {
  (void)version;
  g_rt = rt;
  /* Without a GPU the module still loads (test_gpu_client then exits 77). */
  if (cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking) != cudaSuccess) g_stream = NULL;
  chi_status_t s = chi_register_handler(rt, "test.memsum", memsum, NULL, NULL);
  int32_t gpus = 0;
  if (s == CHI_OK && chi_gpu_count(rt, &gpus) == CHI_OK && gpus > 0) s = client_mem_module_install_gpu(rt);
  return s;
}

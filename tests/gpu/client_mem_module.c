/*
 * A module for test_gpu_client's device memory case, loaded by its
 * chimaera-server: "test.memsum" takes a chi_mem_ref_t to device memory a
 * client registered (chi_register_gpu_mem in a client), resolves it in the
 * server and answers the FNV-1a 64 of those bytes (read with cudaMemcpy on
 * a stream of its own: the server maps the client's allocation).
 * "test.gpu_mem_sum" (client_mem_module_gpu.cu) answers the same from the
 * server's orchestrator: a GPU handler that resolves the reference with
 * chi_dev_mem_resolve.  "test.mem_hold" and "test.gpu_mem_hold" keep
 * reading a client's range for a while, from a kernel the CPU handler
 * launches and in the orchestrator: handlers at work when their client dies.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "chimaera.h"

chi_status_t client_mem_module_install_gpu(chi_runtime_t *rt); /* client_mem_module_gpu.cu */
int client_mem_module_touch(void *p, uint64_t n, uint64_t pass, uint64_t *sum, cudaStream_t stream);

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

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* test.mem_hold: {chi_mem_ref_t, uint64_t ms}: resolves the client's range
 * once, then runs a kernel that reads it (and writes a pass count into its
 * first 8 bytes, which the client watches) every 2 ms for ms: a handler
 * still at work on a client's memory when the client dies
 * (test_gpu_client's mem-kill case).  Says on stderr (the server's log)
 * when it starts and how it ended; answers the sum of the range's bytes
 * from 8 on, -1002 on a CUDA error, -1003 when a pass read other bytes. */
static chi_status_t mem_hold(chi_request_t *req, void *user_data) {
  (void)user_data;
  struct {
    chi_mem_ref_t ref;
    uint64_t ms;
  } a;
  if (req->input_size != sizeof a || req->output_capacity < 8) return CHI_ERR_INVALID;
  memcpy(&a, req->input, sizeof a);
  void *p = NULL;
  int32_t gpu = CHI_ROUTE_CPU;
  chi_status_t s = chi_mem_resolve(g_rt, &a.ref, &p, &gpu);
  if (s != CHI_OK) return s;
  if (!g_stream) return CHI_ERR_NO_DEVICE;
  if (gpu < 0 || a.ref.length < 16 || a.ref.length > (1u << 16)) return -1001;
  fprintf(stderr, "test.mem_hold: region %#llx: started\n", (unsigned long long)a.ref.region);
  const uint64_t t0 = now_ms();
  uint64_t first = 0, pass = 1;
  int e = 0;
  s = CHI_OK;
  for (; pass == 1 || now_ms() - t0 < a.ms; ++pass) {
    uint64_t sum = 0;
    if ((e = client_mem_module_touch(p, a.ref.length, pass, &sum, g_stream)) != 0) {
      s = -1002;
      break;
    }
    if (pass == 1) first = sum;
    else if (sum != first) {
      s = -1003;
      break;
    }
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
  }
  fprintf(stderr, "test.mem_hold: region %#llx: ended after %llu passes in %llu ms: %s%s\n",
          (unsigned long long)a.ref.region, (unsigned long long)pass, (unsigned long long)(now_ms() - t0),
          s == CHI_OK ? "every read right" : s == -1003 ? "a read changed" : "CUDA error ",
          s == -1002 ? cudaGetErrorString((cudaError_t)e) : "");
  if (s != CHI_OK) return s;
  memcpy(req->output, &first, 8);
  req->output_size = 8;
  return CHI_OK;
}

__attribute__((visibility("default"))) chi_status_t chimaera_module_init(chi_runtime_t *rt, uint32_t version) {
  (void)version;
  g_rt = rt;
  /* Without a GPU the module still loads (test_gpu_client then exits 77). */
  if (cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking) != cudaSuccess) g_stream = NULL;
  chi_status_t s = chi_register_handler(rt, "test.memsum", memsum, NULL, NULL);
  if (s == CHI_OK) s = chi_register_handler(rt, "test.mem_hold", mem_hold, NULL, NULL);
  int32_t gpus = 0;
  if (s == CHI_OK && chi_gpu_count(rt, &gpus) == CHI_OK && gpus > 0) s = client_mem_module_install_gpu(rt);
  return s;
}

/* example_module: a chimaera module with one method, "example.scale".
 *
 *   input   float factor, then float x[n]   (native byte order, 4 + 4n bytes)
 *   output  float y[n], y[i] = factor * x[i]
 *
 * A runtime loads it with chi_load_module, or at start-up from the config
 * key `modules:` (chimaera-server: its methods then serve every client).
 * chimaera_module_init registers the CPU handler; in CUDA builds it also
 * installs a user orchestrator whose GPU handler serves the same method id
 * (example_module_gpu.cu), when the runtime drives at least one GPU.  A
 * runtime has one user orchestrator per GPU: a second module that installs
 * one replaces this one's. */
#include <stdint.h>
#include <string.h>

#include "chimaera.h"

#define EXAMPLE_EXPORT __attribute__((visibility("default")))

#ifdef EXAMPLE_MODULE_GPU
/* example_module_gpu.cu: installs the orchestrator on every GPU. */
chi_status_t example_module_install_gpu(chi_runtime_t *rt);
#endif

/* The CPU handler.  Input and output buffers carry no alignment promise:
 * values are copied in and out. */
static chi_status_t scale_cpu(chi_request_t *req, void *user_data) {
  (void)user_data;
  if (req->input_size < sizeof(float) || req->input_size % sizeof(float) != 0)
    return CHI_ERR_INVALID;
  const size_t n = req->input_size / sizeof(float) - 1;
  if (req->output_capacity < n * sizeof(float)) return CHI_ERR_INVALID;
  const unsigned char *in = (const unsigned char *)req->input;
  unsigned char *out = (unsigned char *)req->output;
  float factor;
  memcpy(&factor, in, sizeof factor);
  for (size_t i = 0; i < n; i++) {
    float x;
    memcpy(&x, in + sizeof(float) * (i + 1), sizeof x);
    x *= factor;
    memcpy(out + sizeof(float) * i, &x, sizeof x);
  }
  req->output_size = n * sizeof(float);
  return CHI_OK;
}

chi_status_t chimaera_module_init(chi_runtime_t *rt, uint32_t chi_version);

EXAMPLE_EXPORT chi_status_t chimaera_module_init(chi_runtime_t *rt, uint32_t chi_version) {
  /* Built against this major version: refuse another. */
  if (chi_version / 10000 != CHI_VERSION_MAJOR) return CHI_ERR_PROTOCOL;
  chi_status_t s = chi_register_handler(rt, "example.scale", scale_cpu, NULL, NULL);
  if (s != CHI_OK) return s;
#ifdef EXAMPLE_MODULE_GPU
  int32_t gpus = 0;
  if (chi_gpu_count(rt, &gpus) == CHI_OK && gpus > 0) {
    s = example_module_install_gpu(rt);
    /* A runtime that cannot drive GPUs itself (a client process, which
     * reports the server's count) keeps the CPU handler only. */
    if (s == CHI_ERR_NO_DEVICE) s = CHI_OK;
  }
#endif
  return s;
}

// The GPU handler of "soak.record" (soak_module.c), served by a user
// orchestrator.  Lane 0 checks the input's padding and checksums it on the
// GPU, then records the id through a GPU->CPU task to the method's CPU
// handler (the ledger lives in a file the CPU maps), and answers
// { id, checksum } only when the CPU answered the same.  So a CPU->GPU or
// GPU->GPU task answered CHI_OK is in the ledger, and a handler run twice
// shows as a duplicate there.  The inner wait is bounded: a reply that does
// not come within 2 s gives SOAK_ERR_INNER (the future released).
#include <string.h>

#include "chimaera.h"
#include "chimaera_device.h"
#include "soak_common.h"

namespace {

constexpr int64_t kInnerWaitNs = 2000000000;

__device__ chi_status_t record_gpu(chi_dev_request_t *req) {
  if (chi_port::lane_id() != 0) return CHI_OK; /* lane 0's status and output_size count */
  if (req->input_size < 8u || req->output_capacity < 16u) return SOAK_ERR_BAD_INPUT;
  const uint8_t *in = static_cast<const uint8_t *>(req->input);
  uint64_t id;
  memcpy(&id, in, 8);
  /* A bad input still goes to the CPU handler, which counts it in the ledger. */
  const uint64_t sum = soak_fnv1a(in, req->input_size);
  chi_future_t f = 0;
  chi_status_t s = chi_dev_submit(req->ctx, CHI_ROUTE_CPU, req->method, in, req->input_size, &f);
  if (s != CHI_OK) return s;
  alignas(16) uint64_t out[2] = {0, 0};
  uint32_t n = 0;
  s = chi_dev_wait(req->ctx, f, kInnerWaitNs, out, sizeof out, &n);
  if (s == CHI_ERR_TIMEOUT || s == CHI_ERR_TOO_LARGE) {
    chi_dev_release(req->ctx, f);
    return s == CHI_ERR_TIMEOUT ? SOAK_ERR_INNER : SOAK_ERR_MISMATCH;
  }
  if (s != CHI_OK) return s;
  if (n != sizeof out || out[0] != id || out[1] != sum) return SOAK_ERR_MISMATCH;
  memcpy(req->output, out, sizeof out);
  req->output_size = sizeof out;
  return CHI_OK;
}

__device__ chi_status_t soak_dispatch(uint32_t index, chi_dev_request_t *req) {
  return index == 0 ? record_gpu(req) : CHI_ERR_NOT_FOUND;
}

const char *const kMethods[] = {SOAK_METHOD};

}  // namespace

CHI_DEFINE_ORCHESTRATOR(soak_orchestrator, soak_dispatch, kMethods, 1)

extern "C" chi_status_t soak_module_install_gpu(chi_runtime_t *rt) {
  const chi_gpu_orchestrator_t orch = soak_orchestrator();
  return chi_gpu_set_orchestrator(rt, -1, &orch);
}

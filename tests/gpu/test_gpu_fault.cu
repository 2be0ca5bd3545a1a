/*
 * A GPU fault contained (docs/reliability.md, "GPU faults"): a device handler
 * that traps (argv[1] "trap") or reads an unmapped address ("oob") loses the
 * process's CUDA context.  The runtime must notice (the leased orchestrator's
 * launch reports the fault), answer the faulting task and every CPU->GPU task
 * still pending with CHI_ERR_INTERNAL and a message (not a timeout), refuse
 * new GPU tasks the same way, and keep its CPU routes working; chi_finalize
 * returns.  Exit 77 without a usable GPU.  After the fault this process makes
 * no CUDA call of its own: the context is gone.
 */
#include "gpu_common.h"

#include <chrono>

/* fault.trap: the kernel traps.  fault.oob: it reads an address nobody mapped. */
__device__ chi_status_t fault_dispatch(uint32_t index, chi_dev_request_t *r) {
  r->output_size = 0;
  if (chi_port::lane_id() != 0) return CHI_OK;
  if (index == 0) __trap();
  if (index == 1) {
    const volatile uint32_t *p = reinterpret_cast<const volatile uint32_t *>(uintptr_t(0x10));
    r->output_size = *p == 12345u ? 0u : 0u;
  }
  return CHI_OK;
}
static const char *const kNames[] = {"fault.trap", "fault.oob"};
CHI_DEFINE_ORCHESTRATOR(fault_orchestrator, fault_dispatch, kNames, 2)

static chi_status_t h_upper(chi_request_t *req, void *ud) {
  (void)ud;
  if (req->input_size > req->output_capacity) return CHI_ERR_TOO_LARGE;
  const char *in = (const char *)req->input;
  char *out = (char *)req->output;
  for (size_t i = 0; i < req->input_size; ++i) out[i] = (in[i] >= 'a' && in[i] <= 'z') ? in[i] - 32 : in[i];
  req->output_size = req->input_size;
  return CHI_OK;
}

#define CHECK(cond, ...)                          \
  do {                                            \
    if (!(cond)) {                                \
      fprintf(stderr, "FAIL: " __VA_ARGS__);      \
      fprintf(stderr, "\n");                      \
      ++failed;                                   \
    }                                             \
  } while (0)

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  const char *kind = argc > 1 ? argv[1] : "trap";
  if (!gt_have_cuda()) return 77;
  chi_config_t cfg;
  chi_config_init(&cfg);
  chi_runtime_t *rt = NULL;
  if (chi_init(&cfg, &rt) != CHI_OK) {
    fprintf(stderr, "chi_init: %s\n", chi_last_error_message());
    return 1;
  }
  int32_t count = 0;
  chi_gpu_count(rt, &count);
  if (count == 0) {
    chi_finalize(rt);
    return 77;
  }
  int failed = 0;
  chi_gpu_orchestrator_t o = fault_orchestrator();
  chi_method_t fault = 0, upper = 0;
  if (chi_gpu_set_orchestrator(rt, 0, &o) != CHI_OK ||
      chi_method_lookup(rt, strcmp(kind, "oob") ? "fault.trap" : "fault.oob", &fault) != CHI_OK ||
      chi_register_handler(rt, "fault.upper", h_upper, NULL, &upper) != CHI_OK) {
    fprintf(stderr, "set-up: %s\n", chi_last_error_message());
    chi_finalize(rt);
    return 1;
  }
  uint8_t in[64], out[64];
  gt_fill(in, 64, 3);
  size_t n = 0;
  chi_future_t f, pending[8];
  /* Sane before the fault. */
  CHECK(chi_submit(rt, 0, CHI_METHOD_ECHO, in, 64, &f) == CHI_OK, "submit before the fault");
  CHECK(chi_wait(rt, f, GT_WAIT_NS, out, 64, &n) == CHI_OK && memcmp(in, out, 64) == 0, "echo before the fault");

  /* The fault, and tasks queued behind it. */
  CHECK(chi_submit(rt, 0, fault, NULL, 0, &f) == CHI_OK, "submit of the faulting task");
  int npending = 0;
  for (int i = 0; i < 8; ++i)
    if (chi_submit(rt, 0, CHI_METHOD_ECHO, in, 64, &pending[npending]) == CHI_OK) ++npending;
  auto t0 = std::chrono::steady_clock::now();
  chi_status_t s = chi_wait(rt, f, GT_WAIT_NS, out, 64, &n);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  printf("# %s: the faulting task's wait: %s after %.1f ms: %s\n", kind, chi_status_string(s), ms,
         chi_last_error_message());
  CHECK(s == CHI_ERR_INTERNAL, "the faulting task's wait gave %s, want CHI_ERR_INTERNAL", chi_status_string(s));
  CHECK(strstr(chi_last_error_message(), "failed") != NULL, "no reason in '%s'", chi_last_error_message());
  int ran = 0, refused = 0;
  for (int i = 0; i < npending; ++i) {
    s = chi_wait(rt, pending[i], GT_WAIT_NS, out, 64, &n);
    if (s == CHI_OK) ++ran;
    else if (s == CHI_ERR_INTERNAL) ++refused;
    else CHECK(0, "pending task %d: %s: %s", i, chi_status_string(s), chi_last_error_message());
  }
  printf("# %s: %d CPU->GPU task(s) pending at the fault: %d ran before it, %d answered CHI_ERR_INTERNAL\n",
         kind, npending, ran, refused);
  s = chi_submit(rt, 0, CHI_METHOD_ECHO, in, 64, &f);
  CHECK(s == CHI_ERR_INTERNAL, "a new GPU task gave %s, want CHI_ERR_INTERNAL", chi_status_string(s));

  /* CPU routes go on. */
  const char *word = "contained";
  char up[16] = {0};
  CHECK(chi_submit(rt, CHI_ROUTE_CPU, upper, word, strlen(word), &f) == CHI_OK, "CPU submit after the fault");
  CHECK(chi_wait(rt, f, GT_WAIT_NS, up, sizeof up, &n) == CHI_OK && n == strlen(word) && !memcmp(up, "CONTAINED", n),
        "CPU task after the fault");
  CHECK(chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ECHO, in, 64, &f) == CHI_OK &&
            chi_wait(rt, f, GT_WAIT_NS, out, 64, &n) == CHI_OK && memcmp(in, out, 64) == 0,
        "CPU echo after the fault");
  s = chi_finalize(rt);
  printf("# %s: chi_finalize: %s%s%s\n", kind, chi_status_string(s), s == CHI_OK ? "" : ": ",
         s == CHI_OK ? "" : chi_last_error_message());
  printf("# %s: %s\n", kind, failed ? "FAILED" : "contained");
  return failed ? 1 : 0;
}

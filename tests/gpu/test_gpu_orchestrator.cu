/*
 * A user orchestrator made with CHI_DEFINE_ORCHESTRATOR in this file: its
 * methods run from host and device submitters, built-in methods keep working,
 * unknown methods give CHI_ERR_NOT_FOUND, bad orchestrators are refused.
 * Exit 77 without a usable GPU.
 */
#include "gpu_common.h"

/* user.scale: every little-endian uint32 of the input times 3, all lanes at work. */
__device__ chi_status_t user_scale(chi_dev_request_t *r) {
  const uint32_t lane = chi_port::lane_id();
  if (r->input_size % 4 != 0) return CHI_ERR_INVALID;
  const uint32_t *in = (const uint32_t *)r->input;
  uint32_t *out = (uint32_t *)r->output;
  for (uint32_t i = lane; i < r->input_size / 4; i += 32) out[i] = in[i] * 3u;
  r->output_size = r->input_size;
  return CHI_OK;
}

/* user.fail: a handler-defined status, passed through unchanged. */
__device__ chi_status_t user_fail(chi_dev_request_t *r) {
  r->output_size = 0;
  return CHI_ERR_USER_BASE - 7;
}

/* user.source: where the task came from and which method id it had. */
__device__ chi_status_t user_source(chi_dev_request_t *r) {
  if (r->output_capacity < 8) return CHI_ERR_TOO_LARGE;
  int32_t v[2] = {r->source, (int32_t)r->method};
  if (chi_port::lane_id() == 0) memcpy(r->output, v, 8);
  r->output_size = 8;
  return CHI_OK;
}

/* user.overflow: claims more output than it may write: CHI_ERR_INTERNAL. */
__device__ chi_status_t user_overflow(chi_dev_request_t *r) {
  r->output_size = r->output_capacity + 1;
  return CHI_OK;
}

__device__ chi_status_t user_dispatch(uint32_t index, chi_dev_request_t *r) {
  switch (index) {
    case 0: return user_scale(r);
    case 1: return user_fail(r);
    case 2: return user_source(r);
    case 3: return user_overflow(r);
  }
  return CHI_ERR_NOT_FOUND;
}

static const char *const kNames[] = {"user.scale", "user.fail", "user.source", "user.overflow"};
CHI_DEFINE_ORCHESTRATOR(test_orchestrator, user_dispatch, kNames, 4)

static const char *const kBuiltinName[] = {"chi.echo"};
CHI_DEFINE_ORCHESTRATOR(clashing_orchestrator, user_dispatch, kBuiltinName, 1)

static chi_runtime_t *g_rt;
static chi_dev_context_t g_ctx;
static cudaStream_t g_stream;
static int32_t *g_st;
static chi_method_t g_scale, g_fail, g_source, g_overflow, g_cpu_only;

static chi_status_t h_cpu_only(chi_request_t *req, void *ud) {
  (void)ud;
  req->output_size = 0;
  return CHI_OK;
}

/* One thread submits each user method over CHI_ROUTE_LOCAL. */
__global__ void k_local(chi_dev_context_t ctx, chi_method_t scale, chi_method_t fail,
                        chi_method_t source, chi_method_t cpu_only, int32_t *st) {
  uint32_t in[16], out[16], n = 0;
  for (int i = 0; i < 16; ++i) in[i] = 1000u + i;
  chi_future_t f;
  st[0] = chi_dev_submit(&ctx, CHI_ROUTE_LOCAL, scale, in, sizeof in, &f);
  st[1] = chi_dev_wait(&ctx, f, GT_WAIT_NS, out, sizeof out, &n);
  int ok = n == sizeof in;
  for (int i = 0; i < 16; ++i) ok = ok && out[i] == 3u * in[i];
  st[2] = ok;
  st[3] = chi_dev_submit(&ctx, CHI_ROUTE_LOCAL, fail, NULL, 0, &f);
  st[4] = chi_dev_wait(&ctx, f, GT_WAIT_NS, out, sizeof out, &n);
  st[5] = chi_dev_submit(&ctx, CHI_ROUTE_LOCAL, source, NULL, 0, &f);
  st[6] = chi_dev_wait(&ctx, f, GT_WAIT_NS, out, sizeof out, &n);
  st[7] = (int32_t)out[0]; /* source: GPU 0 */
  st[8] = (int32_t)out[1]; /* method id */
  st[9] = chi_dev_submit(&ctx, CHI_ROUTE_LOCAL, cpu_only, NULL, 0, &f);
  st[10] = chi_dev_wait(&ctx, f, GT_WAIT_NS, out, sizeof out, &n); /* NOT_FOUND */
  st[11] = chi_dev_submit(&ctx, CHI_ROUTE_LOCAL, CHI_METHOD_ECHO, in, sizeof in, &f);
  st[12] = chi_dev_wait(&ctx, f, GT_WAIT_NS, out, sizeof out, &n);
  st[13] = n == sizeof in && out[5] == in[5];
}

static void test_host_routes(void **state) {
  (void)state;
  uint32_t in[256], out[256];
  for (int i = 0; i < 256; ++i) in[i] = 7u * i + 1;
  chi_future_t f;
  size_t n = 0;
  assert_status(CHI_OK, chi_submit(g_rt, 0, g_scale, in, sizeof in, &f));
  assert_status(CHI_OK, chi_wait(g_rt, f, GT_WAIT_NS, out, sizeof out, &n));
  assert_int_equal(n, sizeof in);
  for (int i = 0; i < 256; ++i) assert_int_equal(out[i], 3u * in[i]);
  assert_status(CHI_OK, chi_submit(g_rt, 0, g_fail, NULL, 0, &f));
  assert_status(CHI_ERR_USER_BASE - 7, chi_wait(g_rt, f, GT_WAIT_NS, out, sizeof out, &n));
  int32_t v[2];
  assert_status(CHI_OK, chi_submit(g_rt, 0, g_source, NULL, 0, &f));
  assert_status(CHI_OK, chi_wait(g_rt, f, GT_WAIT_NS, v, sizeof v, &n));
  assert_int_equal(v[0], CHI_ROUTE_CPU);
  assert_int_equal(v[1], (int32_t)g_source);
  assert_status(CHI_OK, chi_submit(g_rt, 0, g_overflow, NULL, 0, &f));
  assert_status(CHI_ERR_INTERNAL, chi_wait(g_rt, f, GT_WAIT_NS, out, sizeof out, &n));
  /* Built-ins still served; a CPU-only method is not. */
  assert_status(CHI_OK, chi_submit(g_rt, 0, CHI_METHOD_ECHO, in, 64, &f));
  assert_status(CHI_OK, chi_wait(g_rt, f, GT_WAIT_NS, out, sizeof out, &n));
  assert_memory_equal(in, out, 64);
  assert_status(CHI_OK, chi_submit(g_rt, 0, g_cpu_only, in, 64, &f));
  assert_status(CHI_ERR_NOT_FOUND, chi_wait(g_rt, f, GT_WAIT_NS, out, sizeof out, &n));
  /* The names are methods now, and only GPU ones: the CPU route says so. */
  chi_method_t id = 0;
  assert_status(CHI_OK, chi_method_lookup(g_rt, "user.scale", &id));
  assert_int_equal(id, g_scale);
  assert_status(CHI_OK, chi_submit(g_rt, CHI_ROUTE_CPU, g_scale, in, 64, &f));
  assert_status(CHI_ERR_NOT_FOUND, chi_wait(g_rt, f, GT_WAIT_NS, out, sizeof out, &n));
}

static void test_device_route(void **state) {
  (void)state;
  memset(g_st, 0x7F, 32 * sizeof(int32_t));
  k_local<<<1, 1, 0, g_stream>>>(g_ctx, g_scale, g_fail, g_source, g_cpu_only, g_st);
  CK(cudaGetLastError());
  CK(cudaStreamSynchronize(g_stream));
  assert_status(CHI_OK, g_st[0]);
  assert_status(CHI_OK, g_st[1]);
  assert_int_equal(g_st[2], 1);
  assert_status(CHI_OK, g_st[3]);
  assert_status(CHI_ERR_USER_BASE - 7, g_st[4]);
  assert_status(CHI_OK, g_st[6]);
  assert_int_equal(g_st[7], 0);
  assert_int_equal(g_st[8], (int32_t)g_source);
  assert_status(CHI_OK, g_st[9]);
  assert_status(CHI_ERR_NOT_FOUND, g_st[10]);
  assert_status(CHI_OK, g_st[12]);
  assert_int_equal(g_st[13], 1);
}

static void test_replace_and_refuse(void **state) {
  (void)state;
  /* Setting it again (same names) keeps the ids; paused, it starts at resume. */
  chi_gpu_orchestrator_t o = test_orchestrator();
  assert_status(CHI_OK, chi_gpu_pause(g_rt, 0));
  assert_status(CHI_OK, chi_gpu_set_orchestrator(g_rt, -1, &o));
  chi_future_t f;
  uint32_t in[4] = {1, 2, 3, 4}, out[4];
  size_t n = 0;
  assert_status(CHI_OK, chi_submit(g_rt, 0, g_scale, in, sizeof in, &f));
  assert_status(CHI_ERR_TIMEOUT, chi_wait(g_rt, f, 1000000, out, sizeof out, &n));
  assert_status(CHI_OK, chi_gpu_resume(g_rt, 0));
  assert_status(CHI_OK, chi_wait(g_rt, f, GT_WAIT_NS, out, sizeof out, &n));
  assert_int_equal(out[3], 12);
  chi_method_t id;
  assert_status(CHI_OK, chi_method_lookup(g_rt, "user.scale", &id));
  assert_int_equal(id, g_scale);
  /* Refused: a built-in's name, NULL launcher, bad struct size. */
  chi_gpu_orchestrator_t bad = clashing_orchestrator();
  assert_status(CHI_ERR_INVALID, chi_gpu_set_orchestrator(g_rt, 0, &bad));
  assert_has_message();
  bad = test_orchestrator();
  bad.launch = NULL;
  assert_status(CHI_ERR_INVALID, chi_gpu_set_orchestrator(g_rt, 0, &bad));
  bad = test_orchestrator();
  bad.struct_size = 4;
  assert_status(CHI_ERR_INVALID, chi_gpu_set_orchestrator(g_rt, 0, &bad));
  assert_status(CHI_ERR_INVALID, chi_gpu_set_orchestrator(g_rt, 0, NULL));
  /* Still served after the refusals. */
  assert_status(CHI_OK, chi_submit(g_rt, 0, g_scale, in, sizeof in, &f));
  assert_status(CHI_OK, chi_wait(g_rt, f, GT_WAIT_NS, out, sizeof out, &n));
  assert_int_equal(out[0], 3);
}

int main(void) {
  setvbuf(stdout, NULL, _IONBF, 0);
  if (!gt_have_cuda()) return 77;
  chi_config_t cfg;
  chi_config_init(&cfg);
  if (chi_init(&cfg, &g_rt) != CHI_OK) {
    fprintf(stderr, "chi_init: %s\n", chi_last_error_message());
    return 1;
  }
  int32_t count = 0;
  chi_gpu_count(g_rt, &count);
  if (count == 0) {
    chi_finalize(g_rt);
    return 77;
  }
  chi_register_handler(g_rt, "test.cpu_only", h_cpu_only, NULL, &g_cpu_only);
  chi_gpu_orchestrator_t o = test_orchestrator();
  chi_status_t s = chi_gpu_set_orchestrator(g_rt, -1, &o);
  if (s != CHI_OK) {
    fprintf(stderr, "chi_gpu_set_orchestrator: %s: %s\n", chi_status_string(s),
            chi_last_error_message());
    chi_finalize(g_rt);
    return 1;
  }
  if (chi_method_lookup(g_rt, "user.scale", &g_scale) != CHI_OK ||
      chi_method_lookup(g_rt, "user.fail", &g_fail) != CHI_OK ||
      chi_method_lookup(g_rt, "user.source", &g_source) != CHI_OK ||
      chi_method_lookup(g_rt, "user.overflow", &g_overflow) != CHI_OK ||
      chi_gpu_context(g_rt, 0, &g_ctx) != CHI_OK ||
      cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking) != cudaSuccess ||
      cudaHostAlloc((void **)&g_st, 32 * sizeof(int32_t), cudaHostAllocMapped) != cudaSuccess) {
    chi_finalize(g_rt);
    return 1;
  }
  static GtWatchdog wd; /* a hang fails with the orchestrator's state */
  wd.start(&g_ctx, 240);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_host_routes),
      cmocka_unit_test(test_device_route),
      cmocka_unit_test(test_replace_and_refuse),
  };
  int failed = chi_test_run("gpu_orchestrator", tests);
  wd.stop();
  if (chi_finalize(g_rt) != CHI_OK) failed++;
  cudaFreeHost(g_st);
  cudaStreamDestroy(g_stream);
  return failed ? 1 : 0;
}

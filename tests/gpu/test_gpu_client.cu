/*
 * Client kernels that submit (docs/server.md, "Client kernels"): kernels of
 * client processes of a chimaera-server use chi_gpu_context's context on
 * every route:
 *   - GPU->CPU to the server's handlers (chi.add, chi.echo, large payloads),
 *   - GPU->GPU (LOCAL, GPU_ANY, GPU(0)): built-ins on the client's own
 *     orchestrator (gpu.client_orchestrator; "own-orch" checks that the
 *     server's orchestrator, parked, launches nothing for them, and that with
 *     the setting off they cross to it), module methods to the server's,
 *   - GPU->CPU to a handler registered in the client itself,
 *   - the refusals (method 0, unknown route, GPU out of range, too large,
 *     unknown method, the client's handler on a GPU route), chi_dev_test,
 *     chi_dev_release and the warp variants;
 * over shm:// and ipc://.  Then the deaths: the server SIGKILLed while a
 * client kernel waits (the kernel gets CHI_ERR_DISCONNECTED, not its
 * timeout), and a client SIGKILLed while its kernel submits (the server drops
 * it and serves the next client).  Client device memory (chi_register_gpu_mem
 * in a client): read by a server module's CPU handler and by its GPU handler
 * (chi_dev_mem_resolve in the server's orchestrator; submitted from the
 * client's host and from a client kernel) through the region, refused
 * outside it, gone at chi_unregister_mem and when the client dies.
 * Then 8 clients at once, and server.mps: two servers share the MPS daemon
 * the first one started, a client that starts no CUDA before chi_init joins
 * it, one that did is warned and still served, a client SIGKILLed mid-kernel
 * leaves the server serving, and the daemon is gone after both servers
 * stopped (skipped without nvidia-cuda-mps-control).
 * `mem-kill` (its own ctest, test_gpu_client_mem_kill): a client SIGKILLed
 * while a server handler (CPU with kernels, then GPU) still reads its device
 * memory; the memory stays mapped until the task ended and the server keeps
 * its GPU (issue 49).
 * One program in several roles (argv[1]); the controller (no argument) never
 * touches CUDA itself.  Exit 77 without a usable GPU.
 * Extra roles for lab/lab recipe client-check (not run by ctest):
 *   share N ADDRESS       N client processes at once, all routes, a rate;
 *   lat ADDRESS | lat     client (or embedded) kernel round trips, p50/p99;
 *   busy ADDRESS SECS     CPU->GPU tasks from a client for SECS (the server's
 *                         orchestrator stays running);
 *   own-orch ADDRESS own|cross, mps-client ADDRESS DIR fresh|touch,
 *   server-mps            the client-orchestrator and server.mps cases.
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "../spawn.h"
#include "chimaera.h"
#include "chimaera_device.h"

#define WAIT_NS 20000000000ll

static void sleep_ms(int ms);

/* Test cases of the route kernel. */
enum { C_CPU_ADD, C_LOCAL_ADD, C_ANY_ECHO, C_GPU0_ADD, C_MINE, C_BIG_ECHO, C_COUNT };

struct Tally {
  unsigned long long ok;
  unsigned long long bad;
  int first_status; /* of the first bad task */
  int first_case;
};

__device__ void note_bad(Tally *t, int c, chi_status_t s) {
  if (atomicAdd(&t->bad, 1ull) == 0) {
    t->first_status = s;
    t->first_case = c;
  }
}

__device__ uint8_t pat(uint64_t seed, uint32_t i) { return (uint8_t)((seed * 0x9E3779B97F4A7C15ull + i * 131u) >> 56); }

/* Every thread: iters tasks, case (thread + i) % C_COUNT. */
__global__ void k_routes(chi_dev_context_t ctx, chi_method_t add, chi_method_t echo, chi_method_t mine,
                         uint32_t iters, Tally *t) {
  const uint32_t tid = blockIdx.x * blockDim.x + threadIdx.x;
  uint8_t in[320], out[320];
  for (uint32_t i = 0; i < iters; ++i) {
    const int c = (int)((tid + i) % C_COUNT);
    const uint64_t a = ((uint64_t)tid << 20) + i, b = 0x1234567ull + i;
    chi_route_t route = CHI_ROUTE_CPU;
    chi_method_t m = add;
    uint32_t n = 16;
    memcpy(in, &a, 8);
    memcpy(in + 8, &b, 8);
    switch (c) {
      case C_LOCAL_ADD: route = CHI_ROUTE_LOCAL; break;
      case C_ANY_ECHO: route = CHI_ROUTE_GPU_ANY; m = echo; n = 40; break;
      case C_GPU0_ADD: route = CHI_ROUTE_GPU(0); break;
      case C_MINE: m = mine; n = 8; break;
      case C_BIG_ECHO: m = echo; n = 300; break;
      default: break;
    }
    if (m == echo)
      for (uint32_t k = 0; k < n; ++k) in[k] = pat(a, k);
    chi_future_t f;
    uint32_t on = 0;
    chi_status_t s = chi_dev_submit(&ctx, route, m, in, n, &f);
    if (s == CHI_OK) s = chi_dev_wait(&ctx, f, WAIT_NS, out, sizeof out, &on);
    bool right = s == CHI_OK;
    if (right && m == add) {
      uint64_t sum;
      memcpy(&sum, out, 8);
      right = on == 8 && sum == a + b;
    } else if (right && m == mine) {
      uint64_t v;
      memcpy(&v, out, 8);
      right = on == 8 && v == 3 * a;
    } else if (right) {
      right = on == n;
      for (uint32_t k = 0; right && k < n; ++k) right = out[k] == in[k];
    }
    if (right) atomicAdd(&t->ok, 1ull);
    else note_bad(t, c, s);
  }
}

__device__ uint8_t g_big[1u << 16];

/* One thread: the statuses, test and release; warp variants by warp 1. */
__global__ void k_edges(chi_dev_context_t ctx, chi_method_t add, chi_method_t mine, int32_t ngpus, int *res) {
  const uint32_t lane = threadIdx.x % 32u, warp = threadIdx.x / 32u;
  uint64_t in[2] = {40, 2};
  uint8_t out[16];
  uint32_t on = 0;
  chi_future_t f;
  if (warp == 0 && lane == 0) {
    int k = 0;
    res[k++] = chi_dev_submit(&ctx, CHI_ROUTE_CPU, 0, in, 16, &f);                 /* INVALID */
    res[k++] = chi_dev_submit(&ctx, -7, add, in, 16, &f);                          /* INVALID */
    res[k++] = chi_dev_submit(&ctx, CHI_ROUTE_GPU(ngpus), add, in, 16, &f);        /* NO_DEVICE */
    res[k++] = chi_dev_submit(&ctx, CHI_ROUTE_CPU, add, g_big, sizeof g_big, &f);  /* TOO_LARGE */
    chi_status_t s = chi_dev_submit(&ctx, CHI_ROUTE_CPU, 0x3FFFFF00u, in, 16, &f); /* a method nobody has */
    res[k++] = s == CHI_OK ? chi_dev_wait(&ctx, f, WAIT_NS, out, sizeof out, &on) : 100 + s; /* NOT_FOUND */
    s = chi_dev_submit(&ctx, CHI_ROUTE_LOCAL, mine, in, 8, &f); /* the client's handler on a GPU route */
    res[k++] = s == CHI_OK ? chi_dev_wait(&ctx, f, WAIT_NS, out, sizeof out, &on) : 100 + s; /* NOT_FOUND */
    /* test until done, then wait */
    s = chi_dev_submit(&ctx, CHI_ROUTE_CPU, add, in, 16, &f);
    int done = 0;
    while (s == CHI_OK && !done) s = chi_dev_test(&ctx, f, &done);
    if (s == CHI_OK) s = chi_dev_wait(&ctx, f, WAIT_NS, out, sizeof out, &on);
    uint64_t sum = 0;
    memcpy(&sum, out, 8);
    res[k++] = s == CHI_OK && on == 8 && sum == 42 ? 0 : 200 + s;
    /* release: pending and done, each route; the future is consumed */
    int rel = 0;
    for (int r = 0; r < 400; ++r) {
      chi_route_t route = r % 2 ? CHI_ROUTE_LOCAL : CHI_ROUTE_CPU;
      if (chi_dev_submit(&ctx, route, add, in, 16, &f) != CHI_OK) { rel = 300; break; }
      if (r % 3 == 0) {
        int d = 0;
        while (!d && chi_dev_test(&ctx, f, &d) == CHI_OK) {
        }
      }
      if (chi_dev_release(&ctx, f) != CHI_OK) { rel = 301; break; }
      if (chi_dev_wait(&ctx, f, 0, out, sizeof out, &on) != CHI_ERR_INVALID) { rel = 302; break; }
    }
    res[k++] = rel;
    res[31] = k;
  }
  if (warp == 1) {
    /* warp variants: every lane, lanes 0..15 active on CPU, 16..31 LOCAL */
    uint64_t w[2] = {lane, 1000};
    chi_route_t route = lane < 16 ? CHI_ROUTE_CPU : CHI_ROUTE_LOCAL;
    int bad = 0;
    for (int r = 0; r < 2; ++r) {
      const chi_route_t rr = r ? route : CHI_ROUTE_CPU;
      chi_status_t s = chi_dev_warp_submit(&ctx, rr, add, w, 16, lane % 3 != 2, &f);
      chi_status_t s2 = chi_dev_warp_wait(&ctx, f, WAIT_NS, out, sizeof out, &on, lane % 3 != 2 && s == CHI_OK);
      uint64_t v = 0;
      memcpy(&v, out, 8);
      if (lane % 3 != 2 && (s != CHI_OK || s2 != CHI_OK || on != 8 || v != lane + 1000)) bad = 1;
    }
    if (__any_sync(0xFFFFFFFFu, bad) && lane == 0) res[30] = 1;
  }
}

static chi_status_t triple(chi_request_t *req, void *) {
  if (req->input_size != 8 || req->output_capacity < 8 || req->source != 0) return -1001;
  uint64_t v;
  memcpy(&v, req->input, 8);
  v *= 3;
  memcpy(req->output, &v, 8);
  req->output_size = 8;
  return CHI_OK;
}

static chi_runtime_t *connect(const char *address) {
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.mode = address ? CHI_MODE_CLIENT : CHI_MODE_EMBEDDED;
  cfg.server_address = address;
  chi_runtime_t *rt = NULL;
  if (chi_init(&cfg, &rt) != CHI_OK) {
    fprintf(stderr, "chi_init(%s): %s\n", address ? address : "embedded", chi_last_error_message());
    return NULL;
  }
  return rt;
}

/* A client: every route from a kernel, then the edge cases.  0 ok, 1 bad, 77 no GPU. */
static int client_routes(const char *address, uint32_t blocks, uint32_t iters, bool edges) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) return 77;
  chi_runtime_t *rt = connect(address);
  if (!rt) return 1;
  chi_dev_context_t ctx;
  chi_status_t s = chi_gpu_context(rt, 0, &ctx);
  if (s == CHI_ERR_NO_DEVICE) {
    fprintf(stderr, "chi_gpu_context: %s\n", chi_last_error_message());
    chi_finalize(rt);
    return 77;
  }
  chi_method_t add = 0, echo = 0, mine = 0;
  int32_t ngpus = 0;
  if (s != CHI_OK || chi_method_lookup(rt, "chi.add", &add) != CHI_OK ||
      chi_method_lookup(rt, "chi.echo", &echo) != CHI_OK ||
      chi_register_handler(rt, "test.triple", triple, NULL, &mine) != CHI_OK || chi_gpu_count(rt, &ngpus) != CHI_OK) {
    fprintf(stderr, "setup: %s\n", chi_last_error_message());
    return 1;
  }
  Tally *t = NULL;
  int *res = NULL;
  if (cudaMallocManaged(&t, sizeof *t) != cudaSuccess || cudaMallocManaged(&res, 32 * sizeof(int)) != cudaSuccess) return 1;
  memset(t, 0, sizeof *t);
  memset(res, 0, 32 * sizeof(int));
  auto t0 = std::chrono::steady_clock::now();
  k_routes<<<blocks, 128>>>(ctx, add, echo, mine, iters, t);
  cudaError_t e = cudaDeviceSynchronize();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int rc = 0;
  const unsigned long long want = (unsigned long long)blocks * 128 * iters;
  printf("# %s: %llu of %llu tasks right (%llu wrong, first: case %d status %d) in %.3f s: %.0f tasks/s\n",
         address, t->ok, want, t->bad, t->first_case, t->first_status, secs, t->ok / secs);
  if (e != cudaSuccess || t->ok != want) rc = 1;
  if (edges && rc == 0) {
    k_edges<<<1, 64>>>(ctx, add, mine, ngpus, res);
    e = cudaDeviceSynchronize();
    const int expect[] = {CHI_ERR_INVALID, CHI_ERR_INVALID, CHI_ERR_NO_DEVICE, CHI_ERR_TOO_LARGE,
                          CHI_ERR_NOT_FOUND, CHI_ERR_NOT_FOUND, 0, 0};
    const int n = (int)(sizeof expect / sizeof expect[0]);
    if (e != cudaSuccess || res[31] != n || res[30] != 0) {
      fprintf(stderr, "%s: edges kernel: %s, %d cases, warp variants %s\n", address, cudaGetErrorString(e), res[31],
              res[30] ? "wrong" : "right");
      rc = 1;
    }
    for (int i = 0; i < n && i < res[31]; ++i)
      if (res[i] != expect[i]) {
        fprintf(stderr, "%s: edge case %d: %d, want %d\n", address, i, res[i], expect[i]);
        rc = 1;
      }
  }
  if (chi_finalize(rt) != CHI_OK) rc = 1;
  cudaFree(t);
  cudaFree(res);
  return rc;
}

/* GPU->GPU built-ins on this GPU's three routes, every result checked. */
__global__ void k_builtins(chi_dev_context_t ctx, chi_method_t add, chi_method_t echo, uint32_t iters, Tally *t) {
  const uint32_t tid = blockIdx.x * blockDim.x + threadIdx.x;
  uint8_t in[64], out[64];
  for (uint32_t i = 0; i < iters; ++i) {
    const int c = (int)((tid + i) % 3u);
    const chi_route_t route = c == 0 ? CHI_ROUTE_LOCAL : c == 1 ? CHI_ROUTE_GPU_ANY : CHI_ROUTE_GPU(0);
    const uint64_t a = ((uint64_t)tid << 20) + i, b = 77u + i;
    const bool sum = (i & 1u) != 0;
    const uint32_t n = sum ? 16u : 8u + (tid + i) % 57u;
    if (sum) {
      memcpy(in, &a, 8);
      memcpy(in + 8, &b, 8);
    } else {
      for (uint32_t k = 0; k < n; ++k) in[k] = pat(a, k);
    }
    chi_future_t f;
    uint32_t on = 0;
    chi_status_t s = chi_dev_submit(&ctx, route, sum ? add : echo, in, n, &f);
    if (s == CHI_OK) s = chi_dev_wait(&ctx, f, WAIT_NS, out, sizeof out, &on);
    bool right = s == CHI_OK;
    if (right && sum) {
      uint64_t v;
      memcpy(&v, out, 8);
      right = on == 8 && v == a + b;
    } else if (right) {
      right = on == n;
      for (uint32_t k = 0; right && k < n; ++k) right = out[k] == in[k];
    }
    if (right) atomicAdd(&t->ok, 1ull);
    else note_bad(t, c, s);
  }
}

/* GPU 0's orchestrator in the server's status: its launches so far, and
 * whether it is parked.  False if the server does not answer. */
static bool server_gpu0(const char *address, unsigned long long *launches, bool *parked) {
  char st[8192];
  size_t n = 0;
  if (chi_server_query(address, "status-json", st, sizeof st, &n) != CHI_OK) return false;
  const char *p = strstr(st, "{\"gpu\":0,\"state\":\"");
  if (!p) return false;
  p += strlen("{\"gpu\":0,\"state\":\"");
  *parked = strncmp(p, "parked\"", 7) == 0;
  const char *l = strstr(p, "\"launches\":");
  return l && sscanf(l, "\"launches\":%llu", launches) == 1;
}

/* A client's kernel runs GPU->GPU built-ins while the server's GPU 0 is
 * parked.  own: they must run on the client's own orchestrator (the server
 * launches nothing); else (CHI_GPU_CLIENT_ORCHESTRATOR=0) they cross to the
 * server, whose orchestrator starts.  Every result is checked either way. */
static int client_own_orch(const char *address, bool own) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) return 77;
  chi_runtime_t *rt = connect(address);
  if (!rt) return 1;
  chi_dev_context_t ctx;
  chi_method_t add = 0, echo = 0;
  if (chi_gpu_context(rt, 0, &ctx) != CHI_OK || chi_method_lookup(rt, "chi.add", &add) != CHI_OK ||
      chi_method_lookup(rt, "chi.echo", &echo) != CHI_OK) {
    fprintf(stderr, "own-orch setup: %s\n", chi_last_error_message());
    return 1;
  }
  unsigned long long before = 0, after = 0;
  bool parked = false;
  for (int i = 0; i < 600 && !(server_gpu0(address, &before, &parked) && parked); ++i) sleep_ms(50);
  if (!parked) {
    fprintf(stderr, "own-orch: the server's GPU 0 never parked\n");
    chi_finalize(rt);
    return 1;
  }
  Tally *t = NULL;
  if (cudaMallocManaged(&t, sizeof *t) != cudaSuccess) return 1;
  memset(t, 0, sizeof *t);
  const uint32_t blocks = 4, iters = 100;
  k_builtins<<<blocks, 64>>>(ctx, add, echo, iters, t);
  const cudaError_t e = cudaDeviceSynchronize();
  const bool read = server_gpu0(address, &after, &parked);
  const unsigned long long want = (unsigned long long)blocks * 64 * iters;
  printf("# own-orch %s (%s): %llu of %llu built-ins right (first bad: case %d status %d); server GPU 0 launches "
         "%llu -> %llu\n",
         address, own ? "client's orchestrator" : "crossing to the server", t->ok, want, t->first_case,
         t->first_status, before, after);
  int rc = e == cudaSuccess && t->ok == want && read ? 0 : 1;
  if (own && after != before) rc = 1;  /* a task reached the server's orchestrator */
  if (!own && after == before) rc = 1; /* the switch did not send them there */
  if (chi_finalize(rt) != CHI_OK) rc = 1;
  cudaFree(t);
  return rc;
}

/* Runs until a task fails: progress in *count (mapped), the failing status in *why. */
__global__ void k_until_failure(chi_dev_context_t ctx, chi_method_t add, volatile unsigned long long *count,
                                volatile int *why) {
  uint64_t in[2] = {1, 2};
  uint8_t out[16];
  uint32_t on;
  for (uint64_t i = 0;; ++i) {
    chi_future_t f;
    chi_status_t s = chi_dev_submit(&ctx, i % 2 ? CHI_ROUTE_LOCAL : CHI_ROUTE_CPU, add, in, 16, &f);
    if (s == CHI_OK) s = chi_dev_wait(&ctx, f, WAIT_NS, out, sizeof out, &on);
    if (s != CHI_OK) {
      *why = s;
      __threadfence_system();
      return;
    }
    *count = i + 1;
  }
}

/* A client whose kernel submits until something fails; "R" on stdout once it
 * runs.  Exit 0 when the failure was CHI_ERR_DISCONNECTED. */
static int client_until_failure(const char *address) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) return 77;
  chi_runtime_t *rt = connect(address);
  chi_dev_context_t ctx;
  chi_method_t add;
  if (!rt || chi_gpu_context(rt, 0, &ctx) != CHI_OK || chi_method_lookup(rt, "chi.add", &add) != CHI_OK) return 1;
  unsigned long long *count;
  int *why;
  if (cudaHostAlloc(&count, sizeof *count, cudaHostAllocMapped) != cudaSuccess ||
      cudaHostAlloc(&why, sizeof *why, cudaHostAllocMapped) != cudaSuccess)
    return 1;
  *count = 0;
  *why = 0;
  cudaStream_t st;
  cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  k_until_failure<<<1, 1, 0, st>>>(ctx, add, count, why);
  while (*(volatile unsigned long long *)count < 100 && *(volatile int *)why == 0) usleep(1000);
  printf("R\n");
  fflush(stdout);
  cudaError_t e = cudaStreamSynchronize(st);
  const int s = *(volatile int *)why;
  fprintf(stderr, "# kernel ended after %llu tasks with status %d (%s)\n", *count, s, chi_status_string(s));
  chi_finalize(rt);
  return e == cudaSuccess && s == CHI_ERR_DISCONNECTED ? 0 : 1;
}

static uint64_t fnv(const uint8_t *p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

/* References to client device memory submitted by a client kernel (the relay
 * context) to the server's GPU handler test.gpu_mem_sum on CHI_ROUTE_GPU(0):
 * one thread, the status and answer of each in st[] and h[]. */
__global__ void k_gpu_mem(chi_dev_context_t ctx, chi_method_t m, const chi_mem_ref_t *refs, uint32_t n, int *st,
                          uint64_t *h) {
  for (uint32_t i = 0; i < n; ++i) {
    chi_mem_ref_t ref = refs[i];
    chi_future_t f;
    uint64_t out = 0;
    uint32_t on = 0;
    chi_status_t s = chi_dev_submit(&ctx, CHI_ROUTE_GPU(0), m, &ref, sizeof ref, &f);
    if (s == CHI_OK) s = chi_dev_wait(&ctx, f, WAIT_NS, &out, sizeof out, &on);
    st[i] = s == CHI_OK && on != 8 ? -2000 : s;
    h[i] = out;
  }
}

/* Client device memory: registered with the server, read there by the
 * module's test.memsum (CPU handler) and test.gpu_mem_sum (GPU handler, on
 * CHI_ROUTE_GPU(0) from this host and from a kernel) through the region,
 * refused outside it, gone after chi_unregister_mem.  die: registers two
 * regions, says "R" and SIGKILLs itself (the server must drop them).  0 ok,
 * 1 bad, 77 no GPU. */
static int client_mem(const char *address, bool die) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) return 77;
  chi_runtime_t *rt = connect(address);
  if (!rt) return 1;
  chi_dev_context_t ctx;
  const bool have_ctx = !die && chi_gpu_context(rt, 0, &ctx) == CHI_OK;
  const size_t n = 1u << 20;
  std::vector<uint8_t> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = (uint8_t)(i * 7 + (i >> 9));
  uint8_t *d = NULL;
  if (cudaMalloc(&d, n) != cudaSuccess || cudaMemcpy(d, host.data(), n, cudaMemcpyHostToDevice) != cudaSuccess) return 1;
  int bad = 0;
  int last = 0; /* the last status of the GPU handler checked */
#define MEM_CHECK(cond)                                                                  \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      fprintf(stderr, "mem: line %d: %s (%s; last GPU handler status %d)\n", __LINE__, \
              #cond, chi_last_error_message(), last);                                    \
      ++bad;                                                                             \
    }                                                                                    \
  } while (0)
  uint64_t region = 0, r2 = 0;
  MEM_CHECK(chi_register_gpu_mem(rt, 0, d + 4096, 65536, &region) == CHI_OK);
  chi_method_t m = 0;
  MEM_CHECK(chi_method_lookup(rt, "test.memsum", &m) == CHI_OK);
  auto sum = [&](uint64_t reg, uint64_t off, uint64_t len, uint64_t *h) {
    chi_mem_ref_t ref = {reg, off, len};
    chi_future_t f;
    chi_status_t s = chi_submit(rt, CHI_ROUTE_CPU, m, &ref, sizeof ref, &f);
    return s == CHI_OK ? chi_wait(rt, f, WAIT_NS, h, sizeof *h, NULL) : s;
  };
  /* The same through the server's GPU handler (chi_dev_mem_resolve in its orchestrator), from the host. */
  chi_method_t gm = 0;
  MEM_CHECK(chi_method_lookup(rt, "test.gpu_mem_sum", &gm) == CHI_OK);
  auto gsum = [&](uint64_t reg, uint64_t off, uint64_t len, uint64_t *h) {
    chi_mem_ref_t ref = {reg, off, len};
    chi_future_t f;
    size_t on = 0;
    *h = 0;
    chi_status_t s = chi_submit(rt, CHI_ROUTE_GPU(0), gm, &ref, sizeof ref, &f);
    if (s == CHI_OK) s = chi_wait(rt, f, WAIT_NS, h, sizeof *h, &on);
    return last = s == CHI_OK && on != 8 ? -2000 : s;
  };
  /* ... and from a client kernel through the relay context: refs[i] answers st[i], h[i]. */
  chi_mem_ref_t *refs = NULL;
  int *kst = NULL;
  uint64_t *kh = NULL;
  if (cudaMallocManaged(&refs, 8 * sizeof *refs) != cudaSuccess ||
      cudaMallocManaged(&kst, 8 * sizeof *kst) != cudaSuccess || cudaMallocManaged(&kh, 8 * sizeof *kh) != cudaSuccess)
    return 1;
  auto ksum = [&](const std::vector<chi_mem_ref_t> &v) {
    for (size_t i = 0; i < v.size(); ++i) {
      refs[i] = v[i];
      kst[i] = -3000;
      kh[i] = 0;
    }
    k_gpu_mem<<<1, 1>>>(ctx, gm, refs, (uint32_t)v.size(), kst, kh);
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) fprintf(stderr, "mem: k_gpu_mem: %s\n", cudaGetErrorString(e));
    return e == cudaSuccess;
  };
  uint64_t h = 0;
  if (!die) {
    MEM_CHECK(gsum(region, 100, 1000, &h) == CHI_OK && h == fnv(host.data() + 4096 + 100, 1000));
    MEM_CHECK(gsum(region, 0, 65536, &h) == CHI_OK && h == fnv(host.data() + 4096, 65536));
    MEM_CHECK(gsum(region, 65535, 1, &h) == CHI_OK && h == fnv(host.data() + 4096 + 65535, 1));
    MEM_CHECK(gsum(region, 65000, 1000, &h) == CHI_ERR_INVALID);         /* past the region */
    MEM_CHECK(gsum(region, 65537, 0, &h) == CHI_ERR_INVALID);            /* offset past it */
    MEM_CHECK(gsum(region, ~0ull - 10, 20, &h) == CHI_ERR_INVALID);      /* offset + length wraps */
    MEM_CHECK(gsum(region, 10, ~0ull - 5, &h) == CHI_ERR_INVALID);       /* length wraps */
    MEM_CHECK(gsum(region + 1, 0, 8, &h) == CHI_ERR_INVALID);            /* no such region */
    MEM_CHECK(gsum(region ^ (1ull << 40), 0, 8, &h) == CHI_ERR_INVALID); /* another generation */
    MEM_CHECK(have_ctx);
    if (have_ctx) {
      MEM_CHECK(ksum({{region, 100, 1000}, {region, 0, 65536}, {region, 65000, 1000}, {region, ~0ull - 10, 20}}));
      MEM_CHECK((last = kst[0]) == CHI_OK && kh[0] == fnv(host.data() + 4096 + 100, 1000));
      MEM_CHECK((last = kst[1]) == CHI_OK && kh[1] == fnv(host.data() + 4096, 65536));
      MEM_CHECK((last = kst[2]) == CHI_ERR_INVALID);
      MEM_CHECK((last = kst[3]) == CHI_ERR_INVALID);
    }
  }
  MEM_CHECK(sum(region, 100, 1000, &h) == CHI_OK && h == fnv(host.data() + 4096 + 100, 1000));
  MEM_CHECK(sum(region, 0, 65536, &h) == CHI_OK && h == fnv(host.data() + 4096, 65536));
  MEM_CHECK(sum(region, 65000, 1000, &h) == CHI_ERR_INVALID); /* past the region */
  chi_mem_ref_t ref = {region, 0, 8};
  void *p;
  MEM_CHECK(chi_mem_resolve(rt, &ref, &p, NULL) == CHI_ERR_INVALID); /* the server's to resolve */
  /* Refused: past the allocation, host memory, another process's idea of a GPU. */
  MEM_CHECK(chi_register_gpu_mem(rt, 0, d + n - 10, 100, &r2) == CHI_ERR_INVALID);
  MEM_CHECK(chi_register_gpu_mem(rt, 0, host.data(), 16, &r2) == CHI_ERR_INVALID);
  MEM_CHECK(chi_register_gpu_mem(rt, 99, d, 16, &r2) == CHI_ERR_INVALID);
  /* A second region of the same allocation, then both gone. */
  MEM_CHECK(chi_register_gpu_mem(rt, 0, d + 8192, 100, &r2) == CHI_OK && r2 != region);
  MEM_CHECK(sum(r2, 0, 100, &h) == CHI_OK && h == fnv(host.data() + 8192, 100));
  if (!die) MEM_CHECK(gsum(r2, 0, 100, &h) == CHI_OK && h == fnv(host.data() + 8192, 100));
  MEM_CHECK(chi_unregister_mem(rt, region) == CHI_OK);
  MEM_CHECK(sum(region, 100, 1000, &h) == CHI_ERR_INVALID);
  if (!die) {
    MEM_CHECK(gsum(region, 100, 1000, &h) == CHI_ERR_INVALID); /* gone from the device table */
    MEM_CHECK(gsum(region, 0, 8, &h) == CHI_ERR_INVALID);
    MEM_CHECK(gsum(r2, 0, 100, &h) == CHI_OK && h == fnv(host.data() + 8192, 100));
    if (have_ctx) {
      MEM_CHECK(ksum({{region, 100, 1000}, {r2, 0, 100}}));
      MEM_CHECK((last = kst[0]) == CHI_ERR_INVALID);
      MEM_CHECK((last = kst[1]) == CHI_OK && kh[1] == fnv(host.data() + 8192, 100));
    }
  }
  MEM_CHECK(chi_unregister_mem(rt, region) == CHI_ERR_INVALID);
  MEM_CHECK(sum(r2, 0, 100, &h) == CHI_OK && h == fnv(host.data() + 8192, 100)); /* the mapping stays */
  MEM_CHECK(chi_unregister_mem(rt, r2) == CHI_OK);
  if (!die) {
    MEM_CHECK(gsum(r2, 0, 100, &h) == CHI_ERR_INVALID);
    if (have_ctx) {
      MEM_CHECK(ksum({{r2, 0, 100}}));
      MEM_CHECK((last = kst[0]) == CHI_ERR_INVALID);
    }
  }
  if (die) {
    MEM_CHECK(chi_register_gpu_mem(rt, 0, d, 4096, &region) == CHI_OK);
    MEM_CHECK(chi_register_gpu_mem(rt, 0, d + 4096, 4096, &r2) == CHI_OK);
    if (bad) return 1;
    printf("R\n");
    fflush(stdout);
    raise(SIGKILL);
  }
  if (chi_finalize(rt) != CHI_OK) ++bad;
  cudaFree(d);
  cudaFree(refs);
  cudaFree(kst);
  cudaFree(kh);
  printf("# client device memory over %s (server CPU and GPU handlers, from the host and a client kernel): %s\n",
         address, bad ? "WRONG" : "right");
  return bad ? 1 : 0;
}

/* Round trips of one thread, globaltimer; p50/p99 printed by the host. */
__global__ void k_lat(chi_dev_context_t ctx, chi_route_t route, chi_method_t echo, uint32_t n, uint64_t *ns, int *bad) {
  uint8_t in[64], out[64];
  for (int i = 0; i < 64; ++i) in[i] = (uint8_t)i;
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t t0, t1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    chi_future_t f;
    uint32_t on = 0;
    chi_status_t s = chi_dev_submit(&ctx, route, echo, in, 64, &f);
    if (s == CHI_OK) s = chi_dev_wait(&ctx, f, WAIT_NS, out, sizeof out, &on);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    if (s != CHI_OK || on != 64) ++*bad;
    ns[i] = t1 - t0;
  }
}

static uint32_t gt_n() {
  const char *s = getenv("CHI_TEST_LAT_N");
  long v = s ? strtol(s, NULL, 10) : 0;
  return v > 0 ? (uint32_t)v : 20000u;
}

static int latency(const char *address) {
  /* chi_init before the first CUDA call: a server's MPS daemon is joined. */
  chi_runtime_t *rt = connect(address);
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) return 77;
  chi_dev_context_t ctx;
  chi_method_t echo;
  if (!rt || chi_gpu_context(rt, 0, &ctx) != CHI_OK || chi_method_lookup(rt, "chi.echo", &echo) != CHI_OK) {
    fprintf(stderr, "lat: %s\n", chi_last_error_message());
    return 1;
  }
  const uint32_t warm = 2000, n = gt_n();
  uint64_t *ns;
  int *bad;
  cudaMallocManaged(&ns, sizeof(uint64_t) * (warm + n));
  cudaMallocManaged(&bad, sizeof(int));
  int rc = 0;
  const struct { const char *name; chi_route_t route; } rows[] = {{"gpu0->cpu", CHI_ROUTE_CPU},
                                                                   {"gpu0->local (GPU->GPU)", CHI_ROUTE_LOCAL}};
  for (const auto &r : rows) {
    *bad = 0;
    cudaStream_t st;
    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    k_lat<<<1, 1, 0, st>>>(ctx, r.route, echo, warm + n, ns, bad);
    if (cudaStreamSynchronize(st) != cudaSuccess || *bad) rc = 1;
    cudaStreamDestroy(st);
    std::vector<uint64_t> v(ns + warm, ns + warm + n);
    std::sort(v.begin(), v.end());
    printf("%-8s %-24s n=%u p50=%.2f us p99=%.2f us bad=%d\n", address ? "client" : "embedded", r.name, n,
           v[n / 2] / 1000.0, v[n * 99 / 100] / 1000.0, *bad);
  }
  chi_finalize(rt);
  return rc;
}

/* Keeps the server's GPU 0 busy for `secs` seconds with CPU->GPU tasks from
 * this client's host thread (chi.echo, 64 bytes): its orchestrator runs the
 * whole time (for measurements beside it: lab/lab recipe client-check). */
static int busy(const char *address, double secs) {
  chi_runtime_t *rt = connect(address);
  chi_method_t echo;
  if (!rt || chi_method_lookup(rt, "chi.echo", &echo) != CHI_OK) return 1;
  uint8_t in[64] = {1}, out[64];
  unsigned long long n = 0, bad = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < secs) {
    chi_future_t f;
    size_t on = 0;
    chi_status_t s = chi_submit(rt, CHI_ROUTE_GPU(0), echo, in, sizeof in, &f);
    if (s == CHI_OK) s = chi_wait(rt, f, WAIT_NS, out, sizeof out, &on);
    if (s == CHI_OK && on == sizeof in) ++n;
    else ++bad;
  }
  printf("# busy %s: %llu CPU->GPU tasks in %.1f s, %llu failed\n", address, n, secs, bad);
  chi_finalize(rt);
  return bad ? 1 : 0;
}

static pid_t spawn(const std::vector<std::string> &args, int *out_fd, const char *log = nullptr) {
  int fds[2] = {-1, -1};
  if (out_fd && pipe2(fds, O_CLOEXEC) != 0) return -1;
  const pid_t pid = chi_test_spawn(args, log, true, out_fd ? fds[1] : -1);
  if (out_fd) {
    close(fds[1]);
    if (pid < 0) close(fds[0]);
    else *out_fd = fds[0];
  }
  return pid;
}

static int wait_status(pid_t pid) {
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
  nanosleep(&ts, NULL);
}

/* A client whose device memory a server handler is still reading when the
 * client is SIGKILLed (issue 49, defect 2): registers 4 KiB of its device
 * memory, submits test.mem_hold (a CPU handler whose kernels read it, `cpu`)
 * or test.gpu_mem_hold (a GPU handler, `gpu`) for hold_ms, says "R" once
 * the handler's second pass is seen in its memory, and waits to be killed.
 * 1 on an error, 77 without a GPU. */
static int client_mem_hold(const char *address, bool gpu_handler, uint64_t hold_ms) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) return 77;
  chi_runtime_t *rt = connect(address);
  if (!rt) return 1;
  const size_t n = 4096;
  std::vector<uint8_t> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = i < 8 ? 0 : (uint8_t)(i * 11 + 3);
  uint8_t *d = NULL;
  uint64_t region = 0;
  chi_method_t m = 0;
  if (cudaMalloc(&d, 1u << 20) != cudaSuccess || cudaMemcpy(d, host.data(), n, cudaMemcpyHostToDevice) != cudaSuccess ||
      chi_register_gpu_mem(rt, 0, d, n, &region) != CHI_OK ||
      chi_method_lookup(rt, gpu_handler ? "test.gpu_mem_hold" : "test.mem_hold", &m) != CHI_OK) {
    fprintf(stderr, "mem-hold: setup: %s\n", chi_last_error_message());
    return 1;
  }
  struct {
    chi_mem_ref_t ref;
    uint64_t hold;
  } a = {{region, 0, n}, gpu_handler ? hold_ms * 1000000u : hold_ms};
  chi_future_t f;
  if (chi_submit(rt, gpu_handler ? CHI_ROUTE_GPU(0) : CHI_ROUTE_CPU, m, &a, sizeof a, &f) != CHI_OK) {
    fprintf(stderr, "mem-hold: submit: %s\n", chi_last_error_message());
    return 1;
  }
  uint64_t pass = 0;
  for (int i = 0; i < 20000 && pass < 2; ++i) {
    if (cudaMemcpy(&pass, d, 8, cudaMemcpyDeviceToHost) != cudaSuccess) return 1;
    if (pass < 2) sleep_ms(1);
  }
  if (pass < 2) {
    fprintf(stderr, "mem-hold: the handler did not start reading within 20 s\n");
    return 1;
  }
  printf("R\n");
  fflush(stdout);
  for (;;) pause();
}

static std::string g_server_log;

/* A server on shm:// and ipc:// with the device memory module, logging (info)
 * to g_server_log; false if it does not answer. */
/* A server on shm (and ipc, if not NULL), its log in `log`; true once it answers. */
static bool start_server_at(const char *shm, const char *ipc, const std::string &log, pid_t *pid) {
  setenv("CHI_MODULES", CHI_MEM_MODULE_PATH, 1);
  setenv("CHI_LOG_LEVEL", "info", 1);
  std::vector<std::string> args{CHI_SERVER_PATH, "--listen", shm, "--workers", "2"};
  if (ipc) args.insert(args.end(), {"--listen", ipc});
  *pid = spawn(args, nullptr, log.c_str());
  unsetenv("CHI_MODULES");
  unsetenv("CHI_LOG_LEVEL");
  char reply[256];
  size_t len = 0;
  for (int i = 0; i < 300; ++i) {
    if (chi_server_query(shm, "ping", reply, sizeof reply, &len) == CHI_OK) return true;
    sleep_ms(50);
  }
  return false;
}

static bool start_server(const char *shm, const char *ipc, pid_t *pid) {
  g_server_log = std::string("/tmp/chi-client-gpu-") + std::to_string(getpid()) + ".log";
  return start_server_at(shm, ipc, g_server_log, pid);
}

/* Waits for "R" from a child's stdout. */
static bool ready(int fd) {
  char c = 0;
  while (read(fd, &c, 1) == 1)
    if (c == 'R') return true;
  return false;
}

static int share(const std::string &self, int n, const char *address) {
  std::vector<pid_t> kids;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) kids.push_back(spawn({self, "routes", address, "16", "200"}, nullptr));
  int rc = 0, skipped = 0;
  for (pid_t k : kids) {
    const int r = wait_status(k);
    if (r == 77) ++skipped;
    else rc |= r;
  }
  if (skipped == n) return 77;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (rc || skipped) {
    printf("# share: %d clients: FAILED (%d without a GPU)\n", n, skipped);
    return 1;
  }
  printf("# share: %d clients x 16 blocks x 128 threads x 200 tasks, every route: all right, %.2f s (processes "
         "included), %.0f tasks/s\n",
         n, secs, n * 16.0 * 128 * 200 / secs);
  return 0;
}

static std::string read_file(const std::string &path) {
  std::string text;
  if (FILE *f = fopen(path.c_str(), "r")) {
    char buf[4096];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, got);
    fclose(f);
  }
  return text;
}

/* ---- MPS run by the server (server.mps) ---- */

/* Whether an MPS control daemon answers at dir/control. */
static bool mps_answers(const std::string &dir) {
  const std::string path = dir + "/control";
  sockaddr_un a{};
  if (path.size() >= sizeof a.sun_path) return false;
  a.sun_family = AF_UNIX;
  memcpy(a.sun_path, path.c_str(), path.size() + 1);
  for (int type : {SOCK_STREAM, SOCK_SEQPACKET}) {
    const int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    const bool ok = connect(fd, (const sockaddr *)&a, sizeof a) == 0;
    close(fd);
    if (ok) return true;
  }
  return false;
}

/* Whether an MPS control daemon for `dir` runs: a process of this user
 * "nvidia-cuda-mps-control -d" whose environment names dir.  (Asking its
 * socket would not do: a connect every few ms kept a quitting daemon alive.) */
static bool mps_daemon_runs(const std::string &dir) {
  const std::string want = "CUDA_MPS_PIPE_DIRECTORY=" + dir;
  DIR *proc = opendir("/proc");
  if (!proc) return false;
  bool found = false;
  while (dirent *e = readdir(proc)) {
    if (found || e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const std::string base = std::string("/proc/") + e->d_name;
    const std::string cmd = read_file(base + "/cmdline");
    if (cmd.find("nvidia-cuda-mps-control") == std::string::npos || cmd.find(std::string("\0-d", 3)) == std::string::npos)
      continue;
    const std::string env = read_file(base + "/environ");
    size_t at = 0;
    while (at < env.size() && !found) {
      const size_t end = env.find('\0', at);
      found = env.compare(at, (end == std::string::npos ? env.size() : end) - at, want) == 0;
      at = end == std::string::npos ? env.size() : end + 1;
    }
  }
  closedir(proc);
  return found;
}

static bool on_path(const char *prog) {
  const char *p = getenv("PATH");
  std::string path = p ? p : "";
  size_t at = 0;
  while (at <= path.size()) {
    size_t end = path.find(':', at);
    if (end == std::string::npos) end = path.size();
    const std::string f = path.substr(at, end - at) + "/" + prog;
    if (access(f.c_str(), X_OK) == 0) return true;
    at = end + 1;
  }
  return false;
}

/* Whether the MPS daemon at dir lists this process as a client of one of its servers. */
static bool mps_lists_me(const std::string &dir) {
  const std::string q = "CUDA_MPS_PIPE_DIRECTORY='" + dir + "' nvidia-cuda-mps-control";
  std::string servers;
  if (FILE *f = popen(("echo get_server_list | " + q).c_str(), "r")) {
    char buf[256];
    while (fgets(buf, sizeof buf, f)) servers += buf;
    pclose(f);
  }
  const std::string me = std::to_string(getpid());
  size_t at = 0;
  while (at < servers.size()) {
    size_t end = servers.find('\n', at);
    if (end == std::string::npos) end = servers.size();
    const std::string srv = servers.substr(at, end - at);
    at = end + 1;
    if (srv.empty()) continue;
    if (FILE *f = popen(("echo get_client_list " + srv + " | " + q).c_str(), "r")) {
      char buf[256];
      bool found = false;
      while (fgets(buf, sizeof buf, f))
        if (strtol(buf, NULL, 10) == strtol(me.c_str(), NULL, 10)) found = true;
      pclose(f);
      if (found) return true;
    }
  }
  return false;
}

/* A client of a server that runs MPS at `dir`.  fresh: no CUDA call before
 * chi_init, so its context must join the server's daemon; touch: CUDA first
 * (outside it), so chi_init warns and the process stays outside.  Then every
 * route from a kernel, results checked. */
static int mps_client(const char *address, const std::string &dir, bool touch) {
  if (touch && cudaFree(0) != cudaSuccess) return 77;
  chi_runtime_t *rt = connect(address);
  if (!rt) return 1;
  const char *env = getenv("CUDA_MPS_PIPE_DIRECTORY");
  const bool adopted = env && dir == env;
  int rc = 0;
  if (adopted == touch) {
    fprintf(stderr, "mps-client (%s): CUDA_MPS_PIPE_DIRECTORY is %s\n", touch ? "touch" : "fresh", env ? env : "unset");
    rc = 1;
  }
  if (!touch && cudaFree(0) != cudaSuccess) rc = 1;
  const bool listed = mps_lists_me(dir);
  printf("# mps-client %s (%s): CUDA_MPS_PIPE_DIRECTORY %s, a client of the server's daemon: %s\n", address,
         touch ? "CUDA first" : "chi_init first", env ? env : "unset", listed ? "yes" : "no");
  if (listed == touch) rc = 1;
  chi_finalize(rt);
  const int r = client_routes(address, 4, 20, true);
  return rc ? rc : r;
}

/* Two servers with server.mps share one daemon that the first started; the
 * last one out stops it.  Clients join it, or warn when they cannot. */
static int server_mps(const std::string &self) {
  if (!on_path("nvidia-cuda-mps-control")) {
    printf("# server.mps: not tested (no nvidia-cuda-mps-control on PATH)\n");
    return 0;
  }
  const std::string base = "/tmp/chi-mps-test-" + std::to_string(getpid());
  const std::string dir = base + "/chimaera-mps";
  mkdir(base.c_str(), 0700);
  const char *old_xdg = getenv("XDG_RUNTIME_DIR");
  const std::string saved_xdg = old_xdg ? old_xdg : "";
  const char *old_pipe = getenv("CUDA_MPS_PIPE_DIRECTORY");
  const std::string saved_pipe = old_pipe ? old_pipe : "";
  setenv("XDG_RUNTIME_DIR", base.c_str(), 1);
  unsetenv("CUDA_MPS_PIPE_DIRECTORY");
  const std::string a_shm = "shm://chi-mps-a-" + std::to_string(getpid());
  const std::string b_shm = "shm://chi-mps-b-" + std::to_string(getpid());
  const std::string a_log = base + "-a.log", b_log = base + "-b.log", c_log = base + "-touch.log";
  int rc = 0;
  pid_t a = -1, b = -1;
  setenv("CHI_SERVER_MPS", "true", 1);
  const bool a_up = start_server_at(a_shm.c_str(), NULL, a_log, &a);
  const bool b_up = a_up && start_server_at(b_shm.c_str(), NULL, b_log, &b);
  unsetenv("CHI_SERVER_MPS");
  char st[8192];
  size_t n = 0;
  if (!a_up || !b_up) {
    fprintf(stderr, "server.mps: a server did not start (logs %s, %s)\n", a_log.c_str(), b_log.c_str());
    rc = 1;
  } else {
    const std::string want_a = "\"mps\":true,\"mps_dir\":\"" + dir + "\",\"mps_started_by\":\"this server\"";
    const std::string want_b =
        "\"mps\":true,\"mps_dir\":\"" + dir + "\",\"mps_started_by\":\"chimaera process " + std::to_string(a) + "\"";
    const bool sa = chi_server_query(a_shm.c_str(), "status-json", st, sizeof st, &n) == CHI_OK &&
                    strstr(st, want_a.c_str());
    const bool sb = chi_server_query(b_shm.c_str(), "status-json", st, sizeof st, &n) == CHI_OK &&
                    strstr(st, want_b.c_str());
    printf("# server.mps: first server started the daemon at %s: %s; second reuses it: %s\n", dir.c_str(),
           sa ? "yes" : "NO", sb ? "yes" : "NO");
    if (!sa || !sb) rc = 1;
    int r = wait_status(spawn({self, "mps-client", a_shm, dir, "fresh"}, nullptr));
    const int r2 = wait_status(spawn({self, "mps-client", b_shm, dir, "touch"}, nullptr, c_log.c_str()));
    const bool warned = read_file(c_log).find("initialized CUDA before chi_init") != std::string::npos;
    printf("# server.mps clients: chi_init first exit %d; CUDA first exit %d, warned: %s\n", r, r2,
           warned ? "yes" : "NO");
    if (r || r2 || !warned) rc = 1;
    /* A client SIGKILLed mid-kernel under the server's MPS: the server keeps serving. */
    int fd;
    pid_t hog = spawn({self, "until-failure", a_shm}, &fd);
    const bool ran = ready(fd);
    kill(hog, SIGKILL);
    wait_status(hog);
    close(fd);
    r = wait_status(spawn({self, "routes", a_shm, "4", "20"}, nullptr));
    printf("# server.mps: client SIGKILLed mid-kernel (ran: %s), next client exit %d\n", ran ? "yes" : "NO", r);
    if (!ran || r) rc = 1;
  }
  if (a > 0) {
    kill(a, SIGTERM);
    wait_status(a);
  }
  const bool kept = mps_daemon_runs(dir) && mps_answers(dir);
  if (b > 0) {
    kill(b, SIGTERM);
    wait_status(b);
  }
  /* The daemon quits once its MPS server has gone. */
  bool gone = false;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 600 && !gone; ++i) {
    gone = !mps_daemon_runs(dir);
    if (!gone) sleep_ms(100);
  }
  printf("# server.mps: the daemon stayed while the second server ran: %s; gone after both stopped: %s (%.1f s)\n",
         kept ? "yes" : "NO", gone ? "yes" : "NO",
         std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  /* MPS started by hand (as scripts/mps.sh does): a server with the key uses
   * it ("its user") and leaves it running; a client's kernels on every route. */
  const std::string hand = base + "/hand";
  mkdir(hand.c_str(), 0700);
  setenv("CUDA_MPS_PIPE_DIRECTORY", hand.c_str(), 1);
  setenv("CUDA_MPS_LOG_DIRECTORY", hand.c_str(), 1);
  bool hand_up = system("nvidia-cuda-mps-control -d") == 0;
  for (int i = 0; hand_up && i < 500 && !mps_answers(hand); ++i) sleep_ms(20);
  pid_t c = -1;
  const std::string c_shm = "shm://chi-mps-c-" + std::to_string(getpid()), c_log2 = base + "-c.log";
  setenv("CHI_SERVER_MPS", "true", 1);
  const bool c_up = hand_up && start_server_at(c_shm.c_str(), NULL, c_log2, &c);
  unsetenv("CHI_SERVER_MPS");
  const std::string want_c = "\"mps\":true,\"mps_dir\":\"" + hand + "\",\"mps_started_by\":\"its user\"";
  const bool sc = c_up && chi_server_query(c_shm.c_str(), "status-json", st, sizeof st, &n) == CHI_OK &&
                  strstr(st, want_c.c_str());
  const int rh = c_up ? wait_status(spawn({self, "mps-client", c_shm, hand, "fresh"}, nullptr)) : -1;
  if (c > 0) {
    kill(c, SIGTERM);
    wait_status(c);
  }
  const bool left = mps_daemon_runs(hand);
  printf("# MPS by hand: daemon up %s; a server with server.mps uses it: %s; client every route: exit %d; "
         "left running at the server's stop: %s\n",
         hand_up ? "yes" : "NO", sc ? "yes" : "NO", rh, left ? "yes" : "NO");
  if (!hand_up || !sc || rh || !left) rc = 1;
  if (system("echo quit | nvidia-cuda-mps-control") != 0) fprintf(stderr, "MPS by hand: quit failed\n");
  unsetenv("CUDA_MPS_PIPE_DIRECTORY");
  unsetenv("CUDA_MPS_LOG_DIRECTORY");
  if (b_up && !kept) rc = 1;
  if (!gone) {
    rc = 1;
    const std::string q = "echo quit | CUDA_MPS_PIPE_DIRECTORY='" + dir + "' nvidia-cuda-mps-control";
    if (system(q.c_str()) != 0) fprintf(stderr, "server.mps: could not stop the daemon at %s\n", dir.c_str());
  }
  if (saved_xdg.empty()) unsetenv("XDG_RUNTIME_DIR");
  else setenv("XDG_RUNTIME_DIR", saved_xdg.c_str(), 1);
  if (!saved_pipe.empty()) setenv("CUDA_MPS_PIPE_DIRECTORY", saved_pipe.c_str(), 1);
  if (rc == 0) {
    const std::string rm = "rm -rf '" + base + "' '" + a_log + "' '" + b_log + "' '" + c_log + "' '" + c_log2 + "'";
    if (system(rm.c_str()) != 0) fprintf(stderr, "server.mps: could not remove %s\n", base.c_str());
  } else {
    fprintf(stderr, "server.mps: logs %s %s %s, directory %s\n", a_log.c_str(), b_log.c_str(), c_log.c_str(),
            base.c_str());
  }
  return rc;
}

/* Where the k-th (from 0) `what` starts in text, or npos. */
static size_t nth(const std::string &text, const char *what, size_t k) {
  size_t at = text.find(what);
  for (; at != std::string::npos && k; --k) at = text.find(what, at + 1);
  return at;
}

/* A client SIGKILLed while a server handler reads its device memory (issue
 * 49, defect 2), once with a CPU handler whose kernels read it
 * (test.mem_hold) and once with a GPU handler in the orchestrator
 * (test.gpu_mem_hold), each reading for 2 s.  The region must stay mapped
 * until the handler's task ended: the server logs it unregistered only
 * after the handler (whose every read must be right) and at least 1 s after
 * the kill; then the server still has its GPU: its orchestrator is not
 * failed, and a new client's kernels on every route and its device memory
 * through both handlers work.  Before the fix the region went at the kill,
 * and the handler's next read of it was a sticky CUDA error. */
static int mem_kill(const std::string &self, const char *shm) {
  const char *gone = "device memory region(s) unregistered";
  int rc = 0;
  for (const char *kind : {"cpu", "gpu"}) {
    const std::string before = read_file(g_server_log);
    size_t gone0 = 0; /* such lines of earlier clients */
    while (nth(before, gone, gone0) != std::string::npos) ++gone0;
    int fd;
    const pid_t c = spawn({self, "mem-hold", shm, kind, "2000"}, &fd);
    const bool said = ready(fd);
    const auto t_kill = std::chrono::steady_clock::now();
    kill(c, SIGKILL);
    const int r = wait_status(c);
    close(fd);
    std::string log;
    size_t at_gone = std::string::npos;
    for (int i = 0; i < 400 && at_gone == std::string::npos; ++i) {
      log = read_file(g_server_log);
      at_gone = nth(log, gone, gone0);
      if (at_gone == std::string::npos) sleep_ms(25);
    }
    const double after = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_kill).count();
    bool right = said && r == 128 + SIGKILL && at_gone != std::string::npos && after >= 1.0;
    if (!strcmp(kind, "cpu")) {
      /* The CPU handler says how it ended, before the region goes. */
      const size_t at_end = log.rfind("test.mem_hold: region");
      const size_t eol = at_end == std::string::npos ? at_end : log.find('\n', at_end);
      const std::string end_line = at_end == std::string::npos ? "(none)" : log.substr(at_end, eol - at_end);
      printf("# mem-kill cpu: handler: %s\n", end_line.c_str());
      right = right && end_line.find("ended after") != std::string::npos &&
              end_line.find("every read right") != std::string::npos && at_end < at_gone;
    }
    char status[8192];
    size_t slen = 0;
    const bool failed = chi_server_query(shm, "status-json", status, sizeof status, &slen) != CHI_OK ||
                        strstr(status, "\"state\":\"failed\"") != NULL;
    const int routes = wait_status(spawn({self, "routes", shm, "4", "20"}, nullptr));
    const int mem = wait_status(spawn({self, "mem", shm}, nullptr));
    printf("# mem-kill %s: client SIGKILLed mid-task (said ready %s, exit %d), region unregistered %s %.2f s after "
           "the kill; GPU %s; next client's routes exit %d, device memory exit %d\n",
           kind, said ? "yes" : "NO", r, at_gone != std::string::npos ? "at" : "NOT SEEN in", after,
           failed ? "FAILED" : "fine", routes, mem);
    if (!right || failed || routes || mem) rc = 1;
  }
  return rc;
}

static int stop_server(pid_t srv, int rc) {
  kill(srv, SIGTERM);
  wait_status(srv);
  if (rc == 0) unlink(g_server_log.c_str());
  else fprintf(stderr, "server log: %s\n", g_server_log.c_str());
  return rc;
}

/* mem_kill_only: the mem-kill case alone (its own ctest). */
static int controller(const std::string &self, bool mem_kill_only) {
  char shm[96], ipc[128];
  snprintf(shm, sizeof shm, "shm://chi-client-gpu-%d", (int)getpid());
  snprintf(ipc, sizeof ipc, "ipc:///tmp/chi-client-gpu-%d.ipc", (int)getpid());
  pid_t srv;
  if (!start_server(shm, ipc, &srv)) {
    fprintf(stderr, "chimaera-server did not answer\n");
    kill(srv, SIGKILL);
    wait_status(srv);
    return 1;
  }
  char status[8192];
  size_t slen = 0;
  if (chi_server_query(shm, "status-json", status, sizeof status, &slen) == CHI_OK && strstr(status, "\"gpus\":0")) {
    kill(srv, SIGTERM);
    wait_status(srv);
    unlink(g_server_log.c_str());
    return 77;
  }
  if (mem_kill_only) return stop_server(srv, mem_kill(self, shm));
  int rc = 0;
  for (const char *a : {(const char *)shm, (const char *)ipc}) {
    const int r = wait_status(spawn({self, "routes", a, "8", "50", "edges"}, nullptr));
    printf("# routes over %s: exit %d\n", a, r);
    if (r == 77) rc = rc ? rc : 77;
    else if (r) rc = 1;
  }
  if (rc == 0) {
    /* Built-ins from a client kernel on the client's own orchestrator, and,
     * with it switched off, on the server's. */
    for (const char *a : {(const char *)shm, (const char *)ipc}) {
      int r = wait_status(spawn({self, "own-orch", a, "own"}, nullptr));
      setenv("CHI_GPU_CLIENT_ORCHESTRATOR", "false", 1);
      const int r2 = wait_status(spawn({self, "own-orch", a, "cross"}, nullptr));
      unsetenv("CHI_GPU_CLIENT_ORCHESTRATOR");
      printf("# own orchestrator over %s: exit %d; crossing: exit %d\n", a, r, r2);
      if (r || r2) rc = 1;
    }
  }
  if (rc == 0) {
    /* A client dies while its kernel submits: the server drops it and serves the next. */
    int fd;
    pid_t hog = spawn({self, "until-failure", shm}, &fd);
    if (!ready(fd)) rc = 1;
    kill(hog, SIGKILL);
    wait_status(hog);
    close(fd);
    bool dropped = false;
    for (int i = 0; i < 400 && !dropped; ++i) {
      dropped = chi_server_query(shm, "status-json", status, sizeof status, &slen) == CHI_OK &&
                strstr(status, "\"clients\":[]") != NULL;
      if (!dropped) sleep_ms(50);
    }
    const int r = wait_status(spawn({self, "routes", shm, "4", "20"}, nullptr));
    printf("# client SIGKILLed mid-kernel: server dropped it %s, next client exit %d\n", dropped ? "yes" : "NO", r);
    if (!dropped || r) rc = 1;
  }
  if (rc == 0) {
    /* Client device memory, over each transport; then a client dies holding regions. */
    for (const char *a : {(const char *)shm, (const char *)ipc})
      if (wait_status(spawn({self, "mem", a}, nullptr))) rc = 1;
    int fd;
    pid_t dier = spawn({self, "mem-die", shm}, &fd);
    const bool said = ready(fd);
    const int r = wait_status(dier);
    close(fd);
    bool dropped = false;
    for (int i = 0; i < 400 && !dropped; ++i) {
      std::string text;
      if (FILE *f = fopen(g_server_log.c_str(), "r")) {
        char buf[4096];
        size_t got;
        while ((got = fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, got);
        fclose(f);
      }
      dropped = text.find("2 device memory region(s) unregistered") != std::string::npos;
      if (!dropped) sleep_ms(50);
    }
    printf("# client SIGKILLed holding 2 device memory regions (exit %d): the server dropped them: %s\n", r,
           dropped ? "yes" : "NO");
    if (!said || r != 128 + SIGKILL || !dropped) rc = 1;
  }
  if (rc == 0) rc = share(self, 8, shm);
  if (rc == 0) rc = server_mps(self);
  if (rc == 0) {
    /* The server dies while a client kernel waits: CHI_ERR_DISCONNECTED, not the timeout. */
    for (const char *a : {(const char *)shm, (const char *)ipc}) {
      int fd;
      pid_t victim = spawn({self, "until-failure", a}, &fd);
      if (!ready(fd)) rc = 1;
      kill(srv, SIGKILL);
      wait_status(srv);
      const int r = wait_status(victim);
      close(fd);
      printf("# server SIGKILLed under a client kernel (%s): client exit %d\n", a, r);
      if (r) rc = 1;
      if (!start_server(shm, ipc, &srv)) rc = 1;
    }
  }
  return stop_server(srv, rc);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return 1;
  self[n] = 0;
  if (argc >= 5 && !strcmp(argv[1], "routes"))
    return client_routes(argv[2], (uint32_t)atoi(argv[3]), (uint32_t)atoi(argv[4]), argc >= 6);
  if (argc >= 3 && !strcmp(argv[1], "until-failure")) return client_until_failure(argv[2]);
  if (argc >= 5 && !strcmp(argv[1], "mps-client")) return mps_client(argv[2], argv[3], !strcmp(argv[4], "touch"));
  if (argc >= 2 && !strcmp(argv[1], "server-mps")) return server_mps(self);
  if (argc >= 4 && !strcmp(argv[1], "busy")) return busy(argv[2], atof(argv[3]));
  if (argc >= 4 && !strcmp(argv[1], "own-orch")) return client_own_orch(argv[2], !strcmp(argv[3], "own"));
  if (argc >= 3 && !strcmp(argv[1], "mem")) return client_mem(argv[2], false);
  if (argc >= 3 && !strcmp(argv[1], "mem-die")) return client_mem(argv[2], true);
  if (argc >= 4 && !strcmp(argv[1], "share")) return share(self, atoi(argv[2]), argv[3]);
  if (argc >= 2 && !strcmp(argv[1], "lat")) return latency(argc >= 3 ? argv[2] : NULL);
  if (argc >= 5 && !strcmp(argv[1], "mem-hold"))
    return client_mem_hold(argv[2], !strcmp(argv[3], "gpu"), strtoull(argv[4], NULL, 10));
  return controller(self, argc >= 2 && !strcmp(argv[1], "mem-kill"));
}

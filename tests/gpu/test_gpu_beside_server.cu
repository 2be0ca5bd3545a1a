/*
 * An ordinary CUDA program beside chimaera on the same GPU (docs/server.md,
 * "GPUs shared by processes").  First while chimaera is idle, without MPS:
 * alone, beside an idle chimaera-server whose GPUs parked, and beside an
 * idle embedded runtime that parked (docs/gpu.md, "Parked GPUs"); then
 * beside a busy server, without MPS and, where nvidia-cuda-mps-control
 * exists, with the MPS control daemon started first in a private pipe
 * directory (scripts/mps.sh):
 *   - a chimaera-server with default settings (its leased orchestrator);
 *   - a client process that keeps CPU->GPU echo tasks flowing through it;
 *   - the neighbour: a process with its own CUDA context and no chimaera,
 *     which times cudaMalloc, a kernel launch + sync, cudaFree,
 *     cudaDeviceSynchronize and a grid-filling FMA kernel of about 0.4 ms
 *     200 times each and checks every kernel's result.
 * The neighbour's rows are printed ("# ..."), never asserted: what is tested
 * is that every call returns, every result is right, and the client's tasks
 * are all right.  Exit 77 without a usable GPU.  One program in three roles
 * (argv[1]: "neighbour", "load ADDRESS", or none: the controller), so that
 * the controller itself never creates a CUDA context before it forks.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "../spawn.h"
#include "chimaera.h"

static volatile sig_atomic_t g_stop;
static void on_term(int) { g_stop = 1; }

/* About 0.4 ms of FMAs on an H200 when it fills the GPU. */
__global__ void k_fma(float *p, int n, int iters) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float a = p[i], b = 1.0001f;
  for (int k = 0; k < iters; ++k) a = a * b + 0.5f;
  p[i] = a;
}

__global__ void k_touch(float *p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = p[i] * 2.0f + 1.0f;
}

static double us_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count();
}

static void row(const char *mode, const char *name, std::vector<double> v) {
  std::sort(v.begin(), v.end());
  printf("# %-7s %-24s n=%4zu p50=%9.1f p99=%9.1f max=%9.1f us\n", mode, name, v.size(), v[v.size() / 2],
         v[std::min(v.size() - 1, v.size() * 99 / 100)], v.back());
}

/* The neighbour: plain CUDA.  Exit 0 all right, 1 a wrong result or a failed
 * call, 77 no GPU. */
static int neighbour(const char *mode) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return 77;
  const int N = 1 << 18, rounds = 200;
  std::vector<float> host(N), back(N);
  std::vector<double> mal, launch, fr, sync, fma;
  cudaEvent_t e0, e1;
  if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) return 1;
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < N; ++i) host[i] = float(i % 1000) + float(r);
    float *p = nullptr;
    auto t = std::chrono::steady_clock::now();
    if (cudaMalloc(&p, N * sizeof(float)) != cudaSuccess) return 1;
    mal.push_back(us_since(t));
    if (cudaMemcpy(p, host.data(), N * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess) return 1;
    t = std::chrono::steady_clock::now();
    k_touch<<<N / 256, 256>>>(p, N);
    if (cudaStreamSynchronize(0) != cudaSuccess) return 1;
    launch.push_back(us_since(t));
    if (cudaMemcpy(back.data(), p, N * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) return 1;
    for (int i = 0; i < N; i += 101)
      if (back[i] != host[i] * 2.0f + 1.0f) {
        fprintf(stderr, "neighbour: round %d word %d is %f\n", r, i, back[i]);
        return 1;
      }
    /* The FMA kernel's own time, from events around it. */
    if (cudaEventRecord(e0, 0) != cudaSuccess) return 1;
    k_fma<<<N / 256, 256>>>(p, N, 26000);
    if (cudaEventRecord(e1, 0) != cudaSuccess || cudaEventSynchronize(e1) != cudaSuccess) return 1;
    float ms = 0;
    if (cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess) return 1;
    fma.push_back(ms * 1000.0);
    t = std::chrono::steady_clock::now();
    if (cudaFree(p) != cudaSuccess) return 1;
    fr.push_back(us_since(t));
    t = std::chrono::steady_clock::now();
    if (cudaDeviceSynchronize() != cudaSuccess) return 1;
    sync.push_back(us_since(t));
  }
  row(mode, "cudaMalloc 1 MiB", mal);
  row(mode, "kernel launch + sync", launch);
  row(mode, "cudaFree", fr);
  row(mode, "cudaDeviceSynchronize", sync);
  row(mode, "FMA kernel (events)", fma);
  return 0;
}

/* The client load: CPU->GPU echo round trips until SIGTERM.  Exit 0 when
 * every result was right (and there was at least one), else 1. */
static int load(const char *address) {
  signal(SIGTERM, on_term);
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.mode = CHI_MODE_CLIENT;
  cfg.server_address = address;
  chi_runtime_t *rt = NULL;
  if (chi_init(&cfg, &rt) != CHI_OK) {
    fprintf(stderr, "load: chi_init: %s\n", chi_last_error_message());
    return 1;
  }
  long ok = 0, bad = 0;
  uint8_t in[64], out[64];
  while (!g_stop) {
    for (int i = 0; i < 64; ++i) in[i] = (uint8_t)(ok + i);
    chi_future_t f;
    size_t n = 0;
    chi_status_t s = chi_submit(rt, CHI_ROUTE_GPU_ANY, CHI_METHOD_ECHO, in, sizeof in, &f);
    if (s == CHI_OK) s = chi_wait(rt, f, 10000000000ll, out, sizeof out, &n);
    if (s == CHI_OK && n == sizeof in && memcmp(in, out, n) == 0) ++ok;
    else ++bad;
  }
  chi_finalize(rt);
  printf("# load: %ld CPU->GPU tasks right, %ld wrong\n", ok, bad);
  return bad == 0 && ok > 0 ? 0 : 1;
}

/* An idle embedded runtime: chi_init with defaults, one CPU->GPU task, then
 * nothing until SIGTERM.  Prints whether its GPUs parked. */
static int idle_embedded(void) {
  signal(SIGTERM, on_term);
  chi_runtime_t *rt = NULL;
  if (chi_init(NULL, &rt) != CHI_OK) {
    fprintf(stderr, "idle: chi_init: %s\n", chi_last_error_message());
    return 1;
  }
  uint8_t in[8] = {1}, out[8];
  chi_future_t f;
  size_t n = 0;
  chi_status_t s = chi_submit(rt, 0, CHI_METHOD_ECHO, in, sizeof in, &f);
  if (s == CHI_OK) s = chi_wait(rt, f, 10000000000ll, out, sizeof out, &n);
  if (s != CHI_OK) fprintf(stderr, "idle: task: %s\n", chi_last_error_message());
  while (!g_stop) pause();
  chi_stats_t st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  chi_stats(rt, &st);
  printf("# idle embedded: parked mask %llx, %llu launches, %llu parks\n", (unsigned long long)st.gpus_parked,
         (unsigned long long)st.gpu_launches, (unsigned long long)st.gpu_parks);
  chi_finalize(rt);
  return s == CHI_OK ? 0 : 1;
}

static pid_t spawn(const std::vector<std::string> &args, const char *log) { return chi_test_spawn(args, log); }

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

/* chimaera idle beside the neighbour, no MPS: alone first, then beside an
 * idle server (after its GPUs parked) and an idle embedded runtime.  The
 * rows are printed; a failed call or wrong result fails.  0, 77 or 1. */
static int idle_rounds(const std::string &self) {
  pid_t nb = spawn({self, "neighbour", "alone"}, nullptr);
  int rc = wait_status(nb);
  if (rc) return rc;
  char address[96], log[128];
  snprintf(address, sizeof address, "shm://chi-beside-%d-idle", (int)getpid());
  snprintf(log, sizeof log, "/tmp/chi-beside-%d-idle.log", (int)getpid());
  pid_t srv = spawn({CHI_SERVER_PATH, "--listen", address}, log);
  char reply[8192];
  size_t len = 0;
  bool parked = false;
  for (int i = 0; i < 600 && !parked; ++i) {
    parked = chi_server_query(address, "status-json", reply, sizeof reply, &len) == CHI_OK &&
             (strstr(reply, "\"state\":\"parked\"") || strstr(reply, "\"gpus\":0")) &&
             !strstr(reply, "\"state\":\"running\""); /* every GPU parked */
    if (!parked) sleep_ms(50);
  }
  if (!parked) {
    fprintf(stderr, "idle server: its GPUs did not park (log %s): %s\n", log, reply);
    kill(srv, SIGKILL);
    wait_status(srv);
    return 1;
  }
  nb = spawn({self, "neighbour", "idle-srv"}, nullptr);
  rc = wait_status(nb);
  chi_server_query(address, "status", reply, sizeof reply, &len);
  printf("# idle server after the neighbour: %.*s\n", (int)len, reply);
  kill(srv, SIGTERM);
  if (wait_status(srv) != 0 && rc == 0) rc = 1;
  if (rc) return rc;
  unlink(log);
  pid_t emb = spawn({self, "idle"}, nullptr);
  sleep_ms(3000); /* started, one task, parked after gpu.keep_alive_us */
  nb = spawn({self, "neighbour", "idle-emb"}, nullptr);
  rc = wait_status(nb);
  kill(emb, SIGTERM);
  if (wait_status(emb) != 0 && rc == 0) rc = 1;
  return rc;
}

/* One round: server, load, neighbour; 0 all right, 77 no GPU, else failed. */
static int round_with(const char *mode, const std::string &self) {
  char address[96], log[128];
  snprintf(address, sizeof address, "shm://chi-beside-%d-%s", (int)getpid(), mode);
  snprintf(log, sizeof log, "/tmp/chi-beside-%d-%s.log", (int)getpid(), mode);
  pid_t srv = spawn({CHI_SERVER_PATH, "--listen", address, "--workers", "2"}, log);
  /* Up once it answers a query. */
  char reply[256];
  size_t len = 0;
  bool up = false;
  for (int i = 0; i < 300 && !up; ++i) {
    up = chi_server_query(address, "ping", reply, sizeof reply, &len) == CHI_OK;
    if (!up) sleep_ms(50);
  }
  if (!up) {
    fprintf(stderr, "%s: chimaera-server did not answer (log %s)\n", mode, log);
    kill(srv, SIGKILL);
    wait_status(srv);
    return 1;
  }
  /* chimaera-ctl status says whether the GPU is shared under MPS. */
  char status[8192];
  size_t slen = 0;
  if (chi_server_query(address, "status-json", status, sizeof status, &slen) != CHI_OK) {
    fprintf(stderr, "%s: status: %s\n", mode, chi_last_error_message());
    kill(srv, SIGKILL);
    wait_status(srv);
    return 1;
  }
  const bool want_mps = strcmp(mode, "MPS") == 0;
  if (!strstr(status, want_mps ? "\"mps\":true" : "\"mps\":false") && strstr(status, "\"gpus\":0") == NULL) {
    fprintf(stderr, "%s: status does not say mps %s: %s\n", mode, want_mps ? "true" : "false", status);
    kill(srv, SIGKILL);
    wait_status(srv);
    return 1;
  }
  pid_t ld = spawn({self, "load", address}, nullptr);
  sleep_ms(300); /* the load is flowing */
  pid_t nb = spawn({self, "neighbour", mode}, nullptr);
  const int nb_status = wait_status(nb);
  kill(ld, SIGTERM);
  const int ld_status = wait_status(ld);
  kill(srv, SIGTERM);
  const int srv_status = wait_status(srv);
  printf("# %s: neighbour exit %d, load exit %d, server exit %d\n", mode, nb_status, ld_status, srv_status);
  if (nb_status == 77) return 77;
  if (nb_status || ld_status || srv_status) {
    fprintf(stderr, "%s: failed; server log %s\n", mode, log);
    return 1;
  }
  /* The server says whether it serves its GPU without MPS. */
  std::string text;
  if (FILE *f = fopen(log, "r")) {
    char buf[4096];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, got);
    fclose(f);
  }
  const bool warned = text.find("without MPS") != std::string::npos;
  if (warned != (strcmp(mode, "no-MPS") == 0)) {
    fprintf(stderr, "%s: the server %s warn about MPS; log:\n%s\n", mode, warned ? "did" : "did not",
            text.c_str());
    return 1;
  }
  unlink(log);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  if (argc >= 3 && !strcmp(argv[1], "neighbour")) return neighbour(argv[2]);
  if (argc >= 3 && !strcmp(argv[1], "load")) return load(argv[2]);
  if (argc >= 2 && !strcmp(argv[1], "idle")) return idle_embedded();
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return 1;
  self[n] = 0;
  int rc = idle_rounds(self);
  if (rc != 0) return rc;
  rc = round_with("no-MPS", self);
  if (rc != 0) return rc;
  /* With MPS: the daemon first, in a private directory, then everything. */
  char dir[128], cmd[512];
  snprintf(dir, sizeof dir, "/tmp/chi-beside-mps-%d", (int)getpid());
  snprintf(cmd, sizeof cmd, "bash '%s/scripts/mps.sh' start '%s' >/dev/null", CHI_SOURCE_DIR, dir);
  int st = system(cmd);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    printf("# MPS: not measured (scripts/mps.sh start: exit %d; 77: no nvidia-cuda-mps-control)\n",
           WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    return 0;
  }
  std::string pipe = std::string(dir) + "/pipe", logs = std::string(dir) + "/log";
  setenv("CUDA_MPS_PIPE_DIRECTORY", pipe.c_str(), 1);
  setenv("CUDA_MPS_LOG_DIRECTORY", logs.c_str(), 1);
  rc = round_with("MPS", self);
  snprintf(cmd, sizeof cmd, "bash '%s/scripts/mps.sh' stop '%s'", CHI_SOURCE_DIR, dir);
  st = system(cmd);
  if (rc == 0 && (!WIFEXITED(st) || WEXITSTATUS(st) != 0)) rc = 1;
  else if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir); /* the daemon is gone: its private directory too */
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  }
  return rc == 77 ? 1 : rc;
}

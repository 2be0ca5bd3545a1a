// chimaera-poll-stagger: whether a GPU thread that polls pinned host memory sees a
// host write sooner when it keeps several loads in flight, issued a gap
// apart, than when it waits for each load before issuing the next (a plain
// spin: one PCIe round trip per look).  No chimaera code; one GPU.
//
//   chimaera-poll-stagger [ROUND_TRIPS]      (CUDA builds with -DCHI_BUILD_LAB=ON)
//
// Two ping-pongs through two pinned words, each in every polling mode, the
// modes in turns over several rounds:
//   cpu->gpu: the host writes req, a GPU thread polls it and writes rsp, the
//             host spins on rsp (the host times each round trip);
//   gpu->cpu: a GPU thread writes req, a host thread spins on it and writes
//             rsp, the GPU thread polls rsp (the GPU times each round trip).
// Modes (kModes): acquire (ld.acquire.sys and a release answer, as the
// bench's floors), volatile loads one at a time, stagger K/G (K volatile
// loads of the word in flight, G ns apart), an acquire poll with a volatile
// answer, a volatile poll with a release answer, and a poll beside a load of
// the next 16 bytes; "nf": no fence after the sighting and a volatile answer,
// as LL words need.  (lab/journal/gpu-routes.md: runs 7 and 8 of 2026-11-27 ran earlier
// lists: volatile loads and staggers followed by __threadfence_system.)
// Prints p50, p90 and the least round trip in us per mode and round.
#include <cuda/atomic>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

struct Mode {
  const char *name;
  int k;        // 0: acquire spin; 1: volatile spin; >1: loads in flight
  unsigned gap; // ns between the first loads
  int relaxed;  // 1: no fence after the sighting, the answer a volatile store (LL-style)
};
// k: 0 acquire spin, 1 volatile spin, 2-8 staggered volatile loads, 10 acquire
// spin with a volatile answer, 11 volatile spin with a release answer, 12 a
// volatile load of the next 16 bytes issued before each volatile poll (two
// loads of one line in flight, as chi_dev_wait's LL output), 13 the same
// with the poll an acquire.
static const Mode kModes[] = {{"acquire", 0, 0, 0},          {"volatile nf", 1, 0, 1},    {"stagger 2/400 nf", 2, 400, 1},
                              {"stagger 4/200 nf", 4, 200, 1}, {"acquire, vol answer", 10, 0, 1},
                              {"vol, release answer", 11, 0, 0}, {"vol pair nf", 12, 0, 1},  {"pair, acquire poll", 13, 0, 1}};
static const int kNModes = sizeof kModes / sizeof kModes[0];

static uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

__device__ __forceinline__ unsigned ld_volatile(const unsigned *p) {
  return *reinterpret_cast<const volatile unsigned *>(p);
}
__device__ __forceinline__ unsigned long long gtimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Waits until *p == want; false after `limit` ns.
template <int K>
__device__ __forceinline__ bool wait_stagger(const unsigned *p, unsigned want, unsigned gap, unsigned long long limit,
                                             int relaxed) {
  const unsigned long long t0 = gtimer();
  unsigned v[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    v[k] = ld_volatile(p);
    if (k + 1 < K) __nanosleep(gap);
  }
  for (;;) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (v[k] == want) {
        if (!relaxed) __threadfence_system();  // what follows the sighting, after it
        return true;
      }
      v[k] = ld_volatile(p);
    }
    if (gtimer() - t0 > limit) return false;
  }
}

__device__ bool wait_mode(const unsigned *p, unsigned want, int k, unsigned gap, unsigned long long limit, int relaxed) {
  const unsigned long long t0 = gtimer();
  if (k == 0 || k == 10) {
    cuda::atomic_ref<unsigned, cuda::thread_scope_system> r(*const_cast<unsigned *>(p));
    while (r.load(cuda::memory_order_acquire) != want)
      if (gtimer() - t0 > limit) return false;
    return true;
  }
  if (k == 12 || k == 13) {
    for (;;) {
      const unsigned side = ld_volatile(p + 4);  // the next 16 bytes, in flight beside the poll
      unsigned v;
      if (k == 13) {
        cuda::atomic_ref<unsigned, cuda::thread_scope_system> r(*const_cast<unsigned *>(p));
        v = r.load(cuda::memory_order_acquire);
      } else {
        v = ld_volatile(p);
      }
      if (v == want && side != 0xFFFFFFFFu) return true;
      if (gtimer() - t0 > limit) return false;
    }
  }
  if (k == 1 || k == 11) {
    while (ld_volatile(p) != want)
      if (gtimer() - t0 > limit) return false;
    if (!relaxed && k == 1) __threadfence_system();
    return true;
  }
  if (k == 2) return wait_stagger<2>(p, want, gap, limit, relaxed);
  if (k == 4) return wait_stagger<4>(p, want, gap, limit, relaxed);
  return wait_stagger<8>(p, want, gap, limit, relaxed);
}

__device__ void put(unsigned *p, unsigned v, int relaxed) {
  if (relaxed) {
    *reinterpret_cast<volatile unsigned *>(p) = v;
    return;
  }
  cuda::atomic_ref<unsigned, cuda::thread_scope_system> r(*p);
  r.store(v, cuda::memory_order_release);
}

// cpu->gpu: answers req[i] == base + i with rsp = base + i.
__global__ void k_pong(unsigned *req, unsigned *rsp, unsigned base, unsigned n, int k, unsigned gap, int relaxed,
                       int *fault) {
  for (unsigned i = 1; i <= n; ++i) {
    if (!wait_mode(req, base + i, k, gap, 2000000000ull, relaxed)) {
      *fault = 1;
      return;
    }
    put(rsp, base + i, relaxed);
  }
}

// gpu->cpu: the GPU asks, the host answers; round trips timed here.
__global__ void k_ping(unsigned *req, unsigned *rsp, unsigned base, unsigned n, int k, unsigned gap, int relaxed,
                       unsigned long long *ns, int *fault) {
  for (unsigned i = 1; i <= n; ++i) {
    const unsigned long long t0 = gtimer();
    put(req, base + i, relaxed);
    if (!wait_mode(rsp, base + i, k, gap, 2000000000ull, relaxed)) {
      *fault = 1;
      return;
    }
    ns[i - 1] = gtimer() - t0;
  }
}

static void report(const char *dir, const char *mode, int round, std::vector<uint64_t> &v) {
  std::sort(v.begin(), v.end());
  printf("%-8s %-14s round %d  p50 %6.3f us  p90 %6.3f us  min %6.3f us\n", dir, mode, round, v[v.size() / 2] / 1e3,
         v[v.size() * 9 / 10] / 1e3, v[0] / 1e3);
}

int main(int argc, char **argv) {
  const unsigned n = argc > 1 ? unsigned(atoi(argv[1])) : 20000u;
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    fprintf(stderr, "no GPU\n");
    return 77;
  }
  CK(cudaSetDeviceFlags(cudaDeviceMapHost));
  unsigned *words;  // req at [0], rsp at [32]: own cache lines
  int *fault;
  unsigned long long *ns;
  CK(cudaHostAlloc(&words, 256, cudaHostAllocMapped));
  CK(cudaHostAlloc(&fault, sizeof(int), cudaHostAllocMapped));
  CK(cudaMalloc(&ns, n * sizeof(unsigned long long)));
  memset(words, 0, 256);
  unsigned *req = words, *rsp = words + 32;
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::vector<uint64_t> v(n);
  std::vector<unsigned long long> g(n);
  unsigned base = 0;
  for (int round = 1; round <= 3; ++round) {
    for (int m = 0; m < kNModes; ++m) {
      const Mode &md = kModes[m];
      // cpu->gpu
      *fault = 0;
      __atomic_store_n(req, base, __ATOMIC_SEQ_CST);
      __atomic_store_n(rsp, base, __ATOMIC_SEQ_CST);
      k_pong<<<1, 1, 0, st>>>(req, rsp, base, n, md.k, md.gap, md.relaxed, fault);
      CK(cudaGetLastError());
      for (unsigned i = 1; i <= n; ++i) {
        const uint64_t t0 = now_ns();
        __atomic_store_n(req, base + i, __ATOMIC_RELEASE);
        while (__atomic_load_n(rsp, __ATOMIC_ACQUIRE) != base + i)
          if (now_ns() - t0 > 2000000000ull) {
            fprintf(stderr, "cpu->gpu %s: no answer\n", md.name);
            return 1;
          }
        v[i - 1] = now_ns() - t0;
      }
      CK(cudaStreamSynchronize(st));
      if (*fault) return 1;
      report("cpu->gpu", md.name, round, v);
      base += n + 1;
      // gpu->cpu
      __atomic_store_n(req, base, __ATOMIC_SEQ_CST);
      __atomic_store_n(rsp, base, __ATOMIC_SEQ_CST);
      std::atomic<bool> quit{false};
      std::thread host([&] {
        for (unsigned i = 1; i <= n && !quit.load(std::memory_order_relaxed);) {
          if (__atomic_load_n(req, __ATOMIC_ACQUIRE) == base + i) {
            __atomic_store_n(rsp, base + i, __ATOMIC_RELEASE);
            ++i;
          }
        }
      });
      k_ping<<<1, 1, 0, st>>>(req, rsp, base, n, md.k, md.gap, md.relaxed, ns, fault);
      CK(cudaGetLastError());
      CK(cudaStreamSynchronize(st));
      quit = true;
      host.join();
      if (*fault) {
        fprintf(stderr, "gpu->cpu %s: no answer\n", md.name);
        return 1;
      }
      CK(cudaMemcpy(g.data(), ns, n * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
      for (unsigned i = 0; i < n; ++i) v[i] = g[i];
      report("gpu->cpu", md.name, round, v);
      base += n + 1;
    }
  }
  return 0;
}

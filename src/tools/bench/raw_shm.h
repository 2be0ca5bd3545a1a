// Raw shared-memory floors of the client sweep and of the wake-up target:
// the same shape as chimaera's (N client processes, one round trip at a time
// each, one server process with as many serving threads as the server has
// shm pollers, 64-byte request and reply) with nothing but a pair of slots
// per client in one memfd segment and the same waiting policy as chimaera's
// clients and pollers, so that what chimaera adds to it is its own code.
// Children are fork()ed, so call these where the bench has no other threads.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "bench_row.h"

namespace chi_bench {

inline constexpr uint32_t kRawPayloadBytes = 64;  // request and reply

enum RawWait : int {
  kRawPolicy = 0,  // spin as chimaera does, then sleep on a futex (both sides)
  kRawSpin = 1,    // never sleep: spin, yielding the CPU after 20 us
};

struct RawShmOptions {
  uint32_t threads = 1;               // serving threads of the raw server process
  int64_t client_spin_ns = 0;         // kRawPolicy: a waiting client spins this long
  int64_t server_spin_ns = 0;         // kRawPolicy: an idle serving thread spins this long
  uint64_t duration_ms = 1000;        // each sweep point
  uint64_t warmup = 1000;             // untimed round trips, all clients (each at least 100)
  uint64_t sample_budget = 4u << 20;  // latency samples kept, all clients
};

// The spin lengths chimaera's shm clients and pollers use here:
// CHI_SPIN_NS and CHI_SERVER_SPIN_NS, else the built-in 50 us, and 0 below
// 4 CPUs (client.cpp wait_spin_ns(), shm_pollers.cpp).  A config file's
// values are not read.
void raw_default_spins(int64_t *client_spin_ns, int64_t *server_spin_ns);

// One sweep point: n client processes, each doing 64-byte echo round trips
// one at a time for o.duration_ms; *row: "raw shm sweep Np" (kRawPolicy) or
// "raw shm spin Np" (kRawSpin) with tasks/s, p50, p99, or failed with why.
void raw_shm_sweep_point(const RawShmOptions &o, int wait, uint32_t n, chi_bench_row *row);

struct RawWakeFigures {
  bool measured = false;
  uint64_t count = 0;                               // round trips after idle
  uint64_t oneway_count = 0;                        // of them, with the server thread seen asleep
  double idle_ms = NAN;                             // quiet before each
  double rt_p50_ns = NAN, rt_max_ns = NAN;          // first round trip after idle
  double oneway_p50_ns = NAN, oneway_max_ns = NAN;  // futex_wake to the sleeper running
  std::string note;                                 // why something is missing
};

// One client process and one serving thread, both sleeping on a futex at
// once (no spin): `samples` round trips, each after idle_ms of quiet.  The
// one-way figure: the client stamps CLOCK_MONOTONIC right before its
// futex_wake of the sleeping server thread, which stamps it again as soon as
// it runs.
void raw_shm_wake(uint64_t idle_ms, uint32_t samples, RawWakeFigures *f);

}  // namespace chi_bench

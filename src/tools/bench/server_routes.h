// Client->server rows (chimaera-bench --server): round trip and pipelined
// throughput from client processes over each transport (shm://, ipc://,
// tcp:// loopback, tcp:// with CURVE), then, over shm://, the client-count
// sweep, the idle cost of connected clients and fairness under a flooding
// client.  shm rows name floor.xproc_pingpong, ZeroMQ rows the raw libzmq
// floors of their transport (zmq_floors.h), all measured in the same run.
// One started server serves shm, ipc and tcp at once; CURVE applies to every
// tcp:// address of a server with keys, so tcp-curve rows go to a second
// server, started after the first has stopped.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "bench_row.h"
#include "raw_shm.h"
#include "server_proc.h"
#include "zmq_floors.h"

namespace chi_bench {

// Targets of the server issues (docs/performance.md).
inline constexpr double kServerTargetP50Ns = 1500.0;        // round trip, one client
inline constexpr double kServerTargetThroughput = 5e6;      // 8 client processes
inline constexpr double kServerTargetIdleCpuPct = 2.0;      // idle clients connected
inline constexpr double kServerTargetWakeP50Ns = 20000.0;   // first task after idle
inline constexpr double kServerTargetFairness = 5.0;        // light p99 flooded / alone
// ZeroMQ transports (issue 8): ipc://, tcp://, tcp:// with CURVE.
inline constexpr double kZmqTargetP50Ns = 40000.0;          // round trip, one client
inline constexpr double kZmqTargetThroughput = 1e6;         // 8 client processes

// --client-mps: the client kernel rows again from a fresh client process
// under MPS started by hand (a daemon in a private pipe directory) and under
// the server's own (server.mps), each beside the no-MPS ones, named
// "client gpu0->... (MPS)" and "(server MPS)".  Without
// nvidia-cuda-mps-control: a note on stderr and no rows.
void client_gpu_mps_rows(const chi_bench_options &opt, const std::string &bin, int32_t workers,
                         const char *config, std::vector<chi_bench_row> &rows);
// That fresh process: chimaera-bench --client-gpu-rows ADDRESS FILE ITERS
// WARMUP PAYLOAD (chi_init before any CUDA call, the two rows written to
// FILE as chi_bench_row records).
int client_gpu_rows_main(int argc, char **argv);

struct ServerOptions {
  std::string server;            // ADDR, or "start"; empty: no client->server rows
  std::string server_bin;        // --server start: the binary (default: next to this one)
  std::vector<int> transports;   // --transports (enum Transport); empty: the default
  uint32_t procs = 8;            // client processes of the multi-process pipelined row
  std::vector<uint32_t> clients; // --clients sweep; empty: none
  uint32_t fairness = 0;         // clients of the fairness run (one floods); 0: none
  uint32_t flood_window = 512;   // the flooding client's tasks in flight
  uint64_t client_ms = 1000;     // length of each sweep and fairness run
  uint64_t idle_ms = 2000;       // idle-CPU window; wake-ups follow idle_ms / 2 of idle
  uint32_t wake_samples = 5;     // wake-up round trips (each on another client)
  uint64_t sample_budget = 4u << 20;  // latency samples kept per run, all clients
  bool client_mps = false;       // --client-mps: the client rows under MPS by hand and server.mps too
  bool client_gpu = false;       // a client kernel's rows too (main.cpp: set when this
                                 // process's embedded runtime drove a GPU)
};

struct IdleFigures {
  bool measured = false;
  uint32_t clients = 0;        // connected and idle
  double seconds = NAN;        // CPU window
  double cpu_pct = NAN;        // server CPU over the window, % of one core
  double rss_base_kib = NAN;   // server RSS before any bench client
  double rss_kib = NAN;        // server RSS with `clients` connected
  uint64_t wake_count = 0;
  double wake_idle_ms = NAN;   // idle before each wake-up task
  double wake_p50_ns = NAN, wake_max_ns = NAN;
  std::string note;            // why something is missing
};

struct FairnessFigures {
  bool measured = false;
  uint32_t clients = 0;        // 1 flooder + clients - 1 light ones
  double ratio = NAN;          // light p99 with the flooder / light p99 alone
  std::string note;
};

// The rows of one transport: where they went and which floors they name.
struct TransportRun {
  int transport = 0;            // enum Transport
  std::string address;
  pid_t server_pid = -1;
  bool curve_server = false;    // served by the second (CURVE) server
  std::string floor;            // of the round-trip row
  std::string pipe_floor;       // of the pipelined rows ("" for shm: no ratio)
};

struct ServerReport {
  bool enabled = false;
  ServerProc server;
  ServerProc curve_server;              // --server start with tcp-curve: the second server
  std::vector<TransportRun> transports;
  uint32_t server_workers = 0;          // from chi_stats
  uint32_t server_pollers = 0;          // shm pollers, from status-json; 0: unknown
  std::vector<chi_bench_row> sweep;     // one row per client count
  IdleFigures idle;
  FairnessFigures fairness;             // rows "fair.*" are in `fair`
  std::vector<chi_bench_row> fair;
  // With the sweep: its raw shm floors, same counts and length (raw_shm.h).
  uint32_t raw_threads = 0;          // the raw server's serving threads
  bool raw_threads_default = false;  // pollers unknown: the server's default count
  int64_t raw_client_spin_ns = 0, raw_server_spin_ns = 0;
  std::vector<chi_bench_row> raw_sweep;  // "raw shm sweep Np": chimaera's waiting policy
  std::vector<chi_bench_row> raw_spin;   // "raw shm spin Np": nobody sleeps
  RawWakeFigures raw_wake;               // the floor of the first task after idle
  uint64_t client_ms = 0;
  uint32_t flood_window = 0;
};

// The transports a run measures: --transports, else (--server start) all
// four, else the one of the --server address (tcp:// counts as tcp-curve
// when CHI_CURVE_SERVER_KEY is set).
std::vector<int> server_transports(const ServerOptions &so);

// Starts or attaches the server, adds the client->server latency and
// pipelined rows to `rows` (with so.client_gpu also "client gpu0->cpu" and
// "client gpu0->local", each after the embedded row of its route), runs the
// sweep, idle and fairness parts into *rep, stops a started server; with a
// sweep, then its raw shm floors (raw_shm.h) into *rep.  Returns false (err set) when no server
// could be started or reached; failures of single rows are in those rows.
bool run_server_rows(const chi_bench_options &opt, const ServerOptions &so, int32_t workers,
                     const char *config, std::vector<chi_bench_row> &rows, ServerReport *rep,
                     std::string *err);

}  // namespace chi_bench

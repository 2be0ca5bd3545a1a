// Runtime settings: built-in defaults, chimaera.yaml, CHI_* environment and
// chi_config_t, merged in that order of priority (lowest first).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/log.h"
#include "chimaera.h"

namespace chi {

struct GpuConfig {
  int32_t devices = -1;            // -1: all visible, 0: none, n: the first n (error if fewer)
  uint32_t blocks = 0;             // orchestrator grid size, 1..1024; 0: one per 8 SMs, 1..16
  uint32_t warps_per_block = 4;    // orchestrator block size in warps, 1..32 (over 16 lowered)
  uint32_t queue_depth = 1024;     // CPU->GPU task slots per GPU, power of two, 2..1<<20
  uint32_t device_slots = 8192;    // GPU->GPU and GPU->CPU slots per GPU each, power of two, 32..1<<22
  uint32_t max_payload = 4096;     // inline payload limit of GPU slots, bytes, 0..max_inline_payload
  uint32_t poll_interval_us = 50;  // longest sleep of an idle GPU->CPU poller, 0..100000
  int64_t poller_spin_ns = 200000; // GPU->CPU poller spins this long before backing off, 0..1e10
  uint32_t poller_park_after_us = 10000;    // idle this long, a GPU's pollers park (one watches); 0: never, 0..100000000
  uint32_t poller_watch_interval_us = 100;  // longest nap of the watching poller while parked, 1..1000000
  uint32_t poller_bell_check_us = 10000;   // parked watcher sleeps on the GPU's bell at most this long; 0: no bell
  uint32_t poller_steal_us = 50;   // an idle poller takes a held-up poller's next task after this; 0: never, 0..10000000
  bool client_orchestrator = true;   // a client runs its own orchestrator for its kernels' GPU->GPU built-ins
  bool peer_routes = false;          // device code may submit to another GPU over peer memory (experimental)
  uint32_t keep_alive_us = 20000;   // an idle GPU parks (no kernel) after this; 0: never, 0..10000000
  uint32_t idle_lease_us = 0;              // lease while the GPU routes are idle (pollers on the bell); 0: lease_us
  uint32_t device_submit_timeout_us = 1000000;  // chi_dev_submit waits this long for a free slot, 0..600000000
  uint32_t lease_us = 1000;        // orchestrator kernel ends and is relaunched after this, 0 (never)..1000000
};

struct ServerConfig {
  std::vector<std::string> listen;   // addresses to serve; empty: this user's default server
  uint32_t pollers = 0;              // threads polling client rings; 0: 1 per CPU (1..64), 1..64
  uint32_t client_slots = 1024;      // task slots (= ring depth) per client, power of two, 2..1<<16
  uint32_t max_clients = 1024;       // client sessions at once, 1..65536
  uint32_t client_max_in_flight = 0; // server task slots one client may hold; 0: queue_depth / 4, at most 1024
  int64_t spin_ns = 50000;           // an idle poller spins this long, then sleeps, 0..1e10
  int64_t yield_ns = 0;              // ... then polls with sched_yield this long, 0..1e10
  bool mps = false;                  // start (or reuse) this user's MPS daemon before the first CUDA context
  bool inline_builtins = true;       // built-in methods (CPU route) run on the poller that took them
  uint32_t shutdown_timeout_ms = 5000;  // stop: how long running client tasks may finish, 0..3600000
  uint32_t hello_timeout_ms = 1000;     // a new connection's hello must come within this, 1..3600000
  std::string curve_key_file;           // tcp:// CURVE: the server's secret key (z85), mode 0600
  std::string curve_allowed_keys_file;  // tcp:// CURVE: client public keys (z85), one per line
};

struct Config {
  int32_t mode = CHI_MODE_EMBEDDED;
  std::string server_address;          // client mode only
  uint32_t workers = 0;                // CPU worker threads; 0: hardware threads (at least 2), 1..1024
  uint32_t queue_depth = 131072;       // most CPU task slots in use at once, power of two, 2..1<<20;
                                       // slot memory is committed as the pool first needs it
  uint32_t max_inline_payload = 4096;  // bytes, 0..1 MiB
  int64_t spin_ns = 50000;             // waiters and idle workers spin this long, then futex sleep, 0..1e10
  uint32_t worker_pop_batch = 0;       // tasks a worker takes from a shared queue at once, 1..8;
                                       // 0: 4 with 16+ hardware threads, else 1
  uint32_t worker_spinners = 0;        // idle workers that spin (spin_ns) at once, 1..1024; 0: half the CPUs, at most 4
  int64_t client_yield_ns = 1000000;   // a client's waiter then polls with sched_yield this long, 0..1e10
  uint32_t client_spin_min_cpus = 4;   // clients spin and yield only on machines of at least this many CPUs
  bool submit_blocking = true;         // full slots: block (up to submit_timeout_ms) or fail with CHI_ERR_AGAIN
  bool inline_wait = false;            // embedded: a waiter runs tasks still queued on its thread's queue
  uint32_t submit_timeout_ms = 1000;   // bound of a blocking submit, 0..3600000
  uint64_t worker_stack_size = 0;      // CPU worker stacks, bytes; 0: the system default for new
                                       // threads (ulimit -s), else 64 KiB..64 GiB
  LogLevel log_level = LogLevel::kWarn;
  std::vector<std::string> modules;    // shared objects loaded at start-up
  uint32_t disconnect_check_ms = 100;  // client: a waiter rechecks the server this often, 1..60000
  uint32_t connect_timeout_ms = 5000;  // client: chi_init's bound for the server's welcome, 1..3600000
  std::string curve_server_key;        // client, tcp:// CURVE: the server's public key (z85)
  std::string curve_key_file;          // client, tcp:// CURVE: this client's secret key (z85), mode 0600
  GpuConfig gpu;
  ServerConfig server;
};

// Builds *out from defaults, then the file (cfg->config_path, else $CHI_CONFIG,
// else none), then CHI_* environment variables, then cfg->settings (YAML text
// like the file, dotted keys allowed), then non-default fields of cfg (which
// may be NULL).  On failure returns CHI_ERR_CONFIG (or CHI_ERR_INVALID
// for a bad chi_config_t) and sets *error to a message that names
// file:line:column for file errors, or the variable for environment errors.
chi_status_t load_config(const chi_config_t *cfg, Config *out, std::string *error);

// Parses YAML text as if read from `path` (used by load_config and the tests).
chi_status_t parse_config_text(const std::string &text, const std::string &path, Config *out,
                               std::string *error);

}  // namespace chi

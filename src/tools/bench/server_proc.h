// The processes behind chimaera-bench's client->server rows: the server (a
// chimaera-server child the bench starts, or one already running), what
// /proc says about it, and pools of client processes.  A pool worker is this
// binary re-executed as `chimaera-bench --client-worker FD:INDEX`: it connects
// as a client, then runs the work the parent writes into a shared memfd (FD),
// and writes its results and latency samples back there.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "chimaera.h"

namespace chi_bench {

struct ServerProc {
  std::string address;      // "shm://NAME": ping, status and the shm rows
  std::string ipc_address;  // started with ipc: "ipc://DIR/server.ipc"
  std::string tcp_address;  // started with tcp or tcp-curve: "tcp://127.0.0.1:PORT"
  bool curve = false;       // CURVE is on for tcp_address
  std::string client_config;  // curve: YAML with curve_server_key and curve_key_file
  std::vector<std::string> files;  // started: keys and YAML the bench wrote (removed at stop)
  bool started = false;     // the bench started it (and stops it)
  pid_t pid = -1;           // the server's pid; -1: unknown
  std::string bin;          // started: the chimaera-server binary
  std::string runtime_dir;  // started: the private CHI_RUNTIME_DIR
  std::string log_path;     // started: the server's stderr
  int exit_status = -1;     // started and stopped: its exit status (-1: killed or unknown)
};

// chimaera-server next to this binary (the build's src/tools, or bin/).
std::string default_server_bin();

// What a started server serves besides its shm:// address.
struct ServerListen {
  bool ipc = false;        // ipc://DIR/server.ipc
  bool tcp = false;        // tcp://127.0.0.1:PORT (a free port)
  bool curve = false;      // with tcp: CURVE on (keys made in DIR)
  std::string suffix;      // appended to the shm name
};

// Makes a private (0700) runtime directory, sets CHI_RUNTIME_DIR to it in
// this process (clients started later inherit it) and starts
// `bin [--listen ipc://...] [--listen tcp://...] --listen
// shm://chimaera-bench-PID[SUFFIX] [--workers N] [--config PATH]`, its stderr
// in a log file there; returns once the server answers ping on the shm://
// address, started last.  With curve: a server
// and a client key pair (libzmq's zmq_curve_keypair) in that directory, the
// client's public key the only one allowed; the server gets them through a
// --config YAML there, or, when `config` is given, through
// CHI_SERVER_CURVE_KEY_FILE and CHI_SERVER_CURVE_ALLOWED_KEYS_FILE in its
// environment; clients through client_config.
bool start_server(const std::string &bin, int32_t workers, const char *config,
                  const ServerListen &listen, ServerProc *out, std::string *err);

// An existing server: checks it answers ping; its pid from status-json.
bool attach_server(const char *address, ServerProc *out, std::string *err);

// Started servers: SIGTERM, wait (SIGKILL after 20 s), remove the directory.
void stop_server(ServerProc *s);

// utime + stime of every thread of pid, in seconds (/proc/PID/stat); NaN: unreadable.
double proc_cpu_seconds(pid_t pid);
// VmRSS of pid in KiB (/proc/PID/status); NaN: unreadable.
double proc_rss_kib(pid_t pid);
// The server's shm:// poller threads (status-json); -1: unknown.
int server_poller_count(const std::string &address);
// Client sessions the server lists (status-json); -1: unknown.
int server_client_count(const std::string &address);

enum WorkMode : uint32_t {
  kWorkNone = 0,       // this worker takes no part in the run (it is not woken)
  kWorkRoundTrip = 1,  // one task at a time, each timed
  kWorkPipeline = 2,   // `window` tasks outstanding, one in sample_every timed
};

// What one worker does in a run.  Every result is checked: chi.echo returns
// its (distinct) input, chi.add the sum.
struct Work {
  uint32_t mode = kWorkNone;
  chi_method_t method = CHI_METHOD_ADD;
  uint32_t payload = 64;      // chi.echo bytes (chi.add: always 16 in, 8 out)
  uint32_t window = 1;
  uint32_t sample_every = 1;
  uint64_t warmup = 0;        // untimed tasks first, before the common start
  uint64_t count = 0;         // timed tasks; 0: until the run's duration is over
};

struct WorkResult {
  chi_status_t status = CHI_OK;
  std::string error;
  uint64_t done = 0;                  // timed tasks completed and checked
  uint64_t start_ns = 0, end_ns = 0;  // CLOCK_MONOTONIC (common to all processes)
  std::vector<uint64_t> samples;      // latencies (a uniform subset when many)
};

class ClientPool {
 public:
  ClientPool() = default;
  ClientPool(const ClientPool &) = delete;
  ClientPool &operator=(const ClientPool &) = delete;
  ~ClientPool() { stop(); }

  // Starts n workers connected to address and waits until every one is (or
  // one failed).  Each keeps at most sample_budget / n latency samples a run.
  // config: the workers' chi_config_t.config_path (empty: none).
  bool start(const std::string &address, uint32_t n, uint64_t sample_budget, std::string *err,
             const std::string &config = std::string());

  // Runs work[i] on worker i (work.size() == size()): every taking part
  // warms up, then all start together; count == 0 work stops duration_ns
  // after the start.  *t0: the start, *t1: the last worker's end.  Returns
  // false when a worker died or the run overran its bound (err says which);
  // a worker's own failure is in its result.
  bool run(const std::vector<Work> &work, uint64_t duration_ns, uint64_t *t0, uint64_t *t1,
           std::vector<WorkResult> *results, std::string *err);

  // Every worker finalizes its runtime and exits; stragglers are killed.
  void stop();

  uint32_t size() const { return n_; }
  const std::vector<pid_t> &pids() const { return pids_; }

 private:
  bool alive(std::string *err);

  void *mem_ = nullptr;
  size_t mem_size_ = 0;
  int fd_ = -1;
  uint32_t n_ = 0;
  std::vector<pid_t> pids_;
};

// Entry of `chimaera-bench --client-worker FD:INDEX` (exit status).
int client_worker_main(const char *arg);

}  // namespace chi_bench

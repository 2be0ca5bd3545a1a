#include "server_routes.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>

#include "bench_gpu.h"
#include "cpu_floors.h"
#include "cpu_routes.h"
#include "tool_util.h"

extern char **environ;

namespace chi_bench {
namespace {

void sleep_ms(uint64_t ms) {
  struct timespec ts = {time_t(ms / 1000), long(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

void init_row(chi_bench_row *row, const char *name, int kind, chi_method_t method,
              uint32_t payload, uint32_t procs, const char *floor = kXprocFloor,
              int transport = kShm) {
  chi_bench_row_init(row, name, kind);
  std::snprintf(row->route, sizeof row->route, "CHI_ROUTE_CPU");
  std::snprintf(row->method, sizeof row->method, "%s",
                method == CHI_METHOD_ADD ? "chi.add" : "chi.echo");
  std::snprintf(row->floor, sizeof row->floor, "%s", floor);
  std::snprintf(row->transport, sizeof row->transport, "%s", transport_name(transport));
  row->payload_bytes = method == CHI_METHOD_ADD ? 16 : payload;
  row->processes = procs;
  row->threads = procs;
}

// Folds the results of the workers in [first, last) into *row: samples,
// timed tasks, first failure.  Returns the tasks done.
uint64_t fold(const std::vector<WorkResult> &res, size_t first, size_t last, chi_bench_row *row) {
  std::vector<uint64_t> samples;
  uint64_t done = 0;
  for (size_t i = first; i < last; i++) {
    const WorkResult &r = res[i];
    done += r.done;
    samples.insert(samples.end(), r.samples.begin(), r.samples.end());
    if (r.status != CHI_OK && row->status == CHI_OK)
      chi_bench_row_fail(row, r.status, "client %zu: %s", i + 1, r.error.c_str());
  }
  if (row->status == CHI_OK) {
    double tput = row->throughput;
    chi_bench_row_samples(row, samples.data(), samples.size());
    row->throughput = tput;
  }
  row->count = done;
  return done;
}

// "client->server" for shm (the names of the first server rows), else
// "client->server ipc" and so on.
std::string row_name(int t) {
  return t == kShm ? std::string("client->server") : std::string("client->server ") + transport_name(t);
}

// Pipelined chi.echo from `procs` client processes sharing opt.tput_tasks.
void pipelined(const chi_bench_options &opt, const ServerOptions &so, const TransportRun &tr,
               const std::string &config, uint32_t procs, chi_bench_row *row) {
  char name[48];
  std::snprintf(name, sizeof name, "%s pipelined %up", row_name(tr.transport).c_str(), procs);
  init_row(row, name, CHI_BENCH_THROUGHPUT, CHI_METHOD_ECHO, opt.payload, procs,
           tr.transport == kShm ? kXprocFloor : tr.pipe_floor.c_str(), tr.transport);
  row->window = opt.window;
  if (procs >= 8)
    row->target_throughput = tr.transport == kShm ? kServerTargetThroughput : kZmqTargetThroughput;
  ClientPool pool;
  std::string err;
  if (!pool.start(tr.address, procs, so.sample_budget, &err, config)) {
    chi_bench_row_fail(row, CHI_ERR_DISCONNECTED, "%s", err.c_str());
    return;
  }
  Work w;
  w.mode = kWorkPipeline;
  w.method = CHI_METHOD_ECHO;
  w.payload = opt.payload;
  w.window = opt.window;
  w.sample_every = 16;
  w.warmup = std::max<uint64_t>(opt.warmup / procs, 2ull * opt.window);
  w.count = std::max<uint64_t>(opt.tput_tasks / procs, 1);
  std::vector<WorkResult> res;
  uint64_t t0 = 0, t1 = 0;
  if (!pool.run(std::vector<Work>(procs, w), 0, &t0, &t1, &res, &err)) {
    chi_bench_row_fail(row, CHI_ERR_INTERNAL, "%s", err.c_str());
    return;
  }
  uint64_t done = fold(res, 0, procs, row);
  if (row->status == CHI_OK && done != w.count * procs)
    chi_bench_row_fail(row, CHI_ERR_INTERNAL, "%llu of %llu tasks done",
                       static_cast<unsigned long long>(done),
                       static_cast<unsigned long long>(w.count * procs));
  if (row->status == CHI_OK && t1 > t0) row->throughput = double(done) * 1e9 / double(t1 - t0);
}

Work round_trips(uint64_t warmup) {
  Work w;
  w.mode = kWorkRoundTrip;
  w.method = CHI_METHOD_ADD;
  w.window = 1;
  w.sample_every = 1;
  w.warmup = warmup;
  return w;
}

// With every client of `pool` connected and idle: the server's CPU use and
// RSS, then single round trips after idle_ms / 2 of quiet each.
void idle_figures(const ServerOptions &so, const ServerProc &srv, ClientPool &pool,
                  IdleFigures *f) {
  f->measured = true;
  f->clients = pool.size();
  sleep_ms(300);  // pollers and client waiters go from spinning to sleeping
  f->rss_kib = proc_rss_kib(srv.pid);
  double c0 = proc_cpu_seconds(srv.pid);
  uint64_t w0 = chi_tool_now_ns();
  sleep_ms(so.idle_ms);
  double c1 = proc_cpu_seconds(srv.pid);
  uint64_t w1 = chi_tool_now_ns();
  f->seconds = double(w1 - w0) / 1e9;
  if (!std::isnan(c0) && !std::isnan(c1)) f->cpu_pct = (c1 - c0) / f->seconds * 100.0;
  else f->note = "server CPU and RSS need its pid and /proc access";

  std::vector<uint64_t> wakes;
  f->wake_idle_ms = double(so.idle_ms) / 2;
  for (uint32_t k = 0; k < so.wake_samples; k++) {
    sleep_ms(so.idle_ms / 2);
    std::vector<Work> work(pool.size());
    Work &w = work[size_t(k) * pool.size() / so.wake_samples];
    w = round_trips(0);
    w.count = 1;
    std::vector<WorkResult> res;
    uint64_t t0 = 0, t1 = 0;
    std::string err;
    if (!pool.run(work, 0, &t0, &t1, &res, &err)) {
      f->note = "wake-up: " + err;
      break;
    }
    for (const auto &r : res) {
      if (r.status != CHI_OK) f->note = "wake-up: " + r.error;
      wakes.insert(wakes.end(), r.samples.begin(), r.samples.end());
    }
  }
  chi_tool_stats_t st;
  chi_tool_summarize(wakes.data(), wakes.size(), &st);
  f->wake_count = st.count;
  f->wake_p50_ns = st.p50_ns;
  f->wake_max_ns = st.max_ns;
}

void sweep_point(const chi_bench_options &opt, const ServerOptions &so, const ServerProc &srv,
                 uint32_t n, bool last, chi_bench_row *row, IdleFigures *idle) {
  char name[48];
  std::snprintf(name, sizeof name, "sweep chi.add %up", n);
  init_row(row, name, CHI_BENCH_LATENCY, CHI_METHOD_ADD, 16, n);
  ClientPool pool;
  std::string err;
  if (!pool.start(srv.address, n, so.sample_budget, &err)) {
    chi_bench_row_fail(row, CHI_ERR_DISCONNECTED, "%s", err.c_str());
    return;
  }
  int listed = server_client_count(srv.address);
  if (srv.started && listed >= 0 && uint32_t(listed) != n)
    std::fprintf(stderr, "chimaera-bench: %s: the server lists %d clients, not %u\n", name, listed,
                 n);
  Work w = round_trips(std::max<uint64_t>(opt.warmup / n, 100));
  std::vector<WorkResult> res;
  uint64_t t0 = 0, t1 = 0;
  if (!pool.run(std::vector<Work>(n, w), so.client_ms * 1000000ull, &t0, &t1, &res, &err)) {
    chi_bench_row_fail(row, CHI_ERR_INTERNAL, "%s", err.c_str());
    return;
  }
  uint64_t done = fold(res, 0, n, row);
  if (row->status == CHI_OK && t1 > t0) row->throughput = double(done) * 1e9 / double(t1 - t0);
  if (last) idle_figures(so, srv, pool, idle);
}

void fairness(const chi_bench_options &opt, const ServerOptions &so, const ServerProc &srv,
              ServerReport *rep) {
  const uint32_t n = so.fairness;
  FairnessFigures &f = rep->fairness;
  f.measured = true;
  f.clients = n;
  rep->fair.resize(3);
  char name[48];
  std::snprintf(name, sizeof name, "fair light alone %up", n - 1);
  init_row(&rep->fair[0], name, CHI_BENCH_LATENCY, CHI_METHOD_ADD, 16, n - 1);
  std::snprintf(name, sizeof name, "fair light+flooder %up", n - 1);
  init_row(&rep->fair[1], name, CHI_BENCH_LATENCY, CHI_METHOD_ADD, 16, n - 1);
  std::snprintf(name, sizeof name, "fair flooder w%u", so.flood_window);
  init_row(&rep->fair[2], name, CHI_BENCH_THROUGHPUT, CHI_METHOD_ADD, 16, 1);
  rep->fair[2].window = so.flood_window;
  auto fail_all = [&](chi_status_t st, const std::string &why) {
    for (auto &r : rep->fair)
      if (r.status == CHI_OK) chi_bench_row_fail(&r, st, "%s", why.c_str());
  };
  ClientPool pool;
  std::string err;
  if (!pool.start(srv.address, n, so.sample_budget, &err)) {
    fail_all(CHI_ERR_DISCONNECTED, err);
    return;
  }
  // Client 1 floods; the others do one round trip at a time.
  std::vector<Work> work(n, round_trips(std::max<uint64_t>(opt.warmup / n, 100)));
  Work flood = round_trips(0);
  flood.mode = kWorkPipeline;
  flood.window = so.flood_window;
  flood.sample_every = 16;
  flood.warmup = 2ull * so.flood_window;
  const uint64_t dur = so.client_ms * 1000000ull;
  for (int phase = 0; phase < 2; phase++) {
    work[0] = phase == 0 ? Work() : flood;
    std::vector<WorkResult> res;
    uint64_t t0 = 0, t1 = 0;
    if (!pool.run(work, dur, &t0, &t1, &res, &err)) {
      fail_all(CHI_ERR_INTERNAL, err);
      return;
    }
    chi_bench_row *light = &rep->fair[phase];
    uint64_t done = fold(res, 1, n, light);
    if (light->status == CHI_OK && t1 > t0)
      light->throughput = double(done) * 1e9 / double(t1 - t0);
    if (phase == 1) {
      chi_bench_row *fl = &rep->fair[2];
      uint64_t fd = fold(res, 0, 1, fl);
      if (fl->status == CHI_OK && t1 > t0) fl->throughput = double(fd) * 1e9 / double(t1 - t0);
    }
  }
  if (rep->fair[0].status == CHI_OK && rep->fair[1].status == CHI_OK && rep->fair[0].p99_ns > 0)
    f.ratio = rep->fair[1].p99_ns / rep->fair[0].p99_ns;
}

// The raw shm floors of the sweep, after it: the same client counts and
// length, the server's poller count as serving threads, then the wake-up
// floor after the same idle as the wake-up figure.
void raw_floors(const chi_bench_options &opt, const ServerOptions &so, ServerReport *rep) {
  RawShmOptions o;
  rep->raw_threads_default = rep->server_pollers == 0;
  // shm_pollers.cpp's default when the server does not say.
  rep->raw_threads = rep->server_pollers
                         ? rep->server_pollers
                         : std::clamp(std::thread::hardware_concurrency(), 1u, 64u);
  raw_default_spins(&rep->raw_client_spin_ns, &rep->raw_server_spin_ns);
  o.threads = rep->raw_threads;
  o.client_spin_ns = rep->raw_client_spin_ns;
  o.server_spin_ns = rep->raw_server_spin_ns;
  o.duration_ms = so.client_ms;
  o.warmup = opt.warmup;
  o.sample_budget = so.sample_budget;
  for (int wait : {kRawPolicy, kRawSpin}) {
    std::vector<chi_bench_row> &rows = wait == kRawPolicy ? rep->raw_sweep : rep->raw_spin;
    for (uint32_t n : so.clients) {
      rows.emplace_back();
      raw_shm_sweep_point(o, wait, n, &rows.back());
    }
  }
  if (so.wake_samples) raw_shm_wake(so.idle_ms / 2, so.wake_samples, &rep->raw_wake);
}

}  // namespace

namespace {

// The round-trip row and the pipelined rows (1 and so.procs client
// processes) of one transport.
void transport_rows(const chi_bench_options &opt, const ServerOptions &so, const TransportRun &tr,
                    const std::string &config, std::vector<chi_bench_row> &rows,
                    ServerReport *rep) {
  const int t = tr.transport;
  const std::string name = row_name(t);
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.mode = CHI_MODE_CLIENT;
  cfg.server_address = tr.address.c_str();
  if (!config.empty()) cfg.config_path = config.c_str();
  chi_runtime_t *rt = nullptr;
  rows.emplace_back();
  chi_bench_row *lat = &rows.back();
  chi_status_t st = chi_init(&cfg, &rt);
  if (st != CHI_OK) {
    chi_bench_row_init(lat, name.c_str(), CHI_BENCH_LATENCY);
    chi_bench_row_fail(lat, st, "chi_init: %s", chi_last_error_message());
  } else {
    chi_stats_t stats;
    std::memset(&stats, 0, sizeof stats);
    stats.struct_size = sizeof stats;
    if (!rep->server_workers && chi_stats(rt, &stats) == CHI_OK)
      rep->server_workers = stats.workers;
    // One client: this process, through the same code as the embedded rows.
    cpu_latency(rt, CHI_ROUTE_CPU, name.c_str(), "CHI_ROUTE_CPU", opt, lat);
    chi_finalize(rt);
  }
  std::snprintf(lat->floor, sizeof lat->floor, "%s", tr.floor.c_str());
  std::snprintf(lat->transport, sizeof lat->transport, "%s", transport_name(t));
  lat->target_p50_ns = t == kShm ? kServerTargetP50Ns : kZmqTargetP50Ns;
  lat->processes = 1;

  rows.emplace_back();
  pipelined(opt, so, tr, config, 1, &rows.back());
  if (so.procs > 1) {
    rows.emplace_back();
    pipelined(opt, so, tr, config, so.procs, &rows.back());
  }
}

TransportRun transport_run(int t, const ServerProc &srv) {
  TransportRun tr;
  tr.transport = t;
  tr.address = t == kShm ? srv.address : t == kIpc ? srv.ipc_address : srv.tcp_address;
  if (!srv.started) tr.address = srv.address;
  tr.server_pid = srv.pid;
  tr.curve_server = srv.started && srv.curve;
  tr.floor = t == kShm ? kXprocFloor : zmq_reqrep_floor_name(t);
  tr.pipe_floor = t == kShm ? "" : zmq_pipe_floor_name(t);
  return tr;
}

bool has(const std::vector<int> &ts, int t) { return std::find(ts.begin(), ts.end(), t) != ts.end(); }

// The value of `name` in a NUL-separated environment block; nullptr: unset.
const char *env_in(const std::string &block, const char *name, std::string *value) {
  const std::string key = std::string(name) + "=";
  for (size_t at = 0; at < block.size();) {
    size_t end = block.find('\0', at);
    if (end == std::string::npos) end = block.size();
    if (block.compare(at, key.size(), key) == 0) {
      *value = block.substr(at + key.size(), end - at - key.size());
      return value->c_str();
    }
    at = end + 1;
  }
  return nullptr;
}

// What selects CUDA device 0: CUDA_VISIBLE_DEVICES' first entry and
// CUDA_DEVICE_ORDER, "first/order" ("-" for unset).
std::string cuda_device0(const char *visible, const char *order) {
  std::string v = visible ? std::string(visible) : "-";
  return v.substr(0, v.find(',')) + "/" + (order ? order : "-");
}

// The server's GPU 0 must be this process's CUDA device 0 (docs/server.md,
// "Client kernels": run both with the same CUDA_VISIBLE_DEVICES).  Compares
// what selects device 0 in the server's environment (/proc/PID/environ) with
// this process's; "" when they agree or the server's cannot be read.
std::string gpu0_mismatch(pid_t server) {
  if (server <= 0) return "";
  std::ifstream in("/proc/" + std::to_string(server) + "/environ", std::ios::binary);
  if (!in) return "";
  const std::string block((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (block.empty()) return "";
  std::string sv, so;
  const std::string theirs = cuda_device0(env_in(block, "CUDA_VISIBLE_DEVICES", &sv),
                                          env_in(block, "CUDA_DEVICE_ORDER", &so));
  const std::string ours =
      cuda_device0(std::getenv("CUDA_VISIBLE_DEVICES"), std::getenv("CUDA_DEVICE_ORDER"));
  if (theirs == ours) return "";
  return "server's GPU 0 is not CUDA device 0 here: CUDA_VISIBLE_DEVICES[0]/CUDA_DEVICE_ORDER " +
         theirs + " there, " + ours + " here";
}

// "client gpu0->cpu" and "client gpu0->local": a kernel of this process, a
// client of the server at `address`, submits through its relay.  Each goes
// right after the embedded row of the same route (main.cpp measured those
// before the server started), so the two sit side by side.
void client_gpu_rows(const chi_bench_options &opt, const std::string &address, int transport,
                     pid_t server, std::vector<chi_bench_row> &rows) {
  chi_bench_row got[2];
  chi_runtime_t *rt = nullptr;
  chi_status_t refused = CHI_OK;
  std::string why = gpu0_mismatch(server);
  if (!why.empty()) {
    refused = CHI_ERR_INVALID;
  } else {
    chi_config_t cfg;
    chi_config_init(&cfg);
    cfg.mode = CHI_MODE_CLIENT;
    cfg.server_address = address.c_str();
    refused = chi_init(&cfg, &rt);
    if (refused != CHI_OK) why = std::string("chi_init: ") + chi_last_error_message();
  }
  const int n = chi_bench_gpu_client_rows(rt, &opt, refused, why.c_str(), got, 2);
  if (rt) chi_finalize(rt);  // after the kernels, which the call above waited for
  for (int i = 0; i < n; i++) {
    chi_bench_row &r = got[i];
    std::snprintf(r.transport, sizeof r.transport, "%s", transport_name(transport));
    r.processes = 1;
    const char *embedded = r.name + std::strlen("client ");
    auto at = std::find_if(rows.begin(), rows.end(), [&](const chi_bench_row &e) {
      return std::strcmp(e.name, embedded) == 0;
    });
    rows.insert(at == rows.end() ? rows.end() : at + 1, r);
  }
}

// ---- client kernels under MPS: "client gpu0->... (MPS)" and "(server MPS)" ----

bool on_path(const char *prog) {
  const char *p = std::getenv("PATH");
  const std::string path = p ? p : "";
  for (size_t at = 0; at <= path.size();) {
    size_t end = path.find(':', at);
    if (end == std::string::npos) end = path.size();
    if (access((path.substr(at, end - at) + "/" + prog).c_str(), X_OK) == 0) return true;
    at = end + 1;
  }
  return false;
}

bool mps_answers(const std::string &dir) {
  const std::string path = dir + "/control";
  sockaddr_un a{};
  if (path.size() >= sizeof a.sun_path) return false;
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const bool ok = connect(fd, reinterpret_cast<const sockaddr *>(&a), sizeof a) == 0;
  close(fd);
  return ok;
}

// Runs a program (environment: this process's), its stdin from `input`;
// its exit status, or -1.
int run(const std::vector<std::string> &args, const char *input = nullptr) {
  int in[2] = {-1, -1};
  if (input && pipe2(in, O_CLOEXEC) != 0) return -1;
  std::vector<char *> argv;
  for (const auto &a : args) argv.push_back(const_cast<char *>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (input) posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int e = posix_spawnp(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (input) {
    close(in[0]);
    if (e == 0 && write(in[1], input, std::strlen(input)) < 0) { /* its status says */ }
    close(in[1]);
  }
  if (e != 0) return -1;
  int st = 0;
  if (waitpid(pid, &st, 0) != pid) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

void restore_env(const char *name, const std::string &saved, bool had) {
  if (had) setenv(name, saved.c_str(), 1);
  else unsetenv(name);
}

// The two client rows from a fresh process (this binary, --client-gpu-rows):
// its chi_init comes before its first CUDA call, so it joins the MPS
// daemon the server names.  Named with `tag`; failed rows say why.
void child_rows(const chi_bench_options &opt, const std::string &address, const std::string &dir,
                const char *tag, std::vector<chi_bench_row> &out) {
  const std::string file = dir + "/rows";
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  int rc = -1;
  if (n > 0) {
    self[n] = 0;
    rc = run({self, "--client-gpu-rows", address, file, std::to_string(opt.iters), std::to_string(opt.warmup),
              std::to_string(opt.payload)});
  }
  chi_bench_row got[2];
  size_t have = 0;
  if (FILE *f = std::fopen(file.c_str(), "rb")) {
    have = std::fread(got, sizeof got[0], 2, f);
    std::fclose(f);
  }
  unlink(file.c_str());
  for (size_t i = 0; i < 2; ++i) {
    chi_bench_row r;
    if (i < have) {
      r = got[i];
    } else {
      chi_bench_row_init(&r, i ? "client gpu0->local" : "client gpu0->cpu", CHI_BENCH_LATENCY);
      chi_bench_row_fail(&r, CHI_ERR_INTERNAL, "the client process exited with %d", rc);
    }
    // "client gpu0->local (server MPS)" is the longest: it fits a row name.
    char name[sizeof r.name];
    if (std::snprintf(name, sizeof name, "%s (%s)", r.name, tag) >= int(sizeof name))
      std::fprintf(stderr, "chimaera-bench: row name '%s (%s)' cut to '%s'\n", r.name, tag, name);
    std::memcpy(r.name, name, sizeof r.name);
    r.processes = 1;
    std::snprintf(r.transport, sizeof r.transport, "shm");
    out.push_back(r);
  }
}

}  // namespace

void client_gpu_mps_rows(const chi_bench_options &opt, const std::string &bin, int32_t workers,
                         const char *config, std::vector<chi_bench_row> &rows) {
  if (!on_path("nvidia-cuda-mps-control")) {
    std::fprintf(stderr, "chimaera-bench: --client-mps: no nvidia-cuda-mps-control on PATH: no MPS rows\n");
    return;
  }
  const char *tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/chimaera-bench-mps.XXXXXX";
  std::vector<char> b(tmpl.begin(), tmpl.end());
  b.push_back(0);
  if (!mkdtemp(b.data())) {
    std::fprintf(stderr, "chimaera-bench: --client-mps: mkdtemp %s: %s\n", tmpl.c_str(), std::strerror(errno));
    return;
  }
  const std::string base = b.data(), pipe = base + "/pipe", logs = base + "/log";
  mkdir(pipe.c_str(), 0700);
  mkdir(logs.c_str(), 0700);
  // Every variable a server or a client process reads from here on, as they were after.
  const char *names[] = {"CHI_RUNTIME_DIR", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY", "XDG_RUNTIME_DIR",
                         "CHI_SERVER_MPS"};
  std::string saved[5];
  bool had[5];
  for (int i = 0; i < 5; ++i) {
    const char *v = std::getenv(names[i]);
    had[i] = v != nullptr;
    saved[i] = v ? v : "";
  }
  std::vector<chi_bench_row> got;
  std::string err;
  // MPS started by hand (what scripts/mps.sh does): the daemon, then the
  // server and the client with its pipe directory.
  setenv("CUDA_MPS_PIPE_DIRECTORY", pipe.c_str(), 1);
  setenv("CUDA_MPS_LOG_DIRECTORY", logs.c_str(), 1);
  if (run({"nvidia-cuda-mps-control", "-d"}) == 0) {
    for (int i = 0; i < 500 && !mps_answers(pipe); ++i) usleep(20000);
    ServerProc srv;
    ServerListen l;
    l.suffix = "-mps";
    if (start_server(bin, workers, config, l, &srv, &err)) child_rows(opt, srv.address, base, "MPS", got);
    else std::fprintf(stderr, "chimaera-bench: --client-mps: %s\n", err.c_str());
    stop_server(&srv);
    (void)run({"nvidia-cuda-mps-control"}, "quit\n");
  } else {
    std::fprintf(stderr, "chimaera-bench: --client-mps: nvidia-cuda-mps-control -d failed (logs: %s)\n", logs.c_str());
  }
  unsetenv("CUDA_MPS_PIPE_DIRECTORY");
  unsetenv("CUDA_MPS_LOG_DIRECTORY");
  // The server's own (server.mps), in a private XDG_RUNTIME_DIR; the
  // client is told the pipe directory in the handshake.
  setenv("XDG_RUNTIME_DIR", base.c_str(), 1);
  setenv("CHI_SERVER_MPS", "true", 1);
  {
    ServerProc srv;
    ServerListen l;
    l.suffix = "-smps";
    const bool up = start_server(bin, workers, config, l, &srv, &err);
    unsetenv("CHI_SERVER_MPS");
    if (up) child_rows(opt, srv.address, base, "server MPS", got);
    else std::fprintf(stderr, "chimaera-bench: --client-mps: server.mps: %s\n", err.c_str());
    stop_server(&srv);  // the last chimaera process out: it stops the daemon
  }
  for (int i = 0; i < 5; ++i) restore_env(names[i], saved[i], had[i]);
  if (std::system(("rm -rf '" + base + "'").c_str()) != 0) { /* a leftover in TMPDIR */ }
  // Each after the rows of its route, so the variants sit side by side.
  for (const chi_bench_row &r : got) {
    const std::string route = std::string(r.name).substr(0, std::string(r.name).find(" ("));
    auto at = std::find_if(rows.rbegin(), rows.rend(), [&](const chi_bench_row &e) {
      return std::string(e.name).rfind(route, 0) == 0;
    });
    rows.insert(at == rows.rend() ? rows.end() : at.base(), r);
  }
}

int client_gpu_rows_main(int argc, char **argv) {
  // --client-gpu-rows ADDRESS FILE ITERS WARMUP PAYLOAD
  if (argc != 7) return 2;
  chi_bench_options opt{};
  opt.iters = std::strtoull(argv[4], nullptr, 10);
  opt.warmup = std::strtoull(argv[5], nullptr, 10);
  opt.payload = uint32_t(std::strtoul(argv[6], nullptr, 10));
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.mode = CHI_MODE_CLIENT;
  cfg.server_address = argv[2];
  chi_runtime_t *rt = nullptr;
  const chi_status_t st = chi_init(&cfg, &rt);  // before any CUDA call: joins the server's MPS
  chi_bench_row got[2];
  const int n = chi_bench_gpu_client_rows(rt, &opt, st, st == CHI_OK ? "" : chi_last_error_message(), got, 2);
  if (rt) chi_finalize(rt);
  FILE *f = std::fopen(argv[3], "wb");
  if (!f) return 1;
  const size_t w = std::fwrite(got, sizeof got[0], size_t(n < 0 ? 0 : n), f);
  std::fclose(f);
  return w == size_t(n) ? 0 : 1;
}

std::vector<int> server_transports(const ServerOptions &so) {
  if (so.server != "start") {
    const std::string &a = so.server;
    if (a.rfind("ipc://", 0) == 0) return {kIpc};
    if (a.rfind("tcp://", 0) == 0) {
      const char *key = std::getenv("CHI_CURVE_SERVER_KEY");
      return {key && *key ? kTcpCurve : kTcp};
    }
    return {kShm};
  }
  if (!so.transports.empty()) return so.transports;
  return {kShm, kIpc, kTcp, kTcpCurve};
}

bool run_server_rows(const chi_bench_options &opt, const ServerOptions &so, int32_t workers,
                     const char *config, std::vector<chi_bench_row> &rows, ServerReport *rep,
                     std::string *err) {
  rep->enabled = true;
  rep->client_ms = so.client_ms;
  rep->flood_window = so.flood_window;
  const std::vector<int> ts = server_transports(so);
  ServerProc &srv = rep->server;
  const bool start = so.server == "start";
  const std::string bin = so.server_bin.empty() ? default_server_bin() : so.server_bin;
  if (start) {
    // shm, ipc and tcp from one server; its shm address is always there
    // (ping, status, sweep and fairness).
    ServerListen l;
    l.ipc = has(ts, kIpc);
    l.tcp = has(ts, kTcp);
    if (!start_server(bin, workers, config, l, &srv, err)) return false;
  } else if (!attach_server(so.server.c_str(), &srv, err)) {
    return false;
  }
  rep->idle.rss_base_kib = proc_rss_kib(srv.pid);
  const int pollers = server_poller_count(srv.address);
  rep->server_pollers = pollers > 0 ? uint32_t(pollers) : 0;

  for (int t : ts) {
    if (start && t == kTcpCurve) continue;  // the second server's
    rep->transports.push_back(transport_run(t, srv));
    transport_rows(opt, so, rep->transports.back(), std::string(), rows, rep);
  }
  // A started server's shm address is always there; an existing one's is the address given.
  if (so.client_gpu) client_gpu_rows(opt, srv.address, start ? kShm : ts.front(), srv.pid, rows);
  if (so.client_gpu && so.client_mps) client_gpu_mps_rows(opt, bin, workers, config, rows);

  uint32_t most = 0;
  for (uint32_t n : so.clients) most = std::max(most, n);
  bool idle_done = false;
  for (uint32_t n : so.clients) {
    rep->sweep.emplace_back();
    bool last = n == most && !idle_done;
    sweep_point(opt, so, srv, n, last, &rep->sweep.back(), &rep->idle);
    idle_done = idle_done || last;
  }
  if (so.fairness >= 2) fairness(opt, so, srv, rep);
  stop_server(&srv);
  // A started server is gone by now: the raw processes run alone.
  if (!so.clients.empty()) raw_floors(opt, so, rep);

  if (start && has(ts, kTcpCurve)) {
    ServerProc &cs = rep->curve_server;
    ServerListen l;
    l.tcp = l.curve = true;
    l.suffix = "-curve";
    std::string why;
    if (start_server(bin, workers, config, l, &cs, &why)) {
      rep->transports.push_back(transport_run(kTcpCurve, cs));
      transport_rows(opt, so, rep->transports.back(), cs.client_config, rows, rep);
      stop_server(&cs);
    } else {
      // Its rows are there, failed, with the reason.
      TransportRun tr = transport_run(kTcpCurve, cs);
      rep->transports.push_back(tr);
      const std::string name = row_name(kTcpCurve);
      std::vector<std::string> names = {name, name + " pipelined 1p"};
      if (so.procs > 1) names.push_back(name + " pipelined " + std::to_string(so.procs) + "p");
      for (size_t i = 0; i < names.size(); i++) {
        rows.emplace_back();
        init_row(&rows.back(), names[i].c_str(), i ? CHI_BENCH_THROUGHPUT : CHI_BENCH_LATENCY,
                 CHI_METHOD_ECHO, opt.payload, i == 2 ? so.procs : 1,
                 i ? tr.pipe_floor.c_str() : tr.floor.c_str(), kTcpCurve);
        chi_bench_row_fail(&rows.back(), CHI_ERR_INTERNAL, "CURVE server: %s", why.c_str());
      }
    }
  }
  return true;
}

}  // namespace chi_bench

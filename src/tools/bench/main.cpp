// chimaera-bench: round-trip latency and throughput of every route available
// here, each next to the raw floor it is bounded by, measured in the same run.
// With --server: the same from client processes of a chimaera-server.
#include <getopt.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_gpu.h"
#include "chimaera.h"
#include "cpu_floors.h"
#include "cpu_routes.h"
#include "report.h"
#include "server_proc.h"
#include "server_routes.h"
#include "tool_util.h"
#include "zmq_floors.h"

namespace {

constexpr int kMaxGpuRows = 64;

void usage(std::FILE *out) {
  std::fprintf(
      out,
      "usage: chimaera-bench [options]\n"
      "\n"
      "Measures chimaera's routes through the public API (chi.echo, payload bytes\n"
      "in and out) and, in the same run, the floors they are bounded by; prints\n"
      "each route's p50/p99 and its ratio to its floor.\n"
      "\n"
      "  --iters N       timed round trips per latency row (default 100000)\n"
      "  --warmup N      untimed round trips first (default iters/10, at least 1000)\n"
      "  --tput-tasks N  tasks per throughput row (default 4 x iters)\n"
      "  --threads N     submitters of the multi-threaded throughput row\n"
      "                  (default: online CPUs)\n"
      "  --window N      outstanding futures per submitter (default 64); keep\n"
      "                  threads x window within queue_depth (131072 by default)\n"
      "  --payload N     bytes of input and output (default 64)\n"
      "  --gpu-lanes N   submitting lanes per warp of the GPU throughput rows, 1..32\n"
      "                  (default: the route's slots over the warps, at most 32, so\n"
      "                  that the tasks in flight nearly fill the slots)\n"
      "  --workers N     CPU worker threads (default: from config, else one per CPU)\n"
      "  --config PATH   chimaera.yaml to use (default: $CHI_CONFIG, else built-ins)\n"
      "  --pin           pin the benchmark's own threads to CPUs (workers are not)\n"
      "  --rows LIST     only these embedded rows, any of lone (the three latency\n"
      "                  rows), x1, xN (pipelined), batched, gpu (default: all);\n"
      "                  the floors always run\n"
      "  --json          one JSON object on stdout instead of the table\n"
      "  --json-file P   the table on stdout, and the JSON object written to file P\n"
      "\n"
      "Client->server (instead of the embedded routes; floor.xproc_pingpong is the floor of\n"
      "shm rows, raw libzmq REQ/REP and DEALER/ROUTER runs of the same transport that of\n"
      "ipc and tcp rows; with a GPU also gpu0->cpu and gpu0->local from a kernel of this\n"
      "process, a client (\"client gpu0->...\"), beside the same from an embedded runtime\n"
      "that ran before the server, with their GPU floors):\n"
      "  --server ADDR   measure the chimaera-server at ADDR (shm://NAME, ipc://PATH,\n"
      "                  tcp://HOST:PORT; with CHI_CURVE_SERVER_KEY set: tcp-curve)\n"
      "  --server start  start a chimaera-server on a private name and runtime directory,\n"
      "                  stop it at the end (--workers and --config go to it)\n"
      "  --transports LIST  with --server start: any of shm,ipc,tcp,tcp-curve (default: all);\n"
      "                  one server serves shm, ipc and tcp (loopback) at once, a second one,\n"
      "                  started after it, tcp with CURVE (keys made in its runtime directory)\n"
      "  --server-bin P  the chimaera-server to start (default: next to this binary)\n"
      "  --client-mps    with --server start and a GPU: the client kernel rows again from a\n"
      "                  fresh client process under MPS started by hand (\"(MPS)\") and under\n"
      "                  a server with server.mps (\"(server MPS)\"), each on its own server\n"
      "                  (needs nvidia-cuda-mps-control)\n"
      "  --procs N       client processes of the multi-process pipelined row (default 8)\n"
      "  --clients LIST  sweep, e.g. 1,8,64,256: that many client processes at once, each\n"
      "                  doing chi.add round trips one at a time; with the largest count\n"
      "                  connected and idle: server CPU, RSS and wake-up latency.  Then\n"
      "                  its floors, the same counts and length: \"raw shm sweep Np\", N\n"
      "                  processes doing 64 B round trips through a pair of shared-memory\n"
      "                  slots each with a raw server process (as many threads as the\n"
      "                  server's shm pollers) and chimaera's waiting policy (spin, then\n"
      "                  futex); \"raw shm spin Np\", nobody sleeping; and beside the\n"
      "                  wake-up figure, the raw round trip after the same idle with both\n"
      "                  sides asleep on a futex, and one futex wake of a sleeper alone\n"
      "  --fairness [N]  N clients (default 64): one floods, N-1 do round trips; their p99\n"
      "                  with and without the flooder\n"
      "  --flood-window N  the flooding client's tasks in flight (default 512; keep it\n"
      "                  within server.client_slots)\n"
      "  --client-ms MS  length of each sweep and fairness run (default 1000)\n"
      "  --idle-ms MS    idle-CPU window (default 2000); each wake-up follows MS/2 of idle\n"
      "  --wake-samples N  wake-up round trips, each on another client (default 5)\n"
      "  --help          this text\n"
      "\n"
      "Environment: CHI_BENCH_LEASE=1 prints, for each GPU row, the orchestrator's launches,\n"
      "their mean length and its step-asides (docs/gpu.md, \"Coexisting with other CUDA code\").\n\n"
      "Exit status: 0 every row measured, 1 some row failed, 2 usage or start-up error.\n");
}

bool count_arg(const char *opt, const char *text, uint64_t min, uint64_t max, uint64_t *out) {
  if (chi_tool_parse_count(text, min, max, out) == 0) return true;
  std::fprintf(stderr, "chimaera-bench: %s wants a count from %llu to %llu, not '%s'\n", opt,
               static_cast<unsigned long long>(min), static_cast<unsigned long long>(max), text);
  return false;
}

// Calls item(text) for each comma-separated item of a list option; false as
// soon as one call is.
template <class Item>
bool each_item(const char *text, Item item) {
  std::string s(text);
  size_t at = 0;
  for (;;) {
    size_t comma = s.find(',', at);
    if (!item(s.substr(at, comma == std::string::npos ? std::string::npos : comma - at))) return false;
    if (comma == std::string::npos) return true;
    at = comma + 1;
  }
}

bool count_list(const char *text, std::vector<uint32_t> *out) {
  out->clear();
  return each_item(text, [&](const std::string &item) {
    uint64_t v = 0;
    if (!count_arg("--clients", item.c_str(), 1, 65536, &v)) return false;
    out->push_back(uint32_t(v));
    return true;
  }) && !out->empty();
}

bool transport_list(const char *text, std::vector<int> *out) {
  out->clear();
  return each_item(text, [&](const std::string &item) {
    int t = chi_bench::parse_transport(item);
    if (t < 0) {
      std::fprintf(stderr, "chimaera-bench: --transports: '%s' is not shm, ipc, tcp or tcp-curve\n",
                   item.c_str());
      return false;
    }
    if (std::find(out->begin(), out->end(), t) == out->end()) out->push_back(t);
    return true;
  }) && !out->empty();
}

// The embedded rows that --rows selects, by group.
enum RowGroup : unsigned {
  kLone = 1,      // cpu->cpu, cpu->cpu local, cpu->cpu after 2ms
  kX1 = 2,        // cpu->cpu pipelined x1
  kXN = 4,        // cpu->cpu pipelined x<threads>
  kBatched = 8,   // cpu->cpu batched x<threads>
  kGpuRows = 16,  // every GPU row
  kAllRows = 31,
};

bool row_list(const char *text, unsigned *out) {
  static const struct {
    const char *name;
    unsigned group;
  } kGroups[] = {{"lone", kLone}, {"x1", kX1}, {"xN", kXN}, {"batched", kBatched}, {"gpu", kGpuRows}};
  *out = 0;
  return each_item(text, [&](const std::string &item) {
    for (const auto &g : kGroups)
      if (item == g.name) {
        *out |= g.group;
        return true;
      }
    std::fprintf(stderr, "chimaera-bench: --rows: '%s' is not lone, x1, xN, batched or gpu\n", item.c_str());
    return false;
  });
}

// Writes the JSON object to `path` (--json-file); false, with a message, on error.
template <class Print>
bool write_json_file(const char *path, Print print) {
  FILE *f = std::fopen(path, "w");
  if (!f) {
    std::fprintf(stderr, "chimaera-bench: --json-file %s: %s\n", path, std::strerror(errno));
    return false;
  }
  print(f);
  if (std::fclose(f) != 0) {
    std::fprintf(stderr, "chimaera-bench: --json-file %s: %s\n", path, std::strerror(errno));
    return false;
  }
  return true;
}

// The embedded rows that a client kernel's rows (server_routes.cpp) sit
// beside: the GPU->CPU and GPU->GPU floors and routes of GPU 0, from a
// runtime of this process that is gone before a started server is, so the
// two orchestrators never share the GPU.  Returns the GPUs it drove.
int32_t embedded_gpu_rows(const chi_bench_options &opt, const chi_config_t &cfg,
                          std::vector<chi_bench_row> &rows) {
  if (chi_bench_gpu_visible() <= 0) return 0;
  chi_config_t ecfg = cfg;
  ecfg.mode = CHI_MODE_EMBEDDED;
  chi_runtime_t *rt = nullptr;
  chi_status_t st = chi_init(&ecfg, &rt);
  if (st != CHI_OK) {
    rows.emplace_back();
    chi_bench_row_init(&rows.back(), "gpu.embedded", CHI_BENCH_FLOOR);
    chi_bench_row_fail(&rows.back(), st, "chi_init: %s", chi_last_error_message());
    return 0;
  }
  int32_t gpus = 0;
  if (chi_gpu_count(rt, &gpus) != CHI_OK) gpus = 0;
  size_t base = rows.size();
  rows.resize(base + kMaxGpuRows);
  int n = chi_bench_gpu_embedded_rows(rt, &opt, &rows[base], kMaxGpuRows);
  rows.resize(base + size_t(n < 0 ? 0 : n > kMaxGpuRows ? kMaxGpuRows : n));
  st = chi_finalize(rt);
  if (st != CHI_OK)
    std::fprintf(stderr, "chimaera-bench: chi_finalize: %s: %s\n", chi_status_string(st),
                 chi_last_error_message());
  return gpus;
}

// The --server run: client->server rows after the floors, then the report.
int server_main(const chi_bench_options &opt, chi_bench::ServerOptions so,
                const chi_config_t &cfg, bool json, const char *json_file, std::vector<chi_bench_row> &rows) {
  chi_bench::ServerReport rep;
  std::string err;
  // No GPU here, or none asked for (gpu.devices 0): no GPU rows, as embedded.
  const int32_t gpus = embedded_gpu_rows(opt, cfg, rows);
  so.client_gpu = gpus > 0;
  if (!chi_bench::run_server_rows(opt, so, cfg.num_workers, cfg.config_path, rows, &rep, &err)) {
    std::fprintf(stderr, "chimaera-bench: --server %s: %s\n", so.server.c_str(), err.c_str());
    return 2;
  }
  chi_bench::link_floors(rows);
  chi_bench::link_floors(rep.sweep, &rows);
  chi_bench::link_floors(rep.fair, &rows);
  chi_bench::Machine m = chi_bench::probe_machine(gpus, cfg.num_workers, opt.pin != 0);
  if (json)
    chi_bench::print_json(stdout, m, opt, rows, &rep);
  else
    chi_bench::print_table(stdout, m, opt, rows, &rep);
  if (json_file && !write_json_file(json_file, [&](FILE *f) { chi_bench::print_json(f, m, opt, rows, &rep); }))
    return 2;

  bool ok = true;
  auto check = [&](const std::vector<chi_bench_row> &rs) {
    for (const auto &r : rs) {
      if (r.status == CHI_OK) continue;
      ok = false;
      if (json)
        std::fprintf(stderr, "chimaera-bench: %s failed: %s: %s\n", r.name,
                     chi_status_string(r.status), r.error);
    }
  };
  check(rows);
  check(rep.sweep);
  check(rep.fair);
  check(rep.raw_sweep);
  check(rep.raw_spin);
  for (const chi_bench::ServerProc *p : {&rep.server, &rep.curve_server}) {
    if (p->exit_status <= 0) continue;
    ok = false;
    std::fprintf(stderr, "chimaera-bench: chimaera-server exited with status %d (log: %s)\n",
                 p->exit_status, p->log_path.c_str());
  }
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char **argv) {
  // A client process of a --server run (see server_proc.h).
  if (argc == 3 && std::strcmp(argv[1], "--client-worker") == 0)
    return chi_bench::client_worker_main(argv[2]);
  if (argc >= 2 && std::strcmp(argv[1], "--client-gpu-rows") == 0) return chi_bench::client_gpu_rows_main(argc, argv);

  enum { kIters = 256, kWarmup, kTput, kThreads, kWindow, kPayload, kWorkers, kConfig, kPin,
         kJson, kJsonFile, kHelp, kServer, kServerBin, kProcs, kClients, kFairness, kFloodWindow, kClientMs,
         kIdleMs, kWakeSamples, kTransportsOpt, kGpuLanes, kClientMps, kRows };
  static const option longopts[] = {
      {"iters", required_argument, nullptr, kIters},
      {"warmup", required_argument, nullptr, kWarmup},
      {"tput-tasks", required_argument, nullptr, kTput},
      {"threads", required_argument, nullptr, kThreads},
      {"window", required_argument, nullptr, kWindow},
      {"payload", required_argument, nullptr, kPayload},
      {"workers", required_argument, nullptr, kWorkers},
      {"config", required_argument, nullptr, kConfig},
      {"pin", no_argument, nullptr, kPin},
      {"json", no_argument, nullptr, kJson},
      {"json-file", required_argument, nullptr, kJsonFile},
      {"help", no_argument, nullptr, kHelp},
      {"server", required_argument, nullptr, kServer},
      {"server-bin", required_argument, nullptr, kServerBin},
      {"procs", required_argument, nullptr, kProcs},
      {"clients", required_argument, nullptr, kClients},
      {"fairness", optional_argument, nullptr, kFairness},
      {"flood-window", required_argument, nullptr, kFloodWindow},
      {"client-ms", required_argument, nullptr, kClientMs},
      {"idle-ms", required_argument, nullptr, kIdleMs},
      {"wake-samples", required_argument, nullptr, kWakeSamples},
      {"transports", required_argument, nullptr, kTransportsOpt},
      {"gpu-lanes", required_argument, nullptr, kGpuLanes},
      {"client-mps", no_argument, nullptr, kClientMps},
      {"rows", required_argument, nullptr, kRows},
      {nullptr, 0, nullptr, 0}};

  chi_bench_options opt{};
  opt.iters = 100000;
  opt.window = 64;
  opt.payload = 64;
  opt.threads = chi_tool_online_cpus();
  bool warmup_set = false, tput_set = false, json = false, rows_set = false;
  unsigned groups = kAllRows;
  const char *json_file = nullptr;
  chi_bench::ServerOptions so;
  chi_config_t cfg;
  chi_config_init(&cfg);
  uint64_t v = 0;
  int c;
  while ((c = getopt_long(argc, argv, "", longopts, nullptr)) != -1) {
    switch (c) {
      case kIters:
        if (!count_arg("--iters", optarg, 1, 1000000000, &opt.iters)) return 2;
        break;
      case kWarmup:
        if (!count_arg("--warmup", optarg, 0, 1000000000, &opt.warmup)) return 2;
        warmup_set = true;
        break;
      case kTput:
        if (!count_arg("--tput-tasks", optarg, 1, 10000000000ull, &opt.tput_tasks)) return 2;
        tput_set = true;
        break;
      case kThreads:
        if (!count_arg("--threads", optarg, 1, 1024, &v)) return 2;
        opt.threads = uint32_t(v);
        break;
      case kWindow:
        if (!count_arg("--window", optarg, 1, 65536, &v)) return 2;
        opt.window = uint32_t(v);
        break;
      case kPayload:
        if (!count_arg("--payload", optarg, 0, 1 << 20, &v)) return 2;
        opt.payload = uint32_t(v);
        break;
      case kClientMps:
        so.client_mps = true;
        break;
      case kRows:
        if (!row_list(optarg, &groups)) return 2;
        rows_set = true;
        break;
      case kGpuLanes:
        if (!count_arg("--gpu-lanes", optarg, 1, 32, &v)) return 2;
        opt.gpu_lanes = uint32_t(v);
        break;
      case kWorkers:
        if (!count_arg("--workers", optarg, 1, 1024, &v)) return 2;
        cfg.num_workers = int32_t(v);
        break;
      case kConfig:
        cfg.config_path = optarg;
        break;
      case kPin:
        opt.pin = 1;
        break;
      case kJson:
        json = true;
        break;
      case kJsonFile:
        json_file = optarg;
        break;
      case kHelp:
        usage(stdout);
        return 0;
      case kServer:
        so.server = optarg;
        break;
      case kTransportsOpt:
        if (!transport_list(optarg, &so.transports)) return 2;
        break;
      case kServerBin:
        so.server_bin = optarg;
        break;
      case kProcs:
        if (!count_arg("--procs", optarg, 1, 4096, &v)) return 2;
        so.procs = uint32_t(v);
        break;
      case kClients:
        if (!count_list(optarg, &so.clients)) return 2;
        break;
      case kFairness: {
        // "--fairness", "--fairness=N" and "--fairness N".
        const char *n = optarg;
        if (!n && optind < argc && std::isdigit(static_cast<unsigned char>(argv[optind][0])))
          n = argv[optind++];
        v = 64;
        if (n && !count_arg("--fairness", n, 2, 65536, &v)) return 2;
        so.fairness = uint32_t(v);
        break;
      }
      case kFloodWindow:
        if (!count_arg("--flood-window", optarg, 1, 65536, &v)) return 2;
        so.flood_window = uint32_t(v);
        break;
      case kClientMs:
        if (!count_arg("--client-ms", optarg, 1, 3600000, &so.client_ms)) return 2;
        break;
      case kIdleMs:
        if (!count_arg("--idle-ms", optarg, 2, 3600000, &so.idle_ms)) return 2;
        break;
      case kWakeSamples:
        if (!count_arg("--wake-samples", optarg, 0, 1000, &v)) return 2;
        so.wake_samples = uint32_t(v);
        break;
      default:
        usage(stderr);
        return 2;
    }
  }
  if (optind < argc) {
    std::fprintf(stderr, "chimaera-bench: unexpected argument '%s'\n", argv[optind]);
    usage(stderr);
    return 2;
  }
  if (!warmup_set) opt.warmup = opt.iters / 10 < 1000 ? 1000 : opt.iters / 10;
  if (!tput_set) opt.tput_tasks = 4 * opt.iters;
  if (opt.tput_tasks < opt.threads) opt.tput_tasks = opt.threads;
  if (so.server.empty() && (!so.clients.empty() || so.fairness || !so.server_bin.empty())) {
    std::fprintf(stderr, "chimaera-bench: --clients, --fairness and --server-bin need --server\n");
    return 2;
  }
  if (rows_set && !so.server.empty()) {
    std::fprintf(stderr, "chimaera-bench: --rows selects embedded rows, not those of --server\n");
    return 2;
  }
  if (!so.transports.empty() && so.server != "start") {
    std::fprintf(stderr, "chimaera-bench: --transports needs --server start (an address names one)\n");
    return 2;
  }

  std::vector<chi_bench_row> rows;
  rows.reserve(16 + kMaxGpuRows);

  // Floors first, before the runtime exists, so its threads cannot disturb them.
  rows.emplace_back();
  chi_bench::cpu_pingpong_floor(opt, &rows.back());
  rows.emplace_back();
  chi_bench::pipe_pingpong_peer(opt, &rows.back());
  if (!so.server.empty()) {
    rows.emplace_back();
    chi_bench::xproc_pingpong_floor(opt, &rows.back());
    // The raw libzmq floors of the ZeroMQ transports measured here.
    for (int t : chi_bench::server_transports(so)) {
      if (t == chi_bench::kShm) continue;
      rows.emplace_back();
      chi_bench::zmq_reqrep_floor(opt, t, &rows.back());
      rows.emplace_back();
      chi_bench::zmq_pipe_floor(opt, t, &rows.back());
    }
    return server_main(opt, so, cfg, json, json_file, rows);
  }

  chi_runtime_t *rt = nullptr;
  chi_status_t st = chi_init(&cfg, &rt);
  if (st != CHI_OK) {
    std::fprintf(stderr, "chimaera-bench: chi_init: %s: %s\n", chi_status_string(st),
                 chi_last_error_message());
    return 2;
  }
  int32_t gpus = 0;
  if (chi_gpu_count(rt, &gpus) != CHI_OK) gpus = 0;

  if (groups & kLone) {
    rows.emplace_back();
    chi_bench::cpu_latency(rt, CHI_ROUTE_CPU, "cpu->cpu", "CHI_ROUTE_CPU", opt, &rows.back());
    rows.emplace_back();
    chi_bench::cpu_latency(rt, CHI_ROUTE_LOCAL, "cpu->cpu local", "CHI_ROUTE_LOCAL", opt,
                           &rows.back());
    rows.emplace_back();
    chi_bench::cpu_latency_after_quiet(rt, "cpu->cpu after 2ms", 2000000, opt, &rows.back());
  }
  if (groups & kX1) {
    rows.emplace_back();
    chi_bench::cpu_throughput(rt, CHI_ROUTE_CPU, "cpu->cpu pipelined x1", "CHI_ROUTE_CPU", 1, opt,
                              &rows.back());
  }
  if ((groups & kXN) && opt.threads > 1) {
    char name[48];
    std::snprintf(name, sizeof name, "cpu->cpu pipelined x%u", opt.threads);
    rows.emplace_back();
    chi_bench::cpu_throughput(rt, CHI_ROUTE_CPU, name, "CHI_ROUTE_CPU", opt.threads, opt,
                              &rows.back());
  }
  if (groups & kBatched) {
    char name[48];
    std::snprintf(name, sizeof name, "cpu->cpu batched x%u", opt.threads);
    rows.emplace_back();
    chi_bench::cpu_batched(rt, CHI_ROUTE_CPU, name, "CHI_ROUTE_CPU", opt.threads, opt, &rows.back());
  }

  if (gpus > 0 && (groups & kGpuRows)) {
    size_t base = rows.size();
    rows.resize(base + kMaxGpuRows);
    int n = chi_bench_gpu_rows(rt, &opt, &rows[base], kMaxGpuRows);
    rows.resize(base + size_t(n < 0 ? 0 : n > kMaxGpuRows ? kMaxGpuRows : n));
  }

  st = chi_finalize(rt);
  if (st != CHI_OK)
    std::fprintf(stderr, "chimaera-bench: chi_finalize: %s: %s\n", chi_status_string(st),
                 chi_last_error_message());

  chi_bench::link_floors(rows);
  chi_bench::Machine m = chi_bench::probe_machine(gpus, cfg.num_workers, opt.pin != 0);
  if (json)
    chi_bench::print_json(stdout, m, opt, rows);
  else
    chi_bench::print_table(stdout, m, opt, rows);
  if (json_file && !write_json_file(json_file, [&](FILE *f) { chi_bench::print_json(f, m, opt, rows); }))
    return 2;

  bool ok = st == CHI_OK;
  for (const auto &r : rows) {
    if (r.status == CHI_OK) continue;
    ok = false;
    if (json)  // the table already shows it
      std::fprintf(stderr, "chimaera-bench: %s failed: %s: %s\n", r.name,
                   chi_status_string(r.status), r.error);
  }
  return ok ? 0 : 1;
}

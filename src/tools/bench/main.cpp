// chimaera-bench: round-trip latency and throughput of every route available
// here, each next to the raw floor it is bounded by, measured in the same run.
#include <getopt.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench_gpu.h"
#include "chimaera.h"
#include "cpu_floors.h"
#include "cpu_routes.h"
#include "report.h"
#include "tool_util.h"

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
      "                  threads x window within queue_depth (1024 by default)\n"
      "  --payload N     bytes of input and output (default 64)\n"
      "  --workers N     CPU worker threads (default: from config, else one per CPU)\n"
      "  --config PATH   chimaera.yaml to use (default: $CHI_CONFIG, else built-ins)\n"
      "  --pin           pin the benchmark's own threads to CPUs (workers are not)\n"
      "  --json          one JSON object on stdout instead of the table\n"
      "  --help          this text\n"
      "\n"
      "Exit status: 0 every row measured, 1 some row failed, 2 usage or start-up error.\n");
}

bool count_arg(const char *opt, const char *text, uint64_t min, uint64_t max, uint64_t *out) {
  if (chi_tool_parse_count(text, min, max, out) == 0) return true;
  std::fprintf(stderr, "chimaera-bench: %s wants a count from %llu to %llu, not '%s'\n", opt,
               static_cast<unsigned long long>(min), static_cast<unsigned long long>(max), text);
  return false;
}

}  // namespace

int main(int argc, char **argv) {
  enum { kIters = 256, kWarmup, kTput, kThreads, kWindow, kPayload, kWorkers, kConfig, kPin,
         kJson, kHelp };
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
      {"help", no_argument, nullptr, kHelp},
      {nullptr, 0, nullptr, 0}};

  chi_bench_options opt{};
  opt.iters = 100000;
  opt.window = 64;
  opt.payload = 64;
  opt.threads = chi_tool_online_cpus();
  bool warmup_set = false, tput_set = false, json = false;
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
      case kHelp:
        usage(stdout);
        return 0;
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

  std::vector<chi_bench_row> rows;
  rows.reserve(16 + kMaxGpuRows);

  // Floors first, before the runtime exists, so its threads cannot disturb them.
  rows.emplace_back();
  chi_bench::cpu_pingpong_floor(opt, &rows.back());
  rows.emplace_back();
  chi_bench::pipe_pingpong_peer(opt, &rows.back());

  chi_runtime_t *rt = nullptr;
  chi_status_t st = chi_init(&cfg, &rt);
  if (st != CHI_OK) {
    std::fprintf(stderr, "chimaera-bench: chi_init: %s: %s\n", chi_status_string(st),
                 chi_last_error_message());
    return 2;
  }
  int32_t gpus = 0;
  if (chi_gpu_count(rt, &gpus) != CHI_OK) gpus = 0;

  rows.emplace_back();
  chi_bench::cpu_latency(rt, CHI_ROUTE_CPU, "cpu->cpu", "CHI_ROUTE_CPU", opt, &rows.back());
  rows.emplace_back();
  chi_bench::cpu_latency(rt, CHI_ROUTE_LOCAL, "cpu->cpu local", "CHI_ROUTE_LOCAL", opt,
                         &rows.back());
  rows.emplace_back();
  chi_bench::cpu_throughput(rt, CHI_ROUTE_CPU, "cpu->cpu pipelined x1", "CHI_ROUTE_CPU", 1, opt,
                            &rows.back());
  if (opt.threads > 1) {
    char name[48];
    std::snprintf(name, sizeof name, "cpu->cpu pipelined x%u", opt.threads);
    rows.emplace_back();
    chi_bench::cpu_throughput(rt, CHI_ROUTE_CPU, name, "CHI_ROUTE_CPU", opt.threads, opt,
                              &rows.back());
  }

  if (gpus > 0) {
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

// chimaera-bench's output: the machine it ran on, the rows linked to their
// floors, as a table for people or one JSON object for tools.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "bench_row.h"
#include "server_routes.h"

namespace chi_bench {

struct Machine {
  std::string hostname;
  std::string os;         // "Linux 6.1.0-18-amd64 x86_64"
  std::string cpu_model;  // from /proc/cpuinfo, "unknown" elsewhere
  std::string timestamp;  // UTC, ISO 8601
  unsigned online_cpus = 1;
  int32_t gpus = 0;       // chi_gpu_count of the runtime
  int32_t workers = 0;    // requested CPU workers (0: config or default)
  bool pinned = false;
  double clock_ns = 0;    // median cost of one clock read (in every sample)
};

Machine probe_machine(int32_t gpus, int32_t workers, bool pinned);

// Fills floor_p50_ns and ratio of every row that names a floor row present in
// rows, or in `floors` when given (ratio = p50 / floor p50); rows whose
// floor is missing keep NaN.
void link_floors(std::vector<chi_bench_row> &rows,
                 const std::vector<chi_bench_row> *floors = nullptr);

// srv: the client->server part (--server), or nullptr.
void print_table(std::FILE *out, const Machine &m, const chi_bench_options &opt,
                 const std::vector<chi_bench_row> &rows, const ServerReport *srv = nullptr);

// One JSON object: tool, version, machine, options, rows (one per line), ok;
// with srv also "server": address, sweep rows, idle and fairness figures.
void print_json(std::FILE *out, const Machine &m, const chi_bench_options &opt,
                const std::vector<chi_bench_row> &rows, const ServerReport *srv = nullptr);

}  // namespace chi_bench

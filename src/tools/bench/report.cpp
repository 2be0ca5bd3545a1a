#include "report.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <ctime>
#include <fstream>

#include "chimaera.h"
#include "tool_util.h"

namespace chi_bench {
namespace {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      size_t colon = line.find(':');
      if (colon != std::string::npos) {
        size_t start = line.find_first_not_of(' ', colon + 1);
        return start == std::string::npos ? std::string() : line.substr(start);
      }
    }
  }
  return "unknown";
}

void json_string(std::FILE *out, const char *s) {
  std::fputc('"', out);
  for (const unsigned char *p = reinterpret_cast<const unsigned char *>(s); *p; p++) {
    switch (*p) {
      case '"': std::fputs("\\\"", out); break;
      case '\\': std::fputs("\\\\", out); break;
      case '\n': std::fputs("\\n", out); break;
      case '\t': std::fputs("\\t", out); break;
      default:
        if (*p < 0x20)
          std::fprintf(out, "\\u%04x", *p);
        else
          std::fputc(*p, out);
    }
  }
  std::fputc('"', out);
}

// JSON has no NaN: unmeasured numbers are null.
void json_number(std::FILE *out, double v, const char *fmt = "%.1f") {
  if (std::isnan(v) || std::isinf(v))
    std::fputs("null", out);
  else
    std::fprintf(out, fmt, v);
}

void cell_us(std::FILE *out, double ns) {
  if (std::isnan(ns))
    std::fprintf(out, " %9s", "-");
  else
    std::fprintf(out, " %9.3f", ns / 1000.0);
}

void print_rows(std::FILE *out, const std::vector<chi_bench_row> &rows) {
  std::fprintf(out, "%-38s %-10s %3s %9s %9s %9s %9s %9s %8s  %s\n", "row", "kind", "thr",
               "count", "p50 us", "p99 us", "mean us", "Mops/s", "vs floor", "target");
  for (const auto &r : rows) {
    if (r.status != CHI_OK) {
      std::fprintf(out, "%-38s %-10s FAILED: %s (%s)\n", r.name, chi_bench_kind_name(r.kind),
                   chi_status_string(r.status), r.error);
      continue;
    }
    std::fprintf(out, "%-38s %-10s %3u %9llu", r.name, chi_bench_kind_name(r.kind), r.threads,
                 static_cast<unsigned long long>(r.count));
    cell_us(out, r.p50_ns);
    cell_us(out, r.p99_ns);
    cell_us(out, r.mean_ns);
    if (std::isnan(r.throughput))
      std::fprintf(out, " %9s", "-");
    else
      std::fprintf(out, " %9.3f", r.throughput / 1e6);
    if (std::isnan(r.ratio))
      std::fprintf(out, " %8s", "-");
    else
      std::fprintf(out, " %7.1fx", r.ratio);
    if (!std::isnan(r.target_p50_ns))
      std::fprintf(out, "  p50 <= %.2f us", r.target_p50_ns / 1000.0);
    else if (!std::isnan(r.target_throughput))
      std::fprintf(out, "  >= %.1f Mops/s", r.target_throughput / 1e6);
    std::fputc('\n', out);
  }
  bool any = false;
  for (const auto &r : rows) {
    if (r.status != CHI_OK || std::isnan(r.cpu_ns_per_op)) continue;
    if (!any) std::fputs("CPU per task (the process's CPU time and context switches over the timed span, per task):\n", out);
    any = true;
    std::fprintf(out, "  %-38s %9.3f us CPU %9.4f switches\n", r.name, r.cpu_ns_per_op / 1000.0, r.csw_per_op);
  }
}

void json_row(std::FILE *out, const char *indent, const chi_bench_row &r) {
  std::fputs(indent, out);
  std::fputs("{\"name\": ", out);
  json_string(out, r.name);
  std::fprintf(out, ", \"kind\": \"%s\", \"route\": ", chi_bench_kind_name(r.kind));
  json_string(out, r.route);
  std::fputs(", \"method\": ", out);
  json_string(out, r.method);
  std::fprintf(out,
               ", \"payload_bytes\": %u, \"threads\": %u, \"processes\": %u, \"window\": %u, "
               "\"count\": %llu",
               r.payload_bytes, r.threads, r.processes, r.window,
               static_cast<unsigned long long>(r.count));
  std::fputs(", \"p50_ns\": ", out);
  json_number(out, r.p50_ns);
  std::fputs(", \"p99_ns\": ", out);
  json_number(out, r.p99_ns);
  std::fputs(", \"mean_ns\": ", out);
  json_number(out, r.mean_ns);
  std::fputs(", \"throughput_per_s\": ", out);
  json_number(out, r.throughput, "%.0f");
  std::fputs(", \"floor\": ", out);
  json_string(out, r.floor);
  std::fputs(", \"transport\": ", out);
  json_string(out, r.transport);
  std::fputs(", \"floor_p50_ns\": ", out);
  json_number(out, r.floor_p50_ns);
  std::fputs(", \"floor_throughput_per_s\": ", out);
  json_number(out, r.floor_throughput, "%.0f");
  std::fputs(", \"ratio\": ", out);
  json_number(out, r.ratio, "%.3f");
  // What the ratio compares: "p50" (p50 / floor p50), "throughput" (floor
  // throughput / throughput), or "" (no ratio).
  std::fprintf(out, ", \"ratio_of\": \"%s\"",
               std::isnan(r.ratio) ? "" : !std::isnan(r.floor_throughput) ? "throughput" : "p50");
  std::fputs(", \"target_p50_ns\": ", out);
  json_number(out, r.target_p50_ns);
  std::fputs(", \"target_throughput_per_s\": ", out);
  json_number(out, r.target_throughput, "%.0f");
  std::fputs(", \"cpu_ns_per_op\": ", out);
  json_number(out, r.cpu_ns_per_op);
  std::fputs(", \"context_switches_per_op\": ", out);
  json_number(out, r.csw_per_op, "%.4f");
  std::fprintf(out, ", \"status\": %d, \"error\": ", r.status);
  json_string(out, r.error);
  std::fputc('}', out);
}

void json_rows(std::FILE *out, const char *indent, const std::vector<chi_bench_row> &rows) {
  for (size_t i = 0; i < rows.size(); i++) {
    json_row(out, indent, rows[i]);
    std::fputs(i + 1 < rows.size() ? ",\n" : "\n", out);
  }
}


void cell_or_dash(std::FILE *out, const char *fmt, double v, double scale) {
  if (std::isnan(v))
    std::fputc('-', out);
  else
    std::fprintf(out, fmt, v / scale);
}

// Sweep rows, one line per client count; the fifth column is the row's
// ratio to its floor, or with `chi` chimaera's tasks/s at the same count
// over the row's.
void print_sweep(std::FILE *out, const std::vector<chi_bench_row> &rows, const char *vs,
                 const std::vector<chi_bench_row> *chi) {
  std::fprintf(out, "%8s %12s %10s %10s %9s  %s\n", "clients", "tasks/s", "p50 us", "p99 us", vs,
               "tasks");
  for (const auto &r : rows) {
    if (r.status != CHI_OK) {
      std::fprintf(out, "%8u FAILED: %s (%s)\n", r.processes, chi_status_string(r.status), r.error);
      continue;
    }
    std::fprintf(out, "%8u %12.0f %10.3f %10.3f", r.processes, r.throughput, r.p50_ns / 1000.0,
                 r.p99_ns / 1000.0);
    double ratio = chi ? NAN : r.ratio;
    if (chi)
      for (const auto &c : *chi)
        if (c.processes == r.processes && c.status == CHI_OK && r.throughput > 0)
          ratio = c.throughput / r.throughput;
    if (std::isnan(ratio))
      std::fprintf(out, " %9s", "-");
    else if (chi)
      std::fprintf(out, " %8.2fx", ratio);
    else
      std::fprintf(out, " %8.1fx", ratio);
    std::fprintf(out, "  %llu\n", static_cast<unsigned long long>(r.count));
  }
}

void print_raw_wake(std::FILE *out, const RawWakeFigures &w) {
  std::fprintf(out,
               "raw shm floor after %.0f ms idle, both sides asleep on a futex: round trip p50 ",
               w.idle_ms);
  cell_or_dash(out, "%.1f us", w.rt_p50_ns, 1000.0);
  std::fputs(", max ", out);
  cell_or_dash(out, "%.1f us", w.rt_max_ns, 1000.0);
  std::fprintf(out, " (%llu samples); one futex wake of the sleeping server thread: p50 ",
               static_cast<unsigned long long>(w.count));
  cell_or_dash(out, "%.1f us", w.oneway_p50_ns, 1000.0);
  std::fputs(", max ", out);
  cell_or_dash(out, "%.1f us", w.oneway_max_ns, 1000.0);
  std::fprintf(out, " (%llu samples)\n", static_cast<unsigned long long>(w.oneway_count));
  if (!w.note.empty()) std::fprintf(out, "note: %s\n", w.note.c_str());
}

void print_server_table(std::FILE *out, const ServerReport &s) {
  const ServerProc &p = s.server;
  std::fprintf(out, "\nclient->server: %s, %s", p.address.c_str(),
               p.bin.empty() ? "an existing server" : ("started " + p.bin).c_str());
  if (p.pid > 0) std::fprintf(out, " (pid %d)", int(p.pid));
  if (s.server_workers) std::fprintf(out, ", %u workers", s.server_workers);
  std::fputs("\n", out);
  for (const auto &t : s.transports) {
    std::fprintf(out, "  %-9s %s", transport_name(t.transport), t.address.c_str());
    if (t.curve_server)
      std::fprintf(out, " (second server, CURVE on, pid %d)", int(t.server_pid));
    std::fprintf(out, "; floor %s", t.floor.c_str());
    if (!t.pipe_floor.empty()) std::fprintf(out, ", pipelined %s", t.pipe_floor.c_str());
    std::fputc('\n', out);
  }
  if (s.curve_server.exit_status > 0)
    std::fprintf(out, "the CURVE server exited with status %d (log: %s)\n",
                 s.curve_server.exit_status, s.curve_server.log_path.c_str());
  if (!s.sweep.empty()) {
    std::fprintf(out,
                 "\nclient sweep: chi.add, each client process one round trip at a time for "
                 "%llu ms\n",
                 static_cast<unsigned long long>(s.client_ms));
    print_sweep(out, s.sweep, "vs floor", nullptr);
  }
  if (!s.raw_sweep.empty()) {
    std::fprintf(out,
                 "\nraw shm sweep, the sweep's floor: the same counts and length, %u B echo "
                 "through a pair of slots per client;\n1 server process with %u serving thread(s) "
                 "(%s); clients spin %.0f us, serving threads %.0f us, then sleep on a futex\n",
                 kRawPayloadBytes, s.raw_threads,
                 s.raw_threads_default ? "pollers unknown: the server's default count"
                                       : "as many as the server's shm pollers",
                 double(s.raw_client_spin_ns) / 1000.0, double(s.raw_server_spin_ns) / 1000.0);
    print_sweep(out, s.raw_sweep, "chi/raw", &s.sweep);
    std::fputs("raw shm spin: the same, nobody sleeps (spin, sched_yield after 20 us)\n", out);
    print_sweep(out, s.raw_spin, "chi/raw", &s.sweep);
    std::fputs("chi/raw: chimaera's tasks/s / the raw tasks/s at that count\n", out);
  }
  const IdleFigures &i = s.idle;
  if (i.measured) {
    std::fprintf(out, "\nidle, %u clients connected: server CPU ", i.clients);
    cell_or_dash(out, "%.2f%%", i.cpu_pct, 1.0);
    std::fprintf(out, " of one core over %.1f s (target < %.0f%%); server RSS ", i.seconds,
                 kServerTargetIdleCpuPct);
    cell_or_dash(out, "%.1f MiB", i.rss_kib, 1024.0);
    std::fputs(" (", out);
    cell_or_dash(out, "%.1f MiB", i.rss_base_kib, 1024.0);
    std::fputs(" before the bench's clients)\n", out);
    std::fprintf(out, "wake-up after %.0f ms idle: p50 ", i.wake_idle_ms);
    cell_or_dash(out, "%.1f us", i.wake_p50_ns, 1000.0);
    std::fputs(", max ", out);
    cell_or_dash(out, "%.1f us", i.wake_max_ns, 1000.0);
    std::fprintf(out, " over %llu clients (target p50 <= %.0f us)\n",
                 static_cast<unsigned long long>(i.wake_count), kServerTargetWakeP50Ns / 1000.0);
    if (!i.note.empty()) std::fprintf(out, "note: %s\n", i.note.c_str());
  }
  if (s.raw_wake.measured) print_raw_wake(out, s.raw_wake);
  const FairnessFigures &f = s.fairness;
  if (f.measured) {
    std::fprintf(out,
                 "\nfairness: %u clients, 1 flooding (window %u), %u doing one chi.add round "
                 "trip at a time for %llu ms\n",
                 f.clients, s.flood_window, f.clients - 1,
                 static_cast<unsigned long long>(s.client_ms));
    print_rows(out, s.fair);
    std::fputs("light clients' p99 with the flooder / without: ", out);
    cell_or_dash(out, "%.2fx", f.ratio, 1.0);
    std::fprintf(out, " (target <= %.0fx)\n", kServerTargetFairness);
  }
}

// The raw shm floors of the sweep and of the wake-up figure (raw_shm.h).
void print_raw_json(std::FILE *out, const ServerReport &s) {
  const RawWakeFigures &w = s.raw_wake;
  std::fprintf(out,
               ",\n    \"raw_shm\": {\"measured\": %s, \"threads\": %u, \"threads_from\": \"%s\", "
               "\"client_spin_ns\": %lld, \"server_spin_ns\": %lld, \"payload_bytes\": %u,\n"
               "      \"sweep\": [\n",
               s.raw_sweep.empty() ? "false" : "true", s.raw_threads,
               s.raw_threads_default ? "default" : "server pollers",
               static_cast<long long>(s.raw_client_spin_ns),
               static_cast<long long>(s.raw_server_spin_ns), kRawPayloadBytes);
  json_rows(out, "        ", s.raw_sweep);
  std::fputs("      ],\n      \"spin_sweep\": [\n", out);
  json_rows(out, "        ", s.raw_spin);
  std::fprintf(out, "      ],\n      \"wake\": {\"measured\": %s, \"idle_ms\": ",
               w.measured ? "true" : "false");
  json_number(out, w.idle_ms, "%.0f");
  std::fprintf(
      out, ", \"count\": %llu, \"round_trip_p50_ns\": ", static_cast<unsigned long long>(w.count));
  json_number(out, w.rt_p50_ns);
  std::fputs(", \"round_trip_max_ns\": ", out);
  json_number(out, w.rt_max_ns);
  std::fprintf(out, ", \"oneway_count\": %llu, \"oneway_p50_ns\": ",
               static_cast<unsigned long long>(w.oneway_count));
  json_number(out, w.oneway_p50_ns);
  std::fputs(", \"oneway_max_ns\": ", out);
  json_number(out, w.oneway_max_ns);
  std::fputs(", \"note\": ", out);
  json_string(out, w.note.c_str());
  std::fputs("}}", out);
}

void print_server_json(std::FILE *out, const ServerReport &s) {
  const ServerProc &p = s.server;
  std::fputs(",\n  \"server\": {\"address\": ", out);
  json_string(out, p.address.c_str());
  std::fprintf(out, ", \"started\": %s, \"bin\": ", p.bin.empty() ? "false" : "true");
  json_string(out, p.bin.c_str());
  std::fprintf(out,
               ", \"pid\": %d, \"workers\": %u, \"pollers\": %u, \"exit_status\": %d, "
               "\"client_ms\": %llu",
               int(p.pid), s.server_workers, s.server_pollers, p.exit_status,
               static_cast<unsigned long long>(s.client_ms));
  std::fputs(",\n    \"transports\": [\n", out);
  for (size_t k = 0; k < s.transports.size(); k++) {
    const TransportRun &t = s.transports[k];
    std::fprintf(out, "      {\"transport\": \"%s\", \"address\": ", transport_name(t.transport));
    json_string(out, t.address.c_str());
    std::fprintf(out, ", \"server_pid\": %d, \"curve_server\": %s, \"floor\": ", int(t.server_pid),
                 t.curve_server ? "true" : "false");
    json_string(out, t.floor.c_str());
    std::fputs(", \"pipe_floor\": ", out);
    json_string(out, t.pipe_floor.c_str());
    std::fputs(k + 1 < s.transports.size() ? "},\n" : "}\n", out);
  }
  const ServerProc &c = s.curve_server;
  std::fprintf(out, "    ],\n    \"curve_server\": {\"started\": %s, \"exit_status\": %d, \"address\": ",
               c.bin.empty() ? "false" : "true", c.exit_status);
  json_string(out, c.tcp_address.c_str());
  std::fputs("}", out);
  std::fputs(",\n    \"sweep\": [\n", out);
  json_rows(out, "      ", s.sweep);
  std::fputs("    ]", out);
  print_raw_json(out, s);
  const IdleFigures &i = s.idle;
  std::fprintf(out, ",\n    \"idle\": {\"measured\": %s, \"clients\": %u, \"seconds\": ",
               i.measured ? "true" : "false", i.clients);
  json_number(out, i.seconds, "%.3f");
  std::fputs(", \"server_cpu_pct\": ", out);
  json_number(out, i.cpu_pct, "%.3f");
  std::fprintf(out, ", \"target_cpu_pct\": %.1f, \"rss_base_kib\": ", kServerTargetIdleCpuPct);
  json_number(out, i.rss_base_kib, "%.0f");
  std::fputs(", \"rss_kib\": ", out);
  json_number(out, i.rss_kib, "%.0f");
  std::fprintf(out, ", \"wake_count\": %llu, \"wake_idle_ms\": ",
               static_cast<unsigned long long>(i.wake_count));
  json_number(out, i.wake_idle_ms, "%.0f");
  std::fputs(", \"wake_p50_ns\": ", out);
  json_number(out, i.wake_p50_ns);
  std::fputs(", \"wake_max_ns\": ", out);
  json_number(out, i.wake_max_ns);
  std::fprintf(out, ", \"target_wake_p50_ns\": %.0f, \"note\": ", kServerTargetWakeP50Ns);
  json_string(out, i.note.c_str());
  const FairnessFigures &f = s.fairness;
  std::fprintf(out, "},\n    \"fairness\": {\"measured\": %s, \"clients\": %u, \"flood_window\": %u, \"ratio\": ",
               f.measured ? "true" : "false", f.clients, s.flood_window);
  json_number(out, f.ratio, "%.3f");
  std::fprintf(out, ", \"target_ratio\": %.1f, \"rows\": [\n", kServerTargetFairness);
  json_rows(out, "      ", s.fair);
  std::fputs("    ]}}", out);
}

bool server_ok(const ServerReport *s) {
  if (!s) return true;
  bool ok = s->server.exit_status <= 0 && s->curve_server.exit_status <= 0;
  for (const auto &r : s->sweep) ok = ok && r.status == CHI_OK;
  for (const auto &r : s->fair) ok = ok && r.status == CHI_OK;
  for (const auto &r : s->raw_sweep) ok = ok && r.status == CHI_OK;
  for (const auto &r : s->raw_spin) ok = ok && r.status == CHI_OK;
  return ok;
}

}  // namespace

Machine probe_machine(int32_t gpus, int32_t workers, bool pinned) {
  Machine m;
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) == 0) m.hostname = host;
  struct utsname u;
  if (uname(&u) == 0) m.os = std::string(u.sysname) + " " + u.release + " " + u.machine;
  m.cpu_model = cpu_model();
  std::time_t now = std::time(nullptr);
  struct tm tm;
  char stamp[32] = {};
  if (gmtime_r(&now, &tm)) std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &tm);
  m.timestamp = stamp;
  m.online_cpus = chi_tool_online_cpus();
  m.gpus = gpus;
  m.workers = workers;
  m.pinned = pinned;
  m.clock_ns = chi_tool_clock_overhead_ns();
  return m;
}

void link_floors(std::vector<chi_bench_row> &rows, const std::vector<chi_bench_row> *floors) {
  for (auto &row : rows) {
    if (row.floor[0] == '\0') continue;
    for (const auto &f : floors ? *floors : rows) {
      if ((f.kind != CHI_BENCH_FLOOR && f.kind != CHI_BENCH_TPUT_FLOOR) ||
          std::strcmp(f.name, row.floor) != 0)
        continue;
      if (f.kind == CHI_BENCH_TPUT_FLOOR) {
        // Pipelined against pipelined: how many times the floor's rate.
        row.floor_throughput = f.throughput;
        if (row.kind == CHI_BENCH_THROUGHPUT && row.throughput > 0 && f.throughput > 0)
          row.ratio = f.throughput / row.throughput;
        break;
      }
      row.floor_p50_ns = f.p50_ns;
      // A throughput row's p50 is latency under load, not a round trip: no ratio.
      if (row.kind != CHI_BENCH_THROUGHPUT && f.p50_ns > 0) row.ratio = row.p50_ns / f.p50_ns;
      break;
    }
  }
}

void print_table(std::FILE *out, const Machine &m, const chi_bench_options &opt,
                 const std::vector<chi_bench_row> &rows, const ServerReport *srv) {
  std::fprintf(out, "chimaera-bench %s on %s: %u CPUs (%s), %d GPU(s), workers %s%s\n",
               chi_version_string(), m.hostname.c_str(), m.online_cpus, m.cpu_model.c_str(),
               m.gpus, m.workers ? std::to_string(m.workers).c_str() : "default",
               m.pinned ? ", pinned" : "");
  std::fprintf(out,
               "%llu timed round trips after %llu warm-up; %u-byte payload; throughput: %llu "
               "tasks, window %u; one clock read: %.0f ns\n\n",
               static_cast<unsigned long long>(opt.iters),
               static_cast<unsigned long long>(opt.warmup), opt.payload,
               static_cast<unsigned long long>(opt.tput_tasks), opt.window, m.clock_ns);
  print_rows(out, rows);
  std::fprintf(out,
               "\nvs floor: p50 / p50 of the floor row (%s), measured in this "
               "run.\nthroughput rows: p50/p99 are submit-to-result latency under load (1 task "
               "in 16).\n",
               srv && srv->enabled
                   ? "floor.xproc_pingpong for shm, floor.zmq_reqrep_TRANSPORT for ipc and tcp"
                   : "floor.cpu_pingpong for CPU routes");
  bool gpu_rows = false;
  for (const auto &r : rows) gpu_rows = gpu_rows || std::strncmp(r.floor, "floor.gpu_", 10) == 0;
  if (srv && srv->enabled && gpu_rows)
    std::fputs("GPU rows: floor.gpu_cpu_pingpong for gpuN->cpu, floor.gpu_block_pingpong for "
               "gpuN->local, embedded and client alike (timed with %globaltimer).\n",
               out);
  if (srv && srv->enabled && !srv->transports.empty())
    std::fputs("ZeroMQ pipelined rows: vs floor = tasks/s of their tput-floor (raw DEALER/ROUTER "
               "echo, 1 process, same window) / tasks/s of the row.\n",
               out);
  if (srv && srv->enabled) print_server_table(out, *srv);
}

void print_json(std::FILE *out, const Machine &m, const chi_bench_options &opt,
                const std::vector<chi_bench_row> &rows, const ServerReport *srv) {
  bool ok = server_ok(srv);
  for (const auto &r : rows) ok = ok && r.status == CHI_OK;
  std::fputs("{\n  \"tool\": \"chimaera-bench\",\n  \"chimaera_version\": ", out);
  json_string(out, chi_version_string());
  std::fputs(",\n  \"machine\": {\"hostname\": ", out);
  json_string(out, m.hostname.c_str());
  std::fputs(", \"os\": ", out);
  json_string(out, m.os.c_str());
  std::fputs(", \"cpu_model\": ", out);
  json_string(out, m.cpu_model.c_str());
  std::fprintf(out,
               ", \"online_cpus\": %u, \"gpus\": %d, \"workers\": %d, \"pinned\": %s, "
               "\"clock_overhead_ns\": %.1f, \"cuda\": %s, \"hip\": %s, \"timestamp\": ",
               m.online_cpus, m.gpus, m.workers, m.pinned ? "true" : "false", m.clock_ns,
               CHI_HAVE_CUDA ? "true" : "false", CHI_HAVE_HIP ? "true" : "false");
  json_string(out, m.timestamp.c_str());
  std::fprintf(out,
               "},\n  \"options\": {\"iters\": %llu, \"warmup\": %llu, \"tput_tasks\": %llu, "
               "\"window\": %u, \"threads\": %u, \"payload_bytes\": %u},\n  \"rows\": [\n",
               static_cast<unsigned long long>(opt.iters),
               static_cast<unsigned long long>(opt.warmup),
               static_cast<unsigned long long>(opt.tput_tasks), opt.window, opt.threads,
               opt.payload);
  json_rows(out, "    ", rows);
  std::fputs("  ]", out);
  if (srv && srv->enabled) print_server_json(out, *srv);
  std::fprintf(out, ",\n  \"ok\": %s\n}\n", ok ? "true" : "false");
}

}  // namespace chi_bench

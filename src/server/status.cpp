#include "server/status.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "core/mps.h"
#include "core/runtime.h"
#include "ipc/channel.h"
#include "server/listener.h"
#include "server/service.h"

namespace chi {

namespace {
// The whole answer fits one session-socket message on every transport: the
// client rows stop short of it, and say how many were left out.
constexpr size_t kMaxStatusBytes = ipc::kMaxMsgPayload;
constexpr size_t kMaxAddressBytes = 4096;
constexpr size_t kTailBytes = 2048;  // the routes and counters after the rows

// `text` (any bytes: a path) inside a JSON string.
void json_text(const std::string &text, std::string *out) {
  for (char ch : text) {
    if (ch == '"' || ch == '\\') {
      *out += '\\';
      *out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      char esc[8];
      snprintf(esc, sizeof esc, "\\u%04x", unsigned(static_cast<unsigned char>(ch)));
      *out += esc;
    } else {
      *out += ch;
    }
  }
}
}  // namespace

std::string status_text(Service &service, bool json) {
  Runtime &rt = service.runtime();
  std::string addrs;
  std::vector<ClientRow> rows, gone;
  size_t pollers = 0;
  for (Listener *l : service.listeners()) {
    addrs += (addrs.empty() ? "" : " ") + l->address();
    l->rows(&rows);
    pollers += l->pollers();
  }
  if (addrs.size() > kMaxAddressBytes) addrs = addrs.substr(0, kMaxAddressBytes) + "...";
  // Clients gone with tasks still running are listed apart ("leaving").
  for (auto it = rows.begin(); it != rows.end();) {
    if (it->gone) {
      gone.push_back(*it);
      it = rows.erase(it);
    } else {
      ++it;
    }
  }
  chi_stats_t st;
  rt.read_stats(&st);
  // Each GPU's orchestrator as it is now (paused, failed...), not assumed.
  std::string orch_json, orch_text;
  const int32_t ngpus = rt.gpu() ? rt.gpu()->count() : 0;
  for (int32_t g = 0; g < ngpus; ++g) {
    uint64_t launches = 0, parks = 0;
    const char *state = rt.gpu()->orchestrator_state(g, &launches, &parks);
    char one[192];
    snprintf(one, sizeof one, "%s{\"gpu\":%d,\"state\":\"%s\",\"launches\":%llu,\"parks\":%llu}", g ? "," : "",
             int(g), state, (unsigned long long)launches, (unsigned long long)parks);
    orch_json += one;
    snprintf(one, sizeof one, "%sGPU %d %s, %llu launch(es), parked %llu time(s)", g ? "; " : "", int(g), state,
             (unsigned long long)launches, (unsigned long long)parks);
    orch_text += one;
  }
  if (orch_text.empty()) orch_text = "none";
  // MPS: whether the GPUs are shared with other processes' contexts
  // concurrently or time-sliced (docs/server.md, "GPUs shared by processes").
  std::string mps_dir;
  const bool mps = ngpus > 0 && rt.gpu()->mps_active(&mps_dir);
  // Who started the daemon: this server (server.mps), another chimaera
  // process that shares it, or the user (scripts/mps.sh, a job script).
  std::string mps_by = "its user";
  if (rt.mps()) mps_by = rt.mps()->started_by() == "this process" ? "this server" : rt.mps()->started_by();
  if (ngpus > 0)
    orch_text += mps ? "; MPS active at " + mps_dir + ", started by " + mps_by : std::string("; MPS not active");
  static const char *const names[] = {"cpu", "gpu", "client", "reserved"};
  char line[512];
  std::string out;
  if (json) {
    // Addresses come from the config: any length, any character (a path).
    out = "{\"address\":\"";
    json_text(addrs, &out);
    snprintf(line, sizeof line,
             "\",\"pid\":%d,\"version\":\"%s\",\"workers\":%u,"
             "\"pollers\":%zu,\"slots_in_use\":%llu,\"slots_total\":%llu,\"gpus\":%d,"
             "\"gpu_orchestrators\":[",
             int(getpid()), ipc::version_text(CHI_VERSION_NUMBER).c_str(), st.workers,
             pollers, (unsigned long long)st.slots_in_use, (unsigned long long)st.slots_total,
             st.gpus);
    out += line;
    out += orch_json + "],\"mps\":" + (mps ? "true" : "false");
    if (mps) {
      out += ",\"mps_dir\":\"";
      json_text(mps_dir, &out);
      out += "\",\"mps_started_by\":\"";
      json_text(mps_by, &out);
      out += "\"";
    }
    out += ",\"clients\":[";
    size_t shown = 0;
    for (; shown < rows.size(); ++shown) {
      const size_t i = shown;
      snprintf(line, sizeof line,
               "%s{\"id\":%u,\"pid\":%d,\"uid\":%u,\"submitted\":%llu,\"finished\":%llu,\"in_flight\":%u",
               i ? "," : "", rows[i].id, rows[i].pid, rows[i].uid,
               (unsigned long long)rows[i].submitted, (unsigned long long)rows[i].finished,
               rows[i].in_flight);
      std::string row = line;
      // shm:// clients only: which poller serves them.
      if (rows[i].poller >= 0) row += ",\"poller\":" + std::to_string(rows[i].poller);
      row += "}";
      if (out.size() + row.size() + kTailBytes > kMaxStatusBytes) break;
      out += row;
    }
    out += "],\"clients_omitted\":" + std::to_string(rows.size() - shown) + ",\"leaving\":[";
    for (size_t i = 0; i < gone.size(); ++i) {
      snprintf(line, sizeof line, "%s{\"id\":%u,\"pid\":%d,\"in_flight\":%u}", i ? "," : "", gone[i].id,
               gone[i].pid, gone[i].in_flight);
      if (out.size() + std::strlen(line) + kTailBytes > kMaxStatusBytes) break;
      out += line;
    }
    out += "],\"routes\":{";
    for (int r = 0; r < 3; ++r) {
      const chi_route_stats_t &x = st.routes[r];
      snprintf(line, sizeof line,
               "%s\"%s\":{\"submitted\":%llu,\"completed\":%llu,\"failed\":%llu,\"in_flight\":%llu,"
               "\"p50_ns\":%llu,\"p99_ns\":%llu,\"max_ns\":%llu}",
               r ? "," : "", names[r], (unsigned long long)x.submitted,
               (unsigned long long)x.completed, (unsigned long long)x.failed,
               (unsigned long long)x.in_flight, (unsigned long long)x.latency_p50_ns,
               (unsigned long long)x.latency_p99_ns, (unsigned long long)x.latency_max_ns);
      out += line;
    }
    snprintf(line, sizeof line, "},\"tasks_cancelled\":%llu}\n", (unsigned long long)st.tasks_cancelled);
    out += line;
    return out;
  }
  snprintf(line, sizeof line,
           "chimaera-server %s, pid %d\n"
           "workers:  %u CPU worker(s), %zu client poller(s)\n"
           "slots:    %llu of %llu CPU task slots in use\n"
           "gpus:     %d (orchestrators: ",
           ipc::version_text(CHI_VERSION_NUMBER).c_str(), int(getpid()), st.workers,
           pollers, (unsigned long long)st.slots_in_use, (unsigned long long)st.slots_total,
           st.gpus);
  out += line;
  out += orch_text + ")\nserving:  " + addrs + "\nclients:  " + std::to_string(rows.size()) + "\n";
  if (!rows.empty()) out += "  id      pid      uid    submitted     finished  in-flight  poller\n";
  size_t shown = 0;
  for (const ClientRow &r : rows) {
    char poller[16] = "-";
    if (r.poller >= 0) snprintf(poller, sizeof poller, "%d", r.poller);
    snprintf(line, sizeof line, "  %-6u %-8d %-6u %10llu %12llu %10u  %6s\n", r.id, r.pid, r.uid,
             (unsigned long long)r.submitted, (unsigned long long)r.finished, r.in_flight, poller);
    if (out.size() + std::strlen(line) + kTailBytes > kMaxStatusBytes) break;
    out += line;
    ++shown;
  }
  if (shown < rows.size())
    out += "  ... and " + std::to_string(rows.size() - shown) + " more client(s) (a status reply holds 64 KiB)\n";
  // Their device memory is kept until these tasks end (docs/server.md).
  if (!gone.empty()) {
    out += "leaving:  " + std::to_string(gone.size()) + " client(s) gone, tasks still running:";
    for (const ClientRow &r : gone) out += " " + std::to_string(r.id) + " (" + std::to_string(r.in_flight) + ")";
    out += "\n";
  }
  out += "route     submitted   completed      failed  in-flight     p50 ns     p99 ns\n";
  for (int r = 0; r < 3; ++r) {
    const chi_route_stats_t &x = st.routes[r];
    snprintf(line, sizeof line, "%-8s %10llu %11llu %11llu %10llu %10llu %10llu\n", names[r],
             (unsigned long long)x.submitted, (unsigned long long)x.completed,
             (unsigned long long)x.failed, (unsigned long long)x.in_flight,
             (unsigned long long)x.latency_p50_ns, (unsigned long long)x.latency_p99_ns);
    out += line;
  }
  snprintf(line, sizeof line, "cancelled: %llu client task(s) dropped unstarted when their client left\n",
           (unsigned long long)st.tasks_cancelled);
  out += line;
  return out;
}

}  // namespace chi

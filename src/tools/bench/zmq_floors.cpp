#include "zmq_floors.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "tool_util.h"

namespace chi_bench {
namespace {

constexpr int kTimeoutMs = 10000;      // a lost peer fails the row, never hangs it
constexpr uint64_t kSampleEvery = 16;  // pipelined: one message in 16 is timed

struct Keys {
  char server_pub[41], server_sec[41], client_pub[41], client_sec[41];
};

void set_int(void *sock, int opt, int v) { zmq_setsockopt(sock, opt, &v, sizeof v); }

// Time bounds, linger and, for tcp-curve, the CURVE role.  The responder has
// no ZAP handler: libzmq then admits any client key, and the floor pays for
// the encryption only.
bool setup(void *sock, int t, bool server, const Keys &k) {
  set_int(sock, ZMQ_LINGER, server ? 2000 : 0);
  set_int(sock, ZMQ_RCVTIMEO, kTimeoutMs);
  set_int(sock, ZMQ_SNDTIMEO, kTimeoutMs);
  if (t != kTcpCurve) return true;
  if (server) {
    set_int(sock, ZMQ_CURVE_SERVER, 1);
    return zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, k.server_sec, 40) == 0;
  }
  return zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, k.server_pub, 40) == 0 &&
         zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, k.client_pub, 40) == 0 &&
         zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, k.client_sec, 40) == 0;
}

// The child: binds, tells the parent its endpoint through wfd ("!why" on
// failure), echoes `total` messages and exits.
[[noreturn]] void responder(int t, bool router, const std::string &bind, uint64_t total,
                            size_t size, int wfd, const Keys &k) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  void *ctx = zmq_ctx_new();
  void *s = ctx ? zmq_socket(ctx, router ? ZMQ_ROUTER : ZMQ_REP) : nullptr;
  char ep[512] = "!";
  if (!s || !setup(s, t, true, k) || zmq_bind(s, bind.c_str()) != 0) {
    std::snprintf(ep, sizeof ep, "!bind %s: %s", bind.c_str(), zmq_strerror(zmq_errno()));
    (void)!write(wfd, ep, std::strlen(ep) + 1);
    _exit(1);
  }
  size_t len = sizeof ep;
  zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, ep, &len);
  (void)!write(wfd, ep, std::strlen(ep) + 1);
  close(wfd);
  std::vector<char> buf(size + 64);
  char id[256];
  for (uint64_t i = 0; i < total; i++) {
    int idn = 0;
    if (router && (idn = zmq_recv(s, id, sizeof id, 0)) < 0) _exit(2);
    int n = zmq_recv(s, buf.data(), buf.size(), 0);
    if (n < 0) _exit(2);
    if (router && zmq_send(s, id, size_t(idn), ZMQ_SNDMORE) < 0) _exit(3);
    if (zmq_send(s, buf.data(), size_t(n), 0) < 0) _exit(3);
  }
  zmq_close(s);  // lingers until the last replies are out
  zmq_ctx_term(ctx);
  _exit(0);
}

struct Pair {
  pid_t child = -1;
  void *ctx = nullptr;
  void *sock = nullptr;
  std::string dir;  // ipc: the socket file's private directory
  std::string err;

  // Starts the responder and connects to it (REQ or DEALER).
  bool open(int t, bool pipelined, uint64_t total, size_t size) {
    Keys k{};
    if (t == kTcpCurve && (zmq_curve_keypair(k.server_pub, k.server_sec) != 0 ||
                           zmq_curve_keypair(k.client_pub, k.client_sec) != 0)) {
      err = std::string("zmq_curve_keypair: ") + zmq_strerror(zmq_errno());
      return false;
    }
    std::string bind = "tcp://127.0.0.1:*";
    if (t == kIpc) {
      const char *tmp = std::getenv("TMPDIR");
      std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/chimaera-bench-zmq.XXXXXX";
      std::vector<char> d(tmpl.begin(), tmpl.end());
      d.push_back(0);
      if (!mkdtemp(d.data())) {
        err = "mkdtemp " + tmpl + ": " + std::strerror(errno);
        return false;
      }
      dir = d.data();
      bind = "ipc://" + dir + "/floor.ipc";
    }
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
      err = std::string("pipe: ") + std::strerror(errno);
      return false;
    }
    std::fflush(nullptr);
    child = fork();
    if (child < 0) {
      err = std::string("fork: ") + std::strerror(errno);
      close(fds[0]);
      close(fds[1]);
      return false;
    }
    if (child == 0) {
      close(fds[0]);
      responder(t, pipelined, bind, total, size, fds[1], k);
    }
    close(fds[1]);
    std::string ep;
    uint64_t deadline = chi_tool_now_ns() + uint64_t(kTimeoutMs) * 1000000ull;
    for (;;) {
      struct pollfd p = {fds[0], POLLIN, 0};
      if (chi_tool_now_ns() > deadline) break;
      if (poll(&p, 1, 100) <= 0) continue;
      char c;
      ssize_t n = read(fds[0], &c, 1);
      if (n <= 0 || c == 0) break;
      ep.push_back(c);
    }
    close(fds[0]);
    if (ep.empty() || ep[0] == '!') {
      err = ep.empty() ? std::string("the responder did not start") : ep.substr(1);
      return false;
    }
    ctx = zmq_ctx_new();
    sock = ctx ? zmq_socket(ctx, pipelined ? ZMQ_DEALER : ZMQ_REQ) : nullptr;
    if (!sock || !setup(sock, t, false, k) || zmq_connect(sock, ep.c_str()) != 0) {
      err = "connect " + ep + ": " + zmq_strerror(zmq_errno());
      return false;
    }
    return true;
  }

  // Closes the socket and the context (joining its threads), reaps the child.
  void close_all(bool ok) {
    if (sock) zmq_close(sock);
    if (ctx) zmq_ctx_term(ctx);
    sock = ctx = nullptr;
    if (child > 0) {
      if (!ok) kill(child, SIGKILL);
      uint64_t deadline = chi_tool_now_ns() + 5'000'000'000ull;
      while (waitpid(child, nullptr, WNOHANG) != child) {
        if (chi_tool_now_ns() > deadline) {
          kill(child, SIGKILL);
          waitpid(child, nullptr, 0);
          break;
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, nullptr);
      }
      child = -1;
    }
    if (!dir.empty()) {
      unlink((dir + "/floor.ipc").c_str());
      rmdir(dir.c_str());
      dir.clear();
    }
  }
};

void fill(uint8_t *p, size_t n, uint64_t seq) {
  for (size_t i = 0; i < n; i++) p[i] = uint8_t(0xA5 ^ (i * 31));
  std::memcpy(p, &seq, std::min(n, sizeof seq));
}

void init_floor(chi_bench_row *row, const char *name, int kind, const chi_bench_options &opt,
                int t) {
  chi_bench_row_init(row, name, kind);
  row->payload_bytes = opt.payload;
  std::snprintf(row->transport, sizeof row->transport, "%s", transport_name(t));
}

const char *const kNames[kTransports] = {"shm", "ipc", "tcp", "tcp-curve"};

}  // namespace

const char *transport_name(int t) { return t >= 0 && t < kTransports ? kNames[t] : "?"; }

int parse_transport(const std::string &name) {
  for (int t = 0; t < kTransports; t++)
    if (name == kNames[t]) return t;
  return -1;
}

const char *zmq_reqrep_floor_name(int t) {
  switch (t) {
    case kIpc: return "floor.zmq_reqrep_ipc";
    case kTcp: return "floor.zmq_reqrep_tcp";
    case kTcpCurve: return "floor.zmq_reqrep_tcp_curve";
    default: return "";
  }
}

const char *zmq_pipe_floor_name(int t) {
  switch (t) {
    case kIpc: return "floor.zmq_pipe_ipc";
    case kTcp: return "floor.zmq_pipe_tcp";
    case kTcpCurve: return "floor.zmq_pipe_tcp_curve";
    default: return "";
  }
}

void zmq_reqrep_floor(const chi_bench_options &opt, int t, chi_bench_row *row) {
  init_floor(row, zmq_reqrep_floor_name(t), CHI_BENCH_FLOOR, opt, t);
  const uint64_t total = opt.warmup + opt.iters;
  const size_t size = opt.payload;
  Pair p;
  if (!p.open(t, false, total, size)) {
    chi_bench_row_fail(row, CHI_ERR_INTERNAL, "%s", p.err.c_str());
    p.close_all(false);
    return;
  }
  std::vector<uint8_t> in(size ? size : 1), out(size + 64);
  std::vector<uint64_t> samples(opt.iters);
  bool ok = true;
  for (uint64_t i = 0; i < total && ok; i++) {
    fill(in.data(), size, i);
    uint64_t t0 = chi_tool_now_ns();
    int n = -1;
    if (zmq_send(p.sock, in.data(), size, 0) >= 0) n = zmq_recv(p.sock, out.data(), out.size(), 0);
    uint64_t t1 = chi_tool_now_ns();
    if (n < 0) {
      chi_bench_row_fail(row, CHI_ERR_INTERNAL, "round trip %llu: %s",
                         static_cast<unsigned long long>(i), zmq_strerror(zmq_errno()));
      ok = false;
    } else if (size_t(n) != size || std::memcmp(in.data(), out.data(), size) != 0) {
      chi_bench_row_fail(row, CHI_ERR_INTERNAL, "the echo differs from its input");
      ok = false;
    } else if (i >= opt.warmup) {
      samples[i - opt.warmup] = t1 - t0;
    }
  }
  p.close_all(ok);
  if (ok) chi_bench_row_samples(row, samples.data(), samples.size());
}

void zmq_pipe_floor(const chi_bench_options &opt, int t, chi_bench_row *row) {
  init_floor(row, zmq_pipe_floor_name(t), CHI_BENCH_TPUT_FLOOR, opt, t);
  const uint32_t win = opt.window ? opt.window : 1;
  row->window = win;
  const size_t size = opt.payload < 8 ? 8 : opt.payload;  // the sequence number travels
  row->payload_bytes = uint32_t(size);
  Pair p;
  if (!p.open(t, true, opt.warmup + opt.tput_tasks, size)) {
    chi_bench_row_fail(row, CHI_ERR_INTERNAL, "%s", p.err.c_str());
    p.close_all(false);
    return;
  }
  std::vector<uint8_t> in(size), out(size + 64);
  std::vector<uint64_t> started(win), samples;
  samples.reserve(opt.tput_tasks / kSampleEvery + 1);
  // n messages from seq `first`, win in flight; replies come back in order.
  auto go = [&](uint64_t first, uint64_t n, bool record) -> bool {
    uint64_t sent = 0, got = 0;
    while (got < n) {
      while (sent < n && sent - got < win) {
        uint64_t seq = first + sent;
        fill(in.data(), size, seq);
        started[seq % win] = (record && seq % kSampleEvery == 0) ? chi_tool_now_ns() : 0;
        if (zmq_send(p.sock, in.data(), size, 0) < 0) {
          chi_bench_row_fail(row, CHI_ERR_INTERNAL, "send: %s", zmq_strerror(zmq_errno()));
          return false;
        }
        sent++;
      }
      int r = zmq_recv(p.sock, out.data(), out.size(), 0);
      if (r < 0) {
        chi_bench_row_fail(row, CHI_ERR_INTERNAL, "recv: %s", zmq_strerror(zmq_errno()));
        return false;
      }
      uint64_t seq = first + got;
      fill(in.data(), size, seq);
      if (size_t(r) != size || std::memcmp(in.data(), out.data(), size) != 0) {
        chi_bench_row_fail(row, CHI_ERR_INTERNAL, "echo %llu differs from its input",
                           static_cast<unsigned long long>(seq));
        return false;
      }
      if (uint64_t t0 = started[seq % win]) samples.push_back(chi_tool_now_ns() - t0);
      got++;
    }
    return true;
  };
  bool ok = go(0, opt.warmup, false);
  uint64_t t0 = chi_tool_now_ns();
  ok = ok && go(opt.warmup, opt.tput_tasks, true);
  uint64_t t1 = chi_tool_now_ns();
  p.close_all(ok);
  if (!ok) return;
  chi_bench_row_samples(row, samples.data(), samples.size());
  row->count = opt.tput_tasks;
  row->throughput = t1 > t0 ? double(opt.tput_tasks) * 1e9 / double(t1 - t0) : NAN;
}

}  // namespace chi_bench

/*
 * The attacks of the 2026-11-28 security review, replayed against a real
 * chimaera-server (in this process, or in a child that re-executes this
 * program): an oversized ZeroMQ frame before any handshake, many idle
 * connections, the `source;destination` address form, a fake server's
 * oversized status reply, keygen through a symlink, a blocking doorbell,
 * connections beyond max_clients, descriptor exhaustion and half-sent
 * messages.  Every bound is a count; timeouts only guard against hangs.
 *
 * `test_security squat` runs the attacks that need a second local user (a
 * foreign uid squatting an ipc:// path or the /tmp runtime folder); it exits
 * 77 unless it runs as root (it switches uids, it makes no account).
 */
// C++ headers first: cmocka's macros would break them.
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <zmq.h>

#include "ipc/frame.h"
#include "ipc/segment.h"
#include "ipc/wire.h"

extern "C" {
#include "common.h"
#include "spawn.h"
}

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>

namespace {

std::string g_self;  // this program, for children
std::string g_dir;   // private runtime directory (CHI_RUNTIME_DIR)
std::vector<pid_t> g_children;  // killed at exit, should a failed test leave one

pid_t spawn_child(const std::vector<std::string> &args, const std::string &log) {
  const pid_t pid = chi_test_spawn(args, log.c_str());
  assert_true(pid > 0);
  g_children.push_back(pid);
  return pid;
}

int next_port() {
  // Ports from the pid, below the ephemeral range as test_server's, and
  // apart from them (test_server's are 20000..32000, these 9000..19000).
  static int n = 0;
  return 9000 + (getpid() % 200) * 50 + (++n % 50);
}

struct Server {
  chi_runtime_t *rt = nullptr;
  chi_server_t *srv = nullptr;
  std::string address;
};

// A server in this process on a fresh address of `transport` (shm, ipc, tcp).
Server start_server(const std::string &transport, const char *yaml = nullptr) {
  static int n = 0;
  Server s;
  s.rt = chi_test_init_yaml(2, yaml ? yaml : "workers: 2\n");
  chi_status_t st = CHI_ERR_INVALID;
  for (int k = 0; k < 8 && st != CHI_OK; ++k) {
    if (transport == "tcp")
      s.address = "tcp://127.0.0.1:" + std::to_string(next_port());
    else if (transport == "ipc")
      s.address = "ipc://" + g_dir + "/s" + std::to_string(++n) + ".ipc";
    else
      s.address = "shm://sec-" + std::to_string(getpid()) + "-" + std::to_string(++n);
    st = chi_server_start(s.rt, s.address.c_str(), &s.srv);
    if (st != CHI_OK && transport != "tcp") break;
  }
  assert_status(CHI_OK, st);
  return s;
}

chi_status_t try_client(const std::string &address, chi_runtime_t **rt) {
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.mode = CHI_MODE_CLIENT;
  cfg.server_address = address.c_str();
  *rt = nullptr;
  return chi_init(&cfg, rt);
}

// An honest client connects and gets n correct sums, each within a hang guard.
void honest_round_trips(const std::string &address, int n) {
  chi_runtime_t *c = nullptr;
  assert_status(CHI_OK, try_client(address, &c));
  for (int i = 0; i < n; ++i) {
    uint64_t in[2] = {uint64_t(i), 40}, out = 0;
    chi_future_t f;
    size_t got = 0;
    assert_status(CHI_OK, chi_submit(c, CHI_ROUTE_CPU, CHI_METHOD_ADD, in, sizeof in, &f));
    assert_status(CHI_OK, chi_wait(c, f, 10000000000ll, &out, sizeof out, &got));
    assert_int_equal(out, uint64_t(i) + 40);
  }
  assert_status(CHI_OK, chi_finalize(c));
}

std::string shm_socket_path(const std::string &address) { return g_dir + "/" + address.substr(6) + ".sock"; }

int unix_connect(const std::string &path) {
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(s >= 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  assert_true(path.size() < sizeof a.sun_path);
  memcpy(a.sun_path, path.c_str(), path.size() + 1);
  if (connect(s, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) {
    close(s);
    return -1;
  }
  return s;
}

int tcp_connect(int port) {
  int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(s >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(s, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) {
    close(s);
    return -1;
  }
  return s;
}

int port_of(const std::string &address) { return atoi(address.c_str() + address.rfind(':') + 1); }

void guard_io(int s, int seconds) {
  timeval tv{seconds, 0};
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

int64_t now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

// Counts the sockets the server closed (EOF or reset), polling until at least
// `want` are closed or the hang guard (guard_ms) passes.  Bytes the server
// sends (a ZMTP greeting) are read and ignored.
int count_closed(std::vector<int> &socks, int want, int guard_ms) {
  std::vector<bool> closed(socks.size(), false);
  int n = 0;
  for (const int64_t end = now_ms() + guard_ms; now_ms() < end && n < want;) {
    std::vector<pollfd> p;
    for (size_t i = 0; i < socks.size(); ++i) p.push_back({closed[i] ? -1 : socks[i], POLLIN, 0});
    if (poll(p.data(), p.size(), 100) <= 0) continue;
    for (size_t i = 0; i < p.size(); ++i) {
      if (closed[i] || !(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char b[256];
      const ssize_t k = recv(socks[i], b, sizeof b, MSG_DONTWAIT);
      if (k == 0 || (k < 0 && errno != EAGAIN)) {
        closed[i] = true;
        ++n;
      }
    }
  }
  return n;
}

void close_all(std::vector<int> &socks) {
  for (int s : socks)
    if (s >= 0) close(s);
  socks.clear();
}

// ---- shm session socket, spoken by hand (a hostile client)

void raw_send(int s, chi::ipc::Kind kind, uint16_t op, const void *payload, uint32_t len) {
  chi::ipc::MsgHeader h{chi::ipc::kMsgMagic, uint16_t(kind), op, 0, len, 0};
  assert_int_equal(send(s, &h, sizeof h, MSG_NOSIGNAL), sizeof h);
  if (len) assert_int_equal(send(s, payload, len, MSG_NOSIGNAL), len);
}

// One reply (header, payload, up to two passed descriptors); false on EOF.
bool raw_recv(int s, chi::ipc::MsgHeader *h, std::string *body, int *fds = nullptr) {
  char ctrl[CMSG_SPACE(2 * sizeof(int))];
  iovec iov{h, sizeof *h};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = ctrl;
  m.msg_controllen = sizeof ctrl;
  if (recvmsg(s, &m, MSG_WAITALL | MSG_CMSG_CLOEXEC) != ssize_t(sizeof *h)) return false;
  if (fds) {
    cmsghdr *c = CMSG_FIRSTHDR(&m);
    if (c && c->cmsg_type == SCM_RIGHTS) memcpy(fds, CMSG_DATA(c), 2 * sizeof(int));
  }
  body->assign(h->length, '\0');
  return h->length == 0 || recv(s, body->data(), h->length, MSG_WAITALL) == ssize_t(h->length);
}

// Says hello (a task or control session); the welcome's status (a refusal
// may come before the hello is sent), or 1 for EOF.
int32_t raw_hello(int s, uint32_t kind, int *fds = nullptr) {
  guard_io(s, 20);
  chi::ipc::Hello hello{chi::ipc::kProtocolVersion, chi_version(), kind, 0};
  chi::ipc::MsgHeader out{chi::ipc::kMsgMagic, uint16_t(chi::ipc::Kind::kHello), 0, 0, sizeof hello, 0};
  std::string msg(reinterpret_cast<char *>(&out), sizeof out);
  msg.append(reinterpret_cast<char *>(&hello), sizeof hello);
  if (send(s, msg.data(), msg.size(), MSG_NOSIGNAL) < 0 && errno != EPIPE && errno != ECONNRESET) return 1;
  chi::ipc::MsgHeader h;
  std::string body;
  if (!raw_recv(s, &h, &body, fds)) return 1;
  return h.status;
}

// ---- a fake server (a ROUTER that admits anyone) for the client-side checks

struct FakeServer {
  std::string address;
  size_t control_reply = 0;  // bytes of 'A' it answers every control request with
  std::atomic<bool> quit{false};
  std::atomic<bool> ready{false};
  std::thread thread;
};

void fake_server_main(FakeServer *fs, bool open_socket) {
  void *ctx = zmq_ctx_new();
  void *router = zmq_socket(ctx, ZMQ_ROUTER);
  const int linger = 0;
  zmq_setsockopt(router, ZMQ_LINGER, &linger, sizeof linger);
  if (zmq_bind(router, fs->address.c_str()) != 0) {
    fprintf(stderr, "fake server: cannot bind %s: %s\n", fs->address.c_str(), zmq_strerror(errno));
    _exit(3);
  }
  if (open_socket) chmod(fs->address.c_str() + 6, 0666);
  fs->ready.store(true);
  while (!fs->quit.load()) {
    zmq_pollitem_t item{router, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, 100) <= 0) continue;
    zmq_msg_t id, body;
    zmq_msg_init(&id);
    zmq_msg_init(&body);
    if (zmq_msg_recv(&id, router, 0) < 0 || zmq_msg_recv(&body, router, 0) < 0) break;
    std::string why, out;
    chi::ipc::for_each_frame(static_cast<const uint8_t *>(zmq_msg_data(&body)), zmq_msg_size(&body), &why,
                             [&](const chi::ipc::Frame &f, size_t) {
                               chi::ipc::Frame r;
                               r.id = f.id;
                               std::string payload;
                               if (f.kind == chi::ipc::Kind::kHello) {
                                 chi::ipc::Welcome w{chi::ipc::kProtocolVersion, chi_version(), 1024, 4096, 0, 100,
                                                     0, 7, 0};
                                 r.kind = chi::ipc::Kind::kWelcome;
                                 payload.assign(reinterpret_cast<const char *>(&w), sizeof w);
                               } else if (f.kind == chi::ipc::Kind::kControl) {
                                 r.kind = chi::ipc::Kind::kControlReply;
                                 payload.assign(fs->control_reply, 'A');
                               } else {
                                 return true;
                               }
                               r.payload = reinterpret_cast<const uint8_t *>(payload.data());
                               r.size = uint32_t(payload.size());
                               chi::ipc::encode_frame(r, &out);
                               return true;
                             });
    if (!out.empty()) {
      zmq_send(router, zmq_msg_data(&id), zmq_msg_size(&id), ZMQ_SNDMORE);
      zmq_send(router, out.data(), out.size(), 0);
    }
    zmq_msg_close(&id);
    zmq_msg_close(&body);
  }
  zmq_close(router);
  zmq_ctx_term(ctx);
}

std::atomic<int> g_sleeps_started{0};

// A handler that sleeps for the number of microseconds in its input.
chi_status_t sleep_handler(chi_request_t *req, void *) {
  g_sleeps_started.fetch_add(1);
  uint64_t us = 0;
  if (req->input_size >= sizeof us) memcpy(&us, req->input, sizeof us);
  usleep(useconds_t(us));
  req->output_size = 0;
  return CHI_OK;
}

// A raw DEALER: its routing id, one frame out, frames in.
void *raw_dealer(void *ctx, const std::string &address, const std::string &routing_id) {
  void *d = zmq_socket(ctx, ZMQ_DEALER);
  const int linger = 0;
  zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof linger);
  assert_int_equal(zmq_setsockopt(d, ZMQ_ROUTING_ID, routing_id.data(), routing_id.size()), 0);
  assert_int_equal(zmq_connect(d, address.c_str()), 0);
  return d;
}

void raw_frame(void *d, chi::ipc::Kind kind, uint64_t id, uint32_t method, const void *p, uint32_t n) {
  chi::ipc::Frame f;
  f.kind = kind;
  f.id = id;
  f.method = method;
  f.route = CHI_ROUTE_CPU;
  f.payload = static_cast<const uint8_t *>(p);
  f.size = n;
  std::string out;
  chi::ipc::encode_frame(f, &out);
  assert_true(zmq_send(d, out.data(), out.size(), 0) >= 0);
}

// Counts the frames of `kind` that arrive within a hang guard of guard_ms.
int raw_count(void *d, chi::ipc::Kind kind, int guard_ms, int32_t *status = nullptr) {
  int n = 0;
  for (const int64_t end = now_ms() + guard_ms; now_ms() < end;) {
    zmq_pollitem_t item{d, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, 50) <= 0) continue;
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, d, 0) >= 0) {
      std::string why;
      chi::ipc::for_each_frame(static_cast<const uint8_t *>(zmq_msg_data(&m)), zmq_msg_size(&m), &why,
                               [&](const chi::ipc::Frame &f, size_t) {
                                 if (f.kind == kind) {
                                   ++n;
                                   if (status) *status = f.status;
                                 }
                                 return true;
                               });
    }
    zmq_msg_close(&m);
  }
  return n;
}

/* ------------------------------------------------------------------ tests */

// C1: a peer that declares a huge frame before any handshake is cut off
// after the header, instead of the server reading (and holding) its bytes.
void test_oversized_frame(void **) {
  Server s = start_server("tcp");
  const int sock = tcp_connect(port_of(s.address));
  assert_true(sock >= 0);
  guard_io(sock, 10);
  // ZMTP 3.0 greeting, NULL mechanism (loopback without CURVE).
  unsigned char greeting[64] = {0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3, 0, 'N', 'U', 'L', 'L'};
  assert_int_equal(send(sock, greeting, sizeof greeting, MSG_NOSIGNAL), 64);
  unsigned char theirs[64];
  assert_int_equal(recv(sock, theirs, sizeof theirs, MSG_WAITALL), 64);
  // A command frame that declares 64 MiB; then up to 32 MiB of it.
  const uint64_t declared = 64ull << 20, limit = 32ull << 20;
  unsigned char hdr[9] = {0x06};
  for (int i = 0; i < 8; ++i) hdr[1 + i] = uint8_t(declared >> (56 - 8 * i));
  assert_int_equal(send(sock, hdr, sizeof hdr, MSG_NOSIGNAL), 9);
  std::vector<char> chunk(64 * 1024, 0);
  uint64_t sent = 0;
  while (sent < limit) {
    const ssize_t k = send(sock, chunk.data(), chunk.size(), MSG_NOSIGNAL);
    if (k <= 0) break;
    sent += uint64_t(k);
  }
  close(sock);
  print_message("the server took %llu of %llu bytes of an oversized frame\n", (unsigned long long)sent,
                (unsigned long long)limit);
  assert_true(sent < limit);
  honest_round_trips(s.address, 10);
  assert_status(CHI_OK, chi_finalize(s.rt));
}

// C1: idle connections that never finish their handshake or say hello are
// closed (at once beyond max_clients + 64 in all, the rest when their
// handshake or hello is overdue), and an honest client still gets in.
void idle_connections(const std::string &transport) {
  Server s = start_server(transport, "workers: 2\nserver:\n  max_clients: 4\n");
  std::vector<int> socks;
  for (int i = 0; i < 100; ++i) {
    const int k = transport == "tcp" ? tcp_connect(port_of(s.address)) : unix_connect(s.address.substr(6));
    assert_true(k >= 0);
    socks.push_back(k);
  }
  const int closed = count_closed(socks, 36, 20000);
  print_message("%s: the server closed %d of 100 idle connections\n", transport.c_str(), closed);
  assert_true(closed >= 36);
  honest_round_trips(s.address, 10);
  close_all(socks);
  assert_status(CHI_OK, chi_finalize(s.rt));
}
void test_idle_connections_tcp(void **) { idle_connections("tcp"); }

// The caps do not cut honest clients that connect together (a job's ranks):
// more of them than may be without a hello at once.
void connection_burst(const std::string &transport) {
  Server s = start_server(transport);
  const int n = int(chi_test_scaled(80));
  std::atomic<int> ready{0}, ok{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&] {
      ready.fetch_add(1);
      while (ready.load() < n) usleep(100);
      chi_runtime_t *c = nullptr;
      if (try_client(s.address, &c) == CHI_OK) {
        ok.fetch_add(1);
        chi_finalize(c);
      } else {
        fprintf(stderr, "burst client: %s\n", chi_last_error_message());
      }
    });
  for (auto &t : threads) t.join();
  print_message("%d of %d clients connecting together got in\n", ok.load(), n);
  assert_int_equal(ok.load(), n);
  assert_status(CHI_OK, chi_finalize(s.rt));
}
void test_connection_burst_tcp(void **) { connection_burst("tcp"); }
void test_connection_burst_shm(void **) { connection_burst("shm"); }
void test_idle_connections_ipc(void **) { idle_connections("ipc"); }

// The process's resident set, KiB (VmRSS).
long rss_kib() {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long kib = -1;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, "VmRSS:", 6) == 0) kib = atol(line + 6);
  fclose(f);
  return kib;
}

std::string write_private(const std::string &name, const std::string &text, mode_t mode) {
  const std::string path = g_dir + "/" + name;
  unlink(path.c_str());
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, text.data(), text.size()), ssize_t(text.size()));
  close(fd);
  return path;
}

// C1 with CURVE: under three oversized frames and a flood of silent
// connections on its tcp:// address, a server that serves shm and tcp with
// CURVE keeps serving the shm and CURVE clients it admitted, admits new ones
// once the flood's connections are cut, and its resident set grows by less
// than the documented bound ((max_clients + 64) parts of about 132 KiB,
// docs/server.md "Threat model") plus a margin for the clients themselves.
// (A client that connects while the flood is beyond the cap may be the one
// cut: the caps bound a flood, they do not keep it out.)
void test_attacks_on_curve_server(void **) {
  char spub[41], ssec[41], cpub[41], csec[41];
  assert_int_equal(zmq_curve_keypair(spub, ssec), 0);
  assert_int_equal(zmq_curve_keypair(cpub, csec), 0);
  const std::string skey = write_private("curve-server.key", std::string(ssec) + "\n", 0600);
  const std::string allowed = write_private("curve-allowed", std::string(cpub) + "\n", 0644);
  const std::string ckey = write_private("curve-client.key", std::string(csec) + "\n", 0600);
  const int max_clients = 4;
  const std::string yaml = "workers: 2\nserver:\n  max_clients: " + std::to_string(max_clients) +
                           "\n  curve_key_file: " + skey + "\n  curve_allowed_keys_file: " + allowed + "\n";
  Server tcp = start_server("tcp", yaml.c_str());
  const std::string shm = "shm://sec-curve-" + std::to_string(getpid());
  chi_server_t *shm_srv = nullptr;
  assert_status(CHI_OK, chi_server_start(tcp.rt, shm.c_str(), &shm_srv));
  const std::string client_yaml = "mode: client\nserver_address: " + tcp.address + "\ncurve_server_key: \"" +
                                  spub + "\"\ncurve_key_file: " + ckey + "\n";
  auto connect_curve = [&] {
    chi_config_t cfg;
    chi_config_init(&cfg);
    cfg.settings = client_yaml.c_str();
    chi_runtime_t *c = nullptr;
    assert_status(CHI_OK, chi_init(&cfg, &c));
    return c;
  };
  auto sums = [](chi_runtime_t *c, int n) {
    for (int i = 0; i < n; ++i) {
      uint64_t in[2] = {uint64_t(i), 2}, out = 0;
      chi_future_t f;
      size_t got = 0;
      assert_status(CHI_OK, chi_submit(c, CHI_ROUTE_CPU, CHI_METHOD_ADD, in, sizeof in, &f));
      assert_status(CHI_OK, chi_wait(c, f, 10000000000ll, &out, sizeof out, &got));
      assert_int_equal(out, uint64_t(i) + 2);
    }
  };
  chi_runtime_t *curve = connect_curve(), *local = nullptr;
  assert_status(CHI_OK, try_client(shm, &local));
  sums(curve, 5);
  sums(local, 5);
  const long rss0 = rss_kib();
  // Three peers that greet with CURVE and declare a 64 MiB command frame.
  uint64_t took = 0;
  for (int k = 0; k < 3; ++k) {
    const int sock = tcp_connect(port_of(tcp.address));
    assert_true(sock >= 0);
    guard_io(sock, 10);
    unsigned char greeting[64] = {0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3, 0, 'C', 'U', 'R', 'V', 'E'};
    if (send(sock, greeting, sizeof greeting, MSG_NOSIGNAL) == 64) {
      unsigned char theirs[64];
      (void)recv(sock, theirs, sizeof theirs, MSG_WAITALL);
      const uint64_t declared = 64ull << 20;
      unsigned char hdr[9] = {0x06};
      for (int i = 0; i < 8; ++i) hdr[1 + i] = uint8_t(declared >> (56 - 8 * i));
      std::vector<char> chunk(64 * 1024, 0);
      if (send(sock, hdr, sizeof hdr, MSG_NOSIGNAL) == 9)
        for (uint64_t sent = 0; sent < (32ull << 20);) {
          const ssize_t n = send(sock, chunk.data(), chunk.size(), MSG_NOSIGNAL);
          if (n <= 0) break;
          sent += uint64_t(n);
          took += uint64_t(n);
        }
    }
    close(sock);
  }
  // A flood of silent connections, held open while honest clients come.
  std::vector<int> socks;
  for (int i = 0; i < 300; ++i) {
    const int k = tcp_connect(port_of(tcp.address));
    if (k >= 0) socks.push_back(k);
  }
  // The clients admitted before keep being served, a new shm client gets in.
  sums(curve, 10);
  sums(local, 10);
  honest_round_trips(shm, 5);
  const long rss1 = rss_kib();
  // Once the flood beyond the cap is cut, a new CURVE client gets in too.
  const int cut = count_closed(socks, int(socks.size()) - (max_clients + 64), 30000);
  assert_true(cut >= int(socks.size()) - (max_clients + 64));
  close_all(socks);
  chi_runtime_t *later = connect_curve();
  sums(later, 5);
  assert_status(CHI_OK, chi_finalize(later));
  assert_status(CHI_OK, chi_finalize(curve));
  assert_status(CHI_OK, chi_finalize(local));
  const long bound_kib = long(max_clients + 64) * 132 + 32 * 1024;
  print_message("oversized frames: %llu bytes taken of 96 MiB; 300 silent connections; RSS %ld -> %ld KiB "
                "(bound %ld KiB of growth); %d of them cut\n",
                (unsigned long long)took, rss0, rss1, bound_kib, cut);
  assert_true(took < (96ull << 20));
  assert_true(rss0 > 0 && rss1 - rss0 < bound_kib);
  assert_status(CHI_OK, chi_server_stop(shm_srv, UINT32_MAX));
  assert_status(CHI_OK, chi_finalize(tcp.rt));
}

// S3: a peer that takes a gone client's routing id (a peer may choose its
// own) gets none of that client's results, nor its session.
void test_routing_id_reuse(void **) {
  Server s = start_server("ipc");
  chi_method_t sleep_method;
  assert_status(CHI_OK, chi_register_handler(s.rt, "test.sleep", sleep_handler, nullptr, &sleep_method));
  void *ctx = zmq_ctx_new();
  chi::ipc::Hello hello{chi::ipc::kProtocolVersion, chi_version(), chi::ipc::kSessionTasks, 0};
  void *a = raw_dealer(ctx, s.address, "same-id");
  raw_frame(a, chi::ipc::Kind::kHello, 1, 0, &hello, sizeof hello);
  int32_t st = -1;
  assert_int_equal(raw_count(a, chi::ipc::Kind::kWelcome, 1000, &st), 1);
  assert_int_equal(st, CHI_OK);
  const int before = g_sleeps_started.load();
  const uint64_t us = 400000;
  raw_frame(a, chi::ipc::Kind::kSubmit, 7, sleep_method, &us, sizeof us);
  for (int i = 0; i < 2000 && g_sleeps_started.load() == before; ++i) usleep(1000);
  assert_int_equal(g_sleeps_started.load(), before + 1);  // running: cannot be cancelled
  zmq_close(a);
  usleep(50000);  // the server sees A go (its result is still to come)
  void *b = raw_dealer(ctx, s.address, "same-id");
  raw_frame(b, chi::ipc::Kind::kHello, 1, 0, &hello, sizeof hello);
  // Past the end of A's task: B must see its welcome and none of A's results.
  const int results = raw_count(b, chi::ipc::Kind::kResult, 1500);
  print_message("results of the gone client delivered to the new holder of its routing id: %d\n", results);
  assert_int_equal(results, 0);
  zmq_close(b);
  zmq_ctx_term(ctx);
  assert_status(CHI_OK, chi_finalize(s.rt));
}

// C2: libzmq reads tcp://SRC;DST as "bind DST": such an address must not pass
// as loopback (nor as an address at all).
void test_source_address_form(void **) {
  chi_runtime_t *rt = chi_test_init(1, nullptr);
  const std::string port = std::to_string(next_port());
  for (const std::string &a : {"tcp://127.0.0.1:0;0.0.0.0:" + port, "tcp://127.0.0.1:1;*:" + port,
                               "tcp://127.0.0.1;0.0.0.0:" + port, "tcp://127.evil:" + port,
                               "tcp://127.0.0.1:" + port + ";x"}) {
    chi_server_t *srv = nullptr;
    const chi_status_t st = chi_server_start(rt, a.c_str(), &srv);
    print_message("%s -> %s: %s\n", a.c_str(), chi_status_string(st), chi_last_error_message());
    assert_true(st != CHI_OK);
    assert_has_message();
  }
  // The config file's listen list is checked the same way.
  chi_config_t cfg;
  chi_config_init(&cfg);
  char path[512];
  const std::string yaml = "server:\n  listen: [\"tcp://127.0.0.1:0;0.0.0.0:" + port + "\"]\n";
  chi_test_write_yaml(yaml.c_str(), path, sizeof path);
  cfg.config_path = path;
  chi_runtime_t *bad = nullptr;
  assert_status(CHI_ERR_CONFIG, chi_init(&cfg, &bad));
  unlink(path);
  // Plain loopback forms still serve.
  chi_server_t *srv = nullptr;
  assert_status(CHI_OK, chi_server_start(rt, ("tcp://127.0.0.1:" + port).c_str(), &srv));
  assert_status(CHI_OK, chi_finalize(rt));
}

// C5: a status reply larger than 64 KiB is copied whole, not read past a
// 64 KiB buffer (a fake server answers 200,000 bytes of 'A').
void test_query_reply_size(void **) {
  FakeServer fs;
  fs.address = "ipc://" + g_dir + "/fake-query.ipc";
  fs.control_reply = 200000;
  fs.thread = std::thread(fake_server_main, &fs, false);
  while (!fs.ready.load()) usleep(1000);
  std::vector<char> reply(1 << 20, 'x');
  size_t n = 0;
  const chi_status_t st = chi_server_query(fs.address.c_str(), "status", reply.data(), reply.size(), &n);
  fs.quit.store(true);
  fs.thread.join();
  assert_status(CHI_OK, st);
  assert_int_equal(n, 200000);
  assert_int_equal(strspn(reply.data(), "A"), 200000);
  // A small buffer: truncated, said so, nothing beyond it written.
  fs.quit.store(false);
  fs.ready.store(false);
  fs.thread = std::thread(fake_server_main, &fs, false);
  while (!fs.ready.load()) usleep(1000);
  std::vector<char> small(100, 'x');
  assert_status(CHI_ERR_TOO_LARGE, chi_server_query(fs.address.c_str(), "status", small.data(), 64, &n));
  fs.quit.store(true);
  fs.thread.join();
  assert_int_equal(strlen(small.data()), 63);
  assert_int_equal(small[64], 'x');
}

// C5: status has one bound on every transport: with more clients than fit in
// 64 KiB (1000 ZeroMQ task sessions), the reply says how many it left out
// instead of growing past what a shm reply holds (or being cut mid-JSON).
void test_status_bound(void **) {
  rlimit rl;
  assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
  if (rl.rlim_max < 4096) {
    print_message("RLIMIT_NOFILE hard limit %llu: too low for 1000 sessions in one process\n",
                  (unsigned long long)rl.rlim_max);
    return skip();
  }
  const rlim_t old_soft = rl.rlim_cur;
  rl.rlim_cur = rl.rlim_max;
  assert_int_equal(setrlimit(RLIMIT_NOFILE, &rl), 0);
  // Every hello gets a minute: on a loaded machine (a sanitizer build beside
  // other tests) the server may reach the last of 1000 hellos after the
  // default second, and close those connections as it should.
  Server s = start_server("ipc", "workers: 2\nserver:\n  hello_timeout_ms: 60000\n");
  void *ctx = zmq_ctx_new();
  const int n = 1000;
  std::vector<void *> dealers;
  chi::ipc::Hello hello{chi::ipc::kProtocolVersion, chi_version(), chi::ipc::kSessionTasks, 0};
  chi::ipc::Frame f;
  f.kind = chi::ipc::Kind::kHello;
  f.id = 1;
  f.payload = reinterpret_cast<const uint8_t *>(&hello);
  f.size = sizeof hello;
  std::string frame;
  chi::ipc::encode_frame(f, &frame);
  for (int i = 0; i < n; ++i) {
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    const int linger = 0;
    zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof linger);
    assert_int_equal(zmq_connect(d, s.address.c_str()), 0);
    assert_true(zmq_send(d, frame.data(), frame.size(), 0) >= 0);
    dealers.push_back(d);
  }
  int welcomed = 0;
  for (void *d : dealers) {
    zmq_pollitem_t item{d, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, 20000) != 1) break;  // hang guard
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, d, 0) >= 0) ++welcomed;
    zmq_msg_close(&m);
  }
  assert_int_equal(welcomed, n);
  std::vector<char> reply(1 << 20, 0);
  size_t size = 0;
  assert_status(CHI_OK, chi_server_query(s.address.c_str(), "status-json", reply.data(), reply.size(), &size));
  print_message("status-json with %d clients: %zu bytes\n", n, size);
  assert_true(size <= chi::ipc::kMaxMsgPayload);
  assert_non_null(strstr(reply.data(), "\"clients_omitted\":"));
  assert_null(strstr(reply.data(), "\"clients_omitted\":0,"));
  assert_string_equal(reply.data() + size - 2, "}\n");
  assert_status(CHI_OK, chi_server_query(s.address.c_str(), "status", reply.data(), reply.size(), &size));
  assert_true(size <= chi::ipc::kMaxMsgPayload);
  assert_non_null(strstr(reply.data(), "more client(s)"));
  for (void *d : dealers) zmq_close(d);
  zmq_ctx_term(ctx);
  assert_status(CHI_OK, chi_finalize(s.rt));
  rl.rlim_cur = old_soft;
  setrlimit(RLIMIT_NOFILE, &rl);
}

// C10: keygen never writes through a symlink or into a file that exists.
void test_keygen_symlink(void **) {
  const std::string victim = g_dir + "/precious.txt", prefix = g_dir + "/jobkey";
  FILE *f = fopen(victim.c_str(), "w");
  assert_non_null(f);
  fputs("important victim data\n", f);
  fclose(f);
  assert_int_equal(symlink(victim.c_str(), (prefix + ".pub").c_str()), 0);
  auto keygen = [&](const std::string &p) {
    const pid_t pid = chi_test_spawn({CHI_CTL_PATH, "keygen", p}, (g_dir + "/keygen.log").c_str());
    assert_true(pid > 0);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  };
  assert_true(keygen(prefix) != 0);
  char buf[256] = {0};
  f = fopen(victim.c_str(), "r");
  assert_non_null(f);
  assert_true(fgets(buf, sizeof buf, f) != nullptr);
  fclose(f);
  assert_string_equal(buf, "important victim data\n");
  struct stat st;
  assert_int_equal(stat((prefix + ".key").c_str(), &st), -1);  // no half-made pair left behind
  // An existing regular PREFIX.pub (another user's, say) is not reused either.
  const std::string other = g_dir + "/other";
  f = fopen((other + ".pub").c_str(), "w");
  fclose(f);
  assert_true(keygen(other) != 0);
  // A fresh prefix works: both files, the secret one 0600.
  const std::string fresh = g_dir + "/fresh";
  assert_int_equal(keygen(fresh), 0);
  assert_int_equal(stat((fresh + ".key").c_str(), &st), 0);
  assert_int_equal(st.st_mode & 0777, 0600);
  assert_int_equal(lstat((fresh + ".pub").c_str(), &st), 0);
  assert_true(S_ISREG(st.st_mode));
}

// C6: a client that makes its doorbell blocking and rings it must not stall
// the poller that serves it (one poller: every client shares it).
void test_doorbell_made_blocking(void **) {
  Server s = start_server("shm", "workers: 2\nserver:\n  pollers: 1\n");
  const int sock = unix_connect(shm_socket_path(s.address));
  assert_true(sock >= 0);
  int fds[2] = {-1, -1};
  assert_int_equal(raw_hello(sock, chi::ipc::kSessionTasks, fds), CHI_OK);
  assert_true(fds[1] >= 0);
  const int flags = fcntl(fds[1], F_GETFL);
  assert_int_equal(fcntl(fds[1], F_SETFL, flags & ~O_NONBLOCK), 0);
  for (int i = 0; i < 3; ++i) {
    uint64_t one = 1;
    assert_int_equal(write(fds[1], &one, sizeof one), sizeof one);
    usleep(20000);
  }
  honest_round_trips(s.address, 20);
  close(fds[0]);
  close(fds[1]);
  close(sock);
  assert_status(CHI_OK, chi_finalize(s.rt));  // and the stop does not hang
}

// C7: control sessions and connections without a hello count against a
// bound derived from server.max_clients.
void test_connection_cap_shm(void **) {
  Server s = start_server("shm", "workers: 2\nserver:\n  max_clients: 4\n");
  std::vector<int> socks;
  int admitted = 0, refused = 0;
  for (int i = 0; i < 100; ++i) {
    const int k = unix_connect(shm_socket_path(s.address));
    if (k < 0) {
      ++refused;
      continue;
    }
    socks.push_back(k);
    (raw_hello(k, chi::ipc::kSessionControl) == CHI_OK ? admitted : refused)++;
  }
  print_message("100 control sessions: %d admitted, %d refused\n", admitted, refused);
  assert_true(admitted <= 4 + 64);
  assert_true(refused >= 100 - (4 + 64));
  close_all(socks);
  // The server sees the closed sessions as its control thread gets to them:
  // a client may be refused (AGAIN) until then, never anything else.
  chi_runtime_t *c = nullptr;
  chi_status_t st = CHI_ERR_AGAIN;
  for (int i = 0; i < 1000 && st == CHI_ERR_AGAIN; ++i)
    if ((st = try_client(s.address, &c)) == CHI_ERR_AGAIN) usleep(10000);
  assert_status(CHI_OK, st);
  assert_status(CHI_OK, chi_finalize(c));
  honest_round_trips(s.address, 10);
  assert_status(CHI_OK, chi_finalize(s.rt));
}

// C8: half-sent hellos and half-sent control requests stall no one.
void test_slow_senders(void **) {
  Server s = start_server("shm");
  std::vector<int> socks;
  for (int i = 0; i < 40; ++i) {
    const int k = unix_connect(shm_socket_path(s.address));
    assert_true(k >= 0);
    assert_int_equal(send(k, "C", 1, MSG_NOSIGNAL), 1);  // the first byte of a header
    socks.push_back(k);
  }
  for (int i = 0; i < 40; ++i) {
    const int k = unix_connect(shm_socket_path(s.address));
    assert_true(k >= 0);
    assert_int_equal(raw_hello(k, chi::ipc::kSessionControl), CHI_OK);
    assert_int_equal(send(k, "C", 1, MSG_NOSIGNAL), 1);
    socks.push_back(k);
  }
  // 80 stalls of 100 ms would outlast the client's 5 s handshake.
  honest_round_trips(s.address, 10);
  // The control sessions still work once their request is whole.
  for (size_t i = 40; i < socks.size(); i += 13) {
    chi::ipc::MsgHeader h{chi::ipc::kMsgMagic, uint16_t(chi::ipc::Kind::kControl), uint16_t(chi::ipc::Op::kPing),
                          0, 0, 0};
    assert_int_equal(send(socks[i], reinterpret_cast<char *>(&h) + 1, sizeof h - 1, MSG_NOSIGNAL), sizeof h - 1);
    chi::ipc::MsgHeader r;
    std::string body;
    assert_true(raw_recv(socks[i], &r, &body));
    assert_int_equal(r.status, CHI_OK);
  }
  close_all(socks);
  assert_status(CHI_OK, chi_finalize(s.rt));
}

// Lines of `path` that contain `what`.
int count_lines(const std::string &path, const char *what) {
  FILE *f = fopen(path.c_str(), "r");
  if (!f) return -1;
  char line[1024];
  int n = 0;
  while (fgets(line, sizeof line, f))
    if (strstr(line, what)) ++n;
  fclose(f);
  return n;
}

// C1/C7: a server out of descriptors pauses accepting (no busy loop, no log
// flood) and serves again once they free.  The server runs in a child with
// RLIMIT_NOFILE lowered to 48.
void test_descriptor_exhaustion(void **) {
  const std::string address = "shm://sec-fds-" + std::to_string(getpid());
  const std::string log = g_dir + "/fds.log";
  const pid_t child = spawn_child({g_self, "child-server", address, "48"}, log);
  for (int i = 0; i < 2000 && chi_server_query(address.c_str(), "ping", nullptr, 0, nullptr) != CHI_OK; ++i)
    usleep(10000);
  assert_status(CHI_OK, chi_server_query(address.c_str(), "ping", nullptr, 0, nullptr));
  std::vector<int> socks;
  for (int i = 0; i < 100; ++i) {
    const int k = unix_connect(shm_socket_path(address));
    if (k >= 0) socks.push_back(k);
  }
  // The window in which a busy loop would log (tens of thousands of lines).
  usleep(500000);
  const int lines = count_lines(log, "accept");
  print_message("%d accept lines in the log while out of descriptors\n", lines);
  assert_true(lines >= 0 && lines < 50);
  close_all(socks);
  // The held connections are gone: clients are served again.
  int ok = 0;
  for (int i = 0; i < 500 && !ok; ++i) {
    ok = chi_server_query(address.c_str(), "ping", nullptr, 0, nullptr) == CHI_OK;
    if (!ok) usleep(10000);
  }
  assert_true(ok);
  honest_round_trips(address, 10);
  kill(child, SIGTERM);
  int status = 0;
  assert_int_equal(waitpid(child, &status, 0), child);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

// CPU ticks (user + system) a process has used so far.
long cpu_ticks(pid_t pid) {
  FILE *f = fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (!f) return -1;
  char buf[2048];
  const size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *p = strrchr(buf, ')');
  long utime = 0, stime = 0;
  if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %ld %ld", &utime, &stime) != 2) return -1;
  return utime + stime;
}

// C1: the same over tcp://: libzmq retries a failed accept at once, so the
// listener unbinds for a while, and listens again once descriptors free.
void test_descriptor_exhaustion_tcp(void **) {
  const std::string address = "tcp://127.0.0.1:" + std::to_string(next_port());
  const std::string log = g_dir + "/fds-tcp.log";
  const pid_t child = spawn_child({g_self, "child-server", address, "64"}, log);
  for (int i = 0; i < 2000 && chi_server_query(address.c_str(), "ping", nullptr, 0, nullptr) != CHI_OK; ++i)
    usleep(10000);
  assert_status(CHI_OK, chi_server_query(address.c_str(), "ping", nullptr, 0, nullptr));
  std::vector<int> socks;
  for (int i = 0; i < 100; ++i) {
    const int k = tcp_connect(port_of(address));
    if (k >= 0) socks.push_back(k);
  }
  const long before = cpu_ticks(child);
  usleep(500000);
  print_message("server CPU ticks over the window out of descriptors: %ld\n", cpu_ticks(child) - before);
  const int paused = count_lines(log, "not accepting"), lines = count_lines(log, "accept");
  print_message("%d pause line(s), %d accept line(s) in the log\n", paused, lines);
  assert_true(paused >= 1);
  assert_true(lines < 50);
  close_all(socks);
  int ok = 0;
  for (int i = 0; i < 500 && !ok; ++i) {
    ok = chi_server_query(address.c_str(), "ping", nullptr, 0, nullptr) == CHI_OK;
    if (!ok) usleep(10000);
  }
  assert_true(ok);
  honest_round_trips(address, 10);
  kill(child, SIGTERM);
  int status = 0;
  assert_int_equal(waitpid(child, &status, 0), child);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

// C4: a tcp:// listener without CURVE says at start that any local user can
// connect.
void test_loopback_warning(void **) {
  const std::string address = "tcp://127.0.0.1:" + std::to_string(next_port());
  const std::string log = g_dir + "/tcp-warn.log";
  const pid_t child = spawn_child({g_self, "child-server", address, "0"}, log);
  for (int i = 0; i < 2000 && chi_server_query(address.c_str(), "ping", nullptr, 0, nullptr) != CHI_OK; ++i)
    usleep(10000);
  kill(child, SIGTERM);
  int status = 0;
  assert_int_equal(waitpid(child, &status, 0), child);
  assert_true(count_lines(log, "any local user") >= 1);
}

/* ------------------------------------------------- root only: other uids */

uid_t g_other_uid = 0;

bool become(uid_t uid) { return setgroups(0, nullptr) == 0 && setgid(uid) == 0 && setuid(uid) == 0; }

// A peer at the address that takes the connection and never answers the
// hello: chi_init gives up after connect_timeout_ms with CHI_ERR_DISCONNECTED
// and a message naming the setting, on shm:// (a socket nobody accepts on)
// and ipc:// (a ZeroMQ socket nobody reads).
void test_connect_timeout(void **) {
  const std::string name = "mute-" + std::to_string(getpid());
  const std::string path = g_dir + "/" + name + ".sock";
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(fd >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  assert_int_equal(bind(fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr), 0);
  assert_int_equal(listen(fd, 8), 0);
  void *ctx = zmq_ctx_new();
  void *router = zmq_socket(ctx, ZMQ_ROUTER);
  const int linger = 0;
  zmq_setsockopt(router, ZMQ_LINGER, &linger, sizeof linger);
  const std::string ipc = "ipc://" + g_dir + "/" + name + ".ipc";
  assert_int_equal(zmq_bind(router, ipc.c_str()), 0);
  for (const std::string &address : {"shm://" + name, ipc}) {
    const std::string yaml = "mode: client\nserver_address: " + address + "\nconnect_timeout_ms: 200\n";
    char file[512];
    chi_test_write_yaml(yaml.c_str(), file, sizeof file);
    chi_config_t cfg;
    chi_config_init(&cfg);
    cfg.config_path = file;
    chi_runtime_t *c = nullptr;
    const chi_status_t st = chi_init(&cfg, &c);
    unlink(file);
    print_message("%s: %s: %s\n", address.c_str(), chi_status_string(st), chi_last_error_message());
    assert_status(CHI_ERR_DISCONNECTED, st);
    assert_null(c);
    assert_non_null(strstr(chi_last_error_message(), "within 200 ms (connect_timeout_ms)"));
  }
  zmq_close(router);
  zmq_ctx_term(ctx);
  close(fd);
  unlink(path.c_str());
}

// C3: another user's fake server on an ipc:// path the victim uses is refused
// by the client, with a message naming the uid.
void test_squatted_ipc(void **) {
  char tmpl[] = "/tmp/chi-sec-shared-XXXXXX";
  assert_non_null(mkdtemp(tmpl));
  assert_int_equal(chmod(tmpl, 01777), 0);
  const std::string address = std::string("ipc://") + tmpl + "/shared.ipc";
  const pid_t child = spawn_child({g_self, "child-fake", address, std::to_string(g_other_uid)}, g_dir + "/fake.log");
  struct stat st;
  for (int i = 0; i < 2000 && stat(address.c_str() + 6, &st) != 0; ++i) usleep(10000);
  assert_int_equal(stat(address.c_str() + 6, &st), 0);
  assert_int_equal(st.st_uid, g_other_uid);
  usleep(100000);  // bound and listening (the file comes first)
  chi_runtime_t *c = nullptr;
  const chi_status_t s = try_client(address, &c);
  print_message("client of a foreign server: %s: %s\n", chi_status_string(s), chi_last_error_message());
  if (c) chi_finalize(c);
  size_t n = 0;
  const chi_status_t q = chi_server_query(address.c_str(), "ping", nullptr, 0, &n);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  std::string rm = std::string("rm -rf ") + tmpl;
  assert_int_equal(system(rm.c_str()), 0);
  assert_status(CHI_ERR_PERMISSION, s);
  assert_non_null(strstr(chi_last_error_message(), "uid"));
  assert_status(CHI_ERR_PERMISSION, q);
}

// C9: /tmp/chimaera-UID made first by another user does not stop the
// victim's default server: it falls back to a private folder in its home.
void test_squatted_runtime_dir(void **) {
  const uid_t victim = g_other_uid + 1;
  const std::string squat = "/tmp/chimaera-" + std::to_string(victim);
  const std::string home = g_dir + "/home-" + std::to_string(victim);
  if (system(("rm -rf " + squat).c_str()) != 0) fail();
  assert_int_equal(mkdir(squat.c_str(), 0777), 0);
  assert_int_equal(chown(squat.c_str(), g_other_uid, g_other_uid), 0);
  assert_int_equal(mkdir(home.c_str(), 0700), 0);
  assert_int_equal(chown(home.c_str(), victim, victim), 0);
  chmod(g_dir.c_str(), 0711);  // the victim reaches its home through it
  const pid_t child = chi_test_spawn({g_self, "child-victim", std::to_string(victim), home},
                                     (g_dir + "/victim.log").c_str());
  assert_true(child > 0);
  int status = 0;
  assert_int_equal(waitpid(child, &status, 0), child);
  chmod(g_dir.c_str(), 0700);
  assert_int_equal(system(("rm -rf " + squat).c_str()), 0);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
}

/* ------------------------------------------------------------- children */

int child_server(const char *address, int nofile) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  if (nofile > 0) {
    rlimit rl{rlim_t(nofile), rlim_t(nofile)};
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) return 2;
  }
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.gpus = 0;
  cfg.num_workers = 2;
  chi_runtime_t *rt;
  if (chi_init(&cfg, &rt) != CHI_OK) return 1;
  chi_server_t *srv;
  if (chi_server_start(rt, address, &srv) != CHI_OK) {
    fprintf(stderr, "child server: %s\n", chi_last_error_message());
    return 1;
  }
  int sig;
  sigwait(&set, &sig);
  return chi_finalize(rt) == CHI_OK ? 0 : 1;
}

int child_fake(const char *address, uid_t uid) {
  if (!become(uid)) return 2;
  umask(0);
  FakeServer fs;
  fs.address = address;
  fake_server_main(&fs, true);
  return 0;
}

int child_victim(uid_t uid, const char *home) {
  if (!become(uid)) return 2;
  unsetenv("CHI_RUNTIME_DIR");
  unsetenv("XDG_RUNTIME_DIR");
  setenv("HOME", home, 1);
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.gpus = 0;
  cfg.num_workers = 1;
  chi_runtime_t *rt;
  if (chi_init(&cfg, &rt) != CHI_OK) return 1;
  chi_server_t *srv;
  if (chi_server_start(rt, "shm://default", &srv) != CHI_OK) {
    fprintf(stderr, "victim's server: %s\n", chi_last_error_message());
    return 1;
  }
  // Its own client finds it (same fallback).
  const chi_status_t q = chi_server_query(nullptr, "ping", nullptr, 0, nullptr);
  if (q != CHI_OK) fprintf(stderr, "victim's ping: %s\n", chi_last_error_message());
  return chi_finalize(rt) == CHI_OK && q == CHI_OK ? 0 : 1;
}

}  // namespace

int main(int argc, char **argv) {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return 1;
  self[n] = 0;
  g_self = self;
  if (argc >= 4 && !strcmp(argv[1], "child-server")) return child_server(argv[2], atoi(argv[3]));
  if (argc >= 4 && !strcmp(argv[1], "child-fake")) return child_fake(argv[2], uid_t(atol(argv[3])));
  if (argc >= 4 && !strcmp(argv[1], "child-victim")) return child_victim(uid_t(atol(argv[2])), argv[3]);
  const bool squat = argc >= 2 && !strcmp(argv[1], "squat");
  if (squat && geteuid() != 0) {
    fprintf(stderr, "test_security squat: needs root (it runs children as other uids); skipped\n");
    return 77;
  }
  chi_test_clean_env();
  signal(SIGPIPE, SIG_IGN);
  char tmpl[] = "/tmp/chi-security-test-XXXXXX";
  if (!mkdtemp(tmpl)) return 1;
  g_dir = tmpl;
  setenv("CHI_RUNTIME_DIR", tmpl, 1);
  // Uids with no account: numbers no one on this host uses.
  g_other_uid = uid_t(61000 + (getpid() % 1000) * 2);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_oversized_frame),
      cmocka_unit_test(test_attacks_on_curve_server),
      cmocka_unit_test(test_idle_connections_tcp),
      cmocka_unit_test(test_idle_connections_ipc),
      cmocka_unit_test(test_connection_burst_tcp),
      cmocka_unit_test(test_connection_burst_shm),
      cmocka_unit_test(test_routing_id_reuse),
      cmocka_unit_test(test_source_address_form),
      cmocka_unit_test(test_query_reply_size),
      cmocka_unit_test(test_status_bound),
      cmocka_unit_test(test_connect_timeout),
      cmocka_unit_test(test_keygen_symlink),
      cmocka_unit_test(test_doorbell_made_blocking),
      cmocka_unit_test(test_connection_cap_shm),
      cmocka_unit_test(test_slow_senders),
      cmocka_unit_test(test_descriptor_exhaustion),
      cmocka_unit_test(test_descriptor_exhaustion_tcp),
      cmocka_unit_test(test_loopback_warning),
  };
  const struct CMUnitTest root_tests[] = {
      cmocka_unit_test(test_squatted_ipc),
      cmocka_unit_test(test_squatted_runtime_dir),
  };
  if (getenv("CHI_TEST_FILTER")) cmocka_set_test_filter(getenv("CHI_TEST_FILTER"));
  const int rc = squat ? cmocka_run_group_tests_name("security (other uids)", root_tests, nullptr, nullptr)
                       : cmocka_run_group_tests_name("security", tests, nullptr, nullptr);
  for (pid_t p : g_children) kill(p, SIGKILL);
  std::string cleanup = "rm -rf " + g_dir;
  if (system(cleanup.c_str()) != 0) return rc ? rc : 1;
  return rc;
}

/*
 * chimaera-server and client mode over shared memory: round trips from many
 * threads, one server per address, stale endpoints, version skew, client
 * SIGKILL loops, server death and graceful stop, and garbage written into
 * a session's segment by a hostile client.  Servers run in this process
 * (chi_server_start) or in a child that re-executes this program
 * ("child-server NAME"), so that a test can kill them.
 */
// C++ headers first: cmocka's macros would break them.
#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <zmq.h>

#include "core/executor.h"
#include "ipc/frame.h"
#include "ipc/ring.h"
#include "ipc/segment.h"
#include "ipc/wire.h"

extern "C" {
#include "common.h"
#include "spawn.h"
}

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>

namespace {

// Sanitizers' shadow memory grows with use: RSS says nothing about leaks there
// (their own leak checks do).
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

std::string g_self;  // this program, for children
std::string g_dir;   // private runtime directory
// The transport under test ($CHI_TEST_TRANSPORT): shm (default), ipc or tcp.
std::string g_transport = "shm";
bool file_endpoint() { return g_transport != "tcp"; }

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

std::string unique_name(const char *what) {
  static int n = 0;
  std::string name = std::string(what) + "-" + std::to_string(getpid()) + "-" + std::to_string(++n);
  if (g_transport == "ipc") return "ipc://" + g_dir + "/" + name + ".ipc";
  // Ports from the pid, so that parallel test programs do not meet.
  // Below the kernel's ephemeral range (32768..), whose ports other
  // processes' connections take at random.
  if (g_transport == "tcp") return "tcp://127.0.0.1:" + std::to_string(20000 + (getpid() % 300) * 40 + n % 40);
  return "shm://" + name;
}

// The file a server's endpoint lives in ("" for tcp://).
std::string socket_path(const std::string &address) {
  if (address.compare(0, 6, "ipc://") == 0) return address.substr(6);
  if (address.compare(0, 6, "tcp://") == 0) return "";
  return g_dir + "/" + address.substr(6) + ".sock";
}

// Runs of sleep_handler started in this process (servers run in-process).
std::atomic<long> g_sleeps_started{0};

// ... and ended: a result the server owes to a client.
std::atomic<long> g_sleeps_done{0};

// A handler that sleeps for the number of microseconds in its input.
chi_status_t sleep_handler(chi_request_t *req, void *) {
  g_sleeps_started.fetch_add(1);
  uint64_t us = 0;
  if (req->input_size >= sizeof us) memcpy(&us, req->input, sizeof us);
  usleep(useconds_t(us));
  req->output_size = 0;
  g_sleeps_done.fetch_add(1);
  return CHI_OK;
}

struct ServerFixture {
  chi_runtime_t *rt = nullptr;
  chi_server_t *srv = nullptr;
  std::string address;
  chi_method_t sleep_method = 0;
};

ServerFixture start_server(const char *yaml = nullptr) {
  ServerFixture f;
  f.address = unique_name("t");
  f.rt = yaml ? chi_test_init_yaml(2, yaml) : chi_test_init(2, nullptr);
  assert_status(CHI_OK, chi_register_handler(f.rt, "test.sleep", sleep_handler, nullptr, &f.sleep_method));
  // A TCP port can be taken by another program: try the next ones.
  chi_status_t st = chi_server_start(f.rt, f.address.c_str(), &f.srv);
  for (int k = 0; k < 8 && st != CHI_OK && g_transport == "tcp" && strstr(chi_last_error_message(), "in use"); ++k) {
    f.address = unique_name("t");
    st = chi_server_start(f.rt, f.address.c_str(), &f.srv);
  }
  assert_status(CHI_OK, st);
  return f;
}

chi_runtime_t *connect_client(const std::string &address) {
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.mode = CHI_MODE_CLIENT;
  cfg.server_address = address.c_str();
  chi_runtime_t *rt = nullptr;
  assert_status(CHI_OK, chi_init(&cfg, &rt));
  return rt;
}

chi_stats_t stats_of(chi_runtime_t *rt) {
  chi_stats_t st;
  st.struct_size = sizeof st;
  assert_status(CHI_OK, chi_stats(rt, &st));
  return st;
}

// Waits (in steps) until the server has no client and no client task left.
bool settle(chi_runtime_t *server, uint32_t clients) {
  for (int i = 0; i < 3000; ++i) {
    chi_stats_t st = stats_of(server);
    if (st.clients == clients && st.routes[CHI_STATS_CLIENT].in_flight == 0 && st.slots_in_use == 0)
      return true;
    usleep(10000);
  }
  return false;
}

int count_fds() {
  int n = 0;
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  while (readdir(d)) ++n;
  closedir(d);
  return n;
}

long rss_kb() {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long kb = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %ld", &kb) == 1) break;
  fclose(f);
  return kb;
}

pid_t spawn(const std::vector<std::string> &args) {
  const pid_t pid = chi_test_spawn(args);
  assert_true(pid > 0);
  return pid;
}

void await_socket(const std::string &address, pid_t child) {
  struct stat st;
  for (int i = 0; i < 3000 && file_endpoint() && stat(socket_path(address).c_str(), &st) != 0; ++i) {
    int status;
    if (child > 0 && waitpid(child, &status, WNOHANG) == child) fail_msg("the server child exited early");
    usleep(10000);
  }
  // The socket exists before the server listens on it: ping until it answers.
  for (int i = 0; i < 3000; ++i) {
    if (chi_server_query(address.c_str(), "ping", nullptr, 0, nullptr) == CHI_OK) return;
    usleep(10000);
  }
  fail_msg("server %s never answered", address.c_str());
}

uint64_t add(chi_runtime_t *rt, uint64_t a, uint64_t b) {
  uint64_t in[2] = {a, b}, out = 0;
  chi_future_t f;
  size_t n = 0;
  assert_status(CHI_OK, chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ADD, in, sizeof in, &f));
  assert_status(CHI_OK, chi_wait(rt, f, -1, &out, sizeof out, &n));
  assert_int_equal(n, sizeof out);
  return out;
}

// Raw session for a hostile client: the socket and the mapped segment.
struct RawSession {
  int sock = -1;
  int memfd = -1;
  int doorbell = -1;
  chi::ipc::SegmentView seg;
  chi::ipc::Welcome w{};
};

int raw_connect(const std::string &address) {
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::string p = socket_path(address);
  memcpy(a.sun_path, p.c_str(), p.size() + 1);
  assert_int_equal(connect(s, reinterpret_cast<sockaddr *>(&a), sizeof a), 0);
  return s;
}

void raw_send(int s, chi::ipc::Kind kind, const void *payload, uint32_t len) {
  chi::ipc::MsgHeader h{chi::ipc::kMsgMagic, uint16_t(kind), 0, 0, len, 0};
  assert_int_equal(send(s, &h, sizeof h, MSG_NOSIGNAL), sizeof h);
  if (len) assert_int_equal(send(s, payload, len, MSG_NOSIGNAL), len);
}

// Receives one reply header and payload (blocking); returns false on EOF.
bool raw_recv(int s, chi::ipc::MsgHeader *h, std::string *body, int *fds = nullptr) {
  char ctrl[CMSG_SPACE(2 * sizeof(int))];
  iovec iov{h, sizeof *h};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = ctrl;
  m.msg_controllen = sizeof ctrl;
  ssize_t n = recvmsg(s, &m, MSG_WAITALL);
  if (n != ssize_t(sizeof *h)) return false;
  if (fds) {
    cmsghdr *c = CMSG_FIRSTHDR(&m);
    if (c && c->cmsg_type == SCM_RIGHTS) memcpy(fds, CMSG_DATA(c), 2 * sizeof(int));
  }
  body->assign(h->length, '\0');
  return h->length == 0 || recv(s, body->data(), h->length, MSG_WAITALL) == ssize_t(h->length);
}

RawSession raw_session(const std::string &address) {
  RawSession r;
  r.sock = raw_connect(address);
  chi::ipc::Hello hello{chi::ipc::kProtocolVersion, chi_version(), chi::ipc::kSessionTasks, 0};
  raw_send(r.sock, chi::ipc::Kind::kHello, &hello, sizeof hello);
  chi::ipc::MsgHeader h;
  std::string body;
  int fds[2] = {-1, -1};
  assert_true(raw_recv(r.sock, &h, &body, fds));
  assert_int_equal(h.status, CHI_OK);
  memcpy(&r.w, body.data(), sizeof r.w);
  r.memfd = fds[0];
  r.doorbell = fds[1];
  r.seg.layout = chi::ipc::segment_layout(r.w.nslots, r.w.max_payload);
  void *p = mmap(nullptr, r.seg.layout.size, PROT_READ | PROT_WRITE, MAP_SHARED, r.memfd, 0);
  assert_true(p != MAP_FAILED);
  r.seg.base = static_cast<uint8_t *>(p);
  return r;
}

void raw_close(RawSession &r) {
  munmap(r.seg.base, r.seg.layout.size);
  close(r.memfd);
  close(r.doorbell);
  close(r.sock);
}

// Queues slot `slot` as a hostile client would, and rings the doorbell.
void raw_queue(RawSession &r, uint32_t slot_in_cell) {
  chi::ipc::SegmentHeader *h = r.seg.header();
  uint32_t pos = h->tail.fetch_add(1);
  chi::ipc::RingCell &c = r.seg.ring()[pos & (r.w.nslots - 1)];
  c.slot = slot_in_cell;
  c.seq.store(pos + 1, std::memory_order_release);
  uint64_t one = 1;
  ssize_t n = write(r.doorbell, &one, sizeof one);
  (void)n;
}

// Waits until the server answers slot i (generation gen); returns its status.
int32_t raw_result(RawSession &r, uint32_t i, uint32_t gen) {
  for (int k = 0; k < 100000; ++k) {
    uint32_t w = r.seg.slot(i)->state.load(std::memory_order_acquire);
    if (chi::ipc::slot_gen(w) == gen && chi::ipc::slot_state(w) == chi::ipc::kSlotDone)
      return r.seg.slot(i)->status;
    usleep(100);
  }
  fail_msg("no answer for slot %u", i);
  return 0;
}

bool raw_cut_off(RawSession &r) {
  chi::ipc::MsgHeader h;
  std::string body;
  timeval tv{10, 0};
  setsockopt(r.sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return !raw_recv(r.sock, &h, &body);
}

/* ------------------------------------------------------------------ tests */

void test_round_trips_from_threads(void **) {
  ServerFixture f = start_server();
  chi_runtime_t *c = connect_client(f.address);
  const long per_thread = chi_test_scaled(2000);
  std::atomic<long> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (long i = 0; i < per_thread; ++i) {
        uint64_t in[2] = {uint64_t(t) << 32, uint64_t(i)}, out = 0;
        chi_future_t fu;
        size_t n;
        if (chi_submit(c, CHI_ROUTE_CPU, CHI_METHOD_ADD, in, sizeof in, &fu) != CHI_OK ||
            chi_wait(c, fu, -1, &out, sizeof out, &n) != CHI_OK || out != in[0] + in[1])
          ++bad;
      }
    });
  for (auto &t : threads) t.join();
  assert_int_equal(bad.load(), 0);
  // Echo of the largest payload, and a too-large one.
  std::vector<uint8_t> big(4096), back(4096);
  for (size_t i = 0; i < big.size(); ++i) big[i] = uint8_t(i * 7);
  chi_future_t fu;
  size_t n = 0;
  assert_status(CHI_OK, chi_submit(c, CHI_ROUTE_CPU, CHI_METHOD_ECHO, big.data(), big.size(), &fu));
  assert_status(CHI_ERR_TOO_LARGE, chi_wait(c, fu, -1, back.data(), 16, &n));
  assert_int_equal(n, 4096);
  assert_status(CHI_OK, chi_wait(c, fu, -1, back.data(), back.size(), &n));
  assert_memory_equal(big.data(), back.data(), 4096);
  // A handler's own status comes back as it is (chi.add wants 16 bytes),
  // and chi.checksum's FNV-1a, with built-ins on the poller or on a worker.
  uint64_t sum = 0;
  assert_status(CHI_OK, chi_submit(c, CHI_ROUTE_CPU, CHI_METHOD_ADD, "abc", 3, &fu));
  assert_status(CHI_ERR_INVALID, chi_wait(c, fu, -1, &sum, sizeof sum, &n));
  assert_status(CHI_OK, chi_submit(c, CHI_ROUTE_LOCAL, CHI_METHOD_CHECKSUM, "abc", 3, &fu));
  assert_status(CHI_OK, chi_wait(c, fu, -1, &sum, sizeof sum, &n));
  assert_int_equal(n, 8);
  assert_true(sum == 0xe71fa2190541574bull);  // little-endian host
  std::vector<uint8_t> huge(4097);
  assert_status(CHI_ERR_TOO_LARGE, chi_submit(c, CHI_ROUTE_CPU, CHI_METHOD_ECHO, huge.data(), huge.size(), &fu));
  // Futures: stale, forged, released.
  assert_status(CHI_ERR_INVALID, chi_wait(c, fu, 0, nullptr, 0, nullptr));
  assert_status(CHI_ERR_INVALID, chi_wait(c, 0x1234567, 0, nullptr, 0, nullptr));
  assert_status(CHI_OK, chi_submit(c, CHI_ROUTE_CPU, CHI_METHOD_ECHO, "x", 1, &fu));
  assert_status(CHI_OK, chi_release(c, fu));
  assert_status(CHI_ERR_INVALID, chi_wait(c, fu, 0, nullptr, 0, nullptr));
  // Methods: the server's by name; unknown ids and names.
  chi_method_t m;
  assert_status(CHI_OK, chi_method_lookup(c, "test.sleep", &m));
  assert_int_equal(m, f.sleep_method);
  assert_status(CHI_ERR_NOT_FOUND, chi_method_lookup(c, "no.such.method", &m));
  assert_status(CHI_ERR_NOT_FOUND, chi_submit(c, CHI_ROUTE_CPU, 4000, "x", 1, &fu));
  assert_status(CHI_ERR_INVALID, chi_submit(c, CHI_ROUTE_CPU, 0, "x", 1, &fu));
  // Routes: GPU routes answer as the server can (no GPU in this server).
  assert_status(CHI_ERR_NO_DEVICE, chi_submit(c, CHI_ROUTE_GPU_ANY, CHI_METHOD_ECHO, "x", 1, &fu));
  // A client's device context (client kernels, docs/server.md): refused
  // with the server's reason before any CUDA call in the client.
  chi_dev_context_t dctx;
  assert_status(CHI_ERR_INVALID, chi_gpu_context(c, 0, nullptr));
  assert_status(CHI_ERR_NO_DEVICE, chi_gpu_context(c, 0, &dctx));
  assert_non_null(strstr(chi_last_error_message(), "drives no GPU"));
  assert_status(CHI_ERR_NO_DEVICE, chi_gpu_context(c, -1, &dctx));
  uint64_t dregion = 0;
  char dbuf[16];
  assert_status(CHI_ERR_NO_DEVICE, chi_register_gpu_mem(c, 0, dbuf, sizeof dbuf, &dregion));
  assert_status(CHI_ERR_INVALID, chi_register_gpu_mem(c, -7, dbuf, sizeof dbuf, &dregion));
  assert_status(CHI_ERR_INVALID, chi_unregister_mem(c, 0x100000001ull));
  // A handler registered in the client runs in the client.
  chi_method_t local;
  assert_status(CHI_OK, chi_register_handler(c, "client.sleep", sleep_handler, nullptr, &local));
  uint64_t us = 10;
  assert_status(CHI_OK, chi_submit(c, CHI_ROUTE_CPU, local, &us, sizeof us, &fu));
  assert_status(CHI_OK, chi_wait(c, fu, -1, nullptr, 0, nullptr));
  assert_status(CHI_ERR_INVALID, chi_register_handler(c, "test.sleep", sleep_handler, nullptr, &local));
  // Administrative requests: the reply, and the refusals.
  char reply[4096];
  size_t reply_size = 0;
  assert_status(CHI_OK, chi_server_query(f.address.c_str(), "status-json", reply, sizeof reply, &reply_size));
  assert_non_null(strstr(reply, "\"clients\":[{"));
  assert_non_null(strstr(reply, "\"gpu_orchestrators\":[]"));  // this server drives no GPU
  assert_status(CHI_ERR_TOO_LARGE, chi_server_query(f.address.c_str(), "status", reply, 8, &reply_size));
  assert_true(reply_size > 8);
  assert_status(CHI_ERR_INVALID, chi_server_query(f.address.c_str(), "reboot", reply, sizeof reply, nullptr));
  assert_has_message();
  assert_status(CHI_ERR_DISCONNECTED, chi_server_query(unique_name("nobody").c_str(), "ping", nullptr, 0, nullptr));
  chi_stats_t tiny;
  tiny.struct_size = 4;
  assert_status(CHI_ERR_INVALID, chi_stats(c, &tiny));
  // Statistics on both sides agree.
  chi_stats_t cs = stats_of(c), ss = stats_of(f.rt);
  assert_int_equal(cs.clients, 1);
  assert_true(ss.routes[CHI_STATS_CLIENT].completed >= uint64_t(4 * per_thread));
  assert_true(ss.routes[CHI_STATS_CLIENT].latency_p50_ns > 0);
  assert_status(CHI_OK, chi_finalize(c));
  assert_true(settle(f.rt, 0));
  assert_status(CHI_OK, chi_finalize(f.rt));
}

void test_one_server_per_address(void **) {
  ServerFixture f = start_server();
  chi_runtime_t *rt2 = chi_test_init(1, nullptr);
  chi_server_t *srv2 = nullptr;
  if (file_endpoint()) {
    assert_status(CHI_ERR_AGAIN, chi_server_start(rt2, f.address.c_str(), &srv2));
    assert_non_null(strstr(chi_last_error_message(), "already serves"));
  } else {
    assert_status(CHI_ERR_INVALID, chi_server_start(rt2, f.address.c_str(), &srv2));
    assert_non_null(strstr(chi_last_error_message(), "in use"));
  }
  assert_status(CHI_ERR_INVALID, chi_server_start(rt2, "shm://bad/name", &srv2));
  assert_status(CHI_ERR_INVALID, chi_server_start(rt2, "tcp://", &srv2));
  assert_status(CHI_ERR_CONFIG, chi_server_start(rt2, "tcp://0.0.0.0:1", &srv2));  // no CURVE keys
  assert_non_null(strstr(chi_last_error_message(), "curve_key_file"));
  // The first server still works, and after it stops the address is free.
  chi_runtime_t *c = connect_client(f.address);
  assert_int_equal(add(c, 1, 2), 3);
  assert_status(CHI_OK, chi_finalize(c));
  assert_status(CHI_OK, chi_finalize(f.rt));
  struct stat st;
  if (file_endpoint()) assert_int_not_equal(stat(socket_path(f.address).c_str(), &st), 0);
  assert_status(CHI_OK, chi_server_start(rt2, f.address.c_str(), &srv2));
  assert_status(CHI_OK, chi_finalize(rt2));
  // No client without a server.
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.mode = CHI_MODE_CLIENT;
  cfg.server_address = f.address.c_str();
  chi_runtime_t *none = nullptr;
  assert_status(CHI_ERR_DISCONNECTED, chi_init(&cfg, &none));
  assert_null(none);
  assert_has_message();
}

void test_stale_endpoint_taken_over(void **) {
  std::string address = unique_name("stale");
  pid_t child = spawn({g_self, "child-server", address});
  await_socket(address, child);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  struct stat st;
  if (file_endpoint()) assert_int_equal(stat(socket_path(address).c_str(), &st), 0);  // left behind
  chi_runtime_t *rt = chi_test_init(1, nullptr);
  chi_server_t *srv;
  assert_status(CHI_OK, chi_server_start(rt, address.c_str(), &srv));
  chi_runtime_t *c = connect_client(address);
  assert_int_equal(add(c, 20, 22), 42);
  assert_status(CHI_OK, chi_finalize(c));
  assert_status(CHI_OK, chi_finalize(rt));
}

void test_version_mismatch(void **) {
  if (g_transport != "shm") return skip();  // test_malformed_frames covers ZeroMQ
  ServerFixture f = start_server();
  int s = raw_connect(f.address);
  chi::ipc::Hello hello{chi::ipc::kProtocolVersion + 7, 9900, chi::ipc::kSessionTasks, 0};
  raw_send(s, chi::ipc::Kind::kHello, &hello, sizeof hello);
  chi::ipc::MsgHeader h;
  std::string body;
  assert_true(raw_recv(s, &h, &body));
  assert_int_equal(h.status, CHI_ERR_PROTOCOL);
  std::string msg = body.substr(sizeof(chi::ipc::Welcome));
  assert_true(msg.find("0.99.0") != std::string::npos);  // the client's version
  assert_true(msg.find(chi_version_string()) != std::string::npos);  // the server's
  close(s);
  // Garbage instead of a hello: refused, the server stays up.
  s = raw_connect(f.address);
  assert_int_equal(send(s, "GET / HTTP/1.0\r\n\r\n", 18, MSG_NOSIGNAL), 18);
  close(s);
  chi_runtime_t *c = connect_client(f.address);
  assert_int_equal(add(c, 2, 2), 4);
  assert_status(CHI_OK, chi_finalize(c));
  assert_status(CHI_OK, chi_finalize(f.rt));
}

void test_max_clients(void **) {
  ServerFixture f = start_server("server:\n  max_clients: 2\n");
  chi_runtime_t *a = connect_client(f.address), *b = connect_client(f.address);
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.mode = CHI_MODE_CLIENT;
  cfg.server_address = f.address.c_str();
  chi_runtime_t *third = nullptr;
  assert_status(CHI_ERR_AGAIN, chi_init(&cfg, &third));
  assert_non_null(strstr(chi_last_error_message(), "server.max_clients"));
  assert_status(CHI_OK, chi_finalize(a));
  assert_true(settle(f.rt, 1));
  assert_status(CHI_OK, chi_init(&cfg, &third));
  assert_status(CHI_OK, chi_finalize(third));
  assert_status(CHI_OK, chi_finalize(b));
  assert_status(CHI_OK, chi_finalize(f.rt));
}

// Children connect, queue a window of slow tasks and are SIGKILLed mid-flight.
void test_client_kill_loop(void **) {
  ServerFixture f = start_server();
  assert_true(settle(f.rt, 0));
  const int fds_before = count_fds();
  const long rss_before = rss_kb();
  const long kills = chi_test_scaled(100);
  for (long i = 0; i < kills; ++i) {
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    pid_t child = spawn({g_self, "child-client", f.address, std::to_string(pipefd[1])});
    close(pipefd[1]);
    char ready;
    assert_int_equal(read(pipefd[0], &ready, 1), 1);  // its tasks are queued
    close(pipefd[0]);
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
  }
  assert_true(settle(f.rt, 0));
  // Dead sessions are freed by the server's control thread on its next turn.
  for (int i = 0; i < 1000 && count_fds() > fds_before; ++i) usleep(10000);
  chi_stats_t st = stats_of(f.rt);
  const int fds_after = count_fds();
  const long rss_after = rss_kb();
  print_message("  %ld clients killed mid-flight: client tasks submitted %llu, finished %llu, in flight %llu; "
                "slots in use %llu; fds %d -> %d; RSS %ld -> %ld kB\n",
                kills, (unsigned long long)st.routes[CHI_STATS_CLIENT].submitted,
                (unsigned long long)(st.routes[CHI_STATS_CLIENT].completed + st.routes[CHI_STATS_CLIENT].failed),
                (unsigned long long)st.routes[CHI_STATS_CLIENT].in_flight,
                (unsigned long long)st.slots_in_use, fds_before, fds_after, rss_before, rss_after);
  assert_int_equal(st.clients, 0);
  assert_int_equal(st.slots_in_use, 0);
  assert_int_equal(st.routes[CHI_STATS_CLIENT].in_flight, 0);
  // A descriptor of an earlier test may still close meanwhile: none may be added.
  assert_true(fds_after <= fds_before);
  // Each dead session's segment is unmapped: RSS may grow by allocator
  // noise, never by a segment per kill (1024 slots of 8 KiB each).
  if (!kSanitized) assert_true(rss_after - rss_before < 32 * 1024);
  // The server still serves.
  chi_runtime_t *c = connect_client(f.address);
  assert_int_equal(add(c, 5, 6), 11);
  assert_status(CHI_OK, chi_finalize(c));
  assert_status(CHI_OK, chi_finalize(f.rt));
}

void test_server_killed(void **) {
  std::string address = unique_name("killed");
  pid_t child = spawn({g_self, "child-server", address});
  await_socket(address, child);
  chi_runtime_t *c = connect_client(address);
  assert_int_equal(add(c, 1, 1), 2);
  chi_method_t slow;
  assert_status(CHI_OK, chi_method_lookup(c, "test.sleep", &slow));
  uint64_t us = 30 * 1000000;  // longer than the test
  chi_future_t pending[4];
  for (auto &p : pending) assert_status(CHI_OK, chi_submit(c, CHI_ROUTE_CPU, slow, &us, sizeof us, &p));
  usleep(50000);
  kill(child, SIGKILL);
  int64_t t0 = now_ns();
  assert_status(CHI_ERR_DISCONNECTED, chi_wait(c, pending[0], -1, nullptr, 0, nullptr));
  int64_t t1 = now_ns();
  waitpid(child, nullptr, 0);
  print_message("  server SIGKILLed: a pending chi_wait returned CHI_ERR_DISCONNECTED after %.1f ms\n",
                double(t1 - t0) / 1e6);
  for (int i = 1; i < 4; ++i)
    assert_status(CHI_ERR_DISCONNECTED, chi_wait(c, pending[i], -1, nullptr, 0, nullptr));
  chi_future_t fu;
  assert_status(CHI_ERR_DISCONNECTED, chi_submit(c, CHI_ROUTE_CPU, CHI_METHOD_ADD, "0123456789abcdef", 16, &fu));
  chi_method_t m;
  assert_status(CHI_ERR_DISCONNECTED, chi_method_lookup(c, "chi.add", &m));
  assert_status(CHI_OK, chi_finalize(c));
  // A restarted server takes clients back: they connect again (chi_init).
  child = spawn({g_self, "child-server", address});
  await_socket(address, child);
  c = connect_client(address);
  assert_int_equal(add(c, 3, 4), 7);
  assert_status(CHI_OK, chi_finalize(c));
  kill(child, SIGTERM);
  int status = 0;
  waitpid(child, &status, 0);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

// Connections that never say hello hold only themselves: a client that
// comes after them is served at once, and they stay open until
// server.hello_timeout_ms (10 minutes here: never within the test).  Were
// hellos read one at a time, the client would wait 8 x 10 minutes.
void test_silent_connections(void **) {
  if (g_transport != "shm") return skip();  // ZeroMQ reads every peer as it speaks
  ServerFixture f = start_server("server:\n  hello_timeout_ms: 600000\n");
  const std::string path = socket_path(f.address);
  std::vector<int> silent;
  for (int i = 0; i < 8; ++i) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    assert_true(path.size() < sizeof a.sun_path);
    memcpy(a.sun_path, path.c_str(), path.size() + 1);
    assert_int_equal(connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a), 0);
    silent.push_back(fd);
  }
  chi_runtime_t *c = connect_client(f.address);
  assert_int_equal(add(c, 2, 3), 5);
  assert_int_equal(stats_of(f.rt).clients, 1);
  for (int fd : silent) {  // still open: nothing to read, no hang-up
    pollfd p{fd, POLLIN, 0};
    assert_int_equal(poll(&p, 1, 0), 0);
  }
  // A late hello that is garbage is refused; closing the rest costs nothing.
  const char junk[64] = "not a chimaera hello";
  assert_int_equal(write(silent[0], junk, sizeof junk), ssize_t(sizeof junk));
  char reply[256];
  assert_true(read(silent[0], reply, sizeof reply) >= 0);  // the refusal, then EOF
  for (int fd : silent) close(fd);
  assert_int_equal(add(c, 4, 5), 9);
  assert_status(CHI_OK, chi_finalize(c));
  assert_true(settle(f.rt, 0));
  assert_status(CHI_OK, chi_finalize(f.rt));

  // Past server.hello_timeout_ms (1 ms here) the server closes a silent
  // connection: the client sees end-of-file (the wait has no bound of its own).
  ServerFixture g = start_server("server:\n  hello_timeout_ms: 1\n");
  const std::string gpath = socket_path(g.address);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(fd >= 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  memcpy(a.sun_path, gpath.c_str(), gpath.size() + 1);
  assert_int_equal(connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a), 0);
  char byte;
  assert_int_equal(read(fd, &byte, 1), 0);
  close(fd);
  assert_status(CHI_OK, chi_finalize(g.rt));
}

void test_graceful_stop(void **) {
  // One task in flight per client: the second waits in the ring, unstarted.
  ServerFixture f = start_server("server:\n  client_max_in_flight: 1\n");
  chi_runtime_t *c = connect_client(f.address);
  uint64_t us = 200000;
  chi_future_t running, queued;
  const long started = g_sleeps_started.load();
  assert_status(CHI_OK, chi_submit(c, CHI_ROUTE_CPU, f.sleep_method, &us, sizeof us, &running));
  assert_status(CHI_OK, chi_submit(c, CHI_ROUTE_CPU, f.sleep_method, &us, sizeof us, &queued));
  // Stop once the first task runs (200 ms): a task taken but not started
  // would be answered CHI_ERR_SHUTDOWN.
  for (int i = 0; i < 30000 && g_sleeps_started.load() == started; ++i) usleep(1000);
  if (g_sleeps_started.load() == started) fail_msg("the first task did not start within 30 s");
  std::thread stopper([&] { assert_status(CHI_OK, chi_server_stop(f.srv, 5000)); });
  // Finished within the bound, its result delivered on every transport
  // (over ZeroMQ the server waits for the client to read its last frame).
  assert_status(CHI_OK, chi_wait(c, running, -1, nullptr, 0, nullptr));
  chi_status_t q = chi_wait(c, queued, -1, nullptr, 0, nullptr);
  if (q != CHI_ERR_SHUTDOWN && q != CHI_ERR_DISCONNECTED) fail_msg("the queued task: status %d", q);
  stopper.join();
  // Over ZeroMQ the client learns it from a frame: a submit that slips in
  // before it arrives is answered DISCONNECTED at its wait.
  chi_future_t fu;
  chi_status_t late = chi_submit(c, CHI_ROUTE_CPU, CHI_METHOD_ECHO, "x", 1, &fu);
  if (late == CHI_OK) late = chi_wait(c, fu, -1, nullptr, 0, nullptr);
  assert_status(CHI_ERR_DISCONNECTED, late);
  if (g_transport == "shm")
    assert_status(CHI_ERR_DISCONNECTED, chi_submit(c, CHI_ROUTE_CPU, CHI_METHOD_ECHO, "x", 1, &fu));
  struct stat st;
  if (file_endpoint()) assert_int_not_equal(stat(socket_path(f.address).c_str(), &st), 0);  // files removed
  assert_status(CHI_OK, chi_finalize(c));
  assert_status(CHI_OK, chi_finalize(f.rt));
}

// A killed client's tasks that no worker started are dropped at once (issue
// 23: "within 100 ms of a kill, in-flight falls to at most the number
// running"); those running finish and their results are discarded.  Not
// cancelled, the 5 x 64 tasks of 200 ms would take 32 s on 2 workers: the
// hang guard below (2 s, twenty times the required 100 ms, for a loaded
// 2-core CI machine or a sanitizer) tells the two apart; the measured time
// is printed.
void test_cancel_on_kill(void **) {
  ServerFixture f = start_server();
  const int kids = 5, tasks = 64, workers = 2;
  const chi_stats_t start = stats_of(f.rt);
  int pipefd[2];
  assert_int_equal(pipe(pipefd), 0);
  std::vector<pid_t> pids;
  for (int i = 0; i < kids; ++i)
    pids.push_back(spawn({g_self, "child-slow", f.address, std::to_string(tasks), std::to_string(pipefd[1])}));
  close(pipefd[1]);
  for (int i = 0; i < kids; ++i) {
    char ready;
    assert_int_equal(read(pipefd[0], &ready, 1), 1);
  }
  close(pipefd[0]);
  // Every task is with the server (ZeroMQ submits travel after chi_submit returns).
  chi_stats_t before = stats_of(f.rt);
  for (int i = 0; i < 3000 && before.routes[CHI_STATS_CLIENT].submitted - start.routes[CHI_STATS_CLIENT].submitted <
                                  uint64_t(kids * tasks);
       ++i) {
    usleep(1000);
    before = stats_of(f.rt);
  }
  for (pid_t p : pids) kill(p, SIGKILL);
  const int64_t t0 = now_ns();
  chi_stats_t st = stats_of(f.rt);
  while (st.routes[CHI_STATS_CLIENT].in_flight > uint64_t(workers) && now_ns() - t0 < 2000000000) {
    usleep(1000);
    st = stats_of(f.rt);
  }
  const double ms = double(now_ns() - t0) / 1e6;
  for (pid_t p : pids) waitpid(p, nullptr, 0);
  const uint64_t cancelled = st.tasks_cancelled - before.tasks_cancelled;
  print_message("  %d clients with %d tasks of 200 ms SIGKILLed: in flight %llu -> %llu after %.1f ms, "
                "%llu cancelled\n",
                kids, tasks, (unsigned long long)before.routes[CHI_STATS_CLIENT].in_flight,
                (unsigned long long)st.routes[CHI_STATS_CLIENT].in_flight, ms, (unsigned long long)cancelled);
  assert_true(st.routes[CHI_STATS_CLIENT].in_flight <= uint64_t(workers));
  // Each task ran (those running at the kill, and those that started
  // before their client's hang-up was read: a worker frees every 200 ms;
  // room for two such turns on a loaded machine) or was cancelled.
  assert_true(cancelled + 3 * workers >= before.routes[CHI_STATS_CLIENT].in_flight);
  assert_true(settle(f.rt, 0));
  // The server still serves.
  chi_runtime_t *c = connect_client(f.address);
  assert_int_equal(add(c, 5, 6), 11);
  assert_status(CHI_OK, chi_finalize(c));
  assert_status(CHI_OK, chi_finalize(f.rt));
}

// Stop answers the queued tasks CHI_ERR_SHUTDOWN at once; only running ones
// get server.shutdown_timeout_ms (issue 23: with thousands of queued 200 ms
// tasks from live clients, SIGTERM returns within 1 s).  Were they run, the
// stop would last the whole shutdown_timeout_ms (5 s); the hang guard (3 s,
// the required 1 s plus room for a loaded 2-core machine) tells the two
// apart; the measured time is printed.
void test_prompt_stop(void **) {
  const std::string address = unique_name("prompt");
  pid_t child = spawn({g_self, "child-server", address});
  await_socket(address, child);
  const int clients = 4;
  const long per_client = chi_test_scaled(1000);
  std::vector<chi_runtime_t *> rts;
  std::vector<std::vector<chi_future_t>> futures(clients);
  uint64_t us = 200000;
  for (int i = 0; i < clients; ++i) {
    rts.push_back(connect_client(address));
    chi_method_t slow;
    assert_status(CHI_OK, chi_method_lookup(rts[i], "test.sleep", &slow));
    futures[i].resize(size_t(per_client));
    for (auto &fu : futures[i]) assert_status(CHI_OK, chi_submit(rts[i], CHI_ROUTE_CPU, slow, &us, sizeof us, &fu));
  }
  // Every task is with the server.
  for (int i = 0; i < 3000 && stats_of(rts[0]).routes[CHI_STATS_CLIENT].submitted < uint64_t(clients * per_client);
       ++i)
    usleep(1000);
  kill(child, SIGTERM);
  const int64_t t0 = now_ns();
  int status = 0;
  waitpid(child, &status, 0);
  const double ms = double(now_ns() - t0) / 1e6;
  long ok = 0, shutdown = 0, other = 0;
  for (int i = 0; i < clients; ++i) {
    for (chi_future_t fu : futures[i]) {
      const chi_status_t s = chi_wait(rts[i], fu, -1, nullptr, 0, nullptr);
      (s == CHI_OK ? ok : s == CHI_ERR_SHUTDOWN ? shutdown : other)++;
      if (s != CHI_OK && s != CHI_ERR_SHUTDOWN && other == 1) print_message("  unexpected status %d\n", s);
    }
    assert_status(CHI_OK, chi_finalize(rts[i]));
  }
  print_message("  stop with %ld queued tasks of 200 ms: the server exited %.1f ms after SIGTERM; "
                "%ld ran, %ld answered CHI_ERR_SHUTDOWN, %ld other\n",
                clients * per_client, ms, ok, shutdown, other);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  assert_true(ms < 3000);
  assert_int_equal(other, 0);
}

// Graceful stops under load lose nothing (issue 23): clients keep a window
// of short tasks in flight while the server stops; every task whose handler
// ran must reach its client as CHI_OK (a lost result would read
// CHI_ERR_DISCONNECTED), every other one CHI_ERR_SHUTDOWN or, for one the
// server never took, CHI_ERR_DISCONNECTED.  CHI_TEST_STOPS rounds (3 by
// default; the server_stops_* tests, label long, run 200).
void test_stop_under_load(void **) {
  const char *env = getenv("CHI_TEST_STOPS");
  const long rounds = env ? atol(env) : 3;
  const int clients = 3, window = 32;
  long lost_total = 0, ran_total = 0, shutdown_total = 0, disc_total = 0;
  for (long round = 0; round < rounds; ++round) {
    ServerFixture f = start_server();
    const long done_before = g_sleeps_done.load();
    std::atomic<long> ok{0}, shutdown{0}, disconnected{0}, other{0}, started{0};
    std::vector<std::thread> threads;
    for (int c = 0; c < clients; ++c) {
      chi_runtime_t *rt = connect_client(f.address);
      threads.emplace_back([&, c, rt] {
        std::vector<chi_future_t> pending;
        uint64_t us = 200 + 300 * uint64_t(c);
        bool gone = false;
        auto settle_one = [&](chi_future_t fu) {
          const chi_status_t s = chi_wait(rt, fu, -1, nullptr, 0, nullptr);
          (s == CHI_OK ? ok : s == CHI_ERR_SHUTDOWN ? shutdown : s == CHI_ERR_DISCONNECTED ? disconnected : other)++;
          if (s == CHI_ERR_DISCONNECTED || s == CHI_ERR_SHUTDOWN) gone = true;
        };
        while (!gone) {
          chi_future_t fu;
          const chi_status_t s = chi_submit(rt, CHI_ROUTE_CPU, f.sleep_method, &us, sizeof us, &fu);
          if (s == CHI_OK) {
            pending.push_back(fu);
            started++;
          } else if (s == CHI_ERR_SHUTDOWN) {
            shutdown++;
            break;
          } else if (s == CHI_ERR_DISCONNECTED) {
            break;
          } else if (s != CHI_ERR_AGAIN) {
            other++;
            break;
          }
          if (pending.size() >= size_t(window)) {
            settle_one(pending.front());
            pending.erase(pending.begin());
          }
        }
        for (chi_future_t fu : pending) settle_one(fu);
        chi_finalize(rt);
      });
    }
    // Stop under load: once some tasks ran.
    while (started.load() < 200) usleep(1000);
    assert_status(CHI_OK, chi_server_stop(f.srv, 5000));
    for (auto &t : threads) t.join();
    const long ran = g_sleeps_done.load() - done_before;
    const long lost = ran - ok.load();
    if (lost != 0 || other.load() != 0)
      print_message("  round %ld: %ld ran, %ld reached their clients, %ld CHI_ERR_SHUTDOWN, %ld "
                    "CHI_ERR_DISCONNECTED, %ld other\n",
                    round, ran, ok.load(), shutdown.load(), disconnected.load(), other.load());
    assert_int_equal(other.load(), 0);
    lost_total += lost;
    ran_total += ran;
    shutdown_total += shutdown.load();
    disc_total += disconnected.load();
    assert_status(CHI_OK, chi_finalize(f.rt));
  }
  print_message("  %ld stops under load: %ld tasks ran, %ld results lost, %ld CHI_ERR_SHUTDOWN, %ld "
                "CHI_ERR_DISCONNECTED (never taken)\n",
                rounds, ran_total, lost_total, shutdown_total, disc_total);
  assert_int_equal(lost_total, 0);
}

// One control request on a raw session; the reply's status and text.
chi_status_t raw_control(int sock, chi::ipc::Op op, const void *payload, uint32_t len, std::string *body) {
  chi::ipc::MsgHeader h{chi::ipc::kMsgMagic, uint16_t(chi::ipc::Kind::kControl), uint16_t(op), 0, len, 0};
  assert_int_equal(send(sock, &h, sizeof h, MSG_NOSIGNAL), sizeof h);
  if (len) assert_int_equal(send(sock, payload, len, MSG_NOSIGNAL), len);
  chi::ipc::MsgHeader r;
  assert_true(raw_recv(sock, &r, body));
  assert_int_equal(r.kind, uint16_t(chi::ipc::Kind::kControlReply));
  return r.status;
}

// Client device memory messages (kRegisterGpuMem, kUnregisterMem) as a
// hostile client may write them: each refused with a status and a message;
// malformed ones end that session only.  This server has no GPU, so no
// handle is ever opened (the GPU case: tests/gpu/test_gpu_client.cu).
void test_gpu_mem_messages(void **) {
  if (g_transport != "shm") return skip();  // the raw session socket
  ServerFixture f = start_server();
  chi_runtime_t *honest = connect_client(f.address);
  using chi::ipc::GpuMemExport;
  GpuMemExport good{};
  good.version = chi::ipc::kGpuMemVersion;
  good.gpu = 0;
  good.size = 4096;
  struct Case {
    const char *what;
    GpuMemExport x;
    uint32_t len;
    chi_status_t want;
    const char *says;
  };
  GpuMemExport v = good, z = good, w = good, g = good;
  v.version = 99;
  z.size = 0;
  w.offset = ~0ull - 10;
  g.gpu = -3;
  const Case cases[] = {
      {"short", good, sizeof good - 1, CHI_ERR_PROTOCOL, "bytes"},
      {"long", good, sizeof good + 1, CHI_ERR_PROTOCOL, "bytes"},
      {"empty", good, 0, CHI_ERR_PROTOCOL, "bytes"},
      {"version", v, sizeof v, CHI_ERR_PROTOCOL, "version 99"},
      {"size 0", z, sizeof z, CHI_ERR_INVALID, "size is 0"},
      {"wraps", w, sizeof w, CHI_ERR_INVALID, "wraps"},
      {"no GPU", good, sizeof good, CHI_ERR_NO_DEVICE, "no GPU"},
      {"negative GPU", g, sizeof g, CHI_ERR_NO_DEVICE, "no GPU"},
  };
  for (const Case &k : cases) {
    RawSession r = raw_session(f.address);
    std::string body;
    char buf[sizeof(GpuMemExport) + 1] = {};
    memcpy(buf, &k.x, sizeof k.x);
    assert_int_equal(raw_control(r.sock, chi::ipc::Op::kRegisterGpuMem, buf, k.len, &body), k.want);
    if (!strstr(body.c_str(), k.says)) fail_msg("%s: reply '%s' does not say '%s'", k.what, body.c_str(), k.says);
    raw_close(r);
  }
  // Unregister: malformed, and a region this session never registered.
  RawSession r = raw_session(f.address);
  std::string body;
  uint64_t region = 0x100000001ull;
  assert_int_equal(raw_control(r.sock, chi::ipc::Op::kUnregisterMem, &region, sizeof region, &body), CHI_ERR_INVALID);
  assert_non_null(strstr(body.c_str(), "not one this client registered"));
  assert_int_equal(raw_control(r.sock, chi::ipc::Op::kUnregisterMem, &region, 3, &body), CHI_ERR_PROTOCOL);
  raw_close(r);
  // The honest client never noticed.
  uint64_t in[2] = {2, 3}, out = 0;
  chi_future_t fu;
  assert_status(CHI_OK, chi_submit(honest, CHI_ROUTE_CPU, CHI_METHOD_ADD, in, sizeof in, &fu));
  assert_status(CHI_OK, chi_wait(honest, fu, -1, &out, sizeof out, nullptr));
  assert_true(out == 5);
  chi_finalize(honest);
  chi_finalize(f.rt);
}

void test_garbage_in_segment(void **) {
  if (g_transport != "shm") return skip();  // shared memory only
  ServerFixture f = start_server();
  // An honest client runs beside the hostile ones all along.
  chi_runtime_t *honest = connect_client(f.address);
  std::atomic<bool> done{false};
  std::atomic<long> bad{0}, good{0};
  std::thread t([&] {
    uint64_t i = 0;
    while (!done.load()) {
      uint64_t in[2] = {i, 3 * i}, out = 0;
      chi_future_t fu;
      if (chi_submit(honest, CHI_ROUTE_CPU, CHI_METHOD_ADD, in, sizeof in, &fu) != CHI_OK ||
          chi_wait(honest, fu, -1, &out, sizeof out, nullptr) != CHI_OK || out != 4 * i)
        ++bad;
      else
        ++good;
      ++i;
    }
  });
  // The honest client's progress: at least one more task done (no time
  // bound of its own; ctest's timeout is the bound).
  auto progress = [&](long from) {
    while (good.load() <= from && bad.load() == 0) usleep(1000);
  };
  progress(0);  // it runs before the hostile sessions start
  // Bad requests in well-formed records: statuses, not cut-offs.
  RawSession r = raw_session(f.address);
  struct Case {
    uint32_t method;
    int32_t route;
    uint32_t size;
    int32_t want;
  } cases[] = {
      {999999, CHI_ROUTE_CPU, 8, CHI_ERR_NOT_FOUND},
      {0, CHI_ROUTE_CPU, 8, CHI_ERR_NOT_FOUND},
      {CHI_METHOD_ECHO, CHI_ROUTE_CPU, 0xFFFFFFF0u, CHI_ERR_TOO_LARGE},
      {CHI_METHOD_ECHO, -77, 8, CHI_ERR_INVALID},
      {CHI_METHOD_ECHO, 5, 8, CHI_ERR_NO_DEVICE},
      {CHI_METHOD_ECHO, CHI_ROUTE_CPU, 8, CHI_OK},
  };
  uint32_t slot = 0;
  for (const Case &k : cases) {
    chi::ipc::SlotHeader *h = r.seg.slot(slot);
    h->method = k.method;
    h->route = k.route;
    h->input_size = k.size;
    h->state.store(chi::ipc::slot_word(slot + 1, chi::ipc::kSlotSubmitted));
    raw_queue(r, slot);
    assert_int_equal(raw_result(r, slot, slot + 1), k.want);
    ++slot;
  }
  // Records no honest client writes: each ends that session, only that one.
  enum Bad { kSlotOutOfRange, kTorn, kTwice, kRandom };
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  const long rounds = chi_test_scaled(40);
  for (long i = 0; i < rounds; ++i) {
    RawSession h = raw_session(f.address);
    Bad kind = Bad(i % 4);
    if (kind == kSlotOutOfRange) {
      raw_queue(h, h.w.nslots + uint32_t(chi_test_rand(&seed) % 100000));
    } else if (kind == kTorn) {
      h.seg.slot(3)->state.store(chi::ipc::slot_word(1, 0x55));
      raw_queue(h, 3);
    } else if (kind == kTwice) {
      uint64_t us = 100000;
      chi::ipc::SlotHeader *s = h.seg.slot(1);
      s->method = f.sleep_method;
      s->route = CHI_ROUTE_CPU;
      s->input_size = sizeof us;
      memcpy(h.seg.input(1), &us, sizeof us);
      s->state.store(chi::ipc::slot_word(1, chi::ipc::kSlotSubmitted));
      raw_queue(h, 1);
      raw_queue(h, 1);
    } else {
      // Random bytes over the ring and the first slots, then ring the bell.
      uint8_t *p = h.seg.base + h.seg.layout.ring_offset;
      size_t n = h.seg.layout.slots_offset - h.seg.layout.ring_offset + 4 * h.seg.layout.slot_stride;
      for (size_t b = 0; b < n; b += 8) {
        uint64_t v = chi_test_rand(&seed);
        memcpy(p + b, &v, 8);
      }
      // Make cell 0 look published so the server reads garbage.
      h.seg.ring()[0].seq.store(1, std::memory_order_release);
      uint64_t one = 1;
      ssize_t wr = write(h.doorbell, &one, sizeof one);
      (void)wr;
    }
    if (kind != kRandom) assert_true(raw_cut_off(h));
    raw_close(h);
  }
  // The first hostile session still gets answers, and so does the honest one.
  chi::ipc::SlotHeader *h = r.seg.slot(slot);
  uint64_t in[2] = {40, 2};
  h->method = CHI_METHOD_ADD;
  h->route = CHI_ROUTE_CPU;
  h->input_size = sizeof in;
  memcpy(r.seg.input(slot), in, sizeof in);
  h->state.store(chi::ipc::slot_word(9, chi::ipc::kSlotSubmitted));
  raw_queue(r, slot);
  assert_int_equal(raw_result(r, slot, 9), CHI_OK);
  uint64_t out;
  memcpy(&out, r.seg.output(slot), sizeof out);
  assert_int_equal(out, 42);
  raw_close(r);
  progress(good.load());  // and is still served after them
  done.store(true);
  t.join();
  assert_int_equal(bad.load(), 0);
  assert_true(good.load() > 1);
  assert_status(CHI_OK, chi_finalize(honest));
  assert_true(settle(f.rt, 0));
  assert_status(CHI_OK, chi_finalize(f.rt));
}

// CPU->GPU from a client: the server relays to its orchestrators (skipped
// where the server has no GPU, as in CI).
void test_gpu_route_through_server(void **) {
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.num_workers = 2;
  chi_runtime_t *rt;
  assert_status(CHI_OK, chi_init(&cfg, &rt));
  int32_t gpus = 0;
  assert_status(CHI_OK, chi_gpu_count(rt, &gpus));
  if (gpus == 0) {
    chi_finalize(rt);
    skip();
    return;
  }
  std::string address = unique_name("gpu");
  chi_server_t *srv;
  assert_status(CHI_OK, chi_server_start(rt, address.c_str(), &srv));
  chi_runtime_t *c = connect_client(address);
  int32_t seen = 0;
  assert_status(CHI_OK, chi_gpu_count(c, &seen));
  assert_int_equal(seen, gpus);
  const long n = chi_test_scaled(2000);
  uint8_t in[600], out[600];
  for (long i = 0; i < n; ++i) {
    size_t len = size_t(i % 3 == 0 ? 600 : i % 64);
    for (size_t b = 0; b < len; ++b) in[b] = uint8_t(i + b);
    chi_future_t f;
    size_t got = 0;
    assert_status(CHI_OK, chi_submit(c, i % 2 ? CHI_ROUTE_GPU_ANY : CHI_ROUTE_GPU(0), CHI_METHOD_ECHO, in, len, &f));
    assert_status(CHI_OK, chi_wait(c, f, -1, out, sizeof out, &got));
    assert_int_equal(got, len);
    assert_memory_equal(in, out, len);
  }
  uint64_t sum_in[2] = {7, 35}, sum = 0;
  chi_future_t f;
  assert_status(CHI_OK, chi_submit(c, CHI_ROUTE_GPU(0), CHI_METHOD_ADD, sum_in, sizeof sum_in, &f));
  assert_status(CHI_OK, chi_wait(c, f, -1, &sum, sizeof sum, nullptr));
  assert_int_equal(sum, 42);
  assert_status(CHI_ERR_INVALID, chi_submit(c, CHI_ROUTE_GPU(gpus), CHI_METHOD_ECHO, in, 1, &f));
  // chimaera-ctl status shows each orchestrator as it is: running, then paused.
  char reply[8192];
  assert_status(CHI_OK, chi_server_query(address.c_str(), "status-json", reply, sizeof reply, nullptr));
  assert_non_null(strstr(reply, "{\"gpu\":0,\"state\":\"running\""));
  assert_status(CHI_OK, chi_gpu_pause(rt, 0));
  assert_status(CHI_OK, chi_server_query(address.c_str(), "status-json", reply, sizeof reply, nullptr));
  assert_non_null(strstr(reply, "{\"gpu\":0,\"state\":\"paused\""));
  assert_status(CHI_OK, chi_gpu_resume(rt, 0));
  print_message("  %ld CPU->GPU echo tasks from a client through the server on %d GPU(s): all correct\n", n, gpus);
  assert_status(CHI_OK, chi_finalize(c));
  assert_status(CHI_OK, chi_finalize(rt));
}

// shm://: a new client goes to the poller with the fewest clients, so that
// clients that come and go leave no poller with many while another has none
// (round-robin would put the two new ones below on pollers 0 and 1: 1 and 3).
// The status lists each client's poller.
void test_poller_balance(void **) {
  if (g_transport != "shm") return skip();  // ZeroMQ sessions have no poller
  ServerFixture f = start_server("server:\n  pollers: 2\n");
  chi_runtime_t *c[4];
  for (auto &x : c) x = connect_client(f.address);
  auto on_poller = [&](int k) {
    char reply[8192];
    assert_status(CHI_OK, chi_server_query(f.address.c_str(), "status-json", reply, sizeof reply, nullptr));
    assert_non_null(strstr(reply, "\"pollers\":2,"));
    const std::string key = "\"poller\":" + std::to_string(k) + "}";
    int n = 0;
    for (const char *p = reply; (p = strstr(p, key.c_str())) != nullptr; p += key.size()) ++n;
    return n;
  };
  assert_int_equal(on_poller(0), 2);
  assert_int_equal(on_poller(1), 2);
  // Clients 0 and 2 went to poller 0 (turns, then ties): it is left empty.
  assert_status(CHI_OK, chi_finalize(c[0]));
  assert_status(CHI_OK, chi_finalize(c[2]));
  assert_true(settle(f.rt, 2));
  assert_int_equal(on_poller(0), 0);
  assert_int_equal(on_poller(1), 2);
  c[0] = connect_client(f.address);
  c[2] = connect_client(f.address);
  assert_int_equal(on_poller(0), 2);
  assert_int_equal(on_poller(1), 2);
  for (auto &x : c) {
    assert_int_equal(add(x, 40, 2), 42);
    assert_status(CHI_OK, chi_finalize(x));
  }
  assert_status(CHI_OK, chi_finalize(f.rt));
}

// 64 client processes connected at once, each checking every result.
void test_many_clients(void **) {
  ServerFixture f = start_server();
  const int clients = 64;
  const long tasks = chi_test_scaled(500);
  std::vector<pid_t> kids;
  for (int i = 0; i < clients; ++i)
    kids.push_back(spawn({g_self, "child-adder", f.address, std::to_string(tasks), std::to_string(i)}));
  int failed = 0;
  for (pid_t k : kids) {
    int status = 0;
    waitpid(k, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  assert_int_equal(failed, 0);
  assert_true(settle(f.rt, 0));
  chi_stats_t st = stats_of(f.rt);
  assert_true(st.routes[CHI_STATS_CLIENT].completed >= uint64_t(clients) * uint64_t(tasks));
  assert_int_equal(st.routes[CHI_STATS_CLIENT].failed, 0);
  print_message("  %d client processes x %ld round trips: all correct; client p50 %llu ns, p99 %llu ns\n",
                clients, tasks, (unsigned long long)st.routes[CHI_STATS_CLIENT].latency_p50_ns,
                (unsigned long long)st.routes[CHI_STATS_CLIENT].latency_p99_ns);
  assert_status(CHI_OK, chi_finalize(f.rt));
}

// Connect, submit, disconnect, many times; every tenth client is SIGKILLed
// mid-flight.  Clients, slots, descriptors and memory return to baseline.
void test_churn(void **) {
  ServerFixture f = start_server();
  assert_true(settle(f.rt, 0));
  const int fds_before = count_fds();
  const long rss_before = rss_kb();
  const long cycles = chi_test_scaled(1000);
  long killed = 0;
  for (long i = 0; i < cycles; ++i) {
    if (i % 10 == 9) {
      int pipefd[2];
      assert_int_equal(pipe(pipefd), 0);
      pid_t child = spawn({g_self, "child-client", f.address, std::to_string(pipefd[1])});
      close(pipefd[1]);
      char ready;
      assert_int_equal(read(pipefd[0], &ready, 1), 1);
      close(pipefd[0]);
      kill(child, SIGKILL);
      waitpid(child, nullptr, 0);
      ++killed;
    } else {
      pid_t child = spawn({g_self, "child-adder", f.address, "3", std::to_string(i)});
      int status = 0;
      waitpid(child, &status, 0);
      assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
  }
  assert_true(settle(f.rt, 0));
  for (int i = 0; i < 1000 && count_fds() > fds_before; ++i) usleep(10000);
  chi_stats_t st = stats_of(f.rt);
  const int fds_after = count_fds();
  const long rss_after = rss_kb();
  print_message("  churn: %ld cycles (%ld SIGKILLed): clients %u, slots in use %llu, fds %d -> %d, "
                "RSS %ld -> %ld kB\n",
                cycles, killed, st.clients, (unsigned long long)st.slots_in_use, fds_before, fds_after,
                rss_before, rss_after);
  assert_int_equal(st.clients, 0);
  assert_int_equal(st.slots_in_use, 0);
  // A descriptor of an earlier test may still close meanwhile: none may be added.
  assert_true(fds_after <= fds_before);
  if (!kSanitized) assert_true(rss_after - rss_before < 32 * 1024);
  assert_status(CHI_OK, chi_finalize(f.rt));
}

int child_adder(const char *address, long tasks, uint64_t id) {
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.mode = CHI_MODE_CLIENT;
  cfg.server_address = address;
  chi_runtime_t *rt;
  // At once, many clients may find the server busy: retry the connection.
  chi_status_t s = CHI_ERR_DISCONNECTED;
  for (int k = 0; k < 50 && (s = chi_init(&cfg, &rt)) != CHI_OK; ++k) usleep(20000);
  if (s != CHI_OK) {
    fprintf(stderr, "child %llu: %s\n", (unsigned long long)id, chi_last_error_message());
    return 1;
  }
  for (long i = 0; i < tasks; ++i) {
    uint64_t in[2] = {id << 32, uint64_t(i)}, out = 0;
    chi_future_t f;
    if (chi_submit(rt, CHI_ROUTE_CPU, CHI_METHOD_ADD, in, sizeof in, &f) != CHI_OK ||
        chi_wait(rt, f, -1, &out, sizeof out, nullptr) != CHI_OK || out != in[0] + in[1]) {
      fprintf(stderr, "child %llu: task %ld: %s\n", (unsigned long long)id, i, chi_last_error_message());
      return 1;
    }
  }
  return chi_finalize(rt) == CHI_OK ? 0 : 1;
}

// A raw DEALER: what a hostile or broken ZeroMQ peer can send.
// One frame's bytes, as a peer puts them on the wire.
std::string frame_bytes(chi::ipc::Kind kind, uint64_t id, const std::string &payload, int32_t status = 0,
                        uint32_t method = 0, int32_t route = 0) {
  chi::ipc::Frame f;
  f.kind = kind;
  f.id = id;
  f.status = status;
  f.method = method;
  f.route = route;
  f.payload = reinterpret_cast<const uint8_t *>(payload.data());
  f.size = uint32_t(payload.size());
  std::string out;
  chi::ipc::encode_frame(f, &out);
  return out;
}

struct RawDealer {
  void *ctx = zmq_ctx_new();
  void *sock = nullptr;
  // routing_id: the identity the ROUTER knows it by (else one of libzmq's).
  explicit RawDealer(const std::string &address, const std::string &routing_id = "") {
    sock = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0, timeout = 10000;
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(sock, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    if (!routing_id.empty()) zmq_setsockopt(sock, ZMQ_ROUTING_ID, routing_id.data(), routing_id.size());
    assert_int_equal(zmq_connect(sock, address.c_str()), 0);
  }
  ~RawDealer() {
    zmq_close(sock);
    zmq_ctx_term(ctx);
  }
  void send(const std::string &bytes, bool more = false) {
    assert_true(zmq_send(sock, bytes.data(), bytes.size(), more ? ZMQ_SNDMORE : 0) >= 0);
  }
  void send(chi::ipc::Kind kind, uint64_t id, uint32_t method, int32_t route, const std::string &payload) {
    send(frame_bytes(kind, id, payload, 0, method, route));
  }
  // The next reply frame, decoded (a part may batch several: the rest wait
  // for the next call); its payload stays valid until then; false on timeout.
  std::string rx;
  size_t rx_off = 0;
  bool recv(chi::ipc::Frame *f, std::string * = nullptr) {
    std::string *buf = &rx;
    if (rx_off >= buf->size()) {
      buf->assign(chi::ipc::kFrameHeader + chi::ipc::kMaxFramePayload, '\0');
      int n = zmq_recv(sock, buf->data(), buf->size(), 0);
      if (n < 0) return false;
      buf->resize(size_t(n));
      rx_off = 0;
    }
    std::string why;
    size_t used = 0;
    assert_status(CHI_OK, chi::ipc::decode_next_frame(buf->data() + rx_off, buf->size() - rx_off, f, &used, &why));
    rx_off += used;
    return true;
  }
  // Returns the session id the server gave.
  uint32_t hello() {
    chi::ipc::Hello h{chi::ipc::kProtocolVersion, chi_version(), chi::ipc::kSessionTasks, 0};
    send(chi::ipc::Kind::kHello, 1ull << 63, 0, 0, std::string(reinterpret_cast<char *>(&h), sizeof h));
    chi::ipc::Frame f;
    assert_true(recv(&f));
    assert_int_equal(int(f.kind), int(chi::ipc::Kind::kWelcome));
    assert_int_equal(f.status, CHI_OK);
    chi::ipc::Welcome w{};
    assert_true(f.size >= sizeof w);
    memcpy(&w, f.payload, sizeof w);
    return w.session_id;
  }
};

// A server that closes one session (a Gone frame that is not its stop:
// status CHI_ERR_PROTOCOL and a reason): the client's calls answer
// CHI_ERR_DISCONNECTED and its message gives the server's reason, with
// bytes that are not printable shown as '?'.  A fake ROUTER plays the
// server: it welcomes the client, then answers its first submit so.
void test_gone_reason(void **) {
  if (g_transport != "ipc") return skip();  // one ZeroMQ transport is enough
  const std::string address = unique_name("fake");
  void *ctx = zmq_ctx_new();
  void *router = zmq_socket(ctx, ZMQ_ROUTER);
  int linger = 0, timeout = 10000;
  zmq_setsockopt(router, ZMQ_LINGER, &linger, sizeof linger);
  zmq_setsockopt(router, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
  assert_int_equal(zmq_bind(router, address.c_str()), 0);
  std::atomic<int> served{0};
  std::thread fake([&] {
    using chi::ipc::Kind;
    auto answer = [&](const std::string &id, Kind kind, uint64_t fid, int32_t status, const std::string &body) {
      const std::string out = frame_bytes(kind, fid, body, status);
      zmq_send(router, id.data(), id.size(), ZMQ_SNDMORE);
      zmq_send(router, out.data(), out.size(), 0);
    };
    for (int step = 0; step < 2; ++step) {
      char id[256], body[chi::ipc::kFrameHeader + 4096];
      const int idn = zmq_recv(router, id, sizeof id, 0);
      const int n = idn > 0 ? zmq_recv(router, body, sizeof body, 0) : -1;
      if (n <= 0) return;
      chi::ipc::Frame f;
      size_t used = 0;
      std::string why;
      if (chi::ipc::decode_next_frame(body, size_t(n), &f, &used, &why) != CHI_OK) return;
      const std::string who(id, size_t(idn));
      if (f.kind == Kind::kHello) {
        chi::ipc::Welcome w{};
        w.protocol = chi::ipc::kProtocolVersion;
        w.library_version = CHI_VERSION_NUMBER;
        w.nslots = 16;
        w.max_payload = 1024;
        w.method_limit = 64;
        w.session_id = 1;
        answer(who, Kind::kWelcome, f.id, CHI_OK, std::string(reinterpret_cast<const char *>(&w), sizeof w));
      } else if (f.kind == Kind::kSubmit) {
        answer(who, Kind::kGone, 0, CHI_ERR_PROTOCOL, std::string("no session:\x01 say hello\n"));
      }
      served.fetch_add(1);
    }
  });
  chi_runtime_t *c = connect_client(address);
  chi_future_t fu;
  chi_status_t st = chi_submit(c, CHI_ROUTE_CPU, CHI_METHOD_ECHO, "x", 1, &fu);
  if (st == CHI_OK) st = chi_wait(c, fu, -1, nullptr, 0, nullptr);
  fake.join();
  assert_int_equal(served.load(), 2);
  assert_status(CHI_ERR_DISCONNECTED, st);
  const std::string msg = chi_last_error_message();
  if (msg.find("the server closed the session: no session:? say hello?") == std::string::npos)
    fail_msg("message: '%s'", msg.c_str());
  // Later calls say the same, and the runtime ends cleanly.
  assert_status(CHI_ERR_DISCONNECTED, chi_submit(c, CHI_ROUTE_CPU, CHI_METHOD_ECHO, "x", 1, &fu));
  assert_non_null(strstr(chi_last_error_message(), "closed the session"));
  assert_status(CHI_OK, chi_finalize(c));
  zmq_close(router);
  zmq_ctx_term(ctx);
}

void test_malformed_frames(void **) {
  if (g_transport == "shm") return skip();  // test_garbage_in_segment covers shared memory
  ServerFixture f = start_server();
  chi_runtime_t *honest = connect_client(f.address);
  std::atomic<bool> done{false};
  std::atomic<long> bad{0};
  std::thread t([&] {
    for (uint64_t i = 0; !done.load(); ++i) {
      uint64_t in[2] = {i, 5}, out = 0;
      chi_future_t fu;
      if (chi_submit(honest, CHI_ROUTE_CPU, CHI_METHOD_ADD, in, sizeof in, &fu) != CHI_OK ||
          chi_wait(honest, fu, -1, &out, sizeof out, nullptr) != CHI_OK || out != i + 5)
        ++bad;
    }
  });
  using chi::ipc::Kind;
  chi::ipc::Frame r;
  std::string buf;
  {
    // Version skew: refused with both versions named.
    RawDealer d(f.address);
    chi::ipc::Hello h{chi::ipc::kProtocolVersion + 3, 9900, chi::ipc::kSessionTasks, 0};
    d.send(Kind::kHello, 1ull << 63, 0, 0, std::string(reinterpret_cast<char *>(&h), sizeof h));
    assert_true(d.recv(&r, &buf));
    assert_int_equal(r.status, CHI_ERR_PROTOCOL);
    std::string msg(reinterpret_cast<const char *>(r.payload) + sizeof(chi::ipc::Welcome),
                    r.size - sizeof(chi::ipc::Welcome));
    assert_true(msg.find("0.99.0") != std::string::npos && msg.find(chi_version_string()) != std::string::npos);
  }
  {
    // Bad requests in well-formed frames: a status each, the session lives.
    RawDealer d(f.address);
    d.hello();
    struct Case {
      uint32_t method;
      int32_t route;
      size_t size;
      int32_t want;
    } cases[] = {{999999, CHI_ROUTE_CPU, 8, CHI_ERR_NOT_FOUND},
                 {CHI_METHOD_ECHO, CHI_ROUTE_CPU, 4097, CHI_ERR_TOO_LARGE},
                 {CHI_METHOD_ECHO, -77, 8, CHI_ERR_INVALID},
                 {CHI_METHOD_ECHO, 3, 8, CHI_ERR_NO_DEVICE},
                 {CHI_METHOD_ECHO, CHI_ROUTE_CPU, 8, CHI_OK}};
    uint64_t id = 1;
    for (const Case &k : cases) {
      d.send(Kind::kSubmit, id, k.method, k.route, std::string(k.size, 'x'));
      assert_true(d.recv(&r, &buf));
      assert_int_equal(int(r.kind), int(Kind::kResult));
      assert_int_equal(r.id, id);
      assert_int_equal(r.status, k.want);
      ++id;
    }
    // A batch: three submits in one part, three results (in one part or more).
    std::string batch;
    for (uint64_t k = 0; k < 3; ++k) {
      uint64_t in[2] = {k, 100};
      chi::ipc::Frame g;
      g.kind = Kind::kSubmit;
      g.id = 100 + k;
      g.method = CHI_METHOD_ADD;
      g.route = CHI_ROUTE_CPU;
      g.payload = reinterpret_cast<const uint8_t *>(in);
      g.size = sizeof in;
      chi::ipc::append_frame(g, &batch);
    }
    d.send(batch);
    for (uint64_t k = 0; k < 3; ++k) {
      assert_true(d.recv(&r, &buf));
      assert_int_equal(int(r.kind), int(Kind::kResult));
      assert_int_equal(r.id, 100 + k);
      assert_int_equal(r.status, CHI_OK);
      uint64_t sum = 0;
      assert_int_equal(r.size, sizeof sum);
      memcpy(&sum, r.payload, sizeof sum);
      assert_int_equal(sum, k + 100);
    }
  }
  // Frames no honest peer sends: the session (if any) ends with kGone.
  std::string good;
  {
    chi::ipc::Frame g;
    g.kind = Kind::kSubmit;
    chi::ipc::encode_frame(g, &good);
  }
  std::vector<std::string> junk = {"", "x", std::string(31, '\0'), "GET / HTTP/1.0\r\n\r\n"};
  std::string bad_magic = good, bad_version = good, bad_kind = good, bad_size = good + "extra";
  bad_magic[0] ^= 1;
  bad_version[4] = 9;
  bad_kind[6] = 77;
  junk.insert(junk.end(), {bad_magic, bad_version, bad_kind, bad_size});
  uint64_t seed = 42;
  for (int i = 0; i < 64; ++i) {
    std::string rnd(size_t(chi_test_rand(&seed) % 200), '\0');
    for (char &c : rnd) c = char(chi_test_rand(&seed));
    if (rnd.size() >= 4 && i % 2) memcpy(rnd.data(), &chi::ipc::kFrameMagic, 4);
    junk.push_back(rnd);
  }
  for (const std::string &j : junk) {
    RawDealer d(f.address);
    d.hello();
    d.send(j);
    // A well-formed frame before the junk (bad_size) gets its result first.
    do assert_true(d.recv(&r, &buf));
    while (r.kind == Kind::kResult);
    assert_int_equal(int(r.kind), int(Kind::kGone));
  }
  {
    // Submit without hello; multi-part requests.
    RawDealer d(f.address);
    d.send(Kind::kSubmit, 5, CHI_METHOD_ECHO, CHI_ROUTE_CPU, "hi");
    assert_true(d.recv(&r, &buf));
    assert_int_equal(int(r.kind), int(Kind::kGone));
    RawDealer m(f.address);
    m.hello();
    m.send(good, true);
    m.send(good);
    assert_true(m.recv(&r, &buf));
    assert_int_equal(int(r.kind), int(Kind::kGone));
  }
  done.store(true);
  t.join();
  assert_int_equal(bad.load(), 0);
  assert_status(CHI_OK, chi_finalize(honest));
  assert_true(settle(f.rt, 0));
  assert_status(CHI_OK, chi_finalize(f.rt));
}

// A handler that holds its task until the test opens the gate.
std::atomic<bool> g_gate_open{false};
std::atomic<long> g_gate_started{0}, g_gate_done{0};
chi_status_t gate_handler(chi_request_t *req, void *) {
  g_gate_started.fetch_add(1);
  while (!g_gate_open.load()) usleep(1000);
  req->output_size = 0;
  g_gate_done.fetch_add(1);
  return CHI_OK;
}

// The row of client `id` in the server's status-json; "" when none.
std::string status_row(const std::string &address, uint32_t id) {
  static char reply[65536];
  assert_status(CHI_OK, chi_server_query(address.c_str(), "status-json", reply, sizeof reply, nullptr));
  const std::string all(reply), key = "{\"id\":" + std::to_string(id) + ",";
  const size_t at = all.find(key);
  return at == std::string::npos ? std::string() : all.substr(at, all.find('}', at) - at + 1);
}

// Waits until the server has answered every client task it took.
bool client_tasks_settled(chi_runtime_t *server) {
  for (int i = 0; i < 3000; ++i) {
    if (stats_of(server).routes[CHI_STATS_CLIENT].in_flight == 0) return true;
    usleep(10000);
  }
  return false;
}

// status-json's "leaving" list (clients gone whose tasks still run).
std::string leaving(const std::string &address) {
  static char reply[65536];
  assert_status(CHI_OK, chi_server_query(address.c_str(), "status-json", reply, sizeof reply, nullptr));
  const char *at = strstr(reply, "\"leaving\":[");
  assert_non_null(at);
  return std::string(at + 11, strchr(at, ']') - at - 11);
}

// A ZeroMQ peer evicted (malformed frame, or bye) while a task of its runs,
// that says hello again on the same connection, gets a new session which
// owes nothing: the old task's end neither reaches that session nor moves
// its in-flight count (it once wrapped to 2^32-1, the peer's next submit was
// parked for good and the listener served no ZeroMQ client any more).  The
// same for another peer that connects with the identity of one that left.
void test_rehello_after_eviction(void **) {
  if (g_transport == "shm") return skip();  // a ZeroMQ session's identity
  ServerFixture f = start_server();
  chi_method_t gate = 0;
  assert_status(CHI_OK, chi_register_handler(f.rt, "test.gate", gate_handler, nullptr, &gate));
  using chi::ipc::Kind;
  enum How { kJunk, kBye, kOtherPeer };
  for (const How how : {kJunk, kBye, kOtherPeer}) {
    g_gate_open.store(false);
    const long started = g_gate_started.load();
    const std::string identity = "peer-" + std::to_string(getpid()) + "-" + std::to_string(int(how));
    auto d = std::make_unique<RawDealer>(f.address, identity);
    const uint32_t first = d->hello();
    d->send(Kind::kSubmit, 7, gate, CHI_ROUTE_CPU, "x");
    while (g_gate_started.load() == started) usleep(1000);  // a worker runs it: it cannot be cancelled
    chi::ipc::Frame r;
    if (how == kBye) {
      d->send(Kind::kBye, 0, 0, 0, "");
    } else if (how == kJunk) {
      d->send("not a frame");
      assert_true(d->recv(&r));
      assert_int_equal(int(r.kind), int(Kind::kGone));
    } else {
      // Gone: once the server has seen it, another peer takes its identity.
      d.reset();
      for (int i = 0; i < 3000 && stats_of(f.rt).clients != 0; ++i) usleep(10000);
      assert_int_equal(stats_of(f.rt).clients, 0);
      d = std::make_unique<RawDealer>(f.address, identity);
    }
    const uint32_t second = d->hello();
    assert_true(second != first);
    g_gate_open.store(true);
    assert_true(client_tasks_settled(f.rt));
    const std::string row = status_row(f.address, second);
    if (row.find("\"in_flight\":0") == std::string::npos)
      fail_msg("session %u after the old task ended: %s", second, row.c_str());
    // The new session is served; the old task's result never reaches it.
    uint64_t in[2] = {40, 2};
    d->send(Kind::kSubmit, 8, CHI_METHOD_ADD, CHI_ROUTE_CPU, std::string(reinterpret_cast<char *>(in), sizeof in));
    do {
      assert_true(d->recv(&r));
      assert_int_equal(int(r.kind), int(Kind::kResult));
      assert_int_not_equal(r.id, 7);
    } while (r.id != 8);
    assert_int_equal(r.status, CHI_OK);
    // So are other clients, and status.
    chi_runtime_t *c = connect_client(f.address);
    assert_int_equal(add(c, 5, 6), 11);
    assert_status(CHI_OK, chi_finalize(c));
    assert_true(status_row(f.address, second).find("\"in_flight\":0") != std::string::npos);
  }
  assert_true(settle(f.rt, 0));
  assert_status(CHI_OK, chi_finalize(f.rt));
}

// A client that leaves while a task of its runs is listed as leaving until
// that task ends: the same count decides when what it registered (client
// device memory, which the running handler may use) is unregistered and
// unmapped, no longer at disconnect.  (The unmapping itself needs a GPU.)
void test_gone_client_kept_until_its_tasks_end(void **) {
  ServerFixture f = start_server();
  chi_method_t gate = 0;
  assert_status(CHI_OK, chi_register_handler(f.rt, "test.gate", gate_handler, nullptr, &gate));
  g_gate_open.store(false);
  const long started = g_gate_started.load();
  chi_runtime_t *c = connect_client(f.address);
  chi_future_t fu;
  assert_status(CHI_OK, chi_submit(c, CHI_ROUTE_CPU, gate, "x", 1, &fu));
  while (g_gate_started.load() == started) usleep(1000);
  assert_string_equal(leaving(f.address).c_str(), "");
  assert_status(CHI_OK, chi_finalize(c));
  std::string gone;
  for (int i = 0; i < 3000 && (gone = leaving(f.address)).empty(); ++i) usleep(10000);
  if (gone.find("\"in_flight\":1}") == std::string::npos) fail_msg("leaving: [%s]", gone.c_str());
  g_gate_open.store(true);
  for (int i = 0; i < 3000 && !(gone = leaving(f.address)).empty(); ++i) usleep(10000);
  assert_string_equal(gone.c_str(), "");
  assert_true(settle(f.rt, 0));
  assert_status(CHI_OK, chi_finalize(f.rt));
}

// A thread stopped by SIGUSR2 wherever it is, until the test lets it go.
std::atomic<bool> g_held{false}, g_let_go{false};
void hold_here(int) {
  g_held.store(true);
  while (!g_let_go.load()) {
    timespec ts{0, 1000000};
    nanosleep(&ts, nullptr);
  }
}

// True while thread `tid` of this process sleeps in a futex.
bool in_futex(pid_t tid) {
  const std::string path = "/proc/self/task/" + std::to_string(tid) + "/syscall";
  FILE *f = fopen(path.c_str(), "r");
  if (!f) return false;
  long nr = -1;
  const bool ok = fscanf(f, "%ld", &nr) == 1 && nr == SYS_futex;
  fclose(f);
  return ok;
}

// Two threads wait on one future; one takes the result and submits again,
// and the slot is used again before the other thread looks: that one lost
// a race with a consumer, CHI_ERR_INVALID (shm:// once blamed the server
// with CHI_ERR_PROTOCOL).  The loser is held by a signal while it waits,
// after it checked the future, so the order is certain.
void test_wait_loses_to_consumer(void **) {
#if defined(__SANITIZE_THREAD__)
  return skip();  // ThreadSanitizer defers signals: the loser would not stop in its wait
#endif
  ServerFixture f = start_server();
  chi_method_t gate = 0;
  assert_status(CHI_OK, chi_register_handler(f.rt, "test.gate", gate_handler, nullptr, &gate));
  g_gate_open.store(false);
  g_held.store(false);
  g_let_go.store(false);
  struct sigaction sa {}, old {};
  sa.sa_handler = hold_here;
  sigemptyset(&sa.sa_mask);
  assert_int_equal(sigaction(SIGUSR2, &sa, &old), 0);
  chi_runtime_t *c = connect_client(f.address);
  chi_future_t fu = 0;
  assert_status(CHI_OK, chi_submit(c, CHI_ROUTE_CPU, gate, "x", 1, &fu));
  std::atomic<pid_t> tid{0};
  std::atomic<int> lost{1};
  std::thread loser([&] {
    tid.store(pid_t(syscall(SYS_gettid)));
    lost.store(chi_wait(c, fu, -1, nullptr, 0, nullptr));
  });
  // Asleep on the task's word: past its check of the future.
  while (!tid.load() || !in_futex(tid.load())) usleep(1000);
  pthread_kill(loser.native_handle(), SIGUSR2);
  while (!g_held.load()) usleep(1000);
  g_gate_open.store(true);
  assert_status(CHI_OK, chi_wait(c, fu, -1, nullptr, 0, nullptr));
  chi_future_t next = 0;
  assert_status(CHI_OK, chi_submit(c, CHI_ROUTE_CPU, gate, "y", 1, &next));
  chi::FutureParts a{}, b{};
  assert_true(chi::decode_future(fu, &a) && chi::decode_future(next, &b));
  assert_int_equal(a.slot, b.slot);  // the same slot, used again
  g_let_go.store(true);
  loser.join();
  assert_status(CHI_ERR_INVALID, chi_status_t(lost.load()));
  assert_status(CHI_OK, chi_wait(c, next, -1, nullptr, 0, nullptr));
  sigaction(SIGUSR2, &old, nullptr);
  assert_status(CHI_OK, chi_finalize(c));
  assert_true(settle(f.rt, 0));
  assert_status(CHI_OK, chi_finalize(f.rt));
}

// Stateful protocol fuzzing: random sequences of frames per connection
// (hello, submits alone and batched, status, bye, junk, hello again, a second
// hello, a dropped connection) from several raw DEALERs at once, against a
// real ZeroMQ listener whose per-client limit is small, so that submits park.
// The protocol has no cancel frame: a session that leaves (bye, junk, a
// dropped connection) with tasks queued has them cancelled.  Each peer
// models what it may receive; after each sequence the server must have no
// client task, no CPU slot and no session left, answer status, and serve an
// honest client (which also runs beside the peers all along).
// $CHI_TEST_SEQUENCES sequences (default 20, times $CHI_TEST_SCALE),
// $CHI_TEST_SEED picks them.
class FuzzPeer {
 public:
  // What all peers did and got (printed at the end: the run did something).
  static inline long welcomes = 0, submits = 0, results = 0, late = 0, gones = 0;
  FuzzPeer(const std::string &address, int index, chi_method_t sleep)
      : address_(address), index_(index), sleep_(sleep) {
    open();
  }
  bool live() const { return live_; }
  uint32_t session() const { return session_; }

  void hello() {
    const bool twice = live_;
    chi::ipc::Hello h{chi::ipc::kProtocolVersion, chi_version(), chi::ipc::kSessionTasks, 0};
    d_->send(chi::ipc::Kind::kHello, 1ull << 63, 0, 0, std::string(reinterpret_cast<char *>(&h), sizeof h));
    // A second hello is refused (Gone) and the session goes on.
    chi::ipc::Frame f = await(twice ? chi::ipc::Kind::kGone : chi::ipc::Kind::kWelcome);
    if (twice) return;
    assert_int_equal(f.status, CHI_OK);
    chi::ipc::Welcome w{};
    memcpy(&w, f.payload, sizeof w);
    session_ = w.session_id;
    // From here a result of an earlier session is one too many.
    ++welcomes;
    ++epoch_;
    late_.clear();
    live_ = true;
  }
  // 1-4 submits in one message part.
  void submit(uint64_t *rng) {
    const int n = 1 + int(chi_test_rand(rng) % 4 == 0 ? chi_test_rand(rng) % 4 : 0);
    std::string part;
    for (int k = 0; k < n; ++k) {
      Want w;
      std::string in;
      chi::ipc::Frame g;
      g.kind = chi::ipc::Kind::kSubmit;
      g.id = (uint64_t(epoch_) << 32) | ++seq_;
      g.route = CHI_ROUTE_CPU;
      switch (chi_test_rand(rng) % 6) {
        case 0:
        case 1: {  // a task on a worker: cancellable while queued
          const uint64_t us = chi_test_rand(rng) % 2000;
          in.assign(reinterpret_cast<const char *>(&us), sizeof us);
          g.method = sleep_;
          break;
        }
        case 2: {
          in.assign(size_t(chi_test_rand(rng) % 64), char('a' + index_));
          g.method = CHI_METHOD_ECHO;
          w.out = in;
          break;
        }
        case 3: {
          const uint64_t ab[2] = {chi_test_rand(rng) % 1000, chi_test_rand(rng) % 1000};
          in.assign(reinterpret_cast<const char *>(ab), sizeof ab);
          g.method = CHI_METHOD_ADD;
          const uint64_t sum = ab[0] + ab[1];
          w.out.assign(reinterpret_cast<const char *>(&sum), sizeof sum);
          break;
        }
        case 4:
          g.method = 999999;
          w.status = CHI_ERR_NOT_FOUND;
          break;
        default:
          g.method = CHI_METHOD_ECHO;
          g.route = -77;
          w.status = CHI_ERR_INVALID;
          break;
      }
      g.payload = reinterpret_cast<const uint8_t *>(in.data());
      g.size = uint32_t(in.size());
      chi::ipc::append_frame(g, &part);
      ++submits;
      if (live_) want_[g.id] = w;
      if (!live_) break;  // without a session the first frame ends the part
    }
    d_->send(part);
    if (!live_) await(chi::ipc::Kind::kGone);
  }
  void status() {
    d_->send(frame_bytes(chi::ipc::Kind::kControl, 77, "", 0, uint32_t(chi::ipc::Op::kStatus), 0));
    chi::ipc::Frame f = await(live_ ? chi::ipc::Kind::kControlReply : chi::ipc::Kind::kGone);
    if (live_) assert_int_equal(f.status, CHI_OK);
  }
  void bye() {
    d_->send(chi::ipc::Kind::kBye, 0, 0, 0, "");
    if (!live_) {
      await(chi::ipc::Kind::kGone);
      return;
    }
    leave();  // no answer to a bye
  }
  void junk(uint64_t *rng) {
    std::string j(size_t(1 + chi_test_rand(rng) % 40), '\0');
    for (char &c : j) c = char(chi_test_rand(rng));
    d_->send(j);
    leave();
    await(chi::ipc::Kind::kGone);
  }
  void drop() {
    d_.reset();
    open();
  }
  // Every result the live session owes arrives.
  void drain() {
    while (live_ && !want_.empty()) take_one();
  }
  void close() { d_.reset(); }

 private:
  struct Want {
    int32_t status = CHI_OK;
    std::string out;
  };
  void open() {
    d_ = std::make_unique<RawDealer>(address_);
    live_ = false;
    want_.clear();
    late_.clear();
  }
  void leave() {
    // Results it owes may still come, until the next session starts.
    for (auto &kv : want_) late_.insert(kv.first);
    want_.clear();
    live_ = false;
  }
  // The next frame; a result is checked and consumed here.
  chi::ipc::Frame take_one() {
    chi::ipc::Frame f;
    if (!d_->recv(&f)) fail_msg("peer %d (session %u): no frame within the receive timeout", index_, session_);
    if (f.kind == chi::ipc::Kind::kGone) ++gones;
    if (f.kind != chi::ipc::Kind::kResult) return f;
    ++results;
    auto it = want_.find(f.id);
    if (it == want_.end()) {
      if (!late_.erase(f.id))
        fail_msg("peer %d (session %u): a result for id %#llx, which this session did not submit (or twice)",
                 index_, session_, (unsigned long long)f.id);
      ++late;
      return f;
    }
    if (f.status != it->second.status)
      fail_msg("peer %d: id %#llx answered %d, want %d", index_, (unsigned long long)f.id, f.status,
               it->second.status);
    if (f.status == CHI_OK && std::string(reinterpret_cast<const char *>(f.payload), f.size) != it->second.out)
      fail_msg("peer %d: id %#llx: wrong output", index_, (unsigned long long)f.id);
    want_.erase(it);
    return f;
  }
  chi::ipc::Frame await(chi::ipc::Kind kind) {
    for (;;) {
      chi::ipc::Frame f = take_one();
      if (f.kind == chi::ipc::Kind::kResult) continue;
      if (f.kind != kind) fail_msg("peer %d: frame kind %u, want %u", index_, unsigned(f.kind), unsigned(kind));
      return f;
    }
  }

  std::string address_;
  int index_;
  chi_method_t sleep_;
  std::unique_ptr<RawDealer> d_;
  bool live_ = false;
  uint32_t session_ = 0, epoch_ = 0, seq_ = 0;
  std::map<uint64_t, Want> want_;  // the live session's submits not answered yet
  std::set<uint64_t> late_;        // a session that left: results that may still come
};

void test_protocol_sequences(void **) {
  if (g_transport == "shm") return skip();
  const char *n_env = getenv("CHI_TEST_SEQUENCES");
  const char *seed_env = getenv("CHI_TEST_SEED");
  const long sequences = chi_test_scaled(n_env ? atol(n_env) : 20);
  uint64_t rng = seed_env ? strtoull(seed_env, nullptr, 0) : 0x5eed;
  if (!rng) rng = 1;
  print_message("  %ld sequences, seed %#llx\n", sequences, (unsigned long long)rng);
  ServerFixture f = start_server("server:\n  client_max_in_flight: 3\n");
  chi_runtime_t *honest = connect_client(f.address);
  std::atomic<bool> done{false};
  std::atomic<long> bad{0}, served{0};
  std::thread beside([&] {
    for (uint64_t i = 0; !done.load(); ++i) {
      uint64_t in[2] = {i, 7}, out = 0;
      chi_future_t fu;
      if (chi_submit(honest, CHI_ROUTE_CPU, CHI_METHOD_ADD, in, sizeof in, &fu) != CHI_OK ||
          chi_wait(honest, fu, -1, &out, sizeof out, nullptr) != CHI_OK || out != i + 7)
        ++bad;
      ++served;
      usleep(500);
    }
  });
  for (long n = 0; n < sequences; ++n) {
    std::vector<std::unique_ptr<FuzzPeer>> peers;
    for (int k = 0; k < 3; ++k) peers.push_back(std::make_unique<FuzzPeer>(f.address, k, f.sleep_method));
    for (int step = 0; step < 24; ++step) {
      FuzzPeer &p = *peers[chi_test_rand(&rng) % peers.size()];
      const unsigned r = unsigned(chi_test_rand(&rng) % 100);
      if (!p.live() && r < 70) p.hello();
      else if (r < 50) p.submit(&rng);
      else if (r < 62) p.status();
      else if (r < 72) p.bye();
      else if (r < 82) p.junk(&rng);
      else if (r < 88) p.hello();  // a second hello (or the first)
      else if (r < 94) p.drop();
      else p.submit(&rng);
    }
    for (auto &p : peers) {
      p->drain();
      // Its count went back to 0 (it once wrapped below 0 after a hello again).
      const std::string row = p->live() ? status_row(f.address, p->session()) : "";
      if (p->live() && row.find("\"in_flight\":0}") == std::string::npos)
        fail_msg("sequence %ld: session %u answered all, yet: %s", n, p->session(), row.c_str());
    }
    peers.clear();
    if (!settle(f.rt, 1)) {
      const chi_stats_t st = stats_of(f.rt);
      fail_msg("sequence %ld: clients %u, client tasks in flight %llu, CPU slots in use %llu", n, st.clients,
               (unsigned long long)st.routes[CHI_STATS_CLIENT].in_flight, (unsigned long long)st.slots_in_use);
    }
    // No session left behind with a count that never reaches 0.
    const std::string gone = leaving(f.address);
    if (!gone.empty()) fail_msg("sequence %ld: leaving: [%s]", n, gone.c_str());
    char reply[8192];
    assert_status(CHI_OK, chi_server_query(f.address.c_str(), "status", reply, sizeof reply, nullptr));
    const long before = served.load();
    while (served.load() < before + 2) usleep(1000);  // the honest client is served
  }
  done.store(true);
  beside.join();
  print_message("  %ld welcomes, %ld submits, %ld results (%ld after their session left), %ld gone; honest: %ld\n",
                FuzzPeer::welcomes, FuzzPeer::submits, FuzzPeer::results, FuzzPeer::late, FuzzPeer::gones,
                served.load());
  assert_int_equal(bad.load(), 0);
  assert_status(CHI_OK, chi_finalize(honest));
  assert_true(settle(f.rt, 0));
  assert_status(CHI_OK, chi_finalize(f.rt));
}

// Stateful protocol fuzzing of shm:// sessions, the shared-memory half of
// test_protocol_sequences: random sequences of actions per connection from
// several raw peers at once, against a real shm listener whose per-client
// limit is small (tasks park in the ring) and whose rings are short (their
// positions wrap).  A peer connects, says hello (a task or a control
// session; whole, a byte at a time, with a stray descriptor, or with a ping
// behind it in one write), sends a malformed hello, submits tasks through
// the ring (slow ones that run or wait, built-ins, bad methods, routes and
// sizes, a waiter's sleeper bit), sends control requests (status, ping,
// lookup, stats, device memory it does not have, unknown ones), a second
// hello, malformed messages, records no honest client writes, and closes
// its socket with tasks queued and running (the wire has no cancel: leaving
// cancels), then reconnects.  Each peer models every slot word of every
// segment it was given, live or left: a word moves only from the task the
// peer queued to its result, once; a consumed result's word is rewritten
// by the peer, so that a second one shows.  After each sequence: every live
// session's in-flight count is 0, the server has no client task in flight,
// no CPU slot in use, no session but the honest client's and none leaving,
// its descriptors are back to the count before the sequence, status
// answers, the honest client (running beside all along) is served, and
// every task of a session that left either has its right result or was
// never answered.  $CHI_TEST_SEQUENCES sequences (default 20, times
// $CHI_TEST_SCALE), $CHI_TEST_SEED picks them.
class ShmPeer {
 public:
  // What all peers did and got (printed at the end: the run did something).
  static inline long welcomes = 0, controls = 0, refusals = 0, cut_off = 0, submits = 0, results = 0, late = 0,
                     unanswered = 0, requests = 0, lagged = 0;
  enum State { kNone, kFresh, kTasks, kControl };

  ShmPeer(const std::string &address, int index, chi_method_t sleep, std::set<uint32_t> *ids)
      : address_(address), index_(index), sleep_(sleep), ids_(ids) {}
  State state() const { return state_; }

  void step(uint64_t *rng) {
    const unsigned r = unsigned(chi_test_rand(rng) % 100);
    switch (state_) {
      case kNone:
        return connect_peer();
      case kFresh:
        if (r < 65) return hello(rng);
        if (r < 90) return bad_hello(rng);
        return drop(rng);  // silent, or half a hello
      case kTasks:
        if (r < 45) return submit(rng);
        if (r < 57) return control(rng);
        if (r < 66) return collect(rng);
        if (r < 69) return hello(rng);  // a second hello
        if (r < 73) return junk(rng);
        if (r < 77) return violate(rng);
        if (r < 87) return drop(rng);
        return submit(rng);
      case kControl:
        if (r < 60) return control(rng);
        if (r < 70) return hello(rng);
        if (r < 80) return junk(rng);
        return drop(rng);
    }
  }

  // Every slot word of every segment still mapped is one the model allows.
  void scan() {
    for (auto &s : segs_) scan(*s);
  }

  // The live session's tasks are all answered, its in-flight count is 0; then
  // the peer closes everything but the mappings.
  void finish() {
    if (state_ == kTasks) {
      Seg &s = *segs_.back();
      const int64_t deadline = now_ns() + kGuardNs;
      while (s.out) {
        scan(s);
        if (now_ns() > deadline) fail_msg("peer %d (session %u): %u task(s) never answered", index_, s.session, s.out);
        usleep(100);
      }
      // The count drops just after the result is published (Session::finish):
      // it may lag the last result by a moment, never for good.
      auto idle = [](const std::string &row) {
        return row.find("\"in_flight\":0,") != std::string::npos || row.find("\"in_flight\":0}") != std::string::npos;
      };
      std::string row = status_row(address_, s.session);
      if (!idle(row)) ++lagged;
      for (int i = 0; i < 60000 && !idle(row); ++i) {
        usleep(1000);
        row = status_row(address_, s.session);
      }
      if (!idle(row)) fail_msg("peer %d: session %u answered all, yet: %s", index_, s.session, row.c_str());
    }
    close_socket();
  }

  // After the server settled and freed every session: nothing moves any more.
  // A task of a session that left has its right result or none.
  void final_check() {
    for (auto &s : segs_) {
      scan(*s);
      unanswered += s->out;
      munmap(s->v.base, s->v.layout.size);
    }
    segs_.clear();
  }

 private:
  static constexpr int64_t kGuardNs = 60ll * 1000000000;  // a hang guard, not a time bound
  struct Slot {
    uint32_t gen = 0;
    uint32_t idle = 0;  // what the word reads while no task of the slot is queued
    bool out = false;   // queued, no result seen yet
    int32_t status = CHI_OK;
    std::string want;
  };
  struct Seg {
    chi::ipc::SegmentView v;
    uint32_t session = 0;
    bool live = true;
    uint32_t out = 0;
    std::vector<Slot> slots;
  };
  enum class Got { kMsg, kEof };

  void connect_peer() {
    sock_ = raw_connect(address_);
    // Hang guards only: every wait here ends with an answer or EOF.
    timeval tv{60, 0};
    setsockopt(sock_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(sock_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    state_ = kFresh;
  }

  static std::string msg(chi::ipc::Kind kind, uint16_t op, uint32_t flags, const void *payload, uint32_t len) {
    chi::ipc::MsgHeader h{chi::ipc::kMsgMagic, uint16_t(kind), op, flags, len, 0};
    std::string m(reinterpret_cast<const char *>(&h), sizeof h);
    m.append(static_cast<const char *>(payload), len);
    return m;
  }

  // Sends bytes whole or in pieces, optionally with a descriptor the server
  // did not ask for (it must close it).  `refused`: the server may close the
  // connection before the last piece (a malformed header is enough).
  void send_bytes(const std::string &bytes, uint64_t *rng, bool pieces, bool stray_fd = false,
                  bool refused = false) {
    size_t at = 0;
    while (at < bytes.size()) {
      size_t n = bytes.size() - at;
      if (pieces) n = std::min(n, size_t(1 + chi_test_rand(rng) % 7));
      iovec iov{const_cast<char *>(bytes.data() + at), n};
      msghdr m{};
      m.msg_iov = &iov;
      m.msg_iovlen = 1;
      alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))];
      int extra = -1;
      if (stray_fd && at == 0) {
        extra = open("/dev/null", O_RDONLY | O_CLOEXEC);
        memset(ctrl, 0, sizeof ctrl);
        m.msg_control = ctrl;
        m.msg_controllen = sizeof ctrl;
        cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &extra, sizeof extra);
      }
      const ssize_t k = sendmsg(sock_, &m, MSG_NOSIGNAL);
      if (extra >= 0) close(extra);
      if (k < 0 && refused && (errno == EPIPE || errno == ECONNRESET)) return;
      if (k <= 0) fail_msg("peer %d: send: %s", index_, k < 0 ? strerror(errno) : "nothing sent");
      at += size_t(k);
    }
  }

  // One whole message (kMsg) or EOF; the descriptors it carried in fds.
  Got recv_msg(chi::ipc::MsgHeader *h, std::string *body, int fds[2]) {
    if (fds) fds[0] = fds[1] = -1;
    size_t got = 0;
    while (got < sizeof *h) {
      iovec iov{reinterpret_cast<char *>(h) + got, sizeof *h - got};
      alignas(cmsghdr) char ctrl[CMSG_SPACE(4 * sizeof(int))];
      msghdr m{};
      m.msg_iov = &iov;
      m.msg_iovlen = 1;
      m.msg_control = ctrl;
      m.msg_controllen = sizeof ctrl;
      const ssize_t n = recvmsg(sock_, &m, MSG_CMSG_CLOEXEC);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        fail_msg("peer %d: no answer from the server within the hang guard", index_);
      if (n <= 0) {
        if (got) fail_msg("peer %d: a torn message header (%zu bytes)", index_, got);
        return Got::kEof;  // EOF or ECONNRESET
      }
      for (cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); ++i) {
          int f;
          memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof f);
          if (fds && fds[0] < 0) fds[0] = f;
          else if (fds && fds[1] < 0) fds[1] = f;
          else fail_msg("peer %d: descriptors it did not expect", index_);
        }
      }
      got += size_t(n);
    }
    if (h->magic != chi::ipc::kMsgMagic || h->length > chi::ipc::kMaxMsgPayload)
      fail_msg("peer %d: a malformed message from the server", index_);
    body->assign(h->length, '\0');
    if (h->length && recv(sock_, body->data(), h->length, MSG_WAITALL) != ssize_t(h->length))
      fail_msg("peer %d: a torn message body", index_);
    return Got::kMsg;
  }

  chi::ipc::MsgHeader expect(chi::ipc::Kind kind, int32_t status, std::string *body, int fds[2] = nullptr) {
    chi::ipc::MsgHeader h{};
    if (recv_msg(&h, body, fds) == Got::kEof)
      fail_msg("peer %d (state %d): EOF, want message kind %u status %d", index_, int(state_), unsigned(kind), status);
    if (h.kind != uint16_t(kind) || h.status != status)
      fail_msg("peer %d (state %d): message kind %u status %d, want kind %u status %d", index_, int(state_),
               unsigned(h.kind), h.status, unsigned(kind), status);
    return h;
  }

  // The server ended the connection: nothing more comes, then EOF.
  void expect_eof(const char *after) {
    chi::ipc::MsgHeader h{};
    std::string body;
    if (recv_msg(&h, &body, nullptr) != Got::kEof)
      fail_msg("peer %d: a message of kind %u status %d after %s, want EOF", index_, unsigned(h.kind), h.status,
               after);
    if (state_ != kFresh) ++cut_off;
    end_session();
    close_socket();
  }

  void hello(uint64_t *rng) {
    const bool again = state_ != kFresh;
    const uint32_t kind = chi_test_rand(rng) % 5 == 0 ? chi::ipc::kSessionControl : chi::ipc::kSessionTasks;
    chi::ipc::Hello h{chi::ipc::kProtocolVersion, chi_version(), kind, 0};
    std::string m = msg(chi::ipc::Kind::kHello, 0, 0, &h, sizeof h);
    const unsigned how = unsigned(chi_test_rand(rng) % 4);
    // A ping behind the hello in one write: read after the session starts.
    const bool ping = how == 3 && !again;
    if (ping) m += msg(chi::ipc::Kind::kControl, uint16_t(chi::ipc::Op::kPing), 0, nullptr, 0);
    send_bytes(m, rng, how == 1, how == 2);
    std::string body;
    if (again) {
      // Not a control request: refused, and the session ends.
      expect(chi::ipc::Kind::kControlReply, CHI_ERR_PROTOCOL, &body);
      return expect_eof("a second hello");
    }
    int fds[2];
    expect(chi::ipc::Kind::kWelcome, CHI_OK, &body, fds);
    chi::ipc::Welcome w{};
    if (body.size() != sizeof w) fail_msg("peer %d: a welcome of %zu bytes", index_, body.size());
    memcpy(&w, body.data(), sizeof w);
    if (!ids_->insert(w.session_id).second) fail_msg("peer %d: session id %u given twice", index_, w.session_id);
    if (kind == chi::ipc::kSessionControl) {
      if (fds[0] >= 0 || fds[1] >= 0) fail_msg("peer %d: a control session got descriptors", index_);
      ++controls;
      state_ = kControl;
    } else {
      if (fds[0] < 0 || fds[1] < 0) fail_msg("peer %d: a task session without its segment", index_);
      auto s = std::make_unique<Seg>();
      s->session = w.session_id;
      s->v.layout = chi::ipc::segment_layout(w.nslots, w.max_payload);
      if (s->v.layout.size != w.segment_size) fail_msg("peer %d: segment size %llu", index_, (unsigned long long)w.segment_size);
      void *p = mmap(nullptr, s->v.layout.size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
      assert_true(p != MAP_FAILED);
      close(fds[0]);
      s->v.base = static_cast<uint8_t *>(p);
      if (s->v.header()->magic != chi::ipc::kSegmentMagic || s->v.header()->nslots != w.nslots)
        fail_msg("peer %d: a segment with a bad header", index_);
      s->slots.resize(w.nslots);
      segs_.push_back(std::move(s));
      bell_ = fds[1];
      ++welcomes;
      state_ = kTasks;
    }
    if (ping) {
      expect(chi::ipc::Kind::kControlReply, CHI_OK, &body);
      ++requests;
    }
  }

  // Each is refused with a reason (PROTOCOL), then EOF.
  void bad_hello(uint64_t *rng) {
    chi::ipc::Hello h{chi::ipc::kProtocolVersion, chi_version(), chi::ipc::kSessionTasks, 0};
    std::string m;
    switch (chi_test_rand(rng) % 8) {
      case 0: {  // not our magic
        m = msg(chi::ipc::Kind::kHello, 0, 0, &h, sizeof h);
        m[0] = char(m[0] ^ 0x5a);
        break;
      }
      case 1:  // another message first
        m = msg(chi::ipc::Kind::kControl, uint16_t(chi::ipc::Op::kStatus), 0, nullptr, 0);
        break;
      case 2:  // another protocol
        h.protocol += 1 + uint32_t(chi_test_rand(rng) % 100);
        m = msg(chi::ipc::Kind::kHello, 0, 0, &h, sizeof h);
        break;
      case 3:  // another major version of the library
        h.library_version += 10000;
        m = msg(chi::ipc::Kind::kHello, 0, 0, &h, sizeof h);
        break;
      case 4:  // short
        m = msg(chi::ipc::Kind::kHello, 0, 0, &h, uint32_t(chi_test_rand(rng) % sizeof h));
        break;
      case 5:  // an unknown session kind
        h.kind = 3 + uint32_t(chi_test_rand(rng) % 1000);
        m = msg(chi::ipc::Kind::kHello, 0, 0, &h, sizeof h);
        break;
      case 6: {  // more than a hello may hold (the header says so at once)
        m = msg(chi::ipc::Kind::kHello, 0, 0, nullptr, 0);
        const uint32_t len = 257 + uint32_t(chi_test_rand(rng) % 100000);
        memcpy(&m[offsetof(chi::ipc::MsgHeader, length)], &len, sizeof len);
        break;
      }
      default: {  // a kind outside the enum
        m = msg(chi::ipc::Kind::kHello, 0, 0, &h, sizeof h);
        const uint16_t k = chi_test_rand(rng) % 2 ? 0 : uint16_t(chi::ipc::kLastKind + 1 + chi_test_rand(rng) % 100);
        memcpy(&m[offsetof(chi::ipc::MsgHeader, kind)], &k, sizeof k);
        break;
      }
    }
    send_bytes(m, rng, chi_test_rand(rng) % 3 == 0, false, true);
    std::string body;
    expect(chi::ipc::Kind::kWelcome, CHI_ERR_PROTOCOL, &body);
    ++refusals;
    expect_eof("a refusal");
  }

  Seg &live() { return *segs_.back(); }

  // A free slot of the live segment (waits for a result when none is).
  uint32_t free_slot(uint64_t pick) {
    Seg &s = live();
    const int64_t deadline = now_ns() + kGuardNs;
    while (s.out == s.slots.size()) {
      scan(s);
      if (now_ns() > deadline) fail_msg("peer %d: no slot came free", index_);
      usleep(100);
    }
    uint32_t i = uint32_t(pick % s.slots.size());
    while (s.slots[i].out) i = (i + 1) % uint32_t(s.slots.size());
    return i;
  }

  void push(uint32_t slot, bool *ring) {
    const int64_t deadline = now_ns() + kGuardNs;
    auto alive = [&] {
      if (now_ns() > deadline) fail_msg("peer %d: a ring cell never came free", index_);
      return true;
    };
    bool r = false;
    chi::ipc::ring_push(live().v, slot, alive, &r);
    *ring = *ring || r;
  }

  void doorbell(bool ring, uint64_t *rng) {
    // A spurious ring now and then: harmless.
    if (!ring && chi_test_rand(rng) % 8) return;
    uint64_t one = 1;
    if (write(bell_, &one, sizeof one) < 0 && errno != EAGAIN) fail_msg("peer %d: doorbell: %s", index_, strerror(errno));
  }

  // 1-4 tasks, one doorbell.
  void submit(uint64_t *rng) {
    Seg &s = live();
    const int n = 1 + int(chi_test_rand(rng) % 3 == 0 ? chi_test_rand(rng) % 4 : 0);
    bool ring = false;
    for (int k = 0; k < n; ++k) {
      const uint32_t i = free_slot(chi_test_rand(rng));
      Slot &sl = s.slots[i];
      sl.gen = (sl.gen + 1) & chi::ipc::kSlotGenMask;
      sl.status = CHI_OK;
      sl.want.clear();
      std::string in;
      uint32_t method = CHI_METHOD_ECHO, size = 0;
      int32_t route = CHI_ROUTE_CPU;
      switch (chi_test_rand(rng) % 8) {
        case 0:
        case 1:
        case 2: {  // on a worker, long enough to be running or queued when the peer leaves
          const uint64_t us = chi_test_rand(rng) % 3000;
          in.assign(reinterpret_cast<const char *>(&us), sizeof us);
          method = sleep_;
          break;
        }
        case 3: {
          const uint32_t max = s.v.layout.max_payload;
          in.assign(chi_test_rand(rng) % 4 == 0 ? max : size_t(chi_test_rand(rng) % 200), char('a' + index_));
          for (char &c : in) c = char(c + chi_test_rand(rng) % 3);
          sl.want = in;
          break;
        }
        case 4: {
          const uint64_t ab[2] = {chi_test_rand(rng) % 100000, chi_test_rand(rng) % 100000};
          in.assign(reinterpret_cast<const char *>(ab), sizeof ab);
          method = CHI_METHOD_ADD;
          const uint64_t sum = ab[0] + ab[1];
          sl.want.assign(reinterpret_cast<const char *>(&sum), sizeof sum);
          break;
        }
        case 5:
          method = chi_test_rand(rng) % 2 ? 0 : 999999;
          sl.status = CHI_ERR_NOT_FOUND;
          break;
        case 6:
          route = -77;
          sl.status = CHI_ERR_INVALID;
          break;
        default:  // an input over the slot: its size is all the server may read
          size = s.v.layout.max_payload + 1 + uint32_t(chi_test_rand(rng) % 0x7FFFFFFF);
          sl.status = CHI_ERR_TOO_LARGE;
          break;
      }
      if (size) {
        chi::ipc::SlotHeader *h = s.v.slot(i);
        h->method = method;
        h->route = route;
        h->input_size = size;
        h->state.store(chi::ipc::slot_word(sl.gen, chi::ipc::kSlotSubmitted), std::memory_order_relaxed);
      } else {
        chi::ipc::post_task(s.v, i, sl.gen, method, route, in.data(), uint32_t(in.size()));
      }
      // A client thread waiting on the word sets the sleeper bit: the result
      // clears it.
      if (chi_test_rand(rng) % 4 == 0) s.v.slot(i)->state.fetch_or(chi::ipc::kSlotSleeper);
      sl.out = true;
      ++s.out;
      ++submits;
      push(i, &ring);
    }
    doorbell(ring, rng);
  }

  // Waits for some of the live session's results.
  void collect(uint64_t *rng) {
    Seg &s = live();
    const uint64_t pick = chi_test_rand(rng);
    const uint32_t want = s.out ? uint32_t(pick % s.out) : 0;
    const int64_t deadline = now_ns() + kGuardNs;
    while (s.out > want) {
      scan(s);
      if (now_ns() > deadline) fail_msg("peer %d (session %u): results never came", index_, s.session);
      usleep(100);
    }
  }

  void control(uint64_t *rng) {
    using chi::ipc::Op;
    Op op = Op::kPing;
    uint32_t flags = 0;
    std::string payload;
    int32_t want = CHI_OK;
    size_t want_size = 0;  // reply bytes, when fixed
    bool fixed = true;
    uint32_t method = 0;
    switch (chi_test_rand(rng) % 10) {
      case 0:
        op = Op::kStatus;
        flags = chi_test_rand(rng) % 2 ? chi::ipc::kStatusJson : 0;
        fixed = false;
        break;
      case 1:
        op = Op::kPing;
        break;
      case 2:
        op = Op::kLookup;
        payload = "test.sleep";
        want_size = sizeof(chi::ipc::MethodReply);
        method = sleep_;
        break;
      case 3:
        op = Op::kLookup;
        payload = chi_test_rand(rng) % 2 ? std::string("no.such.method") : std::string("bad\0name", 8);
        want = CHI_ERR_NOT_FOUND;
        fixed = false;
        break;
      case 4:
        op = Op::kMethodLimit;
        want_size = sizeof(chi::ipc::MethodReply);
        break;
      case 5:
        op = Op::kStats;
        want_size = sizeof(chi_stats_t);
        break;
      case 6: {  // device memory this server cannot have: refused (a short export: PROTOCOL)
        op = Op::kRegisterGpuMem;
        chi::ipc::GpuMemExport x{};
        x.version = chi::ipc::kGpuMemVersion;
        x.size = chi_test_rand(rng) % 2 ? 0 : 4096;
        payload.assign(reinterpret_cast<const char *>(&x), chi_test_rand(rng) % 3 ? sizeof x : sizeof x / 2);
        want = 1;  // any failure
        fixed = false;
        break;
      }
      case 7: {
        op = Op::kUnregisterMem;
        const chi::ipc::RegionReply r{chi_test_rand(rng)};
        payload.assign(reinterpret_cast<const char *>(&r), sizeof r);
        want = 1;
        fixed = false;
        break;
      }
      default: {  // not a request: refused, and the session ends
        const uint16_t unknown[] = {0, 1, 2, 11, 12, 999, 0xFFFF};
        op = Op(unknown[chi_test_rand(rng) % 7]);
        want = CHI_ERR_PROTOCOL;
        fixed = false;
        break;
      }
    }
    send_bytes(msg(chi::ipc::Kind::kControl, uint16_t(op), flags, payload.data(), uint32_t(payload.size())), rng,
               chi_test_rand(rng) % 4 == 0);
    chi::ipc::MsgHeader h{};
    std::string body;
    if (recv_msg(&h, &body, nullptr) == Got::kEof) fail_msg("peer %d: EOF for control op %u", index_, unsigned(op));
    if (h.kind != uint16_t(chi::ipc::Kind::kControlReply))
      fail_msg("peer %d: op %u answered with kind %u", index_, unsigned(op), unsigned(h.kind));
    ++requests;
    if (want == 1 ? h.status == CHI_OK : h.status != want)
      fail_msg("peer %d: op %u answered %d, want %s%d", index_, unsigned(op), h.status, want == 1 ? "a failure, not " : "",
               want == 1 ? CHI_OK : want);
    if (h.status == CHI_OK && fixed && body.size() != want_size)
      fail_msg("peer %d: op %u answered %zu bytes, want %zu", index_, unsigned(op), body.size(), want_size);
    if (h.status == CHI_OK && op == Op::kStatus && body.empty()) fail_msg("peer %d: an empty status", index_);
    if (method) {
      chi::ipc::MethodReply m{};
      memcpy(&m, body.data(), sizeof m);
      if (m.method != method) fail_msg("peer %d: lookup answered method %u, want %u", index_, m.method, method);
    }
    if (h.status == CHI_ERR_PROTOCOL) expect_eof("a refused request");
  }

  // A malformed message on a session: cut off, with a refusal first when the
  // header is well formed.
  void junk(uint64_t *rng) {
    std::string m = msg(chi::ipc::Kind::kControl, uint16_t(chi::ipc::Op::kPing), 0, nullptr, 0);
    bool reply = false;
    switch (chi_test_rand(rng) % 5) {
      case 0:
        m[1] = char(m[1] ^ 0x33);
        break;
      case 1: {
        const uint16_t k = chi_test_rand(rng) % 2 ? 0 : uint16_t(chi::ipc::kLastKind + 1 + chi_test_rand(rng) % 100);
        memcpy(&m[offsetof(chi::ipc::MsgHeader, kind)], &k, sizeof k);
        break;
      }
      case 2: {
        const uint32_t len = chi::ipc::kMaxMsgPayload + 1 + uint32_t(chi_test_rand(rng) % 100000);
        memcpy(&m[offsetof(chi::ipc::MsgHeader, length)], &len, sizeof len);
        break;
      }
      case 3: {  // a kind of the ZeroMQ channel or the server's
        const chi::ipc::Kind ks[] = {chi::ipc::Kind::kWelcome, chi::ipc::Kind::kSubmit, chi::ipc::Kind::kResult,
                                     chi::ipc::Kind::kControlReply, chi::ipc::Kind::kBye, chi::ipc::Kind::kGone};
        const uint16_t k = uint16_t(ks[chi_test_rand(rng) % 6]);
        memcpy(&m[offsetof(chi::ipc::MsgHeader, kind)], &k, sizeof k);
        reply = true;
        break;
      }
      default:  // half a message, then the peer goes
        m.resize(1 + chi_test_rand(rng) % (sizeof(chi::ipc::MsgHeader) - 1));
        send_bytes(m, rng, false);
        return drop(rng);
    }
    send_bytes(m, rng, chi_test_rand(rng) % 3 == 0, false, true);
    if (reply) {
      std::string body;
      expect(chi::ipc::Kind::kControlReply, CHI_ERR_PROTOCOL, &body);
    }
    expect_eof("a malformed message");
  }

  // Records no honest client writes: each ends the session (the poller
  // reaches them after the tasks queued before).
  void violate(uint64_t *rng) {
    Seg &s = live();
    bool ring = false;
    // As many draws whatever the results so far: a seed picks the same steps.
    const unsigned what = unsigned(chi_test_rand(rng) % 3);
    const uint64_t a = chi_test_rand(rng), b = chi_test_rand(rng);
    if (what == 0 || (what == 2 && s.out == 0)) {
      push(uint32_t(s.slots.size() + a % 100000), &ring);
    } else if (what == 1) {
      // A free slot queued in a state other than submitted.
      const uint32_t i = free_slot(a);
      const uint32_t states[] = {chi::ipc::kSlotFree, chi::ipc::kSlotDone, 0x55, 0x7F};
      const uint32_t w = chi::ipc::slot_word(s.slots[i].gen, states[b % 4]);
      s.v.slot(i)->state.store(w);
      s.slots[i].idle = w;
      push(i, &ring);
    } else {
      // A slot queued again before its result was seen.
      uint32_t i = uint32_t(a % s.slots.size());
      while (!s.slots[i].out) i = (i + 1) % uint32_t(s.slots.size());
      push(i, &ring);
    }
    doorbell(true, rng);
    expect_eof("a bad record");
  }

  // Closes the socket with whatever is queued or running (the server
  // cancels what no worker started); the mapping stays for the checks, or
  // goes too.
  void drop(uint64_t *rng) {
    if (state_ == kFresh && chi_test_rand(rng) % 2) {  // half a hello
      chi::ipc::Hello h{chi::ipc::kProtocolVersion, chi_version(), chi::ipc::kSessionTasks, 0};
      const std::string m = msg(chi::ipc::Kind::kHello, 0, 0, &h, sizeof h);
      send_bytes(m.substr(0, 1 + chi_test_rand(rng) % (m.size() - 1)), rng, false);
    }
    if (state_ == kTasks && chi_test_rand(rng) % 4 == 0) {
      unanswered += live().out;
      munmap(live().v.base, live().v.layout.size);
      segs_.pop_back();
      state_ = kNone;
    }
    end_session();
    close_socket();
  }

  void end_session() {
    if (state_ == kTasks) live().live = false;
    if (bell_ >= 0) close(bell_);
    bell_ = -1;
  }

  void close_socket() {
    end_session();
    if (sock_ >= 0) close(sock_);
    sock_ = -1;
    state_ = kNone;
  }

  void scan(Seg &s) {
    for (uint32_t i = 0; i < s.slots.size(); ++i) {
      Slot &sl = s.slots[i];
      chi::ipc::SlotHeader *h = s.v.slot(i);
      const uint32_t w = h->state.load(std::memory_order_acquire);
      if (!sl.out) {
        if (w != sl.idle)
          fail_msg("peer %d (session %u%s): slot %u's word became %#x (was %#x) with no task of it queued: a "
                   "result it did not ask for, or one twice",
                   index_, s.session, s.live ? "" : ", left", i, w, sl.idle);
        continue;
      }
      const uint32_t submitted = chi::ipc::slot_word(sl.gen, chi::ipc::kSlotSubmitted);
      if ((w & ~chi::ipc::kSlotSleeper) == submitted) continue;
      if (w != chi::ipc::slot_word(sl.gen, chi::ipc::kSlotDone))
        fail_msg("peer %d (session %u): slot %u (generation %u) has word %#x", index_, s.session, i, sl.gen, w);
      if (h->status != sl.status)
        fail_msg("peer %d (session %u): slot %u answered %d, want %d", index_, s.session, i, h->status, sl.status);
      if (sl.status == CHI_OK &&
          (h->output_size != sl.want.size() || memcmp(s.v.output(i), sl.want.data(), sl.want.size()) != 0))
        fail_msg("peer %d (session %u): slot %u: wrong output (%u bytes, want %zu)", index_, s.session, i,
                 h->output_size, sl.want.size());
      // Consumed: a second result for it would show.
      sl.idle = chi::ipc::slot_word(sl.gen, chi::ipc::kSlotFree);
      h->state.store(sl.idle, std::memory_order_relaxed);
      h->status = 0x5eed;
      sl.out = false;
      --s.out;
      ++(s.live ? results : late);
    }
  }

  std::string address_;
  int index_;
  chi_method_t sleep_;
  std::set<uint32_t> *ids_;
  State state_ = kNone;
  int sock_ = -1, bell_ = -1;
  std::vector<std::unique_ptr<Seg>> segs_;  // the live session's is last while state_ is kTasks
};

void test_shm_sequences(void **) {
  if (g_transport != "shm") return skip();
  const char *n_env = getenv("CHI_TEST_SEQUENCES");
  const char *seed_env = getenv("CHI_TEST_SEED");
  const long sequences = chi_test_scaled(n_env ? atol(n_env) : 20);
  uint64_t rng = seed_env ? strtoull(seed_env, nullptr, 0) : 0x5eed;
  if (!rng) rng = 1;
  print_message("  %ld sequences, seed %#llx\n", sequences, (unsigned long long)rng);
  // Short rings (their positions wrap), a small per-client limit (tasks
  // park in the ring), and a hello timeout no step reaches.  With
  // $CHI_TEST_WORKERS=1 the built-ins run on workers too (cancellable while
  // queued) instead of on the pollers.
  std::string yaml = "server:\n  client_max_in_flight: 3\n  client_slots: 8\n  hello_timeout_ms: 600000\n";
  const char *workers = getenv("CHI_TEST_WORKERS");
  if (workers && atoi(workers)) yaml += "  inline_builtins: false\n";
  ServerFixture f = start_server(yaml.c_str());
  chi_runtime_t *honest = connect_client(f.address);
  std::atomic<bool> done{false};
  std::atomic<long> bad{0}, served{0};
  std::thread beside([&] {
    for (uint64_t i = 0; !done.load(); ++i) {
      uint64_t in[2] = {i, 7}, out = 0;
      chi_future_t fu;
      if (chi_submit(honest, CHI_ROUTE_CPU, CHI_METHOD_ADD, in, sizeof in, &fu) != CHI_OK ||
          chi_wait(honest, fu, -1, &out, sizeof out, nullptr) != CHI_OK || out != i + 7)
        ++bad;
      ++served;
      usleep(500);
    }
  });
  std::set<uint32_t> ids;
  int fds = count_fds();
  uint64_t cancelled = stats_of(f.rt).tasks_cancelled;
  for (long n = 0; n < sequences; ++n) {
    const long unanswered = ShmPeer::unanswered;
    std::vector<std::unique_ptr<ShmPeer>> peers;
    const int npeers = 2 + int(chi_test_rand(&rng) % 3);
    for (int k = 0; k < npeers; ++k) peers.push_back(std::make_unique<ShmPeer>(f.address, k, f.sleep_method, &ids));
    const int steps = 16 + int(chi_test_rand(&rng) % 24);
    for (int step = 0; step < steps; ++step) {
      peers[chi_test_rand(&rng) % peers.size()]->step(&rng);
      for (auto &p : peers) p->scan();
    }
    for (auto &p : peers) p->finish();
    if (!settle(f.rt, 1)) {
      const chi_stats_t st = stats_of(f.rt);
      fail_msg("sequence %ld: clients %u, client tasks in flight %llu, CPU slots in use %llu", n, st.clients,
               (unsigned long long)st.routes[CHI_STATS_CLIENT].in_flight, (unsigned long long)st.slots_in_use);
    }
    // A session's own count drops just after the route's (Session::finish,
    // cancel_queued): a session may be listed as leaving a moment longer.
    std::string gone = leaving(f.address);
    for (int i = 0; i < 6000 && !gone.empty(); ++i) {
      usleep(10000);
      gone = leaving(f.address);
    }
    if (!gone.empty()) fail_msg("sequence %ld: leaving: [%s]", n, gone.c_str());
    // Every session freed (its socket, segment and doorbell closed), every
    // stray descriptor closed: then nothing writes the segments any more.
    int now = count_fds();
    for (int i = 0; i < 6000 && now > fds; ++i) {
      usleep(10000);
      now = count_fds();
    }
    if (now > fds) fail_msg("sequence %ld: %d descriptors open, %d before", n, now, fds);
    fds = now;  // the first count may have caught one the server was about to close
    for (auto &p : peers) p->final_check();
    // A task cancelled because its peer left is one that peer never saw answered.
    const uint64_t was = cancelled;
    cancelled = stats_of(f.rt).tasks_cancelled;
    if (cancelled - was > uint64_t(ShmPeer::unanswered - unanswered))
      fail_msg("sequence %ld: %llu task(s) cancelled, %ld never answered", n, (unsigned long long)(cancelled - was),
               ShmPeer::unanswered - unanswered);
    char reply[8192];
    assert_status(CHI_OK, chi_server_query(f.address.c_str(), "status", reply, sizeof reply, nullptr));
    const long before = served.load();
    while (served.load() < before + 2) usleep(1000);  // the honest client is served
  }
  done.store(true);
  beside.join();
  const chi_stats_t st = stats_of(f.rt);
  print_message("  %ld task sessions, %ld control sessions, %ld refused hellos, %ld cut off, %ld requests, %ld submits, "
                "%ld results (%ld after their session left, %ld never answered), %llu cancelled, %ld in-flight counts read before they dropped; honest: %ld\n",
                ShmPeer::welcomes, ShmPeer::controls, ShmPeer::refusals, ShmPeer::cut_off, ShmPeer::requests,
                ShmPeer::submits, ShmPeer::results, ShmPeer::late, ShmPeer::unanswered,
                (unsigned long long)st.tasks_cancelled, ShmPeer::lagged, served.load());
  assert_int_equal(bad.load(), 0);
  assert_status(CHI_OK, chi_finalize(honest));
  assert_true(settle(f.rt, 0));
  assert_status(CHI_OK, chi_finalize(f.rt));
}

std::string write_file(const std::string &name, const std::string &text, mode_t mode) {
  std::string path = g_dir + "/" + name;
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, mode);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, text.data(), text.size()), ssize_t(text.size()));
  close(fd);
  chmod(path.c_str(), mode);
  return path;
}

chi_status_t connect_yaml(const std::string &yaml, chi_runtime_t **rt) {
  std::string path = write_file("client-" + std::to_string(getpid()) + ".yaml", yaml, 0600);
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.config_path = path.c_str();
  *rt = nullptr;
  return chi_init(&cfg, rt);
}

// tcp:// with CURVE: the right key works; a wrong, missing or exposed key does not.
void test_curve(void **) {
  if (g_transport != "tcp") return skip();
  char spub[41], ssec[41], apub[41], asec[41], bpub[41], bsec[41];
  assert_int_equal(zmq_curve_keypair(spub, ssec), 0);
  assert_int_equal(zmq_curve_keypair(apub, asec), 0);
  assert_int_equal(zmq_curve_keypair(bpub, bsec), 0);
  std::string skey = write_file("server.key", std::string("# server\n") + ssec + "\n", 0600);
  std::string allowed = write_file("allowed", std::string("# clients\n") + apub + "\n", 0644);
  std::string akey = write_file("a.key", std::string(asec) + "\n", 0600);
  std::string bkey = write_file("b.key", std::string(bsec) + "\n", 0600);
  std::string loose = write_file("loose.key", std::string(asec) + "\n", 0644);
  std::string yaml = "server:\n  curve_key_file: " + skey + "\n  curve_allowed_keys_file: " + allowed + "\n";
  ServerFixture f = start_server(yaml.c_str());
  // A minute for the welcome: a loaded sanitizer run can take the default
  // 5 s over a CURVE handshake (refusals come as events, not timeouts).
  auto client_yaml = [&](const std::string &key_file, const char *server_key) {
    return "mode: client\nserver_address: " + f.address + "\ncurve_server_key: \"" + server_key +
           "\"\ncurve_key_file: " + key_file + "\nconnect_timeout_ms: 60000\n";
  };
  chi_runtime_t *c;
  assert_status(CHI_OK, connect_yaml(client_yaml(akey, spub), &c));
  assert_int_equal(add(c, 40, 2), 42);
  assert_status(CHI_OK, chi_finalize(c));
  assert_status(CHI_ERR_PERMISSION, connect_yaml(client_yaml(bkey, spub), &c));  // not allow-listed
  assert_has_message();
  assert_status(CHI_ERR_PERMISSION, connect_yaml(client_yaml(akey, bpub), &c));  // wrong server key
  assert_status(CHI_ERR_PERMISSION, connect_yaml(client_yaml(loose, spub), &c));  // loose key file
  assert_non_null(strstr(chi_last_error_message(), "mode 644"));
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.mode = CHI_MODE_CLIENT;
  cfg.server_address = f.address.c_str();
  chi_runtime_t *plain = nullptr;
  chi_status_t s = chi_init(&cfg, &plain);  // no CURVE at all
  assert_true(s == CHI_ERR_PERMISSION || s == CHI_ERR_DISCONNECTED);
  assert_null(plain);
  // A client with a server key but a libzmq without CURVE never connects in the clear.
  setenv("CHI_TEST_NO_CURVE", "1", 1);
  assert_status(CHI_ERR_CONFIG, connect_yaml(client_yaml(akey, spub), &c));
  unsetenv("CHI_TEST_NO_CURVE");
  assert_non_null(strstr(chi_last_error_message(), "no CURVE support"));
  assert_status(CHI_OK, chi_finalize(f.rt));
  // The server refuses a loose secret key (an exposed address without keys:
  // test_one_server_per_address).
  std::string loose_server = write_file("loose-server.key", std::string(ssec) + "\n", 0640);
  std::string bad = "server:\n  curve_key_file: " + loose_server + "\n  curve_allowed_keys_file: " + allowed + "\n";
  chi_runtime_t *rt = chi_test_init_yaml(1, bad.c_str());
  chi_server_t *srv;
  assert_status(CHI_ERR_PERMISSION, chi_server_start(rt, unique_name("curve").c_str(), &srv));
  assert_status(CHI_OK, chi_finalize(rt));
  // Half a CURVE configuration is refused, and so are keys with a libzmq
  // that lacks CURVE (CHI_TEST_NO_CURVE makes this one look so): the keys
  // would protect nothing.
  std::string half = "server:\n  curve_key_file: " + skey + "\n";
  rt = chi_test_init_yaml(1, half.c_str());
  assert_status(CHI_ERR_CONFIG, chi_server_start(rt, unique_name("half").c_str(), &srv));
  assert_non_null(strstr(chi_last_error_message(), "both"));
  assert_status(CHI_OK, chi_finalize(rt));
  rt = chi_test_init_yaml(1, yaml.c_str());
  setenv("CHI_TEST_NO_CURVE", "1", 1);
  assert_status(CHI_ERR_CONFIG, chi_server_start(rt, unique_name("nocurve").c_str(), &srv));
  unsetenv("CHI_TEST_NO_CURVE");
  assert_non_null(strstr(chi_last_error_message(), "no CURVE support"));
  assert_status(CHI_OK, chi_finalize(rt));
  // With keys, a server may listen beyond loopback.
  rt = chi_test_init_yaml(1, yaml.c_str());
  std::string any = unique_name("any");
  any.replace(any.find("127.0.0.1"), 9, "0.0.0.0");
  assert_status(CHI_OK, chi_server_start(rt, any.c_str(), &srv));
  assert_status(CHI_OK, chi_finalize(rt));
}

int child_server(const char *address) {
  // SIGTERM is taken by sigwait: block it before any thread starts, or a
  // worker thread would take it and die of it.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.gpus = 0;
  cfg.num_workers = 2;
  chi_runtime_t *rt;
  if (chi_init(&cfg, &rt) != CHI_OK) return 1;
  chi_method_t m;
  chi_register_handler(rt, "test.sleep", sleep_handler, nullptr, &m);
  chi_server_t *srv;
  if (chi_server_start(rt, address, &srv) != CHI_OK) return 1;
  int sig;
  sigwait(&set, &sig);
  return chi_finalize(rt) == CHI_OK ? 0 : 1;
}

int child_client(const char *address, int ready_fd) {
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.mode = CHI_MODE_CLIENT;
  cfg.server_address = address;
  chi_runtime_t *rt;
  if (chi_init(&cfg, &rt) != CHI_OK) return 1;
  chi_method_t slow;
  if (chi_method_lookup(rt, "test.sleep", &slow) != CHI_OK) return 1;
  // A window of short slow tasks, plus quick ones, then tell the parent.
  for (int i = 0; i < 16; ++i) {
    uint64_t us = 2000;
    chi_future_t f;
    chi_submit(rt, CHI_ROUTE_CPU, i % 2 ? slow : CHI_METHOD_ECHO, &us, sizeof us, &f);
  }
  ssize_t n = write(ready_fd, "r", 1);
  (void)n;
  for (;;) pause();
}

// Submits `tasks` tasks of 200 ms, tells the parent, and waits to be killed.
int child_slow(const char *address, long tasks, int ready_fd) {
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.mode = CHI_MODE_CLIENT;
  cfg.server_address = address;
  chi_runtime_t *rt;
  if (chi_init(&cfg, &rt) != CHI_OK) return 1;
  chi_method_t slow;
  if (chi_method_lookup(rt, "test.sleep", &slow) != CHI_OK) return 1;
  for (long i = 0; i < tasks; ++i) {
    uint64_t us = 200000;
    chi_future_t f;
    if (chi_submit(rt, CHI_ROUTE_CPU, slow, &us, sizeof us, &f) != CHI_OK) return 1;
  }
  ssize_t n = write(ready_fd, "r", 1);
  (void)n;
  for (;;) pause();
}

}  // namespace

int main(int argc, char **argv) {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return 1;
  self[n] = 0;
  g_self = self;
  if (argc >= 3 && !strcmp(argv[1], "child-server")) return child_server(argv[2]);
  if (argc >= 4 && !strcmp(argv[1], "child-client")) return child_client(argv[2], atoi(argv[3]));
  if (argc >= 5 && !strcmp(argv[1], "child-slow")) return child_slow(argv[2], atol(argv[3]), atoi(argv[4]));
  if (argc >= 5 && !strcmp(argv[1], "child-adder"))
    return child_adder(argv[2], atol(argv[3]), strtoull(argv[4], nullptr, 10));
  chi_test_clean_env();
  signal(SIGPIPE, SIG_IGN);
  char tmpl[] = "/tmp/chi-server-test-XXXXXX";
  if (!mkdtemp(tmpl)) return 1;
  g_dir = tmpl;
  setenv("CHI_RUNTIME_DIR", tmpl, 1);
  if (const char *t = getenv("CHI_TEST_TRANSPORT")) g_transport = t;
  if (g_transport != "shm" && g_transport != "ipc" && g_transport != "tcp") return 2;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trips_from_threads),
      cmocka_unit_test(test_one_server_per_address),
      cmocka_unit_test(test_stale_endpoint_taken_over),
      cmocka_unit_test(test_version_mismatch),
      cmocka_unit_test(test_max_clients),
      cmocka_unit_test(test_client_kill_loop),
      cmocka_unit_test(test_server_killed),
      cmocka_unit_test(test_silent_connections),
      cmocka_unit_test(test_graceful_stop),
      cmocka_unit_test(test_gone_reason),
      cmocka_unit_test(test_cancel_on_kill),
      cmocka_unit_test(test_prompt_stop),
      cmocka_unit_test(test_stop_under_load),
      cmocka_unit_test(test_garbage_in_segment),
      cmocka_unit_test(test_gpu_mem_messages),
      cmocka_unit_test(test_malformed_frames),
      cmocka_unit_test(test_rehello_after_eviction),
      cmocka_unit_test(test_wait_loses_to_consumer),
      cmocka_unit_test(test_gone_client_kept_until_its_tasks_end),
      cmocka_unit_test(test_protocol_sequences),
      cmocka_unit_test(test_shm_sequences),
      cmocka_unit_test(test_curve),
      cmocka_unit_test(test_poller_balance),
      cmocka_unit_test(test_many_clients),
      cmocka_unit_test(test_churn),
      cmocka_unit_test(test_gpu_route_through_server),
  };
  if (getenv("CHI_TEST_FILTER")) cmocka_set_test_filter(getenv("CHI_TEST_FILTER"));
  std::string group = "server over " + g_transport;
  int rc = cmocka_run_group_tests_name(group.c_str(), tests, nullptr, nullptr);
  std::string cleanup = "rm -rf " + g_dir;
  if (system(cleanup.c_str()) != 0) rc = rc ? rc : 1;
  return rc;
}

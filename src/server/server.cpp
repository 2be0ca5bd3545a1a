#include "server/server.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "base/error.h"
#include "core/futex.h"
#include "base/log.h"
#include "core/runtime.h"
#include "server/session.h"
#include "server/zmq_listener.h"
#include "ipc/handshake.h"

namespace chi {

namespace {

// Once a hello or control message has begun to arrive, its rest must follow
// within this (one sendmsg from an honest peer: it arrives whole).
constexpr int kMessageRestMs = 100;
constexpr unsigned kBatch = 32;  // tasks a poller takes from one session per turn

void signal_fd(int fd) {
  uint64_t one = 1;
  ssize_t r = write(fd, &one, sizeof one);
  (void)r;
}

void drain_fd(int fd) {
  uint64_t v;
  while (read(fd, &v, sizeof v) > 0) {
  }
}


}  // namespace

struct Server::Poller {
  std::thread thread;
  int epfd = -1;
  int wake = -1;
  std::mutex mu;
  std::vector<Session *> sessions;
  std::atomic<bool> changed{false};
  std::atomic<uint64_t> epoch{0};
  ~Poller() {
    if (epfd >= 0) close(epfd);
    if (wake >= 0) close(wake);
  }
};

Server::Server(Runtime &rt) : rt_(rt) {}

Server::~Server() {
  stop(0);
  for (auto &p : pending_) close(p->fd);  // the control thread has ended
  pending_.clear();
  for (Session *s : sessions_) delete s;
  for (Session *s : detached_) delete s;
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
  close_listeners();
}

// Removes the socket and lock files this server made, and closes them.
void Server::close_listeners() {
  for (auto &l : listeners_) {
    if (l->fd >= 0) {
      close(l->fd);
      l->fd = -1;
      unlink(l->ep.socket_path.c_str());
    }
    if (l->lock_fd >= 0) {
      unlink(l->ep.lock_path.c_str());
      close(l->lock_fd);
      l->lock_fd = -1;
    }
  }
}

chi_status_t Server::bind_endpoint(const std::string &address, Listener *l) {
  if (chi_status_t s = ipc::resolve_endpoint(address, &l->ep); s != CHI_OK) return s;
  const std::string shown = "shm://" + l->ep.name;
  if (chi_status_t s = ipc::lock_endpoint(l->ep.lock_path, shown, &l->lock_fd); s != CHI_OK) return s;
  if (unlink(l->ep.socket_path.c_str()) == 0)
    log(LogLevel::kInfo, "took over the stale endpoint %s", l->ep.socket_path.c_str());
  l->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (l->fd < 0) return set_error(CHI_ERR_INTERNAL, "socket: %s", strerror(errno));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, l->ep.socket_path.c_str(), l->ep.socket_path.size() + 1);
  mode_t old = umask(0177);
  int r = bind(l->fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr);
  umask(old);
  if (r != 0) return set_error(CHI_ERR_INTERNAL, "cannot bind %s: %s", l->ep.socket_path.c_str(), strerror(errno));
  if (listen(l->fd, 1024) != 0)
    return set_error(CHI_ERR_INTERNAL, "listen on %s: %s", l->ep.socket_path.c_str(), strerror(errno));
  return CHI_OK;
}

chi_status_t Server::start(Runtime &rt, const std::vector<std::string> &addresses, Server **out) {
  std::unique_ptr<Server> srv(new Server(rt));
  for (const std::string &a : addresses) {
    if (a.compare(0, 6, "ipc://") == 0 || a.compare(0, 6, "tcp://") == 0) {
      ZmqListener::Hooks hooks{&srv->clients_, [s = srv.get()](bool json) { return s->status_text(json); },
                               [s = srv.get()] {
                                 std::lock_guard<std::mutex> lock(s->stop_mu_);
                                 s->stop_requested_ = true;
                                 s->stop_cv_.notify_all();
                               }};
      std::unique_ptr<ZmqListener> z;
      if (chi_status_t st = ZmqListener::open(rt, a, std::move(hooks), &z); st != CHI_OK) {
        std::string msg = last_error();
        srv->zmq_.clear();
        srv->close_listeners();
        return set_error(st, "%s", msg.c_str());
      }
      srv->zmq_.push_back(std::move(z));
      continue;
    }
    srv->listeners_.push_back(std::make_unique<Listener>());
    if (chi_status_t s = srv->bind_endpoint(a, srv->listeners_.back().get()); s != CHI_OK) {
      std::string msg = last_error();
      srv->listeners_.pop_back();  // not ours: keep another server's files
      srv->zmq_.clear();
      srv->close_listeners();
      return set_error(s, "%s", msg.c_str());
    }
  }
  const ServerConfig &sc = rt.config().server;
  // Default: a quarter of the server's slots, at most 1024 (plenty to keep
  // every worker busy), so that no client can hold most of them.
  srv->max_in_flight_ = sc.client_max_in_flight ? sc.client_max_in_flight
                                       : std::clamp(rt.config().queue_depth / 4, 1u, 1024u);
  srv->epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  srv->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (srv->epoll_fd_ < 0 || srv->wake_fd_ < 0)
    return set_error(CHI_ERR_INTERNAL, "epoll/eventfd: %s", strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  for (auto &l : srv->listeners_) {
    ev.data.ptr = l.get();
    epoll_ctl(srv->epoll_fd_, EPOLL_CTL_ADD, l->fd, &ev);
  }
  ev.data.ptr = &srv->wake_fd_;
  epoll_ctl(srv->epoll_fd_, EPOLL_CTL_ADD, srv->wake_fd_, &ev);
  unsigned n = sc.pollers;
  if (n == 0) n = std::clamp(std::thread::hardware_concurrency() / 4, 1u, 8u);
  for (unsigned i = 0; i < n; ++i) {
    auto p = std::make_unique<Poller>();
    p->epfd = epoll_create1(EPOLL_CLOEXEC);
    p->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (p->epfd < 0 || p->wake < 0) return set_error(CHI_ERR_INTERNAL, "epoll/eventfd: %s", strerror(errno));
    epoll_event pe{};
    pe.events = EPOLLIN;
    pe.data.ptr = nullptr;
    epoll_ctl(p->epfd, EPOLL_CTL_ADD, p->wake, &pe);
    srv->pollers_.push_back(std::move(p));
  }
  try {
    for (auto &p : srv->pollers_) p->thread = std::thread(&Server::poller_main, srv.get(), p.get());
    srv->control_ = std::thread(&Server::control_main, srv.get());
  } catch (const std::exception &e) {
    return set_error(CHI_ERR_NOMEM, "cannot start server threads: %s", e.what());
  }
  // Last: from here on a ZeroMQ request may call the status/stop hooks,
  // which read the server built above.
  for (auto &z : srv->zmq_)
    if (chi_status_t s = z->start(); s != CHI_OK) return s;
  for (auto &l : srv->listeners_)
    log(LogLevel::kInfo, "serving shm://%s at %s (%u poller(s), %u slots per client)",
        l->ep.name.c_str(), l->ep.socket_path.c_str(), n, sc.client_slots);
  *out = srv.release();
  return CHI_OK;
}

void Server::poller_main(Poller *p) {
  set_submit_never_blocks(true);  // this thread reaps the GPU tasks it queues
  std::vector<Session *> snap;
  size_t turn = 0;
  // Below 4 CPUs a spinning poller takes the CPU from the worker and the
  // client it waits for: it sleeps at once instead (the doorbell wakes it).
  const int64_t spin_ns = std::thread::hardware_concurrency() >= 4 ? rt_.config().server.spin_ns : 0;
  int64_t idle_since = now_ns();
  epoll_event events[64];
  while (!quit_.load(std::memory_order_acquire)) {
    if (p->changed.exchange(false, std::memory_order_acq_rel)) {
      std::lock_guard<std::mutex> lock(p->mu);
      snap = p->sessions;
    }
    // The control thread frees a removed session only after this moves on.
    p->epoch.fetch_add(1, std::memory_order_acq_rel);
    const bool refuse = stopping_.load(std::memory_order_acquire);
    bool work = false;
    // Round-robin with a batch bound per session: a client that keeps its
    // ring full gets kBatch tasks per turn like everyone else.
    const size_t count = snap.size();
    for (size_t k = 0; k < count; ++k) {
      Session *s = snap[(turn + k) % count];
      if (s->dead()) continue;
      if (s->poll(rt_, kBatch, max_in_flight_, refuse)) work = true;
      if (s->poll_gpu()) work = true;
      if (s->dead()) signal_fd(wake_fd_);
    }
    ++turn;
    if (work) {
      idle_since = now_ns();
      continue;
    }
    if (now_ns() - idle_since < spin_ns) {
      cpu_relax();
      continue;
    }
    // Sleep: arm every doorbell, then look once more, so that a client
    // either sees the doorbell armed or we see its task.
    for (Session *s : snap) s->arm_doorbell(true);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    bool ready = p->changed.load(std::memory_order_acquire) || quit_.load(std::memory_order_acquire);
    for (Session *s : snap) ready = ready || (!s->dead() && s->ring_ready());
    if (!ready) {
      int got = epoll_wait(p->epfd, events, 64, 100);
      for (int i = 0; i < got; ++i) {
        int fd = events[i].data.ptr ? static_cast<Session *>(events[i].data.ptr)->doorbell() : p->wake;
        drain_fd(fd);
      }
    }
    for (Session *s : snap) s->arm_doorbell(false);
    idle_since = now_ns();
  }
}

void Server::control_main() {
  epoll_event events[64];
  bool listening = true;
  while (!quit_.load(std::memory_order_acquire)) {
    int n = epoll_wait(epoll_fd_, events, 64, 50);
    for (int i = 0; i < n; ++i) {
      void *tag = events[i].data.ptr;
      Listener *l = nullptr;
      for (auto &x : listeners_)
        if (x.get() == tag) l = x.get();
      if (l) {
        if (listening) accept_client(l->fd);
      } else if (tag == &wake_fd_) {
        drain_fd(wake_fd_);
      } else if (int fd = take_pending(tag); fd >= 0) {
        handshake(fd);
      } else {
        Session *s = static_cast<Session *>(tag);
        if (!s->detached) serve_request(s);
      }
    }
    expire_pending();
    if (listening && stopping_.load(std::memory_order_acquire)) {
      // No new clients once stopping; the socket files go away now.
      for (auto &x : listeners_) {
        epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, x->fd, nullptr);
        close(x->fd);
        x->fd = -1;
        unlink(x->ep.socket_path.c_str());
      }
      listening = false;
    }
    std::vector<Session *> dead;
    {
      std::lock_guard<std::mutex> lock(sessions_mu_);
      for (Session *s : sessions_)
        if (s->dead()) dead.push_back(s);
    }
    for (Session *s : dead) detach(s, s->reason().c_str());
    reclaim();
  }
}

void Server::accept_client(int listen_fd) {
  for (;;) {
    int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      return;  // EAGAIN, or a connection that went away
    }
    // The hello is read when it arrives: a client that connects and stays
    // silent holds only its own connection, until server.hello_timeout_ms.
    auto p = std::make_unique<PendingHello>(
        PendingHello{fd, now_ns() + int64_t(rt_.config().server.hello_timeout_ms) * 1000000});
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.ptr = p.get();
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      close(fd);
      continue;
    }
    pending_.push_back(std::move(p));
  }
}

int Server::take_pending(void *tag) {
  for (size_t i = 0; i < pending_.size(); ++i) {
    if (pending_[i].get() != tag) continue;
    const int fd = pending_[i]->fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    pending_[i] = std::move(pending_.back());
    pending_.pop_back();
    return fd;
  }
  return -1;
}

void Server::expire_pending() {
  const int64_t now = now_ns();
  for (size_t i = 0; i < pending_.size();) {
    // On stop, connections still waiting for their hello are closed too.
    if (now < pending_[i]->deadline_ns && !stopping_.load(std::memory_order_acquire)) {
      ++i;
      continue;
    }
    const int fd = pending_[i]->fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    close(fd);
    if (!stopping_.load(std::memory_order_acquire))
      log(LogLevel::kInfo, "closed a connection that sent no hello within %u ms",
          rt_.config().server.hello_timeout_ms);
    pending_[i] = std::move(pending_.back());
    pending_.pop_back();
  }
}

void Server::handshake(int fd) {
  auto refuse = [&](chi_status_t st, const std::string &msg) {
    const std::string body = ipc::refusal_body(msg);
    ipc::send_msg(fd, ipc::Kind::kWelcome, ipc::Op(0), 0, st, body.data(), uint32_t(body.size()));
    log(LogLevel::kWarn, "refused a client: %s", msg.c_str());
    close(fd);
  };
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    close(fd);
    return;
  }
  ipc::MsgHeader h;
  ipc::Hello hello{};
  char buf[256];
  chi_status_t rs = ipc::recv_msg(fd, &h, buf, sizeof buf, kMessageRestMs);
  if (rs != CHI_OK || h.kind != uint16_t(ipc::Kind::kHello)) {
    if (rs == CHI_OK || rs == CHI_ERR_PROTOCOL)
      refuse(CHI_ERR_PROTOCOL, "expected a chimaera hello message");
    else
      close(fd);
    return;
  }
  if (cred.uid != geteuid())
    return refuse(CHI_ERR_PERMISSION, "uid " + std::to_string(cred.uid) +
                                          " may not connect: this server admits its own user (uid " +
                                          std::to_string(geteuid()) + ")");
  std::string why;
  if (ipc::check_hello(buf, h.length, &hello, &why) != CHI_OK) return refuse(CHI_ERR_PROTOCOL, why);
  if (stopping_.load(std::memory_order_acquire))
    return refuse(CHI_ERR_SHUTDOWN, "the server is stopping");
  const ServerConfig &sc = rt_.config().server;
  if (hello.kind == ipc::kSessionTasks && clients_.load() >= sc.max_clients)
    return refuse(CHI_ERR_AGAIN, "the server has server.max_clients (" + std::to_string(sc.max_clients) +
                                     ") clients connected");
  auto s = std::make_unique<Session>(next_id_++, fd, cred.pid, cred.uid, hello.kind);
  ipc::Welcome w{};
  w.protocol = ipc::kProtocolVersion;
  w.library_version = CHI_VERSION_NUMBER;
  w.method_limit = rt_.registry().limit();
  w.gpus = rt_.gpu() ? rt_.gpu()->count() : 0;
  w.session_id = s->id();
  int fds[2];
  int nfds = 0;
  if (hello.kind == ipc::kSessionTasks) {
    if (chi_status_t st = s->create_segment(sc.client_slots, rt_.config().max_inline_payload); st != CHI_OK) {
      std::string msg = last_error();
      s.reset();  // closes fd
      log(LogLevel::kError, "cannot serve a client: %s", msg.c_str());
      return;
    }
    w.nslots = s->layout().nslots;
    w.max_payload = s->layout().max_payload;
    w.segment_size = s->layout().size;
    fds[0] = s->segment_fd();
    fds[1] = s->doorbell();
    nfds = 2;
    s->stats = &rt_.stats(CHI_STATS_CLIENT);
  }
  if (!ipc::send_msg(fd, ipc::Kind::kWelcome, ipc::Op(0), 0, CHI_OK, &w, sizeof w, fds, nfds)) return;
  Session *raw = s.release();
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.ptr = raw;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    sessions_.push_back(raw);
  }
  if (raw->kind() == ipc::kSessionTasks) {
    clients_.fetch_add(1, std::memory_order_relaxed);
    rt_.client_count().fetch_add(1, std::memory_order_relaxed);
    raw->poller = next_poller_++ % uint32_t(pollers_.size());
    Poller &p = *pollers_[raw->poller];
    epoll_event pe{};
    pe.events = EPOLLIN;
    pe.data.ptr = raw;
    epoll_ctl(p.epfd, EPOLL_CTL_ADD, raw->doorbell(), &pe);
    {
      std::lock_guard<std::mutex> lock(p.mu);
      p.sessions.push_back(raw);
    }
    p.changed.store(true, std::memory_order_release);
    signal_fd(p.wake);
    log(LogLevel::kInfo, "client %u connected (pid %d, uid %u)", raw->id(), int(raw->pid()),
        unsigned(raw->uid()));
  }
}

void Server::serve_request(Session *s) {
  ipc::MsgHeader h;
  static thread_local char buf[ipc::kMaxMsgPayload];
  chi_status_t rs = ipc::recv_msg(s->sock(), &h, buf, sizeof buf - 1, kMessageRestMs);
  if (rs == CHI_ERR_DISCONNECTED) return detach(s, "connection closed");
  if (rs != CHI_OK) return detach(s, "malformed control message");
  auto reply = [&](chi_status_t st, const void *p, size_t n) {
    ipc::send_msg(s->sock(), ipc::Kind::kControlReply, ipc::Op(0), 0, st, p,
                  uint32_t(std::min<size_t>(n, ipc::kMaxMsgPayload)));
  };
  auto reply_error = [&](chi_status_t st, const std::string &msg) { reply(st, msg.data(), msg.size()); };
  if (h.kind != uint16_t(ipc::Kind::kControl)) {
    reply_error(CHI_ERR_PROTOCOL, "unexpected message kind " + std::to_string(h.kind));
    return detach(s, "unexpected message kind");
  }
  switch (ipc::Op(h.op)) {
    case ipc::Op::kLookup: {
      buf[h.length] = 0;
      if (std::strlen(buf) != h.length || check_method_name(buf) != CHI_OK)
        return reply_error(CHI_ERR_NOT_FOUND, "no method by that name (not a valid method name)");
      ipc::MethodReply m{};
      if (rt_.registry().lookup(buf, &m.method) != CHI_OK)
        return reply_error(CHI_ERR_NOT_FOUND, last_error());
      return reply(CHI_OK, &m, sizeof m);
    }
    case ipc::Op::kMethodLimit: {
      ipc::MethodReply m{rt_.registry().limit(), 0};
      return reply(CHI_OK, &m, sizeof m);
    }
    case ipc::Op::kStats: {
      chi_stats_t st;
      rt_.read_stats(&st);
      return reply(CHI_OK, &st, sizeof st);
    }
    case ipc::Op::kStatus: {
      std::string text = status_text(h.flags & ipc::kStatusJson);
      return reply(CHI_OK, text.data(), text.size());
    }
    case ipc::Op::kPing:
      return reply(CHI_OK, nullptr, 0);
    case ipc::Op::kStop: {
      reply(CHI_OK, nullptr, 0);
      log(LogLevel::kInfo, "stop asked by pid %d", int(s->pid()));
      std::lock_guard<std::mutex> lock(stop_mu_);
      stop_requested_ = true;
      stop_cv_.notify_all();
      return;
    }
    default:
      reply_error(CHI_ERR_PROTOCOL, "unknown request " + std::to_string(h.op));
      return detach(s, "unknown control request");
  }
}

void Server::detach(Session *s, const char *why) {
  if (s->detached) return;
  s->detached = true;
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, s->sock(), nullptr);
  // The client sees EOF at once (its calls answer CHI_ERR_DISCONNECTED).
  shutdown(s->sock(), SHUT_RDWR);
  if (s->kind() == ipc::kSessionTasks) {
    log(s->dead() ? LogLevel::kWarn : LogLevel::kInfo, "client %u (pid %d) gone: %s", s->id(),
        int(s->pid()), why);
    Poller &p = *pollers_[s->poller];
    epoll_ctl(p.epfd, EPOLL_CTL_DEL, s->doorbell(), nullptr);
    {
      std::lock_guard<std::mutex> lock(p.mu);
      p.sessions.erase(std::remove(p.sessions.begin(), p.sessions.end(), s), p.sessions.end());
      s->removed_epoch = p.epoch.load(std::memory_order_acquire);
    }
    p.changed.store(true, std::memory_order_release);
    signal_fd(p.wake);
    clients_.fetch_sub(1, std::memory_order_relaxed);
    rt_.client_count().fetch_sub(1, std::memory_order_relaxed);
  }
  std::lock_guard<std::mutex> lock(sessions_mu_);
  sessions_.erase(std::remove(sessions_.begin(), sessions_.end(), s), sessions_.end());
  detached_.push_back(s);
}

void Server::reclaim() {
  // A detached session is freed once its poller has dropped it (its epoch
  // moved past the removal twice: one full turn) and no task of it runs.
  // Tasks that already run finish into its segment first; none is re-run.
  std::vector<Session *> keep;
  std::vector<Session *> gone;
  {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    for (Session *s : detached_) {
      bool free_it = s->kind() != ipc::kSessionTasks;
      if (!free_it) {
        bool dropped = pollers_[s->poller]->epoch.load(std::memory_order_acquire) > s->removed_epoch + 1;
        if (dropped) s->poll_gpu();  // the poller no longer collects them
        free_it = dropped && s->in_flight() == 0;
      }
      (free_it ? gone : keep).push_back(s);
    }
    detached_.swap(keep);
  }
  for (Session *s : gone) delete s;
}

std::string Server::status_text(bool json) {
  std::string addrs;
  for (auto &l : listeners_) addrs += (addrs.empty() ? "shm://" : " shm://") + l->ep.name;
  for (auto &z : zmq_) addrs += (addrs.empty() ? "" : " ") + z->address();
  chi_stats_t st;
  rt_.read_stats(&st);
  struct Row {
    uint32_t id;
    int pid;
    unsigned uid;
    uint64_t submitted, finished;
    uint32_t in_flight;
  };
  std::vector<Row> rows;
  {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    for (Session *s : sessions_)
      if (s->kind() == ipc::kSessionTasks)
        rows.push_back({s->id(), int(s->pid()), unsigned(s->uid()), s->submitted(), s->finished(),
                        s->in_flight()});
  }
  // ZeroMQ sessions: the peer's pid and uid are not known (-1) off-host.
  for (auto &z : zmq_)
    for (const ZmqListener::Row &r : z->rows())
      rows.push_back({r.id, -1, unsigned(-1), r.submitted, r.finished, r.in_flight});
  // Each GPU's orchestrator as it is now (paused, failed...), not assumed.
  std::string orch_json, orch_text;
  const int32_t ngpus = rt_.gpu() ? rt_.gpu()->count() : 0;
  for (int32_t g = 0; g < ngpus; ++g) {
    uint64_t launches = 0;
    const char *state = rt_.gpu()->orchestrator_state(g, &launches);
    char one[160];
    snprintf(one, sizeof one, "%s{\"gpu\":%d,\"state\":\"%s\",\"launches\":%llu}", g ? "," : "", int(g),
             state, (unsigned long long)launches);
    orch_json += one;
    snprintf(one, sizeof one, "%sGPU %d %s, %llu launch(es)", g ? "; " : "", int(g), state,
             (unsigned long long)launches);
    orch_text += one;
  }
  if (orch_text.empty()) orch_text = "none";
  static const char *const names[] = {"cpu", "gpu", "client", "reserved"};
  char line[512];
  std::string out;
  if (json) {
    // Addresses come from the config: any length, any character (a path).
    out = "{\"address\":\"";
    for (char ch : addrs) {
      if (ch == '"' || ch == '\\') {
        out += '\\';
        out += ch;
      } else if (static_cast<unsigned char>(ch) < 0x20) {
        char esc[8];
        snprintf(esc, sizeof esc, "\\u%04x", unsigned(static_cast<unsigned char>(ch)));
        out += esc;
      } else {
        out += ch;
      }
    }
    snprintf(line, sizeof line,
             "\",\"pid\":%d,\"version\":\"%s\",\"workers\":%u,"
             "\"pollers\":%zu,\"slots_in_use\":%llu,\"slots_total\":%llu,\"gpus\":%d,"
             "\"gpu_orchestrators\":[",
             int(getpid()), ipc::version_text(CHI_VERSION_NUMBER).c_str(), st.workers,
             pollers_.size(), (unsigned long long)st.slots_in_use, (unsigned long long)st.slots_total,
             st.gpus);
    out += line;
    out += orch_json + "],\"clients\":[";
    for (size_t i = 0; i < rows.size(); ++i) {
      snprintf(line, sizeof line,
               "%s{\"id\":%u,\"pid\":%d,\"uid\":%u,\"submitted\":%llu,\"finished\":%llu,\"in_flight\":%u}",
               i ? "," : "", rows[i].id, rows[i].pid, rows[i].uid,
               (unsigned long long)rows[i].submitted, (unsigned long long)rows[i].finished,
               rows[i].in_flight);
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
    out += "}}\n";
    return out;
  }
  snprintf(line, sizeof line,
           "chimaera-server %s, pid %d\n"
           "workers:  %u CPU worker(s), %zu client poller(s)\n"
           "slots:    %llu of %llu CPU task slots in use\n"
           "gpus:     %d (orchestrators: ",
           ipc::version_text(CHI_VERSION_NUMBER).c_str(), int(getpid()), st.workers,
           pollers_.size(), (unsigned long long)st.slots_in_use, (unsigned long long)st.slots_total,
           st.gpus);
  out += line;
  out += orch_text + ")\nserving:  " + addrs + "\nclients:  " + std::to_string(rows.size()) + "\n";
  if (!rows.empty()) out += "  id      pid      uid    submitted     finished  in-flight\n";
  for (const Row &r : rows) {
    snprintf(line, sizeof line, "  %-6u %-8d %-6u %10llu %12llu %10u\n", r.id, r.pid, r.uid,
             (unsigned long long)r.submitted, (unsigned long long)r.finished, r.in_flight);
    out += line;
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
  return out;
}

chi_status_t Server::wait_stop_request(int64_t timeout_ms) {
  std::unique_lock<std::mutex> lock(stop_mu_);
  if (timeout_ms < 0) {
    stop_cv_.wait(lock, [&] { return stop_requested_; });
  } else if (!stop_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                                [&] { return stop_requested_; })) {
    return set_error(CHI_ERR_TIMEOUT, "no stop request within %lld ms", (long long)timeout_ms);
  }
  return CHI_OK;
}

chi_status_t Server::stop(uint32_t drain_timeout_ms) {
  if (stopped_) return CHI_OK;
  if (drain_timeout_ms == UINT32_MAX) drain_timeout_ms = rt_.config().server.shutdown_timeout_ms;
  stopped_ = true;
  // 1. Refuse: clients see kStopping (new submits: CHI_ERR_SHUTDOWN) and the
  //    pollers answer every task still queued CHI_ERR_SHUTDOWN.
  {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    for (Session *s : sessions_) s->announce_server_state(ipc::kStopping);
  }
  stopping_.store(true, std::memory_order_seq_cst);
  for (auto &z : zmq_) z->begin_stop();
  signal_fd(wake_fd_);
  for (auto &p : pollers_) signal_fd(p->wake);
  // 2. Let the tasks that already run finish, within the bound.
  const int64_t deadline = now_ns() + int64_t(drain_timeout_ms) * 1000000;
  chi_status_t result = CHI_OK;
  for (;;) {
    uint64_t busy = 0;
    {
      std::lock_guard<std::mutex> lock(sessions_mu_);
      for (Session *s : sessions_) busy += s->in_flight();
      for (Session *s : detached_) busy += s->in_flight();
    }
    for (auto &z : zmq_) busy += z->in_flight();
    if (busy == 0) break;
    if (now_ns() >= deadline) {
      log(LogLevel::kWarn, "stop: %llu client task(s) still running after %u ms",
          (unsigned long long)busy, drain_timeout_ms);
      result = set_error(CHI_ERR_TIMEOUT, "%llu client task(s) still running after %u ms",
                         (unsigned long long)busy, drain_timeout_ms);
      break;
    }
    usleep(1000);
  }
  // 3. Gone: waiters wake and every call of a client answers DISCONNECTED.
  quit_.store(true, std::memory_order_seq_cst);
  signal_fd(wake_fd_);
  for (auto &p : pollers_) signal_fd(p->wake);
  for (auto &p : pollers_)
    if (p->thread.joinable()) p->thread.join();
  if (control_.joinable()) control_.join();
  {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    for (Session *s : sessions_) {
      s->announce_server_state(ipc::kGone);
      shutdown(s->sock(), SHUT_RDWR);
    }
    for (Session *s : detached_) s->announce_server_state(ipc::kGone);
  }
  for (auto &z : zmq_) z->finish();
  for (auto &l : listeners_) log(LogLevel::kInfo, "stopped serving shm://%s", l->ep.name.c_str());
  close_listeners();
  return result;
}

}  // namespace chi

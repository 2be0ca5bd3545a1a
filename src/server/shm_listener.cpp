#include "server/shm_listener.h"

#include <errno.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "base/error.h"
#include "base/eventfd.h"
#include "base/futex.h"
#include "base/log.h"
#include "core/runtime.h"
#include "ipc/handshake.h"
#include "server/service.h"
#include "server/session.h"
#include "server/wake.h"

namespace chi {

namespace {
// Out of descriptors, the listening socket leaves the epoll set this long.
constexpr int64_t kAcceptPauseNs = 100 * 1000000;
// Logs the n-th of a repeated event at n = 1, 2, 4, 8...: never a flood.
bool worth_logging(uint64_t n) { return (n & (n - 1)) == 0; }
}  // namespace

chi_status_t ShmListener::open(Service &service, const std::string &address, std::unique_ptr<Listener> *out) {
  std::unique_ptr<ShmListener> l(new ShmListener(service));
  if (chi_status_t s = l->bind(address); s != CHI_OK) return s;
  *out = std::move(l);
  return CHI_OK;
}

chi_status_t ShmListener::bind(const std::string &address) {
  if (chi_status_t s = ipc::resolve_endpoint(address, &ep_); s != CHI_OK) return s;
  shown_ = "shm://" + ep_.name;
  if (chi_status_t s = ipc::lock_endpoint(ep_.lock_path, shown_, &lock_fd_); s != CHI_OK) return s;
  if (unlink(ep_.socket_path.c_str()) == 0)
    log(LogLevel::kInfo, "took over the stale endpoint %s", ep_.socket_path.c_str());
  listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listen_fd_ < 0) return set_error(CHI_ERR_INTERNAL, "socket: %s", strerror(errno));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, ep_.socket_path.c_str(), ep_.socket_path.size() + 1);
  mode_t old = umask(0177);
  int r = ::bind(listen_fd_, reinterpret_cast<sockaddr *>(&addr), sizeof addr);
  umask(old);
  if (r != 0) return set_error(CHI_ERR_INTERNAL, "cannot bind %s: %s", ep_.socket_path.c_str(), strerror(errno));
  if (listen(listen_fd_, 1024) != 0)
    return set_error(CHI_ERR_INTERNAL, "listen on %s: %s", ep_.socket_path.c_str(), strerror(errno));
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) return set_error(CHI_ERR_INTERNAL, "epoll_create1: %s", strerror(errno));
  if (chi_status_t st = eventfd_open(&wake_fd_); st != CHI_OK) return st;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = &listen_fd_;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev) != 0)
    return set_error(CHI_ERR_INTERNAL, "epoll_ctl(ADD %s): %s", ep_.socket_path.c_str(), strerror(errno));
  ev.data.ptr = &wake_fd_;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev) != 0)
    return set_error(CHI_ERR_INTERNAL, "epoll_ctl(ADD wake-up): %s", strerror(errno));
  pollers_ = std::make_unique<PollerPool>(svc_, wake_fd_);
  return CHI_OK;
}

chi_status_t ShmListener::start() {
  if (chi_status_t s = pollers_->start(svc_.config().pollers); s != CHI_OK) return s;
  try {
    control_ = std::thread(&ShmListener::control_main, this);
  } catch (const std::exception &e) {
    return set_error(CHI_ERR_NOMEM, "cannot start the control thread: %s", e.what());
  }
  log(LogLevel::kInfo, "serving %s at %s (%zu poller(s), %u slots per client)", shown_.c_str(),
      ep_.socket_path.c_str(), pollers_->size(), svc_.config().client_slots);
  // Three descriptors per task session, one per other connection: short of
  // them, accept pauses (no client is lost, but none gets in meanwhile).
  rlimit rl;
  const uint64_t want = 3ull * svc_.config().max_clients + Service::kMaxPendingConnections + 64;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want)
    log(LogLevel::kWarn,
        "%s: the open-files limit (%llu) is below what server.max_clients (%u) may need (%llu): raise it "
        "(ulimit -n) or lower server.max_clients",
        shown_.c_str(), (unsigned long long)rl.rlim_cur, svc_.config().max_clients, (unsigned long long)want);
  return CHI_OK;
}

ShmListener::~ShmListener() {
  finish();
  for (auto &p : pending_) close(p->fd);  // the control thread has ended
  for (Session *s : sessions_) delete s;
  for (Session *s : detached_) delete s;
  pollers_.reset();
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
  close_files();
}

// Removes the socket and lock files this listener made, and closes them.
void ShmListener::close_files() {
  if (listen_fd_ >= 0) {
    close(listen_fd_);
    listen_fd_ = -1;
    unlink(ep_.socket_path.c_str());
  }
  if (lock_fd_ >= 0) {
    unlink(ep_.lock_path.c_str());
    close(lock_fd_);
    lock_fd_ = -1;
  }
}

void ShmListener::control_main() {
  epoll_event events[64];
  bool listening = true;
  while (!quit_.load(std::memory_order_acquire)) {
    const int n = epoll_wait(epoll_fd_, events, 64, 50);
    if (n < 0 && errno != EINTR) log(LogLevel::kError, "%s: epoll_wait: %s", shown_.c_str(), strerror(errno));
    for (int i = 0; i < n; ++i) {
      void *tag = events[i].data.ptr;
      if (tag == &listen_fd_) {
        if (listening && !accept_paused_) accept_clients();
      } else if (tag == &wake_fd_) {
        eventfd_drain(wake_fd_);
      } else if (pending_input(tag)) {
      } else {
        Session *s = static_cast<Session *>(tag);
        if (!s->detached) serve_request(s);
      }
    }
    expire_pending();
    if (accept_paused_ && listening && now_ns() >= accept_resume_ns_ &&
        pending_.size() < Service::kMaxPendingConnections)
      resume_accepting();
    if (listening && svc_.stopping()) {
      stop_listening();  // no new clients once stopping; the socket file goes now
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

void ShmListener::stop_listening() {
  if (listen_fd_ < 0) return;
  if (!accept_paused_ && epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr) != 0)
    log(LogLevel::kWarn, "%s: epoll_ctl(DEL listener): %s", shown_.c_str(), strerror(errno));
  close(listen_fd_);
  listen_fd_ = -1;
  unlink(ep_.socket_path.c_str());
}

void ShmListener::accept_clients() {
  for (;;) {
    if (pending_.size() >= Service::kMaxPendingConnections) {
      // Enough connections wait for their hello: the next ones wait in the
      // kernel's backlog until some of these end (hello or timeout), so a
      // burst of honest clients is served in turn, not refused.
      pause_accepting();
      accept_resume_ns_ = 0;
      return;
    }
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // The connection waits in the backlog; the socket stays readable,
        // so accepting again at once would only spin.
        if (worth_logging(++accept_failures_))
          log(LogLevel::kWarn, "%s: accept: %s: not accepting for %lld ms (%llu time(s) so far)", shown_.c_str(),
              strerror(errno), (long long)(kAcceptPauseNs / 1000000), (unsigned long long)accept_failures_);
        pause_accepting();
      } else if (errno != EAGAIN && errno != ECONNABORTED) {
        log(LogLevel::kWarn, "%s: accept: %s", shown_.c_str(), strerror(errno));
      }
      return;
    }
    // Every connection counts, whatever it becomes: task and control
    // sessions and those still to say hello.
    size_t sessions;
    {
      std::lock_guard<std::mutex> lock(sessions_mu_);
      sessions = sessions_.size();
    }
    if (sessions + pending_.size() >= svc_.max_connections()) {
      const std::string why = "the server holds " + std::to_string(sessions + pending_.size()) +
                              " connections (server.max_clients + " +
                              std::to_string(Service::kMaxPendingConnections) + ")";
      if (worth_logging(++refusals_))
        log(LogLevel::kWarn, "%s: refused a connection: %s (%llu refused so far)", shown_.c_str(), why.c_str(),
            (unsigned long long)refusals_);
      const std::string body = ipc::refusal_body(why);
      ipc::MsgHeader h{ipc::kMsgMagic, uint16_t(ipc::Kind::kWelcome), 0, 0, uint32_t(body.size()), CHI_ERR_AGAIN};
      std::string msg(reinterpret_cast<const char *>(&h), sizeof h);
      msg += body;
      if (send(fd, msg.data(), msg.size(), MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
      }  // best effort: the peer sees EOF anyway
      close(fd);
      continue;
    }
    // The hello is read as it arrives: a client that connects and stays
    // silent, or sends a byte at a time, holds only its own connection,
    // until server.hello_timeout_ms.
    auto p = std::make_unique<PendingHello>(
        PendingHello{fd, now_ns() + int64_t(svc_.config().hello_timeout_ms) * 1000000, std::string()});
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.ptr = p.get();
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      log(LogLevel::kWarn, "%s: dropped a connection: epoll_ctl(ADD): %s", shown_.c_str(), strerror(errno));
      close(fd);
      continue;
    }
    pending_.push_back(std::move(p));
  }
}

void ShmListener::pause_accepting() {
  if (accept_paused_) return;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr) != 0) {
    log(LogLevel::kWarn, "%s: epoll_ctl(DEL listener): %s", shown_.c_str(), strerror(errno));
    return;
  }
  accept_paused_ = true;
  accept_resume_ns_ = now_ns() + kAcceptPauseNs;
}

void ShmListener::resume_accepting() {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = &listen_fd_;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev) != 0) {
    accept_resume_ns_ = now_ns() + kAcceptPauseNs;  // tried again after the next pause
    return;
  }
  accept_paused_ = false;
}

bool ShmListener::pending_input(void *tag) {
  size_t i = 0;
  while (i < pending_.size() && pending_[i].get() != tag) ++i;
  if (i == pending_.size()) return false;
  PendingHello &p = *pending_[i];
  ipc::MsgHeader h;
  const chi_status_t rs = ipc::recv_msg_nowait(p.fd, &p.buf, &h, 256);
  if (rs == CHI_ERR_AGAIN) return true;
  const int fd = p.fd;
  std::string msg = std::move(p.buf);
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr) != 0)
    log(LogLevel::kWarn, "%s: epoll_ctl(DEL pending): %s", shown_.c_str(), strerror(errno));
  pending_[i] = std::move(pending_.back());
  pending_.pop_back();
  if (rs == CHI_ERR_DISCONNECTED) {
    close(fd);
    return true;
  }
  if (rs != CHI_OK || h.kind != uint16_t(ipc::Kind::kHello)) {
    log(LogLevel::kWarn, "%s: refused a client: expected a chimaera hello message", shown_.c_str());
    const std::string body = ipc::refusal_body("expected a chimaera hello message");
    ipc::send_msg(fd, ipc::Kind::kWelcome, ipc::Op(0), 0, CHI_ERR_PROTOCOL, body.data(), uint32_t(body.size()));
    close(fd);
    return true;
  }
  handshake(fd, h, msg.data() + sizeof h);
  return true;
}

void ShmListener::expire_pending() {
  const int64_t now = now_ns();
  const bool stopping = svc_.stopping();
  for (size_t i = 0; i < pending_.size();) {
    // On stop, connections still waiting for their hello are closed too.
    if (now < pending_[i]->deadline_ns && !stopping) {
      ++i;
      continue;
    }
    // Closing the descriptor takes it out of the epoll set.
    close(pending_[i]->fd);
    if (!stopping)
      log(LogLevel::kInfo, "closed a connection that sent no hello within %u ms", svc_.config().hello_timeout_ms);
    pending_[i] = std::move(pending_.back());
    pending_.pop_back();
  }
}

void ShmListener::handshake(int fd, const ipc::MsgHeader &h, const char *buf) {
  auto refuse = [&](chi_status_t st, const std::string &msg) {
    const std::string body = ipc::refusal_body(msg);
    ipc::send_msg(fd, ipc::Kind::kWelcome, ipc::Op(0), 0, st, body.data(), uint32_t(body.size()));
    close(fd);
  };
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    log(LogLevel::kWarn, "%s: dropped a connection: SO_PEERCRED: %s", shown_.c_str(), strerror(errno));
    close(fd);
    return;
  }
  ipc::Hello hello{};
  std::string why;
  if (chi_status_t st = svc_.admit(shown_, buf, h.length, &cred.uid, &hello, &why); st != CHI_OK)
    return refuse(st, why);
  const bool tasks = hello.kind == ipc::kSessionTasks;
  auto s = std::make_unique<Session>(svc_, svc_.next_session_id(), fd, cred.pid, cred.uid, hello.kind);
  ipc::Welcome w = svc_.welcome(s->id());
  int fds[2];
  int nfds = 0;
  if (tasks) {
    if (chi_status_t st = s->create_segment(svc_.config().client_slots); st != CHI_OK) {
      log(LogLevel::kError, "cannot serve a client: %s", last_error());
      svc_.left();
      return;  // closes fd
    }
    w.nslots = s->layout().nslots;
    w.max_payload = s->layout().max_payload;
    w.segment_size = s->layout().size;
    fds[0] = s->segment_fd();
    fds[1] = s->client_doorbell();
    nfds = 2;
  }
  const std::string body = svc_.welcome_body(w);
  const bool sent =
      ipc::send_msg(fd, ipc::Kind::kWelcome, ipc::Op(0), 0, CHI_OK, body.data(), uint32_t(body.size()), fds, nfds);
  s->close_client_doorbell();  // the client holds its end now
  if (!sent) {
    if (tasks) svc_.left();
    return;
  }
  Session *raw = s.release();
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.ptr = raw;
  {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    sessions_.push_back(raw);
  }
  // A session the control thread cannot watch, or no poller serves, ends at
  // once (the client sees EOF): never connected but unserved.
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    log(LogLevel::kWarn, "%s: epoll_ctl(ADD client): %s", shown_.c_str(), strerror(errno));
    raw->kill("cannot watch its socket");
  } else if (tasks) {
    // From here a poller holds it (and may already have found it dead).
    if (pollers_->add(raw) == CHI_OK) {
      raw->registered = true;
    } else {
      log(LogLevel::kWarn, "%s: %s", shown_.c_str(), last_error());
      raw->kill("no poller could take it");
    }
  }
  if (raw->dead()) return detach(raw, raw->reason().c_str());
  if (tasks)
    log(LogLevel::kInfo, "client %u connected (pid %d, uid %u)", raw->id(), int(raw->pid()), unsigned(raw->uid()));
}

void ShmListener::serve_request(Session *s) {
  // A request is gathered as it arrives (a byte at a time delays no one).
  std::string &msg = partial_[s];
  ipc::MsgHeader h;
  const chi_status_t rs = ipc::recv_msg_nowait(s->sock(), &msg, &h, ipc::kMaxMsgPayload);
  if (rs == CHI_ERR_AGAIN) return;
  if (rs == CHI_ERR_DISCONNECTED) return detach(s, "connection closed");
  if (rs != CHI_OK) return detach(s, "malformed control message");
  const std::string request = std::move(msg);
  msg.clear();
  const char *buf = request.data() + sizeof h;
  // A client that does not read its replies must not make this thread wait
  // for room to send the next one.
  pollfd out{s->sock(), POLLOUT, 0};
  if (poll(&out, 1, 0) != 1 || !(out.revents & POLLOUT)) return detach(s, "does not read its replies");
  std::string reply;
  chi_status_t st;
  if (h.kind != uint16_t(ipc::Kind::kControl)) {
    st = CHI_ERR_PROTOCOL;
    reply = "unexpected message kind " + std::to_string(h.kind);
  } else {
    st = svc_.control(s->id(), ipc::Op(h.op), h.flags, buf, h.length, &reply,
                      shown_ + " client " + std::to_string(s->id()) + " (pid " + std::to_string(s->pid()) + ")");
  }
  if (!ipc::send_msg(s->sock(), ipc::Kind::kControlReply, ipc::Op(0), 0, st, reply.data(),
                     uint32_t(std::min<size_t>(reply.size(), ipc::kMaxMsgPayload))))
    return detach(s, "connection closed");
  if (st == CHI_ERR_PROTOCOL) detach(s, "unknown control request");
}

void ShmListener::detach(Session *s, const char *why) {
  if (s->detached) return;
  s->detached = true;
  partial_.erase(s);
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, s->sock(), nullptr) != 0 && errno != ENOENT)
    log(LogLevel::kWarn, "%s: epoll_ctl(DEL client %u): %s", shown_.c_str(), s->id(), strerror(errno));
  // The client sees EOF at once (its calls answer CHI_ERR_DISCONNECTED).
  shutdown(s->sock(), SHUT_RDWR);
  if (s->kind() == ipc::kSessionTasks) {
    // Its tasks that no worker started are dropped now (their server slots
    // free at once); those that run finish into the segment, unread.
    s->leave();
    const uint32_t dropped = s->cancel_queued(CHI_OK);
    log(s->dead() ? LogLevel::kWarn : LogLevel::kInfo, "client %u (pid %d) gone: %s; %u queued task(s) cancelled",
        s->id(), int(s->pid()), why, dropped);
    if (s->registered) pollers_->remove(s);
    svc_.left();
  }
  // What it registered (client device memory) stays until reclaim(): a task
  // of it that runs may use it.
  std::lock_guard<std::mutex> lock(sessions_mu_);
  sessions_.erase(std::remove(sessions_.begin(), sessions_.end(), s), sessions_.end());
  detached_.push_back(s);
}

void ShmListener::reclaim() {
  // A detached session is freed once its poller has dropped it and no task
  // of it runs.  Tasks that already run finish into its segment first; none
  // is re-run.
  std::vector<Session *> keep, gone;
  {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    for (Session *s : detached_) {
      bool free_it = s->kind() != ipc::kSessionTasks || !s->registered;
      if (!free_it) {
        const bool dropped = pollers_->dropped(s);
        if (dropped) {
          s->cancel_queued(CHI_OK);  // one its poller took while it was leaving
          s->poll_gpu();             // the poller no longer collects them
        }
        free_it = dropped && s->in_flight() == 0;
      }
      (free_it ? gone : keep).push_back(s);
    }
    detached_.swap(keep);
  }
  for (Session *s : gone) {
    svc_.session_ended(s->id());  // its last task ended: its device memory may go
    delete s;
  }
}

void ShmListener::begin_stop() {
  // Clients see kStopping (new submits: CHI_ERR_SHUTDOWN) and the pollers
  // answer every task still queued CHI_ERR_SHUTDOWN.
  {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    for (Session *s : sessions_) s->announce_server_state(ipc::kStopping);
  }
  // Tasks taken but not started are answered now: only running ones delay
  // the stop.
  cancel_queued();
  if (wake_fd_ >= 0) signal_fd(wake_fd_);
  if (pollers_) pollers_->wake_all();
}

void ShmListener::cancel_queued() {
  std::lock_guard<std::mutex> lock(sessions_mu_);
  for (Session *s : sessions_) s->cancel_queued(CHI_ERR_SHUTDOWN);
  for (Session *s : detached_)
    if (s->kind() == ipc::kSessionTasks) s->cancel_queued(CHI_OK);
}

uint64_t ShmListener::in_flight() {
  uint64_t busy = 0;
  std::lock_guard<std::mutex> lock(sessions_mu_);
  for (Session *s : sessions_) busy += s->in_flight();
  for (Session *s : detached_) busy += s->in_flight();
  return busy;
}

void ShmListener::finish() {
  if (finished_) return;
  finished_ = true;
  // Gone: waiters wake and every call of a client answers DISCONNECTED.
  quit_.store(true, std::memory_order_seq_cst);
  if (wake_fd_ >= 0) signal_fd(wake_fd_);
  if (pollers_) pollers_->stop();
  if (control_.joinable()) control_.join();
  {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    for (Session *s : sessions_) {
      s->announce_server_state(ipc::kGone);
      shutdown(s->sock(), SHUT_RDWR);
    }
    for (Session *s : detached_) s->announce_server_state(ipc::kGone);
  }
  if (listen_fd_ >= 0 || lock_fd_ >= 0) log(LogLevel::kInfo, "stopped serving %s", shown_.c_str());
  close_files();
}

void ShmListener::rows(std::vector<ClientRow> *out) {
  std::lock_guard<std::mutex> lock(sessions_mu_);
  for (Session *s : sessions_)
    if (s->kind() == ipc::kSessionTasks)
      out->push_back({s->id(), int(s->pid()), unsigned(s->uid()), s->submitted(), s->finished(), s->in_flight(),
                      s->registered ? int(s->poller) : -1});
  for (Session *s : detached_)
    if (s->kind() == ipc::kSessionTasks && s->in_flight())
      out->push_back({s->id(), int(s->pid()), unsigned(s->uid()), s->submitted(), s->finished(), s->in_flight(), -1,
                      true});
}

}  // namespace chi

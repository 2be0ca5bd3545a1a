#include "server/zmq_listener.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <cstring>

#include "base/error.h"
#include "base/eventfd.h"
#include "base/futex.h"
#include "base/log.h"
#include "core/runtime.h"
#include "core/stats.h"
#include "ipc/address.h"
#include "ipc/channel.h"
#include "ipc/curve.h"
#include "ipc/handshake.h"
#include "ipc/zmq_events.h"

namespace chi {

namespace {
// Tasks kept for reuse hold an output buffer of at most this many bytes.
constexpr size_t kKeptOutputBytes = 16 * 1024;
}  // namespace

ZmqListener::ZmqListener(Service &service, std::string address)
    : svc_(service),
      address_(std::move(address)),
      gpu_(service.max_payload(), [this](uint64_t) { return static_cast<void *>(out_buf_.data()); },
           [this](uint64_t cookie, chi_status_t st, size_t size) {
             Task *t = reinterpret_cast<Task *>(cookie);
             t->status = st;
             t->output.assign(reinterpret_cast<const char *>(out_buf_.data()), size);
             std::lock_guard<std::mutex> lock(done_mu_);
             done_.push_back(t);
           }) {
  out_buf_.resize(std::max<size_t>(service.max_payload(), 1));
}

ZmqListener::~ZmqListener() {
  finish();
  for (Task *t : done_) delete t;
  for (Task *t : spare_) delete t;
  if (wake_fd_ >= 0) close(wake_fd_);
}

chi_status_t ZmqListener::open(Service &service, const std::string &address, std::unique_ptr<Listener> *out) {
  std::unique_ptr<ZmqListener> l(new ZmqListener(service, address));
  if (chi_status_t s = l->bind(); s != CHI_OK) {
    const std::string msg = last_error();
    l->finish();
    return set_error(s, "%s", msg.c_str());
  }
  *out = std::move(l);
  return CHI_OK;
}

chi_status_t ZmqListener::bind() {
  const ipc::Transport transport = ipc::transport_of(address_);
  const bool tcp = transport == ipc::Transport::kTcp;
  if (tcp) {
    std::string host, why;
    int port = 0;
    if (!ipc::split_tcp_address(ipc::after_scheme(address_), &host, &port, &why))
      return set_error(CHI_ERR_INVALID, "%s is not tcp://HOST:PORT: %s", address_.c_str(), why.c_str());
    if (chi_status_t s = curve_.configure(svc_.config(), address_, ipc::is_loopback_host(host)); s != CHI_OK)
      return s;
  } else if (transport != ipc::Transport::kIpc) {
    return set_error(CHI_ERR_INVALID, "%s is not an ipc:// or tcp:// address", address_.c_str());
  }
  ctx_ = zmq_ctx_new();
  if (!ctx_) return set_error(CHI_ERR_NOMEM, "zmq_ctx_new failed");
  // The ZAP handler must be bound before the CURVE socket takes a client.
  if (curve_.enabled())
    if (chi_status_t s = curve_.bind_zap(ctx_); s != CHI_OK) return s;
  router_ = zmq_socket(ctx_, ZMQ_ROUTER);
  if (!router_) return set_error(CHI_ERR_INTERNAL, "cannot make a zmq socket: %s", zmq_strerror(errno));
  if (chi_status_t st = eventfd_open(&wake_fd_); st != CHI_OK) return st;
  // LINGER: replies and the final "gone" frames leave before the socket closes.
  // Heartbeats find a client whose network is gone (one that exits or is
  // killed is seen at once, from its connection): its session and queued
  // tasks are reclaimed after the same 10 s of silence a client allows.
  // What one connection can make the server hold (docs/server.md, "Threat
  // model"): MAXMSGSIZE bounds every message part, before the handshake too
  // (libzmq refuses a larger frame header instead of allocating it); RCVHWM
  // parts wait unread at most; SNDHWM replies wait for a peer that does not
  // read (one per task in flight at most for an honest client, whose
  // results then never drop), and further ones are dropped.  A handshake
  // must end within HANDSHAKE_IVL.
  const int linger = 2000, ivl = 1000, hb_timeout = 10000;
  const int rcvhwm = 256, sndhwm = int(svc_.config().client_slots) + 64;
  const int64_t max_part = int64_t(ipc::max_message_part(std::max<size_t>(svc_.max_payload(), ipc::kMaxMsgPayload)));
  const struct {
    int option;
    int value;
    const char *name;
  } options[] = {{ZMQ_LINGER, linger, "ZMQ_LINGER"},
                 {ZMQ_SNDHWM, sndhwm, "ZMQ_SNDHWM"},
                 {ZMQ_RCVHWM, rcvhwm, "ZMQ_RCVHWM"},
                 {ZMQ_HEARTBEAT_IVL, ivl, "ZMQ_HEARTBEAT_IVL"},
                 {ZMQ_HEARTBEAT_TIMEOUT, hb_timeout, "ZMQ_HEARTBEAT_TIMEOUT"},
                 {ZMQ_HANDSHAKE_IVL, Service::kHandshakeMs, "ZMQ_HANDSHAKE_IVL"}};
  for (const auto &o : options)
    if (chi_status_t s = ipc::set_zmq_option(router_, o.option, &o.value, sizeof o.value, o.name); s != CHI_OK)
      return s;
  if (chi_status_t s = ipc::set_zmq_option(router_, ZMQ_MAXMSGSIZE, &max_part, sizeof max_part, "ZMQ_MAXMSGSIZE");
      s != CHI_OK)
    return s;
  if (curve_.enabled())
    if (chi_status_t s = curve_.apply(router_); s != CHI_OK) return s;
  if (zmq_socket_monitor(router_, "inproc://chimaera-router-monitor",
                         ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_ACCEPT_FAILED) != 0)
    return set_error(CHI_ERR_INTERNAL, "zmq_socket_monitor: %s", zmq_strerror(errno));
  monitor_ = zmq_socket(ctx_, ZMQ_PAIR);
  if (!monitor_ || zmq_connect(monitor_, "inproc://chimaera-router-monitor") != 0)
    return set_error(CHI_ERR_INTERNAL, "cannot watch the ROUTER socket: %s", zmq_strerror(errno));
  if (!tcp) {
    // As for shm://: a lock held for the server's life decides who serves
    // the path; a dead server's socket file is then stale and replaced.
    if (chi_status_t s = ipc::lock_endpoint(address_.substr(6) + ".lock", address_, &lock_fd_); s != CHI_OK)
      return s;
    unlink(address_.c_str() + 6);
  }
  mode_t old = umask(0177);
  int r = zmq_bind(router_, address_.c_str());
  umask(old);
  if (r != 0) return set_error(CHI_ERR_INVALID, "cannot listen on %s: %s", address_.c_str(), zmq_strerror(errno));
  if (tcp) {
    char bound[256] = {0};
    size_t len = sizeof bound - 1;
    if (zmq_getsockopt(router_, ZMQ_LAST_ENDPOINT, bound, &len) == 0) bound_ = bound;
    // What libzmq bound, not what the address looked like: without CURVE
    // only a loopback address may serve.
    if (!curve_.enabled() && !ipc::is_loopback_endpoint(bound_))
      return set_error(CHI_ERR_CONFIG, "%s bound %s, beyond this host, without CURVE keys: refused",
                       address_.c_str(), bound_.empty() ? "an unknown address" : bound_.c_str());
  }
  // umask made it 0600 already; this says so for sure, and never through a
  // symlink that replaced the socket in a folder others can write.
  if (!tcp && fchmodat(AT_FDCWD, address_.c_str() + 6, 0600, AT_SYMLINK_NOFOLLOW) != 0)
    return set_error(CHI_ERR_PERMISSION, "cannot close %s to others: %s", address_.c_str() + 6, strerror(errno));
  return CHI_OK;
}

chi_status_t ZmqListener::start() {
  try {
    io_ = std::thread(&ZmqListener::io_main, this);
  } catch (const std::exception &e) {
    return set_error(CHI_ERR_NOMEM, "cannot start listener threads: %s", e.what());
  }
  if (curve_.enabled())
    if (chi_status_t s = curve_.start(); s != CHI_OK) return s;
  log(LogLevel::kInfo, "serving %s%s", address_.c_str(), curve_.enabled() ? " (CURVE, allow-listed client keys)" : "");
  // A TCP peer has no uid to check: without CURVE, loopback admits every
  // local user (docs/server.md, "Threat model").
  if (ipc::transport_of(address_) == ipc::Transport::kTcp && !curve_.enabled())
    log(LogLevel::kWarn,
        "%s has no CURVE keys: any local user can connect, run tasks, read status and stop this server; "
        "for one user's clients use shm:// or ipc://, or set server.curve_key_file and "
        "server.curve_allowed_keys_file",
        address_.c_str());
  return CHI_OK;
}

void ZmqListener::wake() {
  if (wake_fd_ >= 0 && !eventfd_signal(wake_fd_))
    log(LogLevel::kError, "%s: cannot wake the I/O thread: %s", address_.c_str(), strerror(errno));
}

void ZmqListener::io_main() {
  set_submit_never_blocks(true);  // this thread reaps the GPU tasks it queues
  zmq_pollitem_t items[3] = {{router_, 0, ZMQ_POLLIN, 0}, {nullptr, wake_fd_, ZMQ_POLLIN, 0},
                             {monitor_, 0, ZMQ_POLLIN, 0}};
  while (!quit_.load(std::memory_order_acquire)) {
    // Parked frames (no server slot was free) go before new ones: until they
    // are in, the socket is not read, and zmq's high-water marks push back.
    while (!parked_.empty()) {
      auto &p = parked_.front();
      const size_t used = handle(p.first, -1, reinterpret_cast<const uint8_t *>(p.second.data()), p.second.size());
      if (used < p.second.size()) {
        p.second.erase(0, used);
        break;
      }
      parked_.pop_front();
    }
    items[0].events = parked_.empty() ? ZMQ_POLLIN : 0;
    const long timeout = !gpu_.empty() ? 0 : !parked_.empty() ? 1 : quick_sweeps_ ? 5 : 100;
    if (zmq_poll(items, 3, timeout) < 0 && zmq_errno() != EINTR) {
      log(LogLevel::kError, "%s: zmq_poll: %s: the listener stops", address_.c_str(), zmq_strerror(zmq_errno()));
      break;
    }
    if (items[1].revents & ZMQ_POLLIN) eventfd_drain(wake_fd_);
    if (items[2].revents & ZMQ_POLLIN) monitor_events();
    if (items[0].revents & ZMQ_POLLIN) receive();
    enforce_connection_caps();
    if (!gpu_.empty()) gpu_.reap();
    send_completions();
    // Stopping: tasks taken but not started are answered now (only running
    // ones delay the stop).
    if (svc_.stopping()) cancel_tasks(0);
    flush_replies();
    if (resume_ns_ && now_ns() >= resume_ns_) resume_listening();
    if (now_ns() >= next_sweep_ns_) {
      sweep_sessions(-1);
      expire_pending();
      // Once a second; every 5 ms for a while after a disconnect event
      // (the descriptor it names may close only after the event).
      next_sweep_ns_ = now_ns() + (quick_sweeps_ ? (--quick_sweeps_, 5000000) : 1000000000);
    }
  }
}

void ZmqListener::receive() {
  for (int budget = 0; budget < 256 && parked_.empty(); ++budget) {
    zmq_msg_t idm, body;
    zmq_msg_init(&idm);
    if (zmq_msg_recv(&idm, router_, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&idm);
      return;
    }
    std::string identity(static_cast<char *>(zmq_msg_data(&idm)), zmq_msg_size(&idm));
    const bool more = zmq_msg_more(&idm);
    zmq_msg_close(&idm);
    if (!more) continue;  // a bare identity: nothing to do
    zmq_msg_init(&body);
    if (zmq_msg_recv(&body, router_, 0) < 0) {  // the rest of a message comes whole: never here
      log(LogLevel::kWarn, "%s: dropped a message: %s", address_.c_str(), zmq_strerror(errno));
      zmq_msg_close(&body);
      continue;
    }
    // The connection's descriptor (the ROUTER's identity part carries none):
    // a disconnect event names it, and ipc:// peers' credentials come from it.
    const int fd = zmq_msg_get(&body, ZMQ_SRCFD);
    if (zmq_msg_more(&body)) {
      // A request is exactly one part after the identity: drop anything else.
      zmq_msg_close(&body);
      for (int more2 = 1; more2;) {
        zmq_msg_t x;
        zmq_msg_init(&x);
        more2 = zmq_msg_recv(&x, router_, 0) >= 0 && zmq_msg_more(&x);
        zmq_msg_close(&x);
      }
      reply(identity, ipc::Kind::kGone, 0, CHI_ERR_PROTOCOL, "multi-part request", 18);
      evict(identity, "sent a multi-part request");
      continue;
    }
    const uint8_t *data = static_cast<const uint8_t *>(zmq_msg_data(&body));
    const size_t size = zmq_msg_size(&body);
    const size_t used = handle(identity, fd, data, size);
    if (used < size)
      parked_.emplace_back(identity, std::string(reinterpret_cast<const char *>(data) + used, size - used));
    zmq_msg_close(&body);
  }
}

size_t ZmqListener::handle(const std::string &identity, int fd, const uint8_t *data, size_t size) {
  size_t taken = size;
  std::string why;
  const chi_status_t st = ipc::for_each_frame(data, size, &why, [&](const ipc::Frame &f, size_t at) {
    bool end = false;
    if (!handle_frame(identity, fd, f, &end)) {
      taken = at;  // parked from this frame on
      return false;
    }
    return !end;
  });
  if (st != CHI_OK) {
    log(LogLevel::kWarn, "%s: malformed frame (%s): session closed", address_.c_str(), why.c_str());
    reply(identity, ipc::Kind::kGone, 0, CHI_ERR_PROTOCOL, why.data(), why.size());
    evict(identity, "malformed frame");
    return size;
  }
  return taken;
}

bool ZmqListener::handle_frame(const std::string &identity, int fd, const ipc::Frame &f, bool *end) {
  if (f.kind == ipc::Kind::kHello) {
    handle_hello(identity, fd, f.id, f.payload, f.size);
    return true;
  }
  Session *s;
  {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    auto it = sessions_.find(identity);
    s = it == sessions_.end() ? nullptr : &it->second;
  }
  if (s && fd >= 0 && s->fd >= 0 && fd != s->fd) {
    // A routing id can be chosen by the peer: a gone client's, back on
    // another connection, must not carry on its session.
    drop_session_of_other_connection(identity);
    s = nullptr;
  }
  if (!s) {
    // No hello first (or a session we dropped): the peer must connect again.
    log(LogLevel::kInfo, "%s: a frame (kind %u) from a connection with no session: closed", address_.c_str(),
        unsigned(f.kind));
    reply(identity, ipc::Kind::kGone, 0, CHI_ERR_PROTOCOL, "no session: say hello first", 27);
    *end = true;
    return true;
  }
  switch (f.kind) {
    case ipc::Kind::kSubmit:
      return handle_submit(*s, identity, f);
    case ipc::Kind::kControl: {
      std::string out;
      const chi_status_t st = svc_.control(s->id, ipc::Op(f.method), uint32_t(f.route), f.payload, f.size, &out,
                                           address_ + " session " + std::to_string(s->id));
      reply(identity, ipc::Kind::kControlReply, f.id, st, out.data(), out.size());
      return true;
    }
    case ipc::Kind::kBye:
      evict(identity, "said goodbye");
      *end = true;
      return true;
    default:
      reply(identity, ipc::Kind::kGone, 0, CHI_ERR_PROTOCOL, "unexpected frame kind", 21);
      evict(identity, "unexpected frame kind");
      *end = true;
      return true;
  }
}

void ZmqListener::handle_hello(const std::string &identity, int fd, uint64_t id, const uint8_t *p, uint32_t n) {
  bool other_connection = false;
  {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    auto it = sessions_.find(identity);
    if (it != sessions_.end()) {
      other_connection = fd >= 0 && it->second.fd >= 0 && fd != it->second.fd;
      if (!other_connection) {
        reply(identity, ipc::Kind::kGone, 0, CHI_ERR_PROTOCOL, "hello twice", 11);
        return;
      }
    }
  }
  if (other_connection) drop_session_of_other_connection(identity);
  // ipc:// peers are on this host: the service admits only this user.
  ucred cred{};
  cred.uid = uid_t(-1);
  // A peer whose uid cannot be told (no descriptor) is refused, not taken
  // for a TCP one.
  const bool local = ipc::transport_of(address_) == ipc::Transport::kIpc;
  if (local) {
    socklen_t len = sizeof cred;
    if (fd < 0 || getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) cred.uid = uid_t(-1);
  }
  ipc::Hello hello{};
  std::string why;
  if (chi_status_t st = svc_.admit(address_, p, n, local ? &cred.uid : nullptr, &hello, &why); st != CHI_OK) {
    const std::string body = ipc::refusal_body(why);
    return reply(identity, ipc::Kind::kWelcome, id, st, body.data(), body.size());
  }
  Session s;
  s.id = svc_.next_session_id();
  s.fd = fd;
  struct stat st;
  if (fd >= 0 && fstat(fd, &st) == 0) s.ino = uint64_t(st.st_ino);
  settled(fd, s.ino);
  s.tasks = hello.kind == ipc::kSessionTasks;
  {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    sessions_[identity] = s;
  }
  const std::string body = svc_.welcome_body(svc_.welcome(s.id));
  reply(identity, ipc::Kind::kWelcome, id, CHI_OK, body.data(), body.size());
}

ZmqListener::Task *ZmqListener::new_task() {
  if (spare_.empty()) return new Task;
  Task *t = spare_.back();
  spare_.pop_back();
  return t;
}

void ZmqListener::recycle(Task *t) {
  if (spare_.size() >= 4096 || t->output.capacity() > kKeptOutputBytes) {
    delete t;
    return;
  }
  spare_.push_back(t);
}

bool ZmqListener::handle_submit(Session &s, const std::string &identity, const ipc::Frame &f) {
  if (!s.tasks) {
    reply(identity, ipc::Kind::kResult, f.id, CHI_ERR_PROTOCOL, nullptr, 0);
    return true;
  }
  if (svc_.over_limit(s.in_flight)) return false;
  Task *t = new_task();
  t->identity = identity;
  t->session = s.id;
  t->id = f.id;
  t->taken_ns = RouteStats::sample() ? now_ns() : -1;  // one in 64, as the shm pollers
  const Service::Take r = svc_.take(f.method, f.route, f.payload, f.size, false, out_buf_.data(), out_buf_.size(),
                                    this, reinterpret_cast<uint64_t>(t), &gpu_);
  if (r.what == Service::Take::kBusy) {
    recycle(t);
    return false;  // parked: retried when a slot frees
  }
  ++s.submitted;
  if (r.what == Service::Take::kQueued) {
    ++s.in_flight;
    in_flight_.fetch_add(1, std::memory_order_acq_rel);
    if (r.cpu) {
      t->eslot = r.eslot;
      t->egen = r.egen;
      track(t);
    }
    return true;
  }
  // Ran here or refused: the reply goes out without a worker hand-off.
  ++s.finished;
  reply(identity, ipc::Kind::kResult, f.id, r.status, out_buf_.data(),
        r.what == Service::Take::kRan ? r.output_size : 0);
  svc_.finished(r.status, t->taken_ns);
  recycle(t);
  return true;
}

void ZmqListener::complete(uint64_t cookie, chi_status_t status, const void *output, size_t size) {
  Task *t = reinterpret_cast<Task *>(cookie);
  t->status = status;
  t->output.assign(static_cast<const char *>(output), size);
  {
    std::lock_guard<std::mutex> lock(done_mu_);
    done_.push_back(t);
  }
  wake();
}

void ZmqListener::send_completions() {
  std::vector<Task *> done;
  {
    std::lock_guard<std::mutex> lock(done_mu_);
    if (done_.empty()) return;
    done.swap(done_);
  }
  for (Task *t : done) {
    untrack(t);
    if (answered(t->identity, t->session))
      reply(t->identity, ipc::Kind::kResult, t->id, t->status, t->output.data(), t->output.size());
    svc_.finished(t->status, t->taken_ns);
    in_flight_.fetch_sub(1, std::memory_order_acq_rel);
    recycle(t);
  }
}

bool ZmqListener::answered(const std::string &identity, uint32_t session) {
  {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    // By session, not by identity: a peer evicted with a task running may
    // say hello again on the same connection, and that session owes nothing.
    auto it = sessions_.find(identity);
    if (it != sessions_.end() && it->second.id == session) {
      ++it->second.finished;
      --it->second.in_flight;
      return true;
    }
  }
  bool last = false;
  {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    auto e = ended_.find(session);
    if (e != ended_.end()) {
      ++e->second.finished;
      last = --e->second.in_flight == 0;
      if (last) ended_.erase(e);
    }
  }
  if (last) svc_.session_ended(session);  // its last task ended: its device memory may go
  return false;
}

void ZmqListener::track(Task *t) {
  if (!queued_.next) queued_.next = queued_.prev = &queued_;
  t->prev = queued_.prev;
  t->next = &queued_;
  queued_.prev->next = t;
  queued_.prev = t;
}

void ZmqListener::untrack(Task *t) {
  if (!t->next) return;
  t->prev->next = t->next;
  t->next->prev = t->prev;
  t->prev = t->next = nullptr;
}

uint32_t ZmqListener::cancel_tasks(uint32_t session) {
  if (!queued_.next) return 0;
  uint32_t n = 0;
  for (Task *t = queued_.next, *next; t != &queued_; t = next) {
    next = t->next;
    if (session && t->session != session) continue;
    // The executor decides: a task a worker started runs to its end.
    if (!svc_.cancel(t->eslot, t->egen)) continue;
    ++n;
    untrack(t);
    if (session) {
      svc_.cancelled();  // its session is gone with its counters
    } else {
      if (answered(t->identity, t->session))
        reply(t->identity, ipc::Kind::kResult, t->id, CHI_ERR_SHUTDOWN, nullptr, 0);
      svc_.finished(CHI_ERR_SHUTDOWN, t->taken_ns);
    }
    in_flight_.fetch_sub(1, std::memory_order_acq_rel);
    recycle(t);
  }
  return n;
}

}  // namespace chi

// The ZeroMQ listener's replies and sessions: replies gathered per client
// and sent as one part, the sessions swept when their connections go, and
// the end of it all at stop (zmq_listener.cpp has the requests).
#include <errno.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>

#include "base/futex.h"
#include "base/log.h"
#include "config/config.h"
#include "ipc/zmq_events.h"
#include "server/zmq_listener.h"

namespace chi {

namespace {
// Reply buffers kept between I/O turns: one per recent client, up to this
// many, each kept while at most kKeptReplyBytes.
constexpr size_t kMaxReplyBuffers = 1024;
// Stop: how long the listener waits for clients to close after their Gone frame.
constexpr int kGoneDrainMs = 1000;
}  // namespace

void ZmqListener::rows(std::vector<ClientRow> *out) {
  // ZeroMQ sessions: the peer's pid and uid are not known (-1) off-host.
  std::lock_guard<std::mutex> lock(sessions_mu_);
  for (auto &kv : sessions_)
    if (kv.second.tasks)
      out->push_back({kv.second.id, -1, unsigned(-1), kv.second.submitted, kv.second.finished, kv.second.in_flight, -1});
  for (auto &kv : ended_)
    out->push_back({kv.first, -1, unsigned(-1), kv.second.submitted, kv.second.finished, kv.second.in_flight, -1, true});
}

void ZmqListener::reply(const std::string &identity, ipc::Kind kind, uint64_t id, int32_t status, const void *p,
                        size_t n) {
  if (identity.empty()) return;  // a task of a session that went (evict): answers no one
  ipc::Frame f;
  f.kind = kind;
  f.id = id;
  f.status = status;
  f.payload = static_cast<const uint8_t *>(p);
  f.size = uint32_t(std::min<size_t>(n, ipc::kMaxFramePayload));
  // Gathered per client and sent as one part by flush_replies (the I/O loop
  // flushes every turn); a batch that reached kBatchBytes goes at once.
  auto [it, fresh] = out_index_.try_emplace(identity, out_.size());
  if (fresh) out_.emplace_back(identity, std::string());
  std::string *batch = &out_[it->second].second;
  ipc::append_frame(f, batch);
  if (batch->size() >= ipc::kBatchBytes) send_batch(identity, batch);
}

void ZmqListener::send_batch(const std::string &identity, std::string *batch) {
  // A peer that is gone, or whose pipe is full, loses these replies: counted,
  // and logged now and then (its session ends with its connection).
  if (zmq_send(router_, identity.data(), identity.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
      zmq_send(router_, batch->data(), batch->size(), ZMQ_DONTWAIT) < 0) {
    ++drops_;
    if ((drops_ & (drops_ - 1)) == 0)
      log(LogLevel::kWarn, "%s: dropped replies to a client (%s); %llu dropped so far", address_.c_str(),
          zmq_strerror(errno), (unsigned long long)drops_);
  }
  // Keeps a small buffer's capacity for the next turn; a big one goes.
  if (batch->capacity() > kKeptReplyBytes)
    std::string().swap(*batch);
  else
    batch->clear();
}

void ZmqListener::flush_replies() {
  for (auto &o : out_)
    if (!o.second.empty()) send_batch(o.first, &o.second);
  // The buffers stay (no allocation per reply on the hot path), up to a
  // bound: gone clients' entries are dropped with the rest now and then.
  if (out_.size() > kMaxReplyBuffers) {
    out_.clear();
    out_index_.clear();
  }
}

void ZmqListener::monitor_events() {
  uint16_t event;
  uint32_t value;
  while (ipc::next_monitor_event(monitor_, &event, &value)) {
    if (event == ZMQ_EVENT_ACCEPTED) {
      accepted(int(value));
      continue;
    }
    if (event == ZMQ_EVENT_ACCEPT_FAILED) {
      accept_failed(int(value));
      continue;
    }
    if (event != ZMQ_EVENT_DISCONNECTED) continue;
    forget_pending(int(value));
    sweep_sessions(int(value));
    quick_sweeps_ = 40;  // a client that left is seen within 5 ms, not at the next 1 s sweep
    next_sweep_ns_ = std::min(next_sweep_ns_, now_ns() + 5000000);
  }
}

// A disconnect event names a descriptor, and may come after a new
// connection already reuses it (events and messages travel on different
// pipes): a session is dropped only when its descriptor is closed or holds
// another socket (inode) than at its hello.  A session whose socket still
// looks open is checked again by the periodic sweep.
void ZmqListener::sweep_sessions(int only_fd) {
  std::vector<std::string> gone;
  {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    for (auto &kv : sessions_) {
      const Session &s = kv.second;
      if (s.fd < 0 || (only_fd >= 0 && s.fd != only_fd)) continue;
      struct stat st;
      if (fstat(s.fd, &st) != 0 || uint64_t(st.st_ino) != s.ino) gone.push_back(kv.first);
    }
  }
  for (const std::string &id : gone) evict(id, "connection closed");
}

// Connections are counted from libzmq's ACCEPTED events (the descriptor is
// the event's value) until their hello makes a session.  The descriptor is
// libzmq's: it is only ever shut down (libzmq then sees the end and closes
// it), and only while it still holds the socket it held at the accept, so a
// descriptor closed and reused meanwhile is left alone.
void ZmqListener::accepted(int fd) {
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) return;
  {
    // Events and messages travel on different pipes: its hello may have
    // come first.
    std::lock_guard<std::mutex> lock(sessions_mu_);
    for (auto &kv : sessions_)
      if (kv.second.fd == fd && kv.second.ino == uint64_t(st.st_ino)) return;
  }
  pending_.push_back(Pending{fd, uint64_t(st.st_ino), now_ns()});
}

// Called after the turn's messages were read, so that hellos already queued
// settle their connections first.  Beyond max_connections in all, the oldest
// connection without a hello goes once it had kPendingGraceNs to say it
// (else the newest): a peer that opens many and stays silent loses its own,
// and a newcomer that says hello at once gets in.  Below that bound nothing
// is cut before its time (hello_timeout_ms after the handshake): a job's
// ranks connecting together under load must all get in, and a ZeroMQ client
// does not reconnect.  Each waiting connection holds at most one message
// part (ZMQ_MAXMSGSIZE).
void ZmqListener::enforce_connection_caps() {
  if (pending_.empty()) return;
  size_t sessions;
  {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    sessions = sessions_.size();
  }
  const int64_t now = now_ns();
  const size_t max_all = svc_.max_connections();
  while (!pending_.empty() && sessions + pending_.size() > max_all) {
    if (now - pending_.front().since_ns >= kPendingGraceNs) {
      cut(pending_.front(), "too many connections");
      pending_.erase(pending_.begin());
    } else {
      cut(pending_.back(), "too many connections");
      pending_.pop_back();
    }
  }
}

void ZmqListener::settled(int fd, uint64_t ino) {
  for (size_t i = 0; i < pending_.size(); ++i)
    if (pending_[i].fd == fd && pending_[i].ino == ino) {
      pending_.erase(pending_.begin() + long(i));
      return;
    }
}

void ZmqListener::forget_pending(int fd) {
  for (size_t i = 0; i < pending_.size(); ++i)
    if (pending_[i].fd == fd) {
      pending_.erase(pending_.begin() + long(i));
      return;
    }
}

void ZmqListener::expire_pending() {
  const int64_t limit = (int64_t(svc_.config().hello_timeout_ms) + Service::kHandshakeMs) * 1000000;
  const int64_t now = now_ns();
  while (!pending_.empty() && now - pending_.front().since_ns > limit) {
    cut(pending_.front(), "no hello in time");
    pending_.erase(pending_.begin());
  }
}

namespace {
constexpr int64_t kAcceptPauseNs = 100 * 1000000;
}  // namespace

void ZmqListener::accept_failed(int error) {
  if (error != EMFILE && error != ENFILE && error != ENOBUFS && error != ENOMEM) return;
  // One response per pause, however many failures libzmq reported meanwhile.
  const int64_t now = now_ns();
  if (now < accept_quiet_ns_) return;
  accept_quiet_ns_ = now + kAcceptPauseNs;
  ++accept_failures_;
  if ((accept_failures_ & (accept_failures_ - 1)) == 0)
    log(LogLevel::kWarn, "%s: accept: %s: not accepting for %lld ms (%llu time(s) so far)", address_.c_str(),
        zmq_strerror(error), (long long)(kAcceptPauseNs / 1000000), (unsigned long long)accept_failures_);
  // The oldest silent connections go first: often that frees enough.  (Their
  // clients see the connection end; that is the price of running out.)
  for (int k = 0; k < 4 && !pending_.empty(); ++k) {
    cut(pending_.front(), "out of descriptors");
    pending_.erase(pending_.begin());
  }
  // An ipc:// path stays bound (unbinding would hand the path to whoever
  // binds it next); its peers are this user's processes.
  if (resume_ns_ || bound_.empty()) return;
  if (zmq_unbind(router_, bound_.c_str()) != 0) {
    log(LogLevel::kWarn, "%s: zmq_unbind: %s", address_.c_str(), zmq_strerror(errno));
    return;
  }
  resume_ns_ = accept_quiet_ns_;
}

void ZmqListener::resume_listening() {
  if (zmq_bind(router_, bound_.c_str()) == 0) {
    resume_ns_ = 0;
    return;
  }
  // Still out of descriptors (or the port taken meanwhile): try again later.
  resume_ns_ = now_ns() + kAcceptPauseNs;
  ++rebind_failures_;
  if ((rebind_failures_ & (rebind_failures_ - 1)) == 0)
    log(LogLevel::kWarn, "%s: cannot listen again yet: %s (%llu time(s) so far)", address_.c_str(),
        zmq_strerror(errno), (unsigned long long)rebind_failures_);
}

void ZmqListener::cut(const Pending &p, const char *why) {
  struct stat st;
  if (fstat(p.fd, &st) != 0 || uint64_t(st.st_ino) != p.ino) return;  // gone already
  shutdown(p.fd, SHUT_RDWR);
  ++cuts_;
  if ((cuts_ & (cuts_ - 1)) == 0)  // 1, 2, 4, 8...: never a flood
    log(LogLevel::kWarn, "%s: closed a connection without a session (%s); %llu so far", address_.c_str(), why,
        (unsigned long long)cuts_);
}

void ZmqListener::drop_session_of_other_connection(const std::string &identity) {
  // Replies gathered for the old session this turn go nowhere either.
  auto it = out_index_.find(identity);
  if (it != out_index_.end()) out_[it->second].second.clear();
  evict(identity, "its routing id came back on another connection");
}

void ZmqListener::evict(const std::string &identity, const char *why) {
  Session s;
  {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    auto it = sessions_.find(identity);
    if (it == sessions_.end()) return;
    s = it->second;
    sessions_.erase(it);
    if (s.tasks) svc_.left();
  }
  if (s.tasks) {
    // Its tasks that no worker started are dropped now; those that run
    // finish, and their results go to no one (answered()).
    const uint32_t dropped = cancel_tasks(s.id);
    s.in_flight -= dropped;
    log(LogLevel::kInfo, "%s: client %u gone: %s; %u queued task(s) cancelled, %u still running",
        address_.c_str(), s.id, why, dropped, s.in_flight);
  }
  // What it registered goes with its last task (a running handler may use
  // its device memory); outside the lock: it may upload the GPUs' region tables.
  if (s.in_flight == 0) {
    svc_.session_ended(s.id);
    return;
  }
  std::lock_guard<std::mutex> lock(sessions_mu_);
  ended_[s.id] = s;
}

void ZmqListener::finish() {
  if (io_.joinable()) {
    quit_.store(true, std::memory_order_release);
    wake();
    io_.join();
    // Requests that arrived but were not read yet are answered, not dropped
    // (the service is stopping: submits get CHI_ERR_SHUTDOWN).
    if (svc_.stopping()) {
      for (auto &p : parked_)
        handle(p.first, -1, reinterpret_cast<const uint8_t *>(p.second.data()), p.second.size());
      parked_.clear();
      receive();
      send_completions();
    }
    flush_replies();
    // Every session learns that the server is gone (then its calls answer
    // CHI_ERR_DISCONNECTED); LINGER gives the frames time to leave.
    std::vector<std::string> ids;
    {
      std::lock_guard<std::mutex> lock(sessions_mu_);
      for (auto &kv : sessions_) ids.push_back(kv.first);
    }
    for (const std::string &id : ids) reply(id, ipc::Kind::kGone, 0, CHI_ERR_DISCONNECTED, nullptr, 0);
    flush_replies();
    // Closing the ROUTER right away was seen to lose the frames still queued
    // for a live peer (a running task's result, then Gone), LINGER
    // notwithstanding.  A client closes its connection when it reads Gone:
    // wait for that, a bounded time, before closing.
    const int64_t until = now_ns() + int64_t(kGoneDrainMs) * 1000000;
    for (;;) {
      sweep_sessions(-1);
      {
        std::lock_guard<std::mutex> lock(sessions_mu_);
        if (sessions_.empty()) break;
      }
      if (now_ns() >= until) {
        log(LogLevel::kInfo, "%s: stop: some clients did not close within %d ms", address_.c_str(), kGoneDrainMs);
        break;
      }
      zmq_pollitem_t item = {monitor_, 0, ZMQ_POLLIN, 0};
      if (zmq_poll(&item, 1, 5) > 0 && (item.revents & ZMQ_POLLIN)) monitor_events();
    }
  }
  curve_.stop();
  if (monitor_) zmq_close(monitor_);
  if (router_) zmq_close(router_);
  monitor_ = router_ = nullptr;
  if (ctx_) zmq_ctx_term(ctx_);
  ctx_ = nullptr;
  if (lock_fd_ >= 0) {
    unlink(address_.c_str() + 6);
    unlink((address_.substr(6) + ".lock").c_str());
    close(lock_fd_);
    lock_fd_ = -1;
  }
}

}  // namespace chi

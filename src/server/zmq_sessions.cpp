// The ZeroMQ listener's replies and sessions: replies gathered per client
// and sent as one part, the sessions swept when their connections go, and
// the end of it all at stop (zmq_listener.cpp has the requests).
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>

#include "base/log.h"
#include "core/futex.h"
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
    if (event != ZMQ_EVENT_DISCONNECTED) continue;
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

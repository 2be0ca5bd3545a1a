#include "server/service.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "base/error.h"
#include "base/futex.h"
#include "base/log.h"
#include "core/runtime.h"
#include "ipc/handshake.h"
#include "server/status.h"

namespace chi {

Service::Service(Runtime &rt) : rt_(rt), stats_(rt.stats(CHI_STATS_CLIENT)), client_mem_(rt) {
  const ServerConfig &sc = rt.config().server;
  // Default: a quarter of the server's slots, at most 1024 (plenty to keep
  // every worker busy), so that no client can hold most of them.
  max_in_flight_ = sc.client_max_in_flight ? sc.client_max_in_flight : std::clamp(rt.config().queue_depth / 4, 1u, 1024u);
  max_payload_ = rt.config().max_inline_payload;
}

const ServerConfig &Service::config() const { return rt_.config().server; }

chi_status_t Service::admit(const std::string &where, const void *payload, size_t size, const uid_t *peer_uid,
                            ipc::Hello *hello, std::string *why) {
  chi_status_t st = CHI_OK;
  if (peer_uid && *peer_uid != geteuid()) {
    st = CHI_ERR_PERMISSION;
    *why = "uid " + std::to_string(*peer_uid) + " may not connect: this server admits its own user (uid " +
           std::to_string(geteuid()) + ")";
  } else if (ipc::check_hello(payload, size, hello, why) != CHI_OK) {
    st = CHI_ERR_PROTOCOL;
  } else if (stopping()) {
    st = CHI_ERR_SHUTDOWN;
    *why = "the server is stopping";
  } else if (hello->kind == ipc::kSessionTasks) {
    const uint32_t max = config().max_clients;
    uint32_t n = clients_.load(std::memory_order_relaxed);
    do {
      if (n >= max) {
        *why = "the server has server.max_clients (" + std::to_string(max) + ") clients connected";
        st = CHI_ERR_AGAIN;
        break;
      }
    } while (!clients_.compare_exchange_weak(n, n + 1, std::memory_order_relaxed));
    if (st == CHI_OK) rt_.client_count().fetch_add(1, std::memory_order_relaxed);
  }
  if (st != CHI_OK) log(LogLevel::kWarn, "%s: refused a client: %s", where.c_str(), why->c_str());
  return st;
}

uint32_t Service::max_connections() const { return config().max_clients + kMaxPendingConnections; }

void Service::left() {
  clients_.fetch_sub(1, std::memory_order_relaxed);
  rt_.client_count().fetch_sub(1, std::memory_order_relaxed);
}

ipc::Welcome Service::welcome(uint32_t session_id) const {
  ipc::Welcome w{};
  w.protocol = ipc::kProtocolVersion;
  w.library_version = CHI_VERSION_NUMBER;
  w.nslots = config().client_slots;
  w.max_payload = max_payload_;
  w.method_limit = rt_.registry().limit();
  w.gpus = rt_.gpu() ? rt_.gpu()->count() : 0;
  w.session_id = session_id;
  return w;
}

std::string Service::welcome_body(ipc::Welcome w) const {
  std::string dir;
  const bool mps = rt_.gpu() && rt_.gpu()->count() > 0 && rt_.gpu()->mps_active(&dir) && !dir.empty() &&
                   dir[0] == '/' && dir.size() <= ipc::kMaxMpsDirBytes;
  if (mps) w.flags |= ipc::kWelcomeMpsDir;
  std::string body(reinterpret_cast<const char *>(&w), sizeof w);
  if (mps) body += dir;
  return body;
}

chi_status_t Service::control(uint32_t session, ipc::Op op, uint32_t flags, const void *payload, size_t size,
                              std::string *reply, const std::string &who) {
  auto bytes = [&](const void *p, size_t n) {
    reply->assign(static_cast<const char *>(p), n);
    return CHI_OK;
  };
  auto fail = [&](chi_status_t st, const std::string &msg) {
    *reply = msg;
    return st;
  };
  switch (op) {
    case ipc::Op::kLookup: {
      const std::string name(static_cast<const char *>(payload), size);
      if (std::strlen(name.c_str()) != name.size() || check_method_name(name.c_str()) != CHI_OK)
        return fail(CHI_ERR_NOT_FOUND, "no method by that name (not a valid method name)");
      ipc::MethodReply m{};
      if (rt_.registry().lookup(name.c_str(), &m.method) != CHI_OK) return fail(CHI_ERR_NOT_FOUND, last_error());
      return bytes(&m, sizeof m);
    }
    case ipc::Op::kMethodLimit: {
      ipc::MethodReply m{rt_.registry().limit(), 0};
      return bytes(&m, sizeof m);
    }
    case ipc::Op::kStats: {
      chi_stats_t st;
      rt_.read_stats(&st);
      return bytes(&st, sizeof st);
    }
    case ipc::Op::kStatus:
      *reply = status_text(*this, flags & ipc::kStatusJson);
      return CHI_OK;
    case ipc::Op::kPing:
      reply->clear();
      return CHI_OK;
    case ipc::Op::kStop:
      log(LogLevel::kInfo, "stop asked by %s", who.c_str());
      request_stop();
      reply->clear();
      return CHI_OK;
    case ipc::Op::kRegisterGpuMem:
      return client_mem_.add(session, payload, size, reply);
    case ipc::Op::kUnregisterMem:
      return client_mem_.remove(session, payload, size, reply);
  }
  return fail(CHI_ERR_PROTOCOL, "unknown request " + std::to_string(unsigned(op)));
}

Service::Take Service::take(uint32_t method, int32_t route, const void *input, uint32_t size, bool shared_input,
                            void *out, size_t out_capacity, RemoteSink *sink, uint64_t cookie, GpuTasks *gpu) {
  const bool cpu = route == CHI_ROUTE_CPU || route == CHI_ROUTE_LOCAL;
  const MethodEntry *m = nullptr;
  chi_status_t early = stopping()             ? CHI_ERR_SHUTDOWN
                       : size > max_payload_ ? CHI_ERR_TOO_LARGE
                       : !(m = rt_.registry().get(method)) ? CHI_ERR_NOT_FOUND
                                                            : CHI_OK;
  Take t{Take::kFailed, early, 0, false, 0, 0};
  if (early == CHI_OK && cpu && config().inline_builtins && m->bounded.load(std::memory_order_relaxed)) {
    // Run to completion on this thread: no hand-off to a worker and back.
    // A shared input is copied first (the client may rewrite it).
    if (shared_input) {
      thread_local std::vector<unsigned char> t_scratch;
      if (t_scratch.size() < size) t_scratch.resize(std::max<size_t>(size, max_payload_));
      if (size) std::memcpy(t_scratch.data(), input, size);
      input = t_scratch.data();
    }
    t.what = Take::kRan;
    t.status = run_cpu_handler(rt_.registry(), method, CHI_ROUTE_CPU, input, size, out, out_capacity,
                               &t.output_size);
  } else if (early == CHI_OK && cpu) {
    // One copy of the input, into the executor's slot.
    t.status = rt_.cpu().submit_remote(method, input, size, sink, cookie, &t.eslot, &t.egen);
    t.what = t.status == CHI_OK ? Take::kQueued : t.status == CHI_ERR_AGAIN ? Take::kBusy : Take::kFailed;
    t.cpu = t.what == Take::kQueued;
  } else if (early == CHI_OK) {
    Executor *exec = nullptr;
    uint32_t pool = 0, eslot = 0, egen = 0;
    t.status = rt_.route_executor(route, &exec, &pool);
    if (t.status == CHI_OK) {
      // Never blocks here (set_submit_never_blocks): a full GPU queue answers
      // AGAIN; this thread's finished GPU tasks free its slots.
      t.status = exec->submit(method, input, size, &eslot, &egen);
      if (t.status == CHI_ERR_AGAIN && gpu->reap())
        t.status = exec->submit(method, input, size, &eslot, &egen);
    }
    if (t.status == CHI_OK) gpu->add(cookie, exec, eslot, egen);
    t.what = t.status == CHI_OK ? Take::kQueued : t.status == CHI_ERR_AGAIN ? Take::kBusy : Take::kFailed;
  }
  if (t.what != Take::kBusy) stats_.submitted();
  return t;
}

bool GpuTasks::reap() {
  const size_t before = tasks_.size();
  for (size_t i = 0; i < tasks_.size();) {
    Task &t = tasks_[i];
    int finished = 0;
    if (t.exec->test(t.slot, t.gen, &finished) == CHI_OK && !finished) {
      ++i;
      continue;
    }
    size_t size = 0;
    const chi_status_t s = t.exec->wait(t.slot, t.gen, 0, out_(t.cookie), capacity_, &size);
    if (s == CHI_ERR_TIMEOUT) {
      ++i;
      continue;
    }
    const uint64_t cookie = t.cookie;
    t = tasks_.back();
    tasks_.pop_back();
    done_(cookie, s, s == CHI_ERR_TOO_LARGE ? 0 : size);
  }
  return tasks_.size() < before;
}

void Service::finished(chi_status_t status, int64_t taken_ns) {
  stats_.finished(status, taken_ns < 0 ? -1 : now_ns() - taken_ns);
}

bool Service::cancel(uint32_t eslot, uint32_t egen) { return rt_.cpu().cancel_remote(eslot, egen); }

void Service::cancelled() {
  stats_.finished(CHI_ERR_DISCONNECTED, -1);
  rt_.client_cancelled().fetch_add(1, std::memory_order_relaxed);
}

void Service::request_stop() {
  std::lock_guard<std::mutex> lock(stop_mu_);
  stop_requested_ = true;
  stop_cv_.notify_all();
}

chi_status_t Service::wait_stop_request(int64_t timeout_ms) {
  std::unique_lock<std::mutex> lock(stop_mu_);
  if (timeout_ms < 0) {
    stop_cv_.wait(lock, [&] { return stop_requested_; });
  } else if (!stop_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return stop_requested_; })) {
    return set_error(CHI_ERR_TIMEOUT, "no stop request within %lld ms", (long long)timeout_ms);
  }
  return CHI_OK;
}

}  // namespace chi

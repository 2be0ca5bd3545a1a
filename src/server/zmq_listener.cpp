#include "server/zmq_listener.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <cstring>

#include "base/error.h"
#include "core/futex.h"
#include "base/log.h"
#include "core/runtime.h"
#include "ipc/channel.h"
#include "ipc/curve.h"
#include "ipc/frame.h"
#include "ipc/handshake.h"
#include "ipc/zmq_events.h"
#include "ipc/wire.h"

namespace chi {

namespace {

// Reply buffers kept between I/O turns: one per recent client, up to this
// many, each kept while at most kKeptReplyBytes.
constexpr size_t kMaxReplyBuffers = 1024;
constexpr size_t kKeptReplyBytes = 16 * 1024;

}  // namespace

struct ZmqListener::Task {
  std::string identity;
  uint64_t id;
  int64_t taken_ns;
  chi_status_t status = CHI_OK;
  std::string output;
};

struct ZmqListener::GpuTask {
  Task *task;
  Executor *exec;
  uint32_t slot, gen;
};

ZmqListener::ZmqListener(Runtime &rt, std::string address, Hooks hooks)
    : rt_(rt), address_(std::move(address)), hooks_(std::move(hooks)) {}

ZmqListener::~ZmqListener() {
  finish();
  for (Task *t : done_) delete t;
  if (wake_fd_ >= 0) close(wake_fd_);
}

chi_status_t ZmqListener::open(Runtime &rt, const std::string &address, Hooks hooks,
                               std::unique_ptr<ZmqListener> *out) {
  std::unique_ptr<ZmqListener> l(new ZmqListener(rt, address, std::move(hooks)));
  if (chi_status_t s = l->bind(); s != CHI_OK) {
    l->finish();
    return s;
  }
  *out = std::move(l);
  return CHI_OK;
}

chi_status_t ZmqListener::bind() {
  const ServerConfig &sc = rt_.config().server;
  // Default: a quarter of the server's slots, at most 1024 (plenty to keep
  // every worker busy), so that no client can hold most of them.
  max_in_flight_ = sc.client_max_in_flight ? sc.client_max_in_flight
                                       : std::clamp(rt_.config().queue_depth / 4, 1u, 1024u);
  const bool tcp = address_.compare(0, 6, "tcp://") == 0;
  if (tcp) {
    std::string hp = address_.substr(6);
    size_t colon = hp.rfind(':');
    int port = colon == std::string::npos ? 0 : atoi(hp.c_str() + colon + 1);
    if (colon == std::string::npos || colon == 0 || port < 1 || port > 65535)
      return set_error(CHI_ERR_INVALID, "%s is not tcp://HOST:PORT", address_.c_str());
    std::string host = hp.substr(0, colon);
    const bool loopback = ipc::is_loopback_host(host);
    if (!sc.curve_key_file.empty() || !sc.curve_allowed_keys_file.empty()) {
      if (sc.curve_key_file.empty() || sc.curve_allowed_keys_file.empty())
        return set_error(CHI_ERR_CONFIG, "%s: CURVE needs both server.curve_key_file and "
                         "server.curve_allowed_keys_file", address_.c_str());
      if (chi_status_t s = ipc::read_secret_key(sc.curve_key_file, &secret_); s != CHI_OK) return s;
      if (chi_status_t s = ipc::read_allowed_keys(sc.curve_allowed_keys_file, &allowed_); s != CHI_OK) return s;
      curve_ = true;
    } else if (!loopback) {
      return set_error(CHI_ERR_CONFIG,
                       "%s listens beyond this host: set server.curve_key_file and "
                       "server.curve_allowed_keys_file (chimaera-ctl keygen makes keys), or listen on "
                       "127.0.0.1",
                       address_.c_str());
    }
  } else if (address_.compare(0, 6, "ipc://") != 0) {
    return set_error(CHI_ERR_INVALID, "%s is not an ipc:// or tcp:// address", address_.c_str());
  }
  ctx_ = zmq_ctx_new();
  if (!ctx_) return set_error(CHI_ERR_NOMEM, "zmq_ctx_new failed");
  if (curve_) {
    // The ZAP handler must be bound before the CURVE socket takes a client.
    zap_ = zmq_socket(ctx_, ZMQ_REP);
    if (!zap_ || zmq_bind(zap_, "inproc://zeromq.zap.01") != 0)
      return set_error(CHI_ERR_INTERNAL, "cannot start the ZAP handler: %s", zmq_strerror(errno));
  }
  router_ = zmq_socket(ctx_, ZMQ_ROUTER);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (!router_ || wake_fd_ < 0) return set_error(CHI_ERR_INTERNAL, "cannot make a zmq socket: %s", zmq_strerror(errno));
  // LINGER: replies and the final "gone" frames leave before the socket closes.
  int linger = 2000, hwm = 65536, ivl = 1000, hb_timeout = 30000;
  zmq_setsockopt(router_, ZMQ_LINGER, &linger, sizeof linger);
  zmq_setsockopt(router_, ZMQ_SNDHWM, &hwm, sizeof hwm);
  zmq_setsockopt(router_, ZMQ_RCVHWM, &hwm, sizeof hwm);
  zmq_setsockopt(router_, ZMQ_HEARTBEAT_IVL, &ivl, sizeof ivl);
  zmq_setsockopt(router_, ZMQ_HEARTBEAT_TIMEOUT, &hb_timeout, sizeof hb_timeout);
  if (curve_) {
    int one = 1;
    zmq_setsockopt(router_, ZMQ_CURVE_SERVER, &one, sizeof one);
    zmq_setsockopt(router_, ZMQ_CURVE_SECRETKEY, secret_.c_str(), 40);
  }
  if (zmq_socket_monitor(router_, "inproc://chimaera-router-monitor", ZMQ_EVENT_DISCONNECTED) != 0)
    return set_error(CHI_ERR_INTERNAL, "zmq_socket_monitor: %s", zmq_strerror(errno));
  monitor_ = zmq_socket(ctx_, ZMQ_PAIR);
  zmq_connect(monitor_, "inproc://chimaera-router-monitor");
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
  if (!tcp) chmod(address_.c_str() + 6, 0600);
  return CHI_OK;
}

chi_status_t ZmqListener::start() {
  try {
    io_ = std::thread(&ZmqListener::io_main, this);
    if (curve_) zap_thread_ = std::thread(&ZmqListener::zap_main, this);
  } catch (const std::exception &e) {
    return set_error(CHI_ERR_NOMEM, "cannot start listener threads: %s", e.what());
  }
  log(LogLevel::kInfo, "serving %s%s", address_.c_str(), curve_ ? " (CURVE, allow-listed client keys)" : "");
  return CHI_OK;
}

// ZAP (RFC 27): every CURVE handshake asks here; only allow-listed keys pass.
void ZmqListener::zap_main() {
  int timeout = 100;
  zmq_setsockopt(zap_, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
  while (!quit_.load(std::memory_order_acquire)) {
    std::vector<std::string> parts;
    int more = 1;
    while (more) {
      zmq_msg_t m;
      zmq_msg_init(&m);
      if (zmq_msg_recv(&m, zap_, 0) < 0) {
        zmq_msg_close(&m);
        if (parts.empty()) break;
        continue;
      }
      parts.emplace_back(static_cast<char *>(zmq_msg_data(&m)), zmq_msg_size(&m));
      more = zmq_msg_more(&m);
      zmq_msg_close(&m);
    }
    if (parts.size() < 6) continue;
    // version, request id, domain, address, identity, mechanism, credentials...
    bool ok = parts[0] == "1.0" && parts[5] == "CURVE" && parts.size() >= 7 && parts[6].size() == 32 &&
              allowed_.count(parts[6]);
    if (!ok) {
      char z85[41] = "?";
      if (parts.size() >= 7 && parts[6].size() == 32)
        zmq_z85_encode(z85, reinterpret_cast<const uint8_t *>(parts[6].data()), 32);
      log(LogLevel::kWarn, "%s: refused a client from %s with key %s (not in the allow-list)", address_.c_str(),
          parts[3].c_str(), z85);
    }
    const std::string answer[6] = {"1.0", parts[1], ok ? "200" : "400", ok ? "OK" : "key not allowed", "", ""};
    for (int i = 0; i < 6; ++i)
      zmq_send(zap_, answer[i].data(), answer[i].size(), i < 5 ? ZMQ_SNDMORE : 0);
  }
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
    long timeout = (!gpu_tasks_.empty()) ? 0 : parked_.empty() ? 100 : 1;
    int n = zmq_poll(items, 3, timeout);
    if (n < 0 && zmq_errno() != EINTR) break;
    if (items[1].revents & ZMQ_POLLIN) {
      uint64_t v;
      while (read(wake_fd_, &v, sizeof v) > 0) {
      }
    }
    if (items[2].revents & ZMQ_POLLIN) monitor_events();
    if (items[0].revents & ZMQ_POLLIN) receive();
    send_completions();
    if (!gpu_tasks_.empty()) poll_gpu_tasks();
    flush_replies();
    if (now_ns() >= next_sweep_ns_) {
      sweep_sessions(-1);
      next_sweep_ns_ = now_ns() + 1000000000;  // once a second
    }
  }
}

void ZmqListener::monitor_events() {
  uint16_t event;
  uint32_t value;
  while (ipc::next_monitor_event(monitor_, &event, &value)) {
    if (event == ZMQ_EVENT_DISCONNECTED) sweep_sessions(int(value));
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
  std::lock_guard<std::mutex> lock(sessions_mu_);
  auto it = sessions_.find(identity);
  if (it == sessions_.end()) return;
  if (it->second.tasks) {
    hooks_.clients->fetch_sub(1, std::memory_order_relaxed);
    rt_.client_count().fetch_sub(1, std::memory_order_relaxed);
    log(LogLevel::kInfo, "%s: client %u gone: %s", address_.c_str(), it->second.id, why);
  }
  // Tasks still running finish; their replies to a gone peer are dropped.
  sessions_.erase(it);
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
    bool more = zmq_msg_more(&idm);
    zmq_msg_close(&idm);
    if (!more) continue;  // a bare identity: nothing to do
    zmq_msg_init(&body);
    zmq_msg_recv(&body, router_, 0);
    // The connection's descriptor (the ROUTER's identity part carries none):
    // a disconnect event names it, and ipc:// peers' credentials come from it.
    int fd = zmq_msg_get(&body, ZMQ_SRCFD);
    const bool extra = zmq_msg_more(&body);
    // A request is exactly one part after the identity: drop anything else.
    if (extra) {
      zmq_msg_close(&body);
      for (int more2 = 1; more2;) {
        zmq_msg_t x;
        zmq_msg_init(&x);
        zmq_msg_recv(&x, router_, 0);
        more2 = zmq_msg_more(&x);
        zmq_msg_close(&x);
      }
      reply(identity, int(ipc::Kind::kGone), 0, CHI_ERR_PROTOCOL, "multi-part request", 18);
      evict(identity, "sent a multi-part request");
      continue;
    }
    const uint8_t *data = static_cast<const uint8_t *>(zmq_msg_data(&body));
    const size_t size = zmq_msg_size(&body);
    const size_t used = handle(identity, fd, data, size);
    if (used < size) parked_.emplace_back(identity, std::string(reinterpret_cast<const char *>(data) + used, size - used));
    zmq_msg_close(&body);
  }
}

void ZmqListener::reply(const std::string &identity, int kind, uint64_t id, int32_t status, const void *p, size_t n) {
  ipc::Frame f;
  f.kind = ipc::Kind(kind);
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
  zmq_send(router_, identity.data(), identity.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT);
  zmq_send(router_, batch->data(), batch->size(), ZMQ_DONTWAIT);  // peer gone or full: dropped
  // Keeps a small buffer's capacity for the next turn; a big one goes.
  if (batch->capacity() > kKeptReplyBytes) std::string().swap(*batch);
  else batch->clear();
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

size_t ZmqListener::handle(const std::string &identity, int fd, const uint8_t *data, size_t size) {
  size_t off = 0;
  do {  // an empty part is malformed too
    ipc::Frame f;
    std::string why;
    size_t used = 0;
    if (ipc::decode_next_frame(data + off, size - off, &f, &used, &why) != CHI_OK) {
      log(LogLevel::kWarn, "%s: malformed frame (%s): session closed", address_.c_str(), why.c_str());
      reply(identity, int(ipc::Kind::kGone), 0, CHI_ERR_PROTOCOL, why.data(), why.size());
      evict(identity, "malformed frame");
      return size;
    }
    bool end = false;
    if (!handle_frame(identity, fd, f, &end)) return off;  // parked from this frame on
    if (end) return size;
    off += used;
  } while (off < size);
  return size;
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
  if (!s) {
    // No hello first (or a session we dropped): the peer must connect again.
    reply(identity, int(ipc::Kind::kGone), 0, CHI_ERR_PROTOCOL, "no session: say hello first", 27);
    *end = true;
    return true;
  }
  switch (f.kind) {
    case ipc::Kind::kSubmit:
      return handle_submit(*s, identity, f.id, f.method, f.route, f.payload, f.size);
    case ipc::Kind::kControl:
      handle_control(*s, identity, f.id, f.method, uint32_t(f.route), f.payload, f.size);
      return true;
    case ipc::Kind::kBye:
      evict(identity, "said goodbye");
      *end = true;
      return true;
    default:
      reply(identity, int(ipc::Kind::kGone), 0, CHI_ERR_PROTOCOL, "unexpected frame kind", 21);
      evict(identity, "unexpected frame kind");
      *end = true;
      return true;
  }
}

void ZmqListener::handle_hello(const std::string &identity, int fd, uint64_t id, const uint8_t *p, uint32_t n) {
  ipc::Welcome w{};
  w.protocol = ipc::kProtocolVersion;
  w.library_version = CHI_VERSION_NUMBER;
  auto refuse = [&](chi_status_t st, const std::string &msg) {
    const std::string body = ipc::refusal_body(msg);
    reply(identity, int(ipc::Kind::kWelcome), id, st, body.data(), body.size());
    log(LogLevel::kWarn, "%s: refused a client: %s", address_.c_str(), msg.c_str());
  };
  ipc::Hello hello{};
  std::string why;
  if (ipc::check_hello(p, n, &hello, &why) != CHI_OK) return refuse(CHI_ERR_PROTOCOL, why);
  if (address_.compare(0, 6, "ipc://") == 0 && fd >= 0) {
    ucred cred{};
    socklen_t len = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != geteuid())
      return refuse(CHI_ERR_PERMISSION, "uid " + std::to_string(cred.uid) +
                                            " may not connect: this server admits its own user");
  }
  if (stopping_.load(std::memory_order_acquire)) return refuse(CHI_ERR_SHUTDOWN, "the server is stopping");
  const bool tasks = hello.kind == ipc::kSessionTasks;
  std::lock_guard<std::mutex> lock(sessions_mu_);
  if (sessions_.count(identity)) {
    reply(identity, int(ipc::Kind::kGone), 0, CHI_ERR_PROTOCOL, "hello twice", 11);
    return;
  }
  const ServerConfig &sc = rt_.config().server;
  if (tasks && hooks_.clients->load() >= sc.max_clients) {
    std::string msg = "the server has server.max_clients (" + std::to_string(sc.max_clients) + ") clients connected";
    std::string body(reinterpret_cast<const char *>(&w), sizeof w);
    body += msg;
    reply(identity, int(ipc::Kind::kWelcome), id, CHI_ERR_AGAIN, body.data(), body.size());
    return;
  }
  Session s;
  s.id = next_session_++;
  s.fd = fd;
  struct stat st;
  if (fd >= 0 && fstat(fd, &st) == 0) s.ino = uint64_t(st.st_ino);
  s.tasks = tasks;
  sessions_[identity] = s;
  if (tasks) {
    hooks_.clients->fetch_add(1, std::memory_order_relaxed);
    rt_.client_count().fetch_add(1, std::memory_order_relaxed);
  }
  w.nslots = sc.client_slots;
  w.max_payload = rt_.config().max_inline_payload;
  w.method_limit = rt_.registry().limit();
  w.gpus = rt_.gpu() ? rt_.gpu()->count() : 0;
  w.session_id = s.id;
  reply(identity, int(ipc::Kind::kWelcome), id, CHI_OK, &w, sizeof w);
}

void ZmqListener::handle_control(Session &s, const std::string &identity, uint64_t id, uint32_t op, uint32_t flags,
                                 const uint8_t *p, uint32_t n) {
  auto answer = [&](chi_status_t st, const void *b, size_t len) {
    reply(identity, int(ipc::Kind::kControlReply), id, st, b, len);
  };
  auto fail = [&](chi_status_t st, const std::string &msg) { answer(st, msg.data(), msg.size()); };
  switch (ipc::Op(op)) {
    case ipc::Op::kLookup: {
      std::string name(reinterpret_cast<const char *>(p), n);
      if (std::strlen(name.c_str()) != name.size() || check_method_name(name.c_str()) != CHI_OK)
        return fail(CHI_ERR_NOT_FOUND, "no method by that name (not a valid method name)");
      ipc::MethodReply m{};
      if (rt_.registry().lookup(name.c_str(), &m.method) != CHI_OK) return fail(CHI_ERR_NOT_FOUND, last_error());
      return answer(CHI_OK, &m, sizeof m);
    }
    case ipc::Op::kMethodLimit: {
      ipc::MethodReply m{rt_.registry().limit(), 0};
      return answer(CHI_OK, &m, sizeof m);
    }
    case ipc::Op::kStats: {
      chi_stats_t st;
      rt_.read_stats(&st);
      return answer(CHI_OK, &st, sizeof st);
    }
    case ipc::Op::kStatus: {
      std::string text = hooks_.status(flags & 1);
      return answer(CHI_OK, text.data(), text.size());
    }
    case ipc::Op::kPing:
      return answer(CHI_OK, nullptr, 0);
    case ipc::Op::kStop:
      answer(CHI_OK, nullptr, 0);
      log(LogLevel::kInfo, "%s: stop asked by session %u", address_.c_str(), s.id);
      hooks_.stop_requested();
      return;
    default:
      return fail(CHI_ERR_PROTOCOL, "unknown request " + std::to_string(op));
  }
}

bool ZmqListener::handle_submit(Session &s, const std::string &identity, uint64_t id, uint32_t method, int32_t route,
                                const uint8_t *p, uint32_t n) {
  if (!s.tasks) {
    reply(identity, int(ipc::Kind::kResult), id, CHI_ERR_PROTOCOL, nullptr, 0);
    return true;
  }
  if (s.in_flight >= max_in_flight_ && !stopping_.load(std::memory_order_acquire)) return false;
  auto fail = [&](chi_status_t st) {
    ++s.submitted;
    ++s.finished;
    rt_.stats(CHI_STATS_CLIENT).submitted();
    rt_.stats(CHI_STATS_CLIENT).finished(st, 0);
    reply(identity, int(ipc::Kind::kResult), id, st, nullptr, 0);
    return true;
  };
  if (stopping_.load(std::memory_order_acquire)) return fail(CHI_ERR_SHUTDOWN);
  if (n > rt_.config().max_inline_payload) return fail(CHI_ERR_TOO_LARGE);
  const MethodEntry *entry = rt_.registry().get(method);
  if (!entry) return fail(CHI_ERR_NOT_FOUND);
  const bool cpu = route == CHI_ROUTE_CPU || route == CHI_ROUTE_LOCAL;
  if (cpu && rt_.config().server.inline_builtins && entry->bounded.load(std::memory_order_relaxed)) {
    // Run to completion on this thread: the reply goes out without a
    // worker hand-off and an eventfd wake-up of this thread.
    const int64_t t0 = now_ns();
    if (inline_out_.size() < rt_.config().max_inline_payload) inline_out_.resize(rt_.config().max_inline_payload);
    size_t out_size = 0;
    const chi_status_t st = run_cpu_handler(rt_.registry(), method, CHI_ROUTE_CPU, p, n, inline_out_.data(),
                                            inline_out_.size(), &out_size);
    ++s.submitted;
    ++s.finished;
    rt_.stats(CHI_STATS_CLIENT).submitted();
    reply(identity, int(ipc::Kind::kResult), id, st, inline_out_.data(), out_size);
    rt_.stats(CHI_STATS_CLIENT).finished(st, now_ns() - t0);
    return true;
  }
  auto *t = new Task{identity, id, now_ns(), CHI_OK, {}};
  if (cpu) {
    chi_status_t st = rt_.cpu().submit_remote(method, p, n, this, reinterpret_cast<uint64_t>(t));
    if (st == CHI_ERR_AGAIN) {
      delete t;
      return false;  // parked: retried when a slot frees
    }
    if (st != CHI_OK) {
      delete t;
      return fail(st);
    }
  } else {
    Executor *exec;
    uint32_t pool, slot, gen;
    chi_status_t st = rt_.route_executor(route, &exec, &pool);
    if (st == CHI_OK) st = exec->submit(method, p, n, &slot, &gen);
    if (st == CHI_ERR_AGAIN) {
      // A full GPU queue: collect finished GPU tasks (they free its slots)
      // and try once more, else park the frame like a full CPU pool.
      const size_t before = gpu_tasks_.size();
      poll_gpu_tasks();
      if (gpu_tasks_.size() < before) st = exec->submit(method, p, n, &slot, &gen);
      if (st == CHI_ERR_AGAIN) {
        delete t;
        return false;
      }
    }
    if (st != CHI_OK) {
      delete t;
      return fail(st);
    }
    gpu_tasks_.push_back(GpuTask{t, exec, slot, gen});
  }
  ++s.submitted;
  ++s.in_flight;
  in_flight_.fetch_add(1, std::memory_order_acq_rel);
  rt_.stats(CHI_STATS_CLIENT).submitted();
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
  uint64_t one = 1;
  ssize_t r = write(wake_fd_, &one, sizeof one);
  (void)r;
}

void ZmqListener::send_completions() {
  std::vector<Task *> done;
  {
    std::lock_guard<std::mutex> lock(done_mu_);
    done.swap(done_);
  }
  for (Task *t : done) {
    reply(t->identity, int(ipc::Kind::kResult), t->id, t->status, t->output.data(), t->output.size());
    rt_.stats(CHI_STATS_CLIENT).finished(t->status, now_ns() - t->taken_ns);
    {
      std::lock_guard<std::mutex> lock(sessions_mu_);
      auto it = sessions_.find(t->identity);
      if (it != sessions_.end()) {
        ++it->second.finished;
        --it->second.in_flight;
      }
    }
    in_flight_.fetch_sub(1, std::memory_order_acq_rel);
    delete t;
  }
}

void ZmqListener::poll_gpu_tasks() {
  for (size_t i = 0; i < gpu_tasks_.size();) {
    GpuTask &g = gpu_tasks_[i];
    int done = 0;
    if (g.exec->test(g.slot, g.gen, &done) == CHI_OK && !done) {
      ++i;
      continue;
    }
    std::string out(rt_.config().max_inline_payload, '\0');
    size_t size = 0;
    chi_status_t st = g.exec->wait(g.slot, g.gen, 0, out.data(), out.size(), &size);
    if (st == CHI_ERR_TIMEOUT) {
      ++i;
      continue;
    }
    out.resize(st == CHI_ERR_TOO_LARGE ? 0 : size);
    g.task->status = st;
    g.task->output = std::move(out);
    {
      std::lock_guard<std::mutex> lock(done_mu_);
      done_.push_back(g.task);
    }
    g = gpu_tasks_.back();
    gpu_tasks_.pop_back();
  }
  send_completions();
}

std::vector<ZmqListener::Row> ZmqListener::rows() {
  std::vector<Row> out;
  std::lock_guard<std::mutex> lock(sessions_mu_);
  for (auto &kv : sessions_)
    if (kv.second.tasks) out.push_back({kv.second.id, kv.second.submitted, kv.second.finished, kv.second.in_flight});
  return out;
}

namespace {
// Stop: how long the listener waits for clients to close after their Gone frame.
constexpr int kGoneDrainMs = 1000;
}  // namespace

void ZmqListener::finish() {
  if (io_.joinable()) {
    quit_.store(true, std::memory_order_release);
    uint64_t one = 1;
    ssize_t r = write(wake_fd_, &one, sizeof one);
    (void)r;
    io_.join();
    // Requests that arrived but were not read yet are answered, not dropped
    // (stopping_ is set: submits get CHI_ERR_SHUTDOWN).
    if (stopping_.load(std::memory_order_acquire)) {
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
    for (const std::string &id : ids) reply(id, int(ipc::Kind::kGone), 0, CHI_ERR_DISCONNECTED, nullptr, 0);
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
      zmq_poll(&item, 1, 5);
      if (item.revents & ZMQ_POLLIN) monitor_events();
    }
  }
  if (zap_thread_.joinable()) {
    quit_.store(true, std::memory_order_release);
    zap_thread_.join();
  }
  if (monitor_) zmq_close(monitor_);
  if (router_) zmq_close(router_);
  if (zap_) zmq_close(zap_);
  monitor_ = router_ = zap_ = nullptr;
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

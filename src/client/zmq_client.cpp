#include "client/zmq_client.h"

#include <poll.h>
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
#include "core/executor.h"
#include "core/slot_word.h"
#include "ipc/address.h"
#include "ipc/channel.h"
#include "ipc/curve.h"
#include "ipc/frame.h"
#include "ipc/zmq_events.h"

namespace chi {

namespace {

constexpr uint64_t kControlBit = 1ull << 63;

// The uid of the process that serves an ipc:// connection, from the
// message's descriptor (SO_PEERCRED) or libzmq's Peer-Address property;
// false when neither tells.
bool peer_uid(zmq_msg_t *msg, uid_t *uid) {
  const int fd = zmq_msg_get(msg, ZMQ_SRCFD);
  ucred cred{};
  socklen_t len = sizeof cred;
  if (fd >= 0 && getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
    *uid = cred.uid;
    return true;
  }
  // libzmq 4.3 on Linux: "localhost:UID:GID:PID" for an ipc:// peer.
  const char *pa = zmq_msg_gets(msg, "Peer-Address");
  const char *colon = pa ? std::strchr(pa, ':') : nullptr;
  if (!colon) return false;
  char *end = nullptr;
  const unsigned long v = std::strtoul(colon + 1, &end, 10);
  if (end == colon + 1 || *end != ':') return false;
  *uid = uid_t(v);
  return true;
}

}  // namespace

ZmqClient::~ZmqClient() {
  shutdown_local();
  if (io_.joinable()) {
    if (!gone_.load(std::memory_order_acquire)) {
      // Tell the server this session ends (best effort, never blocking).
      std::lock_guard<std::mutex> lock(out_mu_);
      ipc::Frame bye;
      bye.kind = ipc::Kind::kBye;
      ipc::encode_frame(bye, &out_control_);
    }
    wake_io();
    quit_.store(true, std::memory_order_release);
    wake_io();
    io_.join();
  }
  if (monitor_) zmq_close(monitor_);
  if (dealer_) zmq_close(dealer_);
  if (ctx_) zmq_ctx_term(ctx_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

chi_status_t ZmqClient::connect(const Config &cfg, bool control, std::unique_ptr<Client> *out) {
  std::unique_ptr<ZmqClient> c(new ZmqClient());
  c->cfg_ = cfg;
  c->address_ = cfg.server_address;
  if (chi_status_t s = c->open(control); s != CHI_OK) return s;
  *out = std::move(c);
  return CHI_OK;
}

chi_status_t ZmqClient::open(bool control) {
  const std::string &a = address_;
  if (ipc::transport_of(a) == ipc::Transport::kIpc) {
    struct stat st;
    if (stat(ipc::after_scheme(a), &st) != 0)
      return set_error(CHI_ERR_DISCONNECTED, "no chimaera-server at %s (%s); start one with "
                       "chimaera-server --listen %s", a.c_str(), strerror(errno), a.c_str());
  }
  ctx_ = zmq_ctx_new();
  if (!ctx_) return set_error(CHI_ERR_NOMEM, "zmq_ctx_new failed");
  if (zmq_ctx_set(ctx_, ZMQ_IO_THREADS, 1) != 0)
    return set_error(CHI_ERR_INTERNAL, "libzmq refused ZMQ_IO_THREADS: %s", zmq_strerror(errno));
  dealer_ = zmq_socket(ctx_, ZMQ_DEALER);
  if (!dealer_) return set_error(CHI_ERR_INTERNAL, "cannot make a zmq socket: %s", zmq_strerror(errno));
  if (chi_status_t st = eventfd_open(&wake_fd_); st != CHI_OK) return st;
  const int hwm = 4096;
  // Heartbeats find a peer that hangs (a closed or killed one is seen at
  // once, from the connection); generous, so a loaded machine is not taken
  // for a dead one.
  const int ivl = int(std::max<uint32_t>(cfg_.disconnect_check_ms, 10));
  const int hb_timeout = std::max(10000, 100 * ivl);  // 2 s was seen to expire on a 2-core machine under load
  // A session never survives a reconnection (the server forgets it): no retries.
  const struct {
    int option;
    int value;
    const char *name;
  } options[] = {{ZMQ_LINGER, 0, "ZMQ_LINGER"},
                 {ZMQ_SNDHWM, hwm, "ZMQ_SNDHWM"},
                 {ZMQ_RCVHWM, hwm, "ZMQ_RCVHWM"},
                 {ZMQ_HEARTBEAT_IVL, ivl, "ZMQ_HEARTBEAT_IVL"},
                 {ZMQ_HEARTBEAT_TIMEOUT, hb_timeout, "ZMQ_HEARTBEAT_TIMEOUT"},
                 {ZMQ_RECONNECT_IVL, -1, "ZMQ_RECONNECT_IVL"}};
  for (const auto &o : options)
    if (chi_status_t s = ipc::set_zmq_option(dealer_, o.option, &o.value, sizeof o.value, o.name); s != CHI_OK)
      return s;
  // A reply part is at most a batch plus one frame: a larger one (a server
  // posing as the real one) is refused from its header, never allocated.
  const int64_t max_part = int64_t(ipc::max_message_part(ipc::kMaxFramePayload));
  if (chi_status_t s = ipc::set_zmq_option(dealer_, ZMQ_MAXMSGSIZE, &max_part, sizeof max_part, "ZMQ_MAXMSGSIZE");
      s != CHI_OK)
    return s;
  if (!cfg_.curve_server_key.empty()) {
    if (ipc::transport_of(a) != ipc::Transport::kTcp)
      return set_error(CHI_ERR_CONFIG, "curve_server_key is for tcp:// addresses, not %s", a.c_str());
    if (!ipc::is_z85_key(cfg_.curve_server_key))
      return set_error(CHI_ERR_CONFIG, "curve_server_key is not a z85 public key (40 characters)");
    if (cfg_.curve_key_file.empty())
      return set_error(CHI_ERR_CONFIG, "curve_server_key is set but curve_key_file (this client's secret key) is not");
    std::string secret;
    if (chi_status_t s = ipc::read_secret_key(cfg_.curve_key_file, &secret); s != CHI_OK) return s;
    char pub[41];
    if (zmq_curve_public(pub, secret.c_str()) != 0)
      return set_error(CHI_ERR_CONFIG, "%s: not a CURVE secret key", cfg_.curve_key_file.c_str());
    // A libzmq without CURVE refuses these: never fall back to plain text.
    if (!ipc::zmq_has_curve())
      return set_error(CHI_ERR_CONFIG, "curve_server_key is set but this libzmq (%s) has no CURVE support",
                       ipc::zmq_version_text().c_str());
    chi_status_t cs = ipc::set_zmq_option(dealer_, ZMQ_CURVE_SERVERKEY, cfg_.curve_server_key.c_str(), 40,
                                          "ZMQ_CURVE_SERVERKEY");
    if (cs == CHI_OK) cs = ipc::set_zmq_option(dealer_, ZMQ_CURVE_PUBLICKEY, pub, 40, "ZMQ_CURVE_PUBLICKEY");
    if (cs == CHI_OK) cs = ipc::set_zmq_option(dealer_, ZMQ_CURVE_SECRETKEY, secret.c_str(), 40, "ZMQ_CURVE_SECRETKEY");
    if (cs != CHI_OK) return cs;
  }
  std::string mon = "inproc://chimaera-monitor";
  if (zmq_socket_monitor(dealer_, mon.c_str(),
                         ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CONNECT_RETRIED | ZMQ_EVENT_CLOSED |
                             ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                             ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) != 0)
    return set_error(CHI_ERR_INTERNAL, "zmq_socket_monitor: %s", zmq_strerror(errno));
  monitor_ = zmq_socket(ctx_, ZMQ_PAIR);
  if (!monitor_ || zmq_connect(monitor_, mon.c_str()) != 0)
    return set_error(CHI_ERR_INTERNAL, "cannot watch the connection: %s", zmq_strerror(errno));
  if (zmq_connect(dealer_, a.c_str()) != 0)
    return set_error(CHI_ERR_INVALID, "cannot connect to %s: %s", a.c_str(), zmq_strerror(errno));
  try {
    io_busy_spin_ns_ = wait_yield_ns();
    io_idle_spin_ns_ = wait_spin_ns();
    io_ = std::thread(&ZmqClient::io_main, this);
  } catch (const std::exception &e) {
    return set_error(CHI_ERR_NOMEM, "cannot start the client's I/O thread: %s", e.what());
  }
  // The handshake is a control exchange: Hello out, Welcome back.
  ipc::Hello hello{ipc::kProtocolVersion, CHI_VERSION_NUMBER, control ? ipc::kSessionControl : ipc::kSessionTasks, 0};
  // The reply slot is armed before the request can leave.
  const uint64_t id = kControlBit | next_control_id_++;
  {
    std::lock_guard<std::mutex> lock(reply_mu_);
    ctl_ = Control{};
    ctl_.id = id;
  }
  {
    std::lock_guard<std::mutex> lock(out_mu_);
    ipc::Frame f;
    f.kind = ipc::Kind::kHello;
    f.id = id;
    f.payload = reinterpret_cast<const uint8_t *>(&hello);
    f.size = sizeof hello;
    ipc::encode_frame(f, &out_control_);
  }
  wake_io();
  std::unique_lock<std::mutex> lock(reply_mu_);
  reply_cv_.wait_for(lock, std::chrono::milliseconds(cfg_.connect_timeout_ms),
                     [&] { return ctl_.done || gone_.load(std::memory_order_acquire); });
  if (!ctl_.done) {
    if (gone_.load(std::memory_order_acquire))
      return set_error(connect_failure_.find("CURVE") != std::string::npos || connect_failure_ == "uid"
                           ? CHI_ERR_PERMISSION
                           : CHI_ERR_DISCONNECTED,
                       "cannot connect to %s: %s", a.c_str(), gone_why_.c_str());
    return set_error(CHI_ERR_DISCONNECTED, "no chimaera-server answered at %s within %u ms (connect_timeout_ms)",
                     a.c_str(), cfg_.connect_timeout_ms);
  }
  ipc::Welcome w{};
  const uint32_t kind = control ? ipc::kSessionControl : ipc::kSessionTasks;
  if (chi_status_t s = accept_welcome(ctl_.status, ctl_.payload.data(), ctl_.payload.size(), kind, &w); s != CHI_OK)
    return s;
  if (control) return CHI_OK;
  max_payload_ = w.max_payload;
  slots_.reset(new Slot[w.nslots]);
  slots_free_.init(w.nslots);
  {
    std::lock_guard<std::mutex> out(out_mu_);
    out_slots_.reserve(w.nslots);
  }
  nslots_.store(w.nslots, std::memory_order_release);
  return CHI_OK;
}

void ZmqClient::wake_io() {
  if (!eventfd_signal(wake_fd_))
    log(LogLevel::kError, "%s: cannot wake the I/O thread: %s", address_.c_str(), strerror(errno));
}

void ZmqClient::mark_gone(const char *why) {
  {
    std::lock_guard<std::mutex> lock(reply_mu_);
    if (!gone_.load(std::memory_order_relaxed)) gone_why_ = why;
    gone_.store(true, std::memory_order_release);
  }
  reply_cv_.notify_all();
  // Wake every sleeping waiter: their calls answer DISCONNECTED now.
  const uint32_t n = nslots_.load(std::memory_order_acquire);
  for (uint32_t i = 0; i < n; ++i)
    if (slots_[i].word.load(std::memory_order_relaxed) & slot::kSleeper) futex_wake(&slots_[i].word);
  slots_free_.wake_all();
}

chi_status_t ZmqClient::disconnected(const char *where) {
  std::lock_guard<std::mutex> lock(reply_mu_);
  return set_error(CHI_ERR_DISCONNECTED, "%s: the server %s is gone (%s)", where, address_.c_str(),
                   gone_why_.c_str());
}

void ZmqClient::io_main() {
  zmq_pollitem_t items[3] = {{dealer_, 0, ZMQ_POLLIN, 0}, {nullptr, wake_fd_, ZMQ_POLLIN, 0}, {monitor_, 0, ZMQ_POLLIN, 0}};
  int64_t worked_at = 0;
  while (!quit_.load(std::memory_order_acquire)) {
    items[0].events = short(ZMQ_POLLIN | (backlog_.empty() ? 0 : ZMQ_POLLOUT));
    // Awake while results are due or shortly after its last work: each
    // look is a non-blocking poll, and submits skip the eventfd.
    const int64_t window = io_outstanding_ ? io_busy_spin_ns_ : io_idle_spin_ns_;
    const bool awake = window > 0 && now_ns() - worked_at < window;
    long timeout = 100;
    if (awake) {
      io_awake_.store(true, std::memory_order_seq_cst);
      timeout = 0;
    } else if (io_awake_.load(std::memory_order_relaxed)) {
      // Going to sleep: a submit that still saw it awake wrote no eventfd
      // (out_ready_ then says so: Dekker with submit()).
      io_awake_.store(false, std::memory_order_seq_cst);
      if (out_ready_.load(std::memory_order_seq_cst)) timeout = 0;
    }
    int n = zmq_poll(items, 3, timeout);
    if (n < 0 && zmq_errno() != EINTR) break;
    if (items[1].revents & ZMQ_POLLIN) eventfd_drain(wake_fd_);
    uint32_t moved = 0;
    // Replies before socket events: a result that came before the
    // connection closed is delivered, not lost to the disconnect.
    if (items[0].revents & ZMQ_POLLIN) moved += io_receive();
    if (items[2].revents & ZMQ_POLLIN) io_monitor();
    if (!awake || n > 0 || out_ready_.load(std::memory_order_acquire)) moved += io_send_queued();
    if (moved) worked_at = now_ns();
  }
  io_awake_.store(false, std::memory_order_seq_cst);
  // Last words (kBye) go out if they can; LINGER 0 drops the rest.
  io_send_queued();
}

void ZmqClient::io_monitor() {
  uint16_t event;
  uint32_t value;
  while (ipc::next_monitor_event(monitor_, &event, &value)) {
    switch (event) {
      case ZMQ_EVENT_CONNECT_RETRIED:
        mark_gone("connection refused");
        break;
      case ZMQ_EVENT_DISCONNECTED:
      case ZMQ_EVENT_CLOSED:
        // Events and messages travel on different pipes: a result the
        // server sent before it closed can still sit unread behind this
        // event (seen: a graceful stop's running task answered
        // DISCONNECTED).  Read those first; the receive also processes the
        // socket's pending commands, which make them visible.
        io_receive();
        if (!quit_.load(std::memory_order_acquire)) mark_gone("connection lost");
        break;
      case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
      case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
      case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        connect_failure_ = "CURVE";
        mark_gone("the server refused the CURVE handshake (wrong or missing key?)");
        break;
      default:
        break;
    }
  }
}

uint32_t ZmqClient::io_send_queued() {
  // Frames the socket refused earlier go first, in order.
  while (!backlog_.empty()) {
    if (zmq_send(dealer_, backlog_.front().data(), backlog_.front().size(), ZMQ_DONTWAIT) < 0) return 0;
    backlog_.erase(backlog_.begin());
  }
  std::vector<uint32_t> slots;
  std::string ctl;
  {
    std::lock_guard<std::mutex> lock(out_mu_);
    out_ready_.store(false, std::memory_order_relaxed);
    slots.swap(out_slots_);
    ctl.swap(out_control_);
  }
  io_outstanding_ += uint32_t(slots.size());
  auto send_or_keep = [&](std::string &&frame) {
    if (!backlog_.empty() || zmq_send(dealer_, frame.data(), frame.size(), ZMQ_DONTWAIT) < 0)
      backlog_.push_back(std::move(frame));  // bounded: at most one frame per slot
  };
  const uint32_t moved = uint32_t(slots.size()) + (ctl.empty() ? 0u : 1u);
  if (!ctl.empty()) send_or_keep(std::move(ctl));
  // The submits queued since the last turn leave as batches: one message
  // part of up to kBatchBytes per batch (libzmq's cost is per message).
  std::string batch;
  for (uint32_t i : slots) {
    Slot &s = slots_[i];
    ipc::Frame f;
    f.kind = ipc::Kind::kSubmit;
    f.id = (uint64_t(slot::gen_of(s.word.load(std::memory_order_acquire))) << 32) | i;
    f.method = s.method;
    f.route = s.route;
    f.payload = s.data.data();
    f.size = uint32_t(s.data.size());
    ipc::append_frame(f, &batch);
    if (batch.size() >= ipc::kBatchBytes) {
      send_or_keep(std::move(batch));
      batch.clear();
    }
  }
  if (!batch.empty()) send_or_keep(std::move(batch));
  return moved;
}

uint32_t ZmqClient::io_receive() {
  for (uint32_t got = 0;; ++got) {
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, dealer_, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&msg);
      return got;
    }
    if (!peer_checked_ && ipc::transport_of(address_) == ipc::Transport::kIpc) {
      // Whoever binds the path first answers: in a folder others can write,
      // that may be another user's fake server.  Nothing of this session
      // (the hello's answer included) is read from a stranger.
      peer_checked_ = true;
      uid_t uid = uid_t(-1);
      std::string why;
      if (!peer_uid(&msg, &uid))
        why = address_ + ": cannot tell which user serves it (no peer credentials): refusing to use it";
      else if (uid != geteuid())
        why = address_ + " is served by uid " + std::to_string(uid) + ", not by this user (uid " +
              std::to_string(geteuid()) + "): refusing to talk to another user's server";
      if (!why.empty()) {
        zmq_msg_close(&msg);
        log(LogLevel::kWarn, "%s", why.c_str());
        connect_failure_ = "uid";
        mark_gone(why.c_str());
        return got + 1;
      }
    }
    bool go_on = true;
    std::string why;
    if (ipc::for_each_frame(static_cast<const uint8_t *>(zmq_msg_data(&msg)), zmq_msg_size(&msg), &why,
                            [&](const ipc::Frame &f, size_t) { return go_on = io_frame(f); }) != CHI_OK) {
      log(LogLevel::kWarn, "%s sent a malformed frame (%s): session closed", address_.c_str(), why.c_str());
      mark_gone("the server sent a malformed frame");
      go_on = false;
    }
    zmq_msg_close(&msg);
    if (!go_on) return got + 1;
  }
}

// One frame from the server; false when the session ends with it.
bool ZmqClient::io_frame(const ipc::Frame &f) {
  if (f.kind == ipc::Kind::kGone) {
    // A stopping server says DISCONNECTED with no text; any other Gone
    // closes this session alone, and its text says why (a protocol error,
    // a session the server no longer knows).
    if (f.status == CHI_ERR_DISCONNECTED || f.size == 0) {
      mark_gone("the server stopped");
    } else {
      std::string why = "the server closed the session: ";
      for (uint32_t k = 0; k < f.size && k < 200; ++k) {  // the server's text, printable bytes only
        const unsigned char ch = f.payload[k];
        why += ch >= 0x20 && ch < 0x7F ? char(ch) : '?';
      }
      mark_gone(why.c_str());
    }
    // Gone is the server's last frame: closing the connection now tells
    // a stopping server that everything before it arrived.
    if (zmq_disconnect(dealer_, address_.c_str()) != 0)
      log(LogLevel::kDebug, "%s: zmq_disconnect: %s", address_.c_str(), zmq_strerror(errno));
    return false;
  }
  if ((f.kind == ipc::Kind::kWelcome || f.kind == ipc::Kind::kControlReply) && (f.id & kControlBit)) {
    {
      std::lock_guard<std::mutex> lock(reply_mu_);
      if (f.id == ctl_.id && !ctl_.done) {
        ctl_.done = true;
        ctl_.status = f.status;
        ctl_.payload.assign(reinterpret_cast<const char *>(f.payload), f.size);
      }
    }
    reply_cv_.notify_all();
  } else if (f.kind == ipc::Kind::kResult && !(f.id & kControlBit)) {
    if (io_outstanding_) --io_outstanding_;
    uint32_t i = uint32_t(f.id), gen = uint32_t(f.id >> 32);
    if (i < nslots_.load(std::memory_order_acquire) && f.size <= max_payload_) {
      Slot &s = slots_[i];
      // Written before the publish; a result for a stale or orphaned task
      // only overwrites data that no future reads any more.
      const uint32_t w = s.word.load(std::memory_order_acquire);
      if (slot::gen_of(w) == gen && slot::state_of(w) == slot::kPending) {
        s.data.assign(f.payload, f.payload + f.size);
        s.status = f.status;
        s.output_size.store(f.size, std::memory_order_release);
      }
      if (slot::publish(s.word, gen) == slot::kOrphan) free_slot(i);  // released before its result came
    }
  }
  return true;
}

chi_status_t ZmqClient::control(ipc::Op op, uint16_t flags, const void *payload, uint32_t length, void *reply,
                                uint32_t capacity, uint32_t *reply_length) {
  std::lock_guard<std::mutex> serial(control_mu_);
  if (gone_.load(std::memory_order_acquire)) return disconnected("request");
  const uint64_t id = kControlBit | next_control_id_++;  // under control_mu_
  std::unique_lock<std::mutex> lock(reply_mu_);
  ctl_ = Control{};
  ctl_.id = id;
  lock.unlock();
  {
    std::lock_guard<std::mutex> out(out_mu_);
    ipc::Frame f;
    f.kind = ipc::Kind::kControl;
    f.id = id;
    f.method = uint32_t(op);
    f.route = flags;
    f.payload = static_cast<const uint8_t *>(payload);
    f.size = length;
    ipc::encode_frame(f, &out_control_);
  }
  wake_io();
  lock.lock();
  if (!reply_cv_.wait_for(lock, std::chrono::milliseconds(kControlTimeoutMs),
                          [&] { return ctl_.done || gone_.load(std::memory_order_acquire); })) {
    lock.unlock();
    mark_gone("a control request went unanswered");
    return set_error(CHI_ERR_DISCONNECTED, "%s did not answer within %d ms", address_.c_str(), kControlTimeoutMs);
  }
  if (!ctl_.done) {
    lock.unlock();
    return disconnected("request");
  }
  if (ctl_.status != CHI_OK) return set_error(ctl_.status, "%s", ctl_.payload.c_str());
  uint32_t n = std::min<uint32_t>(uint32_t(ctl_.payload.size()), capacity);
  if (reply && n) std::memcpy(reply, ctl_.payload.data(), n);
  if (reply_length) *reply_length = uint32_t(ctl_.payload.size());
  return CHI_OK;
}

bool ZmqClient::acquire_slot(uint32_t *slot) {
  if (slots_free_.try_acquire(slot)) return true;
  if (!cfg_.submit_blocking) return false;
  const int64_t deadline = now_ns() + int64_t(cfg_.submit_timeout_ms) * 1000000;
  return slots_free_.acquire(slot, deadline, [] {}, [&] { return !gone_.load(std::memory_order_acquire); });
}

void ZmqClient::free_slot(uint32_t i) {
  slot::set_free(slots_[i].word);
  slots_free_.release(i);
}

chi_status_t ZmqClient::submit(chi_route_t route, chi_method_t method, const void *input, size_t input_size,
                               chi_future_t *future) {
  if (gone_.load(std::memory_order_acquire)) return disconnected("chi_submit");
  uint32_t i;
  if (chi_status_t s = take_slot(route, method, input_size, max_payload_, nslots_.load(std::memory_order_relaxed), &i);
      s != CHI_OK)
    return s;
  Slot &s = slots_[i];
  s.method = method;
  s.route = route;
  s.data.assign(static_cast<const uint8_t *>(input), static_cast<const uint8_t *>(input) + input_size);
  const uint32_t gen = slot::begin(s.word);
  {
    std::lock_guard<std::mutex> lock(out_mu_);
    out_slots_.push_back(i);
  }
  // An awake I/O thread sees out_ready_ at its next look (Dekker with io_main).
  out_ready_.store(true, std::memory_order_seq_cst);
  if (!io_awake_.load(std::memory_order_seq_cst)) wake_io();
  *future = encode_future(tag_, kClientPool, gen, i);
  return CHI_OK;
}

chi_status_t ZmqClient::check(uint32_t i, uint32_t gen) const {
  if (i >= nslots_.load(std::memory_order_relaxed)) return set_error(CHI_ERR_INVALID, "unknown future (slot %u)", i);
  if (!slot::live(slots_[i].word.load(std::memory_order_acquire), gen))
    return set_error(CHI_ERR_INVALID, "stale future: already waited on, released or unknown");
  return CHI_OK;
}

chi_status_t ZmqClient::wait(uint32_t i, uint32_t gen, int64_t timeout_ns, void *output, size_t output_capacity,
                             size_t *output_size) {
  if (chi_status_t s = check(i, gen); s != CHI_OK) return s;
  Slot &s = slots_[i];
  slot::WaitPolicy p;
  p.spin_ns = wait_spin_ns();
  p.yield_ns = wait_yield_ns();
  p.slice_ns = int64_t(cfg_.disconnect_check_ms) * 1000000;
  uint32_t w = 0;
  const chi_status_t ws = slot::wait(
      s.word, gen, timeout_ns, p, [&] { return gone_.load(std::memory_order_acquire); }, [] { return false; },
      [] { return true; }, &w);
  if (ws == CHI_ERR_DISCONNECTED) return disconnected("chi_wait");
  if (ws != CHI_OK) return set_error(ws, "task not finished within %lld ns", (long long)timeout_ns);
  if (w != slot::word(gen, slot::kDone)) return set_error(CHI_ERR_INVALID, "stale future: already waited on or released");
  if (output) {
    // CHI_ERR_TOO_LARGE leaves the future valid, so the size is looked at
    // before the claim; it is this task's only if the word still says
    // done(gen) after it (else another thread consumed the future, and the
    // slot may hold the next task).
    const size_t need = s.output_size.load(std::memory_order_acquire);
    if (output_capacity < need) {
      if (s.word.load(std::memory_order_acquire) != w)
        return set_error(CHI_ERR_INVALID, "stale future: consumed by another thread");
      if (output_size) *output_size = need;
      return set_error(CHI_ERR_TOO_LARGE, "output of %zu bytes does not fit a %zu-byte buffer", need,
                       output_capacity);
    }
  }
  if (!slot::claim(s.word, w)) return set_error(CHI_ERR_INVALID, "stale future: consumed by another thread");
  const size_t size = s.data.size();  // claimed: the slot is this thread's
  const chi_status_t status = s.status;
  if (output && size) std::memcpy(output, s.data.data(), size);
  if (output_size) *output_size = size;
  free_slot(i);
  if (status != CHI_OK) set_error(status, "the server's handler returned %d (%s)", status, chi_status_string(status));
  return status;
}

chi_status_t ZmqClient::test(uint32_t i, uint32_t gen, int *done) {
  if (chi_status_t s = check(i, gen); s != CHI_OK) return s;
  *done = slot::state_of(slots_[i].word.load(std::memory_order_acquire)) == slot::kDone;
  if (!*done && gone_.load(std::memory_order_acquire)) return disconnected("chi_test");
  return CHI_OK;
}

bool ZmqClient::finished(uint32_t i, uint32_t gen) const {
  if (i >= nslots_.load(std::memory_order_acquire)) return false;
  return (slots_[i].word.load(std::memory_order_acquire) & ~slot::kSleeper) == slot::word(gen, slot::kDone);
}

chi_status_t ZmqClient::release(uint32_t i, uint32_t gen) {
  if (chi_status_t s = check(i, gen); s != CHI_OK) return s;
  // The I/O thread frees an orphan when its result comes.
  return slot::release(slots_[i].word, gen, [&] { free_slot(i); });
}

}  // namespace chi

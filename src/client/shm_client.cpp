#include "client/shm_client.h"

#include <errno.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "base/error.h"
#include "base/futex.h"
#include "base/log.h"
#include "core/executor.h"
#include "core/runtime.h"
#include "core/slot_word.h"
#include "ipc/channel.h"
#include "ipc/ring.h"

namespace chi {

namespace {

// The segment's slot word and the client's private word share the state
// machine of core/slot_word.h: pending and done mean the same on both.
static_assert(uint32_t(ipc::kSlotSubmitted) == uint32_t(slot::kPending) &&
                  uint32_t(ipc::kSlotDone) == uint32_t(slot::kDone) &&
                  uint32_t(ipc::kSlotSleeper) == uint32_t(slot::kSleeper),
              "segment slot states are the slot word's");

}  // namespace

ShmClient::~ShmClient() {
  shutdown_local();
  if (seg_.base) munmap(seg_.base, seg_.layout.size);
  if (memfd_ >= 0) close(memfd_);
  if (doorbell_ >= 0) close(doorbell_);
  if (sock_ >= 0) close(sock_);
}

chi_status_t ShmClient::connect(const Config &cfg, bool control, std::unique_ptr<Client> *out) {
  std::unique_ptr<ShmClient> c(new ShmClient());
  c->cfg_ = cfg;
  if (chi_status_t s = c->handshake(cfg.server_address, control ? ipc::kSessionControl : ipc::kSessionTasks);
      s != CHI_OK)
    return s;
  *out = std::move(c);
  return CHI_OK;
}

chi_status_t ShmClient::handshake(const std::string &address, uint32_t kind) {
  ipc::Endpoint ep;
  if (chi_status_t s = ipc::resolve_endpoint(address, &ep); s != CHI_OK) return s;
  address_ = "shm://" + ep.name;
  sock_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (sock_ < 0) return set_error(CHI_ERR_INTERNAL, "socket: %s", strerror(errno));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, ep.socket_path.c_str(), ep.socket_path.size() + 1);
  if (::connect(sock_, reinterpret_cast<sockaddr *>(&addr), sizeof addr) != 0)
    return set_error(CHI_ERR_DISCONNECTED, "no chimaera-server at %s (%s: %s); start one with chimaera-server",
                     address_.c_str(), ep.socket_path.c_str(), strerror(errno));
  ipc::Hello hello{ipc::kProtocolVersion, CHI_VERSION_NUMBER, kind, 0};
  if (!ipc::send_msg(sock_, ipc::Kind::kHello, ipc::Op(0), 0, CHI_OK, &hello, sizeof hello))
    return set_error(CHI_ERR_DISCONNECTED, "%s closed the connection during the handshake", address_.c_str());
  ipc::MsgHeader h;
  char buf[1024];
  int fds[2];
  const int limit_ms = int(cfg_.connect_timeout_ms);
  chi_status_t rs = ipc::recv_msg(sock_, &h, buf, sizeof buf, limit_ms, fds);
  memfd_ = fds[0];
  doorbell_ = fds[1];
  if (rs == CHI_ERR_TIMEOUT)
    return set_error(CHI_ERR_DISCONNECTED, "%s did not answer the handshake within %d ms (connect_timeout_ms)",
                     address_.c_str(), limit_ms);
  if (rs != CHI_OK)
    return set_error(rs == CHI_ERR_PROTOCOL ? CHI_ERR_PROTOCOL : CHI_ERR_DISCONNECTED,
                     "handshake with %s failed: %s", address_.c_str(), chi_status_string(rs));
  if (h.kind != uint16_t(ipc::Kind::kWelcome))
    return set_error(CHI_ERR_PROTOCOL, "%s answered the handshake with something else", address_.c_str());
  ipc::Welcome w{};
  if (chi_status_t s = accept_welcome(h.status, buf, h.length, kind, &w); s != CHI_OK) return s;
  if (kind == ipc::kSessionControl) return CHI_OK;
  // Check the shape before mapping, so that a broken server cannot make us
  // read past the mapping.
  ipc::SegmentLayout l = ipc::segment_layout(w.nslots, w.max_payload);
  struct stat st;
  if (memfd_ < 0 || doorbell_ < 0 || l.size != w.segment_size || fstat(memfd_, &st) != 0 ||
      uint64_t(st.st_size) < l.size)
    return set_error(CHI_ERR_PROTOCOL, "%s sent a malformed session segment", address_.c_str());
  void *p = mmap(nullptr, l.size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd_, 0);
  if (p == MAP_FAILED) return set_error(CHI_ERR_NOMEM, "cannot map the session segment: %s", strerror(errno));
  seg_.base = static_cast<uint8_t *>(p);
  seg_.layout = l;
  const ipc::SegmentHeader *sh = seg_.header();
  if (sh->magic != ipc::kSegmentMagic || sh->protocol != ipc::kProtocolVersion || sh->nslots != w.nslots ||
      sh->max_payload != w.max_payload)
    return set_error(CHI_ERR_PROTOCOL, "%s sent a session segment with a bad header", address_.c_str());
  mine_.reset(new std::atomic<uint32_t>[w.nslots]);
  for (uint32_t i = 0; i < w.nslots; ++i) mine_[i].store(slot::word(0, slot::kFree), std::memory_order_relaxed);
  slots_free_.init(w.nslots);
  return CHI_OK;
}

chi_status_t ShmClient::disconnected(const char *where) {
  gone_.store(true, std::memory_order_release);
  return set_error(CHI_ERR_DISCONNECTED, "%s: the server %s is gone", where, address_.c_str());
}

bool ShmClient::server_alive() {
  if (gone_.load(std::memory_order_acquire)) return false;
  if (seg_.base && seg_.header()->server_state.load(std::memory_order_acquire) == ipc::kGone) {
    gone_.store(true, std::memory_order_release);
    return false;
  }
  pollfd p{sock_, POLLRDHUP, 0};
  if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
    gone_.store(true, std::memory_order_release);
    return false;
  }
  return true;
}

chi_status_t ShmClient::control(ipc::Op op, uint16_t flags, const void *payload, uint32_t length,
                                    void *reply, uint32_t capacity, uint32_t *reply_length) {
  std::lock_guard<std::mutex> lock(control_mu_);
  if (gone_.load(std::memory_order_acquire)) return disconnected("request");
  if (!ipc::send_msg(sock_, ipc::Kind::kControl, op, flags, CHI_OK, payload, length)) return disconnected("request");
  ipc::MsgHeader h;
  static thread_local char buf[ipc::kMaxMsgPayload + 1];
  chi_status_t rs = ipc::recv_msg(sock_, &h, buf, ipc::kMaxMsgPayload, kControlTimeoutMs);
  if (rs == CHI_ERR_TIMEOUT) {
    // A late reply would answer the next request: this session is unusable.
    gone_.store(true, std::memory_order_release);
    return set_error(CHI_ERR_DISCONNECTED, "%s did not answer within %d ms", address_.c_str(),
                     kControlTimeoutMs);
  }
  if (rs != CHI_OK) return disconnected("request");
  if (h.kind != uint16_t(ipc::Kind::kControlReply)) {
    gone_.store(true, std::memory_order_release);
    return set_error(CHI_ERR_PROTOCOL, "%s answered a request with a message of kind %u", address_.c_str(), h.kind);
  }
  if (h.status != CHI_OK) {
    buf[h.length] = 0;
    return set_error(h.status, "%s", buf);
  }
  uint32_t n = std::min(h.length, capacity);
  if (reply && n) std::memcpy(reply, buf, n);
  if (reply_length) *reply_length = h.length;
  return CHI_OK;
}

void ShmClient::reap_orphans() {
  if (!orphans_.load(std::memory_order_acquire)) return;
  for (uint32_t i = 0; i < seg_.layout.nslots; ++i) {
    uint32_t w = mine_[i].load(std::memory_order_acquire);
    if (slot::state_of(w) != slot::kOrphan) continue;
    const uint32_t sw = seg_.slot(i)->state.load(std::memory_order_acquire);
    if ((sw & ~slot::kSleeper) != slot::word(slot::gen_of(w), slot::kDone)) continue;
    if (slot::claim(mine_[i], w)) {
      orphans_.fetch_sub(1, std::memory_order_relaxed);
      free_slot(i);
    }
  }
}

bool ShmClient::acquire_slot(uint32_t *slot) {
  if (slots_free_.try_acquire(slot)) return true;
  reap_orphans();
  if (slots_free_.try_acquire(slot)) return true;
  if (!cfg_.submit_blocking) return false;
  const int64_t deadline = now_ns() + int64_t(cfg_.submit_timeout_ms) * 1000000;
  return slots_free_.acquire(slot, deadline, [&] { reap_orphans(); }, [&] { return server_alive(); });
}

void ShmClient::free_slot(uint32_t i) {
  slot::set_free(mine_[i]);
  slots_free_.release(i);
}

chi_status_t ShmClient::submit(chi_route_t route, chi_method_t method, const void *input,
                                   size_t input_size, chi_future_t *future) {
  uint32_t state = seg_.header()->server_state.load(std::memory_order_acquire);
  if (gone_.load(std::memory_order_acquire) || state == ipc::kGone) return disconnected("chi_submit");
  if (state == ipc::kStopping) return set_error(CHI_ERR_SHUTDOWN, "the server %s is stopping", address_.c_str());
  uint32_t slot;
  if (chi_status_t s = take_slot(route, method, input_size, seg_.layout.max_payload, seg_.layout.nslots, &slot);
      s != CHI_OK)
    return s;
  const uint32_t gen = slot::begin(mine_[slot]);
  ipc::post_task(seg_, slot, gen, method, route, input, uint32_t(input_size));
  bool ring = false;
  if (!ipc::ring_push(seg_, slot, [&] { return server_alive(); }, &ring)) return disconnected("chi_submit");
  if (ring) {
    uint64_t one = 1;
    if (write(doorbell_, &one, sizeof one) < 0 && errno != EAGAIN) return disconnected("chi_submit");
  }
  *future = encode_future(tag_, kClientPool, gen, slot);
  return CHI_OK;
}

chi_status_t ShmClient::check(uint32_t i, uint32_t gen) const {
  if (i >= seg_.layout.nslots) return set_error(CHI_ERR_INVALID, "unknown future (slot %u)", i);
  // The private word never says done (that is the segment's word): a live
  // future's task is pending here until a waiter claims it.
  if (mine_[i].load(std::memory_order_acquire) != slot::word(gen, slot::kPending))
    return set_error(CHI_ERR_INVALID, "stale future: already waited on, released or unknown");
  return CHI_OK;
}

chi_status_t ShmClient::wait(uint32_t i, uint32_t gen, int64_t timeout_ns, void *output,
                             size_t output_capacity, size_t *output_size) {
  if (chi_status_t s = check(i, gen); s != CHI_OK) return s;
  ipc::SlotHeader *h = seg_.slot(i);
  slot::WaitPolicy p;
  p.shared = true;
  p.spin_ns = wait_spin_ns();
  p.yield_ns = wait_yield_ns();
  p.slice_ns = int64_t(cfg_.disconnect_check_ms) * 1000000;
  auto gone = [&] {
    return gone_.load(std::memory_order_acquire) ||
           seg_.header()->server_state.load(std::memory_order_acquire) == ipc::kGone;
  };
  uint32_t w = 0;
  const chi_status_t ws = slot::wait(h->state, gen, timeout_ns, p, gone, [] { return false; },
                                     [&] { return server_alive(); }, &w);
  if (ws == CHI_ERR_DISCONNECTED) return disconnected("chi_wait");
  if (ws != CHI_OK) return set_error(ws, "task not finished within %lld ns", (long long)timeout_ns);
  // Another thread may have consumed the future meanwhile, and the slot
  // been used again: the segment then shows another task, and only the
  // private word says whether this future is still live.
  auto consumed = [&] {
    std::atomic_thread_fence(std::memory_order_acquire);  // after the segment reads above
    return mine_[i].load(std::memory_order_relaxed) != slot::word(gen, slot::kPending);
  };
  if ((w & ~slot::kSleeper) != slot::word(gen, slot::kDone)) {
    if (consumed()) return set_error(CHI_ERR_INVALID, "stale future: consumed by another thread");
    return set_error(CHI_ERR_PROTOCOL, "the server wrote slot %u's state word %#x while its task was pending", i, w);
  }
  // Read before the claim (CHI_ERR_TOO_LARGE leaves the future valid): this
  // task's result if the claim succeeds, or, on a refusal, if no other
  // thread consumed the future meanwhile.
  ipc::TaskResult r;
  const bool fits = ipc::read_result(seg_, i, &r);
  if (!fits || (output && output_capacity < r.size)) {
    if (consumed()) return set_error(CHI_ERR_INVALID, "stale future: consumed by another thread");
    if (!fits)
      return set_error(CHI_ERR_PROTOCOL, "the server wrote an output of %u bytes into a %u-byte slot", r.size,
                       seg_.layout.max_payload);
    if (output_size) *output_size = r.size;
    return set_error(CHI_ERR_TOO_LARGE, "output of %u bytes does not fit a %zu-byte buffer", r.size,
                     output_capacity);
  }
  if (!slot::claim(mine_[i], slot::word(gen, slot::kPending)))
    return set_error(CHI_ERR_INVALID, "stale future: consumed by another thread");
  if (output && r.size) std::memcpy(output, r.output, r.size);
  if (output_size) *output_size = r.size;
  free_slot(i);
  if (r.status != CHI_OK)
    set_error(r.status, "the server's handler returned %d (%s)", r.status, chi_status_string(r.status));
  return r.status;
}

chi_status_t ShmClient::test(uint32_t i, uint32_t gen, int *done) {
  if (chi_status_t s = check(i, gen); s != CHI_OK) return s;
  const uint32_t w = seg_.slot(i)->state.load(std::memory_order_acquire);
  *done = (w & ~slot::kSleeper) == slot::word(gen, slot::kDone);
  if (!*done && !server_alive()) return disconnected("chi_test");
  return CHI_OK;
}

bool ShmClient::finished(uint32_t i, uint32_t gen) const {
  if (i >= seg_.layout.nslots) return false;
  return (seg_.slot(i)->state.load(std::memory_order_acquire) & ~slot::kSleeper) == slot::word(gen, slot::kDone);
}

chi_status_t ShmClient::release(uint32_t i, uint32_t gen) {
  if (chi_status_t s = check(i, gen); s != CHI_OK) return s;
  if (slot::orphan(mine_[i], gen) != slot::kOrphan)
    return set_error(CHI_ERR_INVALID, "stale future: already waited on or released");
  orphans_.fetch_add(1, std::memory_order_relaxed);
  // Done already (or the server is gone and never will): recycle it now.
  const uint32_t w = seg_.slot(i)->state.load(std::memory_order_acquire);
  if ((w & ~slot::kSleeper) == slot::word(gen, slot::kDone)) reap_orphans();
  return CHI_OK;
}

}  // namespace chi

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

#include "api/error.h"
#include "core/executor.h"
#include "core/futex.h"
#include "core/log.h"
#include "core/runtime.h"
#include "ipc/channel.h"

namespace chi {

namespace {

// Private slot states.
enum : uint32_t { kFree = 0, kPending = 1, kOrphan = 2, kClaimed = 3, kMask = 0xFF };
inline uint32_t word(uint32_t gen, uint32_t st) { return (gen << 8) | st; }
inline uint32_t gen_of(uint32_t w) { return w >> 8; }
inline uint32_t st_of(uint32_t w) { return w & kMask; }

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
  if (!ipc::send_msg(sock_, ipc::Op::kHello, 0, CHI_OK, &hello, sizeof hello))
    return set_error(CHI_ERR_DISCONNECTED, "%s closed the connection during the handshake", address_.c_str());
  ipc::MsgHeader h;
  char buf[1024];
  int fds[2];
  chi_status_t rs = ipc::recv_msg(sock_, &h, buf, sizeof buf - 1, kConnectTimeoutMs, fds);
  memfd_ = fds[0];
  doorbell_ = fds[1];
  if (rs == CHI_ERR_TIMEOUT)
    return set_error(CHI_ERR_DISCONNECTED, "%s did not answer the handshake within %d ms", address_.c_str(),
                     kConnectTimeoutMs);
  if (rs != CHI_OK)
    return set_error(rs == CHI_ERR_PROTOCOL ? CHI_ERR_PROTOCOL : CHI_ERR_DISCONNECTED,
                     "handshake with %s failed: %s", address_.c_str(), chi_status_string(rs));
  ipc::Welcome w{};
  if (h.op != uint16_t(ipc::Op::kWelcome) || h.length < sizeof w)
    return set_error(CHI_ERR_PROTOCOL, "%s answered the handshake with something else", address_.c_str());
  std::memcpy(&w, buf, sizeof w);
  if (h.status != CHI_OK) {
    buf[h.length] = 0;
    return set_error(h.status, "%s refused the connection: %s", address_.c_str(), buf + sizeof w);
  }
  if (w.protocol != ipc::kProtocolVersion || w.library_version / 100 != CHI_VERSION_NUMBER / 100)
    return set_error(CHI_ERR_PROTOCOL,
                     "version mismatch: client library %s protocol %u, server library %s protocol %u",
                     ipc::version_text(CHI_VERSION_NUMBER).c_str(), ipc::kProtocolVersion,
                     ipc::version_text(w.library_version).c_str(), w.protocol);
  if (kind == ipc::kSessionControl) return CHI_OK;
  // Check the shape before mapping, so that a broken server cannot make us
  // read past the mapping.
  ipc::SegmentLayout l = ipc::segment_layout(w.nslots, w.max_payload);
  struct stat st;
  if (memfd_ < 0 || doorbell_ < 0 || w.nslots < 2 || (w.nslots & (w.nslots - 1)) ||
      w.nslots > (1u << 16) || w.max_payload > (1u << 20) || l.size != w.segment_size ||
      fstat(memfd_, &st) != 0 || uint64_t(st.st_size) < l.size)
    return set_error(CHI_ERR_PROTOCOL, "%s sent a malformed session segment", address_.c_str());
  void *p = mmap(nullptr, l.size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd_, 0);
  if (p == MAP_FAILED) return set_error(CHI_ERR_NOMEM, "cannot map the session segment: %s", strerror(errno));
  seg_.base = static_cast<uint8_t *>(p);
  seg_.layout = l;
  const ipc::SegmentHeader *sh = seg_.header();
  if (sh->magic != ipc::kSegmentMagic || sh->protocol != ipc::kProtocolVersion || sh->nslots != w.nslots ||
      sh->max_payload != w.max_payload)
    return set_error(CHI_ERR_PROTOCOL, "%s sent a session segment with a bad header", address_.c_str());
  if (chi_status_t s = apply_gpu_setting(w.gpus); s != CHI_OK) return s;
  note_method_limit(w.method_limit);
  mine_.reset(new std::atomic<uint32_t>[w.nslots]);
  for (uint32_t i = 0; i < w.nslots; ++i) mine_[i].store(word(0, kFree), std::memory_order_relaxed);
  slots_free_.init(w.nslots);
  log(LogLevel::kInfo, "connected to %s as session %u (%u slots, %u-byte payloads, %d GPU(s))",
      address_.c_str(), w.session_id, w.nslots, w.max_payload, w.gpus);
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
  if (!ipc::send_msg(sock_, op, flags, CHI_OK, payload, length)) return disconnected("request");
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
    if (st_of(w) != kOrphan) continue;
    uint32_t sw = seg_.slot(i)->state.load(std::memory_order_acquire);
    if (ipc::slot_gen(sw) != gen_of(w) || ipc::slot_state(sw) != ipc::kSlotDone) continue;
    if (mine_[i].compare_exchange_strong(w, word(gen_of(w), kClaimed), std::memory_order_acq_rel)) {
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

void ShmClient::free_slot(uint32_t slot) {
  uint32_t w = mine_[slot].load(std::memory_order_relaxed);
  mine_[slot].store(word(gen_of(w), kFree), std::memory_order_release);
  slots_free_.release(slot);
}

chi_status_t ShmClient::submit(chi_route_t route, chi_method_t method, const void *input,
                                   size_t input_size, chi_future_t *future) {
  uint32_t state = seg_.header()->server_state.load(std::memory_order_acquire);
  if (gone_.load(std::memory_order_acquire) || state == ipc::kGone) return disconnected("chi_submit");
  if (state == ipc::kStopping) return set_error(CHI_ERR_SHUTDOWN, "the server %s is stopping", address_.c_str());
  if (chi_status_t s = check_submit(route, method, input_size, seg_.layout.max_payload); s != CHI_OK) {
    if (gone_.load(std::memory_order_acquire)) return disconnected("chi_submit");
    return s;
  }
  uint32_t slot;
  if (!acquire_slot(&slot)) {
    if (gone_.load(std::memory_order_acquire)) return disconnected("chi_submit");
    return set_error(CHI_ERR_AGAIN, cfg_.submit_blocking ? "all %u client slots stayed in use for %u ms"
                                                         : "all %u client slots are in use",
                     seg_.layout.nslots, cfg_.submit_timeout_ms);
  }
  const uint32_t gen = (gen_of(mine_[slot].load(std::memory_order_relaxed)) + 1) & ipc::kSlotGenMask;
  mine_[slot].store(word(gen, kPending), std::memory_order_relaxed);
  ipc::SlotHeader *h = seg_.slot(slot);
  h->method = method;
  h->route = route;
  h->input_size = uint32_t(input_size);
  if (input_size) std::memcpy(seg_.input(slot), input, input_size);
  h->state.store(ipc::slot_word(gen, ipc::kSlotSubmitted), std::memory_order_relaxed);
  // Queue the slot (Vyukov producer; the ring never holds more than nslots).
  ipc::SegmentHeader *sh = seg_.header();
  const uint32_t mask = seg_.layout.nslots - 1;
  const uint32_t pos = sh->tail.fetch_add(1, std::memory_order_relaxed);
  ipc::RingCell &cell = seg_.ring()[pos & mask];
  for (unsigned spins = 1; cell.seq.load(std::memory_order_acquire) != pos; ++spins) {
    // The server has taken this cell's previous task but not handed it back yet.
    cpu_relax();
    if (spins % 4096 == 0) {
      if (!server_alive()) return disconnected("chi_submit");
      sched_yield();
    }
  }
  cell.slot = slot;
  cell.seq.store(pos + 1, std::memory_order_release);
  // Ring the doorbell only when the poller sleeps (it arms it first, then
  // looks at the ring once more: one of us sees the other).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (sh->doorbell_armed.load(std::memory_order_relaxed)) {
    uint64_t one = 1;
    ssize_t r = write(doorbell_, &one, sizeof one);
    (void)r;
  }
  *future = encode_future(tag_, kClientPool, gen, slot);
  return CHI_OK;
}

chi_status_t ShmClient::check(uint32_t slot, uint32_t gen) const {
  if (slot >= seg_.layout.nslots) return set_error(CHI_ERR_INVALID, "unknown future (slot %u)", slot);
  uint32_t w = mine_[slot].load(std::memory_order_acquire);
  if (gen_of(w) != gen || st_of(w) != kPending)
    return set_error(CHI_ERR_INVALID, "stale future: already waited on, released or unknown");
  return CHI_OK;
}

chi_status_t ShmClient::wait(uint32_t slot, uint32_t gen, int64_t timeout_ns, void *output,
                                 size_t output_capacity, size_t *output_size) {
  if (chi_status_t s = check(slot, gen); s != CHI_OK) return s;
  ipc::SlotHeader *h = seg_.slot(slot);
  const int64_t start = now_ns();
  const int64_t spin_end = start + wait_spin_ns();
  const int64_t slice = int64_t(cfg_.disconnect_check_ms) * 1000000;
  const uint32_t done = ipc::slot_word(gen, ipc::kSlotDone);
  uint32_t w = h->state.load(std::memory_order_acquire);
  unsigned polls = 0;
  while ((w & ~ipc::kSlotSleeper) != done) {
    if (++polls % kPollsPerClockRead != 0) {
      cpu_relax();
      w = h->state.load(std::memory_order_acquire);
      continue;
    }
    int64_t now = now_ns();
    if (timeout_ns >= 0 && now - start >= timeout_ns)
      return set_error(CHI_ERR_TIMEOUT, "task not finished within %lld ns", (long long)timeout_ns);
    if (now < spin_end) {
      w = h->state.load(std::memory_order_acquire);
      continue;
    }
    if (!server_alive()) {
      // The result may have come just before the server went.
      w = h->state.load(std::memory_order_acquire);
      if ((w & ~ipc::kSlotSleeper) != done) return disconnected("chi_wait");
      break;
    }
    // Sleep on the segment word in slices, re-checking the server between them.
    uint32_t want = w | ipc::kSlotSleeper;
    if (w != want &&
        !h->state.compare_exchange_strong(w, want, std::memory_order_acq_rel, std::memory_order_acquire))
      continue;
    int64_t left = slice;
    if (timeout_ns >= 0) left = std::min(left, timeout_ns - (now_ns() - start));
    if (left > 0) futex_wait_shared(&h->state, want, left);
    w = h->state.load(std::memory_order_acquire);
  }
  // Copy the result out before anything else: the segment is shared.
  const uint32_t size = h->output_size;
  const chi_status_t status = h->status;
  if (size > seg_.layout.max_payload)
    return set_error(CHI_ERR_PROTOCOL, "the server wrote an output of %u bytes into a %u-byte slot", size,
                     seg_.layout.max_payload);
  if (output && output_capacity < size) {
    if (output_size) *output_size = size;
    return set_error(CHI_ERR_TOO_LARGE, "output of %u bytes does not fit a %zu-byte buffer", size,
                     output_capacity);
  }
  uint32_t mw = word(gen, kPending);
  if (!mine_[slot].compare_exchange_strong(mw, word(gen, kClaimed), std::memory_order_acq_rel))
    return set_error(CHI_ERR_INVALID, "stale future: consumed by another thread");
  if (output && size) std::memcpy(output, seg_.output(slot), size);
  if (output_size) *output_size = size;
  free_slot(slot);
  if (status != CHI_OK) set_error(status, "the server's handler returned %d (%s)", status, chi_status_string(status));
  return status;
}

chi_status_t ShmClient::test(uint32_t slot, uint32_t gen, int *done) {
  if (chi_status_t s = check(slot, gen); s != CHI_OK) return s;
  uint32_t w = seg_.slot(slot)->state.load(std::memory_order_acquire);
  *done = (w & ~ipc::kSlotSleeper) == ipc::slot_word(gen, ipc::kSlotDone);
  if (!*done && !server_alive()) return disconnected("chi_test");
  return CHI_OK;
}

chi_status_t ShmClient::release(uint32_t slot, uint32_t gen) {
  if (chi_status_t s = check(slot, gen); s != CHI_OK) return s;
  uint32_t mw = word(gen, kPending);
  if (!mine_[slot].compare_exchange_strong(mw, word(gen, kOrphan), std::memory_order_acq_rel))
    return set_error(CHI_ERR_INVALID, "stale future: already waited on or released");
  orphans_.fetch_add(1, std::memory_order_relaxed);
  // Done already (or the server is gone and never will): recycle it now.
  uint32_t w = seg_.slot(slot)->state.load(std::memory_order_acquire);
  if ((w & ~ipc::kSlotSleeper) == ipc::slot_word(gen, ipc::kSlotDone)) reap_orphans();
  return CHI_OK;
}

}  // namespace chi

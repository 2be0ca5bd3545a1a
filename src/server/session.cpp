#include "server/session.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <mutex>

#include "base/error.h"
#include "base/futex.h"
#include "base/log.h"
#include "core/stats.h"
#include "ipc/ring.h"
#include "ipc/wire.h"

namespace chi {

namespace {
std::mutex g_reason_mu;  // kill() may race between a poller and the control thread
constexpr uint64_t kTicket = uint64_t(1) << 63;
}

Session::Session(Service &service, uint32_t id, int sock, pid_t pid, uid_t uid, uint32_t kind)
    : svc_(service),
      id_(id),
      sock_(sock),
      pid_(pid),
      uid_(uid),
      kind_(kind),
      gpu_(service.max_payload(), [this](uint64_t c) { return seg_.output(uint32_t(c >> 32)); },
           [this](uint64_t c, chi_status_t st, size_t size) {
             finish(uint32_t(c >> 32), uint32_t(c), st, seg_.output(uint32_t(c >> 32)), size);
           }) {}

Session::~Session() {
  if (seg_.base) munmap(seg_.base, seg_.layout.size);
  if (memfd_ >= 0) close(memfd_);
  if (doorbell_ >= 0) close(doorbell_);
  close_client_doorbell();
  if (sock_ >= 0) close(sock_);
}

void Session::close_client_doorbell() {
  if (client_doorbell_ >= 0) close(client_doorbell_);
  client_doorbell_ = -1;
}

chi_status_t Session::create_segment(uint32_t nslots) {
  seg_.layout = ipc::segment_layout(nslots, svc_.max_payload());
  memfd_ = memfd_create("chimaera-session", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (memfd_ < 0) return set_error(CHI_ERR_NOMEM, "memfd_create: %s", strerror(errno));
  if (ftruncate(memfd_, off_t(seg_.layout.size)) != 0)
    return set_error(CHI_ERR_NOMEM, "cannot size a %llu-byte segment: %s",
                     (unsigned long long)seg_.layout.size, strerror(errno));
  // A client that could shrink the file would make the server fault on its
  // next access: seal the size.
  if (fcntl(memfd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    return set_error(CHI_ERR_INTERNAL, "cannot seal the segment: %s", strerror(errno));
  void *p = mmap(nullptr, seg_.layout.size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd_, 0);
  if (p == MAP_FAILED) return set_error(CHI_ERR_NOMEM, "cannot map the segment: %s", strerror(errno));
  seg_.base = static_cast<uint8_t *>(p);
  ipc::init_segment(seg_, ipc::kProtocolVersion);
  // The doorbell is a datagram socket pair, not a shared eventfd: the client
  // gets only its own end, so no flag it sets (O_NONBLOCK) reaches the end
  // a poller reads, and a pair of datagram sockets shows no EOF to poll on.
  int bell[2];
  if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, bell) != 0)
    return set_error(CHI_ERR_INTERNAL, "socketpair: %s", strerror(errno));
  doorbell_ = bell[0];
  client_doorbell_ = bell[1];
  busy_.reset(new std::atomic<uint8_t>[nslots]);
  for (uint32_t i = 0; i < nslots; ++i) busy_[i].store(0, std::memory_order_relaxed);
  taken_ns_.reset(new int64_t[nslots]());
  ticket_.reset(new std::atomic<uint64_t>[nslots]);
  cgen_.reset(new std::atomic<uint32_t>[nslots]);
  for (uint32_t i = 0; i < nslots; ++i) {
    ticket_[i].store(0, std::memory_order_relaxed);
    cgen_[i].store(0, std::memory_order_relaxed);
  }
  return CHI_OK;
}

void Session::kill(const char *why) {
  std::lock_guard<std::mutex> lock(g_reason_mu);
  if (dead_.load(std::memory_order_relaxed)) return;
  reason_ = why;
  dead_.store(true, std::memory_order_release);
}

bool Session::ring_ready() const { return ipc::ring_ready(seg_, head_); }

void Session::finish(uint32_t slot, uint32_t gen, chi_status_t status, const void *output,
                     size_t size) {
  const int64_t taken = taken_ns_[slot];
  ticket_[slot].store(0, std::memory_order_relaxed);
  // Free for the poller before the client can see the result and queue the
  // slot again (else an honest re-queue would look like a violation).
  busy_[slot].store(0, std::memory_order_release);
  ipc::publish_result(seg_, slot, gen, status, output, size);
  svc_.finished(status, taken);
  counters_.finished.fetch_add(1, std::memory_order_relaxed);
  // Last: once in_flight reaches 0 a dead session may be unmapped.
  counters_.in_flight.fetch_sub(1, std::memory_order_acq_rel);
}

void Session::complete(uint64_t cookie, chi_status_t status, const void *output, size_t size) {
  finish(uint32_t(cookie >> 32), uint32_t(cookie), status, output, size);
}

unsigned Session::poll(unsigned budget) {
  const uint32_t n = seg_.layout.nslots;
  unsigned taken = 0;
  char why[160];
  while (taken < budget && !dead() && !leaving_.load(std::memory_order_acquire)) {
    uint32_t slot;
    if (!ipc::ring_peek(seg_, head_, &slot)) break;  // nothing queued (or a producer mid-write)
    if (svc_.over_limit(counters_.in_flight.load(std::memory_order_relaxed))) break;
    // Copy, then check: the client may rewrite any of these at any time.
    if (slot >= n) {
      snprintf(why, sizeof why, "ring cell names slot %u of %u", slot, n);
      kill(why);
      break;
    }
    if (busy_[slot].load(std::memory_order_acquire)) {
      snprintf(why, sizeof why, "slot %u queued again while its task runs", slot);
      kill(why);
      break;
    }
    const ipc::TaskRecord rec = ipc::read_task(seg_, slot);
    if (ipc::slot_state(rec.word) != ipc::kSlotSubmitted) {
      snprintf(why, sizeof why, "slot %u queued in state %u (torn record)", slot, ipc::slot_state(rec.word));
      kill(why);
      break;
    }
    const uint32_t gen = ipc::slot_gen(rec.word);
    // Ticket cleared first: cancel_queued must never see busy_ with an old task's ticket.
    ticket_[slot].store(0, std::memory_order_relaxed);
    busy_[slot].store(1, std::memory_order_release);
    counters_.in_flight.fetch_add(1, std::memory_order_relaxed);
    // Timed like the CPU route: this poller's first task, then one in 64 (a
    // clock read costs 20-50 ns, two per timed task).
    taken_ns_[slot] = RouteStats::sample() ? now_ns() : -1;
    // The output of a task run here goes straight into the client's slot,
    // which the client reads only after the state says done.
    const Service::Take t = svc_.take(rec.method, rec.route, seg_.input(slot), rec.input_size, true,
                                      seg_.output(slot), seg_.layout.max_payload, this,
                                      (uint64_t(slot) << 32) | gen, &gpu_);
    if (t.what == Service::Take::kBusy) {
      // Every slot of the executor is busy: the task stays queued in the
      // ring and the other sessions get their turn.
      busy_[slot].store(0, std::memory_order_relaxed);
      counters_.in_flight.fetch_sub(1, std::memory_order_relaxed);
      break;
    }
    if (t.cpu) {
      // Cancellable until a worker starts it.  A task that ended before the
      // ticket is stored leaves a stale one: busy_ is 0 then, and the
      // executor refuses a generation that is not queued.
      cgen_[slot].store(gen, std::memory_order_relaxed);
      ticket_[slot].store(kTicket | uint64_t(t.eslot) << 32 | t.egen, std::memory_order_release);
    }
    // Taken: hand the cell back to the client's producers.
    ipc::ring_pop(seg_, &head_);
    ++taken;
    counters_.submitted.fetch_add(1, std::memory_order_relaxed);
    if (t.what == Service::Take::kRan) finish(slot, gen, t.status, seg_.output(slot), t.output_size);
    if (t.what == Service::Take::kFailed) finish(slot, gen, t.status, nullptr, 0);
  }
  return taken;
}

uint32_t Session::cancel_queued(chi_status_t answer) {
  if (!seg_.base) return 0;
  uint32_t n = 0;
  for (uint32_t slot = 0; slot < seg_.layout.nslots; ++slot) {
    // busy_ first: once set by poll(), the ticket read comes after poll's clearing.
    if (!busy_[slot].load(std::memory_order_acquire)) continue;
    const uint64_t t = ticket_[slot].load(std::memory_order_acquire);
    if (!(t & kTicket)) continue;
    // The executor decides: a task a worker started runs to its end.
    if (!svc_.cancel(uint32_t(t >> 32) & 0x7FFFFFFFu, uint32_t(t))) continue;
    ++n;
    if (answer != CHI_OK) {
      finish(slot, cgen_[slot].load(std::memory_order_relaxed), answer, nullptr, 0);
      continue;
    }
    ticket_[slot].store(0, std::memory_order_relaxed);
    busy_[slot].store(0, std::memory_order_release);
    svc_.cancelled();
    counters_.in_flight.fetch_sub(1, std::memory_order_acq_rel);
  }
  return n;
}

void Session::announce_server_state(uint32_t state) {
  if (!seg_.base) return;
  seg_.header()->server_state.store(state, std::memory_order_seq_cst);
  if (state != ipc::kGone) return;
  for (uint32_t i = 0; i < seg_.layout.nslots; ++i) {
    ipc::SlotHeader *h = seg_.slot(i);
    if (h->state.load(std::memory_order_relaxed) & ipc::kSlotSleeper) futex_wake_shared(&h->state);
  }
}

}  // namespace chi

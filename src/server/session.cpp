#include "server/session.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <mutex>
#include <vector>

#include "base/error.h"
#include "core/futex.h"
#include "base/log.h"
#include "core/runtime.h"
#include "ipc/ring.h"
#include "ipc/wire.h"

namespace chi {

namespace {
std::mutex g_reason_mu;  // kill() may race between a poller and the control thread
}

Session::Session(uint32_t id, int sock, pid_t pid, uid_t uid, uint32_t kind)
    : id_(id), sock_(sock), pid_(pid), uid_(uid), kind_(kind) {}

Session::~Session() {
  if (seg_.base) munmap(seg_.base, seg_.layout.size);
  if (memfd_ >= 0) close(memfd_);
  if (doorbell_ >= 0) close(doorbell_);
  if (sock_ >= 0) close(sock_);
}

chi_status_t Session::create_segment(uint32_t nslots, uint32_t max_payload) {
  seg_.layout = ipc::segment_layout(nslots, max_payload);
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
  doorbell_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (doorbell_ < 0) return set_error(CHI_ERR_INTERNAL, "eventfd: %s", strerror(errno));
  busy_.reset(new std::atomic<uint8_t>[nslots]);
  for (uint32_t i = 0; i < nslots; ++i) busy_[i].store(0, std::memory_order_relaxed);
  taken_ns_.reset(new int64_t[nslots]());
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
  // Free for the poller before the client can see the result and queue the
  // slot again (else an honest re-queue would look like a violation).
  busy_[slot].store(0, std::memory_order_release);
  ipc::publish_result(seg_, slot, gen, status, output, size);
  if (stats) stats->finished(status, now_ns() - taken);
  finished_.fetch_add(1, std::memory_order_relaxed);
  // Last: once in_flight reaches 0 a dead session may be unmapped.
  in_flight_.fetch_sub(1, std::memory_order_acq_rel);
}

void Session::complete(uint64_t cookie, chi_status_t status, const void *output, size_t size) {
  finish(uint32_t(cookie >> 32), uint32_t(cookie), status, output, size);
}

void Session::fail_task(uint32_t slot, uint32_t gen, chi_status_t status) {
  finish(slot, gen, status, nullptr, 0);
}

unsigned Session::poll(Runtime &rt, unsigned budget, uint32_t max_in_flight, bool refuse) {
  const uint32_t n = seg_.layout.nslots;
  unsigned taken = 0;
  const bool inline_builtins = rt.config().server.inline_builtins;
  // The input of a task run here, out of the client's reach (one per poller thread).
  thread_local std::vector<unsigned char> t_scratch;
  if (t_scratch.size() < seg_.layout.max_payload) t_scratch.resize(seg_.layout.max_payload);
  unsigned char *const scratch = t_scratch.data();
  char why[160];
  while (taken < budget && !dead()) {
    uint32_t slot;
    if (!ipc::ring_peek(seg_, head_, &slot)) break;  // nothing queued (or a producer mid-write)
    if (!refuse && in_flight_.load(std::memory_order_relaxed) >= max_in_flight) break;
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
    const uint32_t word = rec.word, method = rec.method, input_size = rec.input_size;
    const int32_t route = rec.route;
    if (ipc::slot_state(word) != ipc::kSlotSubmitted) {
      snprintf(why, sizeof why, "slot %u queued in state %u (torn record)", slot,
               ipc::slot_state(word));
      kill(why);
      break;
    }
    const uint32_t gen = ipc::slot_gen(word);
    busy_[slot].store(1, std::memory_order_relaxed);
    in_flight_.fetch_add(1, std::memory_order_relaxed);
    taken_ns_[slot] = now_ns();
    const bool cpu = route == CHI_ROUTE_CPU || route == CHI_ROUTE_LOCAL;
    const MethodEntry *m = rt.registry().get(method);
    chi_status_t early = refuse                                    ? CHI_ERR_SHUTDOWN
                         : input_size > seg_.layout.max_payload ? CHI_ERR_TOO_LARGE
                         : !m                                     ? CHI_ERR_NOT_FOUND
                                                                  : CHI_OK;
    if (early == CHI_OK && cpu && inline_builtins && m->bounded.load(std::memory_order_relaxed)) {
      // Run to completion here: no hand-off to a worker and back.  The input
      // is copied out of the segment first (the client may rewrite it); the
      // output goes straight into the client's slot, which the client reads
      // only after the state says done.
      std::memcpy(scratch, seg_.input(slot), input_size);
      ipc::ring_pop(seg_, &head_);
      ++taken;
      submitted_.fetch_add(1, std::memory_order_relaxed);
      if (stats) stats->submitted();
      size_t out_size = 0;
      const chi_status_t st = run_cpu_handler(rt.registry(), method, CHI_ROUTE_CPU, scratch, input_size,
                                              seg_.output(slot), seg_.layout.max_payload, &out_size);
      finish(slot, gen, st, seg_.output(slot), out_size);
      continue;
    }
    Executor *exec = nullptr;
    uint32_t eslot = 0, egen = 0;
    if (early == CHI_OK && cpu) {
      // One copy of the input, out of the segment into the executor's slot.
      early = rt.cpu().submit_remote(method, seg_.input(slot), input_size, this,
                                     (uint64_t(slot) << 32) | gen);
    } else if (early == CHI_OK) {
      uint32_t pool = 0;
      early = rt.route_executor(route, &exec, &pool);
      if (early == CHI_OK) {
        // Never blocks here (set_submit_never_blocks): a full GPU queue
        // answers AGAIN; finished GPU tasks of this session free slots.
        early = exec->submit(method, seg_.input(slot), input_size, &eslot, &egen);
        if (early == CHI_ERR_AGAIN && poll_gpu_reaped())
          early = exec->submit(method, seg_.input(slot), input_size, &eslot, &egen);
      }
    }
    if (early == CHI_ERR_AGAIN) {
      // Every slot of the executor is busy: the task stays queued in the
      // ring and the other sessions get their turn.
      busy_[slot].store(0, std::memory_order_relaxed);
      in_flight_.fetch_sub(1, std::memory_order_relaxed);
      break;
    }
    // Taken: hand the cell back to the client's producers.
    ipc::ring_pop(seg_, &head_);
    ++taken;
    submitted_.fetch_add(1, std::memory_order_relaxed);
    if (stats) stats->submitted();
    if (early != CHI_OK) {
      fail_task(slot, gen, early);
      continue;
    }
    if (!cpu) gpu_tasks_.push_back(GpuTask{slot, gen, exec, eslot, egen});
  }
  return taken;
}

bool Session::poll_gpu_reaped() {
  const size_t before = gpu_tasks_.size();
  poll_gpu();
  return gpu_tasks_.size() < before;
}

bool Session::poll_gpu() {
  for (size_t i = 0; i < gpu_tasks_.size();) {
    GpuTask &t = gpu_tasks_[i];
    int done = 0;
    if (t.exec->test(t.eslot, t.egen, &done) == CHI_OK && !done) {
      ++i;
      continue;
    }
    size_t size = 0;
    chi_status_t s = t.exec->wait(t.eslot, t.egen, 0, seg_.output(t.slot), seg_.layout.max_payload, &size);
    if (s == CHI_ERR_TIMEOUT) {
      ++i;
      continue;
    }
    finish(t.slot, t.gen, s, seg_.output(t.slot), s == CHI_ERR_TOO_LARGE ? 0 : size);
    t = gpu_tasks_.back();
    gpu_tasks_.pop_back();
  }
  return !gpu_tasks_.empty();
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

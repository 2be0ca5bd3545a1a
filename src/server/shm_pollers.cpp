#include "server/shm_pollers.h"

#include <errno.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "base/error.h"
#include "base/eventfd.h"
#include "base/futex.h"
#include "base/log.h"
#include "core/runtime.h"
#include "server/service.h"
#include "server/session.h"
#include "server/wake.h"

namespace chi {

namespace {
constexpr unsigned kBatch = 32;  // tasks a poller takes from one session per turn
// An idle poller asleep in epoll_wait looks on its own this often (ms).
constexpr int kIdleCheckMs = 1000;
}  // namespace

void signal_fd(int fd) {
  if (!eventfd_signal(fd)) log(LogLevel::kError, "cannot signal eventfd %d: %s", fd, strerror(errno));
}

void drain_doorbell(int fd) {
  // Bounded: a client writing as fast as this reads cannot hold the poller.
  char v[64];
  for (int i = 0; i < 1024 && recv(fd, v, sizeof v, MSG_DONTWAIT) >= 0; ++i) {
  }
}

struct PollerPool::Poller {
  std::thread thread;
  int epfd = -1;
  int wake = -1;
  std::mutex mu;
  std::vector<Session *> sessions;
  std::atomic<bool> changed{false};
  std::atomic<uint64_t> epoch{0};
  size_t load() {
    std::lock_guard<std::mutex> lock(mu);
    return sessions.size();
  }
  ~Poller() {
    if (epfd >= 0) close(epfd);
    if (wake >= 0) close(wake);
  }
};

PollerPool::PollerPool(Service &service, int control_wake_fd) : svc_(service), control_wake_(control_wake_fd) {}

PollerPool::~PollerPool() { stop(); }

chi_status_t PollerPool::start(unsigned n) {
  // One per CPU by default: a poller's per-task work (the client's cache
  // lines, the built-in handler) bounds how many sessions it serves, and on
  // the 16-CPU host 4 pollers held 256 one-at-a-time clients to a third of
  // the sweep's peak with a p99 of 8 ms, 16 to 72% and 7.6 us.  An idle
  // poller sleeps in epoll_wait and costs nothing.
  if (n == 0) n = std::clamp(std::thread::hardware_concurrency(), 1u, 64u);
  for (unsigned i = 0; i < n; ++i) {
    auto p = std::make_unique<Poller>();
    p->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (p->epfd < 0) return set_error(CHI_ERR_INTERNAL, "epoll_create1: %s", strerror(errno));
    if (chi_status_t st = eventfd_open(&p->wake); st != CHI_OK) return st;
    epoll_event pe{};
    pe.events = EPOLLIN;
    pe.data.ptr = nullptr;
    if (epoll_ctl(p->epfd, EPOLL_CTL_ADD, p->wake, &pe) != 0)
      return set_error(CHI_ERR_INTERNAL, "epoll_ctl(ADD poller wake-up): %s", strerror(errno));
    pollers_.push_back(std::move(p));
  }
  try {
    for (auto &p : pollers_) p->thread = std::thread(&PollerPool::main, this, p.get());
  } catch (const std::exception &e) {
    return set_error(CHI_ERR_NOMEM, "cannot start poller threads: %s", e.what());
  }
  return CHI_OK;
}

chi_status_t PollerPool::add(Session *s) {
  // Sessions come and go on the control thread only: the loads are stable.
  const uint32_t n = uint32_t(pollers_.size());
  const uint32_t first = next_++ % n;
  uint32_t best = first;
  size_t best_load = pollers_[first]->load();
  for (uint32_t k = 1; k < n; ++k) {
    const uint32_t i = (first + k) % n;
    const size_t l = pollers_[i]->load();
    if (l < best_load) best = i, best_load = l;
  }
  s->poller = best;
  Poller &p = *pollers_[s->poller];
  epoll_event pe{};
  pe.events = EPOLLIN;
  pe.data.ptr = s;
  // Without its doorbell in the set, a sleeping poller would never see the
  // session's tasks: refuse the session instead.
  if (epoll_ctl(p.epfd, EPOLL_CTL_ADD, s->doorbell(), &pe) != 0)
    return set_error(CHI_ERR_INTERNAL, "epoll_ctl(ADD doorbell): %s", strerror(errno));
  {
    std::lock_guard<std::mutex> lock(p.mu);
    p.sessions.push_back(s);
  }
  p.changed.store(true, std::memory_order_release);
  signal_fd(p.wake);
  return CHI_OK;
}

void PollerPool::remove(Session *s) {
  Poller &p = *pollers_[s->poller];
  // Closing the doorbell (when the session is freed) takes it out of the set
  // anyway; a failure here only leaves a wake-up or two to come.
  if (epoll_ctl(p.epfd, EPOLL_CTL_DEL, s->doorbell(), nullptr) != 0 && errno != ENOENT)
    log(LogLevel::kWarn, "epoll_ctl(DEL doorbell of client %u): %s", s->id(), strerror(errno));
  {
    std::lock_guard<std::mutex> lock(p.mu);
    p.sessions.erase(std::remove(p.sessions.begin(), p.sessions.end(), s), p.sessions.end());
    // `changed` before the epoch is read (both seq_cst, as the poller's
    // exchange and add): the turn that moves the epoch past the value read
    // here is followed by one that sees `changed` and drops the session
    // before it adds again.  Read the other way round, a turn could start
    // with the old list after that value and the session be freed under it.
    p.changed.store(true, std::memory_order_seq_cst);
    s->removed_epoch = p.epoch.load(std::memory_order_seq_cst);
  }
  signal_fd(p.wake);
}

bool PollerPool::dropped(const Session *s) const {
  // Its epoch moved past the removal twice: one full turn without it.
  return pollers_[s->poller]->epoch.load(std::memory_order_acquire) > s->removed_epoch + 1;
}

void PollerPool::wake_all() {
  for (auto &p : pollers_) signal_fd(p->wake);
}

void PollerPool::stop() {
  quit_.store(true, std::memory_order_seq_cst);
  wake_all();
  for (auto &p : pollers_)
    if (p->thread.joinable()) p->thread.join();
}

void PollerPool::main(Poller *p) {
  set_submit_never_blocks(true);  // this thread reaps the GPU tasks it queues
  std::vector<Session *> snap;
  size_t turn = 0;
  // Below 4 CPUs a spinning poller takes the CPU from the worker and the
  // client it waits for: it sleeps at once instead (the doorbell wakes it).
  const int64_t spin_ns =
      std::thread::hardware_concurrency() >= 4 ? svc_.runtime().config().server.spin_ns : 0;
  // Then passes with sched_yield between them (server.yield_ns, off by
  // default): under more runnable clients than CPUs a poller that does not
  // sleep spares them the doorbell and itself the wake-up.
  const int64_t yield_end_ns = spin_ns + svc_.runtime().config().server.yield_ns;
  // The first pass without work since the last pass with some (0: the last
  // pass had work): a pass that finds work reads no clock (20-50 ns a read).
  int64_t idle_since = 0;
  epoll_event events[64];
  while (!quit_.load(std::memory_order_acquire)) {
    // The control thread frees a removed session only after this moves on
    // twice (remove() says why): a turn that takes a change is followed by
    // another before any sleep, or the session (its socket, segment and
    // doorbell) would stay until the idle timeout ended the sleep.
    bool work = false;
    if (p->changed.exchange(false, std::memory_order_seq_cst)) {
      std::lock_guard<std::mutex> lock(p->mu);
      snap = p->sessions;
      work = true;
    }
    p->epoch.fetch_add(1, std::memory_order_seq_cst);
    // Round-robin with a batch bound per session: a client that keeps its
    // ring full gets kBatch tasks per turn like everyone else.
    const size_t count = snap.size();
    for (size_t k = 0; k < count; ++k) {
      Session *s = snap[(turn + k) % count];
      if (s->dead()) continue;
      if (s->poll(kBatch)) work = true;
      if (s->poll_gpu()) work = true;
      if (s->dead()) signal_fd(control_wake_);
    }
    ++turn;
    if (work) {
      idle_since = 0;
      continue;
    }
    const int64_t now = now_ns();
    if (idle_since == 0) idle_since = now;
    const int64_t idle = now - idle_since;
    if (idle < spin_ns) {
      cpu_relax();
      continue;
    }
    if (idle < yield_end_ns) {
      sched_yield();
      continue;
    }
    // Sleep: arm every doorbell, then look once more, so that a client
    // either sees the doorbell armed or we see its task.
    for (Session *s : snap) s->arm_doorbell(true);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    bool ready = p->changed.load(std::memory_order_acquire) || quit_.load(std::memory_order_acquire);
    for (Session *s : snap) ready = ready || (!s->dead() && s->ring_ready());
    int got = 0;
    if (!ready) {
      // Every change it waits for rings a doorbell or p->wake; the timeout
      // is a safety net only.
      got = epoll_wait(p->epfd, events, 64, kIdleCheckMs);
      if (got < 0 && errno != EINTR) log(LogLevel::kError, "poller epoll_wait: %s", strerror(errno));
      for (int i = 0; i < got; ++i) {
        if (events[i].data.ptr)
          drain_doorbell(static_cast<Session *>(events[i].data.ptr)->doorbell());
        else
          eventfd_drain(p->wake);
      }
    }
    for (Session *s : snap) s->arm_doorbell(false);
    // After a wake-up the spin starts again; after a timeout the poller
    // looks once and sleeps again (an idle server's pollers spun after
    // every timeout: 1.6% of a core with 32 of them).
    if (got != 0 || ready) idle_since = 0;
  }
}

}  // namespace chi

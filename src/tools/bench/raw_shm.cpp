#include "raw_shm.h"

#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>
#include <vector>

#include "sampler.h"
#include "tool_util.h"

namespace chi_bench {
namespace {

constexpr uint64_t kMagic = 0x6368695261775368ull;  // "chiRawSh"
constexpr size_t kPayload = kRawPayloadBytes;
constexpr int64_t kDefaultSpinNs = 50000;  // config.h: spin_ns and server.spin_ns
constexpr int64_t kSliceNs = 100'000'000;  // chimaera: disconnect_check_ms, epoll_wait timeout
constexpr int64_t kYieldAfterNs = 20000;   // kRawSpin, as floor.xproc_pingpong
constexpr uint64_t kReplyBoundNs = 10'000'000'000ull;
constexpr uint64_t kStartBoundNs = 60'000'000'000ull;
constexpr uint64_t kEndSlackNs = 60'000'000'000ull;
constexpr unsigned kPollsPerClockRead = 32;  // as core/slot_word.h

enum : uint32_t { kModePolicy = kRawPolicy, kModeSpin = kRawSpin, kModeWake = 2 };

// The client writes payload then seq; the serving thread that owns the pair
// echoes the payload and publishes word = seq << 1.  Bit 0 of word: the
// client sleeps on it (the publisher then wakes it), as slot::kSleeper.
struct alignas(64) Req {
  std::atomic<uint32_t> seq;
  uint32_t pad;
  uint8_t payload[kPayload];
};
struct alignas(64) Rep {
  std::atomic<uint32_t> word;
  uint32_t pad;
  uint64_t
      woke_ns;  // kModeWake: when the serving thread woke for this request; 0: it did not sleep
  uint8_t payload[kPayload];
};
struct Pair {
  Req req;
  Rep rep;
};

// A serving thread's doorbell: armed while it sleeps on `ring`; a client that
// sees it armed bumps ring and wakes it (chimaera: the session's eventfd).
struct alignas(64) Bell {
  std::atomic<uint32_t> armed;
  std::atomic<uint32_t> ring;
};

// One process's results.
struct alignas(64) Part {
  std::atomic<uint32_t> failed;
  uint64_t done, start_ns, end_ns;
  uint64_t nsamples, sample_off, sample_cap;
  uint64_t oneway;  // kModeWake: one-way samples, after the nsamples round trips
  char error[160];
};

struct Ctl {
  uint64_t magic;
  uint32_t nclients, nthreads, mode, wake_samples;
  int64_t client_spin_ns, server_spin_ns;
  uint64_t warmup, idle_ns;
  size_t bells_off, pairs_off, parts_off, samples_off;
  alignas(64) std::atomic<uint32_t> ready;  // clients warmed up
  std::atomic<uint32_t> server_up;          // serving threads running
  std::atomic<uint32_t> go;                 // futex word: 1 = start
  std::atomic<uint32_t> quit;               // the server stops; a client that sees it fails
  std::atomic<uint64_t> stop_ns;
  Part server;
};

static_assert(std::atomic<uint32_t>::is_always_lock_free &&
                  std::atomic<uint64_t>::is_always_lock_free,
              "lock-free words cross processes");

template <class T>
T *at(Ctl *c, size_t off) {
  return reinterpret_cast<T *>(reinterpret_cast<char *>(c) + off);
}
Bell *bells(Ctl *c) {
  return at<Bell>(c, c->bells_off);
}
Pair *pairs(Ctl *c) {
  return at<Pair>(c, c->pairs_off);
}
Part *parts(Ctl *c) {
  return at<Part>(c, c->parts_off);
}
uint64_t *samples(Ctl *c) {
  return at<uint64_t>(c, c->samples_off);
}

size_t round_up(size_t v) {
  return (v + 63) & ~size_t(63);
}

// Shared (not private) futexes: the words live in the memfd mapping.  wait
// returns 0 when woken, else errno (EAGAIN, EINTR, ETIMEDOUT are normal).
int futex_wait(std::atomic<uint32_t> *w, uint32_t seen, int64_t ns) {
  struct timespec ts = {time_t(ns / 1000000000), long(ns % 1000000000)};
  long r = syscall(SYS_futex, reinterpret_cast<uint32_t *>(w), FUTEX_WAIT, seen,
                   ns < 0 ? nullptr : &ts, nullptr, 0);
  return r == 0 ? 0 : errno;
}
bool futex_wake(std::atomic<uint32_t> *w, int n) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t *>(w), FUTEX_WAKE, n, nullptr, nullptr, 0) >=
         0;
}
bool normal_wait_end(int e) {
  return e == 0 || e == EAGAIN || e == EINTR || e == ETIMEDOUT;
}

void fail(Part *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void fail(Part *p, const char *fmt, ...) {
  if (p->failed.load(std::memory_order_relaxed)) return;
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(p->error, sizeof p->error, fmt, ap);
  va_end(ap);
  p->failed.store(1, std::memory_order_release);
}

void sleep_ns(uint64_t ns) {
  struct timespec ts = {time_t(ns / 1000000000), long(ns % 1000000000)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

// ------------------------------------------------------------ server process

// Serves the pairs i with i % nthreads == t: round-robin over them; idle,
// spins server_spin_ns, then arms its doorbell, looks once more and sleeps
// (shm_pollers.cpp's loop, with a futex for the epoll on eventfds).
void serve(Ctl *c, uint32_t t) {
  Bell &b = bells(c)[t];
  std::vector<Pair *> mine;
  for (uint32_t i = t; i < c->nclients; i += c->nthreads) mine.push_back(&pairs(c)[i]);
  std::vector<uint32_t> served(mine.size(), 0);
  const uint32_t mode = c->mode;
  // A thread with no client has nothing to spin for, whatever the mode.
  const bool spinning = mode == kModeSpin && !mine.empty();
  const int64_t sleep_ns = mode == kModeWake ? -1 : kSliceNs;
  c->server_up.fetch_add(1, std::memory_order_acq_rel);
  uint64_t idle_since = chi_tool_now_ns(), woke = 0;
  while (!c->quit.load(std::memory_order_acquire)) {
    bool work = false;
    for (size_t k = 0; k < mine.size(); k++) {
      Pair &p = *mine[k];
      const uint32_t s = p.req.seq.load(std::memory_order_acquire);
      if (s == served[k]) continue;
      std::memcpy(p.rep.payload, p.req.payload, kPayload);
      p.rep.woke_ns = woke;
      served[k] = s;
      work = true;
      if ((p.rep.word.exchange(s << 1, std::memory_order_acq_rel) & 1) &&
          !futex_wake(&p.rep.word, 1)) {
        fail(&c->server, "futex_wake of client %zu: %s", size_t(t + k * c->nthreads) + 1,
             std::strerror(errno));
        c->quit.store(1, std::memory_order_release);
        return;
      }
    }
    if (work) {
      woke = 0;
      idle_since = chi_tool_now_ns();
      continue;
    }
    const uint64_t idle = chi_tool_now_ns() - idle_since;
    if (spinning) {
      if (idle > uint64_t(kYieldAfterNs))
        sched_yield();
      else
        chi_tool_cpu_relax();
      continue;
    }
    if (mode == kModePolicy && idle < uint64_t(c->server_spin_ns)) {
      chi_tool_cpu_relax();
      continue;
    }
    // A client either sees armed, or this look sees its request.
    const uint32_t rung = b.ring.load(std::memory_order_acquire);
    b.armed.store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    bool ready = c->quit.load(std::memory_order_acquire);
    for (size_t k = 0; k < mine.size() && !ready; k++)
      ready = mine[k]->req.seq.load(std::memory_order_acquire) != served[k];
    if (!ready) {
      const int e = futex_wait(&b.ring, rung, sleep_ns);
      woke = e == 0 ? chi_tool_now_ns() : 0;
      if (!normal_wait_end(e)) {
        fail(&c->server, "futex_wait on the doorbell: %s", std::strerror(e));
        c->quit.store(1, std::memory_order_release);
        return;
      }
    }
    b.armed.store(0, std::memory_order_relaxed);
    idle_since = chi_tool_now_ns();
  }
}

int server_main(Ctl *c) {
  std::vector<std::thread> threads;
  try {
    for (uint32_t t = 1; t < c->nthreads; t++) threads.emplace_back(serve, c, t);
  } catch (const std::exception &e) {
    fail(&c->server, "starting serving thread %zu: %s", threads.size() + 2, e.what());
    c->quit.store(1, std::memory_order_release);
  }
  if (!c->quit.load(std::memory_order_acquire)) serve(c, 0);
  for (auto &th : threads) th.join();
  return c->server.failed.load(std::memory_order_acquire) ? 1 : 0;
}

// ------------------------------------------------------------ client process

struct Client {
  Ctl *c;
  Pair &p;
  Bell &b;
  Part &me;
  uint32_t who;
  uint32_t seq = 0;

  // One round trip: *rt its time, *rang when this client woke the serving
  // thread (0: it was not asleep), *woke when that thread ran (Rep::woke_ns).
  bool round_trip(uint64_t *rt, uint64_t *rang, uint64_t *woke) {
    seq = (seq + 1) & 0x7FFFFFFF;
    if (seq == 0) seq = 1;
    uint8_t in[kPayload], out[kPayload];
    for (size_t i = 0; i < kPayload; i++) in[i] = uint8_t(0x5A ^ (i * 29) ^ seq);
    std::memcpy(in, &seq, sizeof seq);
    std::memcpy(in + sizeof seq, &who, sizeof who);
    std::memcpy(p.req.payload, in, kPayload);
    const uint64_t t0 = chi_tool_now_ns();
    p.req.seq.store(seq, std::memory_order_release);
    *rang = 0;
    if (c->mode != kModeSpin) {
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (b.armed.load(std::memory_order_relaxed)) {
        b.ring.fetch_add(1, std::memory_order_release);
        *rang = chi_tool_now_ns();
        if (!futex_wake(&b.ring, 1)) {
          fail(&me, "futex_wake of the server thread: %s", std::strerror(errno));
          return false;
        }
      }
    }
    if (!wait(t0)) return false;
    std::memcpy(out, p.rep.payload, kPayload);
    *woke = p.rep.woke_ns;
    *rt = chi_tool_now_ns() - t0;
    if (std::memcmp(in, out, kPayload) != 0) {
      fail(&me, "round trip %u: the reply differs from the request", seq);
      return false;
    }
    return true;
  }

  // slot::wait's policy: poll, read the clock every 32 polls; past the spin,
  // set the sleeper bit and sleep on the word (a slice at a time).
  bool wait(uint64_t t0) {
    const uint32_t want = seq << 1;
    const uint64_t spin_end = c->mode == kModePolicy ? t0 + uint64_t(c->client_spin_ns) : t0;
    uint32_t w = p.rep.word.load(std::memory_order_acquire);
    unsigned polls = 0;
    while ((w & ~1u) != want) {
      if (++polls % kPollsPerClockRead != 0) {
        chi_tool_cpu_relax();
        w = p.rep.word.load(std::memory_order_acquire);
        continue;
      }
      const uint64_t now = chi_tool_now_ns();
      if (now - t0 > kReplyBoundNs) {
        fail(&me, "no reply to round trip %u within 10 s", seq);
        return false;
      }
      if (c->quit.load(std::memory_order_acquire)) {
        fail(&me, "the raw server stopped");
        return false;
      }
      if (c->mode == kModeSpin) {
        if (now - t0 > uint64_t(kYieldAfterNs)) sched_yield();
        w = p.rep.word.load(std::memory_order_acquire);
        continue;
      }
      if (now < spin_end) {
        chi_tool_cpu_relax();
        w = p.rep.word.load(std::memory_order_acquire);
        continue;
      }
      const uint32_t sleeping = w | 1;
      if (w != sleeping && !p.rep.word.compare_exchange_strong(
                               w, sleeping, std::memory_order_acq_rel, std::memory_order_acquire))
        continue;
      const int e = futex_wait(&p.rep.word, sleeping, kSliceNs);
      if (!normal_wait_end(e)) {
        fail(&me, "futex_wait on the reply: %s", std::strerror(e));
        return false;
      }
      w = p.rep.word.load(std::memory_order_acquire);
    }
    return true;
  }
};

int client_main(Ctl *c, uint32_t i, pid_t parent) {
  Part &me = parts(c)[i];
  Client cl{c, pairs(c)[i], bells(c)[i % c->nthreads], me, i + 1};
  uint64_t rt = 0, rang = 0, woke = 0;
  for (uint64_t k = 0; k < c->warmup; k++)
    if (!cl.round_trip(&rt, &rang, &woke)) return 1;
  c->ready.fetch_add(1, std::memory_order_acq_rel);
  while (c->go.load(std::memory_order_acquire) == 0) {
    if (getppid() != parent || c->quit.load(std::memory_order_acquire)) return 1;
    const int e = futex_wait(&c->go, 0, kSliceNs);
    if (!normal_wait_end(e)) {
      fail(&me, "futex_wait for the start: %s", std::strerror(e));
      return 1;
    }
  }
  uint64_t *buf = samples(c) + me.sample_off;
  me.start_ns = chi_tool_now_ns();
  if (c->mode == kModeWake) {
    for (uint32_t k = 0; k < c->wake_samples; k++) {
      sleep_ns(c->idle_ns);
      if (!cl.round_trip(&rt, &rang, &woke)) return 1;
      buf[me.nsamples++] = rt;
      if (rang && woke > rang) buf[c->wake_samples + me.oneway++] = woke - rang;
      me.done++;
    }
  } else {
    Sampler sm{buf, me.sample_cap};
    const uint64_t stop = c->stop_ns.load(std::memory_order_acquire);
    while (chi_tool_now_ns() < stop) {
      if (!cl.round_trip(&rt, &rang, &woke)) return 1;
      sm.add(rt);
      me.done++;
    }
    me.nsamples = sm.n;
  }
  me.end_ns = chi_tool_now_ns();
  return 0;
}

// ------------------------------------------------------------ parent side

std::string exit_text(int wst) {
  return WIFSIGNALED(wst) ? "killed by signal " + std::to_string(WTERMSIG(wst))
                          : "exit status " + std::to_string(WEXITSTATUS(wst));
}

// One raw run: the segment, the server process and the client processes.
// Whatever happens, the destructor stops and reaps every child and unmaps
// the segment (a memfd: nothing is left in any file system).
class RawRun {
 public:
  RawRun() = default;
  RawRun(const RawRun &) = delete;
  RawRun &operator=(const RawRun &) = delete;
  ~RawRun() { cleanup(); }

  Ctl *ctl() const { return c_; }

  bool setup(uint32_t n, uint32_t threads, uint32_t mode, uint64_t sample_cap, std::string *err) {
    size_t off = round_up(sizeof(Ctl));
    const size_t bells_off = off;
    off += round_up(threads * sizeof(Bell));
    const size_t pairs_off = off;
    off += round_up(n * sizeof(Pair));
    const size_t parts_off = off;
    off += round_up(n * sizeof(Part));
    const size_t samples_off = off;
    size_ = off + n * sample_cap * sizeof(uint64_t);
    const int fd = memfd_create("chimaera-bench-raw", MFD_CLOEXEC);
    if (fd < 0) return error(err, "memfd_create");
    if (ftruncate(fd, off_t(size_)) != 0) {
      const int e = errno;
      close(fd);
      errno = e;
      return error(err, "ftruncate");
    }
    void *mem = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int e = errno;
    close(fd);
    if (mem == MAP_FAILED) {
      errno = e;
      return error(err, "mmap");
    }
    c_ = new (mem) Ctl();
    c_->magic = kMagic;
    c_->nclients = n;
    c_->nthreads = threads;
    c_->mode = mode;
    c_->bells_off = bells_off;
    c_->pairs_off = pairs_off;
    c_->parts_off = parts_off;
    c_->samples_off = samples_off;
    new (bells(c_)) Bell[threads]();
    new (pairs(c_)) Pair[n]();
    Part *p = new (parts(c_)) Part[n]();
    for (uint32_t i = 0; i < n; i++) {
      p[i].sample_off = i * sample_cap;
      p[i].sample_cap = sample_cap;
    }
    return true;
  }

  // Forks the server and the clients; returns once every client is warm.
  bool start(std::string *err) {
    std::fflush(nullptr);
    const pid_t me = getpid();
    server_ = spawn(me, UINT32_MAX);
    if (server_ < 0) return error(err, "fork (raw server)");
    clients_.assign(c_->nclients, -1);
    for (uint32_t i = 0; i < c_->nclients; i++) {
      clients_[i] = spawn(me, i);
      if (clients_[i] < 0) {
        *err = "fork (raw client " + std::to_string(i + 1) + "): " + std::strerror(errno);
        return false;
      }
    }
    const uint64_t bound = chi_tool_now_ns() + kStartBoundNs;
    while (c_->server_up.load(std::memory_order_acquire) < c_->nthreads ||
           c_->ready.load(std::memory_order_acquire) < c_->nclients) {
      if (!alive(err)) return false;
      if (chi_tool_now_ns() > bound) {
        *err = std::to_string(c_->ready.load()) + " of " + std::to_string(c_->nclients) +
               " raw clients warmed up in 60 s";
        return false;
      }
      sleep_ns(1'000'000);
    }
    return true;
  }

  // Starts the timed part (count-based work ignores duration_ns) and waits
  // until every client has exited; then stops the server.  *t0: the start.
  bool run(uint64_t duration_ns, uint64_t bound_ns, uint64_t *t0, std::string *err) {
    *t0 = chi_tool_now_ns();
    c_->stop_ns.store(*t0 + duration_ns, std::memory_order_release);
    c_->go.store(1, std::memory_order_release);
    if (!futex_wake(&c_->go, INT_MAX)) return error(err, "futex_wake (start)");
    const uint64_t bound = *t0 + bound_ns;
    for (;;) {
      // Seldom: the clients should have the CPUs to themselves.
      sleep_ns(5'000'000);
      bool left = false;
      for (uint32_t i = 0; i < clients_.size(); i++) {
        if (clients_[i] <= 0) continue;
        int wst = 0;
        const pid_t r = waitpid(clients_[i], &wst, WNOHANG);
        if (r == 0) {
          left = true;
          continue;
        }
        if (r < 0) return error(err, "waitpid");
        clients_[i] = -1;
        if (!WIFEXITED(wst) || WEXITSTATUS(wst) != 0) {
          *err = "raw client " + std::to_string(i + 1) + ": " + part_error(parts(c_)[i], wst);
          return false;
        }
      }
      if (!left) break;
      if (!server_alive(err)) return false;
      if (chi_tool_now_ns() > bound) {
        *err = "raw clients did not finish within their bound";
        return false;
      }
    }
    stop_server();
    int wst = 0;
    const uint64_t end = chi_tool_now_ns() + 10'000'000'000ull;
    for (;;) {
      const pid_t r = waitpid(server_, &wst, WNOHANG);
      if (r == server_) break;
      if (r < 0) return error(err, "waitpid (raw server)");
      if (chi_tool_now_ns() > end) {
        *err = "the raw server did not stop within 10 s";
        return false;
      }
      sleep_ns(1'000'000);
    }
    server_ = -1;
    if (!WIFEXITED(wst) || WEXITSTATUS(wst) != 0) {
      *err = "raw server: " + part_error(c_->server, wst);
      return false;
    }
    return true;
  }

 private:
  bool error(std::string *err, const char *what) {
    *err = std::string(what) + ": " + std::strerror(errno);
    return false;
  }

  std::string part_error(const Part &p, int wst) {
    return p.failed.load(std::memory_order_acquire) ? std::string(p.error) : exit_text(wst);
  }

  // who: a client's index, or UINT32_MAX for the server.
  pid_t spawn(pid_t parent, uint32_t who) {
    const pid_t p = fork();
    if (p != 0) return p;
    // No child outlives the bench.
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(3);
    _exit(who == UINT32_MAX ? server_main(c_) : client_main(c_, who, parent));
  }

  bool server_alive(std::string *err) {
    int wst = 0;
    const pid_t r = waitpid(server_, &wst, WNOHANG);
    if (r == 0) return true;
    if (r < 0) return error(err, "waitpid (raw server)");
    server_ = -1;
    *err = "raw server: " + part_error(c_->server, wst);
    return false;
  }

  bool alive(std::string *err) {
    if (!server_alive(err)) return false;
    for (uint32_t i = 0; i < clients_.size(); i++) {
      if (clients_[i] <= 0) continue;
      int wst = 0;
      const pid_t r = waitpid(clients_[i], &wst, WNOHANG);
      if (r == 0) continue;
      if (r < 0) return error(err, "waitpid");
      clients_[i] = -1;
      *err = "raw client " + std::to_string(i + 1) + ": " + part_error(parts(c_)[i], wst);
      return false;
    }
    return true;
  }

  void stop_server() {
    c_->quit.store(1, std::memory_order_seq_cst);
    for (uint32_t t = 0; t < c_->nthreads; t++) {
      bells(c_)[t].ring.fetch_add(1, std::memory_order_release);
      futex_wake(&bells(c_)[t].ring, INT_MAX);
    }
  }

  void cleanup() {
    if (c_) {
      stop_server();
      futex_wake(&c_->go, INT_MAX);
    }
    std::vector<pid_t> all = clients_;
    all.push_back(server_);
    for (pid_t p : all)
      if (p > 0) kill(p, SIGKILL);
    for (pid_t p : all)
      if (p > 0)
        while (waitpid(p, nullptr, 0) < 0 && errno == EINTR) {
        }
    clients_.clear();
    server_ = -1;
    if (c_) munmap(c_, size_);
    c_ = nullptr;
  }

  Ctl *c_ = nullptr;
  size_t size_ = 0;
  pid_t server_ = -1;
  std::vector<pid_t> clients_;
};

}  // namespace

void raw_default_spins(int64_t *client_spin_ns, int64_t *server_spin_ns) {
  auto env = [](const char *name) {
    const char *v = std::getenv(name);
    char *end = nullptr;
    long long x = v && *v ? std::strtoll(v, &end, 10) : -1;
    return end && *end == '\0' && x >= 0 ? int64_t(x) : kDefaultSpinNs;
  };
  const bool spin = std::thread::hardware_concurrency() >= 4;
  *client_spin_ns = spin ? env("CHI_SPIN_NS") : 0;
  *server_spin_ns = spin ? env("CHI_SERVER_SPIN_NS") : 0;
}

void raw_shm_sweep_point(const RawShmOptions &o, int wait, uint32_t n, chi_bench_row *row) {
  char name[48];
  std::snprintf(name, sizeof name, "raw shm %s %up", wait == kRawSpin ? "spin" : "sweep", n);
  chi_bench_row_init(row, name, CHI_BENCH_FLOOR);
  std::snprintf(row->transport, sizeof row->transport, "shm");
  row->payload_bytes = kPayload;
  row->processes = row->threads = n;
  row->window = 1;
  RawRun run;
  std::string err;
  const uint64_t cap = std::max<uint64_t>(o.sample_budget / std::max<uint32_t>(n, 1), 1024);
  if (!run.setup(n, std::max<uint32_t>(o.threads, 1), uint32_t(wait), cap, &err)) {
    chi_bench_row_fail(row, CHI_ERR_INTERNAL, "%s", err.c_str());
    return;
  }
  Ctl *c = run.ctl();
  c->client_spin_ns = o.client_spin_ns;
  c->server_spin_ns = o.server_spin_ns;
  c->warmup = std::max<uint64_t>(o.warmup / n, 100);
  uint64_t t0 = 0;
  const uint64_t dur = o.duration_ms * 1000000ull;
  if (!run.start(&err) || !run.run(dur, dur + kEndSlackNs, &t0, &err)) {
    chi_bench_row_fail(row, CHI_ERR_INTERNAL, "%s", err.c_str());
    return;
  }
  std::vector<uint64_t> all;
  uint64_t done = 0, t1 = t0;
  for (uint32_t i = 0; i < n; i++) {
    const Part &p = parts(c)[i];
    done += p.done;
    t1 = std::max(t1, p.end_ns);
    all.insert(all.end(), samples(c) + p.sample_off, samples(c) + p.sample_off + p.nsamples);
  }
  if (all.empty()) {
    chi_bench_row_fail(row, CHI_ERR_INTERNAL, "no round trip in %llu ms",
                       static_cast<unsigned long long>(o.duration_ms));
    return;
  }
  chi_bench_row_samples(row, all.data(), all.size());
  row->count = done;
  row->throughput = t1 > t0 ? double(done) * 1e9 / double(t1 - t0) : NAN;
}

void raw_shm_wake(uint64_t idle_ms, uint32_t samples_wanted, RawWakeFigures *f) {
  f->measured = true;
  f->idle_ms = double(idle_ms);
  RawRun run;
  std::string err;
  if (!run.setup(1, 1, kModeWake, 2ull * samples_wanted, &err)) {
    f->note = "raw wake-up: " + err;
    return;
  }
  Ctl *c = run.ctl();
  c->wake_samples = samples_wanted;
  c->idle_ns = idle_ms * 1000000ull;
  c->warmup = 100;
  uint64_t t0 = 0;
  if (!run.start(&err) || !run.run(0, samples_wanted * c->idle_ns + kEndSlackNs, &t0, &err)) {
    f->note = "raw wake-up: " + err;
    return;
  }
  const Part &p = parts(c)[0];
  uint64_t *buf = samples(c) + p.sample_off;
  chi_tool_stats_t st;
  chi_tool_summarize(buf, p.nsamples, &st);
  f->count = st.count;
  f->rt_p50_ns = st.p50_ns;
  f->rt_max_ns = st.max_ns;
  chi_tool_summarize(buf + samples_wanted, p.oneway, &st);
  f->oneway_count = st.count;
  f->oneway_p50_ns = st.p50_ns;
  f->oneway_max_ns = st.max_ns;
  if (p.oneway < p.nsamples)
    f->note = "raw wake-up: the server thread was awake for " +
              std::to_string(p.nsamples - p.oneway) + " of " + std::to_string(p.nsamples) +
              " round trips (no one-way figure for those)";
}

}  // namespace chi_bench

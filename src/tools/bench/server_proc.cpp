#include "server_proc.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <sstream>

#include "sampler.h"
#include "tool_util.h"

namespace chi_bench {
namespace {

constexpr uint64_t kMagic = 0x63686942656e6368ull;  // "chiBench"
constexpr int64_t kWaitTimeoutNs = 10'000'000'000;
// A worker's connect, warm-up or run past these bounds counts as lost.
constexpr uint64_t kConnectBoundNs = 60'000'000'000ull;
constexpr uint64_t kRunSlackNs = 120'000'000'000ull;

enum : uint32_t { kStarting = 0, kConnected = 1, kFailed = 2, kExited = 3 };
enum : uint32_t { kCmdRun = 1, kCmdExit = 2 };

// One worker's part of the shared memfd.  The parent writes cmd and work,
// then bumps cmd_seq (a futex word: the worker sleeps on it); the worker sets
// done_seq = cmd_seq when its results are in.
struct alignas(64) Slot {
  std::atomic<uint32_t> cmd_seq;
  std::atomic<uint32_t> done_seq;
  std::atomic<uint32_t> state;
  int32_t pid;
  uint32_t cmd;
  Work work;
  int32_t status;
  char error[160];
  uint64_t done, start_ns, end_ns;
  uint64_t nsamples, sample_off, sample_cap;
};

struct Control {
  uint64_t magic;
  uint32_t nworkers;
  char address[256];
  char config[512];              // config_path of the workers' runtimes; "": none
  std::atomic<uint32_t> go_seq;  // futex word: bumped when every participant is warm
  std::atomic<uint32_t> ready;   // participants warmed up in the current run
  std::atomic<uint64_t> stop_ns; // count == 0 work ends at this time
  Slot slots[];                  // then the samples, uint64_t each
};

static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free,
              "lock-free words cross processes");

// Shared (not private) futex: the word lives in the memfd mapping.
void futex_wait(std::atomic<uint32_t> *w, uint32_t seen, int64_t ns) {
  struct timespec ts = {time_t(ns / 1000000000), long(ns % 1000000000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t *>(w), FUTEX_WAIT, seen, &ts, nullptr, 0);
}
void futex_wake(std::atomic<uint32_t> *w) {
  syscall(SYS_futex, reinterpret_cast<uint32_t *>(w), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

uint64_t *samples_of(Control *c) {
  return reinterpret_cast<uint64_t *>(reinterpret_cast<char *>(c->slots) + c->nworkers * sizeof(Slot));
}

std::string self_exe() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return std::string();
  buf[n] = 0;
  return buf;
}

void sleep_ns(uint64_t ns) {
  struct timespec ts = {time_t(ns / 1000000000), long(ns % 1000000000)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

std::string tail_of(const std::string &path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  if (s.size() > 400) s = "..." + s.substr(s.size() - 400);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  for (char &ch : s)
    if (ch == '\n') ch = ' ';
  return s;
}

// ------------------------------------------------------------ worker side

void make_echo(uint8_t *p, size_t n, uint64_t who, uint64_t seq) {
  for (size_t i = 0; i < n; i++) p[i] = uint8_t(0x5A ^ (i * 29));
  uint64_t words[2] = {seq, who};
  std::memcpy(p, words, std::min(n, sizeof words));
}

// chi.add input: two little-endian words, distinct per task.
void make_add(uint8_t *p, uint64_t who, uint64_t seq, uint64_t *sum) {
  uint64_t a = seq * 2654435761ull, b = (who << 40) + seq;
  for (int i = 0; i < 8; i++) {
    p[i] = uint8_t(a >> (8 * i));
    p[8 + i] = uint8_t(b >> (8 * i));
  }
  *sum = a + b;
}

struct Runner {
  chi_runtime_t *rt;
  const Work &w;
  uint64_t who;
  chi_status_t status = CHI_OK;
  std::string error;

  void failed(chi_status_t st, const char *what) {
    if (status != CHI_OK) return;
    status = st;
    error = std::string(what) + ": " + chi_status_string(st) + ": " + chi_last_error_message();
  }

  // n tasks (or, n == 0, until *stop_ns), `window` outstanding; returns the
  // tasks completed and checked.
  uint64_t go(uint64_t n, const std::atomic<uint64_t> *stop_ns, uint64_t first_seq,
              Sampler *sampler) {
    const uint32_t win = std::max<uint32_t>(w.window, 1);
    const bool add = w.method == CHI_METHOD_ADD;
    const size_t size = add ? 16 : w.payload;
    const size_t out_size = add ? 8 : w.payload;
    const uint32_t every = std::max<uint32_t>(w.sample_every, 1);
    std::vector<chi_future_t> futures(win);
    std::vector<uint64_t> seqs(win), started(win), sums(win);
    std::vector<uint8_t> in(size ? size : 1), out(out_size ? out_size : 1), expect(size ? size : 1);
    uint32_t head = 0, outstanding = 0;
    uint64_t issued = 0, done = 0;
    bool stop = false;
    const uint64_t deadline = n == 0 ? stop_ns->load(std::memory_order_acquire) : 0;

    while (true) {
      bool more = !stop && (n ? issued < n : chi_tool_now_ns() < deadline);
      if (!more && outstanding == 0) break;
      if (stop) {
        for (; outstanding > 0; outstanding--, head = (head + 1) % win) chi_release(rt, futures[head]);
        break;
      }
      if (more && outstanding < win) {
        uint64_t seq = first_seq + issued;
        uint32_t at = (head + outstanding) % win;
        if (add)
          make_add(in.data(), who, seq, &sums[at]);
        else
          make_echo(in.data(), size, who, seq);
        uint64_t t0 = (sampler && seq % every == 0) ? chi_tool_now_ns() : 0;
        chi_future_t f = 0;
        chi_status_t st = chi_submit(rt, CHI_ROUTE_CPU, w.method, in.data(), size, &f);
        if (st == CHI_OK) {
          futures[at] = f;
          seqs[at] = seq;
          started[at] = t0;
          outstanding++;
          issued++;
          continue;
        }
        if (st != CHI_ERR_AGAIN || outstanding == 0) {
          failed(st, "chi_submit");
          stop = true;
        }
        if (outstanding == 0) continue;
      }
      size_t got = 0;
      chi_status_t st = chi_wait(rt, futures[head], kWaitTimeoutNs, out.data(), out.size(), &got);
      uint64_t t1 = started[head] ? chi_tool_now_ns() : 0;
      if (st != CHI_OK) {
        failed(st, "chi_wait");
        if (st == CHI_ERR_TIMEOUT || st == CHI_ERR_TOO_LARGE) chi_release(rt, futures[head]);
        stop = true;
      } else {
        bool right;
        if (add) {
          uint64_t v = 0;
          for (int i = 7; i >= 0; i--) v = (v << 8) | out[i];
          right = got == 8 && v == sums[head];
        } else {
          make_echo(expect.data(), size, who, seqs[head]);
          right = got == size && std::memcmp(out.data(), expect.data(), size) == 0;
        }
        if (!right) {
          if (status == CHI_OK) {
            status = CHI_ERR_INTERNAL;
            error = add ? "chi.add returned a wrong sum" : "chi.echo returned bytes that differ from its input";
          }
          stop = true;
        } else {
          done++;
          if (t1) sampler->add(t1 - started[head]);
        }
      }
      head = (head + 1) % win;
      outstanding--;
    }
    return done;
  }
};

void run_command(chi_runtime_t *rt, Control *c, Slot *s, uint64_t who, uint64_t *first_seq) {
  uint32_t go_seen = c->go_seq.load(std::memory_order_acquire);
  Work w = s->work;
  Runner r{rt, w, who, CHI_OK, std::string()};
  if (w.warmup) *first_seq += r.go(w.warmup, nullptr, *first_seq, nullptr);
  c->ready.fetch_add(1, std::memory_order_acq_rel);
  while (c->go_seq.load(std::memory_order_acquire) == go_seen)
    futex_wait(&c->go_seq, go_seen, 100'000'000);
  Sampler sm{samples_of(c) + s->sample_off, s->sample_cap};
  s->start_ns = chi_tool_now_ns();
  uint64_t done = r.status == CHI_OK ? r.go(w.count, &c->stop_ns, *first_seq, &sm) : 0;
  s->end_ns = chi_tool_now_ns();
  *first_seq += done + w.window;
  s->done = done;
  s->nsamples = sm.n;
  s->status = r.status;
  std::snprintf(s->error, sizeof s->error, "%s", r.error.c_str());
}

}  // namespace

int client_worker_main(const char *arg) {
  int fd = -1;
  unsigned index = 0;
  if (std::sscanf(arg, "%d:%u", &fd, &index) != 2) return 2;
  struct stat st;
  if (fstat(fd, &st) != 0) return 2;
  void *mem = mmap(nullptr, size_t(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (mem == MAP_FAILED) return 2;
  Control *c = static_cast<Control *>(mem);
  if (c->magic != kMagic || index >= c->nworkers) return 2;
  Slot *s = &c->slots[index];
  s->pid = getpid();
  const pid_t parent = getppid();

  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.mode = CHI_MODE_CLIENT;
  cfg.server_address = c->address;
  if (c->config[0]) cfg.config_path = c->config;
  chi_runtime_t *rt = nullptr;
  chi_status_t rc = chi_init(&cfg, &rt);
  if (rc != CHI_OK) {
    s->status = rc;
    std::snprintf(s->error, sizeof s->error, "chi_init: %s: %s", chi_status_string(rc),
                  chi_last_error_message());
    s->state.store(kFailed, std::memory_order_release);
    return 1;
  }
  s->state.store(kConnected, std::memory_order_release);
  uint32_t seen = 0;
  uint64_t seq = 0;
  int code = 0;
  for (;;) {
    uint32_t now = s->cmd_seq.load(std::memory_order_acquire);
    if (now == seen) {
      if (getppid() != parent) break;  // the bench is gone
      futex_wait(&s->cmd_seq, seen, 200'000'000);
      continue;
    }
    seen = now;
    if (s->cmd == kCmdExit) break;
    run_command(rt, c, s, index + 1, &seq);
    s->done_seq.store(seen, std::memory_order_release);
  }
  if (chi_finalize(rt) != CHI_OK) code = 1;
  s->state.store(kExited, std::memory_order_release);
  return code;
}

// ------------------------------------------------------------ parent side

bool ClientPool::alive(std::string *err) {
  Control *c = static_cast<Control *>(mem_);
  for (uint32_t i = 0; i < n_; i++) {
    if (pids_[i] <= 0) continue;
    int wst;
    if (waitpid(pids_[i], &wst, WNOHANG) == pids_[i]) {
      pid_t p = pids_[i];
      pids_[i] = -1;
      if (c->slots[i].state.load() == kFailed) {
        *err = "client " + std::to_string(i + 1) + ": " + c->slots[i].error;
      } else {
        *err = "client process " + std::to_string(p) + " exited (" +
               (WIFSIGNALED(wst) ? "signal " + std::to_string(WTERMSIG(wst))
                                 : "status " + std::to_string(WEXITSTATUS(wst))) +
               ")";
      }
      return false;
    }
  }
  return true;
}

bool ClientPool::start(const std::string &address, uint32_t n, uint64_t sample_budget,
                       std::string *err, const std::string &config) {
  stop();
  std::string self = self_exe();
  if (self.empty()) {
    *err = "cannot read /proc/self/exe";
    return false;
  }
  uint64_t cap = std::max<uint64_t>(sample_budget / std::max<uint32_t>(n, 1), 1024);
  mem_size_ = sizeof(Control) + n * sizeof(Slot) + n * cap * sizeof(uint64_t);
  fd_ = memfd_create("chimaera-bench", MFD_CLOEXEC);
  if (fd_ < 0 || ftruncate(fd_, off_t(mem_size_)) != 0) {
    *err = std::string("memfd: ") + std::strerror(errno);
    return false;
  }
  mem_ = mmap(nullptr, mem_size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (mem_ == MAP_FAILED) {
    mem_ = nullptr;
    *err = std::string("mmap: ") + std::strerror(errno);
    return false;
  }
  Control *c = new (mem_) Control;
  c->magic = kMagic;
  c->nworkers = n;
  std::snprintf(c->address, sizeof c->address, "%s", address.c_str());
  std::snprintf(c->config, sizeof c->config, "%s", config.c_str());
  for (uint32_t i = 0; i < n; i++) {
    Slot *s = new (&c->slots[i]) Slot;
    s->sample_off = i * cap;
    s->sample_cap = cap;
  }
  n_ = n;
  pids_.assign(n, -1);
  std::fflush(nullptr);
  const pid_t me = getpid();
  for (uint32_t i = 0; i < n; i++) {
    char arg[32];
    std::snprintf(arg, sizeof arg, "%d:%u", fd_, i);
    pid_t p = fork();
    if (p < 0) {
      *err = "fork: " + std::string(std::strerror(errno)) + " (client " + std::to_string(i + 1) + ")";
      return false;
    }
    if (p == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != me) _exit(127);
      fcntl(fd_, F_SETFD, 0);
      int null = open("/dev/null", O_WRONLY);
      if (null >= 0) dup2(null, STDOUT_FILENO);
      char *argv[] = {const_cast<char *>(self.c_str()), const_cast<char *>("--client-worker"), arg,
                      nullptr};
      execv(self.c_str(), argv);
      _exit(127);
    }
    pids_[i] = p;
  }
  uint64_t deadline = chi_tool_now_ns() + kConnectBoundNs;
  for (;;) {
    uint32_t up = 0;
    for (uint32_t i = 0; i < n; i++) {
      uint32_t st = c->slots[i].state.load(std::memory_order_acquire);
      if (st == kFailed) {
        *err = "client " + std::to_string(i + 1) + ": " + c->slots[i].error;
        return false;
      }
      up += st == kConnected;
    }
    if (up == n) return true;
    if (!alive(err)) return false;
    if (chi_tool_now_ns() > deadline) {
      *err = std::to_string(up) + " of " + std::to_string(n) + " clients connected in 60 s";
      return false;
    }
    sleep_ns(2'000'000);
  }
}

bool ClientPool::run(const std::vector<Work> &work, uint64_t duration_ns, uint64_t *t0,
                     uint64_t *t1, std::vector<WorkResult> *results, std::string *err) {
  Control *c = static_cast<Control *>(mem_);
  if (!c || work.size() != n_) {
    *err = "no pool";
    return false;
  }
  c->ready.store(0);
  c->stop_ns.store(UINT64_MAX);
  uint32_t parts = 0;
  std::vector<uint32_t> seq(n_, 0);
  for (uint32_t i = 0; i < n_; i++) {
    if (work[i].mode == kWorkNone) continue;
    Slot *s = &c->slots[i];
    s->cmd = kCmdRun;
    s->work = work[i];
    s->status = CHI_OK;
    s->error[0] = 0;
    s->done = s->start_ns = s->end_ns = s->nsamples = 0;
    seq[i] = s->cmd_seq.load() + 1;
    s->cmd_seq.store(seq[i], std::memory_order_release);
    futex_wake(&s->cmd_seq);
    parts++;
  }
  uint64_t bound = chi_tool_now_ns() + kRunSlackNs;
  while (c->ready.load(std::memory_order_acquire) < parts) {
    if (!alive(err)) return false;
    if (chi_tool_now_ns() > bound) {
      *err = "warm-up did not end within 120 s";
      return false;
    }
    sleep_ns(500'000);
  }
  *t0 = chi_tool_now_ns();
  c->stop_ns.store(*t0 + duration_ns, std::memory_order_release);
  c->go_seq.fetch_add(1, std::memory_order_acq_rel);
  futex_wake(&c->go_seq);
  bound = *t0 + duration_ns + kRunSlackNs;
  for (;;) {
    uint32_t finished = 0;
    for (uint32_t i = 0; i < n_; i++)
      if (seq[i] && c->slots[i].done_seq.load(std::memory_order_acquire) == seq[i]) finished++;
    if (finished == parts) break;
    if (!alive(err)) return false;
    if (chi_tool_now_ns() > bound) {
      *err = "run did not end within its bound";
      return false;
    }
    sleep_ns(500'000);
  }
  *t1 = *t0;
  results->assign(n_, WorkResult());
  const uint64_t *all = samples_of(c);
  for (uint32_t i = 0; i < n_; i++) {
    if (!seq[i]) continue;
    const Slot &s = c->slots[i];
    WorkResult &r = (*results)[i];
    r.status = s.status;
    r.error = s.error;
    r.done = s.done;
    r.start_ns = s.start_ns;
    r.end_ns = s.end_ns;
    r.samples.assign(all + s.sample_off, all + s.sample_off + s.nsamples);
    *t1 = std::max(*t1, s.end_ns);
  }
  return true;
}

void ClientPool::stop() {
  Control *c = static_cast<Control *>(mem_);
  if (c) {
    for (uint32_t i = 0; i < n_; i++) {
      c->slots[i].cmd = kCmdExit;
      c->slots[i].cmd_seq.fetch_add(1, std::memory_order_acq_rel);
      futex_wake(&c->slots[i].cmd_seq);
    }
  }
  uint64_t deadline = chi_tool_now_ns() + 20'000'000'000ull;
  for (;;) {
    bool left = false;
    for (auto &p : pids_) {
      if (p <= 0) continue;
      if (waitpid(p, nullptr, WNOHANG) == p)
        p = -1;
      else
        left = true;
    }
    if (!left) break;
    if (chi_tool_now_ns() > deadline) {
      for (auto &p : pids_)
        if (p > 0) {
          kill(p, SIGKILL);
          waitpid(p, nullptr, 0);
          p = -1;
        }
      break;
    }
    sleep_ns(1'000'000);
  }
  pids_.clear();
  if (mem_) munmap(mem_, mem_size_);
  if (fd_ >= 0) close(fd_);
  mem_ = nullptr;
  fd_ = -1;
  n_ = 0;
}

// ------------------------------------------------------------ the server

std::string default_server_bin() {
  std::string self = self_exe();
  size_t slash = self.rfind('/');
  return (slash == std::string::npos ? std::string(".") : self.substr(0, slash)) +
         "/chimaera-server";
}

namespace {

bool ping(const std::string &address) {
  char reply[256];
  return chi_server_query(address.c_str(), "ping", reply, sizeof reply, nullptr) == CHI_OK;
}

std::string status_json(const std::string &address) {
  std::vector<char> reply(1 << 20);
  size_t n = 0;
  chi_status_t st = chi_server_query(address.c_str(), "status-json", reply.data(), reply.size(), &n);
  return st == CHI_OK ? std::string(reply.data()) : std::string();
}

// A port of 127.0.0.1 that is free now (the kernel's pick; another process
// could take it before the server binds it, which then fails to start).
int free_loopback_port() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a;
  std::memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

bool write_file(const std::string &path, const std::string &text, mode_t mode, std::string *err) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0 || write(fd, text.data(), text.size()) != ssize_t(text.size())) {
    *err = path + ": " + std::strerror(errno);
    if (fd >= 0) close(fd);
    return false;
  }
  close(fd);
  return true;
}

// Keys and YAML of a CURVE server in out->runtime_dir (see start_server).
bool make_curve_files(bool server_yaml, ServerProc *out, std::string *err) {
  char spub[41], ssec[41], cpub[41], csec[41];
  if (zmq_curve_keypair(spub, ssec) != 0 || zmq_curve_keypair(cpub, csec) != 0) {
    *err = std::string("zmq_curve_keypair: ") + zmq_strerror(zmq_errno());
    return false;
  }
  const std::string &d = out->runtime_dir;
  // z85 has no quote characters: single-quoted YAML scalars hold any key.
  struct {
    std::string name, text;
    mode_t mode;
  } files[] = {
      {"server.key", std::string("# chimaera-bench CURVE secret key\n") + ssec + "\n", 0600},
      {"client.key", std::string("# chimaera-bench CURVE secret key\n") + csec + "\n", 0600},
      {"allowed-clients", std::string(cpub) + "\n", 0600},
      {"client.yaml",
       std::string("curve_server_key: '") + spub + "'\ncurve_key_file: '" + d + "/client.key'\n",
       0600},
      {"server.yaml",
       "server:\n  curve_key_file: '" + d + "/server.key'\n  curve_allowed_keys_file: '" + d +
           "/allowed-clients'\n",
       0600},
  };
  for (auto &f : files) {
    if (f.name == "server.yaml" && !server_yaml) continue;
    std::string path = d + "/" + f.name;
    if (!write_file(path, f.text, f.mode, err)) return false;
    out->files.push_back(path);
  }
  out->client_config = d + "/client.yaml";
  return true;
}

}  // namespace

bool start_server(const std::string &bin, int32_t workers, const char *config,
                  const ServerListen &listen, ServerProc *out, std::string *err) {
  out->bin = bin;
  if (access(bin.c_str(), X_OK) != 0) {
    *err = "no chimaera-server at " + bin + " (--server-bin PATH)";
    return false;
  }
  const char *tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/chimaera-bench.XXXXXX";
  std::vector<char> dir(tmpl.begin(), tmpl.end());
  dir.push_back(0);
  if (!mkdtemp(dir.data())) {  // mode 0700
    *err = "mkdtemp " + tmpl + ": " + std::strerror(errno);
    return false;
  }
  out->runtime_dir = dir.data();
  out->started = true;  // from here on stop_server cleans up
  out->log_path = out->runtime_dir + "/server.log";
  out->address = "shm://chimaera-bench-" + std::to_string(getpid()) + listen.suffix;
  setenv("CHI_RUNTIME_DIR", out->runtime_dir.c_str(), 1);

  // The shm:// address goes last: the server starts its listeners in order,
  // so once it answers ping there, the ZeroMQ ones are bound too.
  std::vector<std::string> args = {bin};
  if (listen.ipc) {
    out->ipc_address = "ipc://" + out->runtime_dir + "/server.ipc";
    args.push_back("--listen");
    args.push_back(out->ipc_address);
  }
  if (listen.tcp) {
    int port = free_loopback_port();
    if (port <= 0) {
      *err = std::string("no free loopback port: ") + std::strerror(errno);
      stop_server(out);
      return false;
    }
    out->tcp_address = "tcp://127.0.0.1:" + std::to_string(port);
    args.push_back("--listen");
    args.push_back(out->tcp_address);
  }
  args.push_back("--listen");
  args.push_back(out->address);
  std::vector<std::string> env;
  for (char **e = environ; *e; e++) env.push_back(*e);
  if (listen.tcp && listen.curve) {
    out->curve = true;
    if (!make_curve_files(!config, out, err)) {
      stop_server(out);
      return false;
    }
    if (config) {
      env.push_back("CHI_SERVER_CURVE_KEY_FILE=" + out->runtime_dir + "/server.key");
      env.push_back("CHI_SERVER_CURVE_ALLOWED_KEYS_FILE=" + out->runtime_dir + "/allowed-clients");
    } else {
      args.push_back("--config");
      args.push_back(out->runtime_dir + "/server.yaml");
    }
  }
  if (workers > 0) {
    args.push_back("--workers");
    args.push_back(std::to_string(workers));
  }
  if (config) {
    args.push_back("--config");
    args.push_back(config);
  }
  std::vector<char *> argv, envp;
  for (auto &a : args) argv.push_back(const_cast<char *>(a.c_str()));
  argv.push_back(nullptr);
  for (auto &e : env) envp.push_back(const_cast<char *>(e.c_str()));
  envp.push_back(nullptr);
  int log = open(out->log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (log < 0) {
    *err = out->log_path + ": " + std::strerror(errno);
    stop_server(out);
    return false;
  }
  std::fflush(nullptr);
  const pid_t me = getpid();
  pid_t p = fork();
  if (p < 0) {
    close(log);
    *err = std::string("fork: ") + std::strerror(errno);
    stop_server(out);
    return false;
  }
  if (p == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != me) _exit(127);
    dup2(log, STDOUT_FILENO);
    dup2(log, STDERR_FILENO);
    execve(bin.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  close(log);
  out->pid = p;
  uint64_t deadline = chi_tool_now_ns() + 20'000'000'000ull;
  for (;;) {
    if (ping(out->address)) return true;
    int wst;
    if (waitpid(p, &wst, WNOHANG) == p) {
      out->pid = -1;
      out->exit_status = WIFEXITED(wst) ? WEXITSTATUS(wst) : -1;
      *err = "chimaera-server exited at start: " + tail_of(out->log_path);
      stop_server(out);
      return false;
    }
    if (chi_tool_now_ns() > deadline) {
      *err = "chimaera-server did not answer ping within 20 s: " + tail_of(out->log_path);
      stop_server(out);
      return false;
    }
    sleep_ns(5'000'000);
  }
}

bool attach_server(const char *address, ServerProc *out, std::string *err) {
  out->address = address;
  out->started = false;
  if (!ping(out->address)) {
    *err = std::string("no server answers ping at ") + address + ": " + chi_last_error_message();
    return false;
  }
  std::string js = status_json(out->address);
  size_t at = js.find("\"pid\":");
  if (at != std::string::npos) out->pid = pid_t(std::atol(js.c_str() + at + 6));
  return true;
}

void stop_server(ServerProc *s) {
  if (!s->started) return;
  if (s->pid > 0) {
    kill(s->pid, SIGTERM);
    uint64_t deadline = chi_tool_now_ns() + 20'000'000'000ull;
    int wst = 0;
    for (;;) {
      pid_t r = waitpid(s->pid, &wst, WNOHANG);
      if (r == s->pid) {
        s->exit_status = WIFEXITED(wst) ? WEXITSTATUS(wst) : -1;
        break;
      }
      if (chi_tool_now_ns() > deadline) {
        kill(s->pid, SIGKILL);
        waitpid(s->pid, nullptr, 0);
        s->exit_status = -1;
        break;
      }
      sleep_ns(2'000'000);
    }
    s->pid = -1;
  }
  if (!s->runtime_dir.empty()) {
    // The server removes its own files; whatever a killed one left goes too.
    std::string name = s->address.substr(s->address.find("://") + 3);
    unlink((s->runtime_dir + "/" + name + ".sock").c_str());
    unlink((s->runtime_dir + "/" + name + ".lock").c_str());
    if (!s->ipc_address.empty()) unlink(s->ipc_address.substr(6).c_str());
    for (const auto &f : s->files) unlink(f.c_str());
    s->files.clear();
    if (s->exit_status == 0) unlink(s->log_path.c_str());
    if (rmdir(s->runtime_dir.c_str()) == 0) s->runtime_dir.clear();
  }
  s->started = false;
}

double proc_cpu_seconds(pid_t pid) {
  if (pid <= 0) return NAN;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(in, text)) return NAN;
  // Fields after the command (which may hold spaces): state is field 3;
  // utime and stime are fields 14 and 15.
  size_t close_paren = text.rfind(')');
  if (close_paren == std::string::npos) return NAN;
  std::istringstream f(text.substr(close_paren + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && f >> field; i++) {
    if (i == 14) utime = std::strtoull(field.c_str(), nullptr, 10);
    if (i == 15) stime = std::strtoull(field.c_str(), nullptr, 10);
  }
  long hz = sysconf(_SC_CLK_TCK);
  return hz > 0 ? double(utime + stime) / double(hz) : NAN;
}

double proc_rss_kib(pid_t pid) {
  if (pid <= 0) return NAN;
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::atof(line.c_str() + 6);
  return NAN;
}

int server_poller_count(const std::string &address) {
  std::string js = status_json(address);
  size_t at = js.find("\"pollers\":");
  return at == std::string::npos ? -1 : std::atoi(js.c_str() + at + 10);
}

int server_client_count(const std::string &address) {
  std::string js = status_json(address);
  size_t at = js.find("\"clients\":[");
  if (at == std::string::npos) return -1;
  size_t end = js.find(']', at);
  int n = 0;
  for (size_t p = js.find("{\"id\":", at); p != std::string::npos && p < end;
       p = js.find("{\"id\":", p + 1))
    n++;
  return n;
}

}  // namespace chi_bench

#include "core/mps.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/log.h"

extern char **environ;

namespace chi::mps {
namespace {

constexpr const char *kControl = "nvidia-cuda-mps-control";
constexpr const char *kStartLock = "/chimaera-mps.lock";   // start and stop decisions, exclusive
constexpr const char *kUsers = "/chimaera-mps.users";      // shared while a chimaera process uses it
constexpr const char *kMarker = "/chimaera-mps.started";   // "PID\n" of the chimaera process that started it

void sleep_ms(int ms) {
  timespec ts{ms / 1000, long(ms % 1000) * 1000000};
  nanosleep(&ts, nullptr);
}

// A directory of this user's, mode 0700 (created if missing).
chi_status_t private_dir(const std::string &dir) {
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    return set_error(CHI_ERR_PERMISSION, "MPS pipe directory %s: %s", dir.c_str(), strerror(errno));
  struct stat st;
  if (lstat(dir.c_str(), &st) != 0)
    return set_error(CHI_ERR_PERMISSION, "MPS pipe directory %s: %s", dir.c_str(), strerror(errno));
  if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) != 0)
    return set_error(CHI_ERR_PERMISSION,
                     "MPS pipe directory %s is not a private directory of this user (mode 0700): refused", dir.c_str());
  return CHI_OK;
}

int open_lock(const std::string &path) {
  return open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
}

// The pid in the marker, if the marker was written after the daemon that
// answers now made its control socket (else it is a stale one of an earlier
// daemon: removed), or 0.
int valid_marker(const std::string &dir) {
  struct stat m, c;
  const std::string marker = dir + kMarker;
  if (lstat(marker.c_str(), &m) != 0) return 0;
  if (lstat((dir + "/control").c_str(), &c) != 0 || m.st_mtim.tv_sec < c.st_mtim.tv_sec ||
      (m.st_mtim.tv_sec == c.st_mtim.tv_sec && m.st_mtim.tv_nsec < c.st_mtim.tv_nsec)) {
    unlink(marker.c_str());
    return 0;
  }
  const int fd = open(marker.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return 0;
  char buf[32] = {};
  const ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  const long pid = n > 0 ? std::strtol(buf, nullptr, 10) : 0;
  return pid > 0 && pid < (1L << 30) ? int(pid) : 0;
}

// Runs the control program with `arg` (or none) for the daemon at `dir`
// (its CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY, the rest of the
// environment as this process's), its standard input from `input` (or
// /dev/null), its output appended to `out` (or /dev/null).  *pid: the child.
bool spawn_control(const std::string &dir, const char *arg, const char *input, const char *out, pid_t *pid) {
  std::vector<std::string> vars{"CUDA_MPS_PIPE_DIRECTORY=" + dir, "CUDA_MPS_LOG_DIRECTORY=" + dir + "/log"};
  std::vector<char *> envp;
  for (char **e = environ; *e; ++e)
    if (std::strncmp(*e, "CUDA_MPS_PIPE_DIRECTORY=", 24) != 0 && std::strncmp(*e, "CUDA_MPS_LOG_DIRECTORY=", 23) != 0)
      envp.push_back(*e);
  for (std::string &v : vars) envp.push_back(&v[0]);
  envp.push_back(nullptr);
  int in[2] = {-1, -1};
  if (input && pipe2(in, O_CLOEXEC) != 0) return false;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (input) posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  else posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, out ? out : "/dev/null", O_WRONLY | O_CREAT | O_APPEND, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  char *argv[3] = {const_cast<char *>(kControl), const_cast<char *>(arg), nullptr};
  const int e = posix_spawnp(pid, kControl, &fa, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&fa);
  if (input) {
    close(in[0]);
    if (e == 0) {
      const size_t n = std::strlen(input);
      if (write(in[1], input, n) != ssize_t(n)) { /* the program reads nothing: it says so itself */ }
    }
    close(in[1]);
  }
  errno = e;
  return e == 0;
}

int wait_child(pid_t pid) {
  int st = 0;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

// Whether this process's CUDA driver is initialized: loaded, and
// cuDeviceGetCount does not answer CUDA_ERROR_NOT_INITIALIZED (3).  The
// driver connects to an MPS daemon at its initialization.
bool cuda_initialized() {
  void *lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (!lib) return false;
  using count_fn = int (*)(int *);
  auto fn = reinterpret_cast<count_fn>(dlsym(lib, "cuDeviceGetCount"));
  int n = 0;
  const bool init = fn && fn(&n) != 3;
  dlclose(lib);
  return init;
}

}  // namespace

std::string pipe_directory() {
  const char *env = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  return env && *env ? env : "/tmp/nvidia-mps";
}

bool control_answers(const std::string &dir) {
  const std::string path = dir + "/control";
  sockaddr_un a{};
  if (path.size() >= sizeof a.sun_path) return false;
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  // The daemon's socket type is its own business: try each.
  for (int type : {SOCK_STREAM, SOCK_SEQPACKET, SOCK_DGRAM}) {
    const int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    const bool ok = connect(fd, reinterpret_cast<const sockaddr *>(&a), sizeof a) == 0;
    close(fd);
    if (ok) return true;
  }
  return false;
}

std::string private_directory() {
  const char *x = std::getenv("XDG_RUNTIME_DIR");
  if (x && *x == '/') return std::string(x) + "/chimaera-mps";
  return "/tmp/chimaera-mps-" + std::to_string(geteuid());
}

chi_status_t Daemon::join() {
  if (joined_) return CHI_OK;
  const char *env = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  if (env && *env && private_directory() != env && control_answers(env)) {
    // The user's own daemon (scripts/mps.sh, a job script): used, never stopped.
    dir_ = env;
    joined_ = true;
    log(LogLevel::kInfo, "MPS: using the control daemon at %s (CUDA_MPS_PIPE_DIRECTORY)", dir_.c_str());
    return CHI_OK;
  }
  dir_ = private_directory();
  if (chi_status_t s = private_dir(dir_); s != CHI_OK) return s;
  const int lock = open_lock(dir_ + kStartLock);
  const int users = lock >= 0 ? open_lock(dir_ + kUsers) : -1;
  if (lock < 0 || users < 0 || flock(lock, LOCK_EX) != 0 || flock(users, LOCK_SH) != 0) {
    const int e = errno;
    if (lock >= 0) close(lock);
    if (users >= 0) close(users);
    return set_error(CHI_ERR_PERMISSION, "MPS pipe directory %s: its lock files: %s", dir_.c_str(), strerror(e));
  }
  chi_status_t status = CHI_OK;
  const std::string logs = dir_ + "/log";
  if (control_answers(dir_)) {
    starter_pid_ = valid_marker(dir_);
    log(LogLevel::kInfo, "MPS: using the control daemon at %s (started by %s)", dir_.c_str(), started_by().c_str());
  } else {
    (void)mkdir(logs.c_str(), 0700);
    pid_t pid = 0;
    int rc = -1;
    if (!spawn_control(dir_, "-d", nullptr, nullptr, &pid))
      status = set_error(CHI_ERR_NO_DEVICE, "server.mps: cannot run %s (%s): is the NVIDIA driver's MPS installed?",
                         kControl, strerror(errno));
    else if ((rc = wait_child(pid)) != 0)
      status = set_error(CHI_ERR_NO_DEVICE, "server.mps: %s -d exited with %d (its log: %s/control.log)", kControl, rc,
                         logs.c_str());
    for (int waited = 0; status == CHI_OK && !control_answers(dir_); waited += 20) {
      if (waited >= start_wait_ms_) {
        status = set_error(CHI_ERR_NO_DEVICE, "server.mps: the MPS control daemon did not answer at %s within %d ms "
                           "(its log: %s/control.log)", dir_.c_str(), start_wait_ms_, logs.c_str());
        break;
      }
      sleep_ms(20);
    }
    if (status == CHI_OK) {
      const std::string marker = dir_ + kMarker;
      const int fd = open(marker.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
      if (fd >= 0) {
        const std::string text = std::to_string(getpid()) + "\n";
        if (write(fd, text.data(), text.size()) != ssize_t(text.size())) { /* then nobody stops it: logged below */ }
        close(fd);
      }
      starter_pid_ = getpid();
      log(LogLevel::kInfo, "MPS: started a control daemon at %s for this user (logs in %s)", dir_.c_str(),
          logs.c_str());
    }
  }
  if (status == CHI_OK) {
    setenv("CUDA_MPS_PIPE_DIRECTORY", dir_.c_str(), 1);
    if (!std::getenv("CUDA_MPS_LOG_DIRECTORY")) setenv("CUDA_MPS_LOG_DIRECTORY", logs.c_str(), 1);
    users_fd_ = users;
    joined_ = true;
  } else {
    close(users);
  }
  flock(lock, LOCK_UN);
  close(lock);
  return status;
}

void Daemon::leave() {
  if (!joined_) return;
  joined_ = false;
  if (users_fd_ < 0) return;  // the user's daemon
  const int lock = open_lock(dir_ + kStartLock);
  if (lock >= 0) (void)flock(lock, LOCK_EX);
  flock(users_fd_, LOCK_UN);
  // The last chimaera process out: a daemon one of them started is told to
  // quit (it ends once its clients' contexts are gone: this process's at
  // exit).  Its answer is not waited for beyond a moment.
  if (lock >= 0 && flock(users_fd_, LOCK_EX | LOCK_NB) == 0 && valid_marker(dir_) != 0) {
    pid_t pid = 0;
    const std::string out = dir_ + "/log/quit.log";
    if (spawn_control(dir_, nullptr, "quit\n", out.c_str(), &pid)) {
      int st = 0;
      int waited = 0;
      while (waitpid(pid, &st, WNOHANG) == 0 && waited < 2000) {
        sleep_ms(10);
        waited += 10;
      }
      if (waited >= 2000) std::thread([pid] { (void)wait_child(pid); }).detach();
      unlink((dir_ + kMarker).c_str());
      log(LogLevel::kInfo, "MPS: told the control daemon at %s to quit (the last chimaera process using it)",
          dir_.c_str());
    } else {
      log(LogLevel::kWarn, "MPS: cannot run %s to stop the daemon at %s: %s", kControl, dir_.c_str(),
          strerror(errno));
    }
  }
  close(users_fd_);
  users_fd_ = -1;
  if (lock >= 0) {
    flock(lock, LOCK_UN);
    close(lock);
  }
}

std::string Daemon::started_by() const {
  if (starter_pid_ == 0) return "its user";
  if (starter_pid_ == getpid()) return "this process";
  return "chimaera process " + std::to_string(starter_pid_);
}

bool adopt(const std::string &dir) {
  static std::atomic<bool> warned{false};
  const char *cur = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  if (cur && dir == cur) return true;
  if (!cuda_initialized()) {
    setenv("CUDA_MPS_PIPE_DIRECTORY", dir.c_str(), 1);
    log(LogLevel::kInfo, "MPS: this process's CUDA contexts join the server's MPS (pipe directory %s)", dir.c_str());
    return true;
  }
  if (!warned.exchange(true))
    log(LogLevel::kWarn,
        "the server runs MPS (pipe directory %s), but this process initialized CUDA before chi_init, outside it: "
        "its kernels and the server's orchestrator are time-sliced on a shared GPU (a client kernel's task that "
        "crosses to the server: milliseconds); call chi_init before the first CUDA call, or start the program "
        "with CUDA_MPS_PIPE_DIRECTORY=%s",
        dir.c_str(), dir.c_str());
  return false;
}

}  // namespace chi::mps

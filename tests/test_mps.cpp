// The MPS daemon a runtime joins for server.mps (src/core/mps.h), without a
// GPU or the NVIDIA driver: the refusals (a pipe directory that is not
// private, no nvidia-cuda-mps-control), the reuse of a daemon that answers at
// $CUDA_MPS_PIPE_DIRECTORY (a listening socket where its control socket
// would be: all "answers" means) which is never stopped, a stale socket that
// does not answer, and a client's adopt in a process without the CUDA
// driver.  Then, with this program as a stand-in nvidia-cuda-mps-control
// (a link of that name on PATH; CHI_FAKE_MPS says how it behaves): a -d
// that fails, a daemon that never answers, a daemon started, shared by two
// runtimes and told to quit by the last one out, a quit that hangs, and a
// stale marker.  On a GPU host, test_gpu_client runs the real daemon.
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "base/error.h"
#include "core/mps.h"

extern "C" {
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>
}

namespace {

std::string g_base;  // a private temporary directory per test

int setup(void **) {
  char tmpl[] = "/tmp/chi-test-mps-XXXXXX";
  if (!mkdtemp(tmpl)) return -1;
  g_base = tmpl;
  setenv("XDG_RUNTIME_DIR", g_base.c_str(), 1);
  unsetenv("CUDA_MPS_PIPE_DIRECTORY");
  return 0;
}

int teardown(void **) {
  const std::string rm = "rm -rf '" + g_base + "'";
  return system(rm.c_str()) == 0 ? 0 : -1;
}

// A Unix socket listening at path (fd returned), or -1.
int listen_at(const std::string &path) {
  sockaddr_un a{};
  if (path.size() >= sizeof a.sun_path) return -1;
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0 || listen(fd, 4) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

void test_private_directory(void **) {
  assert_string_equal(chi::mps::private_directory().c_str(), (g_base + "/chimaera-mps").c_str());
  unsetenv("XDG_RUNTIME_DIR");
  assert_string_equal(chi::mps::private_directory().c_str(),
                      ("/tmp/chimaera-mps-" + std::to_string(geteuid())).c_str());
  setenv("XDG_RUNTIME_DIR", "relative", 1);  // not a path: ignored
  assert_string_equal(chi::mps::private_directory().c_str(),
                      ("/tmp/chimaera-mps-" + std::to_string(geteuid())).c_str());
}

void test_refuses_a_shared_directory(void **) {
  const std::string dir = g_base + "/chimaera-mps";
  assert_int_equal(mkdir(dir.c_str(), 0755), 0);
  assert_int_equal(chmod(dir.c_str(), 0755), 0);
  chi::mps::Daemon d;
  assert_int_equal(d.join(), CHI_ERR_PERMISSION);
  assert_non_null(std::strstr(chi::last_error(), "not a private directory"));
  assert_false(d.joined());
  // A file in its place, too.
  assert_int_equal(rmdir(dir.c_str()), 0);
  FILE *f = fopen(dir.c_str(), "w");
  assert_non_null(f);
  fclose(f);
  assert_int_equal(d.join(), CHI_ERR_PERMISSION);
}

void test_no_control_program(void **) {
  const char *old = getenv("PATH");
  const std::string saved = old ? old : "";
  setenv("PATH", g_base.c_str(), 1);  // an empty directory: no nvidia-cuda-mps-control
  chi::mps::Daemon d;
  const chi_status_t s = d.join();
  setenv("PATH", saved.c_str(), 1);
  assert_int_equal(s, CHI_ERR_NO_DEVICE);
  assert_non_null(std::strstr(chi::last_error(), "nvidia-cuda-mps-control"));
  assert_false(d.joined());
  assert_null(getenv("CUDA_MPS_PIPE_DIRECTORY"));  // a failed join leaves the process as it was
  struct stat st;
  assert_int_equal(lstat((g_base + "/chimaera-mps").c_str(), &st), 0);
  assert_int_equal(st.st_mode & 0777, 0700);
}

void test_reuses_the_users_daemon(void **) {
  const std::string dir = g_base + "/users-own";
  assert_int_equal(mkdir(dir.c_str(), 0700), 0);
  assert_false(chi::mps::control_answers(dir));
  const int fd = listen_at(dir + "/control");
  assert_true(fd >= 0);
  assert_true(chi::mps::control_answers(dir));
  setenv("CUDA_MPS_PIPE_DIRECTORY", dir.c_str(), 1);
  {
    chi::mps::Daemon d;
    assert_int_equal(d.join(), CHI_OK);
    assert_true(d.joined());
    assert_string_equal(d.directory().c_str(), dir.c_str());
    assert_string_equal(d.started_by().c_str(), "its user");
    assert_string_equal(getenv("CUDA_MPS_PIPE_DIRECTORY"), dir.c_str());
  }  // leave(): a daemon the user started is never told to quit
  assert_true(chi::mps::control_answers(dir));
  close(fd);
  // The socket file stays behind a closed listener: it answers no more.
  assert_false(chi::mps::control_answers(dir));
  unsetenv("CUDA_MPS_PIPE_DIRECTORY");
}

// --- The stand-in control program (run as nvidia-cuda-mps-control) ---
//   -d: starts a "daemon" (a child listening at $CUDA_MPS_PIPE_DIRECTORY/
//       control, its pid in fake.pid there) and exits 0; CHI_FAKE_MPS=fail:
//       exits 3 instead; =mute: exits 0 and starts nothing.
//   no argument: reads a command on stdin; "quit" ends the daemon (SIGTERM);
//       CHI_FAKE_MPS=slow-quit: after 4 s.

void sleep_ms(int ms) {
  timespec ts{ms / 1000, long(ms % 1000) * 1000000};
  nanosleep(&ts, nullptr);
}

// The number in a pid file, or 0.
int read_pid(const std::string &path) {
  FILE *f = fopen(path.c_str(), "r");
  int pid = 0;
  if (f) {
    if (fscanf(f, "%d", &pid) != 1) pid = 0;
    fclose(f);
  }
  return pid;
}

int fake_daemon(const std::string &dir) {
  const pid_t pid = fork();
  if (pid < 0) return 1;
  if (pid > 0) return 0;  // -d returns at once; the daemon goes on
  setsid();
  const int fd = listen_at(dir + "/control");
  if (fd < 0) _exit(1);
  FILE *f = fopen((dir + "/fake.pid").c_str(), "w");
  if (f) {
    fprintf(f, "%d\n", int(getpid()));
    fclose(f);
  }
  signal(SIGTERM, SIG_DFL);
  for (;;) {
    const int c = accept(fd, nullptr, nullptr);
    if (c >= 0) close(c);
  }
}

int fake_control(int argc, char **argv) {
  const char *mode = getenv("CHI_FAKE_MPS");
  const std::string m = mode ? mode : "";
  const char *d = getenv("CUDA_MPS_PIPE_DIRECTORY");
  if (!d) return 2;
  const std::string dir = d;
  if (argc > 1 && std::strcmp(argv[1], "-d") == 0) {
    if (m == "fail") return 3;
    if (m == "mute") return 0;
    return fake_daemon(dir);
  }
  char cmd[64] = {};
  if (!fgets(cmd, sizeof cmd, stdin) || std::strncmp(cmd, "quit", 4) != 0) return 4;
  if (m == "slow-quit") sleep_ms(4000);
  const int pid = read_pid(dir + "/fake.pid");
  if (pid <= 0) return 5;
  unlink((dir + "/control").c_str());
  kill(pid, SIGTERM);
  return 0;
}

// The fake on PATH for this test: g_base/bin/nvidia-cuda-mps-control -> this program.
std::string g_saved_path;
void fake_on_path(const char *mode) {
  const std::string bin = g_base + "/bin";
  assert_int_equal(mkdir(bin.c_str(), 0700), 0);
  char self[4096] = {};
  assert_true(readlink("/proc/self/exe", self, sizeof self - 1) > 0);
  assert_int_equal(symlink(self, (bin + "/nvidia-cuda-mps-control").c_str()), 0);
  const char *old = getenv("PATH");
  g_saved_path = old ? old : "";
  setenv("PATH", bin.c_str(), 1);
  if (mode) setenv("CHI_FAKE_MPS", mode, 1);
  else unsetenv("CHI_FAKE_MPS");
}

// Ends the fake daemon of dir, if one runs (test cleanup).
void stop_fake(const std::string &dir) {
  const int pid = read_pid(dir + "/fake.pid");
  if (pid > 0) kill(pid, SIGTERM);
}

int teardown_fake(void **state) {
  stop_fake(g_base + "/chimaera-mps");
  setenv("PATH", g_saved_path.c_str(), 1);
  unsetenv("CHI_FAKE_MPS");
  unsetenv("CUDA_MPS_PIPE_DIRECTORY");
  unsetenv("CUDA_MPS_LOG_DIRECTORY");
  return teardown(state);
}

// Waits for the daemon at dir to stop answering (a few seconds at most:
// the quit is asynchronous); false if it still answers then.
bool gone(const std::string &dir) {
  for (int i = 0; i < 500; ++i) {
    if (!chi::mps::control_answers(dir)) return true;
    sleep_ms(20);
  }
  return false;
}

void test_control_fails(void **) {
  fake_on_path("fail");
  chi::mps::Daemon d;
  assert_int_equal(d.join(), CHI_ERR_NO_DEVICE);
  assert_non_null(std::strstr(chi::last_error(), "-d exited with 3"));
  assert_false(d.joined());
  assert_null(getenv("CUDA_MPS_PIPE_DIRECTORY"));
}

void test_daemon_never_answers(void **) {
  fake_on_path("mute");
  chi::mps::Daemon d(200);
  assert_int_equal(d.join(), CHI_ERR_NO_DEVICE);
  assert_non_null(std::strstr(chi::last_error(), "did not answer"));
  assert_non_null(std::strstr(chi::last_error(), "200 ms"));
  assert_false(d.joined());
  assert_null(getenv("CUDA_MPS_PIPE_DIRECTORY"));
}

void test_start_share_and_quit(void **) {
  fake_on_path(nullptr);
  const std::string dir = g_base + "/chimaera-mps";
  chi::mps::Daemon a, b;
  assert_int_equal(a.join(), CHI_OK);
  assert_true(a.joined());
  assert_string_equal(a.directory().c_str(), dir.c_str());
  assert_string_equal(a.started_by().c_str(), "this process");
  assert_string_equal(getenv("CUDA_MPS_PIPE_DIRECTORY"), dir.c_str());
  assert_string_equal(getenv("CUDA_MPS_LOG_DIRECTORY"), (dir + "/log").c_str());
  assert_true(chi::mps::control_answers(dir));
  assert_int_equal(read_pid(dir + "/chimaera-mps.started"), int(getpid()));
  // A second runtime (another open of the users file: another holder) uses it.
  assert_int_equal(b.join(), CHI_OK);
  assert_string_equal(b.directory().c_str(), dir.c_str());
  assert_string_equal(b.started_by().c_str(), "this process");
  // The first out leaves it running for the second ...
  a.leave();
  assert_false(a.joined());
  assert_true(chi::mps::control_answers(dir));
  // ... and the last out tells it to quit.
  b.leave();
  assert_true(gone(dir));
  struct stat st;
  assert_int_equal(lstat((dir + "/chimaera-mps.started").c_str(), &st), -1);
}

void test_quit_that_hangs(void **) {
  fake_on_path("slow-quit");
  const std::string dir = g_base + "/chimaera-mps";
  {
    chi::mps::Daemon d;
    assert_int_equal(d.join(), CHI_OK);
    assert_true(chi::mps::control_answers(dir));
  }  // leave() does not wait for the quit's answer beyond a moment
  struct stat st;
  assert_int_equal(lstat((dir + "/chimaera-mps.started").c_str(), &st), -1);
  assert_true(gone(dir));  // the quit goes through later
}

void test_stale_marker(void **) {
  fake_on_path(nullptr);
  const std::string dir = g_base + "/chimaera-mps";
  assert_int_equal(mkdir(dir.c_str(), 0700), 0);
  // A marker of a daemon that is gone, older than the one that answers now
  // (started by its user, here by hand).
  FILE *f = fopen((dir + "/chimaera-mps.started").c_str(), "w");
  assert_non_null(f);
  fprintf(f, "12345\n");
  fclose(f);
  sleep_ms(20);
  const std::string cmd = "CUDA_MPS_PIPE_DIRECTORY='" + dir + "' '" + g_base +
                          "/bin/nvidia-cuda-mps-control' -d </dev/null >/dev/null 2>&1";
  assert_int_equal(system(cmd.c_str()), 0);
  for (int i = 0; i < 500 && !chi::mps::control_answers(dir); ++i) sleep_ms(20);
  assert_true(chi::mps::control_answers(dir));
  {
    chi::mps::Daemon d;
    assert_int_equal(d.join(), CHI_OK);
    assert_string_equal(d.started_by().c_str(), "its user");
  }  // not a chimaera process's daemon: left running
  assert_true(chi::mps::control_answers(dir));
  struct stat st;
  assert_int_equal(lstat((dir + "/chimaera-mps.started").c_str(), &st), -1);  // the stale marker went
}

void test_adopt_before_cuda(void **) {
  // This program never loads the CUDA driver: adopt exports the directory.
  assert_true(chi::mps::adopt("/run/example/chimaera-mps"));
  assert_string_equal(getenv("CUDA_MPS_PIPE_DIRECTORY"), "/run/example/chimaera-mps");
  assert_true(chi::mps::adopt("/run/example/chimaera-mps"));
  unsetenv("CUDA_MPS_PIPE_DIRECTORY");
}

}  // namespace

int main(int argc, char **argv) {
  const char *slash = std::strrchr(argv[0], '/');
  if (std::strcmp(slash ? slash + 1 : argv[0], "nvidia-cuda-mps-control") == 0) return fake_control(argc, argv);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_private_directory, setup, teardown),
      cmocka_unit_test_setup_teardown(test_refuses_a_shared_directory, setup, teardown),
      cmocka_unit_test_setup_teardown(test_no_control_program, setup, teardown),
      cmocka_unit_test_setup_teardown(test_reuses_the_users_daemon, setup, teardown),
      cmocka_unit_test_setup_teardown(test_control_fails, setup, teardown_fake),
      cmocka_unit_test_setup_teardown(test_daemon_never_answers, setup, teardown_fake),
      cmocka_unit_test_setup_teardown(test_start_share_and_quit, setup, teardown_fake),
      cmocka_unit_test_setup_teardown(test_quit_that_hangs, setup, teardown_fake),
      cmocka_unit_test_setup_teardown(test_stale_marker, setup, teardown_fake),
      cmocka_unit_test_setup_teardown(test_adopt_before_cuda, setup, teardown),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}

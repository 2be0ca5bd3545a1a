// The MPS daemon a runtime joins for server.mps (src/core/mps.h), without a
// GPU or the NVIDIA driver: the refusals (a pipe directory that is not
// private, no nvidia-cuda-mps-control), the reuse of a daemon that answers at
// $CUDA_MPS_PIPE_DIRECTORY (a listening socket where its control socket
// would be: all "answers" means) which is never stopped, a stale socket that
// does not answer, and a client's adopt in a process without the CUDA
// driver.  On a GPU host, test_gpu_client runs the real daemon.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
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

void test_adopt_before_cuda(void **) {
  // This program never loads the CUDA driver: adopt exports the directory.
  assert_true(chi::mps::adopt("/run/example/chimaera-mps"));
  assert_string_equal(getenv("CUDA_MPS_PIPE_DIRECTORY"), "/run/example/chimaera-mps");
  assert_true(chi::mps::adopt("/run/example/chimaera-mps"));
  unsetenv("CUDA_MPS_PIPE_DIRECTORY");
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_private_directory, setup, teardown),
      cmocka_unit_test_setup_teardown(test_refuses_a_shared_directory, setup, teardown),
      cmocka_unit_test_setup_teardown(test_no_control_program, setup, teardown),
      cmocka_unit_test_setup_teardown(test_reuses_the_users_daemon, setup, teardown),
      cmocka_unit_test_setup_teardown(test_adopt_before_cuda, setup, teardown),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}

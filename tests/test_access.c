/*
 * Access control: a process of another Unix user cannot reach a server.
 * Needs root (it makes a system user "chimaera-test" and becomes it in
 * children); exits 77 otherwise.
 *   - shm://: the runtime directory is 0700, so the other user can neither
 *     use it (chi_init: CHI_ERR_PERMISSION) nor connect to the socket inside.
 *   - ipc:// with a socket file opened up to everyone (a misconfiguration):
 *     the server still checks the peer's uid and refuses (CHI_ERR_PERMISSION).
 *   - the server's own user still gets in.
 */
#include "common.h"

#include <errno.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>

static char g_dir[256];
static uid_t g_uid;
static gid_t g_gid;

static char g_self[4096];

/* Runs what ("client" or "connect") with arg as the other user, in a child
 * that re-executes this program (so it starts with one thread); returns its
 * exit status. */
static int as_other_user(const char *what, const char *arg) {
  pid_t pid = fork();
  if (pid == 0) {
    if (setgid(g_gid) != 0 || setuid(g_uid) != 0) _exit(100);
    execl(g_self, g_self, "as-user", what, arg, (char *)NULL);
    _exit(101);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 200;
}

static int try_client(const char *address) {
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.mode = CHI_MODE_CLIENT;
  cfg.server_address = address;
  chi_runtime_t *rt = NULL;
  chi_status_t s = chi_init(&cfg, &rt);
  fprintf(stderr, "  as uid %u: chi_init(%s) = %s: %s\n", (unsigned)getuid(), address, chi_status_string(s),
          chi_last_error_message());
  return s == CHI_OK ? 0 : -s;
}

static int try_raw_connect(const char *path) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un a;
  memset(&a, 0, sizeof a);
  a.sun_family = AF_UNIX;
  snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
  int r = connect(fd, (struct sockaddr *)&a, sizeof a);
  int err = errno;
  close(fd);
  return r == 0 ? 0 : err;
}

static chi_runtime_t *serve(const char *address) {
  chi_runtime_t *rt = chi_test_init(1, NULL);
  chi_server_t *srv;
  assert_status(CHI_OK, chi_server_start(rt, address, &srv));
  return rt;
}

static void test_shm_other_user(void **state) {
  (void)state;
  char address[128], sock[512];
  snprintf(address, sizeof address, "shm://access-%d", (int)getpid());
  snprintf(sock, sizeof sock, "%s/access-%d.sock", g_dir, (int)getpid());
  chi_runtime_t *rt = serve(address);
  assert_int_equal(as_other_user("client", address), -CHI_ERR_PERMISSION);
  assert_int_equal(as_other_user("connect", sock), EACCES);
  /* The owner connects. */
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.mode = CHI_MODE_CLIENT;
  cfg.server_address = address;
  chi_runtime_t *c;
  assert_status(CHI_OK, chi_init(&cfg, &c));
  assert_status(CHI_OK, chi_finalize(c));
  assert_status(CHI_OK, chi_finalize(rt));
}

static void test_ipc_socket_opened_to_all(void **state) {
  (void)state;
  char open_dir[300], address[400];
  snprintf(open_dir, sizeof open_dir, "%s-open", g_dir);
  assert_int_equal(mkdir(open_dir, 0755) == 0 || errno == EEXIST, 1);
  chmod(open_dir, 0755);
  snprintf(address, sizeof address, "ipc://%s/x.ipc", open_dir);
  chi_runtime_t *rt = serve(address);
  struct stat st;
  assert_int_equal(stat(address + 6, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0600); /* as the server made it */
  chmod(address + 6, 0666);                  /* a misconfiguration */
  assert_int_equal(as_other_user("client", address), -CHI_ERR_PERMISSION);
  assert_status(CHI_OK, chi_finalize(rt));
  rmdir(open_dir);
}

int main(int argc, char **argv) {
  if (argc == 4 && !strcmp(argv[1], "as-user"))
    return !strcmp(argv[2], "client") ? try_client(argv[3]) : try_raw_connect(argv[3]);
  ssize_t n = readlink("/proc/self/exe", g_self, sizeof g_self - 1);
  if (n <= 0) return 1;
  g_self[n] = 0;
  if (geteuid() != 0) {
    printf("# test_access needs root (it becomes another user); skipped\n");
    return 77;
  }
  struct passwd *pw = getpwnam("chimaera-test");
  if (!pw) {
    if (system("useradd --system --no-create-home --shell /usr/sbin/nologin chimaera-test >/dev/null 2>&1") != 0 ||
        !(pw = getpwnam("chimaera-test"))) {
      printf("# cannot create the user chimaera-test; skipped\n");
      return 77;
    }
  }
  g_uid = pw->pw_uid;
  g_gid = pw->pw_gid;
  chi_test_clean_env();
  snprintf(g_dir, sizeof g_dir, "/tmp/chi-access-%d", (int)getpid());
  if (mkdir(g_dir, 0700) != 0) return 1;
  setenv("CHI_RUNTIME_DIR", g_dir, 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shm_other_user),
      cmocka_unit_test(test_ipc_socket_opened_to_all),
  };
  int rc = cmocka_run_group_tests_name("access", tests, NULL, NULL);
  rmdir(g_dir);
  return rc;
}

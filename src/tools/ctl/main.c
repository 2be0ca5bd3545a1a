/* chimaera-ctl: administer a running chimaera-server, and make CURVE keys.
 *   chimaera-ctl [--address ADDR] status [--json]
 *   chimaera-ctl [--address ADDR] ping
 *   chimaera-ctl [--address ADDR] stop
 *   chimaera-ctl keygen PREFIX      (PREFIX.key: secret, 0600; PREFIX.pub)
 * Without --address: $CHI_SERVER_ADDRESS, else this user's default server. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <unistd.h>
#include <zmq.h>

#include "chimaera.h"

/* Writes a CURVE key pair: PREFIX.key (the secret, mode 0600) and PREFIX.pub.
 * Both are created exclusively and never through a symlink (O_EXCL makes
 * open refuse a symlink too, and O_NOFOLLOW says so): in a shared folder,
 * another user's file or link at either name must not be written into.
 * An existing name is an error; a half-made pair is removed. */
static int keygen(const char *prefix) {
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec) != 0) {
    fprintf(stderr, "chimaera-ctl: zmq_curve_keypair: %s (libzmq built without CURVE?)\n", zmq_strerror(errno));
    return 1;
  }
  char key_path[4096], pub_path[4096];
  if (snprintf(key_path, sizeof key_path, "%s.key", prefix) >= (int)sizeof key_path ||
      snprintf(pub_path, sizeof pub_path, "%s.pub", prefix) >= (int)sizeof pub_path) {
    fprintf(stderr, "chimaera-ctl: keygen PREFIX is too long\n");
    return 1;
  }
  const int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  int fd = open(key_path, flags, 0600);
  if (fd < 0) {
    fprintf(stderr, "chimaera-ctl: cannot create %s: %s\n", key_path, strerror(errno));
    return 1;
  }
  int ok = dprintf(fd, "# chimaera CURVE secret key (public key in %s.pub)\n%s\n", prefix, sec) > 0;
  ok = close(fd) == 0 && ok;
  fd = ok ? open(pub_path, flags, 0644) : -1;
  if (fd < 0) {
    if (ok) fprintf(stderr, "chimaera-ctl: cannot create %s: %s (remove it, or choose another PREFIX)\n", pub_path,
                    strerror(errno));
    else fprintf(stderr, "chimaera-ctl: cannot write %s\n", key_path);
    unlink(key_path);
    return 1;
  }
  ok = dprintf(fd, "%s\n", pub) > 0;
  if (close(fd) != 0 || !ok) {
    fprintf(stderr, "chimaera-ctl: cannot write %s\n", pub_path);
    unlink(pub_path);
    unlink(key_path);
    return 1;
  }
  printf("%s\n", pub);
  return 0;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: chimaera-ctl [--address shm://NAME] COMMAND\n"
          "commands:\n"
          "  status [--json]  workers, slots, clients (pid, uid), GPUs, per-route counters\n"
          "  ping             round trip to the server (exit status 0 if it answers)\n"
          "  stop             ask the server to stop (as SIGTERM does)\n"
          "  keygen PREFIX    write a CURVE key pair PREFIX.key (secret, 0600) and\n"
          "                   PREFIX.pub; prints the public key\n");
}

int main(int argc, char **argv) {
  const char *address = getenv("CHI_SERVER_ADDRESS");
  const char *cmd = NULL;
  int json = 0;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--address") && i + 1 < argc) address = argv[++i];
    else if (!strcmp(argv[i], "--json")) json = 1;
    else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return usage(stdout), 0;
    else if (!cmd && argv[i][0] != '-') cmd = argv[i];
    else if (cmd && !strcmp(cmd, "keygen") && argv[i][0] != '-') continue;
    else return fprintf(stderr, "chimaera-ctl: unexpected argument '%s'\n", argv[i]), usage(stderr), 2;
  }
  if (!cmd) return usage(stderr), 2;
  if (!strcmp(cmd, "keygen")) {
    const char *prefix = NULL;
    for (int i = 1; i < argc; ++i)
      if (argv[i] != cmd && argv[i][0] != '-' && (i == 1 || strcmp(argv[i - 1], "--address"))) prefix = argv[i];
    if (!prefix) return fprintf(stderr, "chimaera-ctl: keygen needs a PREFIX\n"), 2;
    return keygen(prefix);
  }
  const char *request;
  if (!strcmp(cmd, "status")) request = json ? "status-json" : "status";
  else if (!strcmp(cmd, "ping")) request = "ping";
  else if (!strcmp(cmd, "stop")) request = "stop";
  else return fprintf(stderr, "chimaera-ctl: unknown command '%s'\n", cmd), usage(stderr), 2;
  static char reply[65536];
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  chi_status_t s = chi_server_query(address, request, reply, sizeof reply, NULL);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (s != CHI_OK) {
    fprintf(stderr, "chimaera-ctl: %s: %s\n", chi_status_string(s), chi_last_error_message());
    return 1;
  }
  if (!strcmp(cmd, "ping"))
    printf("pong from %s in %.1f us (connect + handshake + request)\n",
           address && *address ? address : "the default server",
           (double)(t1.tv_sec - t0.tv_sec) * 1e6 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e3);
  else if (!strcmp(cmd, "stop"))
    printf("stop requested\n");
  else
    fputs(reply, stdout);
  return 0;
}

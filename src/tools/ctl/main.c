/* chimaera-ctl: administer a running chimaera-server.
 *   chimaera-ctl [--address shm://NAME] status [--json]
 *   chimaera-ctl [--address shm://NAME] ping
 *   chimaera-ctl [--address shm://NAME] stop
 * Without --address: $CHI_SERVER_ADDRESS, else this user's default server. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chimaera.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: chimaera-ctl [--address shm://NAME] COMMAND\n"
          "commands:\n"
          "  status [--json]  workers, slots, clients (pid, uid), GPUs, per-route counters\n"
          "  ping             round trip to the server (exit status 0 if it answers)\n"
          "  stop             ask the server to stop (as SIGTERM does)\n");
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
    else return fprintf(stderr, "chimaera-ctl: unexpected argument '%s'\n", argv[i]), usage(stderr), 2;
  }
  if (!cmd) return usage(stderr), 2;
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

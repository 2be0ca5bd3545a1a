/* chimaera-server: an embedded runtime (workers, GPU orchestrators, modules)
 * served to the client processes of this user over shared memory.  Runs in
 * the foreground and logs to stderr; SIGTERM, SIGINT or `chimaera-ctl stop`
 * stop it: new tasks are refused, queued ones answered CHI_ERR_SHUTDOWN,
 * running ones get server.shutdown_timeout_ms to finish. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/resource.h>
#include <unistd.h>

#include "chimaera.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: chimaera-server [--config PATH] [--listen shm://NAME]... [--workers N]\n"
          "  --config PATH   settings file (default: $CHI_CONFIG, else built-in defaults)\n"
          "  --listen ADDR   address to serve (repeatable; default: server.listen from the\n"
          "                  config, else this user's default server, which clients with\n"
          "                  no address find)\n"
          "  --workers N     CPU worker threads (default: from the config, else one per CPU)\n"
          "  --version       print the library version\n");
}

/* Each shm:// task session holds 3 descriptors (socket, segment, doorbell):
 * the usual soft limit of 1024 would run out near 340 clients, below
 * server.max_clients.  The soft limit goes up to the hard one; the server
 * warns at start if that is still short (chi_server_start). */
static void raise_descriptor_limit(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max) return;
  rl.rlim_cur = rl.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &rl) != 0) perror("chimaera-server: setrlimit(RLIMIT_NOFILE)");
}

int main(int argc, char **argv) {
  raise_descriptor_limit();
  const char *config = NULL;
  const char *listen[16];
  int nlisten = 0, workers = 0;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--config") && i + 1 < argc) {
      config = argv[++i];
    } else if (!strcmp(argv[i], "--listen") && i + 1 < argc) {
      if (nlisten == 16) {
        fprintf(stderr, "chimaera-server: at most 16 --listen addresses\n");
        return 2;
      }
      listen[nlisten++] = argv[++i];
    } else if (!strcmp(argv[i], "--workers") && i + 1 < argc) {
      workers = atoi(argv[++i]);
      if (workers <= 0) {
        fprintf(stderr, "chimaera-server: --workers wants a positive number\n");
        return 2;
      }
    } else if (!strcmp(argv[i], "--version")) {
      printf("chimaera-server %s\n", chi_version_string());
      return 0;
    } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "chimaera-server: unknown argument '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  /* Signals are taken synchronously: block them before any thread starts. */
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
  signal(SIGPIPE, SIG_IGN);

  /* The server is the embedded runtime: a shell's client settings are not
   * for it (a config file that says `mode: client` is refused below). */
  unsetenv("CHI_MODE");
  unsetenv("CHI_SERVER_ADDRESS");
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.config_path = config;
  cfg.mode = CHI_MODE_EMBEDDED; /* the server is the embedded runtime */
  cfg.num_workers = workers;
  /* Several --listen addresses are served by one server (one status lists
   * them all): they become server.listen, as a YAML list of quoted strings. */
  static char listen_yaml[16 * 4200 + 32];
  if (nlisten > 1) {
    size_t n = (size_t)snprintf(listen_yaml, sizeof listen_yaml, "server.listen: [");
    for (int i = 0; i < nlisten; ++i) {
      if (strlen(listen[i]) > 4096) {
        fprintf(stderr, "chimaera-server: --listen address longer than 4096 bytes\n");
        return 2;
      }
      n += (size_t)snprintf(listen_yaml + n, sizeof listen_yaml - n, "%s\"", i ? ", " : "");
      for (const char *c = listen[i]; *c; ++c) {
        if ((unsigned char)*c < 0x20) {
          fprintf(stderr, "chimaera-server: --listen address with a control character\n");
          return 2;
        }
        if (*c == '"' || *c == '\\') listen_yaml[n++] = '\\';
        listen_yaml[n++] = *c;
      }
      listen_yaml[n++] = '"';
    }
    snprintf(listen_yaml + n, sizeof listen_yaml - n, "]");
    cfg.settings = listen_yaml;
  }
  chi_runtime_t *rt;
  chi_status_t s = chi_init(&cfg, &rt);
  if (s != CHI_OK) {
    fprintf(stderr, "chimaera-server: cannot start: %s (%s)\n", chi_last_error_message(),
            chi_status_string(s));
    return 1;
  }
  chi_server_t *servers[16];
  int nservers = 0;
  if (nlisten != 1) {
    /* server.listen (from the config, or the --listen addresses), else the
     * default server. */
    s = chi_server_start(rt, NULL, &servers[0]);
    if (s == CHI_OK) nservers = 1;
  } else {
    if ((s = chi_server_start(rt, listen[0], &servers[0])) == CHI_OK) nservers = 1;
  }
  if (s != CHI_OK) {
    fprintf(stderr, "chimaera-server: %s\n", chi_last_error_message());
    chi_finalize(rt);
    return 1;
  }
  fprintf(stderr, "chimaera-server %s: serving %d address(es), pid %d\n", chi_version_string(),
          nservers, (int)getpid());
  for (;;) {
    struct timespec tick = {0, 100 * 1000 * 1000};
    int sig = sigtimedwait(&stop_signals, NULL, &tick);
    if (sig > 0) {
      fprintf(stderr, "chimaera-server: signal %d, stopping\n", sig);
      break;
    }
    int asked = 0;
    for (int i = 0; i < nservers; ++i)
      if (chi_server_wait_stop_request(servers[i], 0) == CHI_OK) asked = 1;
    if (asked) {
      fprintf(stderr, "chimaera-server: stop requested, stopping\n");
      break;
    }
  }
  int rc = 0;
  for (int i = 0; i < nservers; ++i) {
    if (chi_server_stop(servers[i], UINT32_MAX) != CHI_OK) rc = 1;
  }
  if (chi_finalize(rt) != CHI_OK) {
    fprintf(stderr, "chimaera-server: %s\n", chi_last_error_message());
    rc = 1;
  }
  return rc;
}

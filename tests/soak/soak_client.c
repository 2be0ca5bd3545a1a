/* A soak client (scripts/soak.sh): submits "soak.record" tasks to a
 * chimaera-server without pause, a window of them in flight, until a
 * deadline; checks every output and logs every outcome.
 *
 *   soak_client --address ADDR --client N --log PATH --deadline-ms EPOCH_MS
 *               [--window W] [--seq-bits B] [--reconnect-s S] [--hang-s S] [--route gpu]
 *   soak_client --stats --address ADDR
 *
 * --route gpu submits to CHI_ROUTE_GPU_ANY (CPU->GPU through the server):
 * sequences in blocks of 256, in turn soak.record twice (the module's GPU
 * handler, which records through a GPU->CPU task: in the ledger), then the
 * built-ins chi.echo, chi.add and chi.checksum (output checked, never in the
 * ledger: logged "B").  --stats prints the server's chi_stats as one JSON
 * line (device_slots_in_use is not in chimaera-ctl's status) and exits.
 *
 * Task ids are N << 32 | sequence, sequences from 0, never reused: a task
 * whose outcome is unknown (CHI_ERR_DISCONNECTED) is not re-sent.  On
 * CHI_ERR_DISCONNECTED (or CHI_ERR_SHUTDOWN) the client takes the outcomes
 * of its other tasks in flight, calls chi_finalize and chi_init again every
 * 100 ms for at most --reconnect-s, then goes on with the next sequence.
 *
 * The log (appended with write(2), so a SIGKILL loses nothing written) has
 * one line per run of consecutive sequences with the same outcome:
 *   R STATUS FIRST LAST   chi_wait returned STATUS (SOAK_BAD_OUTPUT: CHI_OK
 *                         with a wrong output)
 *   S STATUS FIRST LAST   chi_submit refused the task with STATUS
 *   B STATUS FIRST LAST   as R, for built-in methods (not in the ledger)
 * and events: "# ..." (start), "E connect|disconnect|finalize|hang|...",
 * "X ..." (a normal exit, with counts).  A run is written when it ends or
 * after 20 ms, so a killed client loses at most 20 ms of outcomes.
 *
 * SIGUSR1 brings the deadline forward to now (a test that ends the client
 * when its checks are done rather than at a time it had to guess).
 *
 * Exit status: 0 at the deadline, 2 usage, 3 no reconnection within the
 * bound, 4 a wait that did not return within --hang-s, 5 log error. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "chimaera.h"
#include "soak_common.h"

#define MAX_WINDOW 64
#define RUN_FLUSH_MS 20

static int g_log = -1;
static const char *g_address;
static uint64_t g_client;

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void log_line(const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n >= sizeof buf) n = sizeof buf - 1;
  const char *p = buf;
  while (n > 0) {
    ssize_t w = write(g_log, p, (size_t)n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) _exit(5);
    p += w;
    n -= (int)w;
  }
}

/* A run of consecutive sequences with one outcome. */
typedef struct run {
  char kind; /* 'R' or 'S' */
  int active;
  int32_t status;
  uint32_t first, last;
  int64_t since_ms;
} run_t;

static run_t g_wait_run = {'R', 0, 0, 0, 0, 0}, g_submit_run = {'S', 0, 0, 0, 0, 0},
             g_builtin_run = {'B', 0, 0, 0, 0, 0};

static void run_flush(run_t *r) {
  if (!r->active) return;
  log_line("%c %d %" PRIu32 " %" PRIu32 "\n", r->kind, (int)r->status, r->first, r->last);
  r->active = 0;
}

static void run_add(run_t *r, int32_t status, uint32_t seq) {
  int64_t t = now_ms();
  if (r->active && r->status == status && seq == r->last + 1 && t - r->since_ms < RUN_FLUSH_MS) {
    r->last = seq;
    return;
  }
  run_flush(r);
  r->active = 1;
  r->status = status;
  r->first = r->last = seq;
  r->since_ms = t;
}

static void runs_tick(void) {
  int64_t t = now_ms();
  if (g_wait_run.active && t - g_wait_run.since_ms >= RUN_FLUSH_MS) run_flush(&g_wait_run);
  if (g_submit_run.active && t - g_submit_run.since_ms >= RUN_FLUSH_MS) run_flush(&g_submit_run);
  if (g_builtin_run.active && t - g_builtin_run.since_ms >= RUN_FLUSH_MS) run_flush(&g_builtin_run);
}

static void runs_flush_all(void) {
  run_flush(&g_wait_run);
  run_flush(&g_submit_run);
  run_flush(&g_builtin_run);
}

/* Counts for the exit line. */
static uint64_t g_submitted, g_ok, g_builtin_ok, g_wait_failed, g_submit_refused, g_bad_output, g_connects;
static int g_gpu; /* --route gpu */

/* What task `seq` is: soak.record (0) or a built-in method. */
static chi_method_t task_builtin(uint32_t seq) {
  static const chi_method_t kinds[5] = {0, 0, CHI_METHOD_ECHO, CHI_METHOD_ADD, CHI_METHOD_CHECKSUM};
  return g_gpu ? kinds[(seq >> 8) % 5] : 0;
}

/* Input of a task: the soak input, or for chi.add { id, mix(id) }. */
static size_t task_input(chi_method_t builtin, uint64_t id, uint8_t *buf) {
  if (builtin == CHI_METHOD_ADD) {
    uint64_t v[2] = {id, soak_mix(id)};
    memcpy(buf, v, sizeof v);
    return sizeof v;
  }
  return soak_make_input(id, buf);
}

/* Whether a built-in's output is right for task `id`. */
static int builtin_right(chi_method_t builtin, uint64_t id, const uint8_t *out, size_t size) {
  uint8_t in[8 + SOAK_MAX_PAD];
  size_t n = task_input(builtin, id, in);
  uint64_t want;
  if (builtin == CHI_METHOD_ECHO) return size == n && memcmp(out, in, n) == 0;
  want = builtin == CHI_METHOD_ADD ? id + soak_mix(id) : soak_fnv1a(in, n);
  return size == sizeof want && memcmp(out, &want, sizeof want) == 0;
}

static chi_runtime_t *g_rt;
static chi_method_t g_method;
static chi_route_t g_route = CHI_ROUTE_CPU;
static volatile sig_atomic_t g_stop; /* SIGUSR1: the deadline is now */

static void on_stop(int sig) {
  (void)sig;
  g_stop = 1;
}

static int past(int64_t deadline_ms) { return g_stop || now_ms() >= deadline_ms; }

/* Connects (or re-connects) within bound_ms, not past the deadline.
 * Returns 1 when connected, 0 at the deadline, -1 past the bound. */
static int connect_server(int64_t deadline_ms, int64_t bound_ms) {
  int64_t start = now_ms();
  for (unsigned attempt = 1;; ++attempt) {
    chi_config_t cfg;
    chi_config_init(&cfg);
    cfg.mode = CHI_MODE_CLIENT;
    cfg.server_address = g_address;
    chi_runtime_t *rt = NULL;
    chi_status_t s = chi_init(&cfg, &rt);
    if (s == CHI_OK) {
      s = chi_method_lookup(rt, SOAK_METHOD, &g_method);
      if (s != CHI_OK) {
        chi_finalize(rt);
        rt = NULL;
      }
    }
    int64_t t = now_ms();
    if (s == CHI_OK) {
      g_rt = rt;
      g_connects++;
      log_line("E connect %" PRId64 " attempts %u ms %" PRId64 "\n", t, attempt, t - start);
      return 1;
    }
    if (attempt == 1 || attempt % 50 == 0)
      log_line("E connect-failed %" PRId64 " status %d %s\n", t, (int)s, chi_last_error_message());
    if (past(deadline_ms)) return 0;
    if (t - start >= bound_ms) {
      log_line("E reconnect-bound %" PRId64 " attempts %u\n", t, attempt);
      return -1;
    }
    usleep(100 * 1000);
  }
}

static void disconnect_server(const char *why) {
  chi_status_t s = chi_finalize(g_rt);
  log_line("E finalize %" PRId64 " %s status %d\n", now_ms(), why, (int)s);
  g_rt = NULL;
}

typedef struct pending {
  chi_future_t future;
  uint32_t seq;
  uint64_t checksum; /* of the input */
} pending_t;

static pending_t g_ring[MAX_WINDOW];
static unsigned g_head, g_count;
static int64_t g_hang_ms;

/* Takes the outcome of the oldest task in flight.  Returns its status. */
static chi_status_t wait_oldest(void) {
  pending_t *p = &g_ring[g_head];
  uint64_t out[(8 + SOAK_MAX_PAD) / 8] = {0, 0};
  size_t size = 0;
  int64_t start = now_ms();
  chi_status_t s;
  for (;;) {
    s = chi_wait(g_rt, p->future, 1000 * 1000 * 1000, out, sizeof out, &size);
    if (s != CHI_ERR_TIMEOUT) break;
    if (now_ms() - start >= g_hang_ms) {
      runs_flush_all();
      log_line("E hang %" PRId64 " seq %" PRIu32 " waited_ms %" PRId64 "\n", now_ms(), p->seq,
               now_ms() - start);
      _exit(4);
    }
  }
  int32_t outcome = s;
  const chi_method_t builtin = task_builtin(p->seq);
  const uint64_t id = g_client << 32 | p->seq;
  if (s == CHI_ERR_TOO_LARGE) { /* output over the buffer: take it, count it wrong */
    chi_wait(g_rt, p->future, -1, NULL, 0, NULL);
    outcome = SOAK_BAD_OUTPUT;
  } else if (s == CHI_OK && builtin) {
    if (!builtin_right(builtin, id, (const uint8_t *)out, size)) outcome = SOAK_BAD_OUTPUT;
  } else if (s == CHI_OK) {
    if (size != 2 * sizeof(uint64_t) || out[0] != id || out[1] != p->checksum) outcome = SOAK_BAD_OUTPUT;
  }
  if (outcome == CHI_OK && builtin)
    g_builtin_ok++;
  else if (outcome == CHI_OK)
    g_ok++;
  else if (outcome == SOAK_BAD_OUTPUT)
    g_bad_output++;
  else
    g_wait_failed++;
  if (outcome == SOAK_BAD_OUTPUT)
    log_line("E bad-output %" PRId64 " seq %" PRIu32 " status %d size %zu id %" PRIx64 "\n",
             now_ms(), p->seq, (int)s, size, out[0]);
  run_add(builtin ? &g_builtin_run : &g_wait_run, outcome, p->seq);
  g_head = (g_head + 1) % MAX_WINDOW;
  g_count--;
  return s;
}

static void usage(void) {
  fprintf(stderr,
          "usage: soak_client --address ADDR --client N --log PATH --deadline-ms EPOCH_MS\n"
          "                   [--window W] [--seq-bits B] [--reconnect-s S] [--hang-s S] [--route gpu]\n"
          "       soak_client --stats --address ADDR\n");
  exit(2);
}

/* --stats: the server's chi_stats as one JSON line. */
static int print_stats(void) {
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.mode = CHI_MODE_CLIENT;
  cfg.server_address = g_address;
  chi_runtime_t *rt = NULL;
  chi_stats_t st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  chi_status_t s = chi_init(&cfg, &rt);
  if (s == CHI_OK) s = chi_stats(rt, &st);
  if (s != CHI_OK) {
    fprintf(stderr, "soak_client --stats %s: %s (%s)\n", g_address, chi_status_string(s),
            chi_last_error_message());
    chi_finalize(rt);
    return 1;
  }
  printf("{\"slots_in_use\":%" PRIu64 ",\"device_slots_in_use\":%" PRIu64
         ",\"device_slots_total\":%" PRIu64 ",\"gpus\":%d,\"tasks_cancelled\":%" PRIu64,
         st.slots_in_use, st.device_slots_in_use, st.device_slots_total, (int)st.gpus,
         st.tasks_cancelled);
  static const char *const names[3] = {"cpu", "gpu", "client"};
  for (int r = 0; r < 3; ++r)
    printf(",\"%s\":{\"submitted\":%" PRIu64 ",\"completed\":%" PRIu64 ",\"failed\":%" PRIu64
           ",\"in_flight\":%" PRIu64 "}",
           names[r], st.routes[r].submitted, st.routes[r].completed, st.routes[r].failed,
           st.routes[r].in_flight);
  printf("}\n");
  chi_finalize(rt);
  return 0;
}

int main(int argc, char **argv) {
  const char *log_path = NULL;
  int stats = 0;
  int64_t deadline_ms = 0, reconnect_ms = 30000;
  unsigned window = 8, seq_bits = SOAK_DEFAULT_SEQ_BITS;
  g_hang_ms = 20000;
  for (int i = 1; i < argc; ++i) {
    const char *a = argv[i];
    if (!strcmp(a, "--stats")) {
      stats = 1;
      continue;
    }
    if (i + 1 >= argc) usage();
    const char *v = argv[++i];
    if (!strcmp(a, "--address"))
      g_address = v;
    else if (!strcmp(a, "--client"))
      g_client = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--log"))
      log_path = v;
    else if (!strcmp(a, "--deadline-ms"))
      deadline_ms = strtoll(v, NULL, 10);
    else if (!strcmp(a, "--window"))
      window = (unsigned)strtoul(v, NULL, 10);
    else if (!strcmp(a, "--seq-bits"))
      seq_bits = (unsigned)strtoul(v, NULL, 10);
    else if (!strcmp(a, "--reconnect-s"))
      reconnect_ms = strtoll(v, NULL, 10) * 1000;
    else if (!strcmp(a, "--hang-s"))
      g_hang_ms = strtoll(v, NULL, 10) * 1000;
    else if (!strcmp(a, "--route") && !strcmp(v, "gpu"))
      g_gpu = 1, g_route = CHI_ROUTE_GPU_ANY;
    else if (!strcmp(a, "--route") && !strcmp(v, "cpu"))
      g_gpu = 0, g_route = CHI_ROUTE_CPU;
    else
      usage();
  }
  if (stats) {
    if (!g_address) usage();
    return print_stats();
  }
  if (!g_address || !log_path || deadline_ms <= 0 || window < 1 || window > MAX_WINDOW ||
      seq_bits < 6 || seq_bits > 32 || g_client > 0xffffffffull)
    usage();
  signal(SIGPIPE, SIG_IGN);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR1, &sa, NULL);
  g_log = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (g_log < 0) {
    perror(log_path);
    return 5;
  }
  const uint64_t seq_limit = 1ull << seq_bits;
  log_line("# client %" PRIu64 " address %s route %s pid %d window %u start %" PRId64
           " deadline %" PRId64 "\n",
           g_client, g_address, g_gpu ? "cpu->gpu" : "cpu", (int)getpid(), window, now_ms(),
           deadline_ms);

  uint8_t input[8 + SOAK_MAX_PAD];
  uint64_t next_seq = 0;
  int rc = 0;
  const char *why = "deadline";
  int c = connect_server(deadline_ms, reconnect_ms);
  if (c < 0) rc = 3, why = "no-connection";
  while (c > 0) {
    int lost = 0; /* the connection answered DISCONNECTED or SHUTDOWN */
    while (!lost && !past(deadline_ms) && next_seq < seq_limit) {
      while (!lost && g_count < window && next_seq < seq_limit) {
        uint32_t seq = (uint32_t)next_seq++;
        uint64_t id = g_client << 32 | seq;
        const chi_method_t builtin = task_builtin(seq);
        size_t n = task_input(builtin, id, input);
        chi_future_t f = 0;
        g_submitted++;
        chi_status_t s = chi_submit(g_rt, g_route, builtin ? builtin : g_method, input, n, &f);
        if (s == CHI_OK) {
          pending_t *p = &g_ring[(g_head + g_count) % MAX_WINDOW];
          p->future = f;
          p->seq = seq;
          p->checksum = soak_fnv1a(input, n);
          g_count++;
          continue;
        }
        g_submit_refused++;
        run_add(&g_submit_run, s, seq);
        if (s == CHI_ERR_DISCONNECTED || s == CHI_ERR_SHUTDOWN)
          lost = 1;
        else {
          if (g_count == 0) usleep(1000); /* nothing to take: do not spin */
          break; /* take an outcome first (CHI_ERR_AGAIN: slots full) */
        }
      }
      if (g_count > 0) {
        chi_status_t s = wait_oldest();
        if (s == CHI_ERR_DISCONNECTED || s == CHI_ERR_SHUTDOWN) lost = 1;
      }
      runs_tick();
    }
    /* The tasks still in flight answer (or say DISCONNECTED) within the
     * hang bound either way. */
    while (g_count > 0) wait_oldest();
    runs_flush_all();
    if (!lost) {
      if (next_seq >= seq_limit) log_line("E seq-limit %" PRId64 "\n", now_ms());
      disconnect_server("deadline");
      break;
    }
    log_line("E disconnect %" PRId64 " next %" PRIu64 "\n", now_ms(), next_seq);
    disconnect_server("disconnected");
    c = connect_server(deadline_ms, reconnect_ms);
    if (c < 0) rc = 3, why = "no-connection";
  }
  runs_flush_all();
  log_line("X %" PRId64 " %s submitted %" PRIu64 " ok %" PRIu64 " builtin_ok %" PRIu64
           " wait_failed %" PRIu64 " submit_refused %" PRIu64 " bad_output %" PRIu64
           " connects %" PRIu64 "\n",
           now_ms(), why, g_submitted, g_ok, g_builtin_ok, g_wait_failed, g_submit_refused,
           g_bad_output, g_connects);
  close(g_log);
  return rc;
}

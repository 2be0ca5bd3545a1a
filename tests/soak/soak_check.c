/* Checks a soak (scripts/soak.sh): reads the ledger the server module wrote
 * and every client's log, prints the tallies as "key: value" lines and exits
 * 1 when a check fails.
 *
 *   soak_check LEDGER LOG...
 *
 * A log holds one client or several, one after another (soak_gpu's rounds),
 * each from its "# client N" line; lines R (soak.record, waited), S
 * (submit refused), B (a built-in method, waited: not in the ledger) and L
 * (soak.record released unwaited: outcome unknown by design).
 *
 * Checks:
 *   lost            ids a client saw answered CHI_OK (with the right output)
 *                   whose bit is not in the ledger: must be 0;
 *   run_twice       handler runs of an id already recorded (the ledger's
 *                   duplicate counter): must be 0;
 *   bad_output      CHI_OK with a wrong output; bad_input / out_of_range in
 *                   the ledger (the server saw other bytes than were sent):
 *                   must be 0;
 *   refused_ran     ids chi_submit refused that ran anyway: must be 0;
 *   unanswered      of a client that exited by itself, ids it submitted (the
 *                   count on its X line) with no outcome in its log, or an
 *                   outcome for an id it never submitted: 0;
 *   answered_twice  ids with two outcomes in one log: 0;
 *   hangs           waits that did not return within the client's bound: 0;
 *   reused_clients  a client number in two logs (a script error): 0;
 *   builtin_recorded  built-in tasks (B) whose id is in the ledger: 0.
 * Reported only: outcomes by status, tasks that ran although their
 * submitter got an error (their outcome was unknown to it, as after a killed
 * server), runs no live log accounts for (their submitter was killed), runs
 * a GPU submitted, and the outcomes per group (the address's scheme and the
 * route named on the "#" line). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chimaera.h"
#include "soak_common.h"

#define MAX_STATUSES 64
#define SHOW_IDS 20

typedef struct tally {
  char kind; /* 'R' (chi_wait), 'S' (chi_submit refused), 'B' (built-in), 'L' (released) */
  int32_t status;
  uint64_t count;
  uint64_t ran; /* of these, ids whose bit is set */
} tally_t;

static tally_t g_tally[MAX_STATUSES];
static int g_ntally;

static tally_t *tally_of(char kind, int32_t status) {
  for (int i = 0; i < g_ntally; ++i)
    if (g_tally[i].kind == kind && g_tally[i].status == status) return &g_tally[i];
  if (g_ntally == MAX_STATUSES) {
    fprintf(stderr, "soak_check: too many distinct statuses\n");
    exit(2);
  }
  tally_t *t = &g_tally[g_ntally++];
  t->kind = kind;
  t->status = status;
  return t;
}

static const char *status_name(int32_t s) {
  switch (s) {
    case SOAK_ERR_BAD_INPUT: return "SOAK_ERR_BAD_INPUT";
    case SOAK_ERR_RANGE: return "SOAK_ERR_RANGE";
    case SOAK_ERR_INNER: return "SOAK_ERR_INNER (GPU handler: its GPU->CPU record did not answer)";
    case SOAK_ERR_MISMATCH: return "SOAK_ERR_MISMATCH (GPU handler: CPU and GPU checksums differ)";
    case SOAK_BAD_OUTPUT: return "SOAK_BAD_OUTPUT (CHI_OK, wrong output)";
    case SOAK_HANG: return "SOAK_HANG (a device wait past its bound)";
    default: return chi_status_string(s);
  }
}

/* Outcomes per group: "SCHEME ROUTE" of a client's "#" line. */
#define MAX_GROUPS 32
typedef struct group {
  char name[64];
  uint64_t clients, submitted, record_ok, builtin_ok, released, failed;
} group_t;
static group_t g_groups[MAX_GROUPS];
static int g_ngroups;

static group_t *group_of(const char *line) {
  char scheme[32] = "?", route[32] = "cpu", name[64];
  const char *a = strstr(line, " address ");
  if (a) {
    a += 9;
    size_t n = strcspn(a, ": \n");
    if (n >= sizeof scheme) n = sizeof scheme - 1;
    memcpy(scheme, a, n);
    scheme[n] = '\0';
  }
  const char *r = strstr(line, " route ");
  if (r) sscanf(r + 7, "%31s", route);
  snprintf(name, sizeof name, "%s %s", scheme, route);
  for (int i = 0; i < g_ngroups; ++i)
    if (!strcmp(g_groups[i].name, name)) return &g_groups[i];
  if (g_ngroups == MAX_GROUPS) return &g_groups[MAX_GROUPS - 1];
  group_t *g = &g_groups[g_ngroups++];
  snprintf(g->name, sizeof g->name, "%s", name);
  return g;
}

/* The sequences of one client that have an outcome. */
static uint64_t *g_seen;
static size_t g_seen_words;

static int seen_mark(uint64_t seq) { /* returns 1 if already marked */
  size_t w = (size_t)(seq >> 6);
  if (w >= g_seen_words) {
    size_t n = g_seen_words ? g_seen_words : 1024;
    while (n <= w) n *= 2;
    g_seen = realloc(g_seen, n * sizeof *g_seen);
    if (!g_seen) {
      fprintf(stderr, "soak_check: out of memory\n");
      exit(2);
    }
    memset(g_seen + g_seen_words, 0, (n - g_seen_words) * sizeof *g_seen);
    g_seen_words = n;
  }
  uint64_t m = 1ull << (seq & 63), old = g_seen[w];
  g_seen[w] |= m;
  return (old & m) != 0;
}

static int seen_test(uint64_t seq) {
  size_t w = (size_t)(seq >> 6);
  return w < g_seen_words && ((g_seen[w] >> (seq & 63)) & 1);
}

static const soak_ledger_header_t *g_hdr;
static const uint64_t *g_bitmap;

static int id_recorded(uint64_t client, uint64_t seq) {
  if (client >= g_hdr->clients || seq >= (1ull << g_hdr->seq_bits)) return 0;
  uint64_t bit = (client << g_hdr->seq_bits) | seq;
  return (g_bitmap[bit >> 6] >> (bit & 63)) & 1;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: soak_check LEDGER LOG...\n");
    return 2;
  }
  int fd = open(argv[1], O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0 || (size_t)st.st_size < SOAK_HEADER_BYTES) {
    fprintf(stderr, "soak_check: %s: no ledger\n", argv[1]);
    return 2;
  }
  void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    return 2;
  }
  g_hdr = (const soak_ledger_header_t *)p;
  if (g_hdr->magic != SOAK_MAGIC ||
      (uint64_t)st.st_size != soak_ledger_size(g_hdr->seq_bits, g_hdr->clients)) {
    fprintf(stderr, "soak_check: %s is not a soak ledger\n", argv[1]);
    return 2;
  }
  g_bitmap = (const uint64_t *)((const char *)p + soak_bitmap_offset(g_hdr->clients));
  uint8_t *client_seen = calloc(g_hdr->clients, 1);

  uint64_t logs = 0, exits = 0, hangs = 0, connects = 0, disconnects = 0, reconnect_bound = 0;
  uint64_t lost = 0, reused = 0, bad_client = 0, acked_ok = 0, accounted = 0;
  uint64_t shown_lost = 0, unanswered = 0, answered_twice = 0, builtin_recorded = 0;
  char line[1024];
  for (int a = 2; a < argc; ++a) {
    FILE *f = fopen(argv[a], "r");
    if (!f) {
      perror(argv[a]);
      return 2;
    }
    uint64_t client = UINT64_MAX, max_seq_end = 0;
    group_t *grp = NULL;
    while (fgets(line, sizeof line, f)) {
      char kind = line[0];
      if (kind == '#') {
        /* A new client: its own sequences. */
        if (g_seen) memset(g_seen, 0, g_seen_words * sizeof *g_seen);
        max_seq_end = 0;
        grp = group_of(line);
        grp->clients++;
        if (sscanf(line, "# client %" SCNu64, &client) != 1) client = UINT64_MAX;
        if (client >= g_hdr->clients && client != UINT64_MAX) {
          bad_client++; /* outside the ledger: its ids count as not recorded */
        } else if (client != UINT64_MAX && client_seen[client]++) {
          reused++;
        }
        logs++;
      } else if (kind == 'R' || kind == 'S' || kind == 'B' || kind == 'L') {
        int status;
        uint32_t first, last;
        if (client == UINT64_MAX || sscanf(line + 1, "%d %" SCNu32 " %" SCNu32, &status, &first,
                                           &last) != 3 || last < first) {
          fprintf(stderr, "soak_check: %s: bad line: %s", argv[a], line);
          return 2;
        }
        tally_t *t = tally_of(kind, status);
        if ((uint64_t)last + 1 > max_seq_end) max_seq_end = (uint64_t)last + 1;
        const uint64_t n = (uint64_t)last - first + 1;
        grp->submitted += n;
        if (kind == 'R' && status == CHI_OK)
          grp->record_ok += n;
        else if (kind == 'B' && status == CHI_OK)
          grp->builtin_ok += n;
        else if (kind == 'L' && status == CHI_OK)
          grp->released += n;
        else
          grp->failed += n;
        for (uint64_t s = first; s <= last; ++s) {
          if (seen_mark(s)) answered_twice++;
          int rec = id_recorded(client, s);
          t->count++;
          t->ran += rec;
          accounted += rec;
          if (kind == 'B' && rec) builtin_recorded++;
          if (kind == 'R' && status == CHI_OK) {
            acked_ok++;
            if (!rec) {
              if (shown_lost++ < SHOW_IDS)
                printf("lost id: client %" PRIu64 " seq %" PRIu64 " (%s)\n", client, s, argv[a]);
              lost++;
            }
          }
        }
      } else if (kind == 'E') {
        if (!strncmp(line, "E hang", 6)) hangs++;
        if (!strncmp(line, "E connect ", 10)) connects++;
        if (!strncmp(line, "E disconnect ", 13)) disconnects++;
        if (!strncmp(line, "E reconnect-bound", 17)) reconnect_bound++;
      } else if (kind == 'X') {
        exits++;
        const char *p = strstr(line, " submitted ");
        uint64_t submitted = p ? strtoull(p + 11, NULL, 10) : 0;
        if (!p) {
          fprintf(stderr, "soak_check: %s: bad line: %s", argv[a], line);
          return 2;
        }
        for (uint64_t s = 0; s < submitted; ++s) unanswered += !seen_test(s);
        if (max_seq_end > submitted) unanswered += max_seq_end - submitted;
      }
    }
    fclose(f);
  }

  uint64_t submitted = 0, accepted = 0, completed = 0, bad_output = 0, refused_ran = 0;
  uint64_t builtin_ok = 0, released = 0, released_ran = 0;
  for (int i = 0; i < g_ntally; ++i) {
    tally_t *t = &g_tally[i];
    submitted += t->count;
    if (t->kind != 'S') accepted += t->count;
    if ((t->kind == 'R' || t->kind == 'B') && t->status == CHI_OK) completed += t->count;
    if (t->kind == 'B' && t->status == CHI_OK) builtin_ok += t->count;
    if (t->kind == 'L' && t->status == CHI_OK) released += t->count, released_ran += t->ran;
    if ((t->kind == 'R' || t->kind == 'B') && t->status == SOAK_BAD_OUTPUT) bad_output += t->count;
    if (t->kind == 'S') refused_ran += t->ran;
  }
  printf("client logs: %" PRIu64 "\n", logs);
  printf("clients exited at the deadline: %" PRIu64 "\n", exits);
  printf("connects: %" PRIu64 "\n", connects);
  printf("disconnects seen: %" PRIu64 "\n", disconnects);
  printf("tasks submitted: %" PRIu64 "\n", submitted);
  printf("tasks accepted: %" PRIu64 "\n", accepted);
  printf("tasks completed: %" PRIu64 "\n", completed);
  printf("tasks completed, built-in methods (output checked, not in the ledger): %" PRIu64 "\n",
         builtin_ok);
  printf("tasks released unwaited: %" PRIu64 " (ran: %" PRIu64 ")\n", released, released_ran);
  printf("tasks failed: %" PRIu64 "\n", submitted - completed - released);
  for (int i = 0; i < g_ntally; ++i) {
    tally_t *t = &g_tally[i];
    if ((t->kind == 'R' || t->kind == 'B' || t->kind == 'L') && t->status == CHI_OK) continue;
    printf("failed %s %d %s: %" PRIu64 " (ran in the server: %" PRIu64 ")\n",
           t->kind == 'R' ? "wait" : t->kind == 'B' ? "wait (built-in)" : t->kind == 'L' ? "release" : "submit",
           (int)t->status, status_name(t->status), t->count, t->ran);
  }
  for (int i = 0; i < g_ngroups; ++i) {
    group_t *g = &g_groups[i];
    printf("group %s: clients %" PRIu64 ", submitted %" PRIu64 ", completed %" PRIu64
           " (soak.record %" PRIu64 ", built-in %" PRIu64 "), released %" PRIu64 ", failed %" PRIu64 "\n",
           g->name, g->clients, g->submitted, g->record_ok + g->builtin_ok, g->record_ok, g->builtin_ok,
           g->released, g->failed);
  }
  printf("ledger runs: %" PRIu64 "\n", g_hdr->records);
  printf("ledger runs no live submitter saw: %" PRIu64 "\n",
         g_hdr->records >= accounted ? g_hdr->records - accounted : 0);
  printf("ledger runs a GPU submitted: %" PRIu64 "\n", g_hdr->gpu_runs);
  printf("ledger server starts: %" PRIu64 "\n", g_hdr->opens);
  for (uint64_t i = 0; i < g_hdr->duplicates && i < SOAK_DUP_IDS && i < SHOW_IDS; ++i)
    printf("run twice id: client %" PRIu64 " seq %" PRIu64 "\n", g_hdr->dup_ids[i] >> 32,
           g_hdr->dup_ids[i] & 0xffffffffu);
  printf("lost: %" PRIu64 "\n", lost);
  printf("run twice: %" PRIu64 "\n", g_hdr->duplicates);
  printf("bad output: %" PRIu64 "\n", bad_output);
  printf("bad input: %" PRIu64 "\n", g_hdr->bad_input);
  printf("out of range: %" PRIu64 "\n", g_hdr->out_of_range);
  printf("refused yet ran: %" PRIu64 "\n", refused_ran);
  printf("unanswered: %" PRIu64 "\n", unanswered);
  printf("answered twice: %" PRIu64 "\n", answered_twice);
  printf("hangs: %" PRIu64 "\n", hangs);
  printf("reconnect bound hit: %" PRIu64 "\n", reconnect_bound);
  printf("reused client numbers: %" PRIu64 "\n", reused);
  printf("client numbers outside the ledger: %" PRIu64 "\n", bad_client);
  printf("built-in ids in the ledger: %" PRIu64 "\n", builtin_recorded);
  int fail = lost || g_hdr->duplicates || bad_output || g_hdr->bad_input || g_hdr->out_of_range ||
             refused_ran || unanswered || answered_twice || hangs || reconnect_bound || reused || bad_client || builtin_recorded || acked_ok == 0;
  printf("checks: %s\n", fail ? "FAILED" : "passed");
  free(client_seen);
  return fail ? 1 : 0;
}

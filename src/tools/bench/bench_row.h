/* One row of chimaera-bench's report: a route, a raw floor, or a peer
 * mechanism, with its latency percentiles, throughput and ratio to its
 * floor.  Plain C so that the GPU hook (bench_gpu.cu) fills the same rows. */
#ifndef CHI_BENCH_ROW_H
#define CHI_BENCH_ROW_H

#include <stddef.h>
#include <stdint.h>

#include "chimaera.h"

#ifdef __cplusplus
extern "C" {
#endif

enum chi_bench_kind {
  CHI_BENCH_FLOOR = 0,      /* raw signalling floor: flags only, no task     */
  CHI_BENCH_PEER = 1,       /* what users do today (pipe, kernel launch, ...) */
  CHI_BENCH_LATENCY = 2,    /* one task at a time, submit to result          */
  CHI_BENCH_THROUGHPUT = 3, /* pipelined submitters, tasks per second        */
  CHI_BENCH_TPUT_FLOOR = 4  /* raw pipelined floor: messages per second       */
};

struct chi_bench_row {
  char name[48];            /* "cpu->cpu", "floor.cpu_pingpong", ...           */
  int kind;                 /* enum chi_bench_kind                             */
  char route[24];           /* "CHI_ROUTE_CPU", ...; empty for floors and peers */
  char method[24];          /* "chi.echo", ...; empty for floors and peers     */
  char transport[16];       /* client->server: "shm", "ipc", "tcp", "tcp-curve"; else "" */
  uint32_t payload_bytes;   /* input and output size                           */
  uint32_t threads;         /* submitting threads (a ping-pong pair counts 1)  */
  uint32_t processes;       /* client processes submitting (0: this process)   */
  uint32_t window;          /* outstanding tasks per submitter                 */
  uint64_t count;           /* timed operations (after warm-up)                */
  double p50_ns;            /* latency percentiles; NaN: not measured          */
  double p99_ns;
  double mean_ns;
  double throughput;        /* operations per second; NaN: not measured        */
  char floor[48];           /* name of the floor row it is compared with, or "" */
  double floor_p50_ns;      /* filled by the report from that row              */
  double floor_throughput;  /* a throughput row's tput-floor: its throughput   */
  double ratio;             /* p50_ns / floor_p50_ns, or for a throughput row
                               linked to a tput-floor floor_throughput /
                               throughput (both: > 1 is slower than the floor);
                               filled by the report                            */
  double target_p50_ns;     /* docs/performance.md target; NaN: none                       */
  double target_throughput; /* docs/performance.md target, operations/s; NaN: none         */
  double cpu_ns_per_op;     /* this process's CPU time (every thread, the runtime's
                               workers included) over the timed span, per
                               operation; NaN: not measured                   */
  double csw_per_op;        /* its context switches (voluntary and not) over the
                               same span, per operation; NaN: not measured    */
  chi_status_t status;      /* CHI_OK, or why the row has no numbers           */
  char error[160];          /* detail when status != CHI_OK                    */
};

/* What the user asked for; the GPU hook follows the same settings. */
struct chi_bench_options {
  uint64_t iters;        /* timed round trips per latency row                */
  uint64_t warmup;       /* untimed round trips before them                  */
  uint64_t tput_tasks;   /* tasks per throughput row, all submitters         */
  uint32_t window;       /* outstanding futures per pipelined submitter      */
  uint32_t threads;      /* submitters of the multi-threaded throughput row  */
  uint32_t payload;      /* bytes of input and of output                     */
  int pin;               /* pin the benchmark's own threads to CPUs          */
  uint32_t gpu_lanes;    /* lanes per warp of the GPU throughput rows; 0:
                            the route's slots over the warps, at most 32     */
};

/* Clears *row, sets its name and kind, NaN for every number and CHI_OK. */
void chi_bench_row_init(struct chi_bench_row *row, const char *name, int kind);

/* Sorts samples and fills count, p50, p99, mean and (serial) throughput. */
void chi_bench_row_samples(struct chi_bench_row *row, uint64_t *samples, size_t n);

/* Marks the row failed with a status and a printf-style detail. */
void chi_bench_row_fail(struct chi_bench_row *row, chi_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* "floor", "peer", "latency", "throughput", "tput-floor". */
const char *chi_bench_kind_name(int kind);

#ifdef __cplusplus
}
#endif

#endif /* CHI_BENCH_ROW_H */

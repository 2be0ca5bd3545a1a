// CPU->CPU routes through the public API: one task at a time (latency),
// pipelined and batched submitters (throughput), chi.echo with opt.payload bytes each way.
#pragma once

#include "bench_row.h"

namespace chi_bench {

// docs/performance.md targets for CPU->CPU, embedded.
inline constexpr double kCpuTargetP50Ns = 1000.0;
inline constexpr double kCpuTargetThroughput = 20e6;

// opt.warmup untimed then opt.iters timed round trips (chi_submit + chi_wait),
// each output compared with its input.
void cpu_latency(chi_runtime_t *rt, chi_route_t route, const char *name, const char *route_name,
                 const chi_bench_options &opt, chi_bench_row *row);

// One round trip at a time after `quiet_ns` of no work (the workers asleep
// past spin_ns): a task's cost after an idle spell, a futex wake of a worker
// or (inline_wait) none.  samples: min(opt.iters / 250, 200), at least 20.
void cpu_latency_after_quiet(chi_runtime_t *rt, const char *name, int64_t quiet_ns,
                             const chi_bench_options &opt, chi_bench_row *row);

// `threads` submitters share opt.tput_tasks tasks; each keeps opt.window
// futures outstanding (waits for the oldest, then submits the next).  The row
// gets tasks/s over the timed part and, from one task in 16, the latency from
// submit to collected result under that load.
void cpu_throughput(chi_runtime_t *rt, chi_route_t route, const char *name,
                    const char *route_name, uint32_t threads, const chi_bench_options &opt,
                    chi_bench_row *row);

// As cpu_throughput, but each submitter sends opt.window tasks with one
// chi_submit_batch and collects them with one chi_wait_batch, with two such
// batches in flight (the next is submitted before the previous is waited
// for); a sampled task's latency runs from its batch's submit to the end of
// its wait.
void cpu_batched(chi_runtime_t *rt, chi_route_t route, const char *name, const char *route_name,
                 uint32_t threads, const chi_bench_options &opt, chi_bench_row *row);

}  // namespace chi_bench

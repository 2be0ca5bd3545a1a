// The round-trip trace (built with -DCHI_TRACE=ON; docs/performance.md,
// "The round-trip trace"): where a CPU->CPU task's time goes between
// chi_submit and chi_wait.  Each thread notes its stages' times in its own
// memory and keeps them, under the task's slot and generation, in a ring of
// its own that fills once (no line moves between cores for the trace, which
// would show up in the stages: lab/journal/cpu-engine.md).  chi_finalize
// joins them and prints each stage's time after the submit.
//
// Off (the default), every call here is an empty inline function: no code,
// no data.
#pragma once

#include <cstdint>

namespace chi::trace {

// In the order of a round trip, by side; a thread notes the stages of one
// side and keeps them together: the submitter [kSubmit, kQueued], the worker
// [kPopped, kPublished], the waiter [kWait, kReturned].
enum Stage : uint32_t {
  kSubmit,        // chi_submit entered
  kQueued,        // the task is in a run queue, a worker told
  kPopped,        // a worker took it from the queue
  kHandlerStart,  // its handler starts ...
  kHandlerEnd,    // ... and returns
  kPublished,     // its done word is written
  kWait,          // chi_wait entered (in a lone round trip: just after kQueued)
  kSeen,          // the waiter sees it done
  kReturned,      // chi_wait returns
  kStages
};

#if defined(CHI_TRACE)
// This thread's time of stage s, for its next keep().
void note(Stage s);
// Keeps this thread's noted stages first..last as the task (slot, gen)'s, and
// clears them.  A thread keeps at most a fixed number of stages; then none.
void keep(Stage first, Stage last, uint32_t slot, uint32_t gen);
// Joins what every thread kept so far by task and prints the stages of each
// whole round trip (one with kSubmit and kReturned), then each side's own
// steps, which need no whole round trip: a throughput run's cost per task,
// by side (the submit, a worker's pop gap and run, the wait and the take),
// to $CHI_TRACE_FILE (appended) or stderr.  Called when a runtime's workers
// have stopped; threads still stamping for another runtime then may be
// read mid-write.
void report();
#else
inline void note(Stage) {}
inline void keep(Stage, Stage, uint32_t, uint32_t) {}
inline void report() {}
#endif

}  // namespace chi::trace

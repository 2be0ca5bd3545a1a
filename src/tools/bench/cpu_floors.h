// The CPU floors and peers: what a round trip between two threads (or two
// processes) costs with no runtime at all (one cache line), and with the
// kernel in between (a pipe).
#pragma once

#include "bench_row.h"

namespace chi_bench {

// Name of the CPU<->CPU floor row; routes refer to it in row.floor.
inline constexpr const char *kCpuFloor = "floor.cpu_pingpong";

// Two threads flip one cache-line flag back and forth (spinning); each round
// trip is timed on the initiating thread.
void cpu_pingpong_floor(const chi_bench_options &opt, chi_bench_row *row);

// Name of the cross-process floor row; client->server rows refer to it.
inline constexpr const char *kXprocFloor = "floor.xproc_pingpong";

// The same cache-line ping-pong between two processes: the line lives in a
// MAP_SHARED anonymous mapping and the responder is a fork()ed child (call it
// before any thread exists).  The floor of every client->server row.
void xproc_pingpong_floor(const chi_bench_options &opt, chi_bench_row *row);

// Two threads bounce a payload through a pair of pipes (kernel wake-ups).
void pipe_pingpong_peer(const chi_bench_options &opt, chi_bench_row *row);

}  // namespace chi_bench

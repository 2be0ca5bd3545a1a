// Raw libzmq floors of the ZeroMQ transports (ipc://, tcp:// loopback, tcp://
// with CURVE): what the same sockets cost with no chimaera frame, session or
// task in between.  Each runs in two processes (a fork()ed responder and this
// one), each with its own zmq context; call them before any thread of this
// process exists (the runtime's, or a context's I/O threads: every floor
// terminates its context before it returns).
#pragma once

#include <string>

#include "bench_row.h"

namespace chi_bench {

// The transports of the client->server rows.  tcp-curve is tcp:// loopback
// with CURVE on.
enum Transport : int { kShm = 0, kIpc = 1, kTcp = 2, kTcpCurve = 3, kTransports = 4 };

// "shm", "ipc", "tcp", "tcp-curve"; parse_transport returns -1 for others.
const char *transport_name(int t);
int parse_transport(const std::string &name);

// Floor row names of a ZeroMQ transport (t != kShm): the REQ/REP ping-pong
// ("floor.zmq_reqrep_ipc", ...) and the DEALER/ROUTER pipelined echo
// ("floor.zmq_pipe_ipc", ...).
const char *zmq_reqrep_floor_name(int t);
const char *zmq_pipe_floor_name(int t);

// REQ (here) and REP (the child) bounce opt.payload bytes: opt.warmup untimed
// round trips, then opt.iters timed ones.  A CHI_BENCH_FLOOR row.
void zmq_reqrep_floor(const chi_bench_options &opt, int t, chi_bench_row *row);

// A DEALER (here) keeps opt.window messages of opt.payload bytes in flight
// to a ROUTER (the child) that echoes each one: opt.warmup untimed, then
// opt.tput_tasks timed; messages per second, and the latency of one in 16
// under that load.  A CHI_BENCH_TPUT_FLOOR row.
void zmq_pipe_floor(const chi_bench_options &opt, int t, chi_bench_row *row);

}  // namespace chi_bench

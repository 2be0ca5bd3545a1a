// Addresses, read once for every caller: the scheme that names the
// transport (shm://, ipc://, tcp://), and the tcp://HOST:PORT form for the
// config checks, the server's loopback rule and its listener.  libzmq reads
// more than this form (a `source;destination` pair binds the destination), so
// anything else is refused here rather than guessed at.
#pragma once

#include <string>

namespace chi::ipc {

enum class Transport { kUnknown, kShm, kIpc, kTcp };

// The transport address's scheme names: "shm://", "ipc://" or "tcp://",
// compared as written (case-sensitive); kUnknown for anything else, "" too.
Transport transport_of(const std::string &address);
// What follows the scheme (NAME, PATH or HOST:PORT); only for an address
// whose transport_of is not kUnknown.
const char *after_scheme(const std::string &address);
// True for the addresses the ZeroMQ listener and client serve (ipc://,
// tcp://); the shm transport takes the others, "" (the default) included.
bool served_by_zmq(const std::string &address);

// Splits the rest of tcp:// (after the scheme) into host and port.  The host
// is an IPv4 literal, a bracketed IPv6 literal, `*`, or a name of letters,
// digits, '.', '-' and '_' (an interface or host name); the port is 1..65535
// in decimal.  False (and *why) for anything else, a ';' included.
bool split_tcp_address(const std::string &host_port, std::string *host, int *port, std::string *why);
// True when host (as split above) can only mean this machine: 127.0.0.0/8,
// ::1, an IPv4-mapped 127.x, `localhost` or `lo`.
bool is_loopback_host(const std::string &host);
// The same for a whole endpoint as libzmq reports it (ZMQ_LAST_ENDPOINT).
bool is_loopback_endpoint(const std::string &endpoint);

}  // namespace chi::ipc

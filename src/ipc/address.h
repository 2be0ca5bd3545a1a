// The tcp://HOST:PORT form, parsed once for the config checks, the server's
// loopback rule and its listener.  libzmq reads more than this form (a
// `source;destination` pair binds the destination), so anything else is
// refused here rather than guessed at.
#pragma once

#include <string>

namespace chi::ipc {

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

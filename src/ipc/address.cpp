#include "ipc/address.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>

namespace chi::ipc {

namespace {

bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' ||
         c == '_';
}

// Every scheme is this long: after_scheme depends on it.
constexpr size_t kSchemeSize = 6;

}  // namespace

Transport transport_of(const std::string &address) {
  if (address.compare(0, kSchemeSize, "shm://") == 0) return Transport::kShm;
  if (address.compare(0, kSchemeSize, "ipc://") == 0) return Transport::kIpc;
  if (address.compare(0, kSchemeSize, "tcp://") == 0) return Transport::kTcp;
  return Transport::kUnknown;
}

const char *after_scheme(const std::string &address) { return address.c_str() + kSchemeSize; }

bool served_by_zmq(const std::string &address) {
  const Transport t = transport_of(address);
  return t == Transport::kIpc || t == Transport::kTcp;
}

bool split_tcp_address(const std::string &hp, std::string *host, int *port, std::string *why) {
  std::string h, p;
  if (hp.find(';') != std::string::npos) {
    // libzmq would bind the part after ';' and use the rest as a source.
    *why = "';' (libzmq's source;destination form) is not accepted: give one HOST:PORT";
    return false;
  }
  if (!hp.empty() && hp[0] == '[') {
    const size_t close = hp.find(']');
    if (close == std::string::npos || close + 1 >= hp.size() || hp[close + 1] != ':') {
      *why = "an IPv6 host is written [ADDRESS]:PORT";
      return false;
    }
    h = hp.substr(0, close + 1);
    p = hp.substr(close + 2);
    in6_addr a6;
    if (inet_pton(AF_INET6, h.substr(1, h.size() - 2).c_str(), &a6) != 1) {
      *why = "'" + h + "' is not an IPv6 address";
      return false;
    }
  } else {
    const size_t colon = hp.find(':');
    if (colon == std::string::npos || colon == 0 || hp.find(':', colon + 1) != std::string::npos) {
      *why = "expected HOST:PORT (an IPv6 host in brackets)";
      return false;
    }
    h = hp.substr(0, colon);
    p = hp.substr(colon + 1);
    if (h != "*")
      for (char c : h)
        if (!name_char(c)) {
          *why = std::string("the host may not contain '") + c + "' (one host and one port; no source address)";
          return false;
        }
  }
  if (p.empty() || p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos) {
    *why = "the port must be a number in 1..65535";
    return false;
  }
  const int n = std::atoi(p.c_str());
  if (n < 1 || n > 65535) {
    *why = "the port must be a number in 1..65535";
    return false;
  }
  *host = h;
  *port = n;
  return true;
}

bool is_loopback_host(const std::string &host) {
  if (host == "localhost" || host == "lo") return true;
  in_addr a4;
  if (inet_pton(AF_INET, host.c_str(), &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    in6_addr a6;
    if (inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), &a6) != 1) return false;
    if (IN6_IS_ADDR_LOOPBACK(&a6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127;
  }
  return false;
}

bool is_loopback_endpoint(const std::string &endpoint) {
  if (transport_of(endpoint) != Transport::kTcp) return false;
  const std::string hp = after_scheme(endpoint);
  const size_t colon = hp.rfind(':');
  if (colon == std::string::npos) return false;
  return is_loopback_host(hp.substr(0, colon));
}

}  // namespace chi::ipc

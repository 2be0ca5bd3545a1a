#include "ipc/channel.h"

#include <errno.h>
#include <poll.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "base/error.h"
#include "base/log.h"
#include "ipc/address.h"

namespace chi::ipc {

namespace {

chi_status_t ensure_private_dir(const std::string &dir) {
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    return set_error(CHI_ERR_PERMISSION, "cannot create runtime directory %s: %s", dir.c_str(),
                     strerror(errno));
  struct stat st;
  if (lstat(dir.c_str(), &st) != 0)
    return set_error(CHI_ERR_PERMISSION, "cannot stat runtime directory %s: %s", dir.c_str(),
                     strerror(errno));
  if (!S_ISDIR(st.st_mode))
    return set_error(CHI_ERR_PERMISSION, "runtime directory %s is not a directory", dir.c_str());
  if (st.st_uid != geteuid())
    return set_error(CHI_ERR_PERMISSION, "runtime directory %s belongs to uid %u, not to this user (%u)",
                     dir.c_str(), unsigned(st.st_uid), unsigned(geteuid()));
  if (st.st_mode & 077)
    return set_error(CHI_ERR_PERMISSION, "runtime directory %s has mode %03o: others may enter it (want 0700)",
                     dir.c_str(), unsigned(st.st_mode & 0777));
  return CHI_OK;
}

// $HOME/.cache/chimaera/HOST, each level made 0700 if missing; $HOME and
// .cache must belong to this user, the rest pass ensure_private_dir.
chi_status_t home_runtime_dir(std::string *dir) {
  const char *home = getenv("HOME");
  struct stat st;
  if (!home || home[0] != '/' || stat(home, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid())
    return set_error(CHI_ERR_PERMISSION, "HOME is not a folder of this user");
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) != 0 || !host[0]) std::strcpy(host, "localhost");
  for (char *c = host; *c; ++c)
    if (*c == '/') *c = '_';
  const std::string cache = std::string(home) + "/.cache";
  if (mkdir(cache.c_str(), 0700) != 0 && errno != EEXIST)
    return set_error(CHI_ERR_PERMISSION, "cannot create %s: %s", cache.c_str(), strerror(errno));
  if (lstat(cache.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid())
    return set_error(CHI_ERR_PERMISSION, "%s is not a folder of this user", cache.c_str());
  if (chi_status_t s = ensure_private_dir(cache + "/chimaera"); s != CHI_OK) return s;
  *dir = cache + "/chimaera/" + host;
  return ensure_private_dir(*dir);
}

bool valid_name(const std::string &n) {
  if (n.empty() || n.size() > 64) return false;
  for (char c : n)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
          c == '_' || c == '-'))
      return false;
  return n[0] != '.';
}

bool wait_fd(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  for (;;) {
    int r = poll(&p, 1, timeout_ms);
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return true;  // let the read report the error
  }
}

}  // namespace

chi_status_t runtime_dir(std::string *dir) {
  const char *env = getenv("CHI_RUNTIME_DIR");
  if (env && *env) {
    *dir = env;
    return ensure_private_dir(*dir);
  }
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  struct stat st;
  if (xdg && *xdg && stat(xdg, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == geteuid()) {
    *dir = std::string(xdg) + "/chimaera";
    return ensure_private_dir(*dir);
  }
  *dir = "/tmp/chimaera-" + std::to_string(unsigned(geteuid()));
  if (ensure_private_dir(*dir) == CHI_OK) return CHI_OK;
  // Any local user can make that name first (a folder or a symlink): then a
  // folder under this user's home, which no one else can make, per host (a
  // home shared by several machines holds one per machine).  Server and
  // clients meet there alike, since they see the same squatter.
  const std::string squatted = last_error();
  std::string fallback;
  if (home_runtime_dir(&fallback) == CHI_OK) {
    log(LogLevel::kWarn, "%s; using %s instead", squatted.c_str(), fallback.c_str());
    *dir = fallback;
    return CHI_OK;
  }
  const std::string home_why = last_error();
  return set_error(CHI_ERR_PERMISSION,
                   "%s, and no private folder under $HOME could stand in (%s): set CHI_RUNTIME_DIR (or "
                   "XDG_RUNTIME_DIR) to a folder of this user, mode 0700",
                   squatted.c_str(), home_why.c_str());
}

chi_status_t resolve_endpoint(const std::string &address, Endpoint *ep) {
  std::string name = "default";
  if (!address.empty()) {
    if (transport_of(address) != Transport::kShm)
      return set_error(CHI_ERR_INVALID, "address '%s' is not shm://NAME (ipc:// and tcp:// are not served yet)",
                       address.c_str());
    name = after_scheme(address);
  }
  if (!valid_name(name))
    return set_error(CHI_ERR_INVALID,
                     "server name '%s': 1..64 characters of letters, digits, '.', '_' and '-', not "
                     "starting with '.'",
                     name.c_str());
  std::string dir;
  if (chi_status_t s = runtime_dir(&dir); s != CHI_OK) return s;
  ep->name = name;
  ep->socket_path = dir + "/" + name + ".sock";
  ep->lock_path = dir + "/" + name + ".lock";
  if (ep->socket_path.size() >= sizeof(sockaddr_un{}.sun_path))
    return set_error(CHI_ERR_INVALID, "socket path %s is longer than a Unix socket allows",
                     ep->socket_path.c_str());
  return CHI_OK;
}

chi_status_t lock_endpoint(const std::string &lock_path, const std::string &shown, int *fd) {
  *fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (*fd < 0) return set_error(CHI_ERR_PERMISSION, "cannot open %s: %s", lock_path.c_str(), strerror(errno));
  if (flock(*fd, LOCK_EX | LOCK_NB) != 0) {
    char pid[32] = {0};
    ssize_t n = pread(*fd, pid, sizeof pid - 1, 0);
    pid[n > 0 ? n : 0] = 0;
    if (char *nl = std::strchr(pid, '\n')) *nl = 0;
    close(*fd);
    *fd = -1;
    return set_error(CHI_ERR_AGAIN, "another chimaera-server (pid %s) already serves %s", pid[0] ? pid : "?",
                     shown.c_str());
  }
  std::string me = std::to_string(getpid()) + "\n";
  if (ftruncate(*fd, 0) != 0 || pwrite(*fd, me.data(), me.size(), 0) < 0)
    log(LogLevel::kWarn, "cannot record the pid in %s: %s", lock_path.c_str(), strerror(errno));
  return CHI_OK;
}

std::string version_text(uint32_t v) {
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

bool send_msg(int sock, Kind kind, Op op, uint32_t flags, int32_t status, const void *payload, uint32_t length,
              const int *fds, int nfds) {
  MsgHeader h{kMsgMagic, uint16_t(kind), uint16_t(op), flags, length, status};
  iovec iov[2] = {{&h, sizeof h}, {const_cast<void *>(payload), length}};
  msghdr m{};
  m.msg_iov = iov;
  m.msg_iovlen = length ? 2 : 1;
  alignas(cmsghdr) char ctrl[CMSG_SPACE(2 * sizeof(int))];
  if (nfds > 0 && nfds <= 2) {
    std::memset(ctrl, 0, sizeof ctrl);
    m.msg_control = ctrl;
    m.msg_controllen = CMSG_SPACE(size_t(nfds) * sizeof(int));
    cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(size_t(nfds) * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds, size_t(nfds) * sizeof(int));
  }
  size_t total = sizeof h + length, sent = 0;
  while (sent < total) {
    ssize_t n = sendmsg(sock, &m, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN && wait_fd(sock, POLLOUT, 1000)) continue;
      return false;
    }
    sent += size_t(n);
    m.msg_control = nullptr;  // the descriptor went with the first bytes
    m.msg_controllen = 0;
    // Advance the iovecs past what was sent.
    size_t skip = size_t(n);
    while (m.msg_iovlen && skip >= m.msg_iov[0].iov_len) {
      skip -= m.msg_iov[0].iov_len;
      ++m.msg_iov;
      --m.msg_iovlen;
    }
    if (m.msg_iovlen) {
      m.msg_iov[0].iov_base = static_cast<char *>(m.msg_iov[0].iov_base) + skip;
      m.msg_iov[0].iov_len -= skip;
    }
  }
  return true;
}

namespace {

// One recvmsg without blocking: up to len bytes into buf; passed
// descriptors go into fds[0], fds[1] while those are -1 (fds may be NULL),
// the rest are closed.  Returns what recvmsg returned.
ssize_t recv_some(int sock, void *buf, size_t len, int *fds) {
  iovec iov{buf, len};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int) * 4)];
  m.msg_control = ctrl;
  m.msg_controllen = sizeof ctrl;
  const ssize_t n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  if (n <= 0) return n;
  for (cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t nfds = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < nfds; ++i) {
      int f;
      std::memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof f);
      // Keep descriptors where they are wanted; close anything else.
      if (fds && fds[0] < 0) fds[0] = f;
      else if (fds && fds[1] < 0) fds[1] = f;
      else close(f);
    }
  }
  return n;
}

// Reads exactly len bytes (collecting up to 2 passed descriptors) within the deadline.
chi_status_t read_full(int sock, void *buf, size_t len, int timeout_ms, int *fds) {
  size_t got = 0;
  while (got < len) {
    if (!wait_fd(sock, POLLIN, timeout_ms)) return CHI_ERR_TIMEOUT;
    const ssize_t n = recv_some(sock, static_cast<char *>(buf) + got, len - got, fds);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return CHI_ERR_DISCONNECTED;
    }
    if (n == 0) return CHI_ERR_DISCONNECTED;
    got += size_t(n);
  }
  return CHI_OK;
}

// A header read off the socket, before its payload is read or trusted.
bool header_ok(const MsgHeader &h, uint32_t capacity) {
  return h.magic == kMsgMagic && h.kind >= kFirstKind && h.kind <= kLastKind && h.length <= kMaxMsgPayload &&
         h.length <= capacity;
}

}  // namespace

chi_status_t recv_msg(int sock, MsgHeader *hdr, void *payload, uint32_t capacity, int timeout_ms,
                      int *fds) {
  if (fds) fds[0] = fds[1] = -1;
  if (chi_status_t s = read_full(sock, hdr, sizeof *hdr, timeout_ms, fds); s != CHI_OK) return s;
  if (!header_ok(*hdr, capacity)) return CHI_ERR_PROTOCOL;
  if (hdr->length)
    if (chi_status_t s = read_full(sock, payload, hdr->length, timeout_ms, fds); s != CHI_OK)
      return s == CHI_ERR_TIMEOUT ? CHI_ERR_PROTOCOL : s;  // a torn message
  return CHI_OK;
}

chi_status_t recv_msg_nowait(int sock, std::string *buf, MsgHeader *hdr, uint32_t capacity) {
  for (;;) {
    size_t need = sizeof *hdr;
    if (buf->size() >= sizeof *hdr) {
      std::memcpy(hdr, buf->data(), sizeof *hdr);
      if (!header_ok(*hdr, capacity)) return CHI_ERR_PROTOCOL;
      need += hdr->length;
    }
    if (buf->size() >= sizeof *hdr && buf->size() == need) return CHI_OK;
    const size_t have = buf->size();
    buf->resize(need);
    int none[2] = {0, 0};  // no descriptor is wanted here: all are closed
    const ssize_t n = recv_some(sock, buf->data() + have, need - have, none);
    buf->resize(have + (n > 0 ? size_t(n) : 0));
    if (n > 0) continue;
    if (n == 0) return CHI_ERR_DISCONNECTED;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK ? CHI_ERR_AGAIN : CHI_ERR_DISCONNECTED;
  }
}

}  // namespace chi::ipc

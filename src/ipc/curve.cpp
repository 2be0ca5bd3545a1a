#include "ipc/curve.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "base/error.h"

namespace chi::ipc {

namespace {

chi_status_t read_private_file(const std::string &path, mode_t forbidden, std::string *text) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return set_error(CHI_ERR_CONFIG, "cannot open key file %s: %s", path.c_str(), strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return set_error(CHI_ERR_CONFIG, "key file %s is not a regular file", path.c_str());
  }
  if (st.st_uid != geteuid()) {
    close(fd);
    return set_error(CHI_ERR_PERMISSION, "key file %s belongs to uid %u, not to this user", path.c_str(),
                     unsigned(st.st_uid));
  }
  if (st.st_mode & forbidden) {
    close(fd);
    return set_error(CHI_ERR_PERMISSION, "key file %s has mode %03o: too open (chmod 600 %s)", path.c_str(),
                     unsigned(st.st_mode & 0777), path.c_str());
  }
  char buf[65536];
  ssize_t n = read(fd, buf, sizeof buf);
  close(fd);
  if (n < 0) return set_error(CHI_ERR_CONFIG, "cannot read key file %s", path.c_str());
  text->assign(buf, size_t(n));
  return CHI_OK;
}

std::string trim(const std::string &s) {
  size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

}  // namespace

bool is_z85_key(const std::string &k) {
  static const char *alphabet =
      "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
  if (k.size() != 40) return false;
  for (char c : k)
    if (!std::strchr(alphabet, c) || c == 0) return false;
  return true;
}

chi_status_t read_secret_key(const std::string &path, std::string *z85) {
  std::string text;
  if (chi_status_t s = read_private_file(path, 077, &text); s != CHI_OK) return s;
  // chimaera-ctl keygen writes the key on the first line that is not a comment.
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    line = trim(line);
    if (line.empty() || line[0] == '#') continue;
    if (!is_z85_key(line)) break;
    *z85 = line;
    return CHI_OK;
  }
  return set_error(CHI_ERR_CONFIG, "key file %s holds no z85 key (40 characters)", path.c_str());
}

chi_status_t read_allowed_keys(const std::string &path, std::set<std::string> *keys) {
  std::string text;
  if (chi_status_t s = read_private_file(path, 022, &text); s != CHI_OK) return s;
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    line = trim(line);
    if (line.empty() || line[0] == '#') continue;
    uint8_t bin[32];
    if (!is_z85_key(line) || !zmq_z85_decode(bin, line.c_str()))
      return set_error(CHI_ERR_CONFIG, "%s:%d: not a z85 public key", path.c_str(), n);
    keys->insert(std::string(reinterpret_cast<char *>(bin), 32));
  }
  return CHI_OK;
}

}  // namespace chi::ipc

#include "ipc/handshake.h"

#include <cstring>

#include "base/error.h"
#include "ipc/channel.h"
#include "ipc/frame.h"

namespace chi::ipc {

namespace {
bool same_major_minor(uint32_t a, uint32_t b) { return a / 100 == b / 100; }
}  // namespace

std::string version_mismatch(const Hello &client, uint32_t server_protocol, uint32_t server_library) {
  return "version mismatch: client library " + version_text(client.library_version) + " protocol " +
         std::to_string(client.protocol) + ", server library " + version_text(server_library) + " protocol " +
         std::to_string(server_protocol);
}

chi_status_t check_hello(const void *payload, size_t size, Hello *out, std::string *why) {
  if (size < sizeof *out) {
    *why = "expected a chimaera hello message";
    return CHI_ERR_PROTOCOL;
  }
  std::memcpy(out, payload, sizeof *out);
  if (out->protocol != kProtocolVersion || !same_major_minor(out->library_version, CHI_VERSION_NUMBER)) {
    *why = version_mismatch(*out, kProtocolVersion, CHI_VERSION_NUMBER);
    return CHI_ERR_PROTOCOL;
  }
  if (out->kind != kSessionTasks && out->kind != kSessionControl) {
    *why = "unknown session kind " + std::to_string(out->kind);
    return CHI_ERR_PROTOCOL;
  }
  return CHI_OK;
}

std::string refusal_body(const std::string &why) {
  Welcome w{};
  w.protocol = kProtocolVersion;
  w.library_version = CHI_VERSION_NUMBER;
  std::string body(reinterpret_cast<const char *>(&w), sizeof w);
  return body + why;
}

chi_status_t check_welcome(int32_t status, const void *payload, size_t size, uint32_t kind,
                           const std::string &address, Welcome *w, std::string *mps_dir) {
  if (mps_dir) mps_dir->clear();
  if (size < sizeof *w)
    return set_error(CHI_ERR_PROTOCOL, "%s answered the handshake with something else", address.c_str());
  std::memcpy(w, payload, sizeof *w);
  if (status != CHI_OK) {
    const std::string why(static_cast<const char *>(payload) + sizeof *w, size - sizeof *w);
    return set_error(status < 0 ? status : CHI_ERR_PROTOCOL, "%s refused the connection: %.*s", address.c_str(),
                     int(why.size()), why.c_str());
  }
  if (w->protocol != kProtocolVersion || !same_major_minor(w->library_version, CHI_VERSION_NUMBER)) {
    const Hello mine{kProtocolVersion, CHI_VERSION_NUMBER, kind, 0};
    return set_error(CHI_ERR_PROTOCOL, "%s", version_mismatch(mine, w->protocol, w->library_version).c_str());
  }
  if (kind == kSessionControl) return CHI_OK;
  if (w->nslots < 2 || (w->nslots & (w->nslots - 1)) || w->nslots > (1u << 16) || w->max_payload > kMaxFramePayload ||
      w->gpus < 0 || w->gpus > kMaxWelcomeGpus)
    return set_error(CHI_ERR_PROTOCOL, "%s sent a malformed session shape (%u slots, %u-byte payloads, %d GPUs)",
                     address.c_str(), w->nslots, w->max_payload, int(w->gpus));
  if (w->flags & kWelcomeMpsDir) {
    const char *dir = static_cast<const char *>(payload) + sizeof *w;
    const size_t n = size - sizeof *w;
    bool ok = n >= 1 && n <= kMaxMpsDirBytes && dir[0] == '/';
    for (size_t i = 0; ok && i < n; ++i) ok = static_cast<unsigned char>(dir[i]) >= 0x20 && dir[i] != 0x7f;
    if (!ok) return set_error(CHI_ERR_PROTOCOL, "%s sent a malformed MPS pipe directory", address.c_str());
    if (mps_dir) mps_dir->assign(dir, n);
  }
  return CHI_OK;
}

}  // namespace chi::ipc

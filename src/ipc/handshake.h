// The handshake's checks, one place for both transports and both sides: the
// server checks a Hello, a client checks the Welcome (or refusal) it got.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "chimaera.h"
#include "ipc/wire.h"

namespace chi::ipc {

// More GPUs than any server drives: a client sizes tables by the count.
constexpr int32_t kMaxWelcomeGpus = 1024;

// "version mismatch: client library A protocol P, server library B protocol Q".
std::string version_mismatch(const Hello &client, uint32_t server_protocol, uint32_t server_library);

// Server: a hello's payload.  CHI_OK and *out, or CHI_ERR_PROTOCOL with *why
// (short, other protocol or major.minor library version, unknown session kind).
chi_status_t check_hello(const void *payload, size_t size, Hello *out, std::string *why);

// Client: the answer to its hello (status and payload of the Welcome message)
// for a session of `kind`.  CHI_OK and *w, or the refusal's status (its text
// in the message), or CHI_ERR_PROTOCOL (short, other version, a task
// session's shape out of range: slots not a power of two in 2..65536,
// payload over kMaxFramePayload, GPUs outside 0..kMaxWelcomeGpus, an MPS
// pipe directory (kWelcomeMpsDir) that is not an absolute path of 1 to
// kMaxMpsDirBytes printable bytes).  Sets the thread's message naming
// address.  *mps_dir (may be NULL): that directory, or empty.
chi_status_t check_welcome(int32_t status, const void *payload, size_t size, uint32_t kind,
                           const std::string &address, Welcome *w, std::string *mps_dir = nullptr);

// The refusal a server sends: a Welcome naming its versions, then the reason.
std::string refusal_body(const std::string &why);

}  // namespace chi::ipc

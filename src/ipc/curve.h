// CURVE key files for tcp:// (ZeroMQ's CurveZMQ): z85 text, 40 characters a
// key.  A secret key file must belong to this user and be closed to others
// (no group or other permission bits); an allow-list of client public keys
// must not be writable by others.
#pragma once

#include <set>
#include <string>

#include "chimaera.h"

namespace chi::ipc {

// Reads a z85 secret key from path; CHI_ERR_PERMISSION (loose mode, other
// owner) or CHI_ERR_CONFIG (unreadable, not a key), with the thread's message.
chi_status_t read_secret_key(const std::string &path, std::string *z85);
// Reads public keys, one z85 key per line ('#' comments and blank lines
// skipped), as 32-byte binary strings.
chi_status_t read_allowed_keys(const std::string &path, std::set<std::string> *keys);
// True for 40 z85 characters.
bool is_z85_key(const std::string &k);

}  // namespace chi::ipc

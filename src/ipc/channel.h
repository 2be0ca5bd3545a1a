// The session socket: where it lives (a per-user directory, mode 0700), and
// framed messages with an optional file descriptor, each with a timeout.
#pragma once

#include <cstdint>
#include <string>

#include "chimaera.h"
#include "ipc/wire.h"

namespace chi::ipc {

// Where a shm:// server's files live: $CHI_RUNTIME_DIR, else
// $XDG_RUNTIME_DIR/chimaera, else /tmp/chimaera-UID.  Created 0700 when
// missing; refused (CHI_ERR_PERMISSION) unless owned by this user and closed
// to others.  Sets the thread's error message on failure.
chi_status_t runtime_dir(std::string *dir);

// Splits "shm://NAME" (empty or NULL address: the default server) into the
// socket and lock paths of the runtime directory.
struct Endpoint {
  std::string name;
  std::string socket_path;
  std::string lock_path;
};
chi_status_t resolve_endpoint(const std::string &address, Endpoint *ep);

// Takes the lock file that decides which server serves `shown` (an flock
// the kernel drops when its holder dies, so a dead server's files never
// block a new one) and records this pid in it.  *fd: the held lock.
// CHI_ERR_AGAIN (naming the holder's pid) when a live server has it.
chi_status_t lock_endpoint(const std::string &lock_path, const std::string &shown, int *fd);

// "MAJOR.MINOR.PATCH" of a CHI_VERSION_NUMBER-style number (messages).
std::string version_text(uint32_t version);

// Sends one message whole, with nfds (<= 2) descriptors; false if the peer is
// gone (or stays full for a second).  op and flags: a kControl's request.
bool send_msg(int sock, Kind kind, Op op, uint32_t flags, int32_t status, const void *payload,
              uint32_t length, const int *fds = nullptr, int nfds = 0);

// Receives one message within timeout_ms (< 0: no bound).  Checks the magic,
// the kind and the length (<= capacity).  fds (when given) receive up to 2 passed
// descriptors, -1 where none came; extra descriptors are closed.
// Returns CHI_OK, CHI_ERR_TIMEOUT, CHI_ERR_DISCONNECTED (EOF or error) or
// CHI_ERR_PROTOCOL (bad header or oversized payload).
chi_status_t recv_msg(int sock, MsgHeader *hdr, void *payload, uint32_t capacity, int timeout_ms,
                      int *fds = nullptr);

// The server's reader: never waits.  Appends what has arrived of one message
// to *buf (never bytes of the next one; descriptors passed along are closed).
// CHI_OK: *buf holds one whole message, *hdr its header, the payload after
// it; CHI_ERR_AGAIN: more must come (call again when the socket is
// readable); CHI_ERR_DISCONNECTED (EOF, error) or CHI_ERR_PROTOCOL (bad
// magic or kind, payload over capacity).  A peer that sends one byte at a
// time then costs the server one buffer, not a wait.
chi_status_t recv_msg_nowait(int sock, std::string *buf, MsgHeader *hdr, uint32_t capacity);

}  // namespace chi::ipc

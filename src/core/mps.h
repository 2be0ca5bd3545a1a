// NVIDIA's Multi-Process Service as the runtime sees it (docs/server.md,
// "GPUs shared by processes (MPS)"): whether a control daemon answers, the
// daemon a server starts for its user when asked (server.mps), and what a
// client does with the pipe directory its server names.  POSIX only: no CUDA
// call here, so that it can run before the process's first one.
#pragma once

#include <string>

#include "chimaera.h"

namespace chi::mps {

// The pipe directory the CUDA driver of this process would use:
// $CUDA_MPS_PIPE_DIRECTORY, else /tmp/nvidia-mps.
std::string pipe_directory();

// Whether an MPS control daemon answers on `dir` (a connect to dir/control,
// nothing sent; a stale socket of a dead daemon refuses it).
bool control_answers(const std::string &dir);

// The private pipe directory of this user's chimaera daemon, the one
// scripts/mps.sh uses too: $XDG_RUNTIME_DIR/chimaera-mps, else
// /tmp/chimaera-mps-UID.
std::string private_directory();

// server.mps: the daemon a runtime makes sure of before its first CUDA call,
// and leaves at shutdown.
class Daemon {
 public:
  // start_wait_ms: how long join() waits for a daemon it started to answer.
  explicit Daemon(int start_wait_ms = kDefaultStartWaitMs) : start_wait_ms_(start_wait_ms) {}
  static constexpr int kDefaultStartWaitMs = 10000;
  ~Daemon() { leave(); }
  Daemon(const Daemon &) = delete;
  Daemon &operator=(const Daemon &) = delete;

  // Uses the daemon that serves $CUDA_MPS_PIPE_DIRECTORY if one answers
  // there, else the one in private_directory() (created 0700, refused with
  // CHI_ERR_PERMISSION if it exists with another owner or wider mode),
  // starting it (nvidia-cuda-mps-control -d) if none answers; then exports
  // CUDA_MPS_PIPE_DIRECTORY (and CUDA_MPS_LOG_DIRECTORY if it started it) so
  // that this process's CUDA contexts are its clients.  While joined, the
  // process holds a shared lock on the directory's chimaera-mps.users.
  // CHI_ERR_NO_DEVICE: no nvidia-cuda-mps-control, its -d failed, or its
  // daemon did not answer within start_wait_ms (the message says which);
  // the environment is then left as it was.
  chi_status_t join();
  // Leaves the daemon: the last chimaera process to leave a daemon that a
  // chimaera process started tells it to quit (it goes once its clients'
  // contexts are gone, this process's included, at exit).  A daemon the user
  // started (scripts/mps.sh, or by hand) is never stopped.
  void leave();

  bool joined() const { return joined_; }
  const std::string &directory() const { return dir_; }
  // Who started the daemon: "this process", "chimaera process PID" or "its
  // user" (not a chimaera process).
  std::string started_by() const;

 private:
  int start_wait_ms_;
  std::string dir_;
  bool joined_ = false;
  int users_fd_ = -1;  // shared lock while joined
  int starter_pid_ = 0;  // a chimaera process's pid from the marker file, or 0
};

// A client's part (chi_init in client mode, when the server names the pipe
// directory of its daemon): if this process has not initialized CUDA yet,
// exports CUDA_MPS_PIPE_DIRECTORY=dir so that its first context joins the
// server's MPS, and returns true.  Otherwise (CUDA initialized outside that
// daemon) logs once per process a warning with the fix and returns false.
bool adopt(const std::string &dir);

}  // namespace chi::mps

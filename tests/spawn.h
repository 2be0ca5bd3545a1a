// chi_test_spawn: runs a program in a child process for the test programs
// that start servers and clients (test_server, test_gpu_client,
// test_gpu_beside_server).
//
// Everything the child needs (argv, the log's descriptor) is made before
// fork(): the parent has threads (runtime workers, ZeroMQ's I/O threads),
// and a child that allocates between fork and exec may wait forever for a
// lock that one of them held at the fork.  Seen in CI: ASan's allocator
// lock, in test_server's test_churn (1 run in 20 under load).  The child
// only calls dup2, close, execv and _exit.
#ifndef CHI_TESTS_SPAWN_H
#define CHI_TESTS_SPAWN_H

#include <fcntl.h>
#include <sys/types.h>
#include <unistd.h>

#include <string>
#include <vector>

// args[0] is the program's path.  log: stdout and stderr go to that file
// (appended to with append, else truncated); NULL: inherited.  stdout_fd >= 0:
// stdout goes there instead (stderr still to the log); the caller closes it.
// Returns the child's pid, or -1 (nothing started).
static inline pid_t chi_test_spawn(const std::vector<std::string> &args, const char *log = nullptr,
                                   bool append = false, int stdout_fd = -1) {
  std::vector<char *> argv;
  argv.reserve(args.size() + 1);
  for (const std::string &a : args) argv.push_back(const_cast<char *>(a.c_str()));
  argv.push_back(nullptr);
  int log_fd = -1;
  if (log) {
    log_fd = open(log, O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0600);
    if (log_fd < 0) return -1;
  }
  const pid_t pid = fork();
  if (pid == 0) {
    if (log_fd >= 0 && (dup2(log_fd, STDOUT_FILENO) < 0 || dup2(log_fd, STDERR_FILENO) < 0)) _exit(126);
    if (stdout_fd >= 0 && dup2(stdout_fd, STDOUT_FILENO) < 0) _exit(126);
    execv(argv[0], argv.data());
    _exit(127);
  }
  if (log_fd >= 0) close(log_fd);
  return pid;
}

#endif  // CHI_TESTS_SPAWN_H

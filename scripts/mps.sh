#!/usr/bin/env bash
# Starts, stops or checks this user's CUDA MPS control daemon in a private
# pipe directory (docs/server.md, "GPUs shared by processes").  Start it
# before chimaera-server and before any client or other CUDA program, with
# the same CUDA_MPS_PIPE_DIRECTORY in all of them.
#
#   eval "$(scripts/mps.sh start)"   # starts it, exports the two variables
#   scripts/mps.sh status            # running or not
#   scripts/mps.sh stop              # asks it to quit (clients first)
#
# DIR (second argument, else $CHI_MPS_DIR, else $XDG_RUNTIME_DIR/chimaera-mps
# or /tmp/chimaera-mps-UID) holds the pipes (pipe/) and the logs (log/),
# mode 0700.  Exit status: 0 done, 1 failed, 77 no nvidia-cuda-mps-control.
set -u
cmd=${1:-status}
base=${2:-${CHI_MPS_DIR:-${XDG_RUNTIME_DIR:+$XDG_RUNTIME_DIR/chimaera-mps}}}
base=${base:-/tmp/chimaera-mps-$(id -u)}
export CUDA_MPS_PIPE_DIRECTORY=$base/pipe CUDA_MPS_LOG_DIRECTORY=$base/log
command -v nvidia-cuda-mps-control >/dev/null 2>&1 || { echo "mps.sh: no nvidia-cuda-mps-control" >&2; exit 77; }
running() { [ -S "$CUDA_MPS_PIPE_DIRECTORY/control" ] && echo get_server_list | nvidia-cuda-mps-control >/dev/null 2>&1; }
case $cmd in
  start)
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY" && chmod 0700 "$base" "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY" || exit 1
    if ! running; then
      nvidia-cuda-mps-control -d || { echo "mps.sh: the daemon did not start (see $CUDA_MPS_LOG_DIRECTORY/control.log)" >&2; exit 1; }
      for _ in $(seq 50); do running && break; sleep 0.1; done
      running || { echo "mps.sh: the daemon does not answer" >&2; exit 1; }
    fi
    echo "export CUDA_MPS_PIPE_DIRECTORY=$CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY=$CUDA_MPS_LOG_DIRECTORY" ;;
  stop)
    running || exit 0
    echo quit | nvidia-cuda-mps-control
    for _ in $(seq 100); do running || exit 0; sleep 0.1; done
    echo "mps.sh: the daemon is still running (clients left?)" >&2; exit 1 ;;
  status)
    if running; then echo "MPS running, pipe directory $CUDA_MPS_PIPE_DIRECTORY"; else echo "MPS not running ($CUDA_MPS_PIPE_DIRECTORY)"; exit 1; fi ;;
  *) echo "usage: $0 start|stop|status [DIR]" >&2; exit 2 ;;
esac

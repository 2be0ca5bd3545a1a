#!/bin/sh
# Runs a test program in client mode against its own chimaera-server.
#
#   run_with_server.sh SERVER CTL PROGRAM [ARGS...]
#
# Starts SERVER (chimaera-server) on a unique shm:// name in a private
# CHI_RUNTIME_DIR, waits until `CTL --address ADDR ping` answers, runs
# PROGRAM with CHI_MODE=client and CHI_SERVER_ADDRESS=ADDR, stops the server
# with SIGTERM and exits with the program's status (77, a skip, included).
# The server drives no GPU (the programs run here make their runtimes with
# gpus = 0) unless $CHI_TEST_SERVER_GPUS says how many (-1: all); it loads
# the modules of $CHI_TEST_SERVER_MODULES (colon-separated, as CHI_MODULES);
# $CHI_TEST_SERVER_ARGS (split on blanks) is added to its command line.  A server that crashed or failed to stop cleanly fails the run, and
# its log is printed whenever the run fails.
set -u

if [ $# -lt 3 ]; then
  echo "usage: $0 SERVER CTL PROGRAM [ARGS...]" >&2
  exit 2
fi
server=$1
ctl=$2
shift 2

dir=$(mktemp -d "${TMPDIR:-/tmp}/chi-server-XXXXXX") || exit 1
chmod 700 "$dir"
name="test-$$"
address="shm://$name"
log="$dir/server.log"
server_pid=

cleanup() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill -KILL "$server_pid" 2>/dev/null
    wait "$server_pid" 2>/dev/null
  fi
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The server is an embedded runtime: it gets none of the client settings.
# shellcheck disable=SC2086
env -u CHI_MODE -u CHI_SERVER_ADDRESS CHI_RUNTIME_DIR="$dir" \
  CHI_GPU_DEVICES="${CHI_TEST_SERVER_GPUS:-0}" CHI_MODULES="${CHI_TEST_SERVER_MODULES:-}" \
  "$server" --listen "$address" ${CHI_TEST_SERVER_ARGS:-} >"$log" 2>&1 &
server_pid=$!

# Wait for the first answer (no bound on how long start-up may take: ctest's
# timeout is the bound), giving up when the server exits.
until CHI_RUNTIME_DIR="$dir" "$ctl" --address "$address" ping >/dev/null 2>&1; do
  if ! kill -0 "$server_pid" 2>/dev/null; then
    wait "$server_pid"
    echo "run_with_server: chimaera-server exited with status $? before answering:" >&2
    cat "$log" >&2
    server_pid=
    exit 1
  fi
  sleep 0.05
done

CHI_MODE=client CHI_SERVER_ADDRESS="$address" CHI_RUNTIME_DIR="$dir" "$@"
status=$?

server_status=0
if kill -0 "$server_pid" 2>/dev/null; then
  kill -TERM "$server_pid"
  wait "$server_pid"
  server_status=$?
else
  wait "$server_pid"
  server_status=$?
  echo "run_with_server: chimaera-server died during the run (status $server_status)" >&2
  [ "$server_status" -eq 0 ] && server_status=1
fi
server_pid=

if [ "$server_status" -ne 0 ]; then
  echo "run_with_server: chimaera-server ended with status $server_status" >&2
  [ "$status" -eq 0 ] || [ "$status" -eq 77 ] && status=1
fi
if [ "$status" -ne 0 ] && [ "$status" -ne 77 ]; then
  echo "run_with_server: server log:" >&2
  cat "$log" >&2
fi
exit "$status"

#!/usr/bin/env bash
# gpu-client-check.sh BUILD_DIR: client kernels that submit (docs/server.md,
# "Client kernels") on the GPU machine, after scripts/gpu-run.sh built
# BUILD_DIR.  Each step bounded; logs in $OUT:
#   1. test_gpu_client (the ctest case: every route from client kernels over
#      shm and ipc, the refusals, client and server SIGKILLed, 8 clients);
#   2. sharing: 8 client processes whose kernels submit on every route at
#      once, all results checked, without MPS and under MPS (scripts/mps.sh,
#      private pipe directory, started before the server and quit after);
#   3. latency: a client kernel's GPU->CPU and GPU->GPU round trips (p50/p99)
#      beside the same kernel in an embedded runtime, without and with MPS;
#   4. chimaera-bench (its floors and embedded GPU rows, same session).
#
#   device: run(command="GPU_RUN_STEPS=build bash scripts/gpu-run.sh &&
#                        bash scripts/gpu-client-check.sh build-gpu", carry=[".devdeps"])
#
# Environment: CHECK_BOUND (seconds per step, default 150; the device tool allows 600 s per command), CHI_TEST_LAT_N
# (timed round trips per row, default 20000).
set -u -o pipefail
BUILD=${1:?usage: $0 BUILD_DIR}
BUILD=$(cd "$BUILD" && pwd)
OUT=${OUT:-/tmp/chi-gpu-client-out}
mkdir -p "$OUT"
BOUND=${CHECK_BOUND:-150}
HERE=$(cd "$(dirname "$0")/.." && pwd)
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export CHI_LOG_LEVEL=${CHI_LOG_LEVEL:-info}
export TMPDIR=$OUT/tmp
mkdir -p "$TMPDIR"
T=$BUILD/tests/test_gpu_client
SERVER=$BUILD/src/tools/chimaera-server
[ -x "$SERVER" ] || SERVER=$(find "$BUILD" -name chimaera-server -type f -perm -u+x | head -1)
SUMMARY=$OUT/client-summary.txt
: >"$SUMMARY"

step() {  # NAME COMMAND...: bounded, output in $OUT/NAME.log, rc in the summary
  local name=$1; shift
  local s0 rc
  s0=$(date +%s)
  timeout -k 5 "$BOUND" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  echo "$name: rc=$rc ($(( $(date +%s) - s0 )) s)" | tee -a "$SUMMARY"
  grep -E '^(# |client |embedded )' "$OUT/$name.log" | sed 's/^/    /' | tee -a "$SUMMARY"
  return $rc
}

with_server() {  # MODE: embedded lat alone, then a server on shm://chi-cc-MODE for share and client lat
  local mode=$1 addr="shm://chi-cc-$1-$$" pid i
  # Embedded first, with no server on the GPU (its orchestrator would share the GPU).
  step "lat-embedded-$mode" "$T" lat
  "$SERVER" --listen "$addr" >"$OUT/server-$mode.log" 2>&1 &
  pid=$!
  for i in $(seq 100); do "$BUILD/src/tools/chimaera-ctl" --address "$addr" ping >/dev/null 2>&1 && break; sleep 0.1; done
  "$BUILD/src/tools/chimaera-ctl" --address "$addr" status >"$OUT/status-$mode.txt" 2>&1
  step "share8-$mode" "$T" share 8 "$addr"
  step "lat-client-$mode" "$T" lat "$addr"
  kill -TERM "$pid"; wait "$pid"
  echo "server-$mode: exit $?" | tee -a "$SUMMARY"
}

nvidia-smi -L >"$OUT/gpus.txt" 2>&1
step test_gpu_client "$T"
with_server no-mps
if MPSENV=$(bash "$HERE/scripts/mps.sh" start "$OUT/mps" 2>"$OUT/mps-start.log"); then
  eval "$MPSENV"
  with_server mps
  bash "$HERE/scripts/mps.sh" stop "$OUT/mps" >>"$OUT/mps-start.log" 2>&1
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
else
  echo "mps: not measured ($(cat "$OUT/mps-start.log"))" | tee -a "$SUMMARY"
fi
# The floors (CPU<->GPU flag, GPU->CPU->GPU and block<->block ping-pong) and
# the embedded route rows of the same session, for the table beside the
# client rows above.
step bench "$BUILD/src/tools/chimaera-bench" --iters 20000
grep -iE 'pingpong|ping-pong|gpu0|cpu->gpu' "$OUT/bench.log" | head -20 | sed 's/^/    /' | tee -a "$SUMMARY"
echo "summary: $SUMMARY"

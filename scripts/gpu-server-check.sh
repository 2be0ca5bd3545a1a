#!/usr/bin/env bash
# gpu-server-check.sh BUILD_DIR: the GPU cases of the server tests on the GPU
# machine, one program at a time, each bounded; a program still running after
# its bound gets its threads' stacks (and those of its chimaera-server
# children) dumped with gdb before it is killed.  Logs in $OUT.
#
#   device: run(command="GPU_RUN_STEPS=build bash scripts/gpu-run.sh &&
#                        bash scripts/gpu-server-check.sh build-gpu", carry=[".devdeps"])
#
# Environment: CHECK_BOUND (seconds per program, default 60), CHECK_CASES
# (default: test_module_server --gpu, test_server's GPU route over each transport).
set -u -o pipefail
BUILD=${1:?usage: $0 BUILD_DIR}
OUT=${OUT:-/tmp/chi-gpu-server-out}
mkdir -p "$OUT"
BOUND=${CHECK_BOUND:-60}
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export CHI_LOG_LEVEL=${CHI_LOG_LEVEL:-info}
# The tests' private runtime directories (and server logs) land under $OUT.
export TMPDIR=$OUT/tmp
mkdir -p "$TMPDIR"

dump_stacks() {  # PID LOG: the stacks of PID and of its children
  local pid=$1 log=$2 p
  local dbg d
  dbg=$(command -v gdb || command -v /usr/local/cuda/bin/cuda-gdb)
  # The servers the test started: their state, from chimaera-ctl.
  for d in "$OUT"/tmp/chi-*; do
    [ -d "$d" ] || continue
    echo "==== chimaera-ctl status in $d" >>"$log"
    CHI_RUNTIME_DIR=$d timeout 5 "$BUILD/src/tools/chimaera-ctl" status >>"$log" 2>&1
    [ -f "$d/server.log" ] && { echo "==== $d/server.log"; tail -40 "$d/server.log"; } >>"$log"
  done
  [ -n "$dbg" ] || { echo "(no gdb for stacks)" >>"$log"; return; }
  for p in $pid $(pgrep -P "$pid"); do
    echo "==== stacks of $p ($(tr '\0' ' ' </proc/$p/cmdline 2>/dev/null))" >>"$log"
    timeout 30 "$dbg" -p "$p" -batch -ex "thread apply all bt 12" >>"$log" 2>&1
  done
}

run_case() {  # NAME ENV... -- PROGRAM ARGS...
  local name=$1; shift
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  local log=$OUT/$name.log s0 pid rc
  s0=$(date +%s)
  env "${envs[@]}" "$@" >"$log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null && [ $(( $(date +%s) - s0 )) -lt "$BOUND" ]; do sleep 0.5; done
  if kill -0 "$pid" 2>/dev/null; then
    dump_stacks "$pid" "$log"
    pkill -KILL -P "$pid" 2>/dev/null
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    echo "$name: STILL RUNNING after $BOUND s (stacks in $name.log)"
  else
    wait "$pid"; rc=$?
    echo "$name: rc=$rc ($(( $(date +%s) - s0 )) s)"
  fi
  grep -E "PASSED|FAILED|SKIPPED|OK \]|NOTE|error|Error" "$log" | head -20 | sed 's/^/    /'
}

T=$BUILD/tests
run_case module_server_gpu -- "$T/test_module_server" --gpu
for tr in shm ipc tcp; do
  run_case "server_gpu_route_$tr" CHI_TEST_TRANSPORT=$tr CHI_TEST_FILTER='*gpu*' -- "$T/test_server"
done

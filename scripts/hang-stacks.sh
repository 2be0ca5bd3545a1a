#!/usr/bin/env bash
# Runs one cmocka test of a test program again and again, PARALLEL at a time,
# and when a run outlives SECONDS, writes the stacks of it and of its child
# processes (gdb, every thread) before killing them: for a rare hang that a
# ctest timeout only reports as "Timeout".  Environment variables (such as
# CHI_TEST_TRANSPORT) pass through to the program.
#
#   scripts/hang-stacks.sh PROGRAM FILTER [RUNS] [PARALLEL] [SECONDS] [OUTDIR]
#   e.g. CHI_TEST_TRANSPORT=ipc scripts/hang-stacks.sh build-address/tests/test_server test_churn 40 2 90
#
# Prints one line per run; the stacks of a hung run go to OUTDIR/hang-N.txt,
# its output to OUTDIR/run-N.log (OUTDIR default /tmp/chi-hang-stacks).
# Exit status: 0 when no run hung or failed, 1 otherwise.
set -u
prog=${1:?program}
filter=${2:?cmocka test filter}
runs=${3:-20}
par=${4:-2}
limit=${5:-90}
out=${6:-/tmp/chi-hang-stacks}
mkdir -p "$out"
command -v gdb >/dev/null || echo "hang-stacks: no gdb here: a hang is reported without stacks" >&2
one() { # N
  local n=$1 pid t p
  CHI_TEST_FILTER="$filter" "$prog" >"$out/run-$n.log" 2>&1 &
  pid=$!
  for ((t = 1; t <= limit; ++t)); do
    sleep 1
    if ! kill -0 "$pid" 2>/dev/null; then
      wait "$pid"
      local rc=$?
      echo "run $n: rc=$rc after ${t}s"
      return "$rc"
    fi
  done
  {
    for p in "$pid" $(pgrep -P "$pid"); do
      echo "== pid $p: $( (tr '\0' ' ' <"/proc/$p/cmdline") 2>/dev/null)"
      gdb -p "$p" -batch -ex "thread apply all bt 12" 2>/dev/null | grep -E "^#|^Thread"
    done
  } >"$out/hang-$n.txt"
  pkill -9 -P "$pid" 2>/dev/null
  kill -9 "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  echo "run $n: HUNG past ${limit}s, stacks in $out/hang-$n.txt"
  return 1
}
bad=0
for ((i = 1; i <= runs; i += par)); do
  pids=()
  for ((k = i; k < i + par && k <= runs; ++k)); do one "$k" & pids+=($!); done
  for p in "${pids[@]}"; do wait "$p" || bad=1; done
done
exit "$bad"

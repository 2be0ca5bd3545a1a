#!/usr/bin/env bash
# gpu-bench.sh BUILD_DIR: runs chimaera-demo, chimaera-bench (table, then
# --json) and the CUDA examples of a CUDA build, on the GPU machine, after
# scripts/gpu-run.sh has built BUILD_DIR:
#
#   device: run(command="bash scripts/gpu-run.sh && bash scripts/gpu-bench.sh build-gpu",
#               carry=[".devdeps"])
#
# Writes two files to $OUT (the device returns at most 8 and gpu-run.sh
# writes its own): gpu-bench.log, all output for people, and bench-gpu.json,
# chimaera-bench --json.  Ends with a short table, also appended to
# $OUT/summary.txt when gpu-run.sh left one, so that it comes back even if
# the file count is over the limit.  Every step has its own time bound; the
# whole script stays under ~3 minutes.
#
# Environment: OUT (default BUILD_DIR/gpu-bench-out), GPU_BENCH_ITERS (timed
# round trips per bench row, default 100000), GPU_BENCH_TASKS (demo tasks per
# route, default 20000).
# Exit status: 0 when every step passed (or was skipped: no GPU), else 1.
set -u -o pipefail

if [ $# -ne 1 ] || [ ! -d "$1" ]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
BUILD=$(cd "$1" && pwd)
OUT=${OUT:-$BUILD/gpu-bench-out}
mkdir -p "$OUT"
LOG=$OUT/gpu-bench.log
JSON=$OUT/bench-gpu.json
ITERS=${GPU_BENCH_ITERS:-100000}
TASKS=${GPU_BENCH_TASKS:-20000}
: >"$LOG"

# Libraries gpu-run.sh unpacked (libyaml and friends), and the CUDA runtime.
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}

TOOLS=$BUILD/src/tools
EXAMPLES=$BUILD/examples/cuda
t_start=$(date +%s)
declare -a rows=()
failed=0

# step NAME SECONDS [--stdout FILE] CMD...: runs CMD under a time bound, its
# output appended to the log (stdout to FILE instead when given), and records
# one line of the final table.
step() {
  local name=$1 limit=$2 file=""
  shift 2
  if [ "$1" = "--stdout" ]; then
    file=$2
    shift 2
  fi
  if [ ! -x "$1" ]; then
    rows+=("$(printf '%-22s %-8s %5s  %s' "$name" MISSING - "$1")")
    failed=1
    return
  fi
  {
    echo
    echo "==== $name: $* (limit ${limit}s)"
  } >>"$LOG"
  local s0 rc result
  s0=$(date +%s)
  if [ -n "$file" ]; then
    timeout -k 10 "$limit" "$@" >"$file" 2>>"$LOG"
  else
    timeout -k 10 "$limit" "$@" >>"$LOG" 2>&1
  fi
  rc=$?
  case $rc in
    0) result=ok ;;
    77) result=skipped ;;
    124 | 137) result=TIMEOUT; failed=1 ;;
    *) result="FAIL rc=$rc"; failed=1 ;;
  esac
  echo "==== $name: $result ($(( $(date +%s) - s0 )) s)" >>"$LOG"
  rows+=("$(printf '%-22s %-8s %4ss' "$name" "$result" "$(( $(date +%s) - s0 ))")")
}

{
  echo "== gpu-bench on $(hostname), $(date -u +%FT%TZ), build $BUILD"
  nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1
} >>"$LOG"

step demo 60 "$TOOLS/chimaera-demo" --tasks "$TASKS"
step bench-table 90 "$TOOLS/chimaera-bench" --iters "$ITERS"
step bench-json 90 --stdout "$JSON" "$TOOLS/chimaera-bench" --iters "$ITERS" --json
step example-host-writer 60 "$EXAMPLES/chi_example_host_writer"
step example-offload 60 "$EXAMPLES/chi_example_offload_stream"

# Every row of the JSON run, for the table at the end.
digest() {
  command -v python3 >/dev/null 2>&1 || { echo "(python3 not found: no digest of $JSON)"; return; }
  python3 - "$JSON" <<'PY'
import json, sys
try:
    doc = json.load(open(sys.argv[1]))
except Exception as e:
    print("(no usable JSON: %s)" % e)
    sys.exit(0)
def us(v):
    return "%9.3f" % (v / 1000.0) if isinstance(v, (int, float)) else "%9s" % "-"
print("%-28s %9s %9s %9s %8s  %s" % ("bench row", "p50 us", "p99 us", "Mops/s", "vs floor", "status"))
for r in doc.get("rows", []):
    n = r["name"]
    tp = r.get("throughput_per_s")
    ratio = r.get("ratio")
    status = "ok" if r.get("status") == 0 else "FAILED: " + r.get("error", "")
    if r.get("kind") == "throughput" and isinstance(tp, (int, float)) and r.get("target_throughput_per_s"):
        status += " (target %.0f M/s)" % (r["target_throughput_per_s"] / 1e6)
    elif isinstance(r.get("target_p50_ns"), (int, float)):
        status += " (target p50 %.1f us)" % (r["target_p50_ns"] / 1000.0)
    print("%-28s %s %s %9s %8s  %s" % (n[:28], us(r.get("p50_ns")), us(r.get("p99_ns")),
          "%.3f" % (tp / 1e6) if isinstance(tp, (int, float)) else "-",
          "%.2fx" % ratio if isinstance(ratio, (int, float)) else "-", status))
print("machine: %s, %s GPU(s), ok=%s" % (doc.get("machine", {}).get("hostname", "?"),
      doc.get("machine", {}).get("gpus", "?"), doc.get("ok")))
PY
}

summary=$(mktemp)
{
  echo
  echo "==== gpu-bench summary ($(( $(date +%s) - t_start )) s)"
  printf '%s\n' "${rows[@]}"
  echo
  digest
  echo "logs: $LOG, $JSON"
} >"$summary"
tee -a "$LOG" <"$summary"
[ -f "$OUT/summary.txt" ] && cat "$summary" >>"$OUT/summary.txt"
rm -f "$summary"
exit $failed

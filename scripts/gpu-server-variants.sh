#!/usr/bin/env bash
# The measurements issue 22 still needs on the 16-core GPU host, in one
# device command (about 8 minutes): the server bench with the default
# configuration (ZeroMQ against raw REQ/REP with the client's I/O thread kept
# awake; the 256-client sweep), then the sweep and idle parts again with the
# server's pollers kept from sleeping (server.spin_ns 1 ms, then
# server.yield_ns 1 ms), to see whether doorbell wake-ups bound the
# 256-client row; then the idle embedded runtime at the default and at
# gpu.idle_lease_us 20 ms.  Results go to $OUT (server-bench-*.txt/.json,
# idle/summary.txt) and summary.txt, tarred by the caller if needed.
#
#   device: run(command="GPU_RUN_STEPS=build bash scripts/gpu-run.sh &&
#                        bash scripts/gpu-server-variants.sh", carry=[".devdeps"])
#
# Environment: BUILD (default build-gpu), SERVER_BENCH_ITERS (default 50000),
# SERVER_BENCH_MS (default 500), VARIANTS (the ';'-separated settings of the
# sweep-only runs, each a list of VAR=VALUE), VARIANTS_PARTS (default
# "default variants idle": which of the three parts run).
set -u -o pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-gpu}
OUT=${OUT:-/tmp/chi-variants-out}
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
[ -x "$BUILD/src/tools/chimaera-bench" ] || { note "no $BUILD/src/tools/chimaera-bench: build first"; exit 1; }
export SERVER_BENCH_ITERS=${SERVER_BENCH_ITERS:-50000} SERVER_BENCH_MS=${SERVER_BENCH_MS:-500}
rows='^\| (1|8|64|256) \||^256 clients|^Idle|^Raw floor|^\| (shm|ipc|tcp|tcp-curve)|^ok'

note "== gpu-server-variants on $(hostname), $(date -u +%FT%TZ), $(nproc) CPUs, $(git log -1 --format=%h 2>/dev/null || echo tree)"
PARTS=${VARIANTS_PARTS:-default variants idle}
part() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
if part default; then
  note ""
  note "== default configuration (every transport)"
  OUT=$OUT/default timeout 240 bash scripts/server-bench.sh "$BUILD" >"$OUT/default.log" 2>&1
  note "rc=$?"
  grep -E "$rows" "$OUT/default/server-bench.txt" 2>/dev/null | tee -a "$SUMMARY"
fi

VARIANTS=${VARIANTS:-"CHI_SERVER_SPIN_NS=1000000;CHI_SERVER_YIELD_NS=1000000"}
IFS=';' read -r -a sets <<<"$VARIANTS"
part variants || sets=()
for s in "${sets[@]}"; do
  name=$(echo "$s" | tr ' =' '_-')
  read -r -a envs <<<"$s"
  note ""
  note "== $s (shm only)"
  env "${envs[@]}" OUT="$OUT/$name" SERVER_BENCH_TRANSPORTS=shm timeout 150 bash scripts/server-bench.sh "$BUILD" \
    >"$OUT/$name.log" 2>&1
  note "rc=$?"
  grep -E "$rows" "$OUT/$name/server-bench.txt" 2>/dev/null | tee -a "$SUMMARY"
done

part idle || exit 0
note ""
GPU_IDLE_PARTS="idle" GPU_IDLE_SETTINGS="default;CHI_GPU_IDLE_LEASE_US=20000" OUT=$OUT/idle \
  timeout 120 bash scripts/gpu-idle-ab.sh >"$OUT/idle.log" 2>&1
note "idle sweep rc=$?"
sed -n '/idle embedded/,/idle sweep done/p' "$OUT/idle/summary.txt" 2>/dev/null | tee -a "$SUMMARY"

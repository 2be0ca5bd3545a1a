#!/usr/bin/env bash
# Issue 21's before/after on the GPU machine in one device call: builds this
# tree (build-gpu, through scripts/gpu-run.sh's build step, unless it is
# there) and a base commit's tarball (build-abtrees/base.tar.gz, made here by
# `scripts/gpu-route-ab.sh prepare [REF]`, default HEAD) with CUDA, then
# takes turns between the two: gpu_breakdown (every route's stages at 8, 64,
# 1024 and 4096 bytes) and gpu_timing (p50 and throughput of the three GPU
# routes), ROUNDS times each, and last chimaera-bench at every payload of
# GPU_AB_PAYLOADS with the new build (and at 64 bytes with the base, for the
# table's "before").  Results go to $OUT: summary.txt, ab.tgz with the raw runs.
#
#   here:    scripts/gpu-route-ab.sh prepare f0b0d93
#   device:  run(command="bash scripts/gpu-route-ab.sh", carry=[".devdeps", "build-abtrees"])
#
# Environment: GPU_AB_ROUNDS (default 2), GPU_AB_PAYLOADS (default
# "8 64 1024 4096"; empty: no chimaera-bench rows), GPU_AB_BENCH_ITERS
# (default 20000), GPU_AB_CTEST (1: `ctest -L gpu` on the new build first),
# JOBS (default 16), GPU_AB_BUDGET (seconds, default 540: parts that would
# not fit are skipped with a note).
set -u -o pipefail
cd "$(dirname "$0")/.."
trees=build-abtrees

if [ "${1:-}" = prepare ]; then
  ref=${2:-HEAD}
  mkdir -p "$trees"
  git archive --format=tar.gz -o "$trees/base.tar.gz" "$ref" || exit 1
  git log -1 --format='%h %s' "$ref" >"$trees/base.txt"
  echo "$trees/base.tar.gz: $(cut -c1-100 "$trees/base.txt")"
  exit 0
fi

OUT=${OUT:-/tmp/chi-route-ab-out}
mkdir -p "$OUT/raw"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
ROUNDS=${GPU_AB_ROUNDS:-2}
JOBS=${JOBS:-16}
BUDGET=${GPU_AB_BUDGET:-540}
t_start=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - t_start) )); }
enough() { [ "$(left)" -ge "$1" ] || { note "skipped: $2 (only $(left) s left)"; return 1; }; }

note "== gpu-route-ab on $(hostname), $(date -u +%FT%TZ), $(nproc) CPUs"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | tee -a "$SUMMARY"
. scripts/gpu-deps.sh
[ -f "$trees/base.tar.gz" ] || { note "no $trees/base.tar.gz: run 'scripts/gpu-route-ab.sh prepare REF' here first"; exit 1; }
note "base: $(cat "$trees/base.txt" 2>/dev/null | cut -c1-100)"
note "new:  this tree ($(git log -1 --format=%h 2>/dev/null || echo 'no history') plus its changes)"

cfg() { # SRC BUILD
  PKG_CONFIG_SYSROOT_DIR=/opt/deps cmake -S "$1" -B "$2" -G Ninja -DCHI_ENABLE_CUDA=ON -DCHI_CUDA_ARCHITECTURES=90 \
    -DCMAKE_CUDA_STANDARD=17 -DCMAKE_BUILD_TYPE=RelWithDebInfo
}
targets="chimaera-bench gpu_timing gpu_breakdown"
t0=$(date +%s)
if [ ! -x build-gpu/tests/gpu_breakdown ]; then
  GPU_RUN_STEPS=build OUT=$OUT/new-build bash scripts/gpu-run.sh >/dev/null 2>&1 ||
    { note "new build FAILED"; tail -30 "$OUT/new-build/build.log" | tee -a "$SUMMARY"; exit 1; }
fi
base_src=/tmp/chi-ab-base
rm -rf "$base_src" && mkdir -p "$base_src" && tar -xzf "$trees/base.tar.gz" -C "$base_src"
if ! { cfg "$base_src" /tmp/chi-ab-base-build && cmake --build /tmp/chi-ab-base-build -j "$JOBS" --target $targets; } \
    >"$OUT/raw/base-build.log" 2>&1; then
  note "base build FAILED"; tail -30 "$OUT/raw/base-build.log" | tee -a "$SUMMARY"; exit 1
fi
note "builds: $(( $(date +%s) - t0 )) s"
bin() { [ "$1" = base ] && echo /tmp/chi-ab-base-build || echo build-gpu; }

if [ "${GPU_AB_CTEST:-1}" = 1 ] && enough 120 "ctest -L gpu"; then
  s0=$(date +%s)
  (cd build-gpu && timeout 200 ctest -L gpu --output-on-failure) >"$OUT/raw/ctest-L-gpu.log" 2>&1
  note "ctest -L gpu, new build ($(( $(date +%s) - s0 )) s):"
  grep -E "tests passed|tests failed|\*\*\*Failed|\*\*\*Timeout|\(Failed\)" "$OUT/raw/ctest-L-gpu.log" | tee -a "$SUMMARY"
fi

# Turns: base, new, base, new ...
for r in $(seq 1 "$ROUNDS"); do
  for side in base new; do
    enough 30 "round $r $side" || break 2
    timeout 60 "$(bin $side)/tests/gpu_breakdown" 10000 >"$OUT/raw/breakdown-$side-$r.txt" 2>&1
    timeout 60 "$(bin $side)/tests/gpu_timing" 20000 >"$OUT/raw/timing-$side-$r.txt" 2>&1
  done
done
note ""
note "== gpu_breakdown round trips (median us), per round: base | new"
for p in 8 64 1024 4096; do
  for route in "gpu->cpu " "gpu->gpu " "cpu->gpu "; do
    b=$(grep -h "^$route *$p  = round trip" "$OUT"/raw/breakdown-base-*.txt | awk '{printf "%s ", $(NF-1)}')
    n=$(grep -h "^$route *$p  = round trip" "$OUT"/raw/breakdown-new-*.txt | awk '{printf "%s ", $(NF-1)}')
    note "$(printf '%-9s %5s  %s| %s' "$route" "$p" "$b" "$n")"
  done
done
note ""
note "== gpu_timing, per round: base, then new"
for side in base new; do
  for f in "$OUT"/raw/timing-$side-*.txt; do
    [ -f "$f" ] || continue
    note "-- $side $(basename "$f")"
    grep -E "p50|M tasks/s" "$f" | head -12 | tee -a "$SUMMARY"
  done
done
note "-- new, last round's stages"
sed -n '/^gpu->cpu     64/p;/^gpu->cpu      8/p' "$(ls "$OUT"/raw/breakdown-new-*.txt | tail -1)" | tee -a "$SUMMARY"

bench() { # SIDE PAYLOAD
  enough 60 "chimaera-bench $1 --payload $2" || return
  local s0; s0=$(date +%s)
  timeout 110 "$(bin "$1")/src/tools/chimaera-bench" --iters "${GPU_AB_BENCH_ITERS:-20000}" --warmup 2000 \
    --tput-tasks 100000 --payload "$2" --json-file "$OUT/raw/bench-$1-p$2.json" >"$OUT/raw/bench-$1-p$2.txt" 2>&1
  note "chimaera-bench $1 --payload $2 rc=$? ($(( $(date +%s) - s0 )) s):"
  grep -E '^(floor.gpu|floor.cpu_gpu|cpu->gpu0 |cpu->gpu_any pipelined x8|gpu0->)' "$OUT/raw/bench-$1-p$2.txt" |
    cut -c1-112 | tee -a "$SUMMARY"
}
note ""
for p in ${GPU_AB_PAYLOADS-8 64 1024 4096}; do
  bench new "$p"
  [ "$p" = 64 ] && bench base 64
done
tar -C "$OUT" -czf "$OUT/ab.tgz" raw && rm -rf "$OUT/raw"
note "total $(( $(date +%s) - t_start )) s"

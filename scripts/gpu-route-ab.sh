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
#            scripts/gpu-route-ab.sh prepare-new   (optional: the new side
#            from HEAD's tarball instead of the working tree)
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

if [ "${1:-}" = prepare-new ]; then
  mkdir -p "$trees"
  git archive --format=tar.gz -o "$trees/new.tar.gz" HEAD || exit 1
  git log -1 --format='%h %s' HEAD >"$trees/new.txt"
  echo "$trees/new.tar.gz: $(cut -c1-100 "$trees/new.txt")"
  exit 0
fi
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
ROUNDS=${GPU_AB_ROUNDS:-1}
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

cfg() { # SRC BUILD
  PKG_CONFIG_SYSROOT_DIR=/opt/deps cmake -S "$1" -B "$2" -G Ninja -DCHI_ENABLE_CUDA=ON -DCHI_CUDA_ARCHITECTURES=90 \
    -DCMAKE_CUDA_STANDARD=17 -DCMAKE_BUILD_TYPE=RelWithDebInfo
}
REPEAT=${GPU_AB_REPEAT:-}  # TEST:N: run that test binary N times on each build, in turns
targets="chimaera-bench gpu_timing gpu_breakdown chimaera-gpu-idle${REPEAT:+ ${REPEAT%%:*}}"
t0=$(date +%s)
NEW=build-gpu
[ -f "$trees/new.tar.gz" ] ||
  note "new:  this tree ($(git log -1 --format=%h 2>/dev/null || echo 'no history') plus its changes)"
if [ -f "$trees/new.tar.gz" ]; then
  # The new side from a tarball too (`prepare-new` here): a committed state,
  # whatever else the working tree holds.
  NEW=/tmp/chi-ab-new-build
  note "new:  $(cat "$trees/new.txt" 2>/dev/null | cut -c1-100) (tarball)"
  rm -rf /tmp/chi-ab-new && mkdir -p /tmp/chi-ab-new && tar -xzf "$trees/new.tar.gz" -C /tmp/chi-ab-new
  if ! { cfg /tmp/chi-ab-new "$NEW" && cmake --build "$NEW" -j "$JOBS"; } >"$OUT/raw/new-build.log" 2>&1; then
    note "new build FAILED"; tail -30 "$OUT/raw/new-build.log" | tee -a "$SUMMARY"; exit 1
  fi
elif [ ! -x build-gpu/tests/gpu_breakdown ]; then
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
bin() { [ "$1" = base ] && echo /tmp/chi-ab-base-build || echo "$NEW"; }

if [ "${GPU_AB_CTEST:-1}" = 1 ] && enough 120 "ctest -L gpu"; then
  s0=$(date +%s)
  (cd "$NEW" && timeout 200 ctest -L gpu --output-on-failure) >"$OUT/raw/ctest-L-gpu.log" 2>&1
  note "ctest -L gpu, new build ($(( $(date +%s) - s0 )) s):"
  grep -E "tests passed|tests failed|\*\*\*Failed|\*\*\*Timeout|\(Failed\)" "$OUT/raw/ctest-L-gpu.log" | tee -a "$SUMMARY"
fi

if [ -n "$REPEAT" ]; then
  t=${REPEAT%%:*} n=${REPEAT##*:}
  declare -A fails=([base]=0 [new]=0)
  for i in $(seq 1 "$n"); do
    for side in base new; do
      enough 40 "$t run $i $side" || break 2
      if ! (cd "$(bin $side)/tests" && timeout 60 "./$t") >"$OUT/raw/repeat-$t-$side-$i.txt" 2>&1; then
        fails[$side]=$(( ${fails[$side]} + 1 ))
      fi
    done
  done
  note "$t, $n runs each: base failed ${fails[base]}, new failed ${fails[new]}"
  grep -h "FAILED  \]\|AGAIN [1-9]" "$OUT"/raw/repeat-$t-*.txt | sort | uniq -c | head -20 | tee -a "$SUMMARY"
fi

# Turns: base, new, base, new ...
for r in $(seq 1 "$ROUNDS"); do
  for side in base new; do
    enough 30 "round $r $side" || break 2
    timeout 60 "$(bin $side)/tests/gpu_breakdown" 10000 >"$OUT/raw/breakdown-$side-$r.txt" 2>&1
    timeout 60 "$(bin $side)/tests/gpu_timing" 20000 >"$OUT/raw/timing-$side-$r.txt" 2>&1
  done
done
if [ "$ROUNDS" -gt 0 ]; then
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
fi

bench() { # SIDE PAYLOAD TAG [VAR=VALUE ...]
  local side=$1 p=$2 tag=$3; shift 3
  enough 45 "chimaera-bench $side --payload $p $*" || return
  local s0; s0=$(date +%s)
  env "$@" timeout 110 "$(bin "$side")/src/tools/chimaera-bench" --iters "${GPU_AB_BENCH_ITERS:-20000}" --warmup 2000 \
    --tput-tasks 100000 --payload "$p" --json-file "$OUT/raw/bench-$tag.json" >"$OUT/raw/bench-$tag.txt" 2>&1
  note "chimaera-bench $side --payload $p $* rc=$? ($(( $(date +%s) - s0 )) s) [$tag]"
}
# One line per run: p50 (us) of the latency rows and floors, M tasks/s of the throughput rows.
rows='floor.gpu_cpu_pingpong|floor.gpu_cpu_calls 1056w|floor.gpu_block_pingpong|floor.cpu_gpu_pingpong|gpu0->cpu|gpu0->local|cpu->gpu0|cpu->gpu_any pipelined x8|gpu0->cpu 1056 warps|gpu0->local 1056 warps|cpu->cpu|cpu->cpu pipelined x16|cpu->cpu batched x16'
line() { # TAG
  local f=$OUT/raw/bench-$1.txt out="" r v
  IFS='|' read -r -a names <<<"$rows"
  for r in "${names[@]}"; do
    v=$(awk -v r="$r" '{ n = $0; sub(/ +(floor|latency|throughput|peer) .*/, "", n) } n == r {
          for (k = 1; k <= NF; k++) if ($k ~ /^(floor|latency|throughput|peer)$/) break
          print ($k == "throughput" || r ~ /calls/ ? $(k + 6) : $(k + 3)); exit }' "$f" 2>/dev/null)
    out="$out ${v:--}"
  done
  echo "$1:$out"
}
note ""
AB_P=${GPU_AB_AB_PAYLOADS-8 64}
# Settings of the new build that take their turn beside base and new.
IFS=';' read -r -a tsets <<<"${GPU_AB_TURN_VARIANTS-}"
for r in $(seq 1 "${GPU_AB_BENCH_ROUNDS:-3}"); do
  for p in $AB_P; do
    bench base "$p" "base-p$p-r$r"
    bench new "$p" "new-p$p-r$r"
    for v in "${tsets[@]}"; do
      [ -n "$v" ] || continue
      read -r -a envs <<<"$v"
      bench new "$p" "new-$(echo "$v" | tr ' =' '_-')-p$p-r$r" "${envs[@]}"
    done
  done
done
for p in ${GPU_AB_PAYLOADS-1024 4096}; do bench new "$p" "new-p$p"; done
IFS=';' read -r -a vsets <<<"${GPU_AB_VARIANTS-CHI_GPU_POLLERS=8;CHI_GPU_POLLERS=12;CHI_GPU_BLOCKS=8}"
for v in "${vsets[@]}"; do
  [ -n "$v" ] || continue
  read -r -a envs <<<"$v"
  bench new 64 "new-p64-$(echo "$v" | tr ' =' '_-')" "${envs[@]}"
done
if [ "${GPU_AB_IDLE:-0}" = 1 ]; then
  # An idle embedded runtime of each build: CPU over 5 s and the first
  # GPU->CPU task after 1 s of quiet (chimaera-gpu-idle, as gpu-idle-ab.sh).
  for side in base new; do
    enough 30 "idle $side" || break
    timeout 60 "$(bin $side)/src/tools/chimaera-gpu-idle" --idle-s 5 --samples 10 --gap-ms 1000 \
      >"$OUT/raw/idle-$side.txt" 2>&1
    note "idle $side rc=$?: $(grep -h "^RESULT" "$OUT/raw/idle-$side.txt" | head -1)"
    grep -h "chi-gpu-poll\|idle CPU over" "$OUT/raw/idle-$side.txt" | head -10 | tee -a "$SUMMARY"
  done
fi
note ""
note "== chimaera-bench, one line per run: p50 us of latency rows and floors, M tasks/s of throughput rows"
note "columns: $(echo "$rows" | tr '|' ',')"
for f in "$OUT"/raw/bench-*.txt; do [ -f "$f" ] && note "$(line "$(basename "$f" .txt | sed 's/^bench-//')")"; done
tar -C "$OUT" -czf "$OUT/ab.tgz" raw && rm -rf "$OUT/raw"
note "total $(( $(date +%s) - t_start )) s"

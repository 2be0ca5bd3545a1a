#!/usr/bin/env bash
# Where a lone CPU->CPU task's round trip goes, stage by stage, on the
# 16-core GPU host (docs/performance.md, "A round trip's stages on 16 CPUs"):
# copies this tree to a scratch directory, applies the round-trip trace patch
# (rdtsc stamps through submit, the worker and chi_wait, kept per thread and
# joined at shutdown), builds a CPU-only chimaera-bench from it and runs
# `chimaera-bench --iters 20000` once per setting, ROUNDS times in turns.
# Each run prints the median ns after submit of every stage, the bench's p50
# and floor.cpu_pingpong.  The patch is an experiment: it is never built
# into the library.
#
#   device:  run(command="bash scripts/gpu-cpu-trace.sh", carry=[".devdeps"])
#   here:    bash scripts/gpu-cpu-trace.sh      (any machine with the build dependencies)
#
# Environment: TRACE_PATCH (default
# docs/bench/h200-2026-11-28e/trace-81098b7.patch, made against 81098b7:
# rebase it when cpu_executor.cpp moves), TRACE_SETTINGS (';'-separated, each
# "default" or a list of VAR=VALUE: CHI_ settings, or the patch's what-if
# switches CHI_EXP_NOFENCE, CHI_EXP_NOLOOK, CHI_EXP_NOWATCHREL,
# CHI_EXP_OLDLOOK, CHI_EXP_NOHINT, CHI_EXP_RELAX=N), TRACE_ROUNDS (default 2), JOBS (default
# 16), OUT (default /tmp/chi-cpu-trace-out; trace.txt there).
# Exit status: 0 when every run finished, 1 otherwise (2: the patch or the
# build failed).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/chi-cpu-trace-out}
mkdir -p "$OUT"
PATCH=${TRACE_PATCH:-docs/bench/h200-2026-11-28e/trace-81098b7.patch}
SETTINGS=${TRACE_SETTINGS:-"default;CHI_EXP_OLDLOOK=1 CHI_EXP_NOHINT=1;CHI_EXP_NOLOOK=1;CHI_WORKER_SPINNERS=1"}
ROUNDS=${TRACE_ROUNDS:-2}
JOBS=${JOBS:-16}
LOG=$OUT/trace.txt
: >"$LOG"
[ -f "$PATCH" ] || { echo "$0: no $PATCH" | tee -a "$LOG" >&2; exit 2; }
. scripts/deps-sysroot.sh
src=$(mktemp -d /tmp/chi-trace-src.XXXXXX)
trap 'rm -rf "$src"' EXIT
tar cf - --exclude='./build*' --exclude=./.devdeps --exclude=./.git . | tar xf - -C "$src"
if ! patch -d "$src" -p1 -s <"$PATCH"; then
  echo "$0: $PATCH does not apply to this tree (rebase it)" | tee -a "$LOG" >&2
  exit 2
fi
if ! { PKG_CONFIG_SYSROOT_DIR=$sysroot cmake -S "$src" -B "$src/b" -G Ninja -DCHI_ENABLE_CUDA=OFF \
         -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$OUT/build.log" 2>&1 &&
       timeout 300 cmake --build "$src/b" -j "$JOBS" --target chimaera-bench >>"$OUT/build.log" 2>&1; }; then
  echo "$0: build failed; tail of $OUT/build.log:" | tee -a "$LOG" >&2
  tail -20 "$OUT/build.log" | tee -a "$LOG" >&2
  exit 2
fi
IFS=';' read -r -a sets <<<"$SETTINGS"
echo "== gpu-cpu-trace on $(hostname), $(date -u +%FT%TZ), $(nproc) CPUs, patch $PATCH" | tee -a "$LOG"
rc=0
for r in $(seq 1 "$ROUNDS"); do
  for v in "${sets[@]}"; do
    [ -n "$v" ] || continue
    envs=()
    [ "$v" = default ] || read -r -a envs <<<"$v"
    echo "== round $r: $v" | tee -a "$LOG"
    env "${envs[@]}" CHI_EXP_TRACE=1 CHI_GPU_DEVICES=0 timeout 120 "$src/b/src/tools/chimaera-bench" \
      --iters 20000 --tput-tasks 100000 --threads 2 >"$OUT/run.txt" 2>&1 || rc=1
    grep -E '^trace|^cpu->cpu  |^floor.cpu_pingpong' "$OUT/run.txt" | tee -a "$LOG"
  done
done
rm -f "$OUT/run.txt"
exit $rc

#!/usr/bin/env bash
# One program of the GPU build under several environment settings, in turns,
# in one device call: builds this tree (build-gpu, through gpu-run.sh's build
# step, unless it is there), then runs GPU_VAR_CMD (relative to build-gpu)
# once per variant per round, rounds interleaved so that drift of the machine
# falls on every variant alike.  Each run's output goes to $OUT/raw, the lines
# matching GPU_VAR_GREP of each run to $OUT/summary.txt; raw is tarred into
# $OUT/variants.tgz.
#
#   device: run(command="GPU_VAR_CMD='tests/gpu_timing 20000 tput' \
#               GPU_VAR_LIST='CHI_GPU_POLLERS=4;CHI_GPU_POLLERS=8' bash scripts/gpu-env-variants.sh",
#               carry=[".devdeps"])
#
# Environment: GPU_VAR_CMD (required), GPU_VAR_TARGETS (build only these
# cmake targets, e.g. chimaera-bench, even if build-gpu exists), GPU_VAR_LIST (';'-separated; each
# variant is space-separated VAR=VALUE words, '-' for none), GPU_VAR_ROUNDS
# (default 2), GPU_VAR_GREP (default 'M tasks/s|p50'), GPU_VAR_TIMEOUT (per
# run, default 60 s), GPU_VAR_BUDGET (seconds, default 540: runs that would
# not fit are skipped with a note).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/chi-variants-out}
mkdir -p "$OUT/raw"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
: "${GPU_VAR_CMD:?set GPU_VAR_CMD, the program to run under build-gpu}"
BUDGET=${GPU_VAR_BUDGET:-540}
TMO=${GPU_VAR_TIMEOUT:-60}
t_start=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - t_start) )); }

note "== gpu-env-variants on $(hostname), $(date -u +%FT%TZ), $(nproc) CPUs"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | tee -a "$SUMMARY"
. scripts/gpu-deps.sh  # the Debian libraries the machine lacks, and their path
note "tree: $(git log -1 --format='%h %s' 2>/dev/null | cut -c1-100)$(git diff --quiet HEAD 2>/dev/null || echo ' (plus changes)')"
note "command: $GPU_VAR_CMD"
if [ -n "${GPU_VAR_TARGETS:-}" ]; then
  # Only these targets (a short lease): configured as gpu-run.sh does.
  s0=$(date +%s)
  mkdir -p "$OUT/build"
  { PKG_CONFIG_SYSROOT_DIR=/opt/deps cmake -S . -B build-gpu -G Ninja -DCHI_ENABLE_CUDA=ON \
      -DCHI_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_STANDARD=17 -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
    cmake --build build-gpu -j 16 --target $GPU_VAR_TARGETS; } >"$OUT/build/build.log" 2>&1 ||
    { note "build FAILED"; tail -30 "$OUT/build/build.log" | tee -a "$SUMMARY"; exit 1; }
  note "build of $GPU_VAR_TARGETS: $(( $(date +%s) - s0 )) s"
elif [ ! -x build-gpu/src/tools/chimaera-bench ]; then
  s0=$(date +%s)
  GPU_RUN_STEPS=build OUT=$OUT/build bash scripts/gpu-run.sh >/dev/null 2>&1 ||
    { note "build FAILED"; tail -30 "$OUT/build/build.log" | tee -a "$SUMMARY"; exit 1; }
  note "build: $(( $(date +%s) - s0 )) s"
fi
IFS=';' read -r -a vars <<<"${GPU_VAR_LIST:--}"
for r in $(seq 1 "${GPU_VAR_ROUNDS:-2}"); do
  for i in "${!vars[@]}"; do
    v=${vars[$i]}
    if [ "$(left)" -lt $(( TMO + 10 )) ]; then note "skipped: round $r '$v' (only $(left) s left)"; continue; fi
    envs=()
    [ "$v" = - ] || read -r -a envs <<<"$v"
    f=$OUT/raw/v$i-r$r.txt
    s0=$(date +%s)
    (cd build-gpu && env "${envs[@]}" timeout "$TMO" $GPU_VAR_CMD) >"$f" 2>&1
    rc=$?
    note "-- round $r [$v] rc=$rc ($(( $(date +%s) - s0 )) s)"
    grep -E "${GPU_VAR_GREP:-M tasks/s|p50}" "$f" | head -20 | tee -a "$SUMMARY"
  done
done
tar -C "$OUT" -czf "$OUT/variants.tgz" raw && rm -rf "$OUT/raw"
note "total $(( $(date +%s) - t_start )) s"

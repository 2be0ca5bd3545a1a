#!/usr/bin/env bash
# CPU->CPU rows of two builds on the 16-core GPU host, GPUs hidden, in turns
# in one device call: builds chimaera-bench from a base commit's tarball
# (build-abtrees/base.tar.gz, made here by `scripts/gpu-route-ab.sh prepare
# REF`) and from this tree, then runs `chimaera-bench --threads N
# --tput-tasks M` with CHI_GPU_DEVICES=0 for base, new and each variant of
# the new build, ROUNDS times in turns (even rounds in reverse order).  One line per run in $OUT/summary.txt
# (cpu->cpu p50 us, pipelined x1 M/s, pipelined xN M/s / p99 us, batched xN
# M/s / p99 us, then CPU us and context switches per task of pipelined x1,
# pipelined xN and batched xN); the raw outputs in $OUT/raw.tgz.
#
#   here:    scripts/gpu-route-ab.sh prepare d9e5231
#   device:  run(command="CPU_AB_VARIANTS='CHI_WORKER_POP_BATCH=1' bash scripts/gpu-cpu-ab.sh",
#                carry=[".devdeps", "build-abtrees"])
#
# Also runs on any machine with the build dependencies (no GPU needed).
# Environment: CPU_AB_ROUNDS (default 3), CPU_AB_THREADS (default 16),
# CPU_AB_TASKS (default 1000000), CPU_AB_ITERS (default 20000),
# CPU_AB_VARIANTS (';'-separated settings of the new build, each a list of
# VAR=VALUE), CPU_AB_BASE_VARIANTS (the same for the base build, so that a
# setting can be compared across the two), CPU_AB_CUDA (ON or OFF; default: ON where nvcc is), JOBS
# (default 16).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/chi-cpu-ab-out}
mkdir -p "$OUT/raw"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
trees=build-abtrees
[ -f "$trees/base.tar.gz" ] || { note "no $trees/base.tar.gz: run 'scripts/gpu-route-ab.sh prepare REF' here first"; exit 1; }
. scripts/deps-sysroot.sh
JOBS=${JOBS:-16}
cfg() { # SRC BUILD
  local cuda=OFF
  rm -rf "$2"   # a cache from another configuration keeps its pkg-config answers
  command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] && cuda=ON
  [ -n "${CPU_AB_CUDA:-}" ] && cuda=$CPU_AB_CUDA
  PKG_CONFIG_SYSROOT_DIR=$sysroot cmake -S "$1" -B "$2" -G Ninja -DCHI_ENABLE_CUDA=$cuda \
    -DCHI_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_STANDARD=17 -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$OUT/raw/build-$(basename "$2").log" 2>&1 &&
    cmake --build "$2" -j "$JOBS" --target chimaera-bench >>"$OUT/raw/build-$(basename "$2").log" 2>&1
}
note "== gpu-cpu-ab on $(hostname), $(date -u +%FT%TZ), $(nproc) CPUs"
note "base: $(cut -c1-100 "$trees/base.txt" 2>/dev/null)"
note "new:  this tree ($(git log -1 --format=%h 2>/dev/null || echo 'no history') plus its changes)"
rm -rf /tmp/chi-cpu-ab-base && mkdir -p /tmp/chi-cpu-ab-base && tar -xzf "$trees/base.tar.gz" -C /tmp/chi-cpu-ab-base
cfg /tmp/chi-cpu-ab-base /tmp/chi-cpu-ab-base-build || { note "base build FAILED"; exit 1; }
cfg . /tmp/chi-cpu-ab-new-build || { note "new build FAILED"; exit 1; }
THREADS=${CPU_AB_THREADS:-16}
IFS=';' read -r -a sets <<<"${CPU_AB_VARIANTS-}"
IFS=';' read -r -a base_sets <<<"${CPU_AB_BASE_VARIANTS-}"
note "columns: cpu->cpu p50 us | pipelined x1 M/s | pipelined x$THREADS M/s (p99 us) | batched x$THREADS M/s (p99 us) | CPU us/context switches per task: pipelined x1, pipelined and batched x$THREADS"
run() { # TAG BUILD [VAR=VALUE ...]
  local tag=$1 b=$2 f; shift 2
  f=$OUT/raw/$tag.txt
  env CHI_GPU_DEVICES=0 "$@" timeout 120 "$b/src/tools/chimaera-bench" --iters "${CPU_AB_ITERS:-20000}" \
    --tput-tasks "${CPU_AB_TASKS:-1000000}" --threads "$THREADS" >"$f" 2>&1
  note "$(printf '%-40s' "$tag") $(awk '$1 == "cpu->cpu" && $2 == "latency" {printf "%s", $5}' "$f") |" \
    "$(awk '$1 == "cpu->cpu" && $2 == "pipelined" && $3 == "x1" && $5 != "us" {printf "%s", $10}' "$f") |" \
    "$(awk -v t="x$THREADS" '$1 == "cpu->cpu" && $2 == "pipelined" && $3 == t && $5 != "us" {printf "%s (%s)", $10, $8}' "$f") |" \
    "$(awk -v t="x$THREADS" '$1 == "cpu->cpu" && $2 == "batched" && $3 == t && $5 != "us" {printf "%s (%s)", $10, $8}' "$f")" \
    "| $(awk -v t="x$THREADS" '$1 == "cpu->cpu" && $5 == "us" && ($3 == t || $3 == "x1") {printf "%s/%s ", $4, $7}' "$f")"
}
# Each round runs base, new and the variants; even rounds in the reverse
# order, so that no build always runs first (stop 33's run3 ran base first
# in every round).
for r in $(seq 1 "${CPU_AB_ROUNDS:-3}"); do
  turns=("base-r$r|/tmp/chi-cpu-ab-base-build|" "new-r$r|/tmp/chi-cpu-ab-new-build|")
  for v in "${base_sets[@]}"; do
    [ -n "$v" ] || continue
    turns+=("base-$(echo "$v" | tr ' =' '_-')-r$r|/tmp/chi-cpu-ab-base-build|$v")
  done
  for v in "${sets[@]}"; do
    [ -n "$v" ] || continue
    turns+=("new-$(echo "$v" | tr ' =' '_-')-r$r|/tmp/chi-cpu-ab-new-build|$v")
  done
  order=("${turns[@]}")
  if [ $((r % 2)) -eq 0 ]; then
    order=()
    for ((i = ${#turns[@]} - 1; i >= 0; --i)); do order+=("${turns[i]}"); done
  fi
  for t in "${order[@]}"; do
    IFS='|' read -r tag build vars <<<"$t"
    read -r -a envs <<<"$vars"
    run "$tag" "$build" "${envs[@]}"
  done
done
tar -C "$OUT" -czf "$OUT/raw.tgz" raw && rm -rf "$OUT/raw"

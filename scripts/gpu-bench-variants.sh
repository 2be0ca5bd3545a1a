#!/usr/bin/env bash
# chimaera-bench's GPU rows under several settings of one build, in turns, in
# one device call: builds this tree (build-gpu, through scripts/gpu-run.sh's
# build step; a warm machine's build-gpu is brought up to date), then runs `chimaera-bench --payload P`
# once per setting and round (even rounds in reverse order, so that no
# setting always runs first).  One line per run in $OUT/summary.txt: the
# p50 of gpu0->local, gpu0->cpu and cpu->gpu0 (us), the 1056-warp rows of
# gpu0->local and gpu0->cpu (M tasks/s), and the footprint rows (the FMA and
# copy kernels' time beside a loaded orchestrator over their time alone);
# the raw tables and JSON in $OUT/raw.tgz.
#
#   device:  run(command="GPU_BENCH_VARIANTS='CHI_GPU_BLOCKS=16;CHI_GPU_BLOCKS=32' bash scripts/gpu-bench-variants.sh",
#                carry=[".devdeps"])
#
# Environment: GPU_BENCH_VARIANTS (';'-separated settings, each a list of
# VAR=VALUE and of chimaera-bench options written --opt=value; an empty one
# is the defaults; default: the defaults alone),
# GPU_BENCH_ROUNDS (default 2), GPU_BENCH_PAYLOAD (default 64),
# GPU_BENCH_ITERS (default 20000), GPU_BENCH_TASKS (default 1000000).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/chi-bench-variants-out}
mkdir -p "$OUT/raw"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
note "== gpu-bench-variants on $(hostname), $(date -u +%FT%TZ), $(nproc) CPUs, $(git log -1 --format=%h 2>/dev/null || echo 'no history')"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | tee -a "$SUMMARY"
if [ -f build-gpu/build.ninja ]; then  # a warm machine's build: brought up to this tree
  . scripts/gpu-deps.sh >/dev/null 2>&1
  cmake --build build-gpu -j "${JOBS:-16}" --target chimaera-bench >"$OUT/raw/rebuild.log" 2>&1 ||
    note "rebuild FAILED: see raw/rebuild.log"
else
  OUT=$OUT/raw/build GPU_RUN_STEPS=build GPU_RUN_BUDGET=150 bash scripts/gpu-run.sh >/dev/null 2>&1
  grep -E "^build" "$OUT/raw/build/summary.txt" | tee -a "$SUMMARY"
fi
[ -x build-gpu/src/tools/chimaera-bench ] || { note "no build: see raw/build"; tar -C "$OUT" -czf "$OUT/raw.tgz" raw; exit 1; }
. scripts/gpu-deps.sh >/dev/null 2>&1
P=${GPU_BENCH_PAYLOAD:-64}
IFS=';' read -r -a sets <<<"${GPU_BENCH_VARIANTS-}"
[ "${#sets[@]}" -gt 0 ] || sets=("")
note "payload $P B; columns: p50 us gpu0->local | gpu0->cpu | cpu->gpu0 ; 1056 warps M/s gpu0->local | gpu0->cpu ; footprint fma | copy (loaded orchestrator / alone)"
for r in $(seq 1 "${GPU_BENCH_ROUNDS:-2}"); do
  order=("${sets[@]}")
  if [ $((r % 2)) -eq 0 ]; then
    order=()
    for ((i = ${#sets[@]} - 1; i >= 0; --i)); do order+=("${sets[i]}"); done
  fi
  for v in "${order[@]}"; do
    tag=$(echo "${v:-defaults}" | tr ' =' '_-')
    f=$OUT/raw/$tag-r$r
    envs=() args=()
    for w in $v; do case $w in --*) args+=("$w") ;; *) envs+=("$w") ;; esac; done
    env "${envs[@]}" timeout 300 build-gpu/src/tools/chimaera-bench --iters "${GPU_BENCH_ITERS:-20000}" \
      --tput-tasks "${GPU_BENCH_TASKS:-1000000}" --payload "$P" --json-file "$f.json" "${args[@]}" >"$f.txt" 2>&1
    rc=$?
    row() { awk -v n="$1" -v c="$2" '{ line = $0; sub(/[ ]+(latency|throughput|floor|peer)[ ].*$/, "", line) }
                                      line == n { split(substr($0, length(n) + 1), a, " "); print a[c]; exit }' "$f.txt"; }
    fp() { # NAME: beside a loaded orchestrator over alone
      awk -v n="$1" '$1 == "footprint." n && $2 == "alone" {a = $6} $1 == "footprint." n && $2 == "+loaded" {b = $7}
                     END { if (a > 0 && b > 0) printf "%.3f", b / a; else printf "-" }' "$f.txt"; }
    note "$(printf '%-36s' "$tag-r$r") rc=$rc | $(row gpu0-\>local 4) | $(row gpu0-\>cpu 4) | $(row cpu-\>gpu0 4) ;" \
      "$(row 'gpu0->local 1056 warps' 7) | $(row 'gpu0->cpu 1056 warps' 7) ; $(fp fma) | $(fp copy)"
  done
done
tar -C "$OUT" -czf "$OUT/raw.tgz" raw && rm -rf "$OUT/raw"

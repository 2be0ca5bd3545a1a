#!/usr/bin/env bash
# What is left to run on a GPU machine, in one device call (about 6-8
# minutes on the 16-CPU GPU host; PENDING_PARTS picks parts):
#   build    this tree (scripts/gpu-run.sh's build step);
#   ctest    `ctest -L gpu`;
#   sanitize compute-sanitizer memcheck and racecheck over the tests that
#            run under it (scripts/gpu-run.sh's sanitize step);
#   spin     chimaera-bench's CPU rows with 16 submitters, GPUs hidden,
#            under settings in turns: the defaults, spin_ns 5000 and 0, and
#            8 workers with pops of 8, with and without the shorter spin
#            (docs/performance.md, "Sixteen submitters and how many workers");
#   cpuab    scripts/gpu-cpu-ab.sh: chimaera-bench's CPU rows (16
#            submitters, GPUs hidden) of build-abtrees/base.tar.gz and this
#            tree in turns, PENDING_ROUNDS rounds, both built without
#            CUDA (PENDING_CPUAB_PATCH: a patch on the new side only);
#   coexist  test_gpu_coexist's device-wide call times from this tree and,
#            with build-abtrees/base.tar.gz, from a base built beside it, in
#            turns (docs/gpu.md, "Coexisting with other CUDA code");
#   soak     a 3-minute GPU soak (scripts/gpu-soak.sh), with the rounds whose
#            submits answered CHI_ERR_AGAIN (soak_gpu prints the gate's last
#            give-up).
# Results in $OUT: summary.txt, pending.tgz with the raw runs, and the
# soak's own files.
#
#   here:   scripts/gpu-route-ab.sh prepare REF   (the cpuab and coexist parts' base)
#   device: run(command="bash scripts/gpu-pending.sh", carry=[".devdeps", "build-abtrees"])
#
# Environment: PENDING_ROUNDS (default 2), PENDING_PARTS (default
# "build ctest sanitize cpuab soak"; without build, build-gpu must be there),
# PENDING_CPUAB_PATCH (a patch applied to this tree just before the cpuab
# part: its new side; the GPU build, tests and soak run without it).
# Example (2026-11-28, run1 of docs/bench/h200-2026-11-28c: the patch was left out):
# PENDING_CPUAB_PATCH=docs/bench/next-wake-grace.patch PENDING_ROUNDS=4
# CPU_AB_VARIANTS='CHI_WORKER_SPINNERS=2;CHI_WORKER_SPINNERS=4' bash scripts/gpu-pending.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/chi-pending-out}
mkdir -p "$OUT/raw"
SUMMARY=$OUT/summary.txt
ROUNDS=${PENDING_ROUNDS:-2}
PARTS=${PENDING_PARTS:-build ctest sanitize cpuab soak}
part() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
note() { echo "$*" | tee -a "$SUMMARY"; }

# The build (and its summary line) through gpu-run.sh; its summary goes
# first in ours.
: >"$SUMMARY"
if part build; then
  OUT=$OUT/raw GPU_RUN_STEPS=build GPU_RUN_BUDGET=150 bash scripts/gpu-run.sh >/dev/null 2>&1
  cat "$OUT/raw/summary.txt" >>"$SUMMARY"
fi
[ -x build-gpu/src/tools/chimaera-bench ] || { note "no build: see raw/build.log"; exit 1; }
. scripts/gpu-deps.sh

if part ctest; then
  (cd build-gpu && timeout 120 ctest -L gpu >"$OUT/raw/ctest-gpu.log" 2>&1)
  note "ctest -L gpu rc=$?: $(grep -E 'tests passed' "$OUT/raw/ctest-gpu.log")"
  grep -E '\*\*\*|Failed' "$OUT/raw/ctest-gpu.log" | tee -a "$SUMMARY"
fi

if part sanitize; then
  OUT=$OUT/raw/sanitize GPU_RUN_STEPS=sanitize GPU_RUN_BUDGET=240 bash scripts/gpu-run.sh >/dev/null 2>&1
  note ""
  note "== compute-sanitizer"
  grep -E "compute-sanitizer|ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/raw/sanitize/summary.txt" 2>/dev/null | tee -a "$SUMMARY"
fi

if part spin; then
  note ""
  note "== CPU rows, 16 submitters, GPUs hidden: cpu->cpu p50 us | pipelined x16 M/s (p99 us) | batched x16 M/s (p99 us)"
  sets=("" "CHI_SPIN_NS=5000" "CHI_SPIN_NS=0" "CHI_WORKERS=8 CHI_WORKER_POP_BATCH=8"
        "CHI_SPIN_NS=5000 CHI_WORKERS=8 CHI_WORKER_POP_BATCH=8")
  for r in $(seq 1 "$ROUNDS"); do
    for v in "${sets[@]}"; do
      tag=$(echo "${v:-defaults}" | tr ' =' '_-')
      f=$OUT/raw/spin-$tag-r$r.txt
      read -r -a envs <<<"$v"
      env CHI_GPU_DEVICES=0 "${envs[@]}" timeout 120 build-gpu/src/tools/chimaera-bench --iters 20000 \
        --tput-tasks 2000000 --threads 16 >"$f" 2>&1
      note "$(printf '%-52s' "${v:-defaults}, round $r") $(awk '$1 == "cpu->cpu" && $2 == "latency" {printf "%s", $5}' "$f") |" \
        "$(awk '$2 == "pipelined" && $3 == "x16" {printf "%s (%s)", $10, $8}' "$f") |" \
        "$(awk '$2 == "batched" && $3 == "x16" {printf "%s (%s)", $10, $8}' "$f")"
    done
  done
fi

if part cpuab; then
  note ""
  # A patch for the new side only (build-gpu, built above, stays as it was).
  if [ -n "${PENDING_CPUAB_PATCH:-}" ]; then
    if git apply "$PENDING_CPUAB_PATCH" 2>/dev/null || patch -p1 --forward <"$PENDING_CPUAB_PATCH" >/dev/null 2>&1; then
      note "cpuab: new side with $PENDING_CPUAB_PATCH"
    else
      note "cpuab: $PENDING_CPUAB_PATCH did not apply"
    fi
  fi
  OUT=$OUT/raw/cpuab CPU_AB_ROUNDS=$ROUNDS CPU_AB_CUDA=OFF timeout 200 bash scripts/gpu-cpu-ab.sh >/dev/null 2>&1
  note "gpu-cpu-ab rc=$?"
  cat "$OUT/raw/cpuab/summary.txt" >>"$SUMMARY" 2>/dev/null
  # The later parts run this tree as it came.
  if [ -n "${PENDING_CPUAB_PATCH:-}" ]; then
    git apply -R "$PENDING_CPUAB_PATCH" 2>/dev/null || patch -p1 -R <"$PENDING_CPUAB_PATCH" >/dev/null 2>&1 ||
      note "cpuab: $PENDING_CPUAB_PATCH could not be taken back"
  fi
fi

if part coexist; then
  sides=new
  if [ -f build-abtrees/base.tar.gz ]; then
    rm -rf /tmp/chi-pending-base && mkdir -p /tmp/chi-pending-base &&
      tar -xzf build-abtrees/base.tar.gz -C /tmp/chi-pending-base
    if PKG_CONFIG_SYSROOT_DIR=/opt/deps cmake -S /tmp/chi-pending-base -B /tmp/chi-pending-base-build -G Ninja \
         -DCHI_ENABLE_CUDA=ON -DCHI_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_STANDARD=17 -DCMAKE_BUILD_TYPE=RelWithDebInfo \
         >"$OUT/raw/base-build.log" 2>&1 &&
       cmake --build /tmp/chi-pending-base-build -j 16 --target test_gpu_coexist >>"$OUT/raw/base-build.log" 2>&1; then
      sides="base new"
      note ""
      note "coexist base: $(cut -c1-100 build-abtrees/base.txt 2>/dev/null)"
    else
      note "base build FAILED (raw/base-build.log): test_gpu_coexist runs on this tree only"
    fi
  fi
  note ""
  note "== test_gpu_coexist, device-wide calls (n, p50, p99, max), in turns"
  for r in $(seq 1 "$ROUNDS"); do
    for side in $sides; do
      b=build-gpu
      [ "$side" = base ] && b=/tmp/chi-pending-base-build
      f=$OUT/raw/coexist-$side-r$r.txt
      (cd "$b/tests" && timeout 120 ./test_gpu_coexist) >"$f" 2>&1
      note "-- $side, round $r (rc=$?)"
      grep -E '^# ' "$f" | cut -c1-160 | tee -a "$SUMMARY"
    done
  done
fi

(cd "$OUT" && tar czf pending.tgz raw && rm -rf raw)

if part soak; then
  note ""
  note "== GPU soak, 3 minutes"
  OUT=$OUT timeout 300 bash scripts/gpu-soak.sh 3 >"$OUT/soak.out" 2>&1
  note "soak rc=$?"
  grep -h "CHI_ERR_AGAIN" /tmp/chi-gpu-soak-run/logs/e*.out 2>/dev/null | cut -c1-300 | tee -a "$SUMMARY"
  grep -E "embedded (gpu->gpu|totals)|lost|PASSED|FAILED" "$OUT/soak-summary.txt" 2>/dev/null | head -8 | tee -a "$SUMMARY"
fi
note "done"

#!/usr/bin/env bash
# Issue 22's measurements on the GPU machine in one run (about 4 minutes on
# 16 cores): the CPU->CPU A/B of three engines (the one before the server,
# main before the bookkeeping fix, this tree), then an idle embedded runtime
# with a GPU under several poller settings (CPU use over 5 s, the first
# GPU->CPU task after 1 s of quiet, p50 of 20), then an idle server with 64
# connected clients.  Results go to $OUT; summary.txt has every figure.
#
#   here, once per change:  scripts/gpu-idle-ab.sh prepare
#                           (source tarballs of the A/B commits in
#                           build-abtrees/: the GPU machine gets the working
#                           tree, not the history)
#   device:  run(command="bash scripts/gpu-idle-ab.sh", carry=[".devdeps", "build-abtrees"])
#
# Environment: AB_REFS (for prepare: the commits, default "2c12edf 1c107ac
# HEAD"), AB_ROUNDS (default 5), GPU_IDLE_SETTINGS (the poller settings,
# ';'-separated, each a list of VAR=VALUE or "default"), GPU_IDLE_PARTS
# (default "probe idle ab server": the wake-up probe, the idle sweep, the
# A/B, the idle server), JOBS (default 16).
set -u -o pipefail
cd "$(dirname "$0")/.."
trees=build-abtrees

if [ "${1:-}" = prepare ]; then
  rm -rf "$trees" && mkdir -p "$trees"
  i=0
  for ref in ${AB_REFS:-2c12edf 1c107ac HEAD}; do
    i=$((i + 1))
    git archive --format=tar.gz -o "$trees/$i.tar.gz" "$ref" || exit 1
    git log -1 --format='%h %s' "$ref" >"$trees/$i.txt"
    echo "$trees/$i.tar.gz: $(cat "$trees/$i.txt" | cut -c1-100)"
  done
  exit 0
fi

OUT=${OUT:-/tmp/chi-idle-out}
mkdir -p "$OUT"
JOBS=${JOBS:-16}
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
t_start=$(date +%s)
elapsed() { echo $(( $(date +%s) - t_start )); }

note "== gpu-idle-ab on $(hostname), $(date -u +%FT%TZ), $(nproc) CPUs"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | tee -a "$SUMMARY"
. scripts/gpu-deps.sh
# The .debs' .pc files say prefix=/usr: the sysroot maps them to /opt/deps.
export PKG_CONFIG_SYSROOT_DIR=/opt/deps

# 1. The GPU build of this tree (as gpu-run.sh), only what is measured.
if ! { cmake -S . -B build-gpu -G Ninja -DCHI_ENABLE_CUDA=ON -DCHI_CUDA_ARCHITECTURES=90 \
         -DCMAKE_CUDA_STANDARD=17 -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$OUT/build.log" 2>&1 &&
       timeout 200 cmake --build build-gpu -j "$JOBS" --target chimaera-gpu-idle chimaera-bench \
         chimaera-server chimaera-wake-probe >>"$OUT/build.log" 2>&1; }; then
  note "build: FAILED; tail of build.log:"
  tail -30 "$OUT/build.log" | tee -a "$SUMMARY"
  exit 1
fi
note "build: ok ($(elapsed) s)"
PARTS=${GPU_IDLE_PARTS:-probe idle ab server}
part() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }

# 1b. What one wake-up costs here (no chimaera code): the floors under the
# idle CPU and the first task's wait.
if part probe; then
  note ""
  note "== wake-up probe (chimaera-wake-probe: timed sleep, futex, GPU interrupt via a blocking-sync event)"
  for p in 1000 100; do
    timeout 60 build-gpu/src/tools/chimaera-wake-probe --seconds 2 --period-us $p 2>&1 | tee -a "$SUMMARY"
  done
fi

# 2. Idle embedded runtime with a GPU, per poller setting.  "default" is the
# shipped configuration (the parked watcher sleeps on the GPU's bell);
# BELL_CHECK_US=0 is the watcher napping up to watch_interval_us instead;
# PARK_AFTER_US=0 is every poller napping at poll_interval_us (no parking);
# LEASE_US=0 a persistent orchestrator (no lease thread, no bell).
SETTINGS=${GPU_IDLE_SETTINGS:-"default;CHI_GPU_POLLER_BELL_CHECK_US=0;CHI_GPU_POLLER_BELL_CHECK_US=0 CHI_GPU_POLLER_WATCH_INTERVAL_US=1000;CHI_GPU_POLLER_PARK_AFTER_US=0;CHI_GPU_LEASE_US=0"}
note ""
note "== idle embedded runtime, GPU 0 (chimaera-gpu-idle --idle-s 5 --samples 20 --gap-ms 1000)"
IFS=';' read -r -a sets <<<"$SETTINGS"
part idle || sets=()
for s in "${sets[@]}"; do
  name=$(echo "$s" | tr ' =' '_-')
  envs=()
  [ "$s" = default ] || read -r -a envs <<<"$s"
  env CHI_LOG_LEVEL=${CHI_LOG_LEVEL:-debug} "${envs[@]}" timeout 90 build-gpu/src/tools/chimaera-gpu-idle --idle-s 5 --samples 20 --gap-ms 1000 \
    >"$OUT/idle-$name.txt" 2>&1
  rc=$?
  note "$s (rc=$rc): $(grep -h '^RESULT' "$OUT/idle-$name.txt" || tail -1 "$OUT/idle-$name.txt")"
  grep -h "first task\|back to back\|idle CPU\|thread \|pollers. bell" "$OUT/idle-$name.txt" | sed 's/^/    /' | tee -a "$SUMMARY"
done
note "idle sweep done ($(elapsed) s)"

# 3. CPU->CPU A/B of the prepared trees.
note ""
note "== CPU->CPU A/B (scripts/ab-bench.sh, --iters 50000, GPUs hidden)"
if ! part ab; then
  note "skipped (GPU_IDLE_PARTS)"
elif ls "$trees"/*.tar.gz >/dev/null 2>&1; then
  AB_ROUNDS=${AB_ROUNDS:-5} AB_JOBS=$JOBS AB_DIR=/tmp/chi-ab AB_OUT="$OUT/ab" \
    timeout 240 scripts/ab-bench.sh $(ls "$trees"/*.tar.gz | sort -V) >"$OUT/ab.log" 2>&1
  note "ab-bench rc=$? ($(elapsed) s):"
  sed -n '/^A: /,$p' "$OUT/ab.log" | tee -a "$SUMMARY"
else
  note "skipped: no $trees/*.tar.gz (run 'scripts/gpu-idle-ab.sh prepare' before the run)"
fi

# 4. Idle server with a GPU and 64 connected clients (idle CPU, wake-up).
note ""
note "== idle chimaera-server with 64 shm clients (chimaera-bench --server start)"
if part server; then
  timeout 120 build-gpu/src/tools/chimaera-bench --server start --transports shm --clients 64 \
    --client-ms 300 --idle-ms 4000 --wake-samples 5 --iters 5000 >"$OUT/server-idle.txt" 2>&1
  note "rc=$? ($(elapsed) s):"
  grep -h "^idle\|^wake-up\|^raw shm floor" "$OUT/server-idle.txt" | tee -a "$SUMMARY"
else
  note "skipped (GPU_IDLE_PARTS)"
fi
note "total $(elapsed) s"

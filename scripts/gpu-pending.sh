#!/usr/bin/env bash
# What the 2026-11-27 sixth session left unmeasured, in one device call
# (about 8-9 minutes on the 16-CPU GPU host; PENDING_PARTS splits it): build, `ctest -L gpu` (the
# server's default of one shm poller per CPU had not run under it), then the
# ZeroMQ pipelined rows with client_gather_us 0 (the default) against 20, in
# turns, then the shm sweep with the default configuration (least-loaded
# pollers, sampled client latencies, pollers that read no clock while they
# find work), and last the same with built-ins on the workers
# (server.inline_builtins false: each task a poller -> worker hand-off) at
# one poller per CPU against the old 4, to see whether 16 pollers take CPU
# from the workers.  Results in $OUT: summary.txt, pending.tgz with the raw
# runs.
#
#   here:   scripts/gpu-route-ab.sh prepare 7dd8e00   (the base of the sweep's
#           A/B: one poller per CPU, before the least-loaded pollers, sampled
#           client latencies and clockless passes; optional)
#   device: run(command="bash scripts/gpu-pending.sh", carry=[".devdeps", "build-abtrees"])
#
# With build-abtrees/base.tar.gz the sweep part alternates base and this
# tree, SWEEP_ROUNDS times each (default 1).
# Environment: PENDING_ROUNDS (default 2), PENDING_PARTS (default
# "build ctest gather sweep workers"; without build, build-gpu must be there).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/chi-pending-out}
mkdir -p "$OUT/raw"
SUMMARY=$OUT/summary.txt
ROUNDS=${PENDING_ROUNDS:-2}
PARTS=${PENDING_PARTS:-build ctest gather sweep workers}
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

if part gather; then
  note ""
  note "== ZeroMQ pipelined, client_gather_us 0, then 20, in turns (8 processes)"
  for r in $(seq 1 "$ROUNDS"); do
    for g in 0 20; do
      f=$OUT/raw/zmq-g$g-r$r.txt
      CHI_CLIENT_GATHER_US=$g timeout 90 build-gpu/src/tools/chimaera-bench --server start \
        --transports ipc,tcp,tcp-curve --iters 10000 --procs 8 >"$f" 2>&1
      note "gather $g, round $r (rc=$?):"
      grep -E '^client->server (ipc|tcp|tcp-curve)( pipelined 8p)? ' "$f" | cut -c1-125 | tee -a "$SUMMARY"
    done
  done
fi

if part sweep; then
  sides=new
  if [ -f build-abtrees/base.tar.gz ]; then
    # The base: its tools only (the server, the bench, chimaera-ctl).
    rm -rf /tmp/chi-pending-base && mkdir -p /tmp/chi-pending-base &&
      tar -xzf build-abtrees/base.tar.gz -C /tmp/chi-pending-base
    if PKG_CONFIG_SYSROOT_DIR=/opt/deps cmake -S /tmp/chi-pending-base -B /tmp/chi-pending-base-build -G Ninja \
         -DCHI_ENABLE_CUDA=ON -DCHI_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_STANDARD=17 -DCMAKE_BUILD_TYPE=RelWithDebInfo \
         >"$OUT/raw/base-build.log" 2>&1 &&
       cmake --build /tmp/chi-pending-base-build -j 16 --target chimaera-bench chimaera-server chimaera-ctl \
         >>"$OUT/raw/base-build.log" 2>&1; then
      sides="base new"
      note ""
      note "sweep base: $(cut -c1-100 build-abtrees/base.txt 2>/dev/null)"
    else
      note "base build FAILED (raw/base-build.log): the sweep runs on this tree only"
    fi
  fi
  for r in $(seq 1 "${SWEEP_ROUNDS:-1}"); do
    for side in $sides; do
      b=build-gpu
      [ "$side" = base ] && b=/tmp/chi-pending-base-build
      note ""
      note "== shm sweep, default configuration, $side, round $r"
      OUT=$OUT/raw/sweep-$side-$r SERVER_BENCH_TRANSPORTS=shm SERVER_BENCH_ITERS=50000 SERVER_BENCH_MS=500 \
        timeout 150 bash scripts/server-bench.sh "$b" >"$OUT/raw/sweep-$side-$r.log" 2>&1
      note "rc=$?"
      grep -E '^\| (1|8|64|256) \||^256 clients|^Idle|^\| shm' "$OUT/raw/sweep-$side-$r/server-bench.txt" 2>/dev/null |
        tee -a "$SUMMARY"
    done
  done
fi

if part workers; then
  for p in 0 4; do
    note ""
    note "== shm sweep, built-ins on the workers, server.pollers $p (0: one per CPU)"
    CHI_SERVER_INLINE_BUILTINS=false CHI_SERVER_POLLERS=$p OUT=$OUT/raw/workers-p$p SERVER_BENCH_TRANSPORTS=shm \
      SERVER_BENCH_ITERS=50000 SERVER_BENCH_MS=500 timeout 150 bash scripts/server-bench.sh build-gpu \
      >"$OUT/raw/workers-p$p.log" 2>&1
    note "rc=$?"
    grep -E '^\| (1|8|64|256) \||^256 clients|^\| shm' "$OUT/raw/workers-p$p/server-bench.txt" 2>/dev/null |
      tee -a "$SUMMARY"
  done
fi

(cd "$OUT" && tar czf pending.tgz raw && rm -rf raw)
note "done"

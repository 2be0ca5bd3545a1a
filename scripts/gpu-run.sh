#!/usr/bin/env bash
# The one script the GPU machine runs (Ubuntu 24.04, CUDA 13, cmake, ninja, no
# network, none of our Debian libraries): unpack .devdeps/*.deb into
# /opt/deps, configure and build with CUDA, run every ctest test (GPU ones
# included), gpu_timing at full length, then compute-sanitizer memcheck and
# racecheck over the GPU tests with reduced counts.  Logs go to $OUT.
#
#   here:   ../shared/tools/gpu-machine-deps        (once: fills .devdeps/)
#   device: run(command="bash scripts/gpu-run.sh", carry=[".devdeps"])
#
# Environment: GPU_RUN_STEPS (default "build test timing sanitize cputest";
# "ctestgpu": the whole `ctest -L gpu` with defaults; "breakdown": gpu_breakdown,
# where each route's time goes; "lease": the GPU-host clock offset and the
# lease's launches, step-asides and successor timing at 4 KiB (lease.txt);
# "payloads": chimaera-bench at 8, 64, 1024 and
# 4096 bytes, bench-pN.txt and bench-pN.json each, tarred)
# picks steps; GPU_RUN_JOBS (default 16); GPU_RUN_BUDGET (seconds, default
# 250): each step is bounded by what is left of it and skipped (with a note)
# when too little is, so a run under a short device lease still reports.
# Order: correctness on the GPU first, then timings, the sanitizers, and the
# CPU-only tests last (those also run on any build machine).  The summary
# comes last, so a run's tail shows it.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/chi-gpu-out}
mkdir -p "$OUT"
STEPS=${GPU_RUN_STEPS:-build test timing sanitize cputest}
JOBS=${GPU_RUN_JOBS:-16}
BUDGET=${GPU_RUN_BUDGET:-250}
BUILD=build-gpu
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
has() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }
t_start=$(date +%s)
# bound LIMIT: LIMIT, or what is left of the budget (minus a reserve) if less.
left() { echo $(( BUDGET - ($(date +%s) - t_start) )); }
bound() { local l; l=$(( $(left) - 5 )); [ "$l" -lt 1 ] && l=1; [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
enough() { [ "$(left)" -ge "$1" ] || { note "skipped: $2 (only $(left) s of the budget left)"; return 1; }; }

note "== gpu-run on $(hostname), $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$SUMMARY"

# Debian libraries (libyaml, cmocka, libzmq) the machine lacks.
. scripts/gpu-deps.sh

if has build; then
  t0=$(date +%s)
  # The .debs' .pc files say prefix=/usr: the sysroot maps them to /opt/deps
  # (for this configure only: the install test checks our own .pc file).
  # The gpu preset of CMakePresets.json: CUDA required, sm_90, RelWithDebInfo;
  # CHI_BUILD_LAB for gpu_timing and gpu_breakdown.
  if PKG_CONFIG_SYSROOT_DIR=/opt/deps cmake --preset gpu -B "$BUILD" -DCHI_BUILD_LAB=ON >"$OUT/build.log" 2>&1 &&
     timeout "$(bound 200)" cmake --build "$BUILD" -j "$JOBS" >>"$OUT/build.log" 2>&1; then
    note "build: ok ($(( $(date +%s) - t0 )) s)"
  else
    note "build: FAILED ($(( $(date +%s) - t0 )) s); tail of build.log:"
    tail -40 "$OUT/build.log" | tee -a "$SUMMARY"
    exit 1
  fi
fi

if has test; then
  # The GPU tests one at a time, each under its own bound.  gpu_timing runs
  # in the timing step (once).
  : >"$OUT/ctest.log"
  for spec in test_gpu_device_submit:120 test_gpu:150 test_gpu_orchestrator:60; do
    t=${spec%%:*} limit=$(bound ${spec##*:}) s0=$(date +%s)
    enough 20 "$t" || continue
    (cd "$BUILD" && timeout "$limit" ctest -R "^$t\$" --timeout "$limit" --output-on-failure -V) >"$OUT/$t.log" 2>&1
    note "ctest $t ($(( $(date +%s) - s0 )) s):"
    grep -E "tests passed|tests failed|\*\*\*Failed|\*\*\*Timeout|\*\*\*Skipped|Exception|SegFault|\[  (PASSED|FAILED|  SKIPPED) \]|\[  FAILED  \]|# route|# full grid|# every|# handler|release:|p50|M tasks/s" "$OUT/$t.log" | sed 's/^[0-9]*: //' | tee -a "$SUMMARY"
  done
  if enough 20 "the other GPU tests (examples)"; then
    s0=$(date +%s)
    # test_gpu_coexist at other leases: lab/lab recipe lease.
    (cd "$BUILD" && timeout "$(bound 90)" ctest -L gpu -E '^(test_gpu|test_gpu_orchestrator|gpu_timing|test_gpu_device_submit)$' \
       --timeout 60 --output-on-failure) >>"$OUT/ctest.log" 2>&1
    note "ctest, other GPU tests ($(( $(date +%s) - s0 )) s):"
    grep -E "tests passed|tests failed|\*\*\*Failed|\*\*\*Timeout|Not Run|Exception|SegFault" "$OUT/ctest.log" | tail -n 8 | tee -a "$SUMMARY"
  fi
fi

if has ctestgpu && enough 60 "ctest -L gpu"; then
  # The whole GPU label in one ctest run with default settings, as a user runs it.
  s0=$(date +%s)
  (cd "$BUILD" && timeout "$(bound 400)" ctest -L gpu --output-on-failure) >"$OUT/ctest-L-gpu.log" 2>&1
  note "ctest -L gpu, defaults ($(( $(date +%s) - s0 )) s):"
  grep -E "Test +#|tests passed|tests failed|watchdog" "$OUT/ctest-L-gpu.log" | sed 's/^ *//' | tee -a "$SUMMARY"
fi

if has breakdown && enough 60 "gpu_breakdown"; then
  t0=$(date +%s)
  LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64 \
    timeout "$(bound 150)" "$BUILD/tests/gpu_breakdown" ${GPU_RUN_BREAKDOWN_ITERS:-20000} >"$OUT/breakdown.txt" 2>&1
  note "gpu_breakdown rc=$? ($(( $(date +%s) - t0 )) s):"
  cat "$OUT/breakdown.txt" >>"$SUMMARY"
fi

if has lease && enough 70 "lease timing"; then
  # The lease's timing (docs/gpu.md, "Coexisting with other CUDA code"): the
  # GPU's and the host's clocks, then chimaera-bench at 4 KiB (routes idle
  # between tasks while its kernels check each echo) with the orchestrator's
  # launches and step-asides per GPU row and the lease thread's counters.
  t0=$(date +%s)
  LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64 \
    timeout 30 "$BUILD/tests/gpu_breakdown" 1000 2>&1 | grep "clock offset" >"$OUT/lease.txt"
  CHI_LOG_LEVEL=debug CHI_BENCH_LEASE=1 LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64 \
    timeout "$(bound 100)" "$BUILD/src/tools/chimaera-bench" --iters 20000 --warmup 2000 --tput-tasks 100000 \
    --payload 4096 --json-file "$OUT/lease.json" >>"$OUT/lease.txt" 2>&1
  note "lease timing rc=$? ($(( $(date +%s) - t0 )) s):"
  grep -E "clock offset|launches|successors|FAILED" "$OUT/lease.txt" >>"$SUMMARY"
  python3 lab/lab compare "$OUT/lease.json" 2>&1 | grep -E '^(row|gpu0->)' >>"$SUMMARY"
fi

if has payloads && enough 60 "chimaera-bench payload rows"; then
  # One chimaera-bench run per payload size (every route, latency and
  # throughput), JSON beside each table; lab/lab compare reads them.
  mkdir -p "$OUT/payloads"
  for p in ${GPU_RUN_PAYLOADS:-8 64 1024 4096}; do
    enough 40 "chimaera-bench --payload $p" || continue
    t0=$(date +%s)
    LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64 \
      timeout "$(bound 120)" "$BUILD/src/tools/chimaera-bench" --iters ${GPU_RUN_BENCH_ITERS:-20000} --warmup 2000 \
        --tput-tasks 100000 --payload "$p" --json-file "$OUT/payloads/bench-p$p.json" >"$OUT/payloads/bench-p$p.txt" 2>&1
    note "chimaera-bench --payload $p rc=$? ($(( $(date +%s) - t0 )) s):"
    python3 lab/lab compare "$OUT/payloads/bench-p$p.json" 2>&1 |
      grep -E '^(row|floor.gpu|floor.cpu_gpu|cpu->gpu0 |cpu->gpu_any pipelined x8|gpu0->)' | tee -a "$SUMMARY"
  done
  tar -C "$OUT" -czf "$OUT/payloads.tgz" payloads && rm -rf "$OUT/payloads"
fi

if has timing && enough 30 "gpu_timing"; then
  t0=$(date +%s)
  timeout "$(bound 90)" "$BUILD/tests/gpu_timing" 20000 >"$OUT/timing.log" 2>&1
  note "gpu_timing rc=$? ($(( $(date +%s) - t0 )) s):"
  cat "$OUT/timing.log" >>"$SUMMARY"
  # Short variants: waiters that nap at once (the old back-off, roughly),
  # and GPU->CPU throughput against the number of CPU poller threads.
  if enough 25 "gpu_timing CHI_GPU_WAIT_SPIN_NS=0"; then
    CHI_GPU_WAIT_SPIN_NS=0 timeout "$(bound 30)" "$BUILD/tests/gpu_timing" 5000 lat 2>&1 | grep -E "p50" |
      sed "s/^/CHI_GPU_WAIT_SPIN_NS=0: /" | tee -a "$SUMMARY" >>"$OUT/timing.log"
  fi
  # More orchestrator warps (8 polling the CPU->GPU ring, 8 GPU->GPU workers).
  if enough 25 "gpu_timing CHI_GPU_WARPS_PER_BLOCK=16"; then
    CHI_GPU_WARPS_PER_BLOCK=16 timeout "$(bound 30)" "$BUILD/tests/gpu_timing" 5000 tput 2>&1 |
      grep -E "GPU->GPU throughput|CPU->GPU throughput" |
      sed "s/^/CHI_GPU_WARPS_PER_BLOCK=16: /" | tee -a "$SUMMARY" >>"$OUT/timing.log"
  fi
  for p in 2 8; do
    enough 25 "gpu_timing CHI_GPU_POLLERS=$p" || continue
    CHI_GPU_POLLERS=$p timeout "$(bound 30)" "$BUILD/tests/gpu_timing" 5000 tput 2>&1 | grep "GPU->CPU throughput" |
      sed "s/^/CHI_GPU_POLLERS=$p: /" | tee -a "$SUMMARY" >>"$OUT/timing.log"
  done
fi

if has sanitize; then
  # compute-sanitizer serializes kernels: a test kernel launched while the
  # orchestrator runs would wait for it forever.  So only the tests whose
  # kernels run while no orchestrator does (host routes; GPU->CPU tasks while
  # paused) run under the tools; the orchestrator itself is checked in all.
  export CHI_TEST_WARPS=64 CHI_TEST_TASKS_PER_WARP=10 CHI_TEST_H2D_TASKS=64 CHI_TEST_SCALE=0.05
  : >"$OUT/sanitizer.log"
  for tool in memcheck racecheck; do
    for spec in "test_gpu:test_h2d_*" "test_gpu:test_pause_resume" "test_gpu_orchestrator:test_host_routes"; do
      t=${spec%%:*} filter=${spec#*:} s0=$(date +%s)
      enough 25 "compute-sanitizer $tool $t [$filter]" || continue
      CHI_TEST_FILTER="$filter" timeout "$(bound 60)" compute-sanitizer --tool "$tool" --error-exitcode 99 \
        --print-limit 20 "$BUILD/tests/$t" >>"$OUT/sanitizer.log" 2>&1
      rc=$?
      note "compute-sanitizer $tool $t [$filter]: rc=$rc ($(( $(date +%s) - s0 )) s)"
    done
  done
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|Race reported|PASSED|FAILED" "$OUT/sanitizer.log" | sort | uniq -c | head -30 | tee -a "$SUMMARY"
fi

if has cputest && enough 25 "CPU-only ctest tests"; then
  t0=$(date +%s)
  (cd "$BUILD" && timeout "$(bound 120)" ctest -LE gpu -j 8 --timeout 100 --output-on-failure ${GPU_RUN_CTEST_EXCLUDE:+-E "$GPU_RUN_CTEST_EXCLUDE"}) >>"$OUT/ctest.log" 2>&1
  note "ctest, CPU tests ($(( $(date +%s) - t0 )) s):"
  grep -E "tests passed|tests failed|\*\*\*Failed|\*\*\*Timeout|Not Run|Exception|SegFault" "$OUT/ctest.log" | tail -n 12 | tee -a "$SUMMARY"
fi

echo
echo "==== summary ($(( $(date +%s) - t_start )) s) ===="
cat "$SUMMARY"

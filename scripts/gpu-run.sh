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
# Environment: GPU_RUN_STEPS (default "build test timing sanitize") picks steps;
# GPU_RUN_JOBS (default 16).  The summary comes last, so a run's tail shows it.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/chi-gpu-out}
mkdir -p "$OUT"
STEPS=${GPU_RUN_STEPS:-build test timing sanitize}
JOBS=${GPU_RUN_JOBS:-16}
BUILD=build-gpu
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
has() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }
t_start=$(date +%s)

note "== gpu-run on $(hostname), $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$SUMMARY"

# Debian libraries (libyaml, cmocka, libzmq) the machine lacks.
mkdir -p /opt/deps
for f in .devdeps/*.deb; do dpkg -x "$f" /opt/deps; done
export CMAKE_PREFIX_PATH=/opt/deps/usr
export PKG_CONFIG_PATH=/opt/deps/usr/lib/x86_64-linux-gnu/pkgconfig:/opt/deps/usr/share/pkgconfig
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH

if has build; then
  t0=$(date +%s)
  # The .debs' .pc files say prefix=/usr: the sysroot maps them to /opt/deps
  # (for this configure only: the install test checks our own .pc file).
  if PKG_CONFIG_SYSROOT_DIR=/opt/deps cmake -S . -B "$BUILD" -G Ninja -DCHI_ENABLE_CUDA=ON -DCHI_CUDA_ARCHITECTURES=90 \
      -DCMAKE_CUDA_STANDARD=17 -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$OUT/build.log" 2>&1 &&
     timeout 300 cmake --build "$BUILD" -j "$JOBS" >>"$OUT/build.log" 2>&1; then
    note "build: ok ($(( $(date +%s) - t0 )) s)"
  else
    note "build: FAILED ($(( $(date +%s) - t0 )) s); tail of build.log:"
    tail -40 "$OUT/build.log" | tee -a "$SUMMARY"
    exit 1
  fi
fi

if has test; then
  t0=$(date +%s)
  # CPU tests in parallel, then the GPU tests one at a time, each under its
  # own bound (a device run has at most 10 minutes in all).
  (cd "$BUILD" && timeout 120 ctest -LE gpu -j 8 --timeout 100 --output-on-failure ${GPU_RUN_CTEST_EXCLUDE:+-E "$GPU_RUN_CTEST_EXCLUDE"}) >"$OUT/ctest.log" 2>&1
  note "ctest, CPU tests ($(( $(date +%s) - t0 )) s):"
  grep -E "tests passed|tests failed|\*\*\*Failed|\*\*\*Timeout|Not Run|Exception|SegFault" "$OUT/ctest.log" | tee -a "$SUMMARY"
  s0=$(date +%s)
  (cd "$BUILD" && timeout 90 ctest -L gpu -E '^(test_gpu|test_gpu_orchestrator|gpu_timing)$' \
     --timeout 60 --output-on-failure) >>"$OUT/ctest.log" 2>&1
  note "ctest, other GPU tests ($(( $(date +%s) - s0 )) s):"
  grep -E "tests passed|tests failed|\*\*\*Failed|\*\*\*Timeout|Not Run|Exception|SegFault" "$OUT/ctest.log" | tail -n 8 | tee -a "$SUMMARY"
  for spec in test_gpu:150 test_gpu_orchestrator:60 gpu_timing:60; do
    t=${spec%%:*} limit=${spec##*:} s0=$(date +%s)
    (cd "$BUILD" && timeout "$limit" ctest -R "^$t\$" --timeout "$limit" --output-on-failure -V) >"$OUT/$t.log" 2>&1
    note "ctest $t ($(( $(date +%s) - s0 )) s):"
    grep -E "tests passed|tests failed|\*\*\*Failed|\*\*\*Timeout|\*\*\*Skipped|Exception|SegFault|\[  (PASSED|FAILED|  SKIPPED) \]|\[  FAILED  \]|# route|p50|M tasks/s" "$OUT/$t.log" | sed 's/^[0-9]*: //' | tee -a "$SUMMARY"
  done
fi

if has timing; then
  t0=$(date +%s)
  timeout 90 "$BUILD/tests/gpu_timing" 100000 >"$OUT/timing.log" 2>&1
  note "gpu_timing rc=$? ($(( $(date +%s) - t0 )) s):"
  cat "$OUT/timing.log" >>"$SUMMARY"
  # GPU->CPU throughput against the number of CPU poller threads per GPU.
  for p in 4 8; do
    CHI_GPU_POLLERS=$p timeout 60 "$BUILD/tests/gpu_timing" 20000 2>&1 | grep "GPU->CPU throughput" |
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
      CHI_TEST_FILTER="$filter" timeout 60 compute-sanitizer --tool "$tool" --error-exitcode 99 \
        --print-limit 20 "$BUILD/tests/$t" >>"$OUT/sanitizer.log" 2>&1
      rc=$?
      note "compute-sanitizer $tool $t [$filter]: rc=$rc ($(( $(date +%s) - s0 )) s)"
    done
  done
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|Race reported|PASSED|FAILED" "$OUT/sanitizer.log" | sort | uniq -c | head -30 | tee -a "$SUMMARY"
fi

echo
echo "==== summary ($(( $(date +%s) - t_start )) s) ===="
cat "$SUMMARY"

#!/usr/bin/env bash
# gpu-lease.sh: what the GPU machine runs to check and measure the leased
# orchestrator (gpu.lease_us, docs/gpu.md "Coexisting with other CUDA code"):
# builds the library, the GPU tests and chimaera-bench with CUDA, runs
# test_gpu and test_gpu_orchestrator (nothing regressed), test_gpu_coexist at
# several leases (and, bounded, with no lease: the hang it replaces), then
# chimaera-bench and gpu_timing with and without the lease.  Logs in $OUT
# (at most 8 files), summary last.
#
#   device: run(command="bash scripts/gpu-lease.sh", carry=[".devdeps"])
#
# Environment: LEASES (default "1000 500 250"), BENCH_ITERS (default 20000),
# BENCH_LEASES (leases chimaera-bench runs at, default "0 1000"),
# LEASE_STEPS (default "build test coexist hang bench").
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/chi-lease-out}
mkdir -p "$OUT"
LEASES=${LEASES:-1000 500 250}
ITERS=${BENCH_ITERS:-20000}
BENCH_LEASES=${BENCH_LEASES:-0 1000}
STEPS=${LEASE_STEPS:-build test coexist hang bench}
BUILD=build-gpu
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
has() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }
t_start=$(date +%s)

note "== gpu-lease on $(hostname), $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1 | tee -a "$SUMMARY"

. scripts/gpu-deps.sh

if has build; then
  t0=$(date +%s)
  if PKG_CONFIG_SYSROOT_DIR=/opt/deps cmake -S . -B "$BUILD" -G Ninja -DCHI_ENABLE_CUDA=ON \
      -DCHI_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_STANDARD=17 -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      >"$OUT/build.log" 2>&1 &&
     timeout 300 cmake --build "$BUILD" -j 16 --target chimaera test_gpu test_gpu_orchestrator \
       test_gpu_coexist gpu_timing chimaera-bench >>"$OUT/build.log" 2>&1; then
    note "build: ok ($(( $(date +%s) - t0 )) s)"
  else
    note "build: FAILED; tail of build.log:"
    tail -30 "$OUT/build.log" | tee -a "$SUMMARY"
    exit 1
  fi
fi

T=$BUILD/tests
if has test; then
  for spec in test_gpu:150 test_gpu_orchestrator:60; do
    t=${spec%%:*} limit=${spec##*:} s0=$(date +%s)
    timeout -k 5 "$limit" "$T/$t" >"$OUT/$t.log" 2>&1
    note "$t: rc=$? ($(( $(date +%s) - s0 )) s)"
    grep -E "PASSED|FAILED|SKIPPED" "$OUT/$t.log" | tee -a "$SUMMARY"
  done
fi

if has coexist; then
  for lease in $LEASES; do
    s0=$(date +%s)
    CHI_TEST_LEASE_US=$lease timeout -k 5 60 "$T/test_gpu_coexist" >"$OUT/coexist-$lease.log" 2>&1
    note "test_gpu_coexist, gpu.lease_us $lease: rc=$? ($(( $(date +%s) - s0 )) s)"
    grep -E "^# |PASSED|FAILED|ERROR|error" "$OUT/coexist-$lease.log" | tee -a "$SUMMARY"
  done
fi

if has hang; then
  # No lease: the persistent kernel of before.  Expected: the first device-wide
  # call never returns (killed by the bound).
  s0=$(date +%s)
  CHI_TEST_LEASE_US=0 CHI_TEST_FILTER=test_device_wide_idle timeout -k 5 6 "$T/test_gpu_coexist" \
    >"$OUT/coexist-0.log" 2>&1
  note "test_gpu_coexist [device_wide_idle], gpu.lease_us 0: rc=$? ($(( $(date +%s) - s0 )) s; 124: still blocked after 6 s)"
fi

if has bench; then
  : >"$OUT/bench.log"
  for lease in 0 $LEASES; do
    s0=$(date +%s)
    case " $BENCH_LEASES " in *" $lease "*)
      echo "==== chimaera-bench --iters $ITERS, CHI_GPU_LEASE_US=$lease" >>"$OUT/bench.log"
      CHI_GPU_LEASE_US=$lease timeout -k 5 100 "$BUILD/src/tools/chimaera-bench" --iters "$ITERS" \
        >>"$OUT/bench.log" 2>&1
      note "chimaera-bench, gpu.lease_us $lease: rc=$? ($(( $(date +%s) - s0 )) s)" ;;
    esac
    echo "==== gpu_timing 20000 lat, CHI_GPU_LEASE_US=$lease" >>"$OUT/bench.log"
    CHI_GPU_LEASE_US=$lease timeout -k 5 60 "$T/gpu_timing" 20000 >>"$OUT/bench.log" 2>&1
    note "gpu_timing, gpu.lease_us $lease: rc=$?"
  done
  grep -E "^====|GPU|gpu|floor|peer" "$OUT/bench.log" | tee -a "$SUMMARY"
fi

echo
echo "==== summary ($(( $(date +%s) - t_start )) s) ===="
cat "$SUMMARY"

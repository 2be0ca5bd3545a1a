#!/usr/bin/env bash
# Builds chimaera with the HIP backend (-DCHI_ENABLE_HIP=ON) using Debian's
# hipcc and libamdhip64-dev (ROCm 5.2), then runs that tree's GPU and HIP
# tests: libchimaera.so with the HIP runtime and the library's kernels for
# HIP_ARCH (default gfx90a), the GPU test programs and the CUDA examples
# compiled by hipcc.  No AMD GPU is needed: without one the GPU programs exit
# 77 (skipped) and test_hip_backend checks that GPU routes answer
# CHI_ERR_NO_DEVICE.  On a machine with an AMD GPU the same command runs them.
#   scripts/hip-check.sh [BUILD_DIR]   default build-hip; exit 77 without hipcc
# JOBS (default 2) sets the build's parallelism.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=${1:-$root/build-hip}
ARCH=${HIP_ARCH:-gfx90a}
command -v hipcc >/dev/null || { echo "hip-check: hipcc not found (apt-get install -y hipcc libamdhip64-dev)"; exit 77; }
[ -e /usr/include/hip/hip_runtime_api.h ] ||
  { echo "hip-check: HIP headers not found (apt-get install -y libamdhip64-dev)"; exit 77; }
start=$(date +%s)
# CHI_BUILD_LAB: gpu_timing keeps compiling through hipcc too.
(cd "$root" && cmake --preset hip -B "$dir" -DCHI_HIP_ARCHITECTURES="$ARCH" -DCHI_BUILD_LAB=ON >/dev/null)
cmake --build "$dir" -j"${JOBS:-2}"
echo "hip-check: built $dir in $(( $(date +%s) - start )) s"
# The rest of the tree's tests are the main build's: same sources, no GPU.
ctest --test-dir "$dir" --output-on-failure -L 'gpu|hip'

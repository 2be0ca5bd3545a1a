#!/usr/bin/env bash
# Compile-checks chimaera's device header and the gpu/ sources for AMD GPUs
# with Debian's hipcc (ROCm 5.2; `apt-get install -y hipcc`).  Nothing runs:
# no AMD GPU is needed.  Every file is compiled for HIP_ARCH (default gfx90a)
# with device code generated, so the __hip_atomic_* scopes and the LL loads
# of include/chimaera/gpu_port.h are checked too.
#   scripts/hip-check.sh            exit 0: everything compiles
set -eu
cd "$(dirname "$0")/.."
HIPCC=${HIPCC:-hipcc}
ARCH=${HIP_ARCH:-gfx90a}
command -v "$HIPCC" >/dev/null || { echo "hip-check: $HIPCC not found (apt-get install -y hipcc)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/chimaera"
printf '#define CHI_HAVE_CUDA 0\n#define CHI_HAVE_HIP 1\n' >"$tmp/chimaera/config.h"
# hipcc asks rocm_agent_enumerator for the GPUs present unless told the target.
export HCC_AMDGPU_TARGET=$ARCH
flags=(-std=c++17 -x hip --offload-arch="$ARCH" -O2 -Wall -Wno-unused-command-line-argument
       -I include -I "$tmp" -I src -I . -DCHI_BUILDING_LIBRARY)
fail=0
for f in tests/gpu/device_api_check.cu gpu/kernels.cu gpu/gpu_system.cpp gpu/gpu_device.cpp \
         gpu/h2d_executor.cpp gpu/cpu_poller.cpp gpu/shape.cpp; do
  if "$HIPCC" "${flags[@]}" -c "$f" -o "$tmp/out.o" 2>"$tmp/err"; then
    echo "hip-check: ok      $f"
  else
    echo "hip-check: FAILED  $f"
    sed 's/^/    /' "$tmp/err" | head -40
    fail=1
  fi
done
exit $fail

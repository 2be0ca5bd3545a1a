#!/usr/bin/env bash
cd "$(dirname "$0")/.."
. scripts/gpu-deps.sh >/dev/null 2>&1
B=/tmp/exp-build
PKG_CONFIG_SYSROOT_DIR=/opt/deps cmake -S . -B $B -G Ninja -DCHI_ENABLE_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/tmp/exp-cfg.log 2>&1 || { tail -20 /tmp/exp-cfg.log; exit 1; }
cmake --build $B -j16 --target chimaera >/tmp/exp-build.log 2>&1 || { tail -20 /tmp/exp-build.log; exit 1; }
gcc -O2 -Iinclude -I$B/include exp/prof_driver.c -o /tmp/prof_driver -L$B -lchimaera -lpthread -Wl,-rpath,$B || exit 1
for r in 1 2; do
for v in "CHI_EXP_OLDPASS=1" "CHI_EXP_X=0" "CHI_EXP_SCAN1=1" "CHI_EXP_SCAN1=1 CHI_WORKER_POP_BATCH=8" "CHI_WORKERS=8"; do
  echo "== $v"
  env CHI_EXP_PROF=1 CHI_GPU_DEVICES=0 $v /tmp/prof_driver 16 4000000 2>&1 | grep -E "threads|pop_ok|pass_wake|notify|queue"
done
done

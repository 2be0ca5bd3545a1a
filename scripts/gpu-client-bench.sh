#!/usr/bin/env bash
# gpu-client-bench.sh: chimaera-bench --server with client-kernel rows on the
# GPU machine, after `GPU_RUN_STEPS=build bash scripts/gpu-run.sh` built
# build-gpu: a started server without MPS, then under MPS (scripts/mps.sh,
# private pipe directory), then the refusals (a server that drives no GPU:
# CHI_ERR_NO_DEVICE; one whose CUDA device order differs: CHI_ERR_INVALID),
# and bench_smoke.  Tables and JSON in $OUT/h20.tgz, the GPU rows on stdout.
#
#   device: run(command="GPU_RUN_STEPS=build bash scripts/gpu-run.sh && bash scripts/gpu-client-bench.sh",
#               carry=[".devdeps"])
set -u
OUT=${OUT:-/tmp/chi-client-bench}
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=build-gpu/src/tools
D=$OUT/h20
mkdir -p "$D"
up() { for _ in $(seq 150); do $B/chimaera-ctl --address "$1" ping >/dev/null 2>&1 && return; sleep 0.1; done; }
S="--server start --transports shm --iters 20000 --procs 2"
timeout -k 5 90 $B/chimaera-bench $S --json-file "$D/nomps.json" >"$D/nomps.txt" 2>&1
echo "nomps rc=$?"
if M=$(bash scripts/mps.sh start "$D/mps"); then
  eval "$M"
  timeout -k 5 90 $B/chimaera-bench $S --json-file "$D/mps.json" >"$D/mps.txt" 2>&1
  echo "mps rc=$?"
  bash scripts/mps.sh stop "$D/mps" >/dev/null
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
fi
CHI_GPU_DEVICES=0 $B/chimaera-server --listen shm://h20-nogpu >"$D/srv-nogpu.log" 2>&1 &
P=$!
up shm://h20-nogpu
timeout -k 5 45 $B/chimaera-bench --server shm://h20-nogpu --iters 2000 --procs 1 >"$D/nogpu.txt" 2>&1
echo "nogpu rc=$? (1 expected)"
kill $P; wait $P
CUDA_DEVICE_ORDER=PCI_BUS_ID $B/chimaera-server --listen shm://h20-order >"$D/srv-order.log" 2>&1 &
P=$!
up shm://h20-order
timeout -k 5 45 $B/chimaera-bench --server shm://h20-order --iters 2000 --procs 1 >"$D/order.txt" 2>&1
echo "order rc=$? (1 expected)"
kill $P; wait $P
(cd build-gpu && timeout -k 5 120 ctest -R bench_smoke --output-on-failure >"$D/smoke.txt" 2>&1; echo "smoke rc=$?")
grep -hE 'gpu|FAILED|budget' "$D"/nomps.txt "$D"/mps.txt "$D"/nogpu.txt "$D"/order.txt 2>/dev/null | cut -c1-150
tar -C "$OUT" -czf "$OUT/h20.tgz" --exclude='h20/mps/pipe' h20 && rm -rf "$D"

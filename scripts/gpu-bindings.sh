#!/usr/bin/env bash
# Runs the Rust and Fortran binding tests and the Fortran heat example on the
# GPU machine, which has neither cargo nor gfortran: build them here against a
# CUDA build of the library, carry the binaries, run them there.  The client
# GPU tests (rust_gpu_client, fortran_gpu_client: kernels of a client process
# that submit to a chimaera-server, bindings/tests/client_kernel.cu) run
# against a server on a private shm:// address that drives every GPU
# (tests/run_with_server.sh); there a skip is a failure (CHI_TEST_REQUIRE_GPU=1).
#   here:   scripts/gpu-bindings.sh prepare      (fills .rustgpu/bin and .rustgpu/lib)
#   there:  scripts/gpu-bindings.sh run          (device tool: carry .devdeps,
#                                                 .rustgpu/bin and .rustgpu/lib)
set -euo pipefail
cd "$(dirname "$0")/.."
out=.rustgpu
case "${1:-}" in
prepare)
  grep -qxF "/$out/" .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo "/$out/" >>.git/info/exclude; }
  build=build-bindings-gpu
  cmake -S . -B $build -G Ninja -DCHI_ENABLE_CUDA=ON -DCHI_FORTRAN=ON -DCHI_RUST=OFF \
    -DCHI_BUILD_TOOLS=ON >/dev/null
  # What is carried, nothing more (the tools are here for the server and ctl only).
  cmake --build $build -j2 --target chimaera chimaera_fortran fortran_basic fortran_mixed heat_fortran \
    chimaera-server chimaera-ctl chi_bindings_client_kernel fortran_gpu_client
  (cd bindings/rust && CHIMAERA_LIB_DIR="$PWD/../../$build" CARGO_TARGET_DIR="$PWD/../../$out/target" \
    cargo test --offline --release --no-run)
  rm -rf $out/bin $out/lib
  mkdir -p $out/bin $out/lib
  for t in cpu errors gpu threads gpu_client; do
    cp "$(ls -t $out/target/release/deps/$t-* | grep -v '\.d$' | head -1)" $out/bin/rust_$t
  done
  cp $build/bindings/fortran/fortran_basic $build/bindings/fortran/fortran_mixed \
    $build/bindings/fortran/fortran_gpu_client $build/examples/fortran/heat \
    $build/src/tools/chimaera-server $build/src/tools/chimaera-ctl $out/bin/
  cp -a $build/libchimaera.so* $build/bindings/fortran/libchimaera_fortran.so* \
    $build/bindings/libchi_bindings_client_kernel.so $out/lib/
  for l in libgfortran.so.5 libquadmath.so.0; do cp -L "/usr/lib/x86_64-linux-gnu/$l" $out/lib/; done
  du -sh $out/bin $out/lib
  ;;
run)
  mkdir -p /opt/deps
  for f in .devdeps/*.deb; do dpkg -x "$f" /opt/deps; done
  export LD_LIBRARY_PATH=$PWD/$out/lib:/opt/deps/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
  export CUDA_MODULE_LOADING=EAGER
  status=0
  for t in rust_gpu rust_cpu rust_errors rust_threads; do
    echo "== $t"
    timeout 90 $out/bin/$t --test-threads=1 2>&1 | tail -3 || status=1
  done
  for t in fortran_basic fortran_mixed; do
    echo "== $t"
    timeout 60 $out/bin/$t 2>&1 | tail -2 || status=1
  done
  echo "== heat (512x512, 200 sweeps)"
  timeout 120 $out/bin/heat 2>&1 | tail -6 || status=1
  # Client kernels: each against its own server, which drives every GPU.
  with_server() { CHI_TEST_SERVER_GPUS=-1 CHI_TEST_REQUIRE_GPU=1 timeout 240 \
    sh tests/run_with_server.sh $out/bin/chimaera-server $out/bin/chimaera-ctl "$@"; }
  echo "== rust_gpu_client"
  with_server env CHI_TEST_CLIENT_KERNEL="$PWD/$out/lib/libchi_bindings_client_kernel.so" \
    $out/bin/rust_gpu_client --test-threads=1 --nocapture 2>&1 | grep -vE '^(running |note: |$)' || status=1
  echo "== fortran_gpu_client"
  with_server $out/bin/fortran_gpu_client 2>&1 | tail -4 || status=1
  exit $status
  ;;
*)
  echo "usage: $0 prepare|run" >&2
  exit 2
  ;;
esac

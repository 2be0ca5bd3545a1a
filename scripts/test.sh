#!/usr/bin/env bash
# Quick start, command 2: set up, build, and run every test suite: the main
# build's ctest (C, Rust, Fortran, install, HIP compile check, GPU programs skipped without a
# GPU), then the ThreadSanitizer and AddressSanitizer+UBSan builds of the
# core tests.  CHI_SANITIZERS=0 skips the sanitizer builds.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/setup.sh"

status=0
ctest --test-dir "$build" --output-on-failure -j2 || status=1

if [ "${CHI_SANITIZERS:-1}" != 0 ]; then
  for san in thread address; do
    sbuild="$build-$san"
    echo "== $san sanitizer build ($sbuild)"
    cmake -S "$root" -B "$sbuild" -G Ninja -DCHI_SANITIZE=$san -DCHI_ENABLE_CUDA=OFF \
      -DCHI_FORTRAN=OFF -DCHI_RUST=OFF -DCHI_BUILD_EXAMPLES=OFF >/dev/null
    cmake --build "$sbuild" -j2
    # Sanitized programs run ~10x slower: the tests scale their loops down.
    CHI_TEST_SCALE=0.1 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
      ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" UBSAN_OPTIONS="print_stacktrace=1" \
      ctest --test-dir "$sbuild" --output-on-failure -j2 -E 'install|smoke|hip' || status=1
  done
fi
exit $status

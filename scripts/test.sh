#!/usr/bin/env bash
# Quick start, command 2: set up (every package the tests use), build
# everything (the lab's programs too: -DCHI_BUILD_LAB=ON), and run every
# test suite: the main
# build's ctest (C, Rust, Fortran, install, GPU programs skipped without a
# GPU), then the HIP build (scripts/hip-check.sh: library, GPU tests and
# examples through Debian's hipcc; skipped without an AMD GPU), then the
# library with the round-trip trace (the cpu-trace preset) and test_trace,
# then the ThreadSanitizer and AddressSanitizer+UBSan builds of the core and
# server tests, then short libFuzzer runs when clang is present.
# CHI_HIP=0 skips the HIP build, CHI_TRACE=0 the trace build,
# CHI_SANITIZERS=0 the sanitizer builds, CHI_FUZZ=0 the fuzz runs.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/setup.sh"

# The toolchains this run builds and tests with (docs/toolchains.md).
toolchains() {
  local cache=$build/CMakeCache.txt v
  cachevar() { sed -n "s/^$1:[A-Z]*=//p" "$cache" | head -1; }
  rustc_of() { # the rustc beside a cargo, as bindings/rust/CMakeLists.txt uses it
    local d; d=$(dirname "$1")
    if [ -x "$d/rustc" ]; then "$d/rustc" --version 2>/dev/null; else rustc --version 2>/dev/null; fi
  }
  echo "== toolchains"
  echo "  C++:     $("$(cachevar CMAKE_CXX_COMPILER)" --version | head -1)"
  echo "  CMake:   $(cmake --version | head -1)"
  echo "  libzmq:  $(pkg-config --modversion libzmq)   libyaml: $(pkg-config --modversion yaml-0.1)"
  v=$(cachevar CMAKE_Fortran_COMPILER)
  echo "  Fortran: $([ -n "$v" ] && "$v" --version | head -1 || echo none)"
  v=$(cachevar CMAKE_CUDA_COMPILER)
  echo "  CUDA:    $([ -n "$v" ] && [ -x "$v" ] && "$v" --version | tail -1 || echo "none (no nvcc: CUDA backend not built)")"
  v=$(cachevar CHI_CARGO)
  echo "  Rust:    $([ -n "$v" ] && [ -x "$v" ] && echo "$v: $(rustc_of "$v")" || echo "none (no cargo)")"
  v=$(cachevar CHI_CARGO_DEBIAN)
  if [ -n "$v" ] && [ -x "$v" ] && ctest --test-dir "$build" -N -R '^rust_cargo_test_debian$' | grep rust_cargo_test_debian >/dev/null; then
    echo "           and $v: $(rustc_of "$v") (rust_cargo_test_debian)"
  fi
  echo "  HIP:     $(command -v hipcc >/dev/null && echo "hipcc $(dpkg-query -W -f='${Version}' hipcc 2>/dev/null)" || echo none)"
  echo "  clang:   $(command -v clang++ >/dev/null && clang++ --version | head -1 || echo "none (no fuzz runs)")"
}
toolchains || true

status=0
ctest --test-dir "$build" --output-on-failure -j2 || status=1

# HIP backend: built on its own (about 2 minutes at -j2 on 2 cores), after the
# main tests so that it does not slow their timing-sensitive runs.
if [ "${CHI_HIP:-1}" != 0 ]; then
  echo "== HIP build ($build-hip)"
  hip_rc=0
  "$root/scripts/hip-check.sh" "$build-hip" || hip_rc=$?
  [ $hip_rc -eq 0 ] || [ $hip_rc -eq 77 ] || status=1
fi

# The round-trip trace (-DCHI_TRACE=ON, off in every other build): only the
# library and test_trace, so that the trace keeps compiling and stamping.
if [ "${CHI_TRACE:-1}" != 0 ]; then
  tbuild="$build-trace"
  echo "== trace build ($tbuild)"
  (cd "$root" && cmake --preset cpu-trace -B "$tbuild" >/dev/null)
  cmake --build "$tbuild" -j2 --target test_trace
  ctest --test-dir "$tbuild" --output-on-failure -R '^test_trace$' || status=1
fi

if [ "${CHI_SANITIZERS:-1}" != 0 ]; then
  for san in thread address; do
    sbuild="$build-$san"
    echo "== $san sanitizer build ($sbuild)"
    # The cpu-tsan and cpu-asan presets: CPU only, no examples or bindings.
    (cd "$root" && cmake --preset "cpu-${san:0:1}san" -B "$sbuild" >/dev/null)
    cmake --build "$sbuild" -j2
    # Sanitized programs run ~10x slower: the tests scale their loops down.
    CHI_TEST_SCALE=0.1 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$root/tests/tsan.supp" \
      ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" LSAN_OPTIONS="suppressions=$root/tests/lsan.supp" \
      UBSAN_OPTIONS="print_stacktrace=1" \
      ctest --test-dir "$sbuild" --output-on-failure -j2 -E 'install|smoke|hip' || status=1
  done
fi
# Short fuzz runs (~30 s a target) when clang with libFuzzer is there;
# docs/reliability.md has the long runs.
if command -v clang++ >/dev/null 2>&1 && [ "${CHI_FUZZ:-1}" != 0 ]; then
  fbuild="$build-fuzz"
  echo "== fuzz targets ($fbuild)"
  cmake -S "$root" -B "$fbuild" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DCHI_FUZZ=ON -DCHI_FUZZ_SECONDS="${CHI_FUZZ_SECONDS:-30}" -DCHI_ENABLE_CUDA=OFF -DCHI_BUILD_TESTS=OFF \
    -DCHI_BUILD_TOOLS=OFF -DCHI_BUILD_EXAMPLES=OFF -DCHI_FORTRAN=OFF -DCHI_RUST=OFF >/dev/null
  cmake --build "$fbuild" -j2
  ctest --test-dir "$fbuild" --output-on-failure -L fuzz || status=1
fi
exit $status

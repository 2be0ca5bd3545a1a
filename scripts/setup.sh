#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks, then configures (the `default`
# preset of CMakePresets.json: CUDA when nvcc is found) and builds chimaera
# into build/ (BUILD_DIR overrides; CHI_CMAKE_ARGS adds cmake options).
# Sourced by demo.sh and test.sh.  CHI_SETUP=demo installs only what the
# library and chimaera-demo need and builds only that target; the default,
# CHI_SETUP=all, installs the test, binding and fuzz tools too and builds
# everything.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build}
setup=${CHI_SETUP:-all}

need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
# The library: a C++20 compiler, CMake and Ninja, libyaml and libzmq.
pkgs=(cmake ninja-build g++ pkg-config libyaml-dev libzmq3-dev)
if [ "$setup" = demo ]; then
  # Tests, examples and bindings stay off until test.sh turns them on.
  flags=(-DCHI_BUILD_TESTS=OFF -DCHI_BUILD_EXAMPLES=OFF -DCHI_FORTRAN=OFF -DCHI_RUST=OFF)
  targets=(--target chimaera-demo)
else
  # cargo: Debian's (rustc 1.63), the oldest Rust the crates support, always;
  # where ~/.cargo has a newer one, ctest runs the Rust suite with both
  # (rust_cargo_test, rust_cargo_test_debian).  docs/toolchains.md lists the
  # versions.
  pkgs+=(libcmocka-dev jq clang libclang-rt-14-dev gfortran bindgen gnuplot-nox python3 iproute2 hipcc libamdhip64-dev cargo)
  # CHI_BUILD_LAB: the lab's measurement programs build here, so that they
  # keep compiling; none of them is installed or run by the tests.
  flags=(-DCHI_BUILD_TESTS=ON -DCHI_BUILD_EXAMPLES=ON -DCHI_FORTRAN=AUTO -DCHI_RUST=AUTO -DCHI_BUILD_LAB=ON)
  targets=()
fi
for p in "${pkgs[@]}"; do
  have_pkg "$p" || need+=("$p")
done
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need[@]}" >/dev/null
fi

(cd "$root" && cmake --preset default -B "$build" "${flags[@]}" ${CHI_CMAKE_ARGS:-} >/dev/null)
cmake --build "$build" -j2 "${targets[@]}"

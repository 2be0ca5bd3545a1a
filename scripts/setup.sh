#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks, then configures and builds
# chimaera into build/ (BUILD_DIR overrides).  Sourced by demo.sh and test.sh.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build}

need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
# cargo: Debian's (rustc 1.63), the oldest Rust the crates support, always;
# where ~/.cargo has a newer one, ctest runs the Rust suite with both
# (rust_cargo_test, rust_cargo_test_debian).  docs/toolchains.md lists the
# versions.
for p in cmake ninja-build g++ pkg-config libyaml-dev libcmocka-dev libzmq3-dev jq clang libclang-rt-14-dev gfortran bindgen gnuplot-nox python3 iproute2 hipcc libamdhip64-dev cargo; do
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

cmake -S "$root" -B "$build" -G Ninja ${CHI_CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j2

#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks, then configures and builds
# chimaera into build/ (BUILD_DIR overrides).  Sourced by demo.sh and test.sh.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build}

need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for p in cmake ninja-build g++ pkg-config libyaml-dev libcmocka-dev libzmq3-dev jq clang libclang-rt-14-dev gfortran bindgen gnuplot-nox python3 hipcc libamdhip64-dev; do
  have_pkg "$p" || need+=("$p")
done
# Rust: the machine's toolchain if there is one, else Debian's.
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
command -v cargo >/dev/null 2>&1 || need+=(cargo)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need[@]}" >/dev/null
fi

cmake -S "$root" -B "$build" -G Ninja ${CHI_CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j2

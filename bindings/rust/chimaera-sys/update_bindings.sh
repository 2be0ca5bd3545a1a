#!/bin/sh
# Regenerates src/bindings.rs from include/chimaera.h with Debian's bindgen CLI.
#
#   update_bindings.sh [OUTPUT] [--no-rustfmt]
#
# OUTPUT defaults to src/bindings.rs next to this script.  The output does not
# depend on the build: chimaera/config.h (CHI_HAVE_CUDA/HIP) is replaced by a
# neutral copy in a temporary directory and its macros are blocklisted, and
# chimaera/version.h is written there from project(VERSION).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
out=$here/src/bindings.rs
fmt=
for arg in "$@"; do
  case $arg in
    --no-rustfmt) fmt=--no-rustfmt-bindings ;;
    *) out=$arg ;;
  esac
done

command -v bindgen >/dev/null 2>&1 || { echo "update_bindings.sh: bindgen not found" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/chimaera"
printf '#define CHI_HAVE_CUDA 0\n#define CHI_HAVE_HIP 0\n' >"$tmp/chimaera/config.h"
# chimaera/version.h is generated too (cmake/version.h.in): the same macros,
# from project(VERSION) in CMakeLists.txt.
ver=$(sed -n 's/^project(chimaera VERSION \([0-9]*\)\.\([0-9]*\)\.\([0-9]*\).*/\1 \2 \3/p' "$root/CMakeLists.txt")
[ -n "$ver" ] || { echo "update_bindings.sh: no project(chimaera VERSION x.y.z) in CMakeLists.txt" >&2; exit 1; }
set -- $ver
printf '#define CHI_VERSION_MAJOR %s\n#define CHI_VERSION_MINOR %s\n#define CHI_VERSION_PATCH %s\n' \
  "$1" "$2" "$3" >"$tmp/chimaera/version.h"

# size_t is usize on every target Rust supports; signed macro constants match
# chi_status_t and chi_route_t (i32).  Function-like and cast macros
# (CHI_ROUTE_GPU, CHI_METHOD_*) are not translated: src/lib.rs spells them out.
bindgen "$root/include/chimaera.h" \
  --size_t-is-usize \
  --default-macro-constant-type signed \
  --allowlist-function 'chi_.*' \
  --allowlist-type 'chi_.*' \
  --allowlist-var 'CHI_.*' \
  --blocklist-item 'CHI_HAVE_.*' \
  $fmt \
  --output "$tmp/bindings.rs" \
  -- -I"$root/include" -I"$tmp"
mv "$tmp/bindings.rs" "$out"

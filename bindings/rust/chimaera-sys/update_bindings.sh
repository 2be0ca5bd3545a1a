#!/bin/sh
# Regenerates src/bindings.rs from include/chimaera.h with Debian's bindgen CLI.
#
#   update_bindings.sh [OUTPUT] [--no-rustfmt]
#
# OUTPUT defaults to src/bindings.rs next to this script.  The output does not
# depend on the build: chimaera/config.h (CHI_HAVE_CUDA/HIP) is replaced by a
# neutral copy in a temporary directory and its macros are blocklisted.
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

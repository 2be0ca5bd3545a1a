#!/bin/sh
# Installs a built chimaera into a scratch prefix and checks what a user gets:
# the exported symbols and soname of the library, a consumer built through
# pkg-config and one built through find_package(chimaera), both running on
# the installed library.
#
# usage: run_install_test.sh BUILD_DIR WORK_DIR CC CXX CMAKE GENERATOR [FLAGS]
#   FLAGS: extra compile and link flags for the consumers (the sanitizer
#   flags of a sanitizer build, whose library needs the sanitizer runtime).
set -eu

if [ $# -lt 6 ]; then
  echo "usage: $0 BUILD_DIR WORK_DIR CC CXX CMAKE GENERATOR [FLAGS]" >&2
  exit 2
fi
build=$1
work=$2
cc=$3
cxx=$4
cmake=$5
generator=$6
flags=${7:-}
here=$(cd "$(dirname "$0")" && pwd)

fail() {
  echo "test_install: FAIL: $*" >&2
  exit 1
}

rm -rf "$work"
mkdir -p "$work"
prefix=$(cd "$work" && pwd)/prefix

echo "== cmake --install $build --prefix $prefix"
"$cmake" --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1 ||
  { cat "$work/install.log" >&2; fail "cmake --install failed"; }

# GNUInstallDirs may have chosen lib, lib64 or lib/<multiarch>.
lib=$(find "$prefix" -name 'libchimaera.so.*.*' -type f | head -n 1)
[ -n "$lib" ] || fail "no libchimaera.so.X.Y installed under $prefix"
libdir=$(dirname "$lib")
echo "library: $lib"
[ -L "$libdir/libchimaera.so" ] || fail "no libchimaera.so link (for -lchimaera)"
[ -e "$libdir/libchimaera.so.0" ] || fail "no libchimaera.so.0 link (the soname)"
[ -f "$prefix/include/chimaera.h" ] || fail "chimaera.h not installed"
[ -f "$prefix/include/chimaera/config.h" ] || fail "chimaera/config.h not installed"
[ -f "$prefix/include/chimaera/version.h" ] || fail "chimaera/version.h not installed"
[ -f "$libdir/pkgconfig/chimaera.pc" ] || fail "chimaera.pc not in $libdir/pkgconfig"
[ -f "$libdir/cmake/chimaera/chimaera-config.cmake" ] || fail "no CMake package config"

echo "== soname"
soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')
[ "$soname" = "libchimaera.so.0" ] || fail "soname is '$soname', want libchimaera.so.0"

echo "== exported symbols"
# Names without their @VERSION suffix; the version node itself (an absolute
# symbol such as CHIMAERA_0.1) is the one non-chi_ name allowed.
nm -D --defined-only "$lib" | awk '{ print $NF }' | sed 's/@.*//' | sort -u >"$work/exports.txt"
stray=$(grep -v -e '^chi_' -e '^CHIMAERA_[0-9][0-9.]*$' "$work/exports.txt" || true)
[ -z "$stray" ] || fail "exported symbols outside chi_*: $(echo $stray)"
nm -D --defined-only "$lib" | grep -q 'chi_init@@CHIMAERA_' ||
  fail "chi_init is not versioned by the linker script"
# Every function the header declares is there.
missing=""
for fn in $(sed -n 's/^CHI_API .*[ *]\(chi_[a-z0-9_]*\)(.*/\1/p' "$prefix/include/chimaera.h"); do
  grep -qx "$fn" "$work/exports.txt" || missing="$missing $fn"
done
[ -z "$missing" ] || fail "declared in chimaera.h but not exported:$missing"

echo "== headers compile as C99 and as C++"
printf '#include <chimaera.h>\nint main(void) { return chi_version() == 0; }\n' >"$work/c99.c"
"$cc" -std=c99 -pedantic -Wall -Wextra -Werror -fsyntax-only -I"$prefix/include" "$work/c99.c" ||
  fail "chimaera.h is not clean C99"
"$cxx" -x c++ -std=c++11 -Wall -Wextra -Werror -fsyntax-only -I"$prefix/include" "$work/c99.c" ||
  fail "chimaera.h does not compile as C++"

check_output() {
  # $1: file with the consumer's output; it must run on the installed library.
  out=$(cat "$1")
  case "$out" in
  "OK $libdir/"*) ;;
  OK*) fail "consumer ran on '${out#OK }', not on the library in $libdir" ;;
  *) fail "consumer printed '$out'" ;;
  esac
}

echo "== consumer through pkg-config"
pcflags=$(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --cflags --libs chimaera) ||
  fail "pkg-config does not know chimaera"
echo "pkg-config: $pcflags"
# The .pc must follow the tree to wherever --prefix put it.
case "$pcflags" in
*"-I$prefix/"*"-L$prefix/"* | *"-L$prefix/"*"-I$prefix/"*) ;;
*) fail "chimaera.pc does not point into the prefix it was installed to ($prefix): '$pcflags'" ;;
esac
# shellcheck disable=SC2086 # word splitting of the flags is intended
"$cc" -std=c99 -Wall -Wextra -Werror $flags "$here/consumer.c" -o "$work/consumer-pc" $pcflags ||
  fail "building the consumer with pkg-config flags"
LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$work/consumer-pc" >"$work/consumer-pc.out" ||
  fail "consumer (pkg-config) exited with $?"
check_output "$work/consumer-pc.out"

echo "== consumer through find_package(chimaera)"
"$cmake" -S "$here" -B "$work/consumer-cmake" -G "$generator" \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$cc" \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" \
  >"$work/consumer-cmake.log" 2>&1 ||
  { cat "$work/consumer-cmake.log" >&2; fail "configuring the CMake consumer"; }
"$cmake" --build "$work/consumer-cmake" >>"$work/consumer-cmake.log" 2>&1 ||
  { cat "$work/consumer-cmake.log" >&2; fail "building the CMake consumer"; }
LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$work/consumer-cmake/consumer" >"$work/consumer-cmake.out" ||
  fail "consumer (CMake) exited with $?"
check_output "$work/consumer-cmake.out"

echo "test_install: OK"

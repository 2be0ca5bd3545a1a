#!/bin/sh
# Installs a built chimaera into a scratch prefix and builds a Fortran
# program against it twice, through pkg-config (chimaera-fortran.pc) and
# through find_package(chimaera) (chimaera::fortran); both must run on the
# installed libraries.
#
# usage: run_install_test.sh BUILD_DIR WORK_DIR FC CMAKE GENERATOR [FLAGS]
#   FLAGS: extra compile and link flags (a sanitizer build's flags).
set -eu

if [ $# -lt 5 ]; then
  echo "usage: $0 BUILD_DIR WORK_DIR FC CMAKE GENERATOR [FLAGS]" >&2
  exit 2
fi
build=$1
work=$2
fc=$3
cmake=$4
generator=$5
flags=${6:-}
here=$(cd "$(dirname "$0")" && pwd)

fail() {
  echo "fortran_install: FAIL: $*" >&2
  exit 1
}

rm -rf "$work"
mkdir -p "$work"
prefix=$(cd "$work" && pwd)/prefix

echo "== cmake --install $build --prefix $prefix"
"$cmake" --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1 ||
  { cat "$work/install.log" >&2; fail "cmake --install failed"; }

lib=$(find "$prefix" -name 'libchimaera_fortran.so.*.*' -type f | head -n 1)
[ -n "$lib" ] || fail "no libchimaera_fortran.so.X.Y installed under $prefix"
libdir=$(dirname "$lib")
[ -e "$libdir/libchimaera_fortran.so.0" ] || fail "no libchimaera_fortran.so.0 link (the soname)"
for mod in chimaera.mod chimaera_c.mod; do
  [ -f "$prefix/include/chimaera/fortran/$mod" ] || fail "$mod not in include/chimaera/fortran"
done
[ -f "$libdir/pkgconfig/chimaera-fortran.pc" ] || fail "chimaera-fortran.pc not in $libdir/pkgconfig"

# The program must load both libraries from the prefix.
check_run() {
  # $1: the consumer; run without LD_LIBRARY_PATH when $2 is "rpath".
  if [ "${2:-}" = rpath ]; then out=$("$1") || fail "$1 exited with $?"
  else out=$(LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$1") || fail "$1 exited with $?"; fi
  case "$out" in
  "OK "*) ;;
  *) fail "$1 printed '$out'" ;;
  esac
  for l in libchimaera_fortran.so.0 libchimaera.so.0; do
    where=$(LD_LIBRARY_PATH="$libdir" ldd "$1" | sed -n "s/.*$l => \([^ ]*\).*/\1/p")
    [ "$(cd "$(dirname "$where")" && pwd)" = "$(cd "$libdir" && pwd)" ] ||
      fail "$1 loads $l from '$where', not from $libdir"
  done
}

echo "== consumer through pkg-config"
pcflags=$(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --cflags --libs chimaera-fortran) ||
  fail "pkg-config does not know chimaera-fortran"
echo "pkg-config: $pcflags"
mkdir -p "$work/pc"
# shellcheck disable=SC2086 # word splitting of the flags is intended
(cd "$work/pc" && "$fc" $flags "$here/consumer.f90" -o consumer $pcflags) ||
  fail "building the consumer with pkg-config flags"
check_run "$work/pc/consumer"

echo "== consumer through find_package(chimaera): chimaera::fortran"
"$cmake" -S "$here" -B "$work/consumer-cmake" -G "$generator" \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_Fortran_COMPILER="$fc" \
  -DCMAKE_Fortran_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" \
  >"$work/consumer-cmake.log" 2>&1 ||
  { cat "$work/consumer-cmake.log" >&2; fail "configuring the CMake consumer"; }
"$cmake" --build "$work/consumer-cmake" >>"$work/consumer-cmake.log" 2>&1 ||
  { cat "$work/consumer-cmake.log" >&2; fail "building the CMake consumer"; }
# CMake's build rpath points into the prefix: no LD_LIBRARY_PATH needed.
check_run "$work/consumer-cmake/consumer" rpath

echo "fortran_install: OK"

#!/usr/bin/env bash
# The README's test command on a fresh Debian 12 machine, as a new user meets
# it: a minimal Debian 12 root (debootstrap --variant=minbase bookworm, from
# the mirror in this machine's apt sources), a clone of this repository's
# committed HEAD, and `bash .ci/run` under chroot with a clean environment:
# root, no ~/.cargo (so Debian's Rust 1.63), no CUDA, nothing of this
# machine's but the kernel, the network and the mirror.  Prints PASS or FAIL,
# the time taken, every ctest summary and the failing tests.
#
#   scripts/fresh-check.sh            needs root, debootstrap and git
#
# Environment:
#   CHI_FRESH_STABLE=1   also give the root this machine's newest stable Rust
#                        (the rustup toolchain of `~/.cargo/bin/rustc`, bound
#                        read-only at /opt/rust-stable, linked from
#                        /root/.cargo/bin): ctest then runs the Rust suite
#                        with it (rust_cargo_test) and with Debian's
#                        (rust_cargo_test_debian).
#   CHI_FRESH_DEMO=1     first run `scripts/demo.sh` in a clone of its own in
#                        the same fresh root (the README's first command, also
#                        doing the whole set-up), then .ci/run in another.
#   CHI_FRESH_CACHE      where the debootstrap result is kept as a tarball
#                        between runs (default ~/.cache/chimaera-fresh).
#   CHI_FRESH_WORK       where the root is unpacked (default a new directory
#                        under /var/tmp); removed at the end unless
#                        CHI_FRESH_KEEP=1.
#   CHI_FRESH_MIRROR     a Debian mirror instead of the one found in
#                        /etc/apt/sources.list{,.d/*.sources,.d/*.list}.
#   CHI_FRESH_REPO       the repository whose HEAD is cloned (default this
#                        script's).
#   CHI_FRESH_SRC        where in the root the clones go (default /srv).
#   CHI_FRESH_LOG        the full log of the run (default
#                        $CHI_FRESH_CACHE/run-DATE-PID.log).
# Exit status: 0 when .ci/run (and demo.sh, when asked) exited 0.
set -euo pipefail
repo=${CHI_FRESH_REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
suite=bookworm
arch=$(dpkg --print-architecture 2>/dev/null || echo amd64)
cache=${CHI_FRESH_CACHE:-$HOME/.cache/chimaera-fresh}
say() { echo "fresh-check: $*"; }
die() { echo "fresh-check: $*" >&2; exit 2; }

[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, mount, chroot)"
command -v git >/dev/null || die "git not found"
if ! command -v debootstrap >/dev/null; then
  say "installing debootstrap"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi

# --- The mirror and suites of this machine's apt sources ---------------------
# Prints "URI SUITE COMPONENTS..." for every Debian 12 entry (suite bookworm,
# bookworm-updates, bookworm-security...), from one-line .list files and
# deb822 .sources files alike.
apt_entries() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    # deb [options] URI SUITE COMPONENTS...
    sed -e 's/#.*//' -e 's/\[[^]]*\]//' "$f" |
      awk '$1 == "deb" && $3 ~ /^'"$suite"'([-\/]|$)/ { $1 = ""; sub(/^ /, ""); print }'
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    # Stanzas separated by blank lines; Types/URIs/Suites/Components/Enabled.
    awk -v want="$suite" '
      function flush(   i, j, nu, ns, u, s) {
        if (types ~ /(^| )deb( |$)/ && enabled != "no") {
          nu = split(uris, u, " "); ns = split(suites, s, " ")
          for (i = 1; i <= nu; i++) for (j = 1; j <= ns; j++)
            if (s[j] ~ ("^" want "([-/]|$)")) print u[i], s[j], comps
        }
        types = uris = suites = comps = ""; enabled = "yes"
      }
      BEGIN { enabled = "yes" }
      /^[ \t]*#/ { next }
      /^[ \t]*$/ { flush(); next }
      {
        key = tolower($1); sub(/:$/, "", key); $1 = ""; sub(/^[ \t]+/, ""); val = $0
        if (key == "types") types = val
        else if (key == "uris") uris = val
        else if (key == "suites") suites = val
        else if (key == "components") comps = val
        else if (key == "enabled") enabled = tolower(val)
      }
      END { flush() }' "$f"
  done
}
entries=$(apt_entries | sort -u)
mirror=${CHI_FRESH_MIRROR:-$(printf '%s\n' "$entries" | awk '$2 == "'"$suite"'" { print $1; exit }')}
[ -n "$mirror" ] || die "no '$suite' entry in /etc/apt/sources.list or sources.list.d; set CHI_FRESH_MIRROR"
mirror=${mirror%/}
say "mirror $mirror ($suite, $arch)"

# --- The cached minimal root -------------------------------------------------
mkdir -p "$cache"
key=$(printf '%s %s %s' "$mirror" "$suite" "$arch" | md5sum | cut -c1-8)
tarball=$cache/$suite-minbase-$arch-$key.tar.gz
started=$(date +%s)
if [ ! -s "$tarball" ]; then
  say "debootstrap --variant=minbase $suite (once; kept in $tarball)"
  boot=$(mktemp -d /var/tmp/chimaera-debootstrap.XXXXXX)
  if ! debootstrap --variant=minbase --arch="$arch" "$suite" "$boot" "$mirror" \
      >"$cache/debootstrap.log" 2>&1; then
    tail -20 "$cache/debootstrap.log" >&2
    rm -rf "$boot"
    die "debootstrap failed (log: $cache/debootstrap.log)"
  fi
  chmod 755 "$boot" # mktemp's 0700 would become the root's /
  # Stray mounts of a failed second stage would be archived and deleted.
  tar -C "$boot" --numeric-owner --one-file-system -czf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
  rm -rf --one-file-system "$boot"
  say "root made in $(( $(date +%s) - started )) s"
fi

work=${CHI_FRESH_WORK:-$(mktemp -d /var/tmp/chimaera-fresh.XXXXXX)}
rootfs=$work/root
log=${CHI_FRESH_LOG:-$cache/run-$(date +%Y%m%d-%H%M%S)-$$.log}
mounts=()
cleanup() {
  set +e +o pipefail # a cleanup step that finds nothing to do must not end the cleanup
  local i
  for (( i = ${#mounts[@]} - 1; i >= 0; i-- )); do
    umount "${mounts[i]}" 2>/dev/null || umount -l "${mounts[i]}" 2>/dev/null || true
  done
  # Anything still mounted under the root (a test's leftovers) goes too.
  if [ -d "$rootfs" ]; then
    findmnt -rn -o TARGET | grep -F "$rootfs/" | sort -r | while read -r m; do umount -l "$m" || true; done
  fi
  if [ "${CHI_FRESH_KEEP:-0}" = 1 ]; then
    say "root kept in $rootfs"
  elif [ -d "$work" ]; then
    # Only when nothing is mounted below any more: never delete through a mount.
    if ! findmnt -rn -o TARGET | grep -qF "$rootfs/"; then
      rm -rf --one-file-system "$work"
    else
      echo "fresh-check: $rootfs still has mounts; not removed" >&2
    fi
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

rm -rf "$rootfs"
mkdir -p "$rootfs"
tar -C "$rootfs" --numeric-owner -xzf "$tarball"
chmod 755 "$rootfs" # a / that other users may traverse, as on any machine

# apt sources as on a Debian 12 machine with this mirror: every Debian 12
# entry of this machine's sources (updates and security included).
{
  printf '%s\n' "$entries" | awk 'NF >= 2 { print "deb " $0 }'
  printf '%s\n' "$entries" | grep -q . || echo "deb $mirror $suite main"
} >"$rootfs/etc/apt/sources.list"
rm -f "$rootfs"/etc/apt/sources.list.d/*
cp /etc/resolv.conf "$rootfs/etc/resolv.conf" 2>/dev/null || true
[ -s "$rootfs/etc/hosts" ] || printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' >"$rootfs/etc/hosts"

# --- Mounts: /proc, /sys, a minimal /dev with its own /dev/shm ---------------
bind() { # bind SRC DST [ro]
  mount --bind "$1" "$2"; mounts+=("$2")
  [ "${3:-}" = ro ] && mount -o remount,bind,ro "$2"
  return 0
}
mount -t proc proc "$rootfs/proc"; mounts+=("$rootfs/proc")
bind /sys "$rootfs/sys" ro
rm -rf "$rootfs/dev"; mkdir -m 755 "$rootfs/dev"
mount -t tmpfs -o mode=755,size=1m chimaera-dev "$rootfs/dev"; mounts+=("$rootfs/dev")
for d in null zero full random urandom tty; do
  touch "$rootfs/dev/$d"; bind "/dev/$d" "$rootfs/dev/$d"
done
mkdir -m 755 "$rootfs/dev/pts"
if mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts "$rootfs/dev/pts" 2>/dev/null; then
  mounts+=("$rootfs/dev/pts"); ln -s pts/ptmx "$rootfs/dev/ptmx"
fi
mkdir -m 1777 "$rootfs/dev/shm"
mount -t tmpfs -o mode=1777 chimaera-shm "$rootfs/dev/shm"; mounts+=("$rootfs/dev/shm")
ln -s /proc/self/fd "$rootfs/dev/fd"
ln -s /proc/self/fd/0 "$rootfs/dev/stdin"
ln -s /proc/self/fd/1 "$rootfs/dev/stdout"
ln -s /proc/self/fd/2 "$rootfs/dev/stderr"
mount -t tmpfs -o mode=755 chimaera-run "$rootfs/run"; mounts+=("$rootfs/run")
mkdir -p "$rootfs/run/lock"
chmod 1777 "$rootfs/tmp"

# --- The newest stable Rust, when asked ----------------------------------------
rust_note="Debian's Rust only"
if [ "${CHI_FRESH_STABLE:-0}" = 1 ]; then
  host_rustc=${CARGO_HOME:-$HOME/.cargo}/bin/rustc
  [ -x "$host_rustc" ] || die "CHI_FRESH_STABLE=1 but $host_rustc does not exist"
  sysroot=$("$host_rustc" --print sysroot) || die "$host_rustc --print sysroot failed"
  [ -x "$sysroot/bin/cargo" ] || die "no cargo in $sysroot/bin"
  mkdir -p "$rootfs/opt/rust-stable" "$rootfs/root/.cargo/bin"
  bind "$sysroot" "$rootfs/opt/rust-stable" ro
  for t in cargo rustc rustdoc; do ln -s "/opt/rust-stable/bin/$t" "$rootfs/root/.cargo/bin/$t"; done
  rust_note="Debian's Rust and $(chroot "$rootfs" /opt/rust-stable/bin/rustc --version) in /root/.cargo"
fi
[ -e /usr/local/cuda ] && [ -e "$rootfs/usr/local/cuda" ] && die "CUDA visible in the root"

# --- Clone and run ------------------------------------------------------------
head=$(git -C "$repo" rev-parse HEAD)
in_root() { # in_root DIR COMMAND...: a clean login-like environment, no ~/.cargo of this machine
  local dir=$1; shift
  chroot "$rootfs" /usr/bin/env -i HOME=/root USER=root LOGNAME=root SHELL=/bin/bash \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 TERM=dumb \
    /bin/bash -c 'cd "$1" && shift && exec "$@"' bash "$dir" "$@"
}
# Clones go under $CHI_FRESH_SRC (default /srv), not root's 0700 home:
# test_access re-executes its own binary as another user, which needs a path
# that user may traverse.
src=${CHI_FRESH_SRC:-/srv}
clone() { # clone NAME: the committed HEAD of this repository at $src/NAME
  mkdir -p "$rootfs$src"
  git clone -q --no-hardlinks "$repo" "$rootfs$src/$1"
  git -C "$rootfs$src/$1" checkout -q --detach "$head"
}
: >"$log"
say "root $rootfs; $rust_note; HEAD $head"
say "log $log"

demo_rc=skipped demo_s=
if [ "${CHI_FRESH_DEMO:-0}" = 1 ]; then
  clone demo
  say "running scripts/demo.sh in a fresh clone ($src/demo)"
  t0=$(date +%s)
  echo "===== scripts/demo.sh" >>"$log"
  demo_rc=0
  in_root "$src/demo" ./scripts/demo.sh </dev/null >>"$log" 2>&1 || demo_rc=$?
  demo_s=$(( $(date +%s) - t0 ))
  # The demo's table: its last lines.
  awk '/^===== scripts\/demo.sh/ { on = 1; n = 0; next } on { line[++n] = $0 }
       END { for (i = (n > 15 ? n - 14 : 1); i <= n; i++) print "  | " line[i] }' "$log"
  say "demo.sh exit $demo_rc in $demo_s s"
fi

clone chimaera
say "running bash .ci/run in a fresh clone ($src/chimaera)"
t0=$(date +%s)
echo "===== bash .ci/run" >>"$log"
ci_rc=0
in_root "$src/chimaera" bash .ci/run </dev/null >>"$log" 2>&1 || ci_rc=$?
ci_s=$(( $(date +%s) - t0 ))

# --- Report -----------------------------------------------------------------------
# One line for each ctest run of .ci/run, named by test.sh's "== ..." headers
# (the first is the main build), with its summary and time, or the build
# step that failed where no test ran; then every test listed under "The
# following tests FAILED".
echo "---- ctest runs (.ci/run)"
awk 'function flush() {
       if (section == "") return
       if (summary != "") printf "  %-26s %s (%s s)\n", section ":", summary, secs
       else printf "  %-26s no tests ran%s\n", section ":", (bfail != "" ? "; build failed at " bfail : "")
       summary = secs = bfail = ""
     }
     /^===== bash \.ci\/run/ { on = 1; section = "main build"; next }
     !on { next }
     /^== toolchains/ { next }
     /^== / { flush(); section = substr($0, 4); sub(/ \(.*\)$/, "", section); next }
     /^FAILED: / && bfail == "" { bfail = $2 }
     /tests passed, .* tests failed out of/ { summary = $0 }
     /^Total Test time/ { secs = $(NF - 1) }
     END { flush() }' "$log"
echo "---- toolchains (.ci/run, as test.sh reports them)"
awk '/^===== bash \.ci\/run/ { on = 1; next }
     on && /^== toolchains/ { t = 1; next }
     t && /^  / { print; next } { t = 0 }' "$log"
failed=$(awk '/^===== bash \.ci\/run/ { on = 1 } on && /The following tests FAILED/ { f = 1; next }
              f && /^[ \t]+[0-9]+ - / { sub(/^[ \t]+/, ""); print; next } { f = 0 }' "$log")
if [ -n "$failed" ]; then
  echo "---- failing tests"
  printf '  %s\n' "$failed" | sed 's/^  */  /'
fi
total_s=$(( $(date +%s) - started ))
verdict=PASS
[ "$ci_rc" -eq 0 ] || verdict=FAIL
[ "$demo_rc" = skipped ] || [ "$demo_rc" -eq 0 ] || verdict=FAIL
echo "fresh-check: $verdict: .ci/run exit $ci_rc in $ci_s s; demo.sh: $demo_rc${demo_s:+ in $demo_s s}; total $total_s s ($rust_note; HEAD ${head:0:12})"
if [ "$verdict" = FAIL ]; then
  # Build and script errors, which no ctest list names.
  errs=$(grep -m 10 -E '^FAILED: |(^|: )(fatal )?error(\[E[0-9]+\])?: ' "$log" || true)
  if [ -n "$errs" ]; then
    echo "---- first errors in the log"
    printf '%s\n' "$errs" | cut -c1-200 | sed 's/^/  /'
  elif [ -z "$failed" ]; then
    echo "---- last lines of the log"
    tail -25 "$log"
  fi
fi
[ "$verdict" = PASS ]

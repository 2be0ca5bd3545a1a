#!/usr/bin/env bash
# A/B of two (or more) commits on this machine: builds each one's
# chimaera-bench (CPU only, in git worktrees under a temporary directory),
# then runs their CPU rows in turn, ROUNDS times each, in one session, and
# prints one table: the median p50 and throughput of every row for each
# commit, and last/first.  Taking turns spreads the machine's drift over
# every build alike.
#
#   scripts/ab-bench.sh [A [B [C ...]]]  default: A = 2c12edf (the engine
#                                        before the server), B = HEAD
# Environment:
#   AB_ROUNDS   runs of each build (default 5)
#   AB_ITERS    --iters of each run (default 50000)
#   AB_JOBS     build jobs (default: online CPUs)
#   AB_ARGS     more chimaera-bench arguments (e.g. "--threads 16")
#   AB_DIR      where worktrees, builds and raw outputs go (default: a new
#               temporary directory, removed at the end unless AB_KEEP=1)
#   AB_OUT      also write the raw runs and the table there (a directory)
#   AB_REPORT_ONLY=1  no builds or runs: the table of the runs in AB_DIR
# A and B are anything git rev-parse takes; "WORKTREE" is the working tree's
# tracked changes on top of HEAD (git stash create; untracked files are not
# in it); or a source tarball (NAME.tar.gz from git archive, with NAME.txt
# beside it naming the commit), for machines without the repository's
# history (scripts/gpu-idle-ab.sh prepare makes them).  GPUs are hidden
# from every runtime (CHI_GPU_DEVICES=0).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
refs=("$@")
[ ${#refs[@]} -ge 1 ] || refs=(2c12edf)
[ ${#refs[@]} -ge 2 ] || refs+=(HEAD)
ROUNDS=${AB_ROUNDS:-5}
ITERS=${AB_ITERS:-50000}
JOBS=${AB_JOBS:-$(nproc)}
ARGS=${AB_ARGS:-}
dir=${AB_DIR:-$(mktemp -d /tmp/chi-ab.XXXXXX)}
mkdir -p "$dir"

resolve() {
  if [ -f "$1" ]; then
    readlink -f "$1"
  elif [ "$1" = WORKTREE ]; then
    local c; c=$(git stash create)
    echo "${c:-$(git rev-parse HEAD)}"
  else
    git rev-parse --verify "$1^{commit}"
  fi
}
label() { # commit or tarball: one line saying what it is
  if [ -f "$1" ]; then
    local t=${1%.tar.gz}.txt
    if [ -f "$t" ]; then head -1 "$t" | cut -c1-90; else basename "$1"; fi
  else
    git log -1 --format='%h %s' "$1" | cut -c1-90
  fi
}
sides=()
commits=()
for i in "${!refs[@]}"; do
  sides+=("$(echo abcdefgh | cut -c$((i + 1)))")
  commits+=("$(resolve "${refs[$i]}")")
done

cleanup() {
  for s in "${sides[@]}"; do
    [ -d "$dir/src-$s/.git" ] || [ -f "$dir/src-$s/.git" ] &&
      { git worktree remove --force "$dir/src-$s" >/dev/null 2>&1 || true; }
  done
  git worktree prune >/dev/null 2>&1 || true
  if [ -z "${AB_DIR:-}" ] && [ "${AB_KEEP:-0}" != 1 ]; then rm -rf "$dir"; fi
}
trap cleanup EXIT

build() { # side commit
  local s=$1 c=$2 src=$dir/src-$1 bld=$dir/build-$1
  if [ -f "$c" ]; then
    rm -rf "$src" && mkdir -p "$src" && tar -xzf "$c" -C "$src"
  else
    [ -d "$src" ] && git worktree remove --force "$src" >/dev/null 2>&1
    git worktree add --detach "$src" "$c" >/dev/null 2>&1
  fi
  echo "== build $s: $(label "$c")" >&2
  cmake -S "$src" -B "$bld" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCHI_ENABLE_CUDA=OFF \
    -DCHI_BUILD_TESTS=OFF -DCHI_BUILD_EXAMPLES=OFF -DCHI_FORTRAN=OFF -DCHI_RUST=OFF \
    >"$dir/cmake-$s.log" 2>&1 || { tail -20 "$dir/cmake-$s.log" >&2; exit 1; }
  cmake --build "$bld" -j "$JOBS" --target chimaera-bench >"$dir/build-$s.log" 2>&1 ||
    { tail -30 "$dir/build-$s.log" >&2; exit 1; }
}
report_only=${AB_REPORT_ONLY:-0}
if [ "$report_only" != 1 ]; then
for i in "${!sides[@]}"; do build "${sides[$i]}" "${commits[$i]}"; done
fi

# A fresh copy of a build's binary and library before each run: a file keeps
# its page-cache pages, so without this each build ran all its rounds from
# the same physical pages, and their cache placement made builds of one
# commit differ by 3-6% in p50 (an A/A run, docs/performance.md).
refresh() { # side
  local f
  for f in "$dir/build-$1/src/tools/chimaera-bench" $(find "$dir/build-$1" -maxdepth 2 -type f -name 'libchimaera.so*'); do
    cp -p "$f" "$f.fresh" && mv -f "$f.fresh" "$f"
  done
}
bench() { # side round
  refresh "$1"
  # shellcheck disable=SC2086
  CHI_GPU_DEVICES=0 "$dir/build-$1/src/tools/chimaera-bench" --iters "$ITERS" $ARGS \
    >"$dir/run-$1-$2.txt" 2>&1 || echo "(run $1 $2 exited $?)" >&2
}
if [ "$report_only" != 1 ]; then
  echo "== $ROUNDS rounds of each, alternating (--iters $ITERS $ARGS)" >&2
  for r in $(seq 1 "$ROUNDS"); do
    # Each round starts with another build.
    n=${#sides[@]}
    for k in $(seq 0 $((n - 1))); do bench "${sides[$(( (r + k) % n ))]}" "$r"; done
    echo "   round $r done" >&2
  done
fi

# Rows of the table: the name is every field before the kind; p50 is the
# 4th field after it and Mops/s the 7th.
rows() { # side
  awk '{
    for (i = 2; i <= NF; i++) if ($i == "floor" || $i == "peer" || $i == "latency" || $i == "throughput") break;
    if (i > NF || $(i + 3) !~ /^[0-9.]+$/) next;
    name = $1; for (j = 2; j < i; j++) name = name " " $j;
    print name "\t" $i "\t" $(i + 3) "\t" $(i + 6)
  }' "$dir"/run-"$1"-*.txt
}
{
  for i in "${!sides[@]}"; do
    echo "${sides[$i]^^}: $(label "${commits[$i]}")"
  done
  echo "$(nproc) CPUs ($(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)), $ROUNDS rounds each, --iters $ITERS $ARGS, CHI_GPU_DEVICES=0; medians"
  echo
  for s in "${sides[@]}"; do rows "$s" | sed "s/^/$s\t/"; done | awk -F'\t' -v sides="${sides[*]}" '
    function median(list,   n, v, i, j, t) {
      n = split(list, v, " ");
      for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
      return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
    }
    { key = $2; if (!(key in kind)) { order[++nk] = key; kind[key] = $3 }
      p[$1, key] = p[$1, key] " " $4; m[$1, key] = m[$1, key] " " $5 }
    END {
      ns = split(sides, sd, " "); last = toupper(sd[ns])
      printf "%-26s %-10s", "row", "kind"
      for (i = 1; i <= ns; i++) printf " %9s", toupper(sd[i]) " p50 us"
      printf " %6s", last "/A"
      for (i = 1; i <= ns; i++) printf " %9s", toupper(sd[i]) " Mops/s"
      printf " %6s\n", last "/A"
      for (k = 1; k <= nk; k++) {
        key = order[k]
        printf "%-26s %-10s", key, kind[key]
        for (i = 1; i <= ns; i++) { pv[i] = median(p[sd[i], key]); printf " %9.3f", pv[i] }
        printf " %6.2f", (pv[1] > 0 ? pv[ns] / pv[1] : 0)
        for (i = 1; i <= ns; i++) { mv[i] = median(m[sd[i], key]); printf " %9.3f", mv[i] }
        printf " %6.2f\n", (mv[1] > 0 ? mv[ns] / mv[1] : 0)
      }
    }'
} | tee "$dir/table.txt"
if [ -n "${AB_OUT:-}" ]; then
  mkdir -p "$AB_OUT"
  cp "$dir"/run-*.txt "$dir/table.txt" "$AB_OUT/"
fi

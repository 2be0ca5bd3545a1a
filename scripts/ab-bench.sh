#!/usr/bin/env bash
# A/B of two commits on this machine: builds each one's chimaera-bench
# (CPU only, in git worktrees under a temporary directory), then runs their
# CPU rows alternately, ROUNDS times each, in one session, and prints one
# table: the median p50 and throughput of every row for each commit, and
# B/A.  Alternating spreads the machine's drift over both builds alike.
#
#   scripts/ab-bench.sh [A [B]]        default: A = 2c12edf (the engine before
#                                      the server), B = HEAD
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
# in it).  GPUs are hidden from both runtimes (CHI_GPU_DEVICES=0).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
A=${1:-2c12edf}
B=${2:-HEAD}
ROUNDS=${AB_ROUNDS:-5}
ITERS=${AB_ITERS:-50000}
JOBS=${AB_JOBS:-$(nproc)}
ARGS=${AB_ARGS:-}
dir=${AB_DIR:-$(mktemp -d /tmp/chi-ab.XXXXXX)}
mkdir -p "$dir"

resolve() {
  if [ "$1" = WORKTREE ]; then
    local c; c=$(git stash create)
    echo "${c:-$(git rev-parse HEAD)}"
  else
    git rev-parse --verify "$1^{commit}"
  fi
}
ca=$(resolve "$A")
cb=$(resolve "$B")

cleanup() {
  for s in a b; do
    [ -d "$dir/src-$s" ] && git worktree remove --force "$dir/src-$s" >/dev/null 2>&1 || true
  done
  git worktree prune >/dev/null 2>&1 || true
  if [ -z "${AB_DIR:-}" ] && [ "${AB_KEEP:-0}" != 1 ]; then rm -rf "$dir"; fi
}
trap cleanup EXIT

build() { # side commit
  local s=$1 c=$2 src=$dir/src-$1 bld=$dir/build-$1
  [ -d "$src" ] && git worktree remove --force "$src" >/dev/null 2>&1
  git worktree add --detach "$src" "$c" >/dev/null 2>&1
  echo "== build $s: $(git log -1 --format='%h %s' "$c" | cut -c1-100)" >&2
  cmake -S "$src" -B "$bld" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCHI_ENABLE_CUDA=OFF \
    -DCHI_BUILD_TESTS=OFF -DCHI_BUILD_EXAMPLES=OFF -DCHI_FORTRAN=OFF -DCHI_RUST=OFF \
    >"$dir/cmake-$s.log" 2>&1 || { tail -20 "$dir/cmake-$s.log" >&2; exit 1; }
  cmake --build "$bld" -j "$JOBS" --target chimaera-bench >"$dir/build-$s.log" 2>&1 ||
    { tail -30 "$dir/build-$s.log" >&2; exit 1; }
}
report_only=${AB_REPORT_ONLY:-0}
if [ "$report_only" != 1 ]; then
build a "$ca"
build b "$cb"
fi

bench() { # side round
  # shellcheck disable=SC2086
  CHI_GPU_DEVICES=0 "$dir/build-$1/src/tools/chimaera-bench" --iters "$ITERS" $ARGS \
    >"$dir/run-$1-$2.txt" 2>&1 || echo "(run $1 $2 exited $?)" >&2
}
if [ "$report_only" != 1 ]; then
  echo "== $ROUNDS rounds of each, alternating (--iters $ITERS $ARGS)" >&2
  for r in $(seq 1 "$ROUNDS"); do
    if [ $((r % 2)) = 1 ]; then bench a "$r"; bench b "$r"; else bench b "$r"; bench a "$r"; fi
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
  echo "A: $(git log -1 --format='%h %s' "$ca" | cut -c1-90)"
  echo "B: $(git log -1 --format='%h %s' "$cb" | cut -c1-90)"
  echo "$(nproc) CPUs ($(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)), $ROUNDS rounds each, --iters $ITERS $ARGS, CHI_GPU_DEVICES=0; medians"
  echo
  { rows a | sed 's/^/a\t/'; rows b | sed 's/^/b\t/'; } | awk -F'\t' '
    function median(list,   n, v, i, j, t) {
      n = split(list, v, " ");
      for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
      return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
    }
    { key = $2; if (!(key in kind)) { order[++nk] = key; kind[key] = $3 }
      p[$1, key] = p[$1, key] " " $4; m[$1, key] = m[$1, key] " " $5 }
    END {
      printf "%-28s %-10s %10s %10s %6s %10s %10s %6s\n", "row", "kind", "A p50 us", "B p50 us", "B/A", "A Mops/s", "B Mops/s", "B/A"
      for (k = 1; k <= nk; k++) {
        key = order[k]
        pa = median(p["a", key]); pb = median(p["b", key]); ma = median(m["a", key]); mb = median(m["b", key])
        printf "%-28s %-10s %10.3f %10.3f %6.2f %10.3f %10.3f %6.2f\n", key, kind[key], pa, pb, (pa > 0 ? pb / pa : 0), ma, mb, (ma > 0 ? mb / ma : 0)
      }
    }'
} | tee "$dir/table.txt"
if [ -n "${AB_OUT:-}" ]; then
  mkdir -p "$AB_OUT"
  cp "$dir"/run-*.txt "$dir/table.txt" "$AB_OUT/"
fi

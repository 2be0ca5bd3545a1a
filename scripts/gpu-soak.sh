#!/usr/bin/env bash
# gpu-soak.sh MINUTES [BUILD_DIR]: the soak with GPU routes (scripts/soak.sh
# --gpu on; docs/reliability.md) on the GPU machine, after scripts/gpu-run.sh
# built BUILD_DIR (default build-gpu) with CUDA:
#
#   device: run(command="GPU_RUN_STEPS=build bash scripts/gpu-run.sh && bash scripts/gpu-soak.sh 6",
#               carry=[".devdeps"])
#
# MINUTES may be a fraction (0.5).  One device command runs at most 600 s:
# the soak ends about 30-60 s after its deadline (the last clients, the
# checks, the archive) and is killed GPU_SOAK_MARGIN_S (default 150) after
# it, so with the build in the same command 6 minutes fit.  Longer soaks run
# detached, across two commands (the second within the machine's 30 s idle
# time):
#   device: run("GPU_RUN_STEPS=build bash scripts/gpu-run.sh && bash scripts/gpu-soak.sh --detach 10 &&
#                GPU_SOAK_WAIT_S=480 bash scripts/gpu-soak.sh --collect", carry=[".devdeps"])
#   device: run("bash scripts/gpu-soak.sh --collect")   # waits up to 570 s more
# --detach starts the soak in a session of its own (setsid: it outlives the
# command) and returns; --collect waits for it (GPU_SOAK_WAIT_S, default 570)
# and puts its files in $OUT, or exits 75 when it still runs.
# The run directory (logs, ledgers) is under /tmp; what comes
# back is in $OUT, five files at most with gpu-run.sh's: soak-summary.txt
# (also appended to $OUT/summary.txt when gpu-run.sh left one), soak-logs.tar.gz
# (the run directory without its ledgers: summary, checks, rss.csv,
# server.log, every client's and soak_gpu's logs; client logs are left out
# when the archive would pass 15 MiB, and the summary says so) and rss.png
# when gnuplot is there.  jq comes from .devdeps (jq, libjq1, libonig5
# unpacked by gpu-deps.sh), else a python3 stand-in for the few filters
# soak.sh uses.
# Environment: OUT (default /tmp/chi-gpu-soak-out), GPU_SOAK_ARGS (more
# soak.sh arguments, e.g. "--gpu-chaos 2"), GPU_SOAK_MARGIN_S, GPU_SOAK_WAIT_S.
# Exit status: soak.sh's (0 passed, 1 a check failed), 2 usage or no build,
# 124 the soak outran its bound, 75 (--collect) still running.
set -u -o pipefail
cd "$(dirname "$0")/.."
usage() { sed -n '2,2p' "$0" | sed 's/^# //' >&2; exit 2; }
[ $# -ge 1 ] || usage
KEEP=/tmp/chi-gpu-soak-keep
if [ "$1" = --detach ]; then
  shift
  [ $# -ge 1 ] || usage
  rm -rf "$KEEP" && mkdir -p "$KEEP/out" || exit 2
  OUT=$KEEP/out GPU_SOAK_MARGIN_S=${GPU_SOAK_MARGIN_S:-300} setsid bash "$PWD/scripts/gpu-soak.sh" "$@" >"$KEEP/console" 2>&1 </dev/null &
  echo "gpu-soak.sh: started detached (pid $!): $*; collect with: bash scripts/gpu-soak.sh --collect"
  exit 0
fi
if [ "$1" = --collect ]; then
  OUT=${OUT:-/tmp/chi-gpu-soak-out}
  mkdir -p "$OUT"
  [ -d "$KEEP" ] || { echo "gpu-soak.sh --collect: no detached soak ($KEEP)" >&2; exit 2; }
  t0=$(date +%s)
  while [ ! -f "$KEEP/rc" ] && [ $(( $(date +%s) - t0 )) -lt "${GPU_SOAK_WAIT_S:-570}" ]; do sleep 2; done
  if [ ! -f "$KEEP/rc" ]; then
    echo "gpu-soak.sh --collect: the soak still runs after $(( $(date +%s) - t0 )) s; call --collect again (within 30 s). Its console:"
    tail -n 15 "$KEEP/console"
    exit 75
  fi
  cp "$KEEP"/out/* "$OUT"/ 2>/dev/null
  cat "$KEEP/out/soak-summary.txt"
  exit "$(cat "$KEEP/rc")"
fi
SOAK_S=$(awk -v m="$1" 'BEGIN { if (m !~ /^[0-9]*\.?[0-9]+$/) exit; s = int(m * 60 + 0.5); if (s >= 10) print s }')
[ -n "$SOAK_S" ] || { echo "gpu-soak.sh: MINUTES: a number, at least 10 s worth" >&2; usage; }
BUILD=${2:-build-gpu}
OUT=${OUT:-/tmp/chi-gpu-soak-out}
mkdir -p "$OUT"
[ -x "$BUILD/tests/soak/soak_gpu" ] || {
  echo "gpu-soak.sh: no $BUILD/tests/soak/soak_gpu: build with CUDA first (GPU_RUN_STEPS=build bash scripts/gpu-run.sh)" >&2
  exit 2
}

# The Debian libraries gpu-run.sh unpacked (again: idempotent), and jq.
. scripts/gpu-deps.sh >/dev/null 2>&1
export PATH=/opt/deps/usr/bin:$PATH
if ! jq -n 1 >/dev/null 2>&1; then
  SHIM=$(mktemp -d)
  cat >"$SHIM/jq" <<'EOF'
#!/usr/bin/env python3
# A stand-in for the jq filters scripts/soak.sh uses (no jq on this machine).
import json, sys
args = [a for a in sys.argv[1:] if not a.startswith('-')]
raw, slurp = '-r' in sys.argv, '-s' in sys.argv
expr, text = args[0] if args else '.', sys.stdin.read()
def docs(t):
    d, i, out = json.JSONDecoder(), 0, []
    while True:
        while i < len(t) and t[i].isspace(): i += 1
        if i >= len(t): return out
        v, i = d.raw_decode(t, i); out.append(v)
def get(v, path):
    for k in [p for p in path.split('.') if p]:
        v = v.get(k) if isinstance(v, dict) else None
    return v
def show(v):
    print(v if raw and isinstance(v, str) else json.dumps(v))
vals = docs(text)
if slurp:
    assert expr == 'map(.clients | length) | add', expr
    show(sum(len(get(v, 'clients') or []) for v in vals)); sys.exit(0)
for v in vals:
    if expr == '.clients | length': show(len(get(v, 'clients') or []))
    elif expr == '"\\(.clients | length) \\(.slots_in_use) \\(.routes.client.in_flight)"':
        show('%s %s %s' % (len(get(v, 'clients') or []), json.dumps(get(v, 'slots_in_use')),
                           json.dumps(get(v, 'routes.client.in_flight'))))
    elif expr == '.routes.client.submitted == .routes.client.completed + .routes.client.failed':
        show(get(v, 'routes.client.submitted') == get(v, 'routes.client.completed') + get(v, 'routes.client.failed'))
    elif expr == '.device_slots_in_use == 0 and .gpu.in_flight == 0 and .cpu.in_flight == 0':
        show(get(v, 'device_slots_in_use') == 0 and get(v, 'gpu.in_flight') == 0 and get(v, 'cpu.in_flight') == 0)
    elif expr.startswith('.') and all(c.isalnum() or c in '._' for c in expr):
        show(get(v, expr))
    else:
        sys.exit('jq stand-in: filter not supported: ' + expr)
EOF
  chmod +x "$SHIM/jq"
  export PATH=$SHIM:$PATH
  JQ_NOTE="jq: python3 stand-in (no jq in .devdeps)"
else
  JQ_NOTE="jq: $(command -v jq)"
fi

RUN=/tmp/chi-gpu-soak-run
rm -rf "$RUN"
SUM=$OUT/soak-summary.txt
{
  echo "== gpu-soak on $(hostname), $(date -u +%FT%TZ): $SOAK_S s ($1 min), build $BUILD"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  echo "$(nproc) CPUs; $JQ_NOTE; gnuplot: $(command -v gnuplot || echo none)"
} >"$SUM"
cat "$SUM"
t0=$(date +%s)
# ${GPU_SOAK_ARGS} unquoted on purpose: several arguments.
# shellcheck disable=SC2086
MARGIN_S=${GPU_SOAK_MARGIN_S:-150}
timeout -k 10 $(( SOAK_S + MARGIN_S )) bash scripts/soak.sh --seconds "$SOAK_S" --build "$BUILD" --out "$RUN" \
  --gpu on ${GPU_SOAK_ARGS:-} >"$OUT/soak-console.tmp" 2>&1
rc=$?
echo "soak.sh exit status $rc after $(( $(date +%s) - t0 )) s" >>"$OUT/soak-console.tmp"
[ "$rc" = 124 ] && echo "FAIL: soak.sh outran its bound ($(( SOAK_S + MARGIN_S )) s): killed" >>"$OUT/soak-console.tmp"

# The summary: the run's own (the last lines of the console when it did
# not get that far), then the FAIL lines.
if [ -s "$RUN/summary.txt" ]; then
  sed -n '/^== soak summary/,$p' "$RUN/summary.txt" >>"$SUM"
  grep -h '^FAIL' "$RUN/summary.txt" | sort -u >>"$SUM"
fi
if grep -q '^== soak summary' "$SUM"; then
  tail -n 2 "$OUT/soak-console.tmp" >>"$SUM"
else
  tail -n 40 "$OUT/soak-console.tmp" >>"$SUM"
fi

# The archive: the run directory without the ledgers (sparse, up to
# hundreds of GB apparent size), the console log inside it.
mv "$OUT/soak-console.tmp" "$RUN/console.log" 2>/dev/null || mkdir -p "$RUN"
[ -f "$RUN/rss.png" ] && cp "$RUN/rss.png" "$OUT/rss.png"
TAR=$OUT/soak-logs.tar.gz
tar -C "$(dirname "$RUN")" --exclude='ledger*' --exclude='*.ipc' -czf "$TAR" "$(basename "$RUN")" 2>/dev/null
if [ "$(stat -c %s "$TAR" 2>/dev/null || echo 0)" -gt $(( 15 * 1024 * 1024 )) ]; then
  tar -C "$(dirname "$RUN")" --exclude='ledger*' --exclude='*.ipc' --exclude='c*.log' -czf "$TAR" "$(basename "$RUN")" 2>/dev/null
  echo "note: the CPU clients' logs (logs/c*.log) left out of soak-logs.tar.gz (over 15 MiB)" >>"$SUM"
fi
if [ "$(stat -c %s "$TAR" 2>/dev/null || echo 0)" -gt $(( 15 * 1024 * 1024 )) ]; then
  tar -C "$(dirname "$RUN")" --exclude='ledger*' --exclude='*.ipc' --exclude='*.log' -czf "$TAR" "$(basename "$RUN")" 2>/dev/null
  echo "note: every log (*.log) left out of soak-logs.tar.gz (over 15 MiB)" >>"$SUM"
fi
echo "archive: $(basename "$TAR") $(du -h "$TAR" | cut -f1)" >>"$SUM"
[ -f "$OUT/summary.txt" ] && [ "$SUM" != "$OUT/summary.txt" ] && { echo; cat "$SUM"; } >>"$OUT/summary.txt"
echo
echo "==== gpu-soak summary ===="
cat "$SUM"
# For --collect (a detached run): the status, last.
[ "$OUT" = "$KEEP/out" ] && echo "$rc" >"$KEEP/rc"
exit "$rc"

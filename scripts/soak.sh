#!/usr/bin/env bash
# soak.sh [--minutes N | --seconds N] [--build DIR] [--out DIR] [--chaos N]
#
# The soak under chaos of docs/reliability.md (not in CI).  One
# chimaera-server, serving shm://, ipc:// and tcp:// loopback with the soak
# module (tests/soak/soak_module.c: records every task id it runs in a ledger
# file that outlives the server), and client processes on every transport
# (tests/soak/soak_client.c: submit without pause, check every output, log
# every outcome): per transport one steady client and N chaos clients (default
# 3).  While it runs, a chaos loop SIGKILLs a random chaos client every 200-600
# ms and starts a new one (a new client number), and SIGKILLs the server once
# at the half and restarts it: every client then sees CHI_ERR_DISCONNECTED
# and re-connects.  The server's RSS, clients and slots are sampled every
# second (rss.csv, and rss.png with gnuplot).  At the end every client exits
# by itself at the deadline; the script then checks, and prints:
#   - tasks submitted, completed, failed by status (tests/soak/soak_check.c);
#   - lost tasks (answered CHI_OK to a client, absent from the ledger): 0;
#   - tasks run twice (the ledger's duplicate counter): 0;
#   - the server's slots, client sessions and client tasks in flight back at
#     the baseline of a fresh server (chimaera-ctl status --json, all three
#     addresses), its counters consistent (submitted = completed + failed);
#   - the server's RSS at its starts and at the end (without the pages of the
#     ledger it maps: the soak's bookkeeping, not the server's memory);
#   - no hang: every client exited by itself within BOUND_S (default 30) of
#     the deadline with status 0, the server stopped on SIGTERM within 15 s.
# Everything is written to the run directory (default BUILD/soak-DATE):
# summary.txt, check.txt, rss.csv, rss.png, server.log, logs/ (one per
# client), status JSON, and the ledger (a sparse file, removed when every
# check passed).  Needs jq; gnuplot for the plot.  SOAK_BOUND_S sets the
# clients' exit bound.
# Exit status: 0 when every check passed, 1 otherwise, 2 usage, 77 no jq.
set -u -o pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$ROOT/build
DURATION_S=600
CHAOS=3
OUTDIR=
BOUND_S=${SOAK_BOUND_S:-30}
usage() {
  sed -n '2,2p' "$0" | sed 's/^# //' >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) [ $# -ge 2 ] || usage; DURATION_S=$(( $2 * 60 )); shift 2 ;;
    --seconds) [ $# -ge 2 ] || usage; DURATION_S=$2; shift 2 ;;
    --build) [ $# -ge 2 ] || usage; BUILD=$2; shift 2 ;;
    --out) [ $# -ge 2 ] || usage; OUTDIR=$2; shift 2 ;;
    --chaos) [ $# -ge 2 ] || usage; CHAOS=$2; shift 2 ;;
    -h|--help) usage ;;
    *) echo "soak.sh: unknown argument '$1'" >&2; usage ;;
  esac
done
case "$DURATION_S$CHAOS" in *[!0-9]*) usage ;; esac
[ "$DURATION_S" -ge 10 ] || { echo "soak.sh: at least 10 seconds" >&2; exit 2; }
BUILD=$(cd "$BUILD" && pwd) || exit 2
SERVER=$BUILD/src/tools/chimaera-server
CTL=$BUILD/src/tools/chimaera-ctl
MODULE=$BUILD/tests/soak/libchi_soak_module.so
CLIENT=$BUILD/tests/soak/soak_client
CHECK=$BUILD/tests/soak/soak_check
for f in "$SERVER" "$CTL" "$MODULE" "$CLIENT" "$CHECK"; do
  [ -e "$f" ] || { echo "soak.sh: no $f (build first)" >&2; exit 2; }
done
command -v jq >/dev/null || { echo "soak.sh: needs jq (skipped)" >&2; exit 77; }

RUN=${OUTDIR:-$BUILD/soak-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$RUN/logs" && chmod 700 "$RUN" || exit 2
RUN=$(cd "$RUN" && pwd)
# A directory used before (--out): drop that run's files.
rm -f "$RUN"/logs/c*.log "$RUN"/logs/c*.err "$RUN"/ledger "$RUN"/server.* "$RUN"/status-*.json \
  "$RUN"/rss.csv "$RUN"/rss.png "$RUN"/check.txt "$RUN"/gnuplot.log "$RUN"/soak.ipc*
SUMMARY=$RUN/summary.txt
: >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }

# Private runtime directory (shm:// endpoint files), ledger, addresses.
export CHI_RUNTIME_DIR=$RUN
export CHI_SOAK_LEDGER=$RUN/ledger
# Room for 500000 tasks a second from one client, and for a client start
# every 200 ms (the file is sparse: only pages of ids that ran use disk).
SEQ_BITS=20
while [ "$SEQ_BITS" -lt 32 ] && [ $(( 1 << SEQ_BITS )) -lt $(( DURATION_S * 500000 )) ]; do
  SEQ_BITS=$(( SEQ_BITS + 1 ))
done
export CHI_SOAK_SEQ_BITS=$SEQ_BITS
export CHI_SOAK_CLIENTS=$(( 64 + DURATION_S * 6 ))
NAME=soak$$
ADDRS=("shm://$NAME" "ipc://$RUN/soak.ipc" "")
printf 'modules: [%s]\n' "$MODULE" >"$RUN/server.yaml"

now_ms() { date +%s%3N; }
# A child that runs (kill -0 also succeeds on one that exited, unreaped).
alive() {
  local st
  st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$st" ] && [ "$st" != Z ]
}

SPID=
SAMPLER=
declare -a CPID CNUM CADDR
cleanup() {
  [ -n "$SAMPLER" ] && kill "$SAMPLER" 2>/dev/null
  for i in "${!CPID[@]}"; do
    [ -n "${CPID[$i]}" ] && kill -9 "${CPID[$i]}" 2>/dev/null
  done
  [ -n "$SPID" ] && kill -9 "$SPID" 2>/dev/null
}
trap cleanup EXIT
trap 'exit 1' INT TERM

ctl_json() { # ADDRESS -> status JSON on stdout
  timeout 10 "$CTL" --address "$1" status --json 2>/dev/null
}

# Starts the server on the three addresses; waits until all answer (20 s).
start_server() {
  "$SERVER" --config "$RUN/server.yaml" --listen "${ADDRS[0]}" --listen "${ADDRS[1]}" \
    --listen "${ADDRS[2]}" 2>>"$RUN/server.log" &
  SPID=$!
  echo "$SPID" >"$RUN/server.pid"
  local t0; t0=$(now_ms)
  while [ $(( $(now_ms) - t0 )) -lt 20000 ]; do
    alive "$SPID" || { wait "$SPID"; SPID=; return 1; }
    if timeout 5 "$CTL" --address "${ADDRS[0]}" ping >/dev/null 2>&1 &&
       timeout 5 "$CTL" --address "${ADDRS[1]}" ping >/dev/null 2>&1 &&
       timeout 5 "$CTL" --address "${ADDRS[2]}" ping >/dev/null 2>&1; then
      return 0
    fi
    sleep 0.05
  done
  return 1
}

# The server's RSS and the part of it that is the ledger's mapped pages (the
# soak's own bookkeeping, not the server's memory), kB: "RSS LEDGER".
rss_pair() {
  awk -v ledger="$CHI_SOAK_LEDGER" '
    FILENAME ~ /status$/ && /^VmRSS:/ {r = $2}
    FILENAME ~ /smaps$/ && /^[0-9a-f]+-[0-9a-f]+ / {in_ledger = ($NF == ledger)}
    FILENAME ~ /smaps$/ && in_ledger && /^Rss:/ {l += $2}
    END {print r + 0, l + 0}' "/proc/$1/status" "/proc/$1/smaps" 2>/dev/null || echo "0 0"
}
# The server's own RSS (without the ledger), kB.
rss_kb() { rss_pair "$1" | awk '{print $1 - $2}'; }
# For the CSV: RSS without the ledger, the ledger's pages, then the RSS
# by kind (anonymous, file, shared memory: the clients' segments), kB.
rss_detail() {
  local p
  p=$(rss_pair "$1")
  awk -v r="${p% *}" -v l="${p#* }" '
    /^RssAnon:/ {a = $2} /^RssFile:/ {f = $2} /^RssShmem:/ {s = $2}
    END {printf "%d,%d,%d,%d,%d", r - l, l, a, f, s}' "/proc/$1/status" 2>/dev/null ||
    echo "0,0,0,0,0"
}

# A free loopback port is not known in advance: try a few.
started=0
for attempt in 1 2 3 4 5; do
  PORT=$(( 20000 + (RANDOM * 32768 + RANDOM) % 40000 ))
  ADDRS[2]="tcp://127.0.0.1:$PORT"
  if start_server; then started=1; break; fi
  [ -n "$SPID" ] && { kill -9 "$SPID"; wait "$SPID"; SPID=; }
done
[ "$started" = 1 ] || { echo "soak.sh: the server does not start (server.log):" >&2; tail -5 "$RUN/server.log" >&2; exit 1; }

BASE_JSON=$(ctl_json "${ADDRS[0]}")
echo "$BASE_JSON" >"$RUN/status-baseline.json"
BASE_SLOTS=$(jq .slots_in_use <<<"$BASE_JSON")
RSS_START=$(rss_kb "$SPID")

say "== soak: $(hostname), $(nproc) CPUs, $(date -u +%FT%TZ), ${DURATION_S} s, build $BUILD"
say "   run directory $RUN"
say "   server pid $SPID on ${ADDRS[*]}; clients per transport: 1 steady + $CHAOS chaos"

# Every second, to rss.csv: seconds since the start, server start (1, 2),
# pid, the server's RSS without the ledger's pages, the ledger's pages, the
# RSS by kind (anonymous, file, shared memory), slots in use, client
# sessions on the three addresses, client tasks in flight.
T0=$(now_ms)
(
  echo "t_s,server_start,pid,rss_kb,ledger_kb,anon_kb,file_kb,shmem_kb,slots_in_use,clients,client_in_flight"
  for (( k = 0; ; k++ )); do
    # The k-th sample at T0 + k s (or as soon as the last one is done).
    d=$(( T0 + k * 1000 - $(now_ms) ))
    [ "$d" -gt 0 ] && sleep "$(( d / 1000 )).$(printf %03d $(( d % 1000 )))"
    t=$(( $(now_ms) - T0 ))
    pid=$(cat "$RUN/server.pid" 2>/dev/null)
    starts=$(cat "$RUN/server.starts" 2>/dev/null || echo 1)
    rss=$(rss_detail "$pid")
    slots=; clients=0; inflight=
    for a in "${ADDRS[@]}"; do
      r=$(timeout 2 "$CTL" --address "$a" status --json 2>/dev/null |
          jq -r '"\(.clients | length) \(.slots_in_use) \(.routes.client.in_flight)"') || continue
      read -r c slots inflight <<<"$r"
      clients=$(( clients + c ))
    done
    printf '%d.%03d,%s,%s,%s,%s,%s,%s\n' $(( t / 1000 )) $(( t % 1000 )) "$starts" "$pid" \
      "$rss" "${slots:-}" "$clients" "${inflight:-}"
  done
) >"$RUN/rss.csv" 2>/dev/null &
SAMPLER=$!
echo 1 >"$RUN/server.starts"

DEADLINE_MS=$(( T0 + DURATION_S * 1000 ))
KILL_SERVER_MS=$(( T0 + DURATION_S * 500 ))
NEXT_CLIENT=1
WINDOWS=(1 4 8 16)
CLIENT_STARTS=0
CLIENT_KILLS=0
EARLY_EXITS=0

start_client() { # SLOT TRANSPORT_INDEX WINDOW
  local slot=$1 t=$2 w=$3 n=$NEXT_CLIENT
  NEXT_CLIENT=$(( n + 1 ))
  "$CLIENT" --address "${ADDRS[$t]}" --client "$n" --log "$RUN/logs/c$n.log" \
    --deadline-ms "$DEADLINE_MS" --window "$w" --seq-bits "$SEQ_BITS" \
    --reconnect-s 30 --hang-s 20 2>"$RUN/logs/c$n.err" &
  CPID[$slot]=$!
  CNUM[$slot]=$n
  CADDR[$slot]=$t
  CLIENT_STARTS=$(( CLIENT_STARTS + 1 ))
}

# Slots 0..2: the steady clients; then CHAOS chaos slots per transport.
NSLOTS=$(( 3 * (1 + CHAOS) ))
for (( s = 0; s < NSLOTS; s++ )); do
  t=$(( s % 3 ))
  if [ "$s" -lt 3 ]; then w=8; else w=${WINDOWS[$(( RANDOM % 4 ))]}; fi
  start_client "$s" "$t" "$w"
done

# The chaos loop, until 1 s before the deadline (a client started later
# would only connect and leave).
SERVER_KILLED=0
RESTART_MS=
RSS_BEFORE_KILL=
while [ $(( $(now_ms) + 1000 )) -lt "$DEADLINE_MS" ]; do
  sleep "0.$(( 200 + RANDOM % 400 ))"
  if [ "$SERVER_KILLED" = 0 ] && [ "$(now_ms)" -ge "$KILL_SERVER_MS" ]; then
    RSS_BEFORE_KILL=$(rss_kb "$SPID")
    SERVER_JSON_BEFORE_KILL=$(ctl_json "${ADDRS[0]}")
    echo "$SERVER_JSON_BEFORE_KILL" >"$RUN/status-before-kill.json"
    kill -9 "$SPID"
    wait "$SPID" 2>/dev/null
    k=$(now_ms)
    echo "$(( (k - T0) / 1000 ))" >"$RUN/server.killed_s"
    say "   $(( (k - T0) / 1000 )) s: server (pid $SPID, RSS $RSS_BEFORE_KILL kB) SIGKILLed"
    SPID=
    if ! start_server; then
      say "FAIL: the server does not restart"
      exit 1
    fi
    echo 2 >"$RUN/server.starts"
    RESTART_MS=$(( $(now_ms) - k ))
    RSS_RESTART=$(rss_kb "$SPID")
    say "   restarted as pid $SPID in $RESTART_MS ms"
    SERVER_KILLED=1
    continue
  fi
  [ "$NEXT_CLIENT" -lt "$CHI_SOAK_CLIENTS" ] || continue
  s=$(( 3 + RANDOM % (NSLOTS - 3) ))
  pid=${CPID[$s]}
  early=1
  alive "$pid" && kill -9 "$pid" 2>/dev/null && early=0
  wait "$pid" 2>/dev/null
  rc=$?
  if [ "$early" = 0 ] && [ "$rc" = 137 ]; then
    CLIENT_KILLS=$(( CLIENT_KILLS + 1 ))
  else
    EARLY_EXITS=$(( EARLY_EXITS + 1 ))
    say "FAIL: client ${CNUM[$s]} (${ADDRS[${CADDR[$s]}]}) exited by itself before the deadline, status $rc"
  fi
  start_client "$s" "${CADDR[$s]}" "${WINDOWS[$(( RANDOM % 4 ))]}"
done

# Every client exits by itself at the deadline, within BOUND_S.
HANGS=0
BAD_EXITS=0
LATEST_MS=0
declare -A DONE
while :; do
  left=0
  for s in "${!CPID[@]}"; do
    [ -n "${DONE[$s]:-}" ] && continue
    pid=${CPID[$s]}
    if alive "$pid"; then
      left=$(( left + 1 ))
      continue
    fi
    wait "$pid"
    rc=$?
    DONE[$s]=1
    late=$(( $(now_ms) - DEADLINE_MS ))
    [ "$late" -gt "$LATEST_MS" ] && LATEST_MS=$late
    if [ "$rc" != 0 ]; then
      BAD_EXITS=$(( BAD_EXITS + 1 ))
      say "FAIL: client ${CNUM[$s]} (${ADDRS[${CADDR[$s]}]}) exited with status $rc"
    fi
  done
  [ "$left" = 0 ] && break
  if [ $(( $(now_ms) - DEADLINE_MS )) -gt $(( BOUND_S * 1000 )) ]; then
    for s in "${!CPID[@]}"; do
      [ -n "${DONE[$s]:-}" ] && continue
      HANGS=$(( HANGS + 1 ))
      say "FAIL: client ${CNUM[$s]} (${ADDRS[${CADDR[$s]}]}, pid ${CPID[$s]}) still runs ${BOUND_S} s after the deadline"
      kill -9 "${CPID[$s]}" 2>/dev/null
      wait "${CPID[$s]}" 2>/dev/null
      DONE[$s]=1
    done
    break
  fi
  sleep 0.05
done
CPID=()

# The server after every client left: back at baseline (sessions close
# asynchronously: allow 10 s).
FINAL_OK=0
for i in $(seq 1 100); do
  ok=1
  for a in 0 1 2; do
    j=$(ctl_json "${ADDRS[$a]}") || { ok=0; continue; }
    echo "$j" >"$RUN/status-end-$a.json"
    [ "$(jq '.clients | length' <<<"$j")" = 0 ] || ok=0
  done
  j=$(cat "$RUN/status-end-0.json")
  [ "$(jq .slots_in_use <<<"$j")" = "$BASE_SLOTS" ] || ok=0
  [ "$(jq .routes.client.in_flight <<<"$j")" = 0 ] || ok=0
  [ "$(jq '.routes.client.submitted == .routes.client.completed + .routes.client.failed' <<<"$j")" = true ] || ok=0
  [ "$ok" = 1 ] && { FINAL_OK=1; break; }
  sleep 0.1
done
END_JSON=$(cat "$RUN/status-end-0.json")
RSS_END=$(rss_kb "$SPID")
sleep 1.5 # one more RSS sample
kill "$SAMPLER" 2>/dev/null
wait "$SAMPLER" 2>/dev/null
SAMPLER=

# Stop the server (SIGTERM) within 15 s.
STOP_OK=1
kill -TERM "$SPID"
for i in $(seq 1 150); do alive "$SPID" || break; sleep 0.1; done
if alive "$SPID"; then
  STOP_OK=0
  say "FAIL: the server did not stop within 15 s of SIGTERM"
  kill -9 "$SPID"
fi
wait "$SPID"
SERVER_RC=$?
[ "$SERVER_RC" = 0 ] || { STOP_OK=0; say "FAIL: the server exited with status $SERVER_RC on SIGTERM"; }
SPID=

# The ledger against every client log.
say ""
say "== outcomes (soak_check)"
"$CHECK" "$CHI_SOAK_LEDGER" "$RUN"/logs/c*.log >"$RUN/check.txt" 2>&1
CHECK_RC=$?
sed 's/^/   /' "$RUN/check.txt" | tee -a "$SUMMARY"
get() { sed -n "s/^$1: //p" "$RUN/check.txt"; }

# The RSS plot.
PNG=
if command -v gnuplot >/dev/null; then
  restart_s=$(cat "$RUN/server.killed_s" 2>/dev/null)
  arrow=
  [ -n "$restart_s" ] && arrow="set arrow from $restart_s, graph 0 to $restart_s, graph 1 nohead dt 2 lc rgb '#cc0000'"
  max_clients=$(awk -F, 'NR > 1 && $10 > m {m = $10} END {print m + 0}' "$RUN/rss.csv")
  if gnuplot <<EOF 2>>"$RUN/gnuplot.log"; then
set terminal pngcairo size 900,420 font ",10"
set output "$RUN/rss.png"
set datafile separator ","
set key top left
set xlabel "seconds"
set ylabel "server RSS (MiB)"
set y2label "client sessions"
set ytics nomirror
set y2tics
set yrange [0:*]
set y2range [0:$(( max_clients * 3 / 2 + 1 ))]
$arrow
set grid
set title "chimaera-server under chaos: $(nproc) CPUs, ${DURATION_S} s, server SIGKILLed and restarted at ${restart_s:-?} s"
plot "$RUN/rss.csv" every ::1 using 1:(\$4/1024) with lines lw 2 title "server RSS (without the soak ledger's pages)", \
     "$RUN/rss.csv" every ::1 using 1:((\$4+\$5)/1024) with lines lw 1 dt 3 title "RSS with the ledger's pages", \
     "$RUN/rss.csv" every ::1 using 1:10 axes x1y2 with lines lc rgb "#999999" title "client sessions"
EOF
    PNG=$RUN/rss.png
  fi
fi

say ""
say "== soak summary"
say "   duration:                ${DURATION_S} s, $(nproc) CPUs, 3 transports (shm, ipc, tcp loopback)"
say "   client processes:        $CLIENT_STARTS started, $CLIENT_KILLS SIGKILLed by the chaos loop"
say "   server:                  SIGKILLed once at $(( DURATION_S / 2 )) s, restarted in ${RESTART_MS:-?} ms"
say "   tasks submitted:         $(get 'tasks submitted')"
say "   tasks completed (OK):    $(get 'tasks completed')"
say "   tasks failed:            $(get 'tasks failed')"
sed -n 's/^failed /     /p' "$RUN/check.txt" | tee -a "$SUMMARY"
say "   lost:                    $(get lost)"
say "   run twice:               $(get 'run twice')"
say "   slots in use at end:     $(jq .slots_in_use <<<"$END_JSON") (baseline $BASE_SLOTS)"
say "   client sessions at end:  $(cat "$RUN"/status-end-*.json | jq -s 'map(.clients | length) | add')"
say "   client tasks in flight:  $(jq .routes.client.in_flight <<<"$END_JSON"), server counters since restart: submitted $(jq .routes.client.submitted <<<"$END_JSON") = completed $(jq .routes.client.completed <<<"$END_JSON") + failed $(jq .routes.client.failed <<<"$END_JSON")"
say "   server RSS (no ledger):  start $RSS_START kB, before the kill ${RSS_BEFORE_KILL:-?} kB, after restart ${RSS_RESTART:-?} kB, end $RSS_END kB"
say "   clients' exits:          latest $LATEST_MS ms after the deadline (bound ${BOUND_S} s), $HANGS hung, $BAD_EXITS with a non-zero status, $EARLY_EXITS early"
say "   server stop (SIGTERM):   $([ "$STOP_OK" = 1 ] && echo "ok, status 0" || echo FAILED)"
[ -n "$PNG" ] && say "   RSS plot:                $PNG"

FAIL=0
[ "$CHECK_RC" = 0 ] || FAIL=1
[ "$FINAL_OK" = 1 ] || { FAIL=1; say "FAIL: server counters not back at baseline (status-end-*.json)"; }
[ "$HANGS" = 0 ] && [ "$BAD_EXITS" = 0 ] && [ "$EARLY_EXITS" = 0 ] && [ "$STOP_OK" = 1 ] || FAIL=1
[ "$SERVER_KILLED" = 1 ] || FAIL=1
if [ "$FAIL" = 0 ]; then
  rm -f "$CHI_SOAK_LEDGER" # large (sparse): kept only when a check failed
  say "== soak PASSED (ledger removed; summary in $SUMMARY)"
else
  say "== soak FAILED (ledger kept: $CHI_SOAK_LEDGER)"
fi
exit "$FAIL"

#!/usr/bin/env bash
# soak.sh [--minutes N | --seconds N] [--build DIR] [--out DIR] [--chaos N] [--gpu auto|on|off] [--gpu-chaos N]
#
# The soak under chaos of docs/reliability.md (not in CI).  One
# chimaera-server, serving shm://, ipc:// and tcp:// loopback with the soak
# module (tests/soak/soak_module.c: records every task id it runs in a ledger
# file that outlives the server), and client processes on every transport
# (tests/soak/soak_client.c: submit without pause, check every output, log
# every outcome): per transport one steady client and N chaos clients (default
# 3).  While it runs, a chaos loop SIGKILLs a random chaos client every 200-600
# ms and starts a new one (a new client number), SIGKILLs the server at a
# third of the time and SIGTERMs it at two thirds, restarting it each time:
# every client then sees CHI_ERR_DISCONNECTED (or CHI_ERR_SHUTDOWN) and
# re-connects.  The server's RSS, clients and slots are sampled every second
# (rss.csv, and rss.png with gnuplot).  At the end every client exits by
# itself at the deadline; the script then checks, and prints:
#   - tasks submitted, completed, failed by status (tests/soak/soak_check.c);
#   - lost tasks (answered CHI_OK to a client, absent from the ledger): 0;
#   - tasks run twice (the ledger's duplicate counter): 0;
#   - the server's slots, client sessions and client tasks in flight back at
#     the baseline of a fresh server (chimaera-ctl status --json, all three
#     addresses), its counters consistent (submitted = completed + failed);
#   - the server's RSS at its starts and at the end (without the pages of the
#     ledger it maps: the soak's bookkeeping, not the server's memory);
#   - no hang: every client exited by itself within BOUND_S (default 30) of
#     the deadline with status 0, the server stopped on SIGTERM within 15 s
#     with status 0 (mid-run and at the end).
#
# GPU routes (--gpu, or $SOAK_GPU; "auto", the default, means on when the
# build has tests/soak/soak_gpu (CUDA) and nvidia-smi lists a GPU): the
# server then drives the GPU and the module's GPU handler of soak.record
# (it records through a GPU->CPU task, so GPU runs land in the ledger);
# per transport one steady and N (--gpu-chaos, default 1) chaos clients
# submit CPU->GPU tasks (soak.record, and chi.echo/add/checksum with their
# outputs checked: not in the ledger), the chaos ones killed like the
# others; and tests/soak/soak_gpu, an embedded program whose kernels submit
# GPU->CPU and GPU->GPU tasks (waited and checked, some released, some
# warp-collective) and whose host thread submits CPU->GPU ones, runs beside
# with a ledger of its own (ledger-gpu), SIGKILLed every eighth of the time
# (SIGTERMed once, at the middle: it must exit 0 with its slots back) and
# restarted.  Checked in addition: the embedded logs against ledger-gpu
# (soak_check, check-gpu.txt: lost 0, run twice 0); the server's
# device_slots_in_use and GPU tasks in flight back at 0 at the end
# (chi_stats: soak_client --stats); the embedded program's own end check
# (device_slots_in_use, CPU slots, tasks in flight 0 within 10 s) at its
# SIGTERM and at the deadline; its RSS at its first start and at the end.
# Everything is written to the run directory (default BUILD/soak-DATE):
# summary.txt, check.txt (check-gpu.txt), rss.csv, rss.png, server.log, logs/
# (one per client; eK-* for the embedded program), status JSON, and the ledger (a sparse file, removed when every
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
GPU=${SOAK_GPU:-auto}
GPU_CHAOS=1
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
    --gpu) [ $# -ge 2 ] || usage; GPU=$2; shift 2 ;;
    --gpu-chaos) [ $# -ge 2 ] || usage; GPU_CHAOS=$2; shift 2 ;;
    -h|--help) usage ;;
    *) echo "soak.sh: unknown argument '$1'" >&2; usage ;;
  esac
done
case "$DURATION_S$CHAOS$GPU_CHAOS" in *[!0-9]*) usage ;; esac
case "$GPU" in auto|on|off) ;; *) usage ;; esac
[ "$DURATION_S" -ge 10 ] || { echo "soak.sh: at least 10 seconds" >&2; exit 2; }
BUILD=$(cd "$BUILD" && pwd) || exit 2
SERVER=$BUILD/src/tools/chimaera-server
CTL=$BUILD/src/tools/chimaera-ctl
MODULE=$BUILD/tests/soak/libchi_soak_module.so
CLIENT=$BUILD/tests/soak/soak_client
CHECK=$BUILD/tests/soak/soak_check
SOAK_GPU_BIN=$BUILD/tests/soak/soak_gpu
for f in "$SERVER" "$CTL" "$MODULE" "$CLIENT" "$CHECK"; do
  [ -e "$f" ] || { echo "soak.sh: no $f (build first)" >&2; exit 2; }
done
command -v jq >/dev/null || { echo "soak.sh: needs jq (skipped)" >&2; exit 77; }
if [ "$GPU" = auto ]; then
  GPU=off
  [ -x "$SOAK_GPU_BIN" ] && nvidia-smi -L 2>/dev/null | grep -q '^GPU' && GPU=on
elif [ "$GPU" = on ] && [ ! -x "$SOAK_GPU_BIN" ]; then
  echo "soak.sh: --gpu on needs a CUDA build ($SOAK_GPU_BIN)" >&2
  exit 2
fi

RUN=${OUTDIR:-$BUILD/soak-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$RUN/logs" && chmod 700 "$RUN" || exit 2
RUN=$(cd "$RUN" && pwd)
# A directory used before (--out): drop that run's files.
rm -f "$RUN"/logs/c*.log "$RUN"/logs/c*.err "$RUN"/ledger "$RUN"/server.* "$RUN"/status-*.json \
  "$RUN"/rss.csv "$RUN"/rss.png "$RUN"/check.txt "$RUN"/gnuplot.log "$RUN"/soak.ipc* \
  "$RUN"/logs/e*.log "$RUN"/logs/e*.out "$RUN"/logs/e*.err "$RUN"/ledger-gpu "$RUN"/check-gpu.txt \
  "$RUN"/emb.pid "$RUN"/stats-end.json
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
# Without GPU routes the server drives no GPU either (a CPU-only soak on a GPU host).
[ "$GPU" = on ] || printf 'gpu:\n  devices: 0\n' >>"$RUN/server.yaml"
# The embedded GPU program's ledger: one client number per kind of task and
# round, EMB_CLIENTS of them for each of at most EMB_MAX_STARTS starts.
EMB_SEQ_BITS=14
EMB_CLIENTS=65536
EMB_MAX_STARTS=16

now_ms() { date +%s%3N; }
# A child that runs (kill -0 also succeeds on one that exited, unreaped).
alive() {
  local st
  st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$st" ] && [ "$st" != Z ]
}

SPID=
SAMPLER=
EPID=
declare -a CPID CNUM CADDR CROUTE
cleanup() {
  [ -n "$SAMPLER" ] && kill "$SAMPLER" 2>/dev/null
  for i in "${!CPID[@]}"; do
    [ -n "${CPID[$i]}" ] && kill -9 "${CPID[$i]}" 2>/dev/null
  done
  [ -n "$SPID" ] && kill -9 "$SPID" 2>/dev/null
  [ -n "$EPID" ] && kill -9 "$EPID" 2>/dev/null
}
trap cleanup EXIT
trap 'exit 1' INT TERM

ctl_json() { # ADDRESS -> status JSON on stdout
  timeout 10 "$CTL" --address "$1" status --json 2>/dev/null
}

# Starts the server on the three addresses; waits until all answer (20 s,
# 60 s with a GPU to set up).
SERVER_START_MS=20000
[ "$GPU" = on ] && SERVER_START_MS=60000
start_server() {
  "$SERVER" --config "$RUN/server.yaml" --listen "${ADDRS[0]}" --listen "${ADDRS[1]}" \
    --listen "${ADDRS[2]}" 2>>"$RUN/server.log" &
  SPID=$!
  echo "$SPID" >"$RUN/server.pid"
  local t0; t0=$(now_ms)
  while [ $(( $(now_ms) - t0 )) -lt "$SERVER_START_MS" ]; do
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
rss_pair() { # PID [LEDGER]
  awk -v ledger="${2:-$CHI_SOAK_LEDGER}" '
    FILENAME ~ /status$/ && /^VmRSS:/ {r = $2}
    FILENAME ~ /smaps$/ && /^[0-9a-f]+-[0-9a-f]+ / {in_ledger = ($NF == ledger)}
    FILENAME ~ /smaps$/ && in_ledger && /^Rss:/ {l += $2}
    END {print r + 0, l + 0}' "/proc/$1/status" "/proc/$1/smaps" 2>/dev/null || echo "0 0"
}
# The server's own RSS (without the ledger), kB.
rss_kb() { rss_pair "$@" | awk '{print $1 - $2}'; }
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
SERVER_GPUS=$(jq .gpus <<<"$BASE_JSON")
if [ "$GPU" = on ] && ! [ "${SERVER_GPUS:-0}" -ge 1 ] 2>/dev/null; then
  echo "soak.sh: FAIL: GPU routes on, but the server drives no GPU (server.log):" >&2
  tail -5 "$RUN/server.log" >&2
  exit 1
fi

say "== soak: $(hostname), $(nproc) CPUs, $(date -u +%FT%TZ), ${DURATION_S} s, build $BUILD"
say "   run directory $RUN"
say "   server pid $SPID on ${ADDRS[*]}; clients per transport: 1 steady + $CHAOS chaos"
if [ "$GPU" = on ]; then
  say "   GPU routes on ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)): per transport 1 steady + $GPU_CHAOS chaos CPU->GPU clients; embedded soak_gpu beside"
else
  say "   GPU routes off"
fi

# Every second, to rss.csv: seconds since the start, server start (1, 2),
# pid, the server's RSS without the ledger's pages, the ledger's pages, the
# RSS by kind (anonymous, file, shared memory), slots in use, client
# sessions on the three addresses, client tasks in flight.
T0=$(now_ms)
(
  echo "t_s,server_start,pid,rss_kb,ledger_kb,anon_kb,file_kb,shmem_kb,slots_in_use,clients,client_in_flight,emb_pid,emb_rss_kb"
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
    epid=$(cat "$RUN/emb.pid" 2>/dev/null)
    erss=
    [ -n "$epid" ] && erss=$(rss_kb "$epid" "$RUN/ledger-gpu")
    printf '%d.%03d,%s,%s,%s,%s,%s,%s,%s,%s\n' $(( t / 1000 )) $(( t % 1000 )) "$starts" "$pid" \
      "$rss" "${slots:-}" "$clients" "${inflight:-}" "$epid" "$erss"
  done
) >"$RUN/rss.csv" 2>/dev/null &
SAMPLER=$!
echo 1 >"$RUN/server.starts"

DEADLINE_MS=$(( T0 + DURATION_S * 1000 ))
KILL_SERVER_MS=$(( T0 + DURATION_S * 1000 / 3 ))
TERM_SERVER_MS=$(( T0 + DURATION_S * 2000 / 3 ))
NEXT_CLIENT=1
WINDOWS=(1 4 8 16)
CLIENT_STARTS=0
CLIENT_KILLS=0
EARLY_EXITS=0

start_client() { # SLOT TRANSPORT_INDEX WINDOW ROUTE
  local slot=$1 t=$2 w=$3 r=$4 n=$NEXT_CLIENT
  NEXT_CLIENT=$(( n + 1 ))
  "$CLIENT" --address "${ADDRS[$t]}" --client "$n" --log "$RUN/logs/c$n.log" \
    --deadline-ms "$DEADLINE_MS" --window "$w" --seq-bits "$SEQ_BITS" --route "$r" \
    --reconnect-s 30 --hang-s 20 2>"$RUN/logs/c$n.err" &
  CPID[$slot]=$!
  CNUM[$slot]=$n
  CADDR[$slot]=$t
  CROUTE[$slot]=$r
  CLIENT_STARTS=$(( CLIENT_STARTS + 1 ))
  [ "$r" = gpu ] && GPU_CLIENT_STARTS=$(( GPU_CLIENT_STARTS + 1 ))
}

# Slots 0..2: the steady clients; then CHAOS chaos slots per transport; with
# GPU routes, 3 steady CPU->GPU clients and GPU_CHAOS chaos ones per transport.
GPU_CLIENT_STARTS=0
NCPU=$(( 3 * (1 + CHAOS) ))
NGPU=0
[ "$GPU" = on ] && NGPU=$(( 3 * (1 + GPU_CHAOS) ))
NSLOTS=$(( NCPU + NGPU ))
CHAOS_SLOTS=()
for (( s = 0; s < NSLOTS; s++ )); do
  if [ "$s" -lt "$NCPU" ]; then i=$s r=cpu; else i=$(( s - NCPU )) r=gpu; fi
  t=$(( i % 3 ))
  if [ "$i" -lt 3 ]; then w=8; else w=${WINDOWS[$(( RANDOM % 4 ))]}; CHAOS_SLOTS+=("$s"); fi
  start_client "$s" "$t" "$w" "$r"
done

# The embedded GPU program: started, SIGKILLed every eighth of the time
# (SIGTERMed at the middle one) and started again, at most EMB_MAX_STARTS
# times; each start has client numbers of its own in ledger-gpu.
EMB_STARTS=0
EMB_KILLS=0
EMB_TERMS=0
EMB_RSS_FIRST=
EMB_FAILS=0
EMB_INTERVAL_MS=$(( DURATION_S * 1000 / 8 ))
[ "$EMB_INTERVAL_MS" -lt 20000 ] && EMB_INTERVAL_MS=20000
EMB_NEXT_MS=$(( T0 + EMB_INTERVAL_MS ))
EMB_TERM_DONE=0
emb_fail() { EMB_FAILS=$(( EMB_FAILS + 1 )); say "FAIL: $*"; }
start_embedded() {
  [ "$EMB_STARTS" -lt "$EMB_MAX_STARTS" ] || return 1
  EMB_STARTS=$(( EMB_STARTS + 1 ))
  local k=$EMB_STARTS
  CHI_SOAK_LEDGER=$RUN/ledger-gpu CHI_SOAK_SEQ_BITS=$EMB_SEQ_BITS \
    CHI_SOAK_CLIENTS=$(( EMB_MAX_STARTS * EMB_CLIENTS )) \
    "$SOAK_GPU_BIN" --module "$MODULE" --dir "$RUN/logs" --start "$k" \
    --client-base $(( (k - 1) * EMB_CLIENTS )) --clients "$EMB_CLIENTS" --seq-bits "$EMB_SEQ_BITS" \
    --deadline-ms "$DEADLINE_MS" >"$RUN/logs/e$k.out" 2>"$RUN/logs/e$k.err" &
  EPID=$!
  echo "$EPID" >"$RUN/emb.pid"
}
# Whether the embedded program said it is ready (its RSS after start-up).
emb_ready() { grep -q '^soak_gpu: ready' "$RUN/logs/e$EMB_STARTS.out" 2>/dev/null; }
# Waits for the embedded program's exit (bound S seconds); its status in EMB_RC.
emb_wait() {
  local i
  for (( i = 0; i < $1 * 10; i++ )); do alive "$EPID" || break; sleep 0.1; done
  if alive "$EPID"; then
    kill -9 "$EPID" 2>/dev/null
    wait "$EPID" 2>/dev/null
    EMB_RC=timeout
  else
    wait "$EPID"
    EMB_RC=$?
  fi
  EPID=
  rm -f "$RUN/emb.pid"
}
if [ "$GPU" = on ]; then
  start_embedded
  for (( i = 0; i < 600; i++ )); do
    if emb_ready || ! alive "$EPID"; then break; fi
    sleep 0.1
  done
  if emb_ready; then
    EMB_RSS_FIRST=$(sed -n 's/^soak_gpu: ready .* rss_kb \([0-9]*\).*/\1/p' "$RUN/logs/e1.out")
    say "   soak_gpu pid $EPID ready, RSS $EMB_RSS_FIRST kB (without ledger-gpu's pages)"
  else
    # The rest of the soak goes on; the chaos loop tries to start it again.
    emb_wait 5
    emb_fail "soak_gpu did not start (status $EMB_RC; logs/e1.out, logs/e1.err):"
    tail -n 5 "$RUN/logs/e1.err" "$RUN/logs/e1.out" | tee -a "$SUMMARY"
  fi
fi

# The chaos loop, until 1 s before the deadline (a client started later
# would only connect and leave).
SERVER_KILLED=0
SERVER_TERMED=0
TERM_OK=0
RESTART_MS=
RESTART2_MS=
TERM_STOP_MS=
RSS_BEFORE_KILL=
RSS_BEFORE_TERM=
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
  if [ "$SERVER_TERMED" = 0 ] && [ "$(now_ms)" -ge "$TERM_SERVER_MS" ]; then
    # A graceful stop under load: status 0 within 15 s, then a restart.
    RSS_BEFORE_TERM=$(rss_kb "$SPID")
    ctl_json "${ADDRS[0]}" >"$RUN/status-before-term.json"
    k=$(now_ms)
    kill -TERM "$SPID"
    for i in $(seq 1 150); do alive "$SPID" || break; sleep 0.1; done
    if alive "$SPID"; then
      say "FAIL: the server did not stop within 15 s of a SIGTERM under load"
      kill -9 "$SPID"
    fi
    wait "$SPID"
    rc=$?
    TERM_STOP_MS=$(( $(now_ms) - k ))
    [ "$rc" = 0 ] && TERM_OK=1 || say "FAIL: the server exited with status $rc on a SIGTERM under load"
    echo "$(( (k - T0) / 1000 ))" >"$RUN/server.termed_s"
    say "   $(( (k - T0) / 1000 )) s: server (pid $SPID, RSS $RSS_BEFORE_TERM kB) SIGTERMed: status $rc in $TERM_STOP_MS ms"
    SPID=
    k=$(now_ms)
    if ! start_server; then
      say "FAIL: the server does not restart"
      exit 1
    fi
    echo 3 >"$RUN/server.starts"
    RESTART2_MS=$(( $(now_ms) - k ))
    RSS_RESTART2=$(rss_kb "$SPID")
    say "   restarted as pid $SPID in $RESTART2_MS ms"
    SERVER_TERMED=1
    continue
  fi
  if [ "$GPU" = on ] && [ "$(now_ms)" -ge "$EMB_NEXT_MS" ] && [ $(( $(now_ms) + 10000 )) -lt "$DEADLINE_MS" ]; then
    EMB_NEXT_MS=$(( EMB_NEXT_MS + EMB_INTERVAL_MS ))
    if [ -z "$EPID" ]; then
      start_embedded
    elif emb_ready && [ "$EMB_STARTS" -lt "$EMB_MAX_STARTS" ]; then
      k=$(now_ms)
      if [ "$EMB_TERM_DONE" = 0 ] && [ $(( k - T0 )) -ge $(( DURATION_S * 500 )) ]; then
        # Once, at the middle: a graceful stop, with the program's own checks.
        kill -TERM "$EPID"
        emb_wait 60
        EMB_TERMS=$(( EMB_TERMS + 1 ))
        EMB_TERM_DONE=1
        say "   $(( (k - T0) / 1000 )) s: soak_gpu start $EMB_STARTS SIGTERMed: status $EMB_RC in $(( $(now_ms) - k )) ms; $(grep -h '^soak_gpu end:' "$RUN/logs/e$EMB_STARTS.out" | sed 's/^soak_gpu end: //')"
        [ "$EMB_RC" = 0 ] || emb_fail "soak_gpu exited with status $EMB_RC on SIGTERM (logs/e$EMB_STARTS.err)"
      else
        say "   $(( (k - T0) / 1000 )) s: soak_gpu start $EMB_STARTS (pid $EPID, RSS $(rss_kb "$EPID" "$RUN/ledger-gpu") kB) SIGKILLed"
        kill -9 "$EPID"
        emb_wait 10
        EMB_KILLS=$(( EMB_KILLS + 1 ))
      fi
      start_embedded
    elif ! alive "$EPID"; then
      emb_wait 1
      emb_fail "soak_gpu start $EMB_STARTS exited by itself before the deadline, status $EMB_RC (logs/e$EMB_STARTS.err)"
      start_embedded
    fi
    continue
  fi
  [ "$NEXT_CLIENT" -lt "$CHI_SOAK_CLIENTS" ] || continue
  s=${CHAOS_SLOTS[$(( RANDOM % ${#CHAOS_SLOTS[@]} ))]}
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
  start_client "$s" "${CADDR[$s]}" "${WINDOWS[$(( RANDOM % 4 ))]}" "${CROUTE[$s]}"
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

# The embedded program ends its last round after the deadline, checks its
# slots (up to 10 s) and exits 0.
EMB_END=
if [ "$GPU" = on ] && [ -n "$EPID" ]; then
  emb_wait $(( BOUND_S + 60 ))
  EMB_END=$(grep -h '^soak_gpu end:' "$RUN/logs/e$EMB_STARTS.out" | sed 's/^soak_gpu end: //')
  [ "$EMB_RC" = 0 ] || emb_fail "soak_gpu start $EMB_STARTS: status $EMB_RC at the deadline (logs/e$EMB_STARTS.err: $(grep -h FAIL "$RUN/logs/e$EMB_STARTS.err" | head -3))"
fi

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
# Device slots are only in chi_stats: ask as a client (up to 10 s to drain).
GPU_END_OK=1
STATS_END=
if [ "$GPU" = on ]; then
  GPU_END_OK=0
  for i in $(seq 1 50); do
    STATS_END=$(timeout 10 "$CLIENT" --stats --address "${ADDRS[0]}" 2>>"$RUN/server.log") || { sleep 0.2; continue; }
    echo "$STATS_END" >"$RUN/stats-end.json"
    [ "$(jq '.device_slots_in_use == 0 and .gpu.in_flight == 0 and .cpu.in_flight == 0' <<<"$STATS_END")" = true ] &&
      { GPU_END_OK=1; break; }
    sleep 0.2
  done
fi
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
get() { sed -n "s/^$1: //p" "${2:-$RUN/check.txt}"; }
CHECK_GPU_RC=0
if [ "$GPU" = on ]; then
  say ""
  say "== outcomes of the embedded GPU program against ledger-gpu (soak_check)"
  "$CHECK" "$RUN/ledger-gpu" "$RUN"/logs/e*-kernel.log "$RUN"/logs/e*-host.log >"$RUN/check-gpu.txt" 2>&1
  CHECK_GPU_RC=$?
  sed 's/^/   /' "$RUN/check-gpu.txt" | tee -a "$SUMMARY"
fi

# The RSS plot.
PNG=
if command -v gnuplot >/dev/null; then
  restart_s=$(cat "$RUN/server.killed_s" 2>/dev/null)
  arrow=
  [ -n "$restart_s" ] && arrow="set arrow from $restart_s, graph 0 to $restart_s, graph 1 nohead dt 2 lc rgb '#cc0000'"
  term_s=$(cat "$RUN/server.termed_s" 2>/dev/null)
  [ -n "$term_s" ] && arrow="$arrow
set arrow from $term_s, graph 0 to $term_s, graph 1 nohead dt 3 lc rgb '#0000cc'"
  emb_plot=
  [ "$GPU" = on ] && emb_plot=", \"$RUN/rss.csv\" every ::1 using 1:(\$13/1024) with lines lw 1 lc rgb '#009900' title \"soak_gpu RSS (embedded, restarted)\""
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
set title "chimaera-server under chaos: $(nproc) CPUs, ${DURATION_S} s, server SIGKILLed at ${restart_s:-?} s, SIGTERMed at ${term_s:-?} s"
plot "$RUN/rss.csv" every ::1 using 1:(\$4/1024) with lines lw 2 title "server RSS (without the soak ledger's pages)", \
     "$RUN/rss.csv" every ::1 using 1:((\$4+\$5)/1024) with lines lw 1 dt 3 title "RSS with the ledger's pages", \
     "$RUN/rss.csv" every ::1 using 1:10 axes x1y2 with lines lc rgb "#999999" title "client sessions"$emb_plot
EOF
    PNG=$RUN/rss.png
  fi
fi

say ""
say "== soak summary"
say "   duration:                ${DURATION_S} s, $(nproc) CPUs, 3 transports (shm, ipc, tcp loopback)"
say "   client processes:        $CLIENT_STARTS started, $CLIENT_KILLS SIGKILLed by the chaos loop"
say "   server:                  SIGKILLed at $(cat "$RUN/server.killed_s" 2>/dev/null || echo ?) s, restarted in ${RESTART_MS:-?} ms; SIGTERMed at $(cat "$RUN/server.termed_s" 2>/dev/null || echo ?) s, stopped in ${TERM_STOP_MS:-?} ms ($([ "$TERM_OK" = 1 ] && echo "status 0" || echo FAILED)), restarted in ${RESTART2_MS:-?} ms"
say "   tasks submitted:         $(get 'tasks submitted')"
say "   tasks completed (OK):    $(get 'tasks completed')"
say "   tasks failed:            $(get 'tasks failed')"
sed -n 's/^failed /     /p' "$RUN/check.txt" | tee -a "$SUMMARY"
say "   lost:                    $(get lost)"
say "   run twice:               $(get 'run twice')"
say "   slots in use at end:     $(jq .slots_in_use <<<"$END_JSON") (baseline $BASE_SLOTS)"
say "   client sessions at end:  $(cat "$RUN"/status-end-*.json | jq -s 'map(.clients | length) | add')"
say "   client tasks in flight:  $(jq .routes.client.in_flight <<<"$END_JSON"), server counters since restart: submitted $(jq .routes.client.submitted <<<"$END_JSON") = completed $(jq .routes.client.completed <<<"$END_JSON") + failed $(jq .routes.client.failed <<<"$END_JSON")"
say "   server RSS (no ledger):  start $RSS_START kB, before the kill ${RSS_BEFORE_KILL:-?} kB, after restart ${RSS_RESTART:-?} kB, before the SIGTERM ${RSS_BEFORE_TERM:-?} kB, after restart ${RSS_RESTART2:-?} kB, end $RSS_END kB"
if [ "$GPU" = on ]; then
  say "   -- GPU routes"
  say "   CPU->GPU clients:        $GPU_CLIENT_STARTS processes (in the client counts above)"
  grep -h '^group [a-z]* cpu->gpu' "$RUN/check.txt" | sed 's/^group /     server /' | tee -a "$SUMMARY"
  say "   server GPU runs:         $(get 'ledger runs a GPU submitted') ledger runs submitted by the GPU handler"
  say "   server at end:           device_slots_in_use $(jq .device_slots_in_use <<<"${STATS_END:-null}") (of $(jq .device_slots_total <<<"${STATS_END:-null}")), GPU route in flight $(jq .gpu.in_flight <<<"${STATS_END:-null}") (chi_stats)"
  say "   soak_gpu (embedded):     $EMB_STARTS starts, $EMB_KILLS SIGKILLed, $EMB_TERMS SIGTERMed; RSS at first start ${EMB_RSS_FIRST:-?} kB; last: ${EMB_END:-none}"
  grep -h '^group embedded' "$RUN/check-gpu.txt" | sed 's/^group /     /' | tee -a "$SUMMARY"
  say "   embedded totals:         submitted $(get 'tasks submitted' "$RUN/check-gpu.txt"), completed $(get 'tasks completed' "$RUN/check-gpu.txt"), released $(get 'tasks released unwaited' "$RUN/check-gpu.txt"), failed $(get 'tasks failed' "$RUN/check-gpu.txt")"
  say "   embedded lost:           $(get lost "$RUN/check-gpu.txt"), run twice: $(get 'run twice' "$RUN/check-gpu.txt"), wrong outputs: $(get 'bad output' "$RUN/check-gpu.txt"), hangs: $(get hangs "$RUN/check-gpu.txt")"
fi
say "   clients' exits:          latest $LATEST_MS ms after the deadline (bound ${BOUND_S} s), $HANGS hung, $BAD_EXITS with a non-zero status, $EARLY_EXITS early"
say "   server stop (SIGTERM):   $([ "$STOP_OK" = 1 ] && echo "ok, status 0" || echo FAILED)"
[ -n "$PNG" ] && say "   RSS plot:                $PNG"

FAIL=0
[ "$CHECK_RC" = 0 ] || FAIL=1
[ "$FINAL_OK" = 1 ] || { FAIL=1; say "FAIL: server counters not back at baseline (status-end-*.json)"; }
[ "$HANGS" = 0 ] && [ "$BAD_EXITS" = 0 ] && [ "$EARLY_EXITS" = 0 ] && [ "$STOP_OK" = 1 ] || FAIL=1
[ "$SERVER_KILLED" = 1 ] && [ "$SERVER_TERMED" = 1 ] && [ "$TERM_OK" = 1 ] || FAIL=1
if [ "$GPU" = on ]; then
  [ "$CHECK_GPU_RC" = 0 ] || { FAIL=1; say "FAIL: the embedded GPU program's outcomes (check-gpu.txt)"; }
  [ "$GPU_END_OK" = 1 ] || { FAIL=1; say "FAIL: the server's device slots or GPU tasks in flight not back at 0 (stats-end.json)"; }
  [ "$EMB_FAILS" = 0 ] || FAIL=1
  # A GPU route that answered nothing would pass the checks above vacuously.
  [ "$(get 'ledger runs a GPU submitted')" -gt 0 ] 2>/dev/null ||
    { FAIL=1; say "FAIL: no soak.record task ran on the server's GPU (ledger runs a GPU submitted: 0)"; }
fi
if [ "$FAIL" = 0 ]; then
  rm -f "$CHI_SOAK_LEDGER" "$RUN/ledger-gpu" # large (sparse): kept only when a check failed
  say "== soak PASSED (ledger removed; summary in $SUMMARY)"
else
  say "== soak FAILED (ledger kept: $CHI_SOAK_LEDGER)"
fi
exit "$FAIL"

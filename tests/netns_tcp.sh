#!/usr/bin/env bash
# netns_tcp.sh BUILD_DIR
#
# Two nodes on one machine (docs/server.md, "Several nodes"): two network
# namespaces joined by a veth pair, addresses of 10.213.0.0/16 (this test's
# own), the server in one, a client in the other over tcp:// with CURVE.
# The client (tests/soak/soak_client.c) keeps a window of soak.record tasks
# in flight, each recorded by the server's module in a ledger, and logs
# every outcome.  The test cuts the link (ip link set ... down) and checks:
#   - the client's pending waits end with CHI_ERR_DISCONNECTED within the
#     heartbeat bound (10 s of silence; 15 s allowed for a loaded machine);
#   - the server reclaims the session (no client left in chimaera-ctl status);
#   - with the link back, and 50 ms delay + 1% loss (tc netem, where the
#     kernel has it), the client's chi_init works again and its tasks run;
#   - no task ran twice and none answered CHI_OK is missing from the ledger
#     (tests/soak/soak_check.c).
# Exit 77 (skipped) with the reason where namespaces cannot be made: not
# root, no iproute2, no CAP_NET_ADMIN (a container), no veth.
set -u
BUILD=${1:?usage: netns_tcp.sh BUILD_DIR}
skip() { echo "netns_tcp: skipped: $*"; exit 77; }
fail() { echo "netns_tcp: FAILED: $*"; [ -n "${RUN:-}" ] && tail -n 20 "$RUN/server.log" "$RUN"/c1.log 2>/dev/null; exit 1; }

SERVER=$BUILD/src/tools/chimaera-server
CTL=$BUILD/src/tools/chimaera-ctl
MODULE=$BUILD/tests/soak/libchi_soak_module.so
CLIENT=$BUILD/tests/soak/soak_client
CHECK=$BUILD/tests/soak/soak_check
for f in "$SERVER" "$CTL" "$MODULE" "$CLIENT" "$CHECK"; do
  [ -e "$f" ] || fail "no $f (build first)"
done
[ "$(id -u)" -eq 0 ] || skip "needs root to make network namespaces"
command -v ip >/dev/null || skip "no ip command (Debian package iproute2)"

ID=$$
NS_S=chi-srv-$ID
NS_C=chi-cli-$ID
V_S=chis$ID
V_C=chic$ID
NET=$(( ID % 250 + 1 ))
SA=10.213.$NET.1
CA=10.213.$NET.2
PORT=$(( 20000 + ID % 10000 ))
RUN=$(mktemp -d /tmp/chi-netns-XXXXXX) || exit 1
chmod 700 "$RUN"
SPID=
CPID=
cleanup() {
  [ -n "$CPID" ] && kill -9 "$CPID" 2>/dev/null
  [ -n "$SPID" ] && kill -9 "$SPID" 2>/dev/null
  wait 2>/dev/null
  ip netns del "$NS_C" 2>/dev/null
  ip netns del "$NS_S" 2>/dev/null
  [ -n "${CHI_NETNS_KEEP:-}" ] || rm -rf "$RUN"
}
trap cleanup EXIT

ip netns add "$NS_S" 2>"$RUN/err" || skip "cannot make a network namespace: $(cat "$RUN/err")"
ip netns add "$NS_C" 2>"$RUN/err" || skip "cannot make a network namespace: $(cat "$RUN/err")"
ip link add "$V_S" type veth peer name "$V_C" 2>"$RUN/err" || skip "cannot make a veth pair: $(cat "$RUN/err")"
ip link set "$V_S" netns "$NS_S" && ip link set "$V_C" netns "$NS_C" &&
  ip -n "$NS_S" addr add "$SA/24" dev "$V_S" && ip -n "$NS_C" addr add "$CA/24" dev "$V_C" &&
  ip -n "$NS_S" link set lo up && ip -n "$NS_C" link set lo up &&
  ip -n "$NS_S" link set "$V_S" up && ip -n "$NS_C" link set "$V_C" up ||
  skip "cannot configure the namespaces' links"
# netem: where the kernel has no sch_netem, the degraded phase is left out.
NETEM=yes
if ! ip netns exec "$NS_C" tc qdisc add dev lo root netem delay 1ms 2>"$RUN/err"; then
  NETEM="no ($(head -c 200 "$RUN/err"))"
else
  ip netns exec "$NS_C" tc qdisc del dev lo root
fi

now_ms() { date +%s%3N; }
"$CTL" keygen "$RUN/server" >/dev/null && "$CTL" keygen "$RUN/client" >/dev/null || fail "chimaera-ctl keygen"
cp "$RUN/client.pub" "$RUN/allowed" && chmod 600 "$RUN/allowed"
printf 'modules: [%s]\n' "$MODULE" >"$RUN/server.yaml"
export CHI_RUNTIME_DIR=$RUN
export CHI_SOAK_LEDGER=$RUN/ledger CHI_SOAK_SEQ_BITS=24 CHI_SOAK_CLIENTS=4
LOCAL=shm://netns$ID
ip netns exec "$NS_S" env CHI_SERVER_CURVE_KEY_FILE="$RUN/server.key" \
  CHI_SERVER_CURVE_ALLOWED_KEYS_FILE="$RUN/allowed" \
  "$SERVER" --config "$RUN/server.yaml" --listen "tcp://$SA:$PORT" --listen "$LOCAL" 2>"$RUN/server.log" &
SPID=$!
status_json() { timeout 10 "$CTL" --address "$LOCAL" status --json 2>/dev/null; }
for _ in $(seq 200); do
  timeout 5 "$CTL" --address "$LOCAL" ping >/dev/null 2>&1 && break
  kill -0 "$SPID" 2>/dev/null || fail "the server exited"
  sleep 0.05
done

# The client runs until the checks below are done (SIGUSR1 ends it as its
# deadline would; the deadline only backs that up, inside ctest's timeout);
# it reconnects by itself (chi_init every 100 ms) after CHI_ERR_DISCONNECTED.
T0=$(now_ms)
ip netns exec "$NS_C" env CHI_CURVE_SERVER_KEY="$(cat "$RUN/server.pub")" CHI_CURVE_KEY_FILE="$RUN/client.key" \
  "$CLIENT" --address "tcp://$SA:$PORT" --client 1 --log "$RUN/c1.log" --deadline-ms $(( T0 + 170000 )) \
  --window 16 --reconnect-s 60 --hang-s 40 2>"$RUN/c1.err" &
CPID=$!
wait_for() { # SECONDS COMMAND...: true once the command succeeds
  local until=$(( $(now_ms) + $1 * 1000 )); shift
  while [ "$(now_ms)" -lt "$until" ]; do "$@" && return 0; sleep 0.02; done
  return 1
}
connects() { awk '$1 == "E" && $2 == "connect" { n++ } END { print n + 0 }' "$RUN/c1.log" 2>/dev/null || echo 0; }
ok_results() { awk '$1 == "R" && $2 == 0 { n += $4 - $3 + 1 } END { print n + 0 }' "$RUN/c1.log" 2>/dev/null || echo 0; }
# Conditions, evaluated at each try.
connected() { [ "$(connects)" -ge "$1" ]; }
answered() { [ "$(ok_results)" -ge "$1" ]; }
wait_for 20 connected 1 || fail "the client did not connect"
wait_for 20 answered 1000 || fail "no tasks ran before the cut"

# 1. The link goes down: pending waits end within the heartbeat bound, and
#    the server reclaims the session.
ip -n "$NS_C" link set "$V_C" down
CUT=$(now_ms)
wait_for 40 grep -q '^E disconnect ' "$RUN/c1.log" || fail "no CHI_ERR_DISCONNECTED within 40 s of the cut"
DISC=$(awk '$1 == "E" && $2 == "disconnect" { print $3; exit }' "$RUN/c1.log")
DISC_MS=$(( DISC - CUT ))
no_clients() { status_json | grep -q '"clients":\[\]'; }
wait_for 40 no_clients || fail "the server kept the session 40 s after the cut"
RECLAIM_MS=$(( $(now_ms) - CUT ))
[ "$DISC_MS" -le 15000 ] || fail "CHI_ERR_DISCONNECTED came $DISC_MS ms after the cut (bound: 10 s of heartbeats)"

# 2. The link returns, slower and lossy where netem exists: chi_init again works.
if [ "$NETEM" = yes ]; then
  ip netns exec "$NS_C" tc qdisc add dev "$V_C" root netem delay 50ms loss 1% || fail "tc netem"
fi
ip -n "$NS_C" link set "$V_C" up
BEFORE=$(ok_results)
wait_for 40 connected 2 || fail "the client did not connect again within 40 s"
wait_for 20 answered $(( BEFORE + 200 )) || fail "tasks did not run after the reconnection"
RECONNECTED=$(ok_results)

# 3. The client, told to stop, exits as at its deadline; nothing lost,
#    nothing run twice.
kill -USR1 "$CPID"
wait "$CPID"
CRC=$?
CPID=
[ "$CRC" -eq 0 ] || fail "the client exited with $CRC"
STATUS=$(status_json)
kill -TERM "$SPID"
wait "$SPID"
SPID=
"$CHECK" "$CHI_SOAK_LEDGER" "$RUN/c1.log" >"$RUN/check.txt" 2>&1
CHK=$?
echo "netns_tcp: server $SA:$PORT (namespace $NS_S), client $CA (namespace $NS_C), tcp:// + CURVE"
echo "netns_tcp: link cut: CHI_ERR_DISCONNECTED after $DISC_MS ms, the server reclaimed the session after $RECLAIM_MS ms"
echo "netns_tcp: link back (netem 50 ms + 1% loss: $NETEM): the client connected again; $BEFORE -> $RECONNECTED tasks answered CHI_OK"
echo "netns_tcp: server: $(echo "$STATUS" | grep -o '"tasks_cancelled":[0-9]*')"
grep -E '^(tasks (submitted|completed)|failed .*|ledger runs.*|lost|run twice|refused yet ran|unanswered|answered twice|hangs|checks):' "$RUN/check.txt" | sed 's/^/netns_tcp:   /'
[ "$CHK" -eq 0 ] || { cat "$RUN/check.txt"; fail "soak_check"; }
echo "netns_tcp: passed"

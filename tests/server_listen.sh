#!/usr/bin/env bash
# chimaera-server with several --listen addresses is one server: status asked
# through any of them lists every address (shm, ipc and loopback tcp).
#   server_listen.sh SERVER CTL
set -u
server=$1 ctl=$2
dir=$(mktemp -d /tmp/chi-listen-XXXXXX)
chmod 700 "$dir"
export CHI_RUNTIME_DIR=$dir CHI_GPU_DEVICES=0
shm=shm://listen-$$ ipc=ipc://$dir/s.sock
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT
# The tcp port comes from 32000-32699: above the ports test_server and
# test_client_relay use, below Linux's ephemeral range (32768 up), where an
# outgoing connection of another test may hold it. A port someone else holds
# anyway is not this test's failure: the server says so and exits, and the
# next port is tried.
for attempt in 0 1 2 3 4 5 6 7; do
  port=$(( 32000 + ($$ + attempt * 97) % 700 ))
  tcp=tcp://127.0.0.1:$port
  "$server" --workers 1 --listen "$shm" --listen "$ipc" --listen "$tcp" 2>"$dir/log" &
  pid=$!
  for _ in $(seq 300); do
    "$ctl" --address "$shm" ping >/dev/null 2>&1 && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
  done
  kill -0 $pid 2>/dev/null && break
  wait $pid 2>/dev/null; pid=
  grep -q "Address already in use" "$dir/log" || break
done
[ -n "$pid" ] || { echo "chimaera-server did not start:"; cat "$dir/log"; exit 1; }
rc=0
for a in "$shm" "$ipc" "$tcp"; do
  out=$("$ctl" --address "$a" status --json 2>&1) || { echo "status via $a: $out"; rc=1; continue; }
  for want in "$shm" "$ipc" "$tcp"; do
    case $out in *"$want"*) ;; *) echo "status via $a does not list $want: $out"; rc=1 ;; esac
  done
done
[ $rc -eq 0 ] || cat "$dir/log"
# An address with a control character is refused before anything starts.
bad=$(printf 'shm://a\tb')
"$server" --listen "$shm-2" --listen "$bad" >"$dir/bad.out" 2>&1
st=$?
if [ $st -ne 2 ] || ! grep -q "control character" "$dir/bad.out"; then
  echo "a --listen address with a tab: exit $st, want 2 with a message:"; cat "$dir/bad.out"; rc=1
fi
exit $rc

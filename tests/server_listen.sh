#!/usr/bin/env bash
# chimaera-server with several --listen addresses is one server: status asked
# through any of them lists every address (shm, ipc and loopback tcp).
#   server_listen.sh SERVER CTL
set -u
server=$1 ctl=$2
dir=$(mktemp -d /tmp/chi-listen-XXXXXX)
chmod 700 "$dir"
export CHI_RUNTIME_DIR=$dir CHI_GPU_DEVICES=0
port=$(( 20000 + $$ % 20000 ))
shm=shm://listen-$$ ipc=ipc://$dir/s.sock tcp=tcp://127.0.0.1:$port
"$server" --workers 1 --listen "$shm" --listen "$ipc" --listen "$tcp" 2>"$dir/log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do "$ctl" --address "$shm" ping >/dev/null 2>&1 && break; sleep 0.1; done
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

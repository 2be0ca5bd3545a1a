#!/usr/bin/env bash
# chimaera-bench --rows: only the row groups asked for run (the floors
# always); an unknown group, or --rows with --server, is refused with exit
# status 2 and a message.
#   bench_rows.sh BENCH
set -u
bench=$1
export CHI_GPU_DEVICES=0
rc=0
small=(--iters 200 --warmup 100 --tput-tasks 2000 --threads 2 --json)
names() { grep -o '"name": *"[^"]*"' | sed 's/.*: *"\(.*\)"/\1/'; }
expect() { # GROUPS ROWS...: --rows GROUPS runs exactly the floors and ROWS
  local groups=$1; shift
  local out st want got
  out=$("$bench" --rows "$groups" "${small[@]}" 2>&1); st=$?
  want=$(printf '%s\n' floor.cpu_pingpong peer.pipe "$@")
  got=$(names <<<"$out")
  if [ $st -ne 0 ] || [ "$got" != "$want" ]; then
    echo "--rows $groups: exit $st, rows:"; echo "$got"; echo "want:"; echo "$want"; rc=1
  fi
}
expect x1 "cpu->cpu pipelined x1"
expect lone,batched "cpu->cpu" "cpu->cpu local" "cpu->cpu after 2ms" "cpu->cpu batched x2"
expect xN,x1 "cpu->cpu pipelined x1" "cpu->cpu pipelined x2"
refused() { # MESSAGE ARGS...: exit status 2 and MESSAGE on stderr
  local msg=$1; shift
  local out st
  out=$("$bench" "$@" 2>&1 >/dev/null); st=$?
  if [ $st -ne 2 ] || [[ $out != *"$msg"* ]]; then
    echo "$*: exit $st, want 2 with '$msg': $out"; rc=1
  fi
}
refused "'' is not" --rows "lone,,x1"
refused "'bogus' is not lone, x1, xN, batched or gpu" --rows bogus
refused "not those of --server" --rows x1 --server start
exit $rc

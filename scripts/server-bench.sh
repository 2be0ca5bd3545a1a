#!/usr/bin/env bash
# server-bench.sh BUILD_DIR: the client->server benchmark of docs/performance.md
# on the 16-core GPU machine: chimaera-bench starts its own chimaera-server
# (private name and runtime directory) and measures, over each transport of
# SERVER_BENCH_TRANSPORTS (shm://, ipc://, tcp:// loopback and tcp:// with
# CURVE, the last from a second server), one client's round trip and
# pipelined throughput from 1 and 8 client processes, next to the raw libzmq
# REQ/REP and DEALER/ROUTER floors of the same transport; then the sweep
# 1,8,64,256 (with idle server CPU, RSS and wake-up latency at 256 idle
# clients) and fairness (1 flooding client, 63 light ones) over shm://, next
# to the cross-process cache-line floor of the same run; the sweep's raw shm
# floors (the same counts over a bare shared-memory ping-pong, chimaera's
# waiting policy and pure spinning) and the raw futex wake-up floor come
# with --clients.  After a build:
#
#   device: run(command="GPU_RUN_STEPS=build bash scripts/gpu-run.sh &&
#                        bash scripts/server-bench.sh build-gpu", carry=[".devdeps"])
#   here:   bash scripts/server-bench.sh build
#
# Writes to $OUT: server-bench.json (chimaera-bench --json), server-bench.txt
# (the tables, Markdown, for docs), server-bench.log (stderr and notes) and,
# when gnuplot is there, server-bench.png (aggregate tasks/s and p50/p99
# against client processes).  Each step has a time bound.
#
# Environment: OUT (default BUILD_DIR/server-bench-out), SERVER_BENCH_CLIENTS
# (default 1,8,64,256), SERVER_BENCH_FAIRNESS (default 64), SERVER_BENCH_ITERS
# (timed round trips of the latency row, default 100000), SERVER_BENCH_MS
# (length of each sweep and fairness run, default 1000),
# SERVER_BENCH_TRANSPORTS (default shm,ipc,tcp,tcp-curve), SERVER_BENCH_ARGS
# (more chimaera-bench options).
# Exit status: 0 when the bench reported ok, else 1 (2: usage).
set -u -o pipefail

if [ $# -ne 1 ] || [ ! -d "$1" ]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
BUILD=$(cd "$1" && pwd)
OUT=${OUT:-$BUILD/server-bench-out}
mkdir -p "$OUT"
JSON=$OUT/server-bench.json
TXT=$OUT/server-bench.txt
LOG=$OUT/server-bench.log
PNG=$OUT/server-bench.png
CLIENTS=${SERVER_BENCH_CLIENTS:-1,8,64,256}
FAIRNESS=${SERVER_BENCH_FAIRNESS:-64}
ITERS=${SERVER_BENCH_ITERS:-100000}
MS=${SERVER_BENCH_MS:-1000}
TRANSPORTS=${SERVER_BENCH_TRANSPORTS:-shm,ipc,tcp,tcp-curve}
BENCH=$BUILD/src/tools/chimaera-bench
: >"$LOG"

# Libraries gpu-run.sh unpacked on the GPU machine (harmless elsewhere).
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
[ -x "$BENCH" ] || { echo "$0: no $BENCH (build first)" | tee -a "$LOG" >&2; exit 1; }
[ -x "$BUILD/src/tools/chimaera-server" ] || { echo "$0: no chimaera-server next to it" | tee -a "$LOG" >&2; exit 1; }

# 256 client processes, each with a few threads and descriptors.
ulimit -n 65536 2>/dev/null || true
ulimit -u unlimited 2>/dev/null || true

{
  echo "== server-bench on $(hostname), $(date -u +%FT%TZ), build $BUILD, $(nproc) CPUs"
  echo "== $BENCH --server start --transports $TRANSPORTS --iters $ITERS --procs 8 --clients $CLIENTS --fairness $FAIRNESS --client-ms $MS ${SERVER_BENCH_ARGS:-} --json"
} >>"$LOG"
t0=$(date +%s)
# shellcheck disable=SC2086
timeout -k 10 600 "$BENCH" --server start --transports "$TRANSPORTS" --iters "$ITERS" --procs 8 \
  --clients "$CLIENTS" --fairness "$FAIRNESS" --client-ms "$MS" ${SERVER_BENCH_ARGS:-} --json \
  >"$JSON" 2>>"$LOG"
rc=$?
echo "== chimaera-bench exit $rc ($(( $(date +%s) - t0 )) s)" >>"$LOG"

# Markdown tables from the JSON, for docs/performance.md.
python3 - "$JSON" "$OUT/sweep.dat" >"$TXT" 2>>"$LOG" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
m, srv = doc["machine"], doc.get("server", {})
def us(v):
    return "-" if v is None else "%.2f" % (v / 1000.0)
def x(v):
    return "-" if v is None else "%.1fx" % v
print("chimaera-bench %s, %s: %s CPUs (%s), server %s (%s workers), %s" % (
    doc["chimaera_version"], m["hostname"], m["online_cpus"], m["cpu_model"],
    srv.get("address", "?"), srv.get("workers", "?"), m["timestamp"]))
print()
print("| row | procs | p50 us | p99 us | M tasks/s | vs floor | target |")
print("|---|---:|---:|---:|---:|---:|---|")
for r in doc["rows"]:
    if r["name"] not in ("floor.cpu_pingpong", "floor.xproc_pingpong", "peer.pipe") and \
            not r["name"].startswith("client->server") and not r["name"].startswith("floor.zmq_"):
        continue
    if r["status"] != 0:
        print("| %s | | FAILED: %s | | | | |" % (r["name"], r["error"]))
        continue
    tgt = ""
    if r.get("target_p50_ns"):
        tgt = "p50 <= %.1f us" % (r["target_p50_ns"] / 1000.0)
    elif r.get("target_throughput_per_s"):
        tgt = ">= %.0f M/s" % (r["target_throughput_per_s"] / 1e6)
    tp = r["throughput_per_s"]
    print("| %s | %s | %s | %s | %s | %s | %s |" % (
        r["name"], r.get("processes") or "", us(r["p50_ns"]), us(r["p99_ns"]),
        "-" if tp is None else "%.3f" % (tp / 1e6), x(r["ratio"]), tgt))
print()
print("vs floor: p50 / floor p50 (latency rows); floor tasks/s / tasks/s (ZeroMQ pipelined rows, "
      "against floor.zmq_pipe_*: raw DEALER/ROUTER echo, one process, same window).")
# The ZeroMQ transports side by side: round trip and 8-process pipelined.
trs = srv.get("transports", [])
if trs:
    rows = {r["name"]: r for r in doc["rows"]}
    procs = max([r.get("processes") or 0 for r in doc["rows"]
                 if r["name"].startswith("client->server") and "pipelined" in r["name"]] or [1])
    print()
    print("| transport | address | p50 us | p99 us | floor p50 us | vs floor | pipelined 1p M/s | "
          "pipelined %dp M/s | floor M/s | %dp vs floor |" % (procs, procs))
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for t in trs:
        base = "client->server" + ("" if t["transport"] == "shm" else " " + t["transport"])
        lat, p1, pn = rows.get(base), rows.get(base + " pipelined 1p"), \
            rows.get(base + " pipelined %dp" % procs)
        fl = rows.get(t["floor"]) or {}
        pf = rows.get(t["pipe_floor"]) or {}
        def tput(r):
            return "-" if not r or r["status"] != 0 or r["throughput_per_s"] is None \
                else "%.3f" % (r["throughput_per_s"] / 1e6)
        ok = lat and lat["status"] == 0
        print("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            t["transport"] + (" (2nd server)" if t["curve_server"] else ""), t["address"],
            us(lat["p50_ns"]) if ok else "FAILED", us(lat["p99_ns"]) if ok else "-",
            us(fl.get("p50_ns")), x(lat["ratio"]) if ok else "-", tput(p1), tput(pn), tput(pf),
            x(pn["ratio"]) if pn and pn["status"] == 0 else "-"))
sweep = srv.get("sweep", [])
if sweep:
    print()
    print("Client sweep (chi.add, one round trip at a time per client process, %s ms each):"
          % srv.get("client_ms"))
    print()
    print("| client processes | tasks/s | p50 us | p99 us | p50 vs floor |")
    print("|---:|---:|---:|---:|---:|")
    raw = srv.get("raw_shm", {})
    def by_procs(key):
        return {r["processes"]: r for r in raw.get(key, []) if r["status"] == 0}
    raw_sweep, raw_spin = by_procs("sweep"), by_procs("spin_sweep")
    with open(sys.argv[2], "w") as dat:
        for r in sweep:
            if r["status"] != 0:
                print("| %d | FAILED: %s | | | |" % (r["processes"], r["error"]))
                continue
            print("| %d | %.0f | %s | %s | %s |" % (r["processes"], r["throughput_per_s"],
                  us(r["p50_ns"]), us(r["p99_ns"]), x(r["ratio"])))
            rr = raw_sweep.get(r["processes"])
            dat.write("%d %.0f %.3f %.3f %s\n" % (r["processes"], r["throughput_per_s"],
                      r["p50_ns"] / 1000.0, r["p99_ns"] / 1000.0,
                      "%.0f" % rr["throughput_per_s"] if rr else "NaN"))
    best = max([r["throughput_per_s"] for r in sweep if r["status"] == 0] or [0])
    top = sweep[-1]
    if best and top["status"] == 0:
        print()
        print("%d clients: %.0f%% of the best aggregate (%.0f tasks/s)." % (
            top["processes"], 100.0 * top["throughput_per_s"] / best, best))
    if raw.get("measured"):
        print()
        print("Its raw shm floor, same counts and length: 64 B echo through a pair of slots per "
              "client, 1 server process with %d thread(s) (%s), clients spinning %.0f us and server "
              "threads %.0f us before a futex sleep (chimaera's policy); \"spin\": nobody sleeps:"
              % (raw["threads"], "as many as the server's shm pollers"
                 if raw["threads_from"] == "server pollers" else "the server's default poller count",
                 raw["client_spin_ns"] / 1000.0, raw["server_spin_ns"] / 1000.0))
        print()
        print("| client processes | raw tasks/s | p50 us | p99 us | chimaera / raw | "
              "spin tasks/s | p50 us | p99 us |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        chi = {r["processes"]: r for r in sweep if r["status"] == 0}
        for key in raw["sweep"]:
            n = key["processes"]
            a, b, c = raw_sweep.get(n), raw_spin.get(n), chi.get(n)
            def cells(r):
                return ("FAILED", "-", "-") if not r else \
                    ("%.0f" % r["throughput_per_s"], us(r["p50_ns"]), us(r["p99_ns"]))
            ratio = "-" if not a or not c else "%.2fx" % (c["throughput_per_s"] / a["throughput_per_s"])
            print("| %d | %s | %s | %s | %s | %s | %s | %s |" % ((n,) + cells(a) + (ratio,) + cells(b)))
        for r in raw.get("sweep", []) + raw.get("spin_sweep", []):
            if r["status"] != 0:
                print("%s: FAILED: %s" % (r["name"], r["error"]))
idle = srv.get("idle", {})
if idle.get("measured"):
    def num(v, f):
        return "-" if v is None else f % v
    print()
    print("Idle, %d clients connected: server CPU %s of one core over %s s (target < %.0f%%); "
          "server RSS %s MiB (%s MiB before the bench's clients); first task after %s ms idle: "
          "p50 %s us, max %s us over %d clients (target p50 <= %.0f us)." % (
              idle["clients"], num(idle["server_cpu_pct"], "%.2f%%"), num(idle["seconds"], "%.1f"),
              idle["target_cpu_pct"], num(idle["rss_kib"] and idle["rss_kib"] / 1024, "%.1f"),
              num(idle["rss_base_kib"] and idle["rss_base_kib"] / 1024, "%.1f"),
              num(idle["wake_idle_ms"], "%.0f"), us(idle["wake_p50_ns"]), us(idle["wake_max_ns"]),
              idle["wake_count"], idle["target_wake_p50_ns"] / 1000.0))
    if idle.get("note"):
        print("Note: " + idle["note"])
rw = srv.get("raw_shm", {}).get("wake", {})
if rw.get("measured"):
    print("Raw floor after %s ms idle, both sides asleep on a futex: round trip p50 %s us, max %s us "
          "(%d samples); one futex wake of the sleeping server thread: p50 %s us, max %s us (%d)." % (
              "-" if rw["idle_ms"] is None else "%.0f" % rw["idle_ms"], us(rw["round_trip_p50_ns"]),
              us(rw["round_trip_max_ns"]), rw["count"], us(rw["oneway_p50_ns"]),
              us(rw["oneway_max_ns"]), rw["oneway_count"]))
    if rw.get("note"):
        print("Note: " + rw["note"])
fair = srv.get("fairness", {})
if fair.get("measured"):
    print()
    print("Fairness, %d clients (1 flooding with %d in flight, %d light):" % (
        fair["clients"], fair["flood_window"], fair["clients"] - 1))
    print()
    print("| row | p50 us | p99 us | tasks/s |")
    print("|---|---:|---:|---:|")
    for r in fair["rows"]:
        if r["status"] != 0:
            print("| %s | FAILED: %s | | |" % (r["name"], r["error"]))
            continue
        print("| %s | %s | %s | %.0f |" % (r["name"], us(r["p50_ns"]), us(r["p99_ns"]),
                                           r["throughput_per_s"] or 0))
    print()
    print("Light clients' p99 with the flooder / without: %s (target <= %.0fx)." % (
        x(fair["ratio"]), fair["target_ratio"]))
print()
print("ok: %s" % doc["ok"])
PY
[ $? -eq 0 ] || echo "(no usable JSON in $JSON: see $LOG)" >>"$TXT"

# The sweep plot: aggregate tasks/s (left axis) and p50/p99 (right, log).
if command -v gnuplot >/dev/null 2>&1 && [ -s "$OUT/sweep.dat" ]; then
  if gnuplot -e 'set terminal' 2>&1 | grep -q pngcairo; then
    term='pngcairo size 900,500 noenhanced font "sans,10"'
  else
    term='png size 900,500 noenhanced'
  fi
  gnuplot >>"$LOG" 2>&1 <<GP || echo "gnuplot failed" >>"$LOG"
set terminal $term
set output "$PNG"
set title "chimaera-server: client processes doing chi.add round trips ($(hostname), $(nproc) CPUs)"
set xlabel "client processes (log scale)"
set logscale x 2
set ylabel "aggregate tasks/s"
set y2label "latency, us (log scale)"
set logscale y2
set ytics nomirror
set y2tics
set yrange [0:*]
set grid
set key top left
plot "$OUT/sweep.dat" using 1:2 with linespoints lw 2 pt 7 title "tasks/s", \
     "" using 1:5 with linespoints lw 1 dt 4 pt 6 title "raw shm tasks/s (floor)", \
     "" using 1:3 axes x1y2 with linespoints dt 2 pt 5 title "p50 us", \
     "" using 1:4 axes x1y2 with linespoints dt 3 pt 9 title "p99 us"
GP
fi
rm -f "$OUT/sweep.dat"

cat "$TXT"
echo "files: $JSON $TXT $LOG$([ -f "$PNG" ] && echo " $PNG")"
[ $rc -eq 0 ] || exit 1

#!/bin/sh
# plot-payloads.sh OUT.png BENCH.json... -- latency against payload size from
# chimaera-bench --json(-file) runs at several --payload sizes (scripts/
# gpu-run.sh's "payloads" step writes them): p50 of every one-task route
# (cpu->cpu, cpu->gpu0, gpu0->cpu, gpu0->local), log-log, one line per route,
# with the floors of the same runs as dashed lines.  Rows that failed in a run
# are left out of it.  Needs gnuplot (pngcairo or png terminal) and python3
# (stdlib only).
set -eu
if [ $# -lt 2 ]; then
  echo "usage: $0 OUT.png BENCH.json..." >&2
  exit 2
fi
out=$1
shift
command -v gnuplot >/dev/null || { echo "$0: gnuplot not found" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$tmp" "$@" <<'PY'
import json, sys
tmp, files = sys.argv[1], sys.argv[2:]
routes = ["cpu->cpu", "cpu->gpu0", "gpu0->cpu", "gpu0->local",
          "floor.cpu_gpu_pingpong", "floor.gpu_cpu_pingpong", "floor.gpu_block_pingpong"]
pts = {r: [] for r in routes}
title = ""
for f in files:
    d = json.load(open(f))
    size = d["options"]["payload_bytes"]
    m = d["machine"]
    title = "chimaera-bench p50 by payload, %s, %s" % (m.get("cpu_model", "?"), m.get("timestamp", "")[:10])
    for row in d["rows"]:
        if row["name"] in pts and row.get("status", 0) == 0 and row.get("p50_ns"):
            pts[row["name"]].append((size, row["p50_ns"] / 1000.0))
for i, r in enumerate(routes):
    with open("%s/%d.dat" % (tmp, i), "w") as o:
        for s, v in sorted(pts[r]):
            o.write("%d %.4f\n" % (s, v))
with open(tmp + "/title.txt", "w") as o:
    o.write(title + "\n")
PY
term=pngcairo
gnuplot -e "set terminal pngcairo" >/dev/null 2>&1 || term=png
title=$(head -1 "$tmp/title.txt")
gnuplot <<GP
set terminal $term size 900,560
set output "$out"
set title "$title"
set logscale xy
set xlabel "payload bytes"
set ylabel "round trip p50, us"
set key top left
set grid
set xtics (8, 64, 1024, 4096)
plot "$tmp/0.dat" using 1:2 with linespoints lw 2 title "cpu->cpu", \
     "$tmp/1.dat" using 1:2 with linespoints lw 2 title "cpu->gpu0", \
     "$tmp/2.dat" using 1:2 with linespoints lw 2 title "gpu0->cpu", \
     "$tmp/3.dat" using 1:2 with linespoints lw 2 title "gpu0->local (GPU->GPU)", \
     "$tmp/4.dat" using 1:2 with lines dt 2 title "floor cpu<->gpu ping-pong", \
     "$tmp/5.dat" using 1:2 with lines dt 3 title "floor gpu<->cpu ping-pong", \
     "$tmp/6.dat" using 1:2 with lines dt 4 title "floor gpu block ping-pong"
GP
echo "$out"

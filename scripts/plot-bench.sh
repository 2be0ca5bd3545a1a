#!/bin/sh
# plot-bench.sh BENCH.json OUT.png -- latency plot of a `chimaera-bench --json`
# run: p50 and p99 bars for every floor, peer and latency row (log scale),
# each route's floor p50 as a dashed line and its ratio to it above the bar.
# Needs gnuplot (pngcairo or png terminal) and python3 (stdlib only).
set -eu

usage() { echo "usage: $0 BENCH.json OUT.png" >&2; exit 2; }
[ $# -eq 2 ] || usage
json=$1
png=$2
[ -r "$json" ] || { echo "$0: cannot read $json" >&2; exit 1; }
command -v gnuplot >/dev/null 2>&1 || { echo "$0: gnuplot not found" >&2; exit 1; }
command -v python3 >/dev/null 2>&1 || { echo "$0: python3 not found" >&2; exit 1; }

if gnuplot -e 'set terminal' 2>&1 | grep -q pngcairo; then
  term='pngcairo size 1100,600 noenhanced font "sans,10"'
elif gnuplot -e 'set terminal' 2>&1 | grep -qw png; then
  term='png size 1100,600 noenhanced'
else
  echo "$0: this gnuplot has neither the pngcairo nor the png terminal" >&2
  exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# One line per plotted row: "name" p50_us p99_us floor_p50_us ratio ('-': none).
# The first line of title.txt is the plot title.
python3 - "$json" "$tmp/rows.dat" "$tmp/title.txt" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
def us(v):
    return "-" if v is None else "%.4f" % (v / 1000.0)
n = 0
with open(sys.argv[2], "w") as out:
    for r in doc["rows"]:
        if r["kind"] == "throughput" or r.get("status", 0) != 0 or r["p50_ns"] is None:
            continue
        ratio = "-" if r.get("ratio") is None else "%.2f" % r["ratio"]
        name = r["name"].replace('"', "'")
        out.write('"%s" %s %s %s %s\n' % (name, us(r["p50_ns"]), us(r["p99_ns"]),
                                          us(r.get("floor_p50_ns")), ratio))
        n += 1
if n == 0:
    sys.exit("no latency rows to plot in " + sys.argv[1])
m = doc.get("machine", {})
title = "chimaera-bench %s: round-trip latency, %s payload - %s, %s CPUs, %s GPU(s), %s" % (
    doc.get("chimaera_version", "?"),
    "%s B" % doc.get("options", {}).get("payload_bytes", "?"),
    m.get("hostname", "?"), m.get("online_cpus", "?"), m.get("gpus", "?"),
    m.get("timestamp", ""))
open(sys.argv[3], "w").write(title.replace('"', "'") + "\n")
PY

title=$(head -n 1 "$tmp/title.txt")
gnuplot <<GP
set terminal $term
set output "$png"
set title "$title"
set datafile missing "-"
set ylabel "microseconds (log scale)"
set logscale y
set grid ytics mytics
set style fill solid 0.85 border -1
set boxwidth 0.32
set xtics rotate by -25 nomirror
set xrange [-0.6:*]
set key top left
set bmargin 7
plot "$tmp/rows.dat" using (\$0 - 0.17):2 with boxes lc rgb "#3b75af" title "p50", \
     "" using (\$0 + 0.17):3 with boxes lc rgb "#ef8636" title "p99", \
     "" using (\$0 - 0.42):4:(0.84):(0) with vectors nohead lw 2 dt 2 lc rgb "#222222" title "p50 of its floor", \
     "" using (\$0 - 0.17):2:(valid(5) ? sprintf("%.1fx", \$5) : "") with labels offset 0,0.8 font ",9" notitle, \
     "" using 0:(NaN):xtic(1) notitle
GP
echo "wrote $png"

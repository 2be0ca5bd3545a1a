#!/bin/sh
# bench_smoke: a tiny chimaera-bench --json run must exit 0 and print JSON that
# parses and holds the floor and the CPU routes with numbers, ratios included.
# Exits 77 (skipped) without python3.
set -eu
bench="$1"
command -v python3 >/dev/null 2>&1 || { echo "python3 not found: skipped"; exit 77; }
out="${TMPDIR:-/tmp}/chimaera-bench-smoke.$$.json"
trap 'rm -f "$out"' EXIT
"$bench" --iters 2000 --warmup 200 --tput-tasks 4000 --json >"$out"
python3 -m json.tool "$out" >/dev/null
python3 - "$out" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
rows = {r["name"]: r for r in doc["rows"]}
assert doc["ok"] is True, "ok is not true"
for key in ("hostname", "online_cpus", "gpus"):
    assert key in doc["machine"], "machine." + key + " missing"
for name in ("floor.cpu_pingpong", "peer.pipe", "cpu->cpu", "cpu->cpu local",
             "cpu->cpu pipelined x1"):
    assert name in rows, name + " row missing"
    r = rows[name]
    assert r["status"] == 0, name + ": " + r["error"]
    assert r["count"] > 0 and r["p50_ns"] > 0 and r["p99_ns"] >= r["p50_ns"], name
for name in ("cpu->cpu", "cpu->cpu local", "peer.pipe"):
    r = rows[name]
    assert r["floor"] == "floor.cpu_pingpong", name + ": floor"
    want = r["p50_ns"] / r["floor_p50_ns"]
    assert abs(r["ratio"] - want) <= 1e-3 * want + 1e-3, "%s: ratio %r, p50/floor %r" % (name, r["ratio"], want)
assert rows["cpu->cpu pipelined x1"]["throughput_per_s"] > 0
assert rows["cpu->cpu pipelined x1"]["count"] == 4000
print("bench JSON ok:", len(rows), "rows")
PY

#!/bin/sh
# bench_smoke: a tiny chimaera-bench --json run must exit 0 and print JSON that
# parses and holds the floor and the CPU routes with numbers, ratios included;
# then a tiny --server start run (client processes, sweep 1,2, idle figures,
# fairness) must do the same and leave no process or file behind.  Checks
# shapes only, never times.  Exits 77 (skipped) without python3.
set -eu
bench="$1"
command -v python3 >/dev/null 2>&1 || { echo "python3 not found: skipped"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/chimaera-bench-smoke.XXXXXX")
trap 'rm -rf "$work"' EXIT
out="$work/embedded.json"
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

# Client->server: the bench starts its own chimaera-server (private name and
# runtime directory under $TMPDIR) and stops it.
out="$work/server.json"
mkdir "$work/tmp"
TMPDIR="$work/tmp" "$bench" --server start --iters 2000 --warmup 200 --tput-tasks 4000 \
  --procs 2 --clients 1,2 --fairness 3 --flood-window 16 --client-ms 200 --idle-ms 200 \
  --wake-samples 2 --json >"$out"
python3 -m json.tool "$out" >/dev/null
python3 - "$out" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
assert doc["ok"] is True, "ok is not true"
rows = {r["name"]: r for r in doc["rows"]}
for name in ("floor.xproc_pingpong", "client->server", "client->server pipelined 1p",
             "client->server pipelined 2p"):
    assert name in rows, name + " row missing"
    r = rows[name]
    assert r["status"] == 0, name + ": " + r["error"]
    assert r["count"] > 0 and r["p50_ns"] > 0 and r["p99_ns"] >= r["p50_ns"], name
r = rows["client->server"]
assert r["floor"] == "floor.xproc_pingpong" and r["ratio"] > 0, "client->server: floor"
for name in ("client->server pipelined 1p", "client->server pipelined 2p"):
    assert rows[name]["count"] == 4000 and rows[name]["throughput_per_s"] > 0, name
assert rows["client->server pipelined 2p"]["processes"] == 2
srv = doc["server"]
assert srv["started"] is True and srv["exit_status"] == 0, "server exit %r" % srv["exit_status"]
assert [r["processes"] for r in srv["sweep"]] == [1, 2], "sweep counts"
for r in srv["sweep"]:
    assert r["status"] == 0, r["name"] + ": " + r["error"]
    assert r["count"] > 0 and r["throughput_per_s"] > 0 and r["p99_ns"] >= r["p50_ns"] > 0, r["name"]
    assert r["floor"] == "floor.xproc_pingpong" and r["ratio"] > 0, r["name"]
idle = srv["idle"]
assert idle["measured"] is True and idle["clients"] == 2, "idle"
assert idle["server_cpu_pct"] is not None and idle["server_cpu_pct"] >= 0, "idle cpu"
assert idle["rss_kib"] > 0 and idle["rss_base_kib"] > 0, "rss"
assert idle["wake_count"] == 2 and idle["wake_p50_ns"] > 0, "wake-ups"
fair = srv["fairness"]
assert fair["measured"] is True and fair["clients"] == 3 and fair["ratio"] > 0, "fairness"
assert len(fair["rows"]) == 3 and all(r["status"] == 0 and r["count"] > 0 for r in fair["rows"])
print("server bench JSON ok:", len(rows), "rows,", len(srv["sweep"]), "sweep points")
PY
# The server's runtime directory is gone, and so are its processes.
left=$(ls -A "$work/tmp")
[ -z "$left" ] || { echo "left behind in TMPDIR: $left"; exit 1; }

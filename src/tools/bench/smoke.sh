#!/bin/sh
# bench_smoke: a tiny chimaera-bench --json run must exit 0 and print JSON that
# parses and holds the floor and the CPU routes with numbers, ratios included;
# then a tiny --server start run (client processes over shm, ipc, tcp and tcp
# with CURVE next to the raw libzmq floors, sweep 1,2 and its raw shm floors,
# idle figures with the raw wake-up floor, fairness;
# with a GPU, a client kernel's round trips beside embedded ones)
# must do the same and leave no process or file behind.  Checks shapes only,
# never times.  Exits 77 (skipped) without python3.
set -eu
bench="$1"
command -v python3 >/dev/null 2>&1 || { echo "python3 not found: skipped"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/chimaera-bench-smoke.XXXXXX")
trap 'rm -rf "$work"' EXIT
out="$work/embedded.json"
# --gpu-lanes takes 1..32 (a bad count exits 2 before any row); with a GPU
# its throughput rows run that many lanes per warp (their "window").
for bad in 0 33 x; do
  if "$bench" --gpu-lanes "$bad" --iters 10 >/dev/null 2>&1; then echo "--gpu-lanes $bad accepted"; exit 1; fi
done
"$bench" --iters 2000 --warmup 200 --tput-tasks 4000 --gpu-lanes 3 --json >"$out"
python3 -m json.tool "$out" >/dev/null
python3 - "$out" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
rows = {r["name"]: r for r in doc["rows"]}
assert doc["ok"] is True, "ok is not true"
gpu_tput = [r for r in doc["rows"] if r["kind"] == "throughput" and r["name"].startswith("gpu0->")
            and r["status"] == 0]
assert doc["machine"]["gpus"] == 0 or gpu_tput, "no GPU throughput rows"
for r in gpu_tput:
    assert r["window"] == 3, "%s: window %r, --gpu-lanes 3" % (r["name"], r["window"])
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
# runtime directory under $TMPDIR; shm, ipc and tcp at once), then a second
# one for tcp with CURVE, and stops them.
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
# ZeroMQ transports: each row names its transport's raw libzmq floor, which
# is in the same run, with a ratio.
for t in ("ipc", "tcp", "tcp-curve"):
    f = t.replace("-", "_")
    rr, pipe = "floor.zmq_reqrep_" + f, "floor.zmq_pipe_" + f
    assert rows[rr]["kind"] == "floor" and rows[rr]["status"] == 0, rr + ": " + rows[rr]["error"]
    assert rows[rr]["count"] == 2000 and rows[rr]["p99_ns"] >= rows[rr]["p50_ns"] > 0, rr
    assert rows[pipe]["kind"] == "tput-floor" and rows[pipe]["status"] == 0, pipe + ": " + rows[pipe]["error"]
    assert rows[pipe]["count"] == 4000 and rows[pipe]["throughput_per_s"] > 0, pipe
    lat = "client->server " + t
    r = rows[lat]
    assert r["status"] == 0, lat + ": " + r["error"]
    assert r["transport"] == t and r["count"] == 2000 and r["p99_ns"] >= r["p50_ns"] > 0, lat
    assert r["floor"] == rr and r["ratio_of"] == "p50", lat + ": floor"
    want = r["p50_ns"] / rows[rr]["p50_ns"]
    assert abs(r["ratio"] - want) <= 1e-3 * want + 1e-3, lat + ": ratio"
    for p in (1, 2):
        name = "%s pipelined %dp" % (lat, p)
        r = rows[name]
        assert r["status"] == 0, name + ": " + r["error"]
        assert r["transport"] == t and r["processes"] == p and r["count"] == 4000, name
        assert r["floor"] == pipe and r["ratio_of"] == "throughput", name + ": floor"
        want = rows[pipe]["throughput_per_s"] / r["throughput_per_s"]
        assert abs(r["ratio"] - want) <= 1e-2 * want + 1e-3, name + ": ratio"
assert rows["client->server"]["transport"] == "shm"
# With a GPU: a client kernel's GPU->CPU and GPU->GPU rows, each right after
# the embedded row of its route, all naming the GPU floors of the same run.
names = [r["name"] for r in doc["rows"]]
if doc["machine"]["gpus"] > 0:
    for route, floor in (("gpu0->cpu", "floor.gpu_cpu_pingpong"), ("gpu0->local", "floor.gpu_block_pingpong")):
        assert names.index("client " + route) == names.index(route) + 1, route + ": order"
        for name in (route, "client " + route):
            r = rows[name]
            assert r["status"] == 0, name + ": " + r["error"]
            assert r["count"] > 0 and r["p99_ns"] >= r["p50_ns"] > 0, name
            assert r["floor"] == floor and r["ratio"] > 0, name + ": floor"
        assert rows["client " + route]["transport"] == "shm", route + ": transport"
else:
    assert not any("gpu" in n for n in names), "GPU rows without a GPU"
srv = doc["server"]
assert srv["started"] is True and srv["exit_status"] == 0, "server exit %r" % srv["exit_status"]
assert [t["transport"] for t in srv["transports"]] == ["shm", "ipc", "tcp", "tcp-curve"], "transports"
assert [t["curve_server"] for t in srv["transports"]] == [False, False, False, True], "curve server"
assert srv["curve_server"]["started"] is True and srv["curve_server"]["exit_status"] == 0, "curve server exit"
assert srv["transports"][1]["address"].startswith("ipc://")
assert srv["transports"][2]["address"].startswith("tcp://127.0.0.1:")
assert srv["transports"][3]["address"].startswith("tcp://127.0.0.1:")
assert [r["processes"] for r in srv["sweep"]] == [1, 2], "sweep counts"
for r in srv["sweep"]:
    assert r["status"] == 0, r["name"] + ": " + r["error"]
    assert r["count"] > 0 and r["throughput_per_s"] > 0 and r["p99_ns"] >= r["p50_ns"] > 0, r["name"]
    assert r["floor"] == "floor.xproc_pingpong" and r["ratio"] > 0, r["name"]
# The sweep's raw shm floors: the same counts, both waiting policies, and
# the raw wake-up beside the idle figures.
raw = srv["raw_shm"]
assert raw["measured"] is True and raw["threads"] >= 1 and raw["payload_bytes"] == 64, "raw_shm"
assert raw["threads_from"] in ("server pollers", "default"), "raw_shm threads_from"
for key, label in (("sweep", "sweep"), ("spin_sweep", "spin")):
    assert [r["name"] for r in raw[key]] == ["raw shm %s %dp" % (label, p) for p in (1, 2)], key
    for r in raw[key]:
        assert r["status"] == 0, r["name"] + ": " + r["error"]
        assert r["processes"] == int(r["name"].split()[-1][:-1]), r["name"] + ": processes"
        assert r["count"] > 0 and r["throughput_per_s"] > 0 and r["p99_ns"] >= r["p50_ns"] > 0, r["name"]
w = raw["wake"]
assert w["measured"] is True and w["idle_ms"] == 100 and w["count"] == 2, "raw wake: " + w["note"]
assert w["round_trip_max_ns"] >= w["round_trip_p50_ns"] > 0, "raw wake round trip"
assert w["oneway_count"] <= 2 and (w["oneway_count"] == 0 or w["oneway_max_ns"] >= w["oneway_p50_ns"] > 0), "raw wake one-way"
idle = srv["idle"]
assert idle["measured"] is True and idle["clients"] == 2, "idle"
assert idle["server_cpu_pct"] is not None and idle["server_cpu_pct"] >= 0, "idle cpu"
assert idle["rss_kib"] > 0 and idle["rss_base_kib"] > 0, "rss"
assert idle["wake_count"] == 2 and idle["wake_p50_ns"] > 0, "wake-ups"
fair = srv["fairness"]
assert fair["measured"] is True and fair["clients"] == 3 and fair["ratio"] > 0, "fairness"
assert len(fair["rows"]) == 3 and all(r["status"] == 0 and r["count"] > 0 for r in fair["rows"])
print("server bench JSON ok:", len(rows), "rows,", len(srv["sweep"]), "sweep points,",
      len(raw["sweep"]) + len(raw["spin_sweep"]), "raw shm points")
PY
# The server's runtime directory is gone, and so are its processes.
left=$(ls -A "$work/tmp")
[ -z "$left" ] || { echo "left behind in TMPDIR: $left"; exit 1; }

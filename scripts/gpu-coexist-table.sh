#!/usr/bin/env bash
# The bounded device-wide calls table (docs/gpu.md): test_gpu_coexist's
# device-wide tests (cudaFree after a kernel, cudaDeviceSynchronize,
# legacy-stream cudaMemcpy, cudaFree, cudaFreeHost, 200 of each per run;
# idle, then beside CPU->GPU, GPU->GPU and GPU->CPU load) ROUNDS times at
# each lease, then one table: the largest max and p99 and the median p50
# over the rounds, refused GPU->GPU submits, and every run's exit status.
# Needs a build (scripts/gpu-run.sh or gpu-lease.sh build first).
#
#   device: run(command="bash scripts/gpu-coexist-table.sh", carry=[".devdeps"])
#
# Environment: LEASES (default "100 250 1000 default"; "default": the
# library's), ROUNDS (default 20), BUILD (default build-gpu).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/chi-coexist-out}
BUILD=${BUILD:-build-gpu}
LEASES=${LEASES:-100 250 1000 default}
ROUNDS=${ROUNDS:-20}
mkdir -p "$OUT/coexist-runs"
. scripts/gpu-deps.sh >/dev/null 2>&1
T=$BUILD/tests/test_gpu_coexist
for lease in $LEASES; do
  for r in $(seq "$ROUNDS"); do
    log=$OUT/coexist-runs/$lease-$r.log
    if [ "$lease" = default ]; then
      CHI_TEST_FILTER='test_device_wide_*' timeout -k 5 120 "$T" >"$log" 2>&1
    else
      CHI_TEST_LEASE_US=$lease CHI_TEST_FILTER='test_device_wide_*' timeout -k 5 120 "$T" >"$log" 2>&1
    fi
    echo "rc=$?" >>"$log"
  done
done
python3 - "$OUT/coexist-runs" $LEASES <<'PY'
import re, sys, os, statistics
d, leases = sys.argv[1], sys.argv[2:]
row = re.compile(r'^# (idle|load): (.+?)\s+n=\s*\d+ p50=\s*([\d.]+) p99=\s*([\d.]+) max=\s*([\d.]+) us')
ref = re.compile(r'GPU->GPU \d+ ok \d+ bad (\d+) refused')
print("| lease | state | call | p50 (median of runs) | p99 (largest) | max (largest) |")
print("|---|---|---|---:|---:|---:|")
for lease in leases:
    acc, rcs, refused = {}, [], 0
    for f in sorted(os.listdir(d)):
        if not f.startswith(lease + "-"): continue
        for line in open(os.path.join(d, f), errors="replace"):
            m = row.match(line)
            if m:
                k = (m.group(1), m.group(2))
                a = acc.setdefault(k, [[], 0.0, 0.0])
                a[0].append(float(m.group(3))); a[1] = max(a[1], float(m.group(4))); a[2] = max(a[2], float(m.group(5)))
            m = ref.search(line)
            if m: refused += int(m.group(1))
            if line.startswith("rc="): rcs.append(line.strip()[3:])
    for (state, call), (p50s, p99, mx) in sorted(acc.items()):
        print(f"| {lease} | {state} | {call} | {statistics.median(p50s)/1000:.2f} ms | {p99/1000:.2f} ms | {mx/1000:.2f} ms |")
    bad = [r for r in rcs if r != "0"]
    print(f"| {lease} | runs | {len(rcs)} runs, exit statuses not 0: {len(bad)} {bad[:5]}; GPU->GPU submits refused under load: {refused} | | | |")
PY

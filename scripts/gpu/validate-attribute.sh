#!/usr/bin/env bash
# Attribution on the real driver (issue 8, points 4-5): what a probe hit costs and how sampled
# launches are scaled back, against launch_micro (scripts/gpu/launch_micro.cu: N empty-kernel
# launches, a stream synchronisation every 256, then ALLOCS 1 MiB cudaMalloc+cudaFree pairs).
# ROUNDS rounds (default 3), each with three runs interleaved:
#   native:   launch_micro alone (its median launch, CPU ns);
#   probed:   every launch probed (`--probe-budget off --probe-launches on`): the measured slowdown
#             per launch against the attributed probe cost per probed call;
#   sampled:  the default probe budget (1%, 50 ms windows): the scaled launch count against the
#             launches made, and the probe cost share (and, for information, the launch driver
#             time beside the application's native launch time x launches).
# Run from the repo root on the GPU machine after `cargo xtask bundle`. Results under $OUT.
set -u
OUT=${OUT:-/tmp/out-attribute}
# Every run's files go to $RAW, packed into $OUT/raw.tgz at the end (one file to fetch).
ROUNDS=${ROUNDS:-3}
N=${N:-1000000}
ALLOCS=${ALLOCS:-1000}
PIN=${PIN:-taskset -c 2}
BIN=$PWD/.carry/bin
T=$(mktemp -d)
RAW=$T/raw
mkdir -p "$OUT" "$RAW"
{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  uname -r
  echo "N=$N ALLOCS=$ALLOCS ROUNDS=$ROUNDS PIN=$PIN"
} | tee "$OUT/env.txt" "$RAW/env.txt"
nvcc -O2 -o "$T/launch_micro" scripts/gpu/launch_micro.cu || { echo "nvcc failed"; exit 1; }

# attributed TAG ARGS...: launch_micro under `vgpu-agent attribute ARGS`, started once the agent
# records (the agent attaches to the host's libcuda at start).
attributed() {
  local tag=$1; shift
  "$BIN/vgpu-agent" attribute --no-daemon --no-nvml --json --duration 120s --poll-interval 100ms "$@" \
    > "$RAW/$tag.json" 2> "$RAW/$tag.err" &
  local agent=$!
  for _ in $(seq 200); do grep -q "recording for" "$RAW/$tag.err" && break; sleep 0.1; done
  $PIN "$T/launch_micro" "$N" "$ALLOCS" > "$RAW/$tag.micro" 2>&1 &
  local w=$!
  echo "$w" > "$RAW/$tag.pid"
  wait "$w"
  sleep 0.5
  kill -INT "$agent"; wait "$agent"
}

for r in $(seq "$ROUNDS"); do
  $PIN "$T/launch_micro" "$N" "$ALLOCS" > "$RAW/native-$r.micro" 2>&1
  attributed "probed-$r" --probe-budget off --probe-launches on
  attributed "sampled-$r"
  echo "round $r: native $(cat "$RAW/native-$r.micro") probed $(cat "$RAW/probed-$r.micro") sampled $(cat "$RAW/sampled-$r.micro")"
done

python3 - "$RAW" "$ROUNDS" "$N" <<'PY' | tee "$OUT/summary.txt"
import json, re, statistics, sys
out, rounds, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
made = n + 1000  # launch_micro warms up with 1000 launches
def micro(tag):
    m = re.search(r"launch_med_ns=(\d+) launch_loop_ns=(\d+)", open(f"{out}/{tag}.micro").read())
    return float(m.group(1)), float(m.group(2))
def proc(tag):
    r = json.load(open(f"{out}/{tag}.json"))
    pid = int(open(f"{out}/{tag}.pid").read())
    p = next(p for p in r["processes"] if p["pid"] == pid)
    launch = [a for a in p["apis"] if a["kind"] == "launch"]
    return r, p, launch
native = [micro(f"native-{i}")[0] for i in range(1, rounds + 1)]
slow, charged, cost_share, counts, drivers, classes = [], [], [], [], [], []
for i in range(1, rounds + 1):
    r, p, launch = proc(f"probed-{i}")
    probed_calls = sum(a["calls"] for a in p["apis"] if a["measured_by"] == "probes")
    slow.append(micro(f"probed-{i}")[0] - native[i - 1])
    charged.append(p["components"]["probe_cost"] * 1e9 / max(probed_calls, 1))
    r, p, launch = proc(f"sampled-{i}")
    calls = sum(a["calls"] for a in launch)
    counts.append(calls)
    drivers.append(sum(a["seconds"] for a in launch))
    cost_share.append(r["sampling"]["probe_cost_share"])
    classes.append(r["sampling"].get("probe_cost_per_class_ns"))
    print(f"round {i}: measured by {sorted({a['measured_by'] for a in launch})}, sampling {json.dumps(r['sampling'].get('sampled_kinds'))}")
med = statistics.median
truth, got = med(slow), med(charged)
print(f"probe cost per probed launch: slowdown (probed - native median launch) {[round(s) for s in slow]} -> {truth:.0f} ns; "
      f"attributed {[round(c) for c in charged]} -> {got:.0f} ns ({abs(got - truth) / truth * 100:.1f}% off)")
print(f"sampled launch count: {counts} vs {made} made -> median {abs(med(counts) - made) / made * 100:.1f}% off")
dt = [made * x / 1e9 for x in native]
# Informational: the application's launch time also includes the CUDA runtime above the driver.
print(f"sampled launch driver time: {[round(d, 3) for d in drivers]} s; native median launch (application side) x launches "
      f"{[round(d, 3) for d in dt]} s (ratio {med(drivers) / med(dt):.3f})")
print(f"per-class hit cost at the end of each sampled run, ns: {classes}")
print(f"probe cost share with the default budget (1%): {[round(c * 100, 2) for c in cost_share]} %")
PY
cp "$OUT/summary.txt" "$RAW/"
tar czf "$OUT/raw.tgz" -C "$RAW" .
rm -rf "$T"

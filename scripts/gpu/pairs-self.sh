#!/usr/bin/env bash
# The limiter's own time per 1 MiB cuMemAlloc_v2 + cuMemFree_v2 pair on the real driver, for one or
# more limiter builds side by side: 1 and 8 processes allocating at once
# (after a barrier), native and each build interleaved round by round (the order rotates).
# Per process: the region's hook_ns per alloc + per free (the limiter's self-time, including
# the record of the call) and its median pair time end to end.
#   LIMITERS="after=.carry/bin/libvgpu_limiter.so before=.carry/before/libvgpu_limiter.so" \
#   ROUNDS=5 PAIRS=2000 bash scripts/gpu/pairs-self.sh
# Needs only .carry (cargo xtask bundle); results: $OUT/pairs-self.json and a table on stdout.
# EXERCISE_ARGS="--lib .../libsimcuda.so" runs it on the simulated driver (a dry run off the GPU).
# PIN=1 pins process i to CPU 2i (no migrations: a process that blocks in the driver otherwise
# often wakes up on another core, with cold caches and TLB).
# A build named NAME+sep gives each process a region of its own (nothing shared between the
# processes' accounting): against the same build with one region, what sharing costs.
# HOLD_IDLE=1 holds /dev/cpu_dma_latency at 0 for the whole run (the kernel then keeps idle CPUs
# in their shallowest idle state: a process that blocks in the driver wakes up on a core whose
# caches were not flushed by a deep C-state): against a run without it, what waking costs.
# BARRIER_S (default 3): seconds between starting the processes and releasing them together (they
# must all be past cuInit by then; the simulated driver needs a fraction of a second).
# OUTSIDE=1 (simulated driver only, with SIMCUDA_SWEEP on alloc and free) times each call minus
# the driver's own time (`pairs --outside`): builds that record nothing (ablations) can then be
# compared too; "pair us median" is then the time outside the driver per pair.
set -euo pipefail
OUT=${OUT:-/tmp/out-pairs-self}
ROUNDS=${ROUNDS:-5}
PAIRS=${PAIRS:-2000}
PROCS=${PROCS:-"1 8"}
LIMITERS=${LIMITERS:-"after=$PWD/.carry/bin/libvgpu_limiter.so"}
SETTINGS="rounds=$ROUNDS pairs=$PAIRS procs=$PROCS pin=${PIN:-0} hold_idle=${HOLD_IDLE:-0} outside=${OUTSIDE:-0}"
mode=()
if [ "${OUTSIDE:-0}" = 1 ]; then mode=(--outside); fi
# shellcheck source=ab-common.sh
source "$(dirname "$0")/ab-common.sh"
if [ "${HOLD_IDLE:-0}" = 1 ]; then
  # The request lasts as long as the file stays open (PM QoS); the holder goes with the script.
  python3 -c 'import os, signal, struct
fd = os.open("/dev/cpu_dma_latency", os.O_WRONLY)
os.write(fd, struct.pack("i", 0))
signal.pause()' &
  holder=$!
  trap 'kill "$holder" 2>/dev/null; rm -rf "$T" "$TS"' EXIT
  sleep 0.5
  kill -0 "$holder" || { echo "HOLD_IDLE=1: cannot hold /dev/cpu_dma_latency" >&2; exit 1; }
fi
builds=(native "${builds[@]}")

run() { # run BUILD N TAG: N processes after a barrier, one JSON line each in raw/TAG.jsonl
  local build=$1 n=$2 tag=$3 pids=() i region
  rm -f "$T/go"
  for i in $(seq "$n"); do
    region="$TS/$tag.region"
    if [[ $build == *+sep ]]; then region="$TS/$tag.$i.region"; fi
    pin=()
    if [ "${PIN:-0}" = 1 ]; then pin=(taskset -c $(( (i - 1) * 2 ))); fi
    if [ "$build" = native ]; then
      "${pin[@]}" "$BIN/cuda-exercise" "${XARGS[@]}" pairs "${mode[@]}" --count "$PAIRS" --barrier "$T/go" > "$T/$tag.$i.json" 2> "$T/$tag.$i.err" &
    else
      LD_PRELOAD=${lib[$build]} CUDA_DEVICE_MEMORY_LIMIT=64g LIBCUDA_LOG_LEVEL=2 \
        CUDA_DEVICE_MEMORY_SHARED_CACHE="$region" \
        "${pin[@]}" "$BIN/cuda-exercise" "${XARGS[@]}" pairs "${mode[@]}" --count "$PAIRS" --barrier "$T/go" > "$T/$tag.$i.json" 2> "$T/$tag.$i.err" &
    fi
    pids+=($!)
  done
  sleep "${BARRIER_S:-3}"; touch "$T/go"
  for i in "${pids[@]}"; do wait "$i"; done
  cat "$T/$tag".*.json > "$OUT/raw/$tag.jsonl"
}

for r in $(seq "$ROUNDS"); do
  k=${#builds[@]}
  for j in $(seq 0 $((k - 1))); do
    build=${builds[$(( (j + r) % k ))]}
    for n in $PROCS; do
      run "$build" "$n" "$build-p$n-r$r"
      echo "round $r $build x$n done"
    done
  done
done

python3 - "$OUT" "${builds[@]}" <<'PY'
import glob, json, statistics, sys
out, builds = sys.argv[1], sys.argv[2:]
res = {}
for b in builds:
    for f in sorted(glob.glob(f"{out}/raw/{b}-p*-r*.jsonl")):
        n = f.rsplit("-p", 1)[1].split("-r")[0]
        rows = [json.loads(l) for l in open(f) if l.strip()]
        e = res.setdefault(b, {}).setdefault(n, {"hook_per_pair": [], "pair_median_ns": [], "errors": 0})
        for row in rows:
            e["errors"] += row.get("errors", 0)
            e["pair_median_ns"].append(row.get("pair_median_ns", row.get("pair_outside_median_ns")))
            apis = (row.get("limiter") or {}).get("apis", {})
            a, fr = apis.get("cuMemAlloc_v2"), apis.get("cuMemFree_v2")
            if a and fr:
                e["hook_per_pair"].append(a["hook_ns"] / a["calls"] + fr["hook_ns"] / fr["calls"])
summary = {}
print(f"{'build':10} {'procs':>5} {'hook ns/pair median':>20} {'quartiles':>18} {'max':>7} {'pair ns median':>15} {'processes':>9}")
for b, by_n in res.items():
    for n, e in sorted(by_n.items(), key=lambda x: int(x[0])):
        h, p = e["hook_per_pair"], e["pair_median_ns"]
        s = {"processes": len(p), "errors": e["errors"], "pair_median_ns": statistics.median(p)}
        if h:
            q = statistics.quantiles(h, n=4) if len(h) > 1 else [h[0]] * 3
            s.update({"hook_ns_per_pair_median": statistics.median(h), "quartiles": [q[0], q[2]], "max": max(h)})
            print(f"{b:10} {n:>5} {s['hook_ns_per_pair_median']:>20.0f} {q[0]:>8.0f}..{q[2]:<8.0f} {max(h):>7.0f} {s['pair_median_ns']:>15.0f} {len(p):>9}")
        else:
            print(f"{b:10} {n:>5} {'-':>20} {'':>18} {'':>7} {s['pair_median_ns']:>15.0f} {len(p):>9}")
        summary.setdefault(b, {})[n] = s
json.dump({"summary": summary, "raw": res}, open(f"{out}/pairs-self.json", "w"), indent=1)
PY

#!/usr/bin/env bash
# The 8-process part of bench-limiter.sh alone: 1 MiB cuMemAlloc_v2+cuMemFree_v2
# pairs, 8 processes after a barrier, native and under the limiter interleaved, RUNS of each
# (default 5). Prints the slowest process's median pair per run and the limiter's own hook
# self-time per pair from the region (median and worst process). Run on the GPU machine from the
# repo root after `cargo xtask bundle`. Results under $OUT (default /tmp/out-pairs8).
set -u
OUT=${OUT:-/tmp/out-pairs8}
RUNS=${RUNS:-5}
PAIRS=${PAIRS:-5000}
mkdir -p "$OUT"
BIN=$PWD/.carry/bin
T=$(mktemp -d)
TS=$(mktemp -d -p /dev/shm)
# Scratch files and regions go when the script ends (a dry run must not leave them in /dev/shm).
trap 'rm -rf "$T" "$TS"' EXIT
{ date -u +"date: %Y-%m-%dT%H:%M:%SZ"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } | tee "$OUT/env.txt"
run8() { # run8 MODE TAG
  local mode=$1 tag=$2 i pids=()
  rm -f "$T/$tag.go"
  for i in $(seq 8); do
    if [ "$mode" = limited ]; then
      LD_PRELOAD=$BIN/libvgpu_limiter.so CUDA_DEVICE_MEMORY_LIMIT=64g CUDA_DEVICE_MEMORY_SHARED_CACHE="$TS/$tag.region" \
        "$BIN/cuda-exercise" pairs --count "$PAIRS" --barrier "$T/$tag.go" > "$T/$tag.$i.json" &
    else
      "$BIN/cuda-exercise" pairs --count "$PAIRS" --barrier "$T/$tag.go" > "$T/$tag.$i.json" &
    fi
    pids+=($!)
  done
  sleep 5; touch "$T/$tag.go"
  for i in "${pids[@]}"; do wait "$i"; done
  cat "$T/$tag".*.json > "$OUT/$tag.jsonl"
}
for run in $(seq "$RUNS"); do
  run8 native "native-$run"
  run8 limited "limited-$run"
done
python3 - "$OUT" "$RUNS" <<'PY' | tee "$OUT/summary.txt"
import json, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
def rows(tag): return [json.loads(l) for l in open(f"{out}/{tag}.jsonl") if l.strip()]
n = [max(r["pair_median_ns"] for r in rows(f"native-{i}")) for i in range(1, runs + 1)]
l = [max(r["pair_median_ns"] for r in rows(f"limited-{i}")) for i in range(1, runs + 1)]
hook = []
for i in range(1, runs + 1):
    for r in rows(f"limited-{i}"):
        a = r["limiter"]["apis"]
        hook.append(a["cuMemAlloc_v2"]["hook_ns"] / a["cuMemAlloc_v2"]["calls"] + a["cuMemFree_v2"]["hook_ns"] / a["cuMemFree_v2"]["calls"])
print(f"slowest process's median pair, ns: native {statistics.median(n):.0f} {n}, limiter {statistics.median(l):.0f} {l}, "
      f"difference {statistics.median(l) - statistics.median(n):+.0f}")
print(f"limiter hook self-time per pair, 8 processes at once: median {statistics.median(hook):.0f} ns, "
      f"worst process {max(hook):.0f} ns ({len(hook)} processes)")
PY
rm -rf "$T" "$TS"

#!/usr/bin/env bash
# What the limiter touches between driver calls, counted exactly (docs/benchmarks.md, "The limiter
# with cold caches"): `cuda-exercise pairs` on the simulated driver (4 KiB sweeps) under
# `valgrind --tool=lackey --trace-mem=yes`, the process's mappings captured while it runs, then
# lackey_stretches.py splits the trace at the simulated driver's cuMemAlloc_v2 / cuMemFree_v2
# entries and counts, per stretch ("after the alloc": the alloc's end and the free's start; "after
# the free"), the instructions the limiter executes and the distinct code lines, code pages and
# data lines and pages they touch. Needs valgrind (Debian package) and a release build.
#   bash scripts/vm/lackey-stretches.sh [LIMITER_SO] [PAIRS]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LIM=${1:-$ROOT/target/release/libvgpu_limiter.so}
PAIRS=${2:-150}
BIN=$ROOT/target/release
T=$(mktemp -d)
REGION=$(mktemp -u -p /dev/shm lackey-region.XXXXXX)
trap 'rm -rf "$T" "$REGION" "$REGION.ctl"' EXIT
SIMCUDA_SWEEP=alloc=4k,free=4k LD_PRELOAD=$LIM CUDA_DEVICE_MEMORY_LIMIT=64g \
  CUDA_DEVICE_MEMORY_SHARED_CACHE=$REGION VGPU_CONTEXT_BYTES=0 \
  valgrind --tool=lackey --trace-mem=yes --log-file="$T/trace" "$BIN/cuda-exercise" \
  --lib "$BIN/libsimcuda.so" pairs --count "$PAIRS" --barrier "$T/go" > "$T/out" 2>&1 &
pid=$!
for _ in $(seq 600); do
  grep -q libsimcuda "/proc/$pid/maps" 2>/dev/null && grep -q "$REGION" "/proc/$pid/maps" && break
  sleep 0.2
done
sleep 3 # past start-up: the mappings the pairs use are all there
cp "/proc/$pid/maps" "$T/maps"
touch "$T/go"
wait "$pid"
python3 "$ROOT/scripts/vm/lackey_stretches.py" "$T/trace" "$T/maps" "$LIM" "$BIN/libsimcuda.so"

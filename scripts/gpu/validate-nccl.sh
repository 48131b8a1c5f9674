#!/usr/bin/env bash
# GPU validation of the NCCL probes: `vgpu-agent stat` beside a 1-GPU torch.distributed
# (nccl) workload with known collectives. Run on the GPU machine from the repo root after
# `cargo xtask bundle` (binaries in .carry/bin). Results go to $OUT (default /tmp/out-nccl).
# Prints PASS or FAIL (exit status 1) at the end.
set -u
OUT=${OUT:-/tmp/out-nccl}
mkdir -p "$OUT"
BIN=$PWD/.carry/bin
T=$(mktemp -d)
export PYTHONUNBUFFERED=1
export MASTER_PORT=${MASTER_PORT:-29500}
{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  uname -r
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())'
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

python3 scripts/gpu/nccl_one_gpu.py "$T/ready" "$T/go" "$T/done" "$OUT/nccl_expected.json" > "$OUT/workload.log" 2>&1 &
W=$!
for _ in $(seq 600); do [ -e "$T/ready" ] && break; sleep 0.1; done
[ -e "$T/ready" ] || { echo "workload did not get ready"; cat "$OUT/workload.log"; kill $W 2>/dev/null; echo FAIL; exit 1; }
"$BIN/vgpu-agent" stat --json --duration 300s --poll-interval 200ms > "$OUT/stat.json" 2> "$OUT/stat.err" &
A=$!
# Wait until the workload's libnccl is attached (found in its /proc/<pid>/maps).
for _ in $(seq 600); do grep -q "libnccl.so.2 \[" "$OUT/stat.err" && break; sleep 0.1; done
cat "$OUT/stat.err"
grep -q "libnccl.so.2 \[" "$OUT/stat.err" || { echo "the agent did not attach to a libnccl"; kill -INT $A; kill $W; echo FAIL; exit 1; }
# The window starts with the first snapshot, logged as "tracing for".
for _ in $(seq 100); do grep -q "tracing for" "$OUT/stat.err" && break; sleep 0.1; done
touch "$T/go"
for _ in $(seq 1200); do [ -e "$T/done" ] && break; sleep 0.1; done
[ -e "$T/done" ] || { echo "workload did not finish"; cat "$OUT/workload.log"; }
sleep 0.5
kill -INT $A; wait $A
echo "stat exit: $?"
kill $W 2>/dev/null; wait $W 2>/dev/null
cat "$OUT/workload.log"
cat "$OUT/nccl_expected.json"
python3 scripts/gpu/compare_nccl.py "$OUT/nccl_expected.json" "$OUT/stat.json" | tee "$OUT/compare.txt"
exit "${PIPESTATUS[0]}"

#!/usr/bin/env bash
# GPU validation of `vgpu-agent stat`. Run on the GPU machine from the repo
# root after `cargo xtask bundle` (binaries in .carry/bin). Results go to $OUT (default /tmp/out).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
BIN=$PWD/.carry/bin
T=$(mktemp -d)
export PYTHONUNBUFFERED=1
{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  uname -r
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

python3 scripts/gpu/torch_known_calls.py "$T/ready" "$T/go" "$T/done" "$OUT/torch_expected.json" > "$OUT/workload.log" 2>&1 &
W=$!
for _ in $(seq 600); do [ -e "$T/ready" ] && break; sleep 0.1; done
[ -e "$T/ready" ] || { echo "workload did not get ready"; cat "$OUT/workload.log"; exit 1; }
"$BIN/vgpu-agent" stat --json --duration 300s --poll-interval 200ms > "$OUT/stat.json" 2> "$OUT/stat.err" &
A=$!
for _ in $(seq 300); do grep -q "tracing for" "$OUT/stat.err" && break; sleep 0.1; done
cat "$OUT/stat.err"
touch "$T/go"
for _ in $(seq 600); do [ -e "$T/done" ] && break; sleep 0.1; done
nvidia-smi --query-compute-apps=pid,used_memory --format=csv > "$OUT/nvidia-smi-apps.csv"
sleep 0.5
kill -INT $A; wait $A
echo "stat exit: $?"
kill $W 2>/dev/null; wait $W 2>/dev/null
cat "$OUT/torch_expected.json"
python3 scripts/gpu/compare_stat.py "$OUT/torch_expected.json" "$OUT/stat.json" | tee "$OUT/compare.txt"
# The human-readable table of the same kind of run, for the record.
"$BIN/vgpu-agent" stat --duration 2s --no-calibrate > "$OUT/stat-table-idle.txt" 2>&1

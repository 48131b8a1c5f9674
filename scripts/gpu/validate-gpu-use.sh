#!/usr/bin/env bash
# GPU use per process: `vgpu-agent stat --json`'s per-process SM utilisation
# against `nvidia-smi pmon -s u` over the same 20 s windows, for a saturating PyTorch matmul loop
# (no limiter), the same loop under the limiter at CUDA_DEVICE_SM_LIMIT=30, and the two at once.
# Run on the GPU machine from the repo root after `cargo xtask bundle` (needs
# .carry/bin/vgpu-agent and .carry/bin/libvgpu_limiter.so); builds nothing; as root (stat loads
# the probes). Results: $OUT/gpu-use-summary.{json,txt}, the pmon output, stat's JSON and the raw
# NVML samples of each phase (default OUT=/tmp/out-gpu-use). About 2 minutes.
# Exit status 1 if a process's SM figure is 5 points or more from pmon's.
set -u
OUT=${OUT:-/tmp/out-gpu-use}
mkdir -p "$OUT"
BIN=$PWD/.carry/bin
for f in vgpu-agent libvgpu_limiter.so; do
  [ -e "$BIN/$f" ] || { echo "missing $BIN/$f: run cargo xtask bundle where Rust is"; exit 2; }
done
{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version,memory.total,mig.mode.current --format=csv,noheader
  uname -r
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -1
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
export PYTHONUNBUFFERED=1
timeout 175 python3 scripts/gpu/validate_gpu_use.py "$BIN/libvgpu_limiter.so" "$BIN/vgpu-agent" "$OUT"
RC=$?
[ $RC -eq 0 ] && echo PASS || echo FAIL
exit $RC

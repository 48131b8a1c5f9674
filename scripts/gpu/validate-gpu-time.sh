#!/usr/bin/env bash
# GPU validation of the limiter's GPU time (sampled event pairs) against an independent referee,
# with NVML's per-process reading printed beside it, and of what sampling costs a launch. Run on
# the GPU machine from the repo root after `cargo xtask bundle` (needs .carry/bin/vgpu-agent and
# .carry/bin/libvgpu_limiter.so, and PyTorch or CuPy); builds nothing.
#
# Referee: each tenant's own completed work. All tenants launch the same kernel (a 2048^2 fp16
# matmul); its device time is measured alone first (a saturating run, batches of 50 with one
# synchronisation each), and a tenant's true GPU time over the window is the kernels it completed
# in the window (from its own log of CLOCK_MONOTONIC and kernels done after each batch) times
# that. Phases (MEASURE_S each, default 20 s, after 5 s of warm-up):
#   alone   one tenant duty-cycled at 0.3 of the GPU, under the limiter in its own region
#   shared  three tenants at 0.1, 0.2 and 0.3 at once, each in its own region (container)
# A tenant's limiter figure is `vgpu-agent stat --json`'s processes[].gpu_busy (source limiter,
# device 0) over a window from stat's "tracing for" to its SIGINT; NVML's is the same row's
# source nvml. PASS when every tenant's limiter share is within TOLERANCE_PTS (default 2) points
# of the referee's.
# Cost: an empty-kernel launch loop (PyTorch: add_ on a one-element tensor; CuPy: an empty
# RawKernel), median ns per launch over interleaved batches, natively, under the limiter with
# sampling at its default and with VGPU_GPU_TIME_SAMPLE=off. PASS when the limiter at its default
# adds at most 500 ns per launch to the native loop.
# Results: $OUT/gpu-time.json and $OUT/gpu-time.txt (default OUT=/tmp/out-gpu-time), the
# tenants' logs and stat's JSON per phase. Takes ~2 min. Exit status 1 on FAIL.
set -u
OUT=${OUT:-/tmp/out-gpu-time}
mkdir -p "$OUT"
BIN=$PWD/.carry/bin
for f in vgpu-agent libvgpu_limiter.so; do
  [ -e "$BIN/$f" ] || { echo "missing $BIN/$f: run cargo xtask bundle first"; exit 2; }
done
{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  git rev-parse HEAD 2>/dev/null | sed 's/^/commit: /'
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -1
  python3 -c 'import cupy; print("cupy", cupy.__version__)' 2>&1 | tail -1
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
timeout 600 python3 scripts/gpu/validate_gpu_time.py "$BIN/libvgpu_limiter.so" "$BIN/vgpu-agent" "$OUT"
RC=$?
[ $RC -eq 0 ] && echo PASS || echo FAIL
exit $RC

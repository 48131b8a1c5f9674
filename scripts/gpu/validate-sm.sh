#!/usr/bin/env bash
# GPU validation of the SM share controller. Run on the GPU machine from the repo root
# after `cargo xtask bundle` (needs .carry/bin/libvgpu_limiter.so and .carry/bin/vgpu-agent); builds
# nothing. A saturating PyTorch matmul loop (CuPy if PyTorch is missing) runs under the limiter:
#   1. alone at CUDA_DEVICE_SM_LIMIT=25, 50, 75: NVML device utilisation sampled every 200 ms for
#      30 s after a 5 s warm-up, mean against the target;
#   2. two processes (two containers: two regions) at 30% and 60% at once: NVML per-process SM
#      utilisation (nvidia-smi pmon) over 30 s, first with VGPU_SM_FEEDBACK=0 (open loop, for
#      comparison), then with the NVML feedback loop after 20 s of warm-up (its Info log of
#      measured and effective shares is recorded);
#   3. a run-time change: unlimited, then `vgpu-agent limit set --region R --sm 40` after 10 s;
#      the time until utilisation drops (three samples in a row <= 50%).
# Results: $OUT/sm-summary.json and $OUT/sm-summary.txt (default OUT=/tmp/out-sm). Takes ~6 min.
# Exit status 1 if a share misses its target by 5 points or more, or the change took over 1 s
# (+ NVML's averaging window, reported separately).
set -u
OUT=${OUT:-/tmp/out-sm}
mkdir -p "$OUT"
BIN=$PWD/.carry/bin
{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  uname -r
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -1
  python3 -c 'import cupy; print("cupy", cupy.__version__)' 2>&1 | tail -1
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
timeout 470 python3 scripts/gpu/validate_sm.py "$BIN/libvgpu_limiter.so" "$BIN/vgpu-agent" "$OUT" "$@"
RC=$?
[ $RC -eq 0 ] && echo PASS || echo FAIL
exit $RC

#!/usr/bin/env bash
# GPU validation of the limiter. Run on the GPU machine from the repo root after
# `cargo xtask bundle` (needs .carry/bin/libvgpu_limiter.so and vgpu-agent). Under a 4 GiB limit,
# each case (PyTorch default and expandable_segments, CuPy default and MemoryAsyncPool, JAX, raw
# ctypes driver calls) allocates until out-of-memory in its own region; nvidia-smi's per-process
# memory is compared with the region. PASS/FAIL per case; JSON and logs in $OUT (default
# /tmp/out-limiter). Cases can be named as arguments. Exit status 1 if any case failed.
set -u
OUT=${OUT:-/tmp/out-limiter}
mkdir -p "$OUT"
BIN=$PWD/.carry/bin
{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  uname -r
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -1
  python3 -c 'import cupy; print("cupy", cupy.__version__)' 2>&1 | tail -1
  python3 -c 'import jax; print("jax", jax.__version__)' 2>&1 | tail -1
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
python3 scripts/gpu/validate_limiter.py "$BIN/libvgpu_limiter.so" "$BIN/vgpu-agent" "$OUT" "$@"
RC=$?
[ $RC -eq 0 ] && echo PASS || echo FAIL
exit $RC

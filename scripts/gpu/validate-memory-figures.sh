#!/usr/bin/env bash
# GPU validation of the memory figures. Run on the GPU machine from the repo
# root after `cargo xtask bundle` (needs .carry/bin/libvgpu_limiter.so); builds nothing.
# For PyTorch, JAX (if it imports; XLA_PYTHON_CLIENT_PREALLOCATE=false) and CuPy: the free memory
# a framework reads right after initialising (torch.cuda.mem_get_info, cuMemGetInfo through
# ctypes for JAX, cupy.cuda.runtime.memGetInfo) against the bytes then allocatable (2 MiB and
# 20 MiB chunks until the framework's out-of-memory error), under the limiter with
# CUDA_DEVICE_MEMORY_LIMIT=4g and natively (20 MiB chunks only, for reference). Each case is its
# own process; two rounds, the order rotated.
# Results: $OUT/memory-figures.json and $OUT/memory-figures.txt (default
# OUT=/tmp/out-memory-figures). Takes ~2-3 min. Exit status 1 if, under the limiter, free and
# allocatable differ by more than the case's allowed slack (see validate_memory_figures.py).
set -u
OUT=${OUT:-/tmp/out-memory-figures}
MODULES="jax cupy"
. scripts/gpu/check-common.sh
verdict 230 python3 scripts/gpu/validate_memory_figures.py "$BIN/libvgpu_limiter.so" "$OUT"

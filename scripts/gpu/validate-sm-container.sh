#!/usr/bin/env bash
# GPU validation of SM shares per container. Run on the GPU machine from the
# repo root after `cargo xtask bundle` (needs .carry/bin/libvgpu_limiter.so); builds nothing.
# Container A: two processes sharing one region at CUDA_DEVICE_SM_LIMIT=50; container B: one
# process in its own region at 30; each a saturating PyTorch matmul loop (CuPy if PyTorch is
# missing). Per-process SM utilisation from `nvidia-smi pmon` (NVML's process samples) over 20 s
# after 12 s of warm-up, summed per container; two rounds, each running the NVML correction
# (VGPU_SM_FEEDBACK=nvml) and the open loop (VGPU_SM_FEEDBACK=0, for comparison) in rotated order;
# CUDA_VISIBLE_DEVICES (one index, default 0) picks the GPU.
# Results: $OUT/sm-container.json and $OUT/sm-container.txt (default OUT=/tmp/out-sm-container).
# Takes ~3.5 min (4 runs of ~50 s); SM_ROUNDS and SM_OPEN_LOOP=0 (validate_sm_container.py) change
# how many runs. Exit status 1 if a container's median share (correction on) misses its limit
# by 5 points or more.
set -u
OUT=${OUT:-/tmp/out-sm-container}
MODULES="cupy"
. scripts/gpu/check-common.sh
RUNS=$(( ${SM_ROUNDS:-2} * ( ${SM_OPEN_LOOP:-1} == 0 ? 1 : 2 ) ))
verdict $(( RUNS * 60 + 40 )) python3 scripts/gpu/validate_sm_container.py "$BIN/libvgpu_limiter.so" "$OUT"

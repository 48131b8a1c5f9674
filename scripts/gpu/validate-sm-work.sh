#!/usr/bin/env bash
# GPU validation of SM shares by completed work, with the correction measuring the containers'
# GPU time (VGPU_SM_FEEDBACK=auto, the default). Run on the GPU machine from the repo root after
# `cargo xtask bundle` (needs .carry/bin/libvgpu_limiter.so); builds nothing; needs PyTorch.
# Container A: two processes sharing one region at CUDA_DEVICE_SM_LIMIT=50; container B: one
# process at 30; each launches matmuls without a sync per launch. Each container's share is the
# work it completes beside the other over the work it completes alone (validate_sm_work.py).
# Results: $OUT/sm-work.json and $OUT/sm-work.txt (default OUT=/tmp/out-sm-work).
# Takes ~6 min (3 rounds); SM_ROUNDS, SM_COMPARE=0 (no NVML comparison), SM_WARM_S and
# SM_MEASURE_S change it. Exit status 1 if a container's median share misses its limit by more
# than 3 points, or its correction did not measure from GPU time.
OUT=${OUT:-/tmp/out-sm-work}
. scripts/gpu/check-common.sh
verdict 580 python3 scripts/gpu/validate_sm_work.py "$BIN/libvgpu_limiter.so" "$OUT"

#!/usr/bin/env bash
# GPU validation of freeze and thaw (docs/oversubscription.md): a PyTorch tenant under the limiter
# holding FREEZE_SIZES_GIB (default 4,16) GiB of a pattern is frozen and thawed with
# `vgpu-agent freeze|thaw --pid` (the driver's checkpoint API, driver 550+), timed against a pinned
# copy of the same size on the same GPU; the memory given back (nvidia-smi) and the pattern after
# the thaw are checked. Run from the repo root after `cargo xtask bundle` (.carry/bin); builds
# nothing. Results: $OUT/freeze.json, $OUT/freeze.txt (default OUT=/tmp/out-freeze). Exit status 1
# if a size misses a goal (0 corrupted words, >= 95% given back, each within 2x the pinned copy).
OUT=${OUT:-/tmp/out-freeze}
. scripts/gpu/check-common.sh
verdict 580 python3 scripts/gpu/validate_freeze.py "$BIN/vgpu-agent" "$BIN/libvgpu_limiter.so" "$OUT"

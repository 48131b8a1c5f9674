#!/usr/bin/env bash
# GPU validation of `vgpu-agent run --freeze-on-demand` (docs/oversubscription.md, "Freezing idle
# tenants for a waiting one"): container A (PyTorch under the limiter) holds FOD_A_MIB (default
# 16384) MiB of a pattern and goes idle; a filler outside any container takes the GPU but
# FOD_RESERVE_MIB (default 4096); container B (the driver API under the limiter,
# VGPU_OOM_WAIT=FOD_WAIT_S s, default 30) asks for more than is free (the free memory plus half
# of A's). With the daemon's `--freeze-on-demand FOD_IDLE_S` s (default 2) B's allocation must
# succeed (A frozen: >= 95% of its memory off the GPU by NVML), then A's next CUDA call thaws it
# with 0 corrupted words; the control, the same without the flag, must end B's wait with
# out-of-memory while A keeps its memory. Both runs must leave the GPU at its idle use. Run as
# root from the repo root after `cargo xtask bundle` (.carry/bin); builds nothing. SIM=1 runs it
# on the simulated driver (no GPU). Results: $OUT/freeze-on-demand.{json,txt} (default
# OUT=/tmp/out-freeze-on-demand). Exit status 1 on a miss, 2 (BLOCKED) without a writable cgroup
# v2 hierarchy. Takes ~2.5 min.
OUT=${OUT:-/tmp/out-freeze-on-demand}
. scripts/gpu/check-common.sh
export OUT
verdict 280 python3 scripts/gpu/validate_freeze_on_demand.py "$BIN/vgpu-agent" "$BIN/libvgpu_limiter.so" "$OUT"

#!/usr/bin/env bash
# GPU validation of the container path of freeze and thaw (docs/oversubscription.md): each of
# FREEZE_TENANTS (default torch, jax, cupy and a two-process PyTorch container) runs in a cgroup
# of its own under the limiter, holding FREEZE_MIB (default 1024) MiB of a pattern, beside
# `vgpu-agent run`; `vgpu-agent freeze --container` freezes it, and each process's next CUDA call
# thaws it (the daemon's thaw watcher). Checked: the memory given back (>= 95%), every process's
# pattern intact (0 corrupted words), the time to the thawed call's answer. Run as root from the
# repo root after `cargo xtask bundle` (.carry/bin); builds nothing. SIM=1 runs it on the
# simulated driver (no GPU). Results: $OUT/freeze-frameworks.{json,txt} (default
# OUT=/tmp/out-freeze-frameworks). Exit status 1 on a miss, 2 (BLOCKED) without a writable
# cgroup v2 hierarchy. Takes ~2 min.
OUT=${OUT:-/tmp/out-freeze-frameworks}
MODULES="cupy jax"
. scripts/gpu/check-common.sh
export OUT
verdict 300 python3 scripts/gpu/validate_freeze_frameworks.py "$BIN/vgpu-agent" "$BIN/libvgpu_limiter.so" "$OUT"

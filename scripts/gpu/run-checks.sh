#!/usr/bin/env bash
# Runs several GPU checks one after the other on the GPU machine, each with its own result folder
# and time limit, so that one device command covers a batch: `bash scripts/gpu/run-checks.sh
# attribute gpu-use metrics-nvml` (from the repo root, after `cargo xtask bundle`; results under
# $OUT/<check>/, each check's output in $OUT/<check>/run.log, a line per check in $OUT/checks.txt:
# name, exit status, seconds). Checks:
#   attribute        scripts/gpu/validate-attribute.sh (3 rounds, ~2 min)
#   budget           scripts/gpu/validate-budget.sh (the probe budget held, measured inside a
#                    launch loop under `vgpu-agent run --probe-launches on`, 3 rounds, ~5 min)
#   gpu-use          scripts/gpu/validate-gpu-use.sh (~2 min)
#   gpu-time         scripts/gpu/validate-gpu-time.sh (~2 min)
#   metrics-nvml     scripts/gpu/validate-metrics-nvml.sh (~1 min)
#   sm-container     scripts/gpu/validate-sm-container.sh
#   sm-work          scripts/gpu/validate-sm-work.sh (SM shares by completed work, ~6 min)
#   qos              scripts/gpu/validate-qos.sh (QoS tiers by completed work, ~8 min)
#   freeze           scripts/gpu/validate-freeze.sh (freeze and thaw, 4 and 16 GiB)
#   thaw-no-room     FREEZE_NO_ROOM=1 scripts/gpu/validate-freeze.sh (a thaw that finds no room,
#                    then one with room: the process thaws intact; ~1 min)
#   freeze-frameworks scripts/gpu/validate-freeze-frameworks.sh (freeze by container, thaw at the
#                    next CUDA call: PyTorch, JAX, CuPy, two processes; ~2 min)
#   freeze-in-process scripts/gpu/validate-freeze-in-process.sh (the limiter's in-process path:
#                    four frameworks, 4 and 16 GiB beside a pinned copy, the driver's path at
#                    16 GiB as the baseline; ~6 min)
#   freeze-on-demand scripts/gpu/validate-freeze-on-demand.sh (an idle 16 GiB container frozen for
#                    another's allocation waiting under VGPU_OOM_WAIT, thawed intact by its next
#                    call; and the control without --freeze-on-demand; ~2.5 min)
#   host-link        scripts/gpu/host_link_costs.py (what moving 16 GiB to host memory and back
#                    costs, piece by piece: pinning, pinned and pageable copies, VMM; ~2 min)
#   sm               scripts/gpu/validate-sm.sh (the SM share alone, in pairs, at run time, ~6 min)
#   agent-cost       scripts/gpu/agent-cost.sh (the agent's cost on one GPU, ~5 min; RUNS=5 of
#                    one pattern needs LIMIT_S=420)
#   two-gpu-slowdown PARTS=1 scripts/gpu/two-gpu.sh (two GPUs: the seed's patterns, ~8 min)
#   two-gpu-ranks-limits PARTS=2,3 scripts/gpu/two-gpu.sh (two GPUs: NCCL across ranks and the
#                    per-device limits, ~2 min)
#   probe-cost       scripts/gpu/probe-cost-breakdown.sh (two GPUs: where the agent's time goes;
#                    CONFIGS picks configurations)
#   memory-figures   scripts/gpu/validate-memory-figures.sh
#   bench-limiter    scripts/gpu/bench-limiter.sh (previous build from .carry/prev if bundled)
#   two-gpu-smoke    SMOKE=1 scripts/gpu/two-gpu.sh (one GPU: the script's own check)
#   screenshot       scripts/gpu/top-screenshot.sh (the README's)
# LIMIT_S (default 300) bounds each check; the device's own limit bounds the batch. BACK=DIR
# copies what should come back from the device (checks.txt, device.txt and one archive per check)
# into DIR, which holds nothing else (the device returns at most 8 files).
set -u
OUT=${OUT:-/tmp/out-checks}
LIMIT_S=${LIMIT_S:-300}
mkdir -p "$OUT"
{
  echo "date: $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
} | tee "$OUT/device.txt"
for check in "$@"; do
  dir=$OUT/$check
  mkdir -p "$dir"
  case $check in
    attribute) cmd=(bash scripts/gpu/validate-attribute.sh) ;;
    budget) cmd=(bash scripts/gpu/validate-budget.sh) ;;
    gpu-use) cmd=(bash scripts/gpu/validate-gpu-use.sh) ;;
    gpu-time) cmd=(bash scripts/gpu/validate-gpu-time.sh) ;;
    metrics-nvml) cmd=(bash scripts/gpu/validate-metrics-nvml.sh) ;;
    sm-container) cmd=(bash scripts/gpu/validate-sm-container.sh) ;;
    sm-work) cmd=(bash scripts/gpu/validate-sm-work.sh) ;;
    qos) cmd=(bash scripts/gpu/validate-qos.sh) ;;
    freeze) cmd=(bash scripts/gpu/validate-freeze.sh) ;;
    thaw-no-room) cmd=(env FREEZE_NO_ROOM=1 bash scripts/gpu/validate-freeze.sh) ;;
    freeze-frameworks) cmd=(bash scripts/gpu/validate-freeze-frameworks.sh) ;;
    freeze-in-process) cmd=(bash scripts/gpu/validate-freeze-in-process.sh) ;;
    freeze-on-demand) cmd=(bash scripts/gpu/validate-freeze-on-demand.sh) ;;
    host-link) cmd=(bash -c 'python3 scripts/gpu/host_link_costs.py "${HOST_LINK_GIB:-16}" >"$OUT/host-link.json"') ;;
    sm) cmd=(bash scripts/gpu/validate-sm.sh) ;;
    agent-cost) cmd=(bash scripts/gpu/agent-cost.sh) ;;
    probe-cost)
      cmd=(env NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
           bash scripts/gpu/probe-cost-breakdown.sh) ;;
    two-gpu-slowdown)
      # NVLink multicast off: the lent two-GPU machines cannot use it.
      cmd=(env PARTS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
           bash scripts/gpu/two-gpu.sh) ;;
    two-gpu-ranks-limits)
      cmd=(env PARTS=2,3 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
           bash scripts/gpu/two-gpu.sh) ;;
    memory-figures) cmd=(bash scripts/gpu/validate-memory-figures.sh) ;;
    bench-limiter)
      prev=.carry/prev/libvgpu_limiter.so
      if [ -f "$prev" ]; then cmd=(env LIM_PREV="$PWD/$prev" bash scripts/gpu/bench-limiter.sh)
      else cmd=(bash scripts/gpu/bench-limiter.sh); fi ;;
    two-gpu-smoke) cmd=(env SMOKE=1 bash scripts/gpu/two-gpu.sh) ;;
    screenshot) cmd=(bash scripts/gpu/top-screenshot.sh) ;;
    *) echo "unknown check: $check" | tee -a "$OUT/checks.txt"; continue ;;
  esac
  start=$(date +%s)
  OUT=$dir timeout --kill-after=10 "$LIMIT_S" "${cmd[@]}" >"$dir/run.log" 2>&1
  rc=$?
  line="$check rc=$rc seconds=$(( $(date +%s) - start ))"
  echo "$line" | tee -a "$OUT/checks.txt"
  # Everything the check wrote in one archive (few files come back from the device); its
  # summaries (*.txt, *.json) and run.log also as they are.
  tar czf "$OUT/$check.tar.gz" -C "$OUT" "$check"
  find "$dir" -type f ! -name run.log ! -name '*.txt' ! -name '*.json' -delete
  find "$dir" -mindepth 1 -type d -empty -delete
  tail -n 25 "$dir/run.log"
  if [ -n "${BACK:-}" ]; then # after each check: a batch cut short by the device keeps the rest
    mkdir -p "$BACK"
    cp "$OUT/checks.txt" "$OUT/device.txt" "$OUT/$check.tar.gz" "$BACK"/
  fi
done

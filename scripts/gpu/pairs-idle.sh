#!/usr/bin/env bash
# Why eight processes' alloc+free pairs cost the limiter twice what one process's do: pairs-self.sh
# on the real driver with and without idle CPUs held in their shallowest
# state (HOLD_IDLE=1), and on the simulated driver with calls that sleep inside the driver (as a
# call does that waits for another process's), one process, with and without the hold.
#   bash scripts/gpu/pairs-idle.sh      # results under $OUT/<case>/, the CPU's idle states in $OUT/cpu.txt
set -euo pipefail
OUT=${OUT:-/tmp/out-pairs-idle}
mkdir -p "$OUT"
here=$(dirname "$0")
{
  lscpu | grep -E "Model name|^CPU\(s\)|Thread|Socket|NUMA node\(s\)|L2|L3|Hypervisor" || true
  for s in /sys/devices/system/cpu/cpu0/cpuidle/state*; do
    [ -d "$s" ] && echo "$(basename "$s"): $(cat "$s/name") latency=$(cat "$s/latency")us residency=$(cat "$s/residency")us disabled=$(cat "$s/disable")"
  done
  echo "cpuidle driver: $(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo none)"
  echo "cpufreq governor: $(cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor 2>/dev/null || echo none)"
} | tee "$OUT/cpu.txt"
sim=(--lib "$PWD/.carry/bin/libsimcuda.so")
for hold in 0 1; do
  OUT=$OUT/gpu-hold$hold HOLD_IDLE=$hold ROUNDS=${ROUNDS:-3} bash "$here/pairs-self.sh"
  SIMCUDA_DELAY_US=alloc=${SLEEP_US:-400},free=${SLEEP_US:-400} EXERCISE_ARGS="${sim[*]}" PROCS=1 \
    OUT=$OUT/sim-sleep-hold$hold HOLD_IDLE=$hold ROUNDS=${ROUNDS:-3} PAIRS=1000 bash "$here/pairs-self.sh"
done

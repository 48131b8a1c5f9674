#!/usr/bin/env bash
# Where the agent's time goes on the two-GPU all_reduce loop (the seed slowdown test's sustained
# all_reduce, K=1024, `torchrun --nproc_per_node=2`), from the repo root after `cargo xtask bundle`
# (binaries in .carry/bin; nothing is built here). Results under $OUT (default /tmp/out-probe-cost).
#
# Configurations, the order rotated each round (RUNS rounds, default 3):
#   native         the loop alone
#   limiter        under the limiter (LD_PRELOAD)
#   agent          the limiter + `vgpu-agent run` at its defaults, on any core
#   agent-pinned   the same, the daemon on cores 0-1 (the ranks run on PIN, default 2-7): what is left
#                  once the daemon's own threads cannot take a rank's core is what the probes cost
#   agent-nonvml   as agent-pinned, with --no-nvml: the NVML reads' share
# With kernel.bpf_stats_enabled=1 for the agent configurations, each eBPF program's run count and
# run time come from the daemon's program descriptors (/proc/PID/fdinfo: run_cnt, run_time_ns),
# the daemon's CPU time per thread from /proc/PID/task/*/stat, and the daemon's snapshot (its socket)
# gives the calls per API per rank and the calibrated price of a probe hit per prologue class;
# the workload marks its measured window (MARK_PREFIX), and the counts and programs' run counts
# are also read at its start and end, so that the per-step figures are the window's.
# breakdown.txt puts them together per step: probe hits x (trap price + program time), the
# daemon's CPU, and the added time per step against native.
# Exit status: 1 if a run produced no figure or a configuration's median is outside native's
# spread (min..max of its runs).
set -u
OUT=${OUT:-/tmp/out-probe-cost}
RUNS=${RUNS:-3}
export MEASURE_SECS=${MEASURE_SECS:-10} K=${K:-1024} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PIN=${PIN-taskset -c 2-7}
CONFIGS=(${CONFIGS:-native limiter agent agent-pinned agent-nonvml})
BIN=$PWD/.carry/bin
HERE=$PWD/scripts/gpu
mkdir -p "$OUT"
for f in vgpu-agent libvgpu_limiter.so; do
  [ -e "$BIN/$f" ] || { echo "probe-cost-breakdown.sh: $BIN/$f is missing: run cargo xtask bundle and carry .carry/"; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "probe-cost-breakdown.sh: run as root (the agent loads eBPF probes)"; exit 1; }
NGPU=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l)
[ "$NGPU" -ge 2 ] || { echo "probe-cost-breakdown.sh: needs two GPUs, $NGPU visible"; exit 1; }
TS=$(mktemp -d -p /dev/shm probe-cost.XXXXXX)
DAEMON=
STATS_BEFORE=$(cat /proc/sys/kernel/bpf_stats_enabled 2>/dev/null || echo 0)
cleanup() {
  [ -n "$DAEMON" ] && kill -INT "$DAEMON" 2>/dev/null && wait "$DAEMON" 2>/dev/null
  echo "$STATS_BEFORE" > /proc/sys/kernel/bpf_stats_enabled 2>/dev/null
  rm -rf "$TS"
}
trap cleanup EXIT
{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
  nvidia-smi topo -m 2>/dev/null | head -3
  uname -r; nproc
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())'
  echo "RUNS=$RUNS MEASURE_SECS=$MEASURE_SECS K=$K PIN='$PIN' CONFIGS='${CONFIGS[*]}'"
} 2>&1 | tee "$OUT/env.txt"

# Each eBPF program of the daemon, from its descriptors: name, run_cnt, run_time_ns (JSON lines).
prog_stats() { # pid
  python3 "$HERE/probe_cost_breakdown.py" --progs "$1"
}
cpu_threads() { # pid: comm utime stime (clock ticks) per thread
  local t
  for t in /proc/"$1"/task/*; do
    awk '{c=$0; sub(/^[0-9]+ \(/, "", c); sub(/\) .*/, "", c); n=split($0, f, ") "); split(f[n], g, " ");
          print c, g[12], g[13]}' "$t/stat" 2>/dev/null
  done
}
snapshot() { # socket file
  python3 "$HERE/daemon_snapshot.py" "$1" "$2"
}
start_daemon() { # config round
  local cfg=$1 r=$2 pin="" extra=""
  case $cfg in agent-pinned|agent-nonvml) pin="taskset -c 0,1" ;; esac
  [ "$cfg" = agent-nonvml ] && extra=--no-nvml
  echo 1 > /proc/sys/kernel/bpf_stats_enabled
  mkdir -p "$TS/regions"
  rm -f "$TS/agent.sock"
  $pin "$BIN/vgpu-agent" run --socket "$TS/agent.sock" --region-dir "$TS/regions" \
    --metrics-listen off $extra > "$OUT/daemon-$cfg-$r.log" 2>&1 &
  DAEMON=$!
  for _ in $(seq 600); do [ -S "$TS/agent.sock" ] && break; sleep 0.1; done
  sleep 3 # its probes attach to the host's libcuda and libnccl first
}
stop_daemon() { # config round
  local cfg=$1 r=$2
  snapshot "$TS/agent.sock" "$OUT/snapshot-$cfg-$r.json" || echo "no snapshot for $cfg-$r"
  prog_stats "$DAEMON" > "$OUT/progs-$cfg-$r.txt"
  cpu_threads "$DAEMON" > "$OUT/daemon-cpu-$cfg-$r.txt"
  kill -INT "$DAEMON" 2>/dev/null; wait "$DAEMON" 2>/dev/null; DAEMON=
  echo 0 > /proc/sys/kernel/bpf_stats_enabled
}
run_config() { # config round
  local cfg=$1 r=$2
  local cmd=(torchrun --standalone --nproc_per_node=2 "$HERE/hami_slowdown.py")
  case $cfg in
    native) env PATTERNS=all_reduce LABEL="native-$r" $PIN "${cmd[@]}" ;;
    limiter)
      mkdir -p "$TS/regions/$cfg-$r"
      env LD_PRELOAD="$BIN/libvgpu_limiter.so" CUDA_DEVICE_MEMORY_LIMIT=64g \
        CUDA_DEVICE_MEMORY_SHARED_CACHE="$TS/regions/$cfg-$r/ctr.cache" \
        PATTERNS=all_reduce LABEL="$cfg-$r" $PIN "${cmd[@]}" ;;
    *)
      start_daemon "$cfg" "$r"
      mkdir -p "$TS/regions/$cfg-$r"
      rm -f "$TS/mark.start" "$TS/mark.end"
      env LD_PRELOAD="$BIN/libvgpu_limiter.so" CUDA_DEVICE_MEMORY_LIMIT=64g \
        CUDA_DEVICE_MEMORY_SHARED_CACHE="$TS/regions/$cfg-$r/ctr.cache" MARK_PREFIX="$TS/mark" \
        PATTERNS=all_reduce LABEL="$cfg-$r" $PIN "${cmd[@]}" &
      local job=$!
      # The daemon's counts and the programs' run counts at both ends of the measured window.
      local at
      for at in start end; do
        while [ ! -e "$TS/mark.$at" ] && kill -0 "$job" 2>/dev/null; do sleep 0.05; done
        if [ -e "$TS/mark.$at" ]; then
          snapshot "$TS/agent.sock" "$OUT/snapshot-$at-$cfg-$r.json" || echo "no $at snapshot for $cfg-$r"
          prog_stats "$DAEMON" > "$OUT/progs-$at-$cfg-$r.txt"
        fi
      done
      wait "$job"
      stop_daemon "$cfg" "$r" ;;
  esac
}
: > "$OUT/results.txt"
N=${#CONFIGS[@]}
for r in $(seq "$RUNS"); do
  for i in $(seq 0 $((N - 1))); do
    cfg=${CONFIGS[$(((i + r - 1) % N))]}
    run_config "$cfg" "$r" > "$TS/run.log" 2>&1
    cat "$TS/run.log" >> "$OUT/runs.log"
    grep RESULT "$TS/run.log" | tee -a "$OUT/results.txt"
  done
done
python3 "$HERE/probe_cost_breakdown.py" "$OUT" | tee "$OUT/breakdown.txt"
exit "${PIPESTATUS[0]}"

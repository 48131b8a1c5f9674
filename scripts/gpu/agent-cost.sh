#!/usr/bin/env bash
# The agent's cost on one GPU, against native, on real workloads: an eager loop of 600 tiny
# kernels, a GPT-2 training step (scripts/gpu/one_gpu_steps.py) and the seed slowdown test's
# single-GPU `combined` pattern (scripts/gpu/hami_slowdown.py, K=1024); PATTERNS_ONE_GPU picks
# some. Configurations (CONFIGS): native, limiter, limiter-nosample (the limiter without its GPU-time
# sampling, VGPU_GPU_TIME_SAMPLE=off), agent (the limiter + `vgpu-agent run` at its defaults),
# agent-nonvml (the same with --no-nvml); default native, limiter and agent; RUNS rounds (default 3), the
# order rotated each round; the workload pinned to cores 2-7 (PIN). From the repo root after
# `cargo xtask bundle` (binaries in .carry/bin). Results under $OUT (default /tmp/out-agent-cost):
# results.txt (every run), verdict.txt (per pattern the medians and spreads).
# Exit status: 1 if a configuration's median is outside native's spread (min..max) or a run
# produced no figure.
set -u
OUT=${OUT:-/tmp/out-agent-cost}
RUNS=${RUNS:-3}
export MEASURE_SECS=${MEASURE_SECS:-8} K=${K:-1024} PYTHONUNBUFFERED=1
PATTERNS_ONE_GPU=${PATTERNS_ONE_GPU:-eager,gpt2,combined}
PIN=${PIN-taskset -c 2-7}
BIN=$PWD/.carry/bin
HERE=$PWD/scripts/gpu
mkdir -p "$OUT"
for f in vgpu-agent libvgpu_limiter.so; do
  [ -e "$BIN/$f" ] || { echo "agent-cost.sh: $BIN/$f is missing: run cargo xtask bundle and carry .carry/"; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "agent-cost.sh: run as root (the agent loads eBPF probes)"; exit 1; }
TS=$(mktemp -d -p /dev/shm agent-cost.XXXXXX)
DAEMON=
cleanup() {
  [ -n "$DAEMON" ] && kill -INT "$DAEMON" 2>/dev/null && wait "$DAEMON" 2>/dev/null
  rm -rf "$TS"
}
trap cleanup EXIT
{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | head -1
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
  echo "RUNS=$RUNS MEASURE_SECS=$MEASURE_SECS K=$K PIN='$PIN'"
} 2>&1 | tee "$OUT/env.txt"
workloads() { # LABEL in the environment names the runs
  case ",$PATTERNS_ONE_GPU," in *,eager,*|*,gpt2,*)
    PATTERNS=$(echo "$PATTERNS_ONE_GPU" | tr , '\n' | grep -E '^(eager|gpt2)$' | paste -sd,) \
      $PIN python3 "$HERE/one_gpu_steps.py" ;;
  esac
  case ",$PATTERNS_ONE_GPU," in *,combined,*) PATTERNS=combined $PIN python3 "$HERE/hami_slowdown.py" ;; esac
}
run_config() { # config round
  local cfg=$1 r=$2
  case $cfg in
    native) LABEL="native-$r" workloads ;;
    limiter|limiter-nosample|agent|agent-nonvml)
      if [ "${cfg%-nosample}" != limiter ]; then
        rm -f "$TS/agent.sock"
        "$BIN/vgpu-agent" run --socket "$TS/agent.sock" --region-dir "$TS/regions" \
          --metrics-listen off $([ "$cfg" = agent-nonvml ] && echo --no-nvml) > "$OUT/daemon-$cfg-$r.log" 2>&1 &
        DAEMON=$!
        for _ in $(seq 300); do [ -S "$TS/agent.sock" ] && break; sleep 0.1; done
        sleep 3
      fi
      mkdir -p "$TS/regions/$cfg-$r"
      local sample=auto
      [ "$cfg" = limiter-nosample ] && sample=off
      VGPU_GPU_TIME_SAMPLE=$sample LD_PRELOAD="$BIN/libvgpu_limiter.so" CUDA_DEVICE_MEMORY_LIMIT=64g \
        CUDA_DEVICE_MEMORY_SHARED_CACHE="$TS/regions/$cfg-$r/ctr.cache" \
        LABEL="$cfg-$r" workloads
      if [ "${cfg%-nosample}" != limiter ]; then kill -INT "$DAEMON"; wait "$DAEMON" 2>/dev/null; DAEMON=; fi ;;
  esac
}
CONFIGS=(${CONFIGS:-native limiter agent})
N=${#CONFIGS[@]}
: > "$OUT/results.txt"
for r in $(seq "$RUNS"); do
  for i in $(seq 0 $((N - 1))); do
    cfg=${CONFIGS[$(((i + r - 1) % N))]}
    run_config "$cfg" "$r" > "$TS/run.log" 2>&1
    cat "$TS/run.log" >> "$OUT/runs.log"
    grep RESULT "$TS/run.log" | tee -a "$OUT/results.txt"
  done
done
python3 - "$OUT/results.txt" <<'PY' | tee "$OUT/verdict.txt"
import re, statistics, sys
data = {}
for l in open(sys.argv[1]):
    m = re.match(r"RESULT ([\w-]+)-(\d+) (\w+) ([\d.]+) ms/step", l)
    if m:
        data.setdefault((m.group(3), m.group(1)), []).append(float(m.group(4)))
ok = bool(data)
cfgs = sorted({c for _, c in data} - {"native"})
for pattern in sorted({p for p, _ in data}):
    n = data.get((pattern, "native"), [])
    if not n:
        print(f"{pattern}: no native runs"); ok = False; continue
    print(f"{pattern}: native median {statistics.median(n):.3f} ms/step, runs {n}")
    for cfg in cfgs:
        v = data.get((pattern, cfg), [])
        if not v:
            print(f"  {cfg}: no runs"); ok = False; continue
        med = statistics.median(v)
        # Slower than native's slowest is a cost; faster than its fastest is noise in our favour.
        within = med <= max(n)
        ok = ok and within
        print(f"  {cfg}: median {med:.3f} ({(med / statistics.median(n) - 1) * 100:+.1f}%), runs {v}; "
              f"within native's spread (or faster): {'yes' if within else 'NO'}")
print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
PY
exit "${PIPESTATUS[0]}"

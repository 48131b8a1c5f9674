#!/usr/bin/env bash
# Two GPUs, on a machine with two GPUs, from the repo root after `cargo xtask bundle`
# (binaries in .carry/bin; nothing is built here). Results under $OUT (default /tmp/out-two-gpu).
#   1. The seed slowdown test's multi-GPU patterns (scripts/gpu/hami_slowdown.py: sustained
#      all_reduce, and the combined step) under `torchrun --nproc_per_node=2`: native, the limiter,
#      and the limiter + the agent daemon at its defaults; RUNS rounds (default 3), the order of
#      the three rotated each round; medians and spread per configuration (slowdown.txt). Fails
#      when a configuration's median is outside native's spread (min..max of its runs).
#   2. `vgpu-agent stat --json` during a 2-rank all_reduce job (scripts/gpu/nccl_ranks.py): both
#      ranks' communicators, one NCCL communicator id (checked against the commId NCCL itself
#      prints with NCCL_DEBUG=INFO), ranks 0 and 1 of 2, calls and bytes as issued
#      (nccl-compare.txt); and `vgpu-agent top`'s detail view of the job's container in tmux
#      (top-nccl.txt), when tmux is installed.
#   3. Different per-device limits (CUDA_DEVICE_MEMORY_LIMIT_0 and _1): PyTorch allocating until
#      out-of-memory on each device, against nvidia-smi, the region and `stat --json`, one process
#      on both devices, then one process per device in one container (device-limits.txt).
# With fewer than 2 GPUs the two-GPU parts say BLOCKED and the rest runs on one GPU: the
# slowdown harness and the NCCL check with one rank (world size 1), and the limit of device 0
# (a smoke test of this script, not a two-GPU figure). SMOKE=1 shortens every part;
# PARTS=1 or PARTS=2,3 runs some parts (part 1 takes ~8 min at the defaults, 2 and 3 ~1 min each).
# Exit status: 1 if any check failed, else 0.
set -u
OUT=${OUT:-/tmp/out-two-gpu}
RUNS=${RUNS:-3}
SMOKE=${SMOKE:-0}
if [ "$SMOKE" = 1 ]; then
  RUNS=1 MEASURE_SECS=${MEASURE_SECS:-3}
fi
export MEASURE_SECS=${MEASURE_SECS:-15} K=${K:-1024} PYTHONUNBUFFERED=1
PARTS=${PARTS:-1,2,3}
part() { case ",$PARTS," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
# The ranks' busy threads on cores of their own: migrations were the largest source of spread in
# the one-GPU seed test (scripts/gpu/seed-slowdown.sh).
PIN=${PIN-taskset -c 2-7}
LIMITS_MIB=${LIMITS_MIB:-3072,5120}
BIN=$PWD/.carry/bin
HERE=$PWD/scripts/gpu
mkdir -p "$OUT"
for f in vgpu-agent libvgpu_limiter.so; do
  [ -e "$BIN/$f" ] || { echo "two-gpu.sh: $BIN/$f is missing: run cargo xtask bundle and carry .carry/"; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "two-gpu.sh: run as root (the agent loads eBPF probes)"; exit 1; }
TS=$(mktemp -d -p /dev/shm two-gpu.XXXXXX)
DAEMON=
cleanup() {
  [ -n "$DAEMON" ] && kill -INT "$DAEMON" 2>/dev/null && wait "$DAEMON" 2>/dev/null
  [ -n "${TMUX_SOCK:-}" ] && tmux -L "$TMUX_SOCK" kill-server 2>/dev/null
  [ -n "${CG:-}" ] && { echo 1 > "$CG/cgroup.kill" 2>/dev/null; sleep 1; find "$CGROOT" -depth -type d -exec rmdir {} \; 2>/dev/null; }
  rm -rf "$TS"
}
trap cleanup EXIT
FAILED=0
verdict() { # part, exit status of its check
  local v=PASS
  [ "$2" = 0 ] || { v=FAIL; FAILED=1; }
  echo "part $1: $v" | tee -a "$OUT/summary.txt"
}

NGPU=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l)
{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,pci.bus_id --format=csv,noheader
  nvidia-smi topo -m 2>/dev/null | head -4
  uname -r
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())'
  echo "GPUs visible: $NGPU  PARTS=$PARTS RUNS=$RUNS MEASURE_SECS=$MEASURE_SECS K=$K PIN='$PIN' LIMITS_MIB=$LIMITS_MIB SMOKE=$SMOKE"
} 2>&1 | tee "$OUT/env.txt"
: > "$OUT/summary.txt"
if [ "$NGPU" -lt 1 ]; then
  echo "two-gpu.sh: no GPU visible (nvidia-smi lists none): nothing to run" | tee -a "$OUT/summary.txt"
  exit 0
fi
if [ "$NGPU" -ge 2 ]; then
  RANKS=2 DEVICES=0,1
else
  RANKS=1 DEVICES=0 LIMITS_MIB=${LIMITS_MIB%%,*}
  echo "two-gpu.sh: only $NGPU GPU visible. BLOCKED: two ranks on two GPUs, two devices' limits." \
       "Running the one-GPU forms (1 rank, device 0) as a smoke test of this script." | tee -a "$OUT/summary.txt"
fi

# --- 1. slowdown: native, limiter, limiter + daemon; rotated order, medians and spread ---------
start_daemon() {
  mkdir -p "$TS/regions"
  "$BIN/vgpu-agent" run --socket "$TS/agent.sock" --region-dir "$TS/regions" > "$OUT/daemon.log" 2>&1 &
  DAEMON=$!
  for _ in $(seq 600); do [ -S "$TS/agent.sock" ] && break; sleep 0.1; done
  [ -S "$TS/agent.sock" ] || { echo "the daemon did not start"; cat "$OUT/daemon.log"; }
  sleep 3 # its probes attach to the host's libcuda and libnccl first
}
stop_daemon() { kill -INT "$DAEMON" 2>/dev/null; wait "$DAEMON" 2>/dev/null; DAEMON=; }
run_config() { # config round
  local cfg=$1 r=$2
  local cmd=(torchrun --standalone --nproc_per_node="$RANKS" "$HERE/hami_slowdown.py")
  case $cfg in
    native) env PATTERNS=all_reduce,combined LABEL="native-$r" $PIN "${cmd[@]}" ;;
    limiter|agent)
      [ "$cfg" = agent ] && start_daemon
      mkdir -p "$TS/regions/$cfg-$r"
      env LD_PRELOAD="$BIN/libvgpu_limiter.so" CUDA_DEVICE_MEMORY_LIMIT=64g \
        CUDA_DEVICE_MEMORY_SHARED_CACHE="$TS/regions/$cfg-$r/ctr.cache" \
        PATTERNS=all_reduce,combined LABEL="$cfg-$r" $PIN "${cmd[@]}"
      [ "$cfg" = agent ] && stop_daemon ;;
  esac
}
if part 1; then
CONFIGS=(native limiter agent)
: > "$OUT/results.txt"
for r in $(seq "$RUNS"); do
  for i in 0 1 2; do
    cfg=${CONFIGS[$(((i + r - 1) % 3))]}
    # Not in a pipeline: the daemon's pid must stay in this shell (the exit trap stops it).
    run_config "$cfg" "$r" > "$TS/run.log" 2>&1
    cat "$TS/run.log" >> "$OUT/slowdown-runs.log"
    grep RESULT "$TS/run.log" | tee -a "$OUT/results.txt"
  done
done
python3 - "$OUT/results.txt" <<'PY' | tee "$OUT/slowdown.txt"
import re, statistics, sys
data = {}
for l in open(sys.argv[1]):
    m = re.match(r"RESULT (\w+)-(\d+) (\w+) ([\d.]+) ms/step \((\d+) steps\) world=(\d+)", l)
    if m:
        data.setdefault((m.group(3), m.group(1)), []).append(float(m.group(4)))
ok = bool(data)
for pattern in ["all_reduce", "combined"]:
    n = data.get((pattern, "native"), [])
    if not n:
        print(f"{pattern}: no native runs"); ok = False; continue
    lo, hi = min(n), max(n)
    print(f"{pattern}: native median {statistics.median(n):.3f} ms/step, runs {n}, spread {lo:.3f}..{hi:.3f}")
    for cfg in ["limiter", "agent"]:
        v = data.get((pattern, cfg), [])
        if not v:
            print(f"  {cfg}: no runs"); ok = False; continue
        med = statistics.median(v)
        # Slower than native's slowest is a cost; faster than its fastest is noise in our favour.
        within = med <= hi
        ok = ok and within
        print(f"  {cfg}: median {med:.3f} ms/step ({(med / statistics.median(n) - 1) * 100:+.2f}%), runs {v}, "
              f"spread {min(v):.3f}..{max(v):.3f}; median within native's spread (or faster): {'yes' if within else 'NO'}")
sys.exit(0 if ok else 1)
PY
verdict "1 slowdown (every configuration's median within native's spread, slowdown.txt)" "${PIPESTATUS[0]}"
fi

# --- 2. NCCL across ranks: stat --json and top beside a known all_reduce job -------------------
if part 2; then
N=$TS/nccl
mkdir -p "$N"
ALL_REDUCE=$([ "$SMOKE" = 1 ] && echo 20 || echo 200)
# The ranks in a cgroup shaped like a Kubernetes pod's container, so top shows them as one
# container; NCCL prints each rank's commId (INIT lines) into the log.
POD_UID=21d0c0de-0000-4000-8000-0000000000a1
CTR_ID=21d0c0de21d0c0de21d0c0de21d0c0de21d0c0de21d0c0de21d0c0de21d0c0de
CGROOT=/sys/fs/cgroup/vgpu-two-gpu-$$
CG=$CGROOT/kubepods/besteffort/pod$POD_UID/$CTR_ID
mkdir -p "$CG" || CG=
sh -c "[ -n '$CG' ] && echo \$\$ > '$CG/cgroup.procs'; exec env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT ALL_REDUCE=$ALL_REDUCE \
  torchrun --standalone --nproc_per_node=$RANKS '$HERE/nccl_ranks.py' '$N'" > "$OUT/nccl-workload.log" 2>&1 &
W=$!
for _ in $(seq 1200); do [ "$(ls "$N"/ready-* 2>/dev/null | wc -l)" -ge "$RANKS" ] && break; sleep 0.1; done
"$BIN/vgpu-agent" stat --json --no-daemon --duration 600s --poll-interval 200ms > "$OUT/nccl-stat.json" 2> "$OUT/nccl-stat.err" &
A=$!
TMUX_SOCK=
if command -v tmux >/dev/null; then
  TMUX_SOCK=vgpu-two-gpu-$$
  tmux -L "$TMUX_SOCK" -f /dev/null new-session -d -s top -x 200 -y 50 \
    "TERM=xterm-256color '$BIN/vgpu-agent' top --no-daemon --interval 1s 2>'$OUT/top.stderr'"
fi
for _ in $(seq 600); do grep -q "libnccl.so.2 \[" "$OUT/nccl-stat.err" && break; sleep 0.1; done
for _ in $(seq 100); do grep -q "tracing for" "$OUT/nccl-stat.err" && break; sleep 0.1; done
# top's own probes must be on the library before the communicators are made.
if [ -n "$TMUX_SOCK" ]; then
  for _ in $(seq 300); do grep -q "libnccl.so.2" "$OUT/top.stderr" 2>/dev/null && break; sleep 0.1; done
fi
sleep 2
touch "$N/go"
for _ in $(seq 3000); do [ "$(ls "$N"/done-* 2>/dev/null | wc -l)" -ge "$RANKS" ] && break; sleep 0.1; done
sleep 2
kill -INT $A; wait $A
if [ -n "$TMUX_SOCK" ]; then
  # The container's detail: filter on its id, open it (a filter expands containers already).
  tmux -L "$TMUX_SOCK" send-keys -t top / "${CTR_ID:0:12}" Enter; sleep 2
  tmux -L "$TMUX_SOCK" send-keys -t top g Enter; sleep 2
  tmux -L "$TMUX_SOCK" capture-pane -p -t top > "$OUT/top-nccl.txt"
  tmux -L "$TMUX_SOCK" send-keys -t top q
fi
touch "$N/stop"; wait $W
cp "$N"/rank-*.json "$OUT/" 2>/dev/null
python3 "$HERE/compare_nccl_ranks.py" "$N" "$OUT/nccl-stat.json" "$OUT/nccl-workload.log" | tee "$OUT/nccl-compare.txt"
RC=${PIPESTATUS[0]}
if [ -n "$TMUX_SOCK" ]; then
  cat "$OUT/top-nccl.txt"
  if grep -q "commId 0x[0-9a-f]*: $RANKS ranks\? of $RANKS here" "$OUT/top-nccl.txt"; then
    echo "PASS: top shows the communicator with its $RANKS rank(s) in the container's detail" | tee -a "$OUT/nccl-compare.txt"
  else
    echo "FAIL: top's detail view (top-nccl.txt) has no 'commId ...: $RANKS rank(s) of $RANKS here' line" | tee -a "$OUT/nccl-compare.txt"
    RC=1
  fi
else
  echo "note: tmux missing: top not checked" | tee -a "$OUT/nccl-compare.txt"
fi
verdict "2 NCCL ranks (stat, top)" "$RC"
fi

# --- 3. per-device limits ----------------------------------------------------------------------
if part 3; then
python3 "$HERE/validate_device_limits.py" "$BIN/libvgpu_limiter.so" "$BIN/vgpu-agent" "$OUT" "$DEVICES" "$LIMITS_MIB" \
  2>&1 | tee "$OUT/device-limits.txt"
verdict "3 per-device limits ($DEVICES: $LIMITS_MIB MiB)" "${PIPESTATUS[0]}"
fi

echo; cat "$OUT/summary.txt"
exit $FAILED

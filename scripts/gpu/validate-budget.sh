#!/usr/bin/env bash
# Whether the probe budget holds in reality: the share of a process's time that its probe hits
# took, measured inside the process, against `vgpu-agent run`'s budget.
# scripts/gpu/attribute_micro.cu makes N launches of an empty kernel straight through libcuda's
# cuLaunchKernel (the eager loop's launches with nothing else between them), natively, under
# `vgpu-agent run --probe-launches on` at its default budget (0.5% of each process's time, 100 ms
# windows): launches are the kind with the highest rate a process has, and nothing but the budget
# keeps their probes' cost down. Each launch is known to have met the probe or not (the int3 at
# libcuda's entry point). scripts/gpu/probe_budget_share.py takes each window of probed launches,
# widened by 5 ms each side so that attaching and detaching are inside it, and charges its loop
# iterations' time over the untouched iterations' around it: the share of the loop's wall time the
# probes took. The agent's own figure (`probe_seconds`, from its snapshot) is printed beside.
# ROUNDS rounds (default 3). Verdict: PASS when every round's share is within TOLERANCE (default
# 0.1, 10%) over the budget and had a window to measure.
# Run from the repo root on the GPU machine after `cargo xtask bundle` (.carry/bin/vgpu-agent);
# builds only the micro-benchmark (nvcc). Results under $OUT (default /tmp/out-budget): env.txt,
# summary.txt, results.jsonl, raw/ (the daemon's logs and snapshots, the micro-benchmark's lines).
# About 80 s a round at the defaults.
set -u
OUT=${OUT:-/tmp/out-budget}
ROUNDS=${ROUNDS:-3}
N=${N:-20000000}
BUDGET=${BUDGET:-0.005}
TOLERANCE=${TOLERANCE:-0.1}
PIN=${PIN:-taskset -c 2}
BIN=$PWD/.carry/bin
HERE=$PWD/scripts/gpu
RAW=$OUT/raw
T=$(mktemp -d)
DAEMON=
cleanup() {
  [ -n "$DAEMON" ] && kill -INT "$DAEMON" 2>/dev/null && wait "$DAEMON" 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
mkdir -p "$RAW"
[ -e "$BIN/vgpu-agent" ] || { echo "validate-budget.sh: $BIN/vgpu-agent is missing: run cargo xtask bundle and carry .carry/" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "validate-budget.sh: run as root (the agent loads eBPF probes)" >&2; exit 1; }
{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  uname -r
  echo "N=$N ROUNDS=$ROUNDS BUDGET=$BUDGET TOLERANCE=$TOLERANCE PIN=$PIN"
  git log -1 --format="commit %h %s" 2>/dev/null
} | tee "$OUT/env.txt"
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
nvcc -O2 -o "$T/attribute_micro" "$HERE/attribute_micro.cu" -L"$CUDA_HOME/lib64/stubs" -lcuda -ldl \
  || { echo "nvcc failed"; exit 1; }
snapshot() { # socket file
  python3 "$HERE/daemon_snapshot.py" "$1" "$2"
}
: > "$OUT/results.jsonl"
for r in $(seq "$ROUNDS"); do
  rm -f "$T/agent.sock"
  mkdir -p "$T/regions"
  # The daemon away from the loop's core (its own threads are not what is measured here).
  taskset -c 0,1 "$BIN/vgpu-agent" run --socket "$T/agent.sock" --region-dir "$T/regions" \
    --metrics-listen off --no-nvml --probe-launches on --probe-budget "$(python3 -c "print($BUDGET * 100)")%" \
    > "$RAW/daemon-$r.log" 2>&1 &
  DAEMON=$!
  for _ in $(seq 600); do [ -S "$T/agent.sock" ] && break; sleep 0.1; done
  sleep 3 # its probes attach to the host's libcuda first
  # Lingers 4 s after its loop, in which the daemon's snapshot (every second) still has it.
  TRACE="$T/trace" $PIN "$T/attribute_micro" "$N" 0 4000 > "$RAW/micro-$r.txt" 2>&1 &
  w=$!
  # The schedule as it runs (duty, rate, overrun), 40 s into the loop.
  (sleep 40; snapshot "$T/agent.sock" "$RAW/snapshot-mid-$r.json") &
  mid=$!
  for _ in $(seq 3000); do grep -q MICRO "$RAW/micro-$r.txt" && break; kill -0 "$w" 2>/dev/null || break; sleep 0.1; done
  sleep 2
  snapshot "$T/agent.sock" "$RAW/snapshot-$r.json" || echo "round $r: no snapshot"
  wait "$w"
  kill "$mid" 2>/dev/null # a loop shorter than 40 s: never this round's snapshot from the next's daemon
  kill -INT "$DAEMON"; wait "$DAEMON" 2>/dev/null; DAEMON=
  echo "round $r: $(cat "$RAW/micro-$r.txt")"
  python3 "$HERE/probe_budget_share.py" "$T/trace" "$w" "$RAW/snapshot-$r.json" "$BUDGET" \
    | tee "$RAW/share-$r.txt" | grep RESULT >> "$OUT/results.jsonl"
  grep -v RESULT "$RAW/share-$r.txt"
  rm -f "$T/trace"
done
python3 "$HERE/probe_budget_share.py" verdict "$OUT/results.jsonl" "$BUDGET" "$TOLERANCE" | tee "$OUT/summary.txt"
exit "${PIPESTATUS[0]}"

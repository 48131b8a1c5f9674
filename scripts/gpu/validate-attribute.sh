#!/usr/bin/env bash
# Attribution on the real driver against the truth measured inside the attributed process.
# scripts/gpu/attribute_micro.cu makes N launches straight through cuLaunchKernel,
# timing each, and knows which were probed (a uprobe shows as an int3 at libcuda's entry point), so
# the truths are in the same process at the same moments: the launches made, the probes' cost per
# probed launch (probed mean - unprobed mean, each trimmed of 1% at both ends), and the launches'
# time in the driver (the unprobed ones as measured, the probed ones at the unprobed mean); each
# window's probed launches are compared with the unprobed launches within 200 ms of it.
# ROUNDS rounds (default 3), each with three runs in an order that rotates by round:
#   sampled:  `vgpu-agent attribute` with its defaults (1% budget, 50 ms windows); a
#             cuStreamSynchronize every SYNC_EVERY (256) launches, the reference of the gaps;
#   pace:     the same without synchronisations (the gaps estimated by pace);
#   limiter:  the limiter preloaded (its region read by the agent), launches sampled meanwhile,
#             every other launch straight to libcuda's own cuLaunchKernel (past the limiter): the
#             launch figures must be the limiter's (exact count of the hooked launches, their
#             driver time within 2% of the direct launches' mean times their count; the hook's
#             own time, which the limiter does not record for launches, is printed beside).
# For each run: attributed against truth, % error, and the uncertainty the report gave the figure.
# Run from the repo root on the GPU machine after `cargo xtask bundle` (.carry/bin/vgpu-agent and
# .carry/bin/libvgpu_limiter.so); builds only the micro-benchmark (nvcc). Everything goes to $OUT
# (default /tmp/out-attribute): env.txt, summary.txt, summary.json, raw/ (each run's report,
# agent log and micro-benchmark line). About 2 minutes on an H100.
# HIT_TRACE=1 also traces every launch of the sampled and pace runs and the user-mode instructions
# their thread retires, and checks what a hit costs the process against estimates from outside it
# (scripts/gpu/probe_hit_trace.py; hit-trace.txt, hit-trace.json; the traces are deleted after).
set -u
OUT=${OUT:-/tmp/out-attribute}
ROUNDS=${ROUNDS:-3}
N=${N:-1000000}
SYNC_EVERY=${SYNC_EVERY:-256}
HIT_TRACE=${HIT_TRACE:-0}
PIN=${PIN:-taskset -c 2}
BIN=$PWD/.carry/bin
RAW=$OUT/raw
T=$(mktemp -d)
mkdir -p "$RAW"
for f in "$BIN/vgpu-agent" "$BIN/libvgpu_limiter.so"; do
  [ -e "$f" ] || { echo "missing $f: run cargo xtask bundle first" >&2; exit 1; }
done
{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  uname -r
  echo "N=$N SYNC_EVERY=$SYNC_EVERY ROUNDS=$ROUNDS PIN=$PIN"
  git log -1 --format="commit %h %s" 2>/dev/null
} | tee "$OUT/env.txt"
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
nvcc -O2 -o "$T/attribute_micro" scripts/gpu/attribute_micro.cu -L"$CUDA_HOME/lib64/stubs" -lcuda -ldl \
  || { echo "nvcc failed"; exit 1; }

# run TAG CONFIG: the micro-benchmark under `vgpu-agent attribute`, started once the agent records.
run() {
  local tag=$1 config=$2 sync=$SYNC_EVERY direct=0
  local agent_args=() env_args=()
  case $config in
    pace) sync=0 ;;
    limiter)
      direct=1
      mkdir -p "$T/regions-$tag"
      agent_args=(--region-dir "$T/regions-$tag")
      env_args=(LD_PRELOAD="$BIN/libvgpu_limiter.so" CUDA_DEVICE_MEMORY_LIMIT=64g
                CUDA_DEVICE_MEMORY_SHARED_CACHE="$T/regions-$tag/ctr.cache" LIBCUDA_LOG_LEVEL=2) ;;
  esac
  local log=info
  [ "$HIT_TRACE" = 1 ] && log=info,vgpu_agent::probes::calibrate=debug  # the prices' timeline
  VGPU_LOG=$log "$BIN/vgpu-agent" attribute --no-daemon --no-nvml --json --duration 120s --poll-interval 100ms \
    --out "$RAW/$tag-report" "${agent_args[@]}" > "$RAW/$tag.json" 2> "$RAW/$tag.err" &
  local agent=$!
  for _ in $(seq 300); do grep -q "recording for" "$RAW/$tag.err" && break; sleep 0.1; done
  [ "$HIT_TRACE" = 1 ] && [ "$config" != limiter ] && env_args+=(TRACE="$RAW/$tag.trace")
  env "${env_args[@]}" $PIN "$T/attribute_micro" "$N" "$sync" 1000 "$direct" > "$RAW/$tag.micro" 2>&1 &
  local w=$!
  echo "$w" > "$RAW/$tag.pid"
  [ "$HIT_TRACE" = 1 ] && python3 scripts/gpu/probe_hit_trace.py sample "$w" "$RAW/$tag.pmu.npy" 2> "$RAW/$tag.pmu.err" &
  wait "$w"
  sleep 0.5
  kill -INT "$agent"; wait "$agent"
  echo "$tag: $(cat "$RAW/$tag.micro")"
}

CONFIGS=(sampled pace limiter)
for r in $(seq "$ROUNDS"); do
  for i in 0 1 2; do
    c=${CONFIGS[$(( (i + r - 1) % 3 ))]}
    run "$c-$r" "$c"
  done
done

python3 - "$RAW" "$ROUNDS" "$OUT" <<'PY' | tee "$OUT/summary.txt"
import json, re, statistics, sys
raw, rounds, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def micro(tag):
    text = open(f"{raw}/{tag}.micro").read()
    m = re.search(r"MICRO (.*)", text)
    if not m:
        raise SystemExit(f"{tag}: no MICRO line: {text!r}")
    return {k: float(v) for k, v in (kv.split("=") for kv in m.group(1).split())}
def process(tag):
    r = json.load(open(f"{raw}/{tag}.json"))
    pid = int(open(f"{raw}/{tag}.pid").read())
    p = next((p for p in r["processes"] if p["pid"] == pid), None)
    if p is None:
        raise SystemExit(f"{tag}: pid {pid} not in the report")
    return r, p
def rel(u):
    if not u or u.get("relative") is None:
        return None
    return u["relative"]
def pct(x):
    return "unknown" if x is None else f"{x * 100:.1f}%"
checks, rows = [], []
def check(rnd, config, what, got, truth, unc, tolerance):
    err = abs(got - truth) / truth if truth else float("inf")
    ok = err <= tolerance
    checks.append(dict(round=rnd, config=config, figure=what, attributed=got, truth=truth,
                       error=err, reported_uncertainty=unc, tolerance=tolerance, ok=ok))
    print(f"  {what:<34} attributed {got:>14.6g}  truth {truth:>14.6g}  {err * 100:5.1f}% off"
          f"  reported ±{pct(unc)}  (within {tolerance * 100:.0f}%: {'PASS' if ok else 'FAIL'})")
for rnd in range(1, rounds + 1):
    for config in ("sampled", "pace", "limiter"):
        tag = f"{config}-{rnd}"
        m = micro(tag)
        r, p = process(tag)
        launch = [a for a in p["apis"] if a["kind"] == "launch"]
        calls = sum(a["calls"] for a in launch)
        seconds = sum(a["seconds"] for a in launch)
        by = sorted({a["measured_by"] for a in launch})
        kinds = {k["kind"]: k for k in r["sampling"].get("sampled_kinds", [])}
        lk = kinds.get("launch", {})
        print(f"round {rnd} {config}: measured by {by}; launches probed {int(m['probed'])} of {int(m['launches'])} "
              f"(agent saw {sum(a.get('probed_calls', 0) for a in launch)} and {p.get('unpaired_probe_hits', 0)} unpaired returns), launch duty {lk.get('duty', 0):.3f}, "
              f"gaps by reference {lk.get('gaps_by_reference', 0):.2f}; hit price {r['sampling'].get('probe_cost_per_class_ns')} ns, "
              f"in band {r['sampling']['probe_inband_ns']:.0f} ns; probe cost share {r['sampling']['probe_cost_share'] * 100:.2f}%")
        a0 = launch[0] if len(launch) == 1 else {}
        if config == "limiter":
            hooked = m["hooked"]
            print(f"    (hooked launch mean {m['launch_total_ns'] / max(hooked, 1):.0f} ns, direct launch mean "
                  f"{m['direct_mean_ns']:.0f} ns: the hook's own time "
                  f"{m['launch_total_ns'] / max(hooked, 1) - m['direct_mean_ns']:.0f} ns per launch; "
                  f"limiter's driver time per launch {seconds / max(calls, 1) * 1e9:.0f} ns)")
            check(rnd, config, "launch count (limiter)", calls, hooked, 0.0, 0.0)
            check(rnd, config, "launch driver time, s (limiter)", seconds, m["driver_truth_ns"] / 1e9,
                  rel(a0.get("seconds_uncertainty")), 0.02)
            continue
        check(rnd, config, "sampled launch count", calls, m["launches"], rel(a0.get("calls_uncertainty")), 0.10)
        # The truths at the windows' own moments (each window's probed launches against the
        # unprobed ones within 200 ms of it: the launch's time drifts over a run); the run's
        # means beside them.
        driver_truth = m.get("local_driver_truth_ns", m["driver_truth_ns"])
        check(rnd, config, "launch driver time, s", seconds, driver_truth / 1e9,
              rel(a0.get("seconds_uncertainty")), 0.10)
        # Its hits: the probed calls, and the returns without their entry at the windows' edges
        # (charged, no call counted), as the micro-benchmark counts every launch that met the
        # breakpoint.
        probed = sum(a.get("probed_calls", a["calls"] if a["measured_by"] == "probes" else 0) for a in p["apis"])
        probed += p.get("unpaired_probe_hits", 0)
        per_probed = p["components"]["probe_cost"] * 1e9 / max(probed, 1)
        # What the probes cost is a sum (the time they add over the run), so its truth per probed
        # launch is the difference of the means (trimmed of the 1% preemptions at each end), each
        # window's against its own moments; the run's means and medians are shown beside (a
        # launch that waits for the GPU's queue skews the medians).
        truth = m.get("local_cost_ns", m["probed_mean_ns"] - m["unprobed_mean_ns"])
        print(f"    (probe cost per probed launch by the run's means: {m['probed_mean_ns'] - m['unprobed_mean_ns']:.0f} ns, "
              f"by its medians: {m['probed_med_ns'] - m['unprobed_med_ns']:.0f} ns; driver time by the run's means "
              f"{m['driver_truth_ns'] / 1e9:.4f} s; driver time per launch attributed {seconds / max(calls, 1) * 1e9:.0f} ns, "
              f"unprobed launch mean {m['unprobed_mean_ns']:.0f} ns)")
        check(rnd, config, "probe cost per probed launch, ns", per_probed, truth,
              rel(p.get("uncertainty", {}).get("probe_cost")), 0.10)
bad = [c for c in checks if not c["ok"]]
print(f"\n{len(checks) - len(bad)} of {len(checks)} checks within tolerance")
for what in sorted({c["figure"] for c in checks}):
    errs = [c["error"] * 100 for c in checks if c["figure"] == what]
    print(f"  {what:<34} error median {statistics.median(errs):.1f}%, worst {max(errs):.1f}%")
json.dump(checks, open(f"{out}/summary.json", "w"), indent=1)
print(f"verdict: {'PASS' if not bad else 'FAIL'}")
sys.exit(1 if bad else 0)
PY
status=${PIPESTATUS[0]}
if [ "$HIT_TRACE" = 1 ]; then
  python3 scripts/gpu/probe_hit_trace.py analyse "$RAW" | tee "$OUT/hit-trace.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  mv "$RAW/../hit-trace.json" "$OUT/hit-trace.json" 2>/dev/null
  rm -f "$RAW"/*.trace
fi
rm -rf "$T"
exit $status

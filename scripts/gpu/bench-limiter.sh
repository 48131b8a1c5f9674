#!/usr/bin/env bash
# What the limiter costs an application on the real driver, end to end: native runs and runs
# under LD_PRELOAD of the limiter (this build, and optionally a previous build beside it),
# interleaved on one host, the order rotated every round; medians and spread (min..max over
# rounds). The method of notes/gpu-machine.md. Measures, per round and configuration:
#   1. launch_micro.cu (nvcc): median CPU ns per launch (200k) and per 1 MiB cudaMalloc+cudaFree
#      pair (20k), one process;
#   2. `cuda-exercise pairs`: 1 MiB cuMemAlloc_v2+cuMemFree_v2 pairs, 8 processes after a
#      barrier, the slowest process's median pair;
#   3. start-up of 8, 32 and 64 processes (cuInit + primary context + one allocation): the time
#      from spawning them to the last one's exit.
# The criterion is end to end: against native, the limiter makes no difference beyond the
# run-to-run spread. What the limiter itself spends (its hook self-time per pair from the region,
# its start-up time from its log, the cost of preloading it into /bin/true) is reported beside
# that, as a figure, not a goal.
#
# Run on the GPU machine from the repository root after `cargo xtask bundle` (.carry/bin:
# libvgpu_limiter.so, cuda-exercise); `cargo xtask bundle --prev COMMIT` also builds that
# commit's limiter into .carry/prev/ for the comparison:
#   LIM_PREV=.carry/prev/libvgpu_limiter.so bash scripts/gpu/bench-limiter.sh
# Options (environment): RUNS (rounds, default 3), RUNS64 (rounds with the 64-process start-up,
# default 3), PAIRS (per process in 2., default 3000), DEADLINE_S (default 480: later 64-process
# start-ups are skipped, and said so, rather than pass it; the whole run takes about 6.5 minutes
# with three configurations on an H100), LIM_NEW (default .carry/bin/libvgpu_limiter.so),
# EXERCISE_ARGS="--lib .../libsimcuda.so" (a dry run on the simulated driver: no launch_micro).
# Limited runs: CUDA_DEVICE_MEMORY_LIMIT=64g, a fresh region per run, the default context charge.
# Results: $OUT/bench-limiter.json (default OUT=/tmp/out-bench-limiter), $OUT/raw/, a table on
# stdout.
set -u
OUT=${OUT:-/tmp/out-bench-limiter}
RUNS=${RUNS:-3}
RUNS64=${RUNS64:-3}
PAIRS=${PAIRS:-3000}
DEADLINE_S=${DEADLINE_S:-480}
LIM_NEW=${LIM_NEW:-$PWD/.carry/bin/libvgpu_limiter.so}
LIM_PREV=${LIM_PREV:-}
LIMITERS="new=$LIM_NEW${LIM_PREV:+ prev=$LIM_PREV}"
SETTINGS="runs=$RUNS runs64=$RUNS64 pairs=$PAIRS deadline_s=$DEADLINE_S"
# shellcheck source=ab-common.sh
source "$(dirname "$0")/ab-common.sh"
configs=(native "${builds[@]}")
STARTED=$(date +%s)
elapsed() { echo $(($(date +%s) - STARTED)); }

MICRO=""
if [ ${#XARGS[@]} -eq 0 ] && command -v nvcc > /dev/null; then
  nvcc -O2 -o "$T/launch_micro" scripts/gpu/launch_micro.cu && MICRO="$T/launch_micro"
fi
[ -n "$MICRO" ] || echo "launch_micro: skipped (a dry run, or no nvcc)"

under() { # under CONFIG TAG CMD...: runs CMD natively or under that build, with a fresh region
  local cfg=$1 tag=$2
  shift 2
  if [ "$cfg" = native ]; then
    "$@"
  else
    LD_PRELOAD=${lib[$cfg]} CUDA_DEVICE_MEMORY_LIMIT=64g CUDA_DEVICE_MEMORY_SHARED_CACHE="$TS/$tag.region" \
      LIBCUDA_LOG_LEVEL=3 "$@"
  fi
}

record() { # record KEY CONFIG ROUND VALUE (a failed measurement is left out)
  [ -n "$4" ] || { echo "  $2 $1: no value (failed)"; return; }
  printf '{"key": "%s", "config": "%s", "round": %s, "value": %s}\n' "$1" "$2" "$3" "$4" >> "$T/results.jsonl"
}

pairs8() { # pairs8 CONFIG TAG: 8 processes, barrier, the slowest median pair (ns)
  local cfg=$1 tag=$2 pids=() i
  rm -f "$T/$tag.go"
  for i in $(seq 8); do
    under "$cfg" "$tag" "$BIN/cuda-exercise" "${XARGS[@]}" pairs --count "$PAIRS" --barrier "$T/$tag.go" \
      > "$T/$tag.$i.json" 2> "$T/$tag.$i.err" &
    pids+=($!)
  done
  sleep 5
  touch "$T/$tag.go"
  for i in "${pids[@]}"; do wait "$i"; done
  cat "$T/$tag".*.json > "$OUT/raw/$tag.jsonl"
  python3 -c 'import sys,json; print(max(json.loads(l)["pair_median_ns"] for l in open(sys.argv[1]) if l.strip()))' \
    "$OUT/raw/$tag.jsonl"
}

startup() { # startup CONFIG TAG N: N processes together; seconds from spawning to the last exit
  local cfg=$1 tag=$2 n=$3 pids=() i t0
  t0=$(date +%s.%N)
  for i in $(seq "$n"); do
    ( under "$cfg" "$tag" "$BIN/cuda-exercise" "${XARGS[@]}" pairs --count 1 > "$T/$tag.$i.json" 2> "$T/$tag.$i.err"
      date +%s.%N > "$T/$tag.$i.end" ) &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i"; done
  cat "$T/$tag".*.end | python3 -c "import sys; print(max(float(l) for l in sys.stdin) - $t0)"
  for i in $(seq "$n"); do # one line per process: its JSON and the limiter's start-up log lines
    python3 - "$T/$tag.$i.json" "$T/$tag.$i.err" "$T/$tag.$i.end" <<'PY'
import json, re, sys
j = json.loads(open(sys.argv[1]).read() or "{}")
err = open(sys.argv[2]).read()
j["end_s"] = float(open(sys.argv[3]).read())  # when it exited: the last one is the slowest
init = re.search(r"initialised in (\d+) us(?: \(cpu (\d+) us\))?", err)
claim = re.search(r"claimed slot \d+ of \S+ in (\d+) us(?: \(cpu (\d+) us\))?", err)
j["limiter_init_us"] = int(init.group(1)) if init else None
j["limiter_claim_us"] = int(claim.group(1)) if claim else None
j["limiter_init_cpu_us"] = int(init.group(2)) if init and init.group(2) else None
j["limiter_claim_cpu_us"] = int(claim.group(2)) if claim and claim.group(2) else None
print(json.dumps(j))
PY
  done > "$OUT/raw/$tag.jsonl"
}

: > "$T/results.jsonl"
for run in $(seq "$RUNS"); do
  order=()
  for k in $(seq 0 $((${#configs[@]} - 1))); do
    order+=("${configs[$(((k + run - 1) % ${#configs[@]}))]}")
  done
  echo "round $run (order: ${order[*]}, $(elapsed) s in)"
  if [ -n "$MICRO" ]; then
    for cfg in "${order[@]}"; do
      m=$(under "$cfg" "micro-$cfg-$run" "$MICRO" 200000 20000 | grep MICRO)
      echo "  $cfg launch_micro: $m"
      record launch_ns "$cfg" "$run" "$(sed -E 's/.*launch_med_ns=([0-9]+).*/\1/' <<< "$m")"
      record pair1_ns "$cfg" "$run" "$(sed -E 's/.*allocfree_med_ns=([0-9]+).*/\1/' <<< "$m")"
    done
  fi
  for cfg in "${order[@]}"; do
    p=$(pairs8 "$cfg" "pairs-$cfg-$run")
    echo "  $cfg pairs x8: $p ns"
    record pairs8_ns "$cfg" "$run" "$p"
  done
  for n in 8 32 64; do
    if [ "$n" = 64 ]; then
      [ "$run" -gt "$RUNS64" ] && continue
      if [ $(($(elapsed) + 25 * ${#configs[@]})) -gt "$DEADLINE_S" ]; then
        echo "  start-up x64 skipped: $(elapsed) s in, the deadline is $DEADLINE_S s"
        continue
      fi
    fi
    for cfg in "${order[@]}"; do
      s=$(startup "$cfg" "startup-$cfg-$n-$run" "$n")
      echo "  $cfg start-up x$n: $s s"
      record "startup${n}_s" "$cfg" "$run" "$s"
    done
  done
done

# The cost of preloading each build into a process that never calls CUDA, interleaved with
# native: median ns of 300 x /bin/true each.
python3 - "$T/preload.json" "${configs[@]:1}" <<PY
import json, os, statistics, subprocess, sys, time
libs = {$(for b in "${builds[@]}"; do printf '"%s": "%s", ' "$b" "${lib[$b]}"; done)}
envs = {"native": dict(os.environ)}
for name in sys.argv[2:]:
    envs[name] = dict(os.environ, LD_PRELOAD=libs[name], CUDA_DEVICE_MEMORY_LIMIT="64g")
times = {name: [] for name in envs}
for _ in range(300):
    for name, env in envs.items():
        t = time.perf_counter_ns(); subprocess.run(["/bin/true"], env=env, check=True)
        times[name].append(time.perf_counter_ns() - t)
json.dump({name: statistics.median(v) for name, v in times.items()}, open(sys.argv[1], "w"))
PY

python3 - "$T/results.jsonl" "$T/preload.json" "$OUT/raw" "$OUT/bench-limiter.json" "$(elapsed)" "${configs[@]}" <<'PY'
import glob, json, os, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
preload = json.load(open(sys.argv[2]))
raw, out, wall, configs = sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6:]
builds = configs[1:]
MEASURES = [("launch_ns", "launch, CPU ns (launch_micro)", 0), ("pair1_ns", "1 MiB pair, 1 process, ns", 0),
            ("pairs8_ns", "1 MiB pair, 8 processes, ns", 0), ("startup8_s", "start-up x8, s", 3),
            ("startup32_s", "start-up x32, s", 3), ("startup64_s", "start-up x64, s", 3)]
series = {(r["key"], r["config"]): [] for r in rows}
for r in rows:
    series[(r["key"], r["config"])].append(float(r["value"]))

def verdict(a, b):
    """Whether medians differ by more than the run-to-run spread: the ranges (min..max) overlap."""
    if max(min(a), min(b)) <= min(max(a), max(b)):
        return "within the spread"
    d = statistics.median(b) - statistics.median(a)
    return f"{d:+.3g} beyond the spread"

summary = {}
print(f"\nEnd to end, {len(configs)} configurations interleaved, rotated each round; medians (min..max)")
print(f"{'measure':<30}" + "".join(f"{c:>28}" for c in configs) + "   against native")
for key, label, digits in MEASURES:
    have = {c: series.get((key, c)) for c in configs}
    if not all(have.values()):
        continue
    cell = lambda v: f"{statistics.median(v):.{digits}f} ({min(v):.{digits}f}..{max(v):.{digits}f})"
    against = "; ".join(f"{b}: {verdict(have['native'], have[b])}" for b in builds)
    if "prev" in builds:
        against += f"; new vs prev: {verdict(have['prev'], have['new'])}"
    print(f"{label:<30}" + "".join(f"{cell(have[c]):>28}" for c in configs) + "   " + against)
    summary[key] = {c: {"runs": have[c], "median": statistics.median(have[c])} for c in configs}
    summary[key]["verdict"] = {b: verdict(have["native"], have[b]) for b in builds}
    if "prev" in builds:
        summary[key]["verdict"]["new_vs_prev"] = verdict(have["prev"], have["new"])
print("Criterion: against native, no difference beyond the run-to-run spread (the 8-process pair included).")

def jsonl(pattern):
    out = []
    for f in sorted(glob.glob(os.path.join(raw, pattern))):
        out += [json.loads(l) for l in open(f) if l.strip()]
    return out

self_time = {}
print("\nThe limiter's own time (reported, not a goal):")
for b in builds:
    per_pair = []
    for row in jsonl(f"pairs-{b}-*.jsonl"):
        apis = (row.get("limiter") or {}).get("apis", {})
        a, f = apis.get("cuMemAlloc_v2"), apis.get("cuMemFree_v2")
        if a and f and a["calls"] and f["calls"]:
            per_pair.append(a["hook_ns"] / a["calls"] + f["hook_ns"] / f["calls"])
    mine = {}
    if per_pair:
        mine["pairs8_hook_ns_per_pair"] = {"median": statistics.median(per_pair), "max": max(per_pair),
                                           "processes": len(per_pair)}
        print(f"  {b}: hook self-time per 1 MiB pair with 8 processes at once: median "
              f"{statistics.median(per_pair):.0f} ns, worst process {max(per_pair):.0f} ns ({len(per_pair)} processes)")
    for n in (8, 32, 64):
        last, largest = [], []
        for f in sorted(glob.glob(os.path.join(raw, f"startup-{b}-{n}-*.jsonl"))):
            per = [((r.get("limiter_init_us") or 0) + (r.get("limiter_claim_us") or 0)
                    + ((r.get("limiter") or {}).get("hook_ns_total", 0)) / 1000, r.get("end_s", 0))
                   for r in (json.loads(l) for l in open(f) if l.strip())]
            if per:
                largest.append(max(p[0] for p in per))
                last.append(max(per, key=lambda p: p[1])[0])
        if last:
            mine[f"startup{n}_us_last_finished"] = last
            mine[f"startup{n}_us_largest"] = largest
            print(f"  {b}: start-up x{n}, its time (init + slot claim + hooks) in the process that finished last: "
                  f"median {statistics.median(last):.0f} us {['%.0f' % x for x in last]}; the largest in any "
                  f"process: median {statistics.median(largest):.0f} us")
    mine["preload_ns"] = {"native": preload["native"], "preloaded": preload[b]}
    print(f"  {b}: preloaded into /bin/true: {preload['native'] / 1e6:.3f} -> {preload[b] / 1e6:.3f} ms "
          f"({(preload[b] - preload['native']) / 1e6:+.3f} ms)")
    self_time[b] = mine
print(f"\n{wall} s for the measurements")
json.dump({"configs": configs, "summary": summary, "limiter_self_time": self_time, "runs": rows,
           "wall_s": wall}, open(out, "w"), indent=1)
beyond = [f"{key} {b}" for key, s in summary.items() for b in builds
          if s["verdict"][b] != "within the spread"]
print("FAIL: beyond native's spread: " + ", ".join(beyond) if beyond else "PASS: every measure within native's spread")
sys.exit(1 if beyond or not summary else 0)
PY

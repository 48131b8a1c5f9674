#!/usr/bin/env bash
# The limiter's cost on the real driver (issue 4, point 8), the method of notes/gpu-machine.md:
# native and LD_PRELOAD=libvgpu_limiter.so runs interleaved (A B A B ...), RUNS of each (default 3),
# medians and spread. Run on the GPU machine from the repo root after `cargo xtask bundle`
# (.carry/bin: libvgpu_limiter.so, cuda-exercise); needs nvcc for launch_micro.cu.
#   1. launch_micro: median CPU ns per launch (200k) and per 1 MiB cudaMalloc+cudaFree pair (20k)
#   2. cuda-exercise pairs: 1 MiB cuMemAlloc_v2+cuMemFree_v2 pairs, 8 processes after a barrier
#   3. start-up of 8, 32 and 64 processes (cuInit + primary context + one allocation), slowest
#   4. what the limiter itself adds, measured in-process below the run-to-run noise: its hook
#      self-time per pair with 8 processes (the region's hook_ns), its start-up self-time per
#      process (initialisation + slot claim from its log, + hook self-time during start-up), and
#      the cost of preloading it into a process (LD_PRELOAD=... /bin/true vs /bin/true, 300 each)
# Limited runs: CUDA_DEVICE_MEMORY_LIMIT=64g, a fresh region per run, default context charge.
# Results: $OUT/bench-limiter.json (default OUT=/tmp/out-bench-limiter) and a table on stdout.
set -u
OUT=${OUT:-/tmp/out-bench-limiter}
RUNS=${RUNS:-5}
RUNS64=${RUNS64:-3}
PAIRS=${PAIRS:-5000}
mkdir -p "$OUT/raw"
BIN=$PWD/.carry/bin
LIM=$BIN/libvgpu_limiter.so
T=$(mktemp -d)
# Regions live on tmpfs, as they should in production (docs/region.md: first writes to a
# disk-backed shared mapping cost milliseconds).
TS=$(mktemp -d -p /dev/shm)
# Scratch files and regions go when the script ends (a dry run must not leave them in /dev/shm).
trap 'rm -rf "$T" "$TS"' EXIT
{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  uname -r
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
nvcc -O2 -o "$T/launch_micro" scripts/gpu/launch_micro.cu || { echo "nvcc failed"; exit 1; }

limited() { # limited TAG CMD...: runs CMD under the limiter with a fresh region
  local tag=$1; shift
  LD_PRELOAD=$LIM CUDA_DEVICE_MEMORY_LIMIT=64g CUDA_DEVICE_MEMORY_SHARED_CACHE="$TS/$tag.region" LIBCUDA_LOG_LEVEL=3 "$@"
}
native() { shift; "$@"; }

pairs8() { # pairs8 MODE TAG: 8 processes, barrier, the slowest median pair (ns)
  local mode=$1 tag=$2 pids=() i
  rm -f "$T/$tag.go"
  for i in $(seq 8); do
    $mode "$tag" "$BIN/cuda-exercise" pairs --count "$PAIRS" --barrier "$T/$tag.go" > "$T/$tag.$i.json" 2> "$T/$tag.$i.err" &
    pids+=($!)
  done
  sleep 5; touch "$T/$tag.go"
  for i in "${pids[@]}"; do wait "$i"; done
  cat "$T/$tag".*.json | python3 -c 'import sys,json; print(max(json.loads(l)["pair_median_ns"] for l in sys.stdin if l.strip()))'
  cat "$T/$tag".*.json > "$OUT/raw/$tag.jsonl"
}

startup() { # startup MODE TAG N: N processes together, the slowest spawn-to-exit seconds
  local mode=$1 tag=$2 n=$3 pids=() i t0
  t0=$(date +%s.%N)
  for i in $(seq "$n"); do
    ( $mode "$tag" "$BIN/cuda-exercise" pairs --count 1 > "$T/$tag.$i.json" 2> "$T/$tag.$i.err"; date +%s.%N > "$T/$tag.$i.end" ) &
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
# CPU time of the same two steps (builds from 2026-11-22 on log it): the rest is waiting.
j["limiter_init_cpu_us"] = int(init.group(2)) if init and init.group(2) else None
j["limiter_claim_cpu_us"] = int(claim.group(2)) if claim and claim.group(2) else None
print(json.dumps(j))
PY
  done > "$OUT/raw/$tag.jsonl"
}

preload_cost() { # median ns of 300 x /bin/true with and without the limiter preloaded, interleaved
  python3 - "$LIM" <<'PY'
import os, statistics, subprocess, sys, time
lim = sys.argv[1]
env_n = dict(os.environ); env_l = dict(os.environ, LD_PRELOAD=lim, CUDA_DEVICE_MEMORY_LIMIT="64g")
n, l = [], []
for _ in range(300):
    for env, out in ((env_n, n), (env_l, l)):
        t = time.perf_counter_ns(); subprocess.run(["/bin/true"], env=env, check=True); out.append(time.perf_counter_ns() - t)
print(f"{statistics.median(n)} {statistics.median(l)}")
PY
}

echo '{' > "$T/results.json"
for run in $(seq "$RUNS"); do
  for mode in native limited; do
    m=$($mode "micro-$run" "$T/launch_micro" 200000 20000 | grep MICRO)
    echo "run $run $mode launch_micro: $m"
    echo "\"micro/$mode/$run\": \"$m\"," >> "$T/results.json"
    p=$(pairs8 $mode "pairs-$mode-$run")
    echo "run $run $mode pairs x8: $p ns"
    echo "\"pairs8/$mode/$run\": $p," >> "$T/results.json"
    for n in 8 32 64; do
      [ "$n" = 64 ] && [ "$run" -gt "$RUNS64" ] && continue
      s=$(startup $mode "startup-$mode-$n-$run" "$n")
      echo "run $run $mode start-up x$n: $s s"
      echo "\"startup$n/$mode/$run\": $s," >> "$T/results.json"
    done
  done
done
pc=$(preload_cost)
echo "preload cost (/bin/true x300, native and preloaded median ns): $pc"
echo '"preload_ns": "'"$pc"'",' >> "$T/results.json"
echo '"runs": '"$RUNS"', "runs64": '"$RUNS64"'}' >> "$T/results.json"
python3 - "$T/results.json" "$OUT/bench-limiter.json" "$OUT/raw" <<'PY'
import json, re, statistics, sys
raw = json.load(open(sys.argv[1]))
runs = raw["runs"]
def series(key, mode):
    return [raw[k] for r in range(1, runs + 1) if (k := f"{key}/{mode}/{r}") in raw]
table = {}
for field in ["launch_med_ns", "allocfree_med_ns"]:
    for mode in ["native", "limited"]:
        table.setdefault(field, {})[mode] = [float(re.search(field + r"=(\d+)", s).group(1)) for s in series("micro", mode)]
for key in ["pairs8", "startup8", "startup32", "startup64"]:
    for mode in ["native", "limited"]:
        table.setdefault(key, {})[mode] = [float(x) for x in series(key, mode)]
summary = {}
for key, modes in table.items():
    n, l = statistics.median(modes["native"]), statistics.median(modes["limited"])
    summary[key] = {"native": modes["native"], "limited": modes["limited"], "native_median": n,
                    "limited_median": l, "delta": l - n, "ratio": l / n if n else None}
    print(f"{key:<18} native {n:>12.3f} ({min(modes['native']):.3f}..{max(modes['native']):.3f})  "
          f"limiter {l:>12.3f} ({min(modes['limited']):.3f}..{max(modes['limited']):.3f})  "
          f"delta {l - n:+.3f}  x{(l / n if n else 0):.3f}")
# What the limiter adds, from its own records (limited runs only).
import glob, os
def jsonl(pattern):
    rows = []
    for f in sorted(glob.glob(os.path.join(sys.argv[3], pattern))):
        rows += [json.loads(l) for l in open(f) if l.strip()]
    return rows
self_time = {}
pair_hook = []
for row in jsonl("pairs-limited-*.jsonl"):
    apis = (row.get("limiter") or {}).get("apis", {})
    a, f = apis.get("cuMemAlloc_v2"), apis.get("cuMemFree_v2")
    if a and f:
        pair_hook.append(a["hook_ns"] / a["calls"] + f["hook_ns"] / f["calls"])
if pair_hook:
    self_time["pairs8_hook_ns_per_pair"] = {"median": statistics.median(pair_hook), "max": max(pair_hook),
                                            "processes": len(pair_hook)}
    print(f"limiter hook self-time per 1 MiB alloc+free pair, 8 processes at once: median "
          f"{statistics.median(pair_hook):.0f} ns, worst process {max(pair_hook):.0f} ns ({len(pair_hook)} processes)")
for n in (8, 32, 64):
    worst, worst_cpu, last = [], [], []
    for r in range(1, runs + 1):
        rows = jsonl(f"startup-limited-{n}-{r}.jsonl")
        per = [((row.get("limiter_init_us") or 0) + (row.get("limiter_claim_us") or 0)
                + ((row.get("limiter") or {}).get("hook_ns_total", 0)) / 1000,
                (row.get("limiter_init_cpu_us") or 0) + (row.get("limiter_claim_cpu_us") or 0),
                row.get("end_s", 0))
               for row in rows]
        if per:
            slowest = max(per)
            worst.append(slowest[0])
            worst_cpu.append(slowest[1])
            # The process that exited last: the start-up's slowest process, end to end.
            last.append(max(per, key=lambda p: p[2])[0])
    if worst:
        self_time[f"startup{n}_limiter_us_slowest"] = worst
        self_time[f"startup{n}_limiter_cpu_us_slowest"] = worst_cpu
        self_time[f"startup{n}_limiter_us_last_finished"] = last
        print(f"start-up x{n}: the limiter's own time (init + slot claim + hooks) in the process that finished "
              f"last: median {statistics.median(last):.0f} us over runs {['%.0f' % w for w in last]}; "
              f"the largest in any process: median {statistics.median(worst):.0f} us over runs "
              f"{['%.0f' % w for w in worst]}, CPU of its init + claim {['%.0f' % c for c in worst_cpu]} us "
              f"(the rest is waiting)")
pn, pl = (float(x) for x in raw["preload_ns"].split())
self_time["preload_ns"] = {"native": pn, "preloaded": pl, "delta": pl - pn}
print(f"preloading the library into /bin/true: {pn/1e6:.3f} ms -> {pl/1e6:.3f} ms ({(pl - pn)/1e6:+.3f} ms)")
json.dump({"summary": summary, "limiter_self_time": self_time, "raw": raw}, open(sys.argv[2], "w"), indent=1)
PY

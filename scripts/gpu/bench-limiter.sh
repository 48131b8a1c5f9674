#!/usr/bin/env bash
# The limiter's cost on the real driver (issue 4, point 8), the method of notes/gpu-machine.md:
# native and LD_PRELOAD=libvgpu_limiter.so runs interleaved (A B A B ...), RUNS of each (default 3),
# medians and spread. Run on the GPU machine from the repo root after `cargo xtask bundle`
# (.carry/bin: libvgpu_limiter.so, cuda-exercise); needs nvcc for launch_micro.cu.
#   1. launch_micro: median CPU ns per launch (200k) and per 1 MiB cudaMalloc+cudaFree pair (20k)
#   2. cuda-exercise pairs: 1 MiB cuMemAlloc_v2+cuMemFree_v2 pairs, 8 processes after a barrier
#   3. start-up of 8, 32 and 64 processes (cuInit + primary context + one allocation), slowest
# Limited runs: CUDA_DEVICE_MEMORY_LIMIT=64g, a fresh region per run, default context charge.
# Results: $OUT/bench-limiter.json (default OUT=/tmp/out-bench-limiter) and a table on stdout.
set -u
OUT=${OUT:-/tmp/out-bench-limiter}
RUNS=${RUNS:-3}
mkdir -p "$OUT"
BIN=$PWD/.carry/bin
LIM=$BIN/libvgpu_limiter.so
T=$(mktemp -d)
# Regions live on tmpfs, as they should in production (docs/region.md: first writes to a
# disk-backed shared mapping cost milliseconds).
TS=$(mktemp -d -p /dev/shm)
{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  uname -r
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
nvcc -O2 -o "$T/launch_micro" scripts/gpu/launch_micro.cu || { echo "nvcc failed"; exit 1; }

limited() { # limited TAG CMD...: runs CMD under the limiter with a fresh region
  local tag=$1; shift
  LD_PRELOAD=$LIM CUDA_DEVICE_MEMORY_LIMIT=64g CUDA_DEVICE_MEMORY_SHARED_CACHE="$TS/$tag.region" "$@"
}
native() { shift; "$@"; }

pairs8() { # pairs8 MODE TAG: 8 processes, barrier, the slowest median pair (ns)
  local mode=$1 tag=$2 pids=() i
  rm -f "$T/$tag.go"
  for i in $(seq 8); do
    $mode "$tag" "$BIN/cuda-exercise" pairs --count 20000 --barrier "$T/$tag.go" > "$T/$tag.$i.json" &
    pids+=($!)
  done
  sleep 5; touch "$T/$tag.go"
  for i in "${pids[@]}"; do wait "$i"; done
  cat "$T/$tag".*.json | python3 -c 'import sys,json; print(max(json.loads(l)["pair_median_ns"] for l in sys.stdin if l.strip()))'
}

startup() { # startup MODE TAG N: N processes together, the slowest spawn-to-exit seconds
  local mode=$1 tag=$2 n=$3 pids=() i t0
  t0=$(date +%s.%N)
  for i in $(seq "$n"); do
    ( $mode "$tag" "$BIN/cuda-exercise" pairs --count 1 > /dev/null; date +%s.%N > "$T/$tag.$i.end" ) &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i"; done
  cat "$T/$tag".*.end | python3 -c "import sys; print(max(float(l) for l in sys.stdin) - $t0)"
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
      s=$(startup $mode "startup-$mode-$n-$run" "$n")
      echo "run $run $mode start-up x$n: $s s"
      echo "\"startup$n/$mode/$run\": $s," >> "$T/results.json"
    done
  done
done
echo '"runs": '"$RUNS"'}' >> "$T/results.json"
python3 - "$T/results.json" "$OUT/bench-limiter.json" <<'PY'
import json, re, statistics, sys
raw = json.load(open(sys.argv[1]))
runs = raw["runs"]
def series(key, mode):
    out = []
    for r in range(1, runs + 1):
        v = raw[f"{key}/{mode}/{r}"]
        out.append(v)
    return out
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
json.dump({"summary": summary, "raw": raw}, open(sys.argv[2], "w"), indent=1)
PY

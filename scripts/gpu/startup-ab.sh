#!/usr/bin/env bash
# The limiter's own start-up time with N processes starting together, for
# several limiter builds side by side, interleaved round by round (the order rotates), so that
# builds are compared on the same host. Per process, as scripts/gpu/bench-limiter.sh counts it:
# initialisation + slot claim (from the limiter's log) + its hooks' self-time, and the CPU time
# of initialisation + claim; per round the slowest process (largest own time: its init, claim and
# hooks apart), the own time of the process that finished last, and the wall time of the slowest.
#   LIMITERS="after=.carry/bin/libvgpu_limiter.so before=.carry/before/libvgpu_limiter.so" \
#   N=64 ROUNDS=3 bash scripts/gpu/startup-ab.sh
# EXERCISE_ARGS="--lib .../libsimcuda.so" runs it on the simulated driver (a dry run off the GPU).
# Results: $OUT/startup-ab.json and a table on stdout.
set -euo pipefail
OUT=${OUT:-/tmp/out-startup-ab}
ROUNDS=${ROUNDS:-3}
N=${N:-64}
LIMITERS=${LIMITERS:-"after=$PWD/.carry/bin/libvgpu_limiter.so"}
SETTINGS="rounds=$ROUNDS n=$N"
# shellcheck source=ab-common.sh
source "$(dirname "$0")/ab-common.sh"

run() { # run BUILD TAG: N processes at once; raw/TAG.jsonl has one line per process
  local build=$1 tag=$2 pids=() i t0
  t0=$(date +%s.%N)
  for i in $(seq "$N"); do
    ( LD_PRELOAD=${lib[$build]} CUDA_DEVICE_MEMORY_LIMIT=64g LIBCUDA_LOG_LEVEL=3 \
        CUDA_DEVICE_MEMORY_SHARED_CACHE="$TS/$tag.region" \
        "$BIN/cuda-exercise" "${XARGS[@]}" pairs --count 1 > "$T/$tag.$i.json" 2> "$T/$tag.$i.err"
      date +%s.%N > "$T/$tag.$i.end" ) &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i"; done
  python3 - "$T" "$tag" "$N" "$t0" > "$OUT/raw/$tag.jsonl" <<'PY'
import json, re, sys
t, tag, n, t0 = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
for i in range(1, n + 1):
    j = json.loads(open(f"{t}/{tag}.{i}.json").read() or "{}")
    err = open(f"{t}/{tag}.{i}.err").read()
    init = re.search(r"initialised in (\d+) us \(cpu (\d+) us\)", err)
    claim = re.search(r"claimed slot \d+ of \S+ in (\d+) us \(cpu (\d+) us\)", err)
    init_us = int(init.group(1)) if init else 0
    claim_us = int(claim.group(1)) if claim else 0
    hooks_us = ((j.get("limiter") or {}).get("hook_ns_total", 0)) / 1000
    own = init_us + claim_us + hooks_us
    cpu = (int(init.group(2)) if init else 0) + (int(claim.group(2)) if claim else 0)
    wall = float(open(f"{t}/{tag}.{i}.end").read()) - t0
    print(json.dumps({"own_us": own, "init_us": init_us, "claim_us": claim_us, "hooks_us": hooks_us,
                      "cpu_us": cpu, "wall_s": wall, "errors": j.get("errors")}))
PY
}

for r in $(seq "$ROUNDS"); do
  k=${#builds[@]}
  for j in $(seq 0 $((k - 1))); do
    build=${builds[$(( (j + r) % k ))]}
    run "$build" "$build-r$r"
    echo "round $r $build done"
  done
done

python3 - "$OUT" "${builds[@]}" <<'PY'
import glob, json, statistics, sys
out, builds = sys.argv[1], sys.argv[2:]
summary = {}
print(f"{'build':10} {'slowest own us per round':>34} {'median':>8} {'its cpu us':>18} {'slowest wall s':>22}")
for b in builds:
    own, cpu, wall, parts, last = [], [], [], [], []
    for f in sorted(glob.glob(f"{out}/raw/{b}-r*.jsonl")):
        rows = [json.loads(l) for l in open(f) if l.strip()]
        slowest = max(rows, key=lambda x: x["own_us"])
        own.append(slowest["own_us"]); cpu.append(slowest["cpu_us"]); wall.append(max(x["wall_s"] for x in rows))
        # Where the slowest process's own time went: initialisation, slot claim, hooks.
        parts.append([round(slowest.get(k, 0)) for k in ("init_us", "claim_us", "hooks_us")])
        # The limiter's own time in the process that finished last (the start-up's slowest
        # process end to end), beside the largest own time of any process above.
        last.append(max(rows, key=lambda x: x["wall_s"])["own_us"])
    summary[b] = {"slowest_own_us": own, "median_own_us": statistics.median(own), "its_cpu_us": cpu,
                  "its_init_claim_hooks_us": parts, "slowest_wall_s": wall,
                  "last_finished_own_us": last, "median_last_finished_own_us": statistics.median(last)}
    print(f"{b:10} {' '.join('%.0f' % o for o in own):>34} {statistics.median(own):>8.0f} "
          f"{' '.join('%d' % c for c in cpu):>18} {' '.join('%.2f' % w for w in wall):>22}")
    print(f"{'':10} its init/claim/hooks us per round: {' '.join('/'.join(map(str, p)) for p in parts)}")
    print(f"{'':10} own us in the process that finished last, per round: {' '.join('%.0f' % x for x in last)}"
          f" (median {statistics.median(last):.0f})")
json.dump(summary, open(f"{out}/startup-ab.json", "w"), indent=1)
PY

#!/usr/bin/env python3
"""SM shares per container on a GPU (called by validate-sm-container.sh).

Usage: validate_sm_container.py LIMITER_SO OUT

Container A is two processes with one region (CUDA_DEVICE_MEMORY_SHARED_CACHE) at
CUDA_DEVICE_SM_LIMIT=50: together they get 50%, not 50% each. Container B is one process with its
own region at 30%. The workload and the pmon reader are validate_sm.py's. A container's share is
the sum of its processes' mean SM utilisation (nvidia-smi pmon -s u, 1 s samples). Each round
runs the NVML correction ("feedback", VGPU_SM_FEEDBACK=nvml: the check is of NVML's estimator,
which the default uses only until the limiters sample GPU time) and the open loop ("open",
VGPU_SM_FEEDBACK=0), the order rotated between rounds; the verdict is on the feedback medians.
CUDA_VISIBLE_DEVICES (one index, default 0) picks the GPU, for the workloads and for pmon.
SM_ROUNDS (default 2) sets the rounds; SM_OPEN_LOOP=0 runs the correction only (the open loop's
figures are then absent). Writes OUT/sm-container.json and OUT/sm-container.txt.
"""

import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from validate_sm import WORKLOAD, process_util, stop  # noqa: E402

ROUNDS = int(os.environ.get("SM_ROUNDS", "2"))
OPEN_LOOP = os.environ.get("SM_OPEN_LOOP", "1") != "0"
WARM_S = 12
MEASURE_S = 20
TOLERANCE = 5.0
CONTAINERS = (("A", 50, 2), ("B", 30, 1))


def start(limiter, out, name, region, limit, feedback):
    env = dict(os.environ)
    env.update(
        LD_PRELOAD=limiter,
        CUDA_DEVICE_MEMORY_SHARED_CACHE=region,
        CUDA_VISIBLE_DEVICES=env.get("CUDA_VISIBLE_DEVICES", "0"),
        CUDA_DEVICE_SM_LIMIT=str(limit),
        # Debug: the SM loop logs NVML's raw samples each tick (what its measured share is from).
        LIBCUDA_LOG_LEVEL="4",
        VGPU_SM_FEEDBACK="nvml" if feedback else "0",
    )
    log = open(os.path.join(out, name + ".log"), "w")
    p = subprocess.Popen([sys.executable, "-c", WORKLOAD], env=env, stdout=subprocess.PIPE,
                         stderr=log, text=True)
    line = p.stdout.readline()
    if not line.startswith("ready"):
        raise RuntimeError(f"{name}: workload did not start ({line!r}); see {name}.log")
    return p


def run(limiter, out, tag, feedback):
    procs, members = [], {}
    os.makedirs(os.path.join(out, "regions"), exist_ok=True)
    for name, limit, n in CONTAINERS:
        region = os.path.join(out, "regions", f"{tag}-{name}.region")
        for p in (region, region + ".ctl"):
            if os.path.exists(p):
                os.remove(p)
        members[name] = []
        for i in range(n):
            p = start(limiter, out, f"{tag}-{name}{i}", region, limit, feedback)
            procs.append(p)
            members[name].append(p.pid)
    try:
        time.sleep(WARM_S)
        per = process_util([p.pid for p in procs], MEASURE_S)
    finally:
        stop(*procs)
    result = {"tag": tag, "feedback": feedback, "containers": {}}
    for name, limit, _ in CONTAINERS:
        shares = [per[pid][0] for pid in members[name]]
        total = None if any(s is None for s in shares) else round(sum(shares), 1)
        result["containers"][name] = {"limit": limit, "processes": [
            {"pid": pid, "mean_util": per[pid][0], "samples": per[pid][1]} for pid in members[name]
        ], "share": total}
    print(json.dumps(result), flush=True)
    return result


def main():
    limiter, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    runs = []
    for r in range(ROUNDS):
        order = [True, False] if r % 2 == 0 else [False, True]
        for feedback in order if OPEN_LOOP else [True]:
            runs.append(run(limiter, out, f"r{r}-{'feedback' if feedback else 'open'}", feedback))
    summary = {"rounds": ROUNDS, "warm_s": WARM_S, "measure_s": MEASURE_S, "runs": runs,
               "containers": {}}
    ok = True
    lines = []
    for name, limit, n in CONTAINERS:
        entry = {"limit": limit, "processes": n}
        for mode, fb in (("feedback", True), ("open", False)):
            shares = [x["containers"][name]["share"] for x in runs if x["feedback"] == fb]
            shares = [s for s in shares if s is not None]
            med = statistics.median(shares) if shares else None
            entry[mode] = {"median": med, "shares": shares,
                           "spread": round(max(shares) - min(shares), 1) if shares else None}
        good = entry["feedback"]["median"] is not None and \
            abs(entry["feedback"]["median"] - limit) < TOLERANCE
        entry["ok"] = good
        entry["feedback"]["rounds_within"] = sum(abs(x - limit) < TOLERANCE for x in entry["feedback"]["shares"])
        ok &= good
        summary["containers"][name] = entry
        lines.append(f"container {name}: {n} process(es) at {limit}%: feedback median "
                     f"{entry['feedback']['median']} {entry['feedback']['shares']} "
                     f"({entry['feedback']['rounds_within']} of {len(entry['feedback']['shares'])} rounds within), open loop "
                     f"median {entry['open']['median']} {entry['open']['shares']} -> "
                     f"{'ok' if good else 'MISS'}")
    summary["verdict"] = "PASS" if ok else "FAIL"
    lines.append(f"verdict: {summary['verdict']} (each container within {TOLERANCE} points)")
    with open(os.path.join(out, "sm-container.json"), "w") as f:
        json.dump(summary, f, indent=1)
    with open(os.path.join(out, "sm-container.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""SM shares per container checked by completed work (called by validate-sm-work.sh).

Usage: validate_sm_work.py LIMITER_SO OUT

The referee is the work each container completes, not NVML: container A (two processes, one
region, CUDA_DEVICE_SM_LIMIT=50) and container B (one process, its own region, 30) each run
matmuls launched without a synchronisation per launch (the pattern of HAMi#2863, where a
launch-sync loop hides throttling): a batch of launches, an event after it, and a wait only
when 8 batches are in flight. Each worker reports its completed matmuls every 100 ms.

Per round: A alone and B alone without an SM limit (the work each does alone), then A and B
together under their limits, once per correction source in rotated order: "auto" (the default:
the GPU time the limiters sample) and "nvml" (VGPU_SM_FEEDBACK=nvml, for comparison;
SM_COMPARE=0 leaves it out). A container's share = its work together / its work alone * 100.
Verdict: every container's median share under "auto" within TOLERANCE (3) points of its limit.
SM_ROUNDS (default 3). Writes OUT/sm-work.json and OUT/sm-work.txt; exit status 1 on FAIL.
"""

import json
import os
import statistics
import sys
import time

from tenants import MATMUL, Tenant, fresh_region, limiter_env

ROUNDS = int(os.environ.get("SM_ROUNDS", "3"))
COMPARE = os.environ.get("SM_COMPARE", "1") != "0"
WARM_S = float(os.environ.get("SM_WARM_S", "10"))
MEASURE_S = float(os.environ.get("SM_MEASURE_S", "15"))
SOLO_WARM_S = 4.0
TOLERANCE = 3.0
CONTAINERS = (("A", 50, 2), ("B", 30, 1))

def worker(limiter, out, name, region, limit, feedback):
    """A process of a container (its `region`) at `limit` (None: unlimited) with the correction
    measuring from `feedback`."""
    extra = {"CUDA_DEVICE_SM_LIMIT": str(limit)} if limit else {}
    # Log level 4: the source of the correction, and the samples the GPU-time sampler capped
    # because another context's time slice fell inside them.
    env = limiter_env(limiter, region, 4, unset=("CUDA_DEVICE_SM_LIMIT",),
                      VGPU_SM_FEEDBACK=feedback, **extra)
    return Tenant(name, MATMUL, env, os.path.join(out, name + ".log"))


def source(w):
    """The correction source a worker's limiter logged (None if it logged none)."""
    try:
        text = open(w.log).read()
    except OSError:
        return None
    if "measured from the GPU time" in text:
        return "gpu-time"
    if "measured from NVML" in text:
        return "nvml"
    return None


def run_containers(limiter, out, tag, which, limited, feedback):
    workers = {}
    try:
        for name, limit, n in CONTAINERS:
            if name not in which:
                continue
            region = fresh_region(os.path.join(out, "regions", f"{tag}-{name}.region"))
            workers[name] = [
                worker(limiter, out, f"{tag}-{name}{i}", region, limit if limited else None,
                       feedback)
                for i in range(n)
            ]
        for ws in workers.values():
            for w in ws:
                w.wait_ready()
        warm = WARM_S if limited else SOLO_WARM_S
        time.sleep(warm)
        t0 = time.monotonic_ns()
        time.sleep(MEASURE_S)
        t1 = time.monotonic_ns()
        time.sleep(0.3)
        rates = {name: sum(w.count_at(t1) - w.count_at(t0) for w in ws) / ((t1 - t0) / 1e9)
                 for name, ws in workers.items()}
        # Only the process holding the container's lease runs the correction and logs its
        # source; the container's source is what its processes logged ("none" if none did).
        sources = {name: sorted({source(w) for w in ws} - {None}) or ["none"]
                   for name, ws in workers.items()}
        return rates, sources
    finally:
        for ws in workers.values():
            for w in ws:
                w.stop()


def main():
    limiter, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    modes = ["auto", "nvml"] if COMPARE else ["auto"]
    rounds = []
    for r in range(ROUNDS):
        solo = {}
        for name, _, _ in CONTAINERS:
            rates, _ = run_containers(limiter, out, f"r{r}-solo", {name}, False, "auto")
            solo[name] = rates[name]
        together = {}
        order = modes if r % 2 == 0 else list(reversed(modes))
        for mode in order:
            rates, sources = run_containers(limiter, out, f"r{r}-{mode}", {"A", "B"}, True, mode)
            together[mode] = {
                name: {"rate": round(rates[name], 1),
                       "share": round(100.0 * rates[name] / solo[name], 1) if solo[name] else None,
                       "source": sources[name]}
                for name in rates
            }
        entry = {"round": r, "solo": {k: round(v, 1) for k, v in solo.items()},
                 "together": together}
        print(json.dumps(entry), flush=True)
        rounds.append(entry)
    summary = {"rounds": rounds, "warm_s": WARM_S, "measure_s": MEASURE_S,
               "tolerance": TOLERANCE, "containers": {}}
    ok = True
    lines = []
    for name, limit, n in CONTAINERS:
        entry = {"limit": limit, "processes": n}
        for mode in modes:
            shares = [x["together"][mode][name]["share"] for x in rounds
                      if x["together"][mode][name]["share"] is not None]
            med = statistics.median(shares) if shares else None
            entry[mode] = {"median": med, "shares": shares,
                           "spread": round(max(shares) - min(shares), 1) if shares else None,
                           "sources": sorted({s for x in rounds
                                              for s in x["together"][mode][name]["source"]})}
        good = entry["auto"]["median"] is not None and \
            abs(entry["auto"]["median"] - limit) <= TOLERANCE and \
            entry["auto"]["sources"] == ["gpu-time"]
        entry["ok"] = good
        ok &= good
        summary["containers"][name] = entry
        line = (f"container {name}: {n} process(es) at {limit}%: share of its solo work, "
                f"auto median {entry['auto']['median']} {entry['auto']['shares']} "
                f"(source {entry['auto']['sources']})")
        if COMPARE:
            line += f", nvml median {entry['nvml']['median']} {entry['nvml']['shares']}"
        lines.append(line + f" -> {'ok' if good else 'MISS'}")
    summary["verdict"] = "PASS" if ok else "FAIL"
    lines.append(f"verdict: {summary['verdict']} (each container's median share under the default "
                 f"correction within {TOLERANCE} points of its limit, measured from GPU time)")
    with open(os.path.join(out, "sm-work.json"), "w") as f:
        json.dump(summary, f, indent=1)
    with open(os.path.join(out, "sm-work.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

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
import subprocess
import sys
import threading
import time

ROUNDS = int(os.environ.get("SM_ROUNDS", "3"))
COMPARE = os.environ.get("SM_COMPARE", "1") != "0"
WARM_S = float(os.environ.get("SM_WARM_S", "10"))
MEASURE_S = float(os.environ.get("SM_MEASURE_S", "15"))
SOLO_WARM_S = 4.0
TOLERANCE = 3.0
CONTAINERS = (("A", 50, 2), ("B", 30, 1))

WORKER = r"""
import sys, time, collections
import torch
n = 2048
a = torch.randn(n, n, device="cuda", dtype=torch.float16)
b = torch.randn(n, n, device="cuda", dtype=torch.float16)
BATCH = 16
inflight = collections.deque()
done = 0
for _ in range(3):
    torch.mm(a, b)
torch.cuda.synchronize()
print("ready", flush=True)
last = time.monotonic()
while True:
    for _ in range(BATCH):
        torch.mm(a, b)
    e = torch.cuda.Event()
    e.record()
    inflight.append(e)
    while inflight and inflight[0].query():
        inflight.popleft()
        done += BATCH
    if len(inflight) >= 8:
        inflight.popleft().synchronize()
        done += BATCH
    now = time.monotonic()
    if now - last >= 0.1:
        last = now
        print("W", time.monotonic_ns(), done, flush=True)
"""


class Worker:
    def __init__(self, limiter, out, name, region, limit, feedback):
        env = dict(os.environ)
        env.update(
            LD_PRELOAD=limiter,
            CUDA_DEVICE_MEMORY_SHARED_CACHE=region,
            CUDA_VISIBLE_DEVICES=env.get("CUDA_VISIBLE_DEVICES", "0"),
            # 4: the source of the correction, and the samples the GPU-time sampler capped
            # because another context's time slice fell inside them.
            LIBCUDA_LOG_LEVEL="4",
            VGPU_SM_FEEDBACK=feedback,
        )
        env.pop("CUDA_DEVICE_SM_LIMIT", None)
        if limit:
            env["CUDA_DEVICE_SM_LIMIT"] = str(limit)
        self.name = name
        self.log_path = os.path.join(out, name + ".log")
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER], env=env,
                                     stdout=subprocess.PIPE, stderr=open(self.log_path, "w"),
                                     text=True)
        self.points = []

    def wait_ready(self):
        """Waits for the worker's first line (workers start in parallel, then wait here)."""
        line = self.proc.stdout.readline()
        if not line.startswith("ready"):
            raise RuntimeError(f"{self.name}: worker did not start ({line!r}); see {self.log_path}")
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            parts = line.split()
            if len(parts) == 3 and parts[0] == "W":
                self.points.append((int(parts[1]), int(parts[2])))

    def count_at(self, t_ns):
        """Completed matmuls at the last report at or before t_ns."""
        before = [c for (t, c) in self.points if t <= t_ns]
        return before[-1] if before else 0

    def stop(self):
        self.proc.kill()
        self.proc.wait()

    def source(self):
        """The correction source the limiter logged (None if it logged none)."""
        try:
            text = open(self.log_path).read()
        except OSError:
            return None
        if "measured from the GPU time" in text:
            return "gpu-time"
        if "measured from NVML" in text:
            return "nvml"
        return None


def fresh_region(out, tag):
    region = os.path.join(out, "regions", tag + ".region")
    os.makedirs(os.path.dirname(region), exist_ok=True)
    for p in (region, region + ".ctl"):
        if os.path.exists(p):
            os.remove(p)
    return region


def run_containers(limiter, out, tag, which, limited, feedback):
    workers = {}
    try:
        for name, limit, n in CONTAINERS:
            if name not in which:
                continue
            region = fresh_region(out, f"{tag}-{name}")
            workers[name] = [
                Worker(limiter, out, f"{tag}-{name}{i}", region, limit if limited else None,
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
        sources = {name: sorted({w.source() for w in ws} - {None}) or ["none"]
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

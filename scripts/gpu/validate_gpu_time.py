#!/usr/bin/env python3
"""The limiter's GPU time against each tenant's own completed work (called by
validate-gpu-time.sh, which describes the method).

Usage: validate_gpu_time.py LIMITER_SO AGENT_BIN OUT
"""

import json
import os
import signal
import statistics
import subprocess
import sys
import time

MEASURE_S = float(os.environ.get("MEASURE_S", "20"))
WARMUP_S = 5.0
TOLERANCE_PTS = float(os.environ.get("TOLERANCE_PTS", "2"))
MAX_ADDED_NS = 500.0
BATCH = 50

TENANT = r"""
import os, sys, time
duty = float(sys.argv[1]); log = open(sys.argv[2], "w", buffering=1); seconds = float(sys.argv[3])
BATCH = int(sys.argv[4])
try:
    import torch
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    b = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    def batch():
        for _ in range(BATCH):
            torch.mm(a, b)
        torch.cuda.synchronize()
    lib = "torch"
except ImportError:
    import cupy as cp
    a = cp.random.rand(2048, 2048).astype(cp.float16)
    b = a.copy()
    def batch():
        for _ in range(BATCH):
            a @ b
        cp.cuda.Device().synchronize()
    lib = "cupy"
batch()
print("ready", lib, flush=True)
done = 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    t = time.monotonic()
    batch()
    done += BATCH
    log.write(f"{time.monotonic_ns()} {done}\n")
    if duty < 1.0:
        busy = time.monotonic() - t
        time.sleep(busy * (1.0 - duty) / duty)
"""

LAUNCHES = r"""
import sys, time, statistics
n = int(sys.argv[1]); batches = int(sys.argv[2])
try:
    import torch
    x = torch.zeros(1, device="cuda")
    def launch():
        x.add_(1)
    sync = torch.cuda.synchronize
except ImportError:
    import cupy as cp
    k = cp.RawKernel(r'extern "C" __global__ void empty(int x) {}', "empty")
    def launch():
        k((1,), (1,), (0,))
    sync = cp.cuda.Device().synchronize
for _ in range(2000):
    launch()
sync()
per = []
for _ in range(batches):
    t = time.perf_counter_ns()
    for i in range(n):
        launch()
        if i % 256 == 255:
            sync()
    sync()
    per.append((time.perf_counter_ns() - t) / n)
print(statistics.median(per))
"""


def env_for(limiter, out, name, sample=None, limited=True):
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = env.get("CUDA_VISIBLE_DEVICES", "0")
    for k in ("LD_PRELOAD", "CUDA_DEVICE_SM_LIMIT", "CUDA_DEVICE_MEMORY_SHARED_CACHE",
              "VGPU_GPU_TIME_SAMPLE"):
        env.pop(k, None)
    if limited:
        region = os.path.join(out, "regions", name + ".region")
        os.makedirs(os.path.dirname(region), exist_ok=True)
        for p in (region, region + ".ctl"):
            if os.path.exists(p):
                os.remove(p)
        env.update(LD_PRELOAD=limiter, CUDA_DEVICE_MEMORY_SHARED_CACHE=region)
        if sample is not None:
            env["VGPU_GPU_TIME_SAMPLE"] = sample
    return env


def start_tenant(limiter, out, name, duty, seconds, limited=True):
    log = os.path.join(out, name + ".work")
    p = subprocess.Popen([sys.executable, "-c", TENANT, str(duty), log, str(seconds), str(BATCH)],
                         env=env_for(limiter, out, name, limited=limited),
                         stdout=subprocess.PIPE, stderr=open(os.path.join(out, name + ".log"), "w"),
                         text=True)
    line = p.stdout.readline()
    if not line.startswith("ready"):
        raise RuntimeError(f"{name}: did not start ({line!r}); see {name}.log")
    return p, log


def done_at(log, t_ns):
    """Kernels the tenant had completed at CLOCK_MONOTONIC t_ns (linear between its lines)."""
    rows = [tuple(map(int, l.split())) for l in open(log) if l.strip()]
    prev = (0, 0)
    for t, n in rows:
        if t >= t_ns:
            if prev[0] == 0:
                return n
            return prev[1] + (n - prev[1]) * (t_ns - prev[0]) / max(1, t - prev[0])
        prev = (t, n)
    return prev[1]


def kernel_time_alone(limiter, out):
    """Device time of one kernel: a saturating tenant alone, without the limiter."""
    p, log = start_tenant(limiter, out, "calibrate", 1.0, 8.0, limited=False)
    p.wait()
    rows = [tuple(map(int, l.split())) for l in open(log) if l.strip()]
    # Skip the first second (clocks ramping).
    rows = [r for r in rows if r[0] >= rows[0][0] + 1_000_000_000]
    (t0, n0), (t1, n1) = rows[0], rows[-1]
    return (t1 - t0) / (n1 - n0)


def phase(limiter, agent, out, name, duties, kernel_ns):
    seconds = WARMUP_S + MEASURE_S + 10
    tenants = {}
    for i, duty in enumerate(duties):
        tname = f"{name}-{i}-{int(duty * 100)}"
        tenants[tname] = (duty,) + start_tenant(limiter, out, tname, duty, seconds)
    time.sleep(WARMUP_S)
    stat_out = os.path.join(out, f"stat-{name}.json")
    stat = subprocess.Popen([agent, "stat", "--json", "--no-daemon", "--duration", "300s",
                             "--region-dir", os.path.join(out, "regions")],
                            stdout=open(stat_out, "w"), stderr=subprocess.PIPE, text=True)
    for line in stat.stderr:
        if "tracing for" in line:
            break
    t0 = time.monotonic_ns()
    time.sleep(MEASURE_S)
    t1 = time.monotonic_ns()
    stat.send_signal(signal.SIGINT)
    stat.wait()
    for _, p, _ in tenants.values():
        p.send_signal(signal.SIGTERM)
        p.wait()
    report = json.load(open(stat_out))
    window = (t1 - t0) / 1e9
    rows = []
    for tname, (duty, p, log) in tenants.items():
        referee = (done_at(log, t1) - done_at(log, t0)) * kernel_ns / 1e9 / window
        row = next((r for r in report["processes"] if r["pid"] == p.pid), None)
        by = {b["source"]: b for b in (row or {}).get("gpu_busy", []) if b["device"] == 0}
        lim = by.get("limiter", {}).get("busy_ratio")
        nvml = by.get("nvml", {}).get("busy_ratio")
        rows.append({
            "tenant": tname, "duty": duty, "referee_pct": 100 * referee,
            "limiter_pct": None if lim is None else 100 * lim,
            "limiter_samples": by.get("limiter", {}).get("samples"),
            "nvml_pct": None if nvml is None else 100 * nvml,
            "kernels": (row or {}).get("kernels", [])[:3],
            "ok": lim is not None and abs(100 * lim - 100 * referee) <= TOLERANCE_PTS,
        })
    return rows


def launch_cost(limiter, out):
    configs = [("native", None, False), ("limiter", None, True), ("limiter-sampling-off", "off", True)]
    per = {c[0]: [] for c in configs}
    for r in range(5):
        for k in range(len(configs)):
            name, sample, limited = configs[(k + r) % len(configs)]
            res = subprocess.run([sys.executable, "-c", LAUNCHES, "20000", "3"],
                                 env=env_for(limiter, out, "cost-" + name, sample, limited),
                                 capture_output=True, text=True, timeout=300)
            per[name].append(float(res.stdout.strip().splitlines()[-1]))
    med = {k: statistics.median(v) for k, v in per.items()}
    return {"runs": per, "median_ns": med,
            "added_ns": med["limiter"] - med["native"],
            "sampling_ns": med["limiter"] - med["limiter-sampling-off"],
            "ok": med["limiter"] - med["native"] <= MAX_ADDED_NS}


def main():
    limiter, agent, out = sys.argv[1:4]
    kernel_ns = kernel_time_alone(limiter, out)
    result = {"kernel_ns_alone": kernel_ns, "tolerance_pts": TOLERANCE_PTS,
              "measure_s": MEASURE_S}
    result["alone"] = phase(limiter, agent, out, "alone", [0.3], kernel_ns)
    result["shared"] = phase(limiter, agent, out, "shared", [0.1, 0.2, 0.3], kernel_ns)
    result["cost"] = launch_cost(limiter, out)
    ok = all(r["ok"] for r in result["alone"] + result["shared"]) and result["cost"]["ok"]
    result["pass"] = ok
    lines = [f"kernel alone: {kernel_ns / 1000:.1f} us; window {MEASURE_S:.0f} s; "
             f"PASS within {TOLERANCE_PTS} points of the referee"]
    for ph in ("alone", "shared"):
        for r in result[ph]:
            fmt = lambda v: "-" if v is None else f"{v:5.1f}%"
            lines.append(f"{ph:6} {r['tenant']:16} duty {r['duty']:.1f}  referee {fmt(r['referee_pct'])}"
                         f"  limiter {fmt(r['limiter_pct'])} ({r['limiter_samples']} samples)"
                         f"  nvml {fmt(r['nvml_pct'])}  {'ok' if r['ok'] else 'MISS'}")
    c = result["cost"]
    lines.append("launch, ns: " + ", ".join(f"{k} {v:.0f}" for k, v in c["median_ns"].items())
                 + f"; limiter adds {c['added_ns']:.0f} ns (sampling {c['sampling_ns']:.0f} ns)"
                 + f" {'ok' if c['ok'] else 'OVER'} (max {MAX_ADDED_NS:.0f})")
    text = "\n".join(lines)
    print(text)
    open(os.path.join(out, "gpu-time.txt"), "w").write(text + "\n")
    json.dump(result, open(os.path.join(out, "gpu-time.json"), "w"), indent=1)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

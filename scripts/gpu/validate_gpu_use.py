#!/usr/bin/env python3
"""GPU use per process: vgpu-agent against nvidia-smi pmon (called by validate-gpu-use.sh).

Usage: validate_gpu_use.py LIMITER_SO AGENT_BIN OUT

Three phases on GPU 0, each measured over the same MEASURE_S window by both tools:
  saturating   a PyTorch matmul loop (CuPy if PyTorch is missing), no limiter
  limited30    the same loop under the limiter with CUDA_DEVICE_SM_LIMIT=30 (its own region)
  both         the two at once (two tenants time-slicing the device)
The agent's figure is `vgpu-agent stat --json`'s processes[].gpu_use[device 0].sm_util_pct
(and mem_util_pct) over a window that starts when stat says "tracing for" and ends (SIGINT) when
`nvidia-smi pmon -s u -d 1 -c MEASURE_S` has printed its last line; pmon's is the mean of its
1 s samples over that window ("-": no sample, counted 0). The raw NVML samples
(nvmlDeviceGetProcessUtilization, polled every 250 ms with lastSeenTimeStamp = the previous
poll minus 2 s) are kept in OUT/raw-<phase>.jsonl, to see the driver's sample period.

PASS when every process's SM figure is within TOLERANCE points of pmon's. Writes
OUT/gpu-use-summary.json and OUT/gpu-use-summary.txt.
"""

import ctypes
import json
import os
import subprocess
import sys
import threading
import time

MEASURE_S = 20
TOLERANCE = 5.0

WORKLOAD = r"""
import sys, time
try:
    import torch
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    def step():
        for _ in range(20):
            torch.mm(a, b)
        torch.cuda.synchronize()
    lib = "torch"
except ImportError:
    import cupy as cp
    a = cp.random.rand(4096, 4096).astype(cp.float16)
    b = a.copy()
    def step():
        for _ in range(20):
            a @ b
        cp.cuda.Device().synchronize()
    lib = "cupy"
print("ready", lib, flush=True)
while True:
    step()
"""


def start(limiter, out, name, sm_limit):
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = env.get("CUDA_VISIBLE_DEVICES", "0")
    for k in ("LD_PRELOAD", "CUDA_DEVICE_SM_LIMIT", "CUDA_DEVICE_MEMORY_SHARED_CACHE"):
        env.pop(k, None)
    if sm_limit is not None:
        region = os.path.join(out, "regions", name + ".region")
        os.makedirs(os.path.dirname(region), exist_ok=True)
        for p in (region, region + ".ctl"):
            if os.path.exists(p):
                os.remove(p)
        env.update(
            LD_PRELOAD=limiter,
            CUDA_DEVICE_SM_LIMIT=str(sm_limit),
            CUDA_DEVICE_MEMORY_SHARED_CACHE=region,
            LIBCUDA_LOG_LEVEL="3",
        )
    log = open(os.path.join(out, name + ".log"), "w")
    p = subprocess.Popen([sys.executable, "-c", WORKLOAD], env=env, stdout=subprocess.PIPE,
                         stderr=log, text=True)
    line = p.stdout.readline()
    if not line.startswith("ready"):
        raise RuntimeError(f"{name}: the workload did not start ({line!r}); see {name}.log")
    return p


class Sample(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("ts", ctypes.c_ulonglong), ("sm", ctypes.c_uint),
                ("mem", ctypes.c_uint), ("enc", ctypes.c_uint), ("dec", ctypes.c_uint)]


def raw_sampler(path, stop):
    """Polls NVML's per-process samples into a JSON-lines file until `stop` is set."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        nvml.nvmlInit_v2()
        dev = ctypes.c_void_p()
        nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev))
    except OSError as e:
        open(path, "w").write(json.dumps({"error": str(e)}) + "\n")
        return
    last = 0
    with open(path, "w") as f:
        while not stop.is_set():
            now = int(time.time() * 1e6)
            buf = (Sample * 256)()
            n = ctypes.c_uint(256)
            since = max(last - 2_000_000, 0)
            r = nvml.nvmlDeviceGetProcessUtilization(dev, buf, ctypes.byref(n), ctypes.c_ulonglong(since))
            rec = {"t_us": now, "since_us": since, "rc": r,
                   "samples": [[s.pid, s.ts, s.sm, s.mem] for s in buf[: n.value]] if r == 0 else []}
            f.write(json.dumps(rec) + "\n")
            last = now
            time.sleep(0.25)


def pmon(seconds):
    """Mean SM and memory utilisation per pid over `seconds` 1 s samples of nvidia-smi pmon."""
    out = subprocess.run(["nvidia-smi", "pmon", "-i", "0", "-s", "u", "-d", "1", "-c", str(seconds)],
                         capture_output=True, text=True).stdout
    return out, parse_pmon(out, seconds)


def parse_pmon(out, seconds):
    cols = None
    per = {}
    for line in out.splitlines():
        if line.startswith("# gpu"):
            cols = line[1:].split()
            continue
        if line.startswith("#") or cols is None:
            continue
        f = line.split()
        if len(f) < len(cols) - 1 or not f[1].isdigit():
            continue
        pid = int(f[1])
        val = lambda name: 0.0 if f[cols.index(name)] == "-" else float(f[cols.index(name)])
        per.setdefault(pid, []).append((val("sm"), val("mem")))
    return {pid: {"sm": sum(v[0] for v in vs) / seconds, "mem": sum(v[1] for v in vs) / seconds,
                       "lines": len(vs)} for pid, vs in per.items()}


def measure(agent, out, phase, procs):
    stop = threading.Event()
    raw = threading.Thread(target=raw_sampler, args=(os.path.join(out, f"raw-{phase}.jsonl"), stop))
    raw.start()
    err = open(os.path.join(out, f"stat-{phase}.err"), "w+")
    stat = subprocess.Popen([agent, "stat", "--json", "--duration", "300s", "--no-calibrate",
                             "--poll-interval", "500ms"], stdout=subprocess.PIPE, stderr=err,
                            text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        err.seek(0)
        if "tracing for" in err.read():
            break
        time.sleep(0.1)
    text, by_pid = pmon(MEASURE_S)
    stat.send_signal(2)
    report = json.loads(stat.communicate(timeout=30)[0])
    stop.set()
    raw.join()
    open(os.path.join(out, f"pmon-{phase}.txt"), "w").write(text)
    json.dump(report, open(os.path.join(out, f"stat-{phase}.json"), "w"), indent=1)
    rows = []
    for name, p in procs.items():
        row = next((r for r in report["processes"] if r["pid"] == p.pid), None)
        use = next((u for u in (row or {}).get("gpu_use", []) if u["device"] == 0), None)
        ref = by_pid.get(p.pid, {"sm": 0.0, "mem": 0.0, "lines": 0})
        agent_sm = use and use["sm_util_pct"]
        ok = agent_sm is not None and abs(agent_sm - ref["sm"]) < TOLERANCE
        rows.append({"phase": phase, "process": name, "pid": p.pid,
                     "agent_sm_pct": None if agent_sm is None else round(agent_sm, 1),
                     "pmon_sm_pct": round(ref["sm"], 1),
                     "agent_mem_pct": None if not use or use["mem_util_pct"] is None
                     else round(use["mem_util_pct"], 1),
                     "pmon_mem_pct": round(ref["mem"], 1), "pmon_lines": ref["lines"],
                     "agent_observed_s": use and use["observed_seconds"],
                     "window_s": report["duration_seconds"], "ok": ok})
    return rows


def main():
    limiter, agent, out = sys.argv[1:4]
    results = []
    phases = [("saturating", {"saturating": None}, 5),
              ("limited30", {"limited30": 30}, 10),
              ("both", {"saturating": None, "limited30": 30}, 15)]
    for phase, spec, warm in phases:
        procs = {name: start(limiter, out, f"{phase}-{name}", lim) for name, lim in spec.items()}
        try:
            time.sleep(warm)
            results.extend(measure(agent, out, phase, procs))
        finally:
            for p in procs.values():
                p.kill()
            for p in procs.values():
                p.wait()
    ok = all(r["ok"] for r in results)
    json.dump({"tolerance_points": TOLERANCE, "measure_s": MEASURE_S, "pass": ok,
               "results": results}, open(os.path.join(out, "gpu-use-summary.json"), "w"), indent=1)
    lines = [f"{'phase':<11} {'process':<11} {'pid':>7} {'agent SM%':>9} {'pmon SM%':>8} "
             f"{'agent MEM%':>10} {'pmon MEM%':>9}  ok"]
    for r in results:
        lines.append(f"{r['phase']:<11} {r['process']:<11} {r['pid']:>7} {str(r['agent_sm_pct']):>9} "
                     f"{r['pmon_sm_pct']:>8} {str(r['agent_mem_pct']):>10} {r['pmon_mem_pct']:>9}  "
                     f"{'yes' if r['ok'] else 'NO'}")
    text = "\n".join(lines) + f"\n{'PASS' if ok else 'FAIL'} (within {TOLERANCE} points of pmon)\n"
    open(os.path.join(out, "gpu-use-summary.txt"), "w").write(text)
    print(text)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

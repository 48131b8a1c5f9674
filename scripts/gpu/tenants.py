"""Tenants for the GPU checks that referee by completed work (validate_sm_work.py,
validate_qos.py): PyTorch processes under the limiter that report their work on stdout.

MATMUL launches 2048x2048 fp16 matmuls in batches of 16 with an event after each batch, waiting
only when 8 batches are in flight (no synchronisation per launch), and prints `W <ns> <done>`
every 100 ms; with PAUSE_FILE set it drains and idles while that file exists. A tenant's code
prints `ready` once warmed up; `S <ns> <step ns>` lines are step times.
"""

import os
import subprocess
import sys
import threading

MATMUL = r"""
import os, sys, time, collections
import torch
n = 2048
a = torch.randn(n, n, device="cuda", dtype=torch.float16)
b = torch.randn(n, n, device="cuda", dtype=torch.float16)
pause = os.environ.get("PAUSE_FILE")
inflight = collections.deque()
done = 0
for _ in range(3):
    torch.mm(a, b)
torch.cuda.synchronize()
print("ready", flush=True)
last = time.monotonic()
while True:
    if pause and os.path.exists(pause):
        while inflight:
            inflight.popleft().synchronize()
            done += 16
        time.sleep(0.01)
    else:
        for _ in range(16):
            torch.mm(a, b)
        e = torch.cuda.Event()
        e.record()
        inflight.append(e)
        while inflight and inflight[0].query():
            inflight.popleft()
            done += 16
        if len(inflight) >= 8:
            inflight.popleft().synchronize()
            done += 16
    now = time.monotonic()
    if now - last >= 0.1:
        last = now
        print("W", time.monotonic_ns(), done, flush=True)
"""


def fresh_region(path):
    """`path` for a region of its own: the directory made, an earlier region and block gone."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    for p in (path, path + ".ctl"):
        if os.path.exists(p):
            os.remove(p)
    return path


def limiter_env(limiter, region, log_level, unset=(), **extra):
    """The environment of a tenant under `limiter` in `region` on GPU 0 (unless
    CUDA_VISIBLE_DEVICES says otherwise): `unset` variables removed, then `extra` set."""
    env = dict(os.environ)
    env.update(
        LD_PRELOAD=limiter,
        CUDA_DEVICE_MEMORY_SHARED_CACHE=region,
        CUDA_VISIBLE_DEVICES=env.get("CUDA_VISIBLE_DEVICES", "0"),
        LIBCUDA_LOG_LEVEL=str(log_level),
    )
    for k in unset:
        env.pop(k, None)
    env.update(extra)
    return env


class Tenant:
    """A tenant process: started at once, waited for with `wait_ready` (start several, then wait
    for each), its `W` and `S` lines read on a thread of its own; stderr in `log`."""

    def __init__(self, name, code, env, log):
        self.name, self.log = name, log
        self.proc = subprocess.Popen([sys.executable, "-c", code], env=env,
                                     stdout=subprocess.PIPE, stderr=open(log, "w"), text=True)
        self.points, self.steps = [], []
        self.started = False

    def wait_ready(self):
        if self.started:
            return self
        line = self.proc.stdout.readline()
        if not line.startswith("ready"):
            raise RuntimeError(f"{self.name}: did not start ({line!r}); see {self.log}")
        self.started = True
        threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self):
        for line in self.proc.stdout:
            p = line.split()
            if len(p) == 3 and p[0] == "W":
                self.points.append((int(p[1]), int(p[2])))
            elif len(p) == 3 and p[0] == "S":
                self.steps.append((int(p[1]), int(p[2])))

    def count_at(self, t_ns):
        """Completed work at the last report at or before t_ns."""
        c = [n for (ts, n) in self.points if ts <= t_ns]
        return c[-1] if c else 0

    def rate(self, t0, t1):
        return (self.count_at(t1) - self.count_at(t0)) / ((t1 - t0) / 1e9)

    def stop(self):
        self.proc.kill()
        self.proc.wait()

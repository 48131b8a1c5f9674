#!/usr/bin/env python3
"""Freeze on demand on a GPU, against a control without it (called by
validate-freeze-on-demand.sh).

Usage: validate_freeze_on_demand.py VGPU_AGENT LIMITER_SO OUT

Two runs, each with its own `vgpu-agent run` and fresh processes:

- **on**: the daemon with `--freeze-on-demand FOD_IDLE_S` seconds (default 2);
- **control**: the same daemon without it (and without `VGPU_FREEZE_ON_DEMAND` or
  `VGPU_FREEZE_AFTER` in its environment).

In each run:

1. Container A (a docker-like cgroup of its own and a region; PyTorch under the limiter) holds
   FOD_A_MIB MiB (default 16384) of a pattern, then makes no CUDA call: it waits for a line on
   its stdin (its signal).
2. A filler, a host process in no container and without the limiter (never frozen), takes all
   of the GPU's free memory but FOD_RESERVE_MIB (default 4096). The filler, not A, makes the
   GPU full: a frozen A is held in host memory (128 GiB on a one-H200 machine, less than the
   GPU) and the driver's freeze takes ~0.55 s per GiB (docs/oversubscription.md, "On a GPU").
3. Container B (its own cgroup and region; the driver API through ctypes under the limiter,
   `VGPU_OOM_WAIT=FOD_WAIT_S` seconds, default 30) creates its context. Once the daemon's model
   shows A and A has been idle for FOD_IDLE_S + 2 s, B asks for the GPU's free memory (NVML) plus
   half of A's: more than is physically free, less than is free once A is off the GPU. One
   `cuMemAlloc_v2`, timed in B; on success B writes every byte (`cuMemsetD8_v2`), then frees
   and exits.
4. A is signalled: its first CUDA call (timed in A) thaws it if it was frozen; then it checks
   its pattern word for word.

The referee is NVML (`nvidia-smi --query-gpu=memory.used,memory.free`, sampled through B's
wait), B's own result and A's own check, never the agent's view (its log and model are
recorded beside, for diagnosis). Verdict:

- on: the GPU had less free than B asked; B's allocation succeeded within its wait and B wrote
  it; A was off the GPU while frozen (>= 95% of what it held given back, measured after B left
  and before A's next call); A alive, answered with 0 corrupted words; the GPU back to its idle
  use (within 1 GiB) once everything stopped.
- control: the GPU had less free than B asked; B got CUDA_ERROR_OUT_OF_MEMORY (2) after its
  whole wait; A kept >= 95% of its memory on the GPU throughout; A alive, 0 corrupted words;
  the GPU back to idle.

PASS if both runs pass. Writes OUT/freeze-on-demand.{json,txt} and each process's log; exit
status 1 on a miss, 2 if cgroups cannot be made here (BLOCKED).

SIM=1 runs the same on the simulated driver (no GPU; SIM_BIN names the folder with cuda-exercise
and libsimcuda.so, default .carry/bin): A, B and the filler are `cuda-exercise pattern`, the
referee the simulated device's charged bytes. It checks this script, not the GPU.
"""

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_snapshot  # noqa: E402
from validate_freeze_frameworks import cgroup2_root, rmdir_when_empty, sim_paths  # noqa: E402

SIM = os.environ.get("SIM") == "1"
A_MIB = int(os.environ.get("FOD_A_MIB", "8" if SIM else "16384"))
RESERVE_MIB = int(os.environ.get("FOD_RESERVE_MIB", "4" if SIM else "4096"))
IDLE_S = int(os.environ.get("FOD_IDLE_S", "2"))
WAIT_S = int(os.environ.get("FOD_WAIT_S", "8" if SIM else "30"))
SIM_CAPACITY_MIB = int(os.environ.get("FOD_SIM_CAPACITY_MIB", "64"))
GPU = os.environ.get("CUDA_VISIBLE_DEVICES", "0") or "0"
RUNS = os.environ.get("FOD_RUNS", "on,control").split(",")
CUDA_ERROR_OUT_OF_MEMORY = 2
# Goals.
GIVEN_BACK_MIN = 0.95
KEPT_MIN = 0.95
END_SLACK_MIB = 0 if SIM else 1024
# How long a process may take to answer a line (start-up, a check whose first call thaws).
LINE_TIMEOUT_S = 120

# Container A: PyTorch holding a pattern, made and checked 1 GiB (128 Mi words) at a time so that
# it holds little more than its bytes (as validate_freeze.py's tenant). Speaks
# `cuda-exercise pattern`'s protocol: {"result": 0} once it holds the pattern; on "check":
# {"checking": true}, then {"result": 0, "corrupted": N}. Its first CUDA call after the signal
# is a small allocation and a fill (the limiter intercepts both: a frozen container thaws there),
# timed on its own.
TENANT_A = r"""
import json, os, sys, time
def say(**kw):
    print(json.dumps(kw), flush=True)
sys.stdin.readline()  # "go": it is in its container now
import torch
n = int(sys.argv[1]) << 20
words = n // 8
step = 1 << 27
def pattern(i, j):
    return torch.arange(i, j, device="cuda", dtype=torch.int64).mul_(2654435761).remainder_(1 << 31)
x = torch.empty(words, device="cuda", dtype=torch.int64)
for i in range(0, words, step):
    x[i:i + step] = pattern(i, min(i + step, words))
torch.cuda.synchronize()
# Only the pattern (and the context) stays on the GPU: the temporaries go back.
torch.cuda.empty_cache()
say(result=0, pid=os.getpid(), bytes=n)
for line in sys.stdin:
    if line.strip() != "check":
        continue
    say(checking=True)
    t = time.perf_counter()
    one = torch.ones(1, device="cuda").item()
    first = time.perf_counter() - t
    bad = 0
    for i in range(0, words, step):
        j = min(i + step, words)
        bad += int((x[i:j] != pattern(i, j)).sum().item())
    torch.cuda.synchronize()
    say(result=0, corrupted=bad, first_call_s=round(first, 3), first_call_ok=(one == 1.0),
        check_s=round(time.perf_counter() - t, 3))
"""

# Container B: the driver API through ctypes (the limiter answers dlsym of libcuda's handle with
# its hooks), so that the wait is exactly one cuMemAlloc_v2 (PyTorch's allocator would retry a
# refused cudaMalloc and wait twice). {"ready": true, ...} once it has a context; on
# "alloc BYTES": {"result": CUresult, "waited_s": ...}; at the end of its stdin it frees and
# says {"freed": CUresult or null}.
TENANT_B = r"""
import ctypes, json, sys, time
from ctypes import byref, c_int, c_size_t, c_ubyte, c_uint64, c_void_p, POINTER
def say(**kw):
    print(json.dumps(kw), flush=True)
sys.stdin.readline()  # "go": it is in its container now
cu = ctypes.CDLL("libcuda.so.1")
cu.cuInit.argtypes = [ctypes.c_uint]
cu.cuDeviceGet.argtypes = [POINTER(c_int), c_int]
cu.cuDevicePrimaryCtxRetain.argtypes = [POINTER(c_void_p), c_int]
cu.cuCtxSetCurrent.argtypes = [c_void_p]
cu.cuMemGetInfo_v2.argtypes = [POINTER(c_size_t), POINTER(c_size_t)]
cu.cuMemAlloc_v2.argtypes = [POINTER(c_uint64), c_size_t]
cu.cuMemsetD8_v2.argtypes = [c_uint64, c_ubyte, c_size_t]
cu.cuMemFree_v2.argtypes = [c_uint64]
def ok(r, what):
    if r != 0:
        say(error=f"{what} -> CUresult {r}")
        sys.exit(1)
dev, ctx = c_int(), c_void_p()
ok(cu.cuInit(0), "cuInit")
ok(cu.cuDeviceGet(byref(dev), 0), "cuDeviceGet")
ok(cu.cuDevicePrimaryCtxRetain(byref(ctx), dev), "cuDevicePrimaryCtxRetain")
ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
free, total = c_size_t(), c_size_t()
ok(cu.cuMemGetInfo_v2(byref(free), byref(total)), "cuMemGetInfo_v2")
say(ready=True, free=free.value, total=total.value)
words = sys.stdin.readline().split()
n = int(words[1])
p = c_uint64()
t = time.perf_counter()
r = cu.cuMemAlloc_v2(byref(p), n)
waited = time.perf_counter() - t
written = None
if r == 0:
    written = cu.cuMemsetD8_v2(p.value, 0xA5, n) == 0 and cu.cuCtxSynchronize() == 0
say(result=r, waited_s=round(waited, 3), bytes=n, written=written)
sys.stdin.read()
say(freed=cu.cuMemFree_v2(p.value) if r == 0 else None)
"""

# The filler: a host process without the limiter, in no container (never frozen), holding all of
# the GPU's free memory but RESERVE MiB (as validate_freeze.py's FILL).
FILL = r"""
import json, sys, torch
free, _ = torch.cuda.mem_get_info()
x = torch.empty(max(free - (int(sys.argv[1]) << 20), 0), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print(json.dumps({"result": 0, "bytes": x.numel()}), flush=True)
sys.stdin.read()
"""

def sim_env(d, env):
    """The simulated device's environment (every process that uses it, the agent's too): a
    device of its own for each run (in the run's folder `d`)."""
    if SIM:
        env.update(SIMCUDA_SHARED_DEVICE=os.path.join(d, "sim.gpu"),
                   SIMCUDA_CAPACITY=f"{SIM_CAPACITY_MIB}m")
    return env


def memory(d):
    """The GPU's memory (used, free) in MiB as NVML says, or the simulated device's (that of the
    run in folder `d`)."""
    if SIM:
        try:
            with open(os.path.join(d, "sim.gpu"), "rb") as f:
                b = f.read()
            used = int.from_bytes(b[256 * 8:257 * 8], "little") >> 20
        except FileNotFoundError:
            used = 0
        return used, SIM_CAPACITY_MIB - used
    r = subprocess.run(["nvidia-smi", "-i", GPU, "--query-gpu=memory.used,memory.free",
                        "--format=csv,noheader,nounits"], capture_output=True, text=True)
    used, free = (int(x) for x in r.stdout.strip().splitlines()[0].split(","))
    return used, free


def used_mib(d):
    return memory(d)[0]


def pid_mib(pid):
    """NVML's memory of one process (MiB; 0 where it lists none, as in some containers)."""
    if SIM:
        return None
    r = subprocess.run(["nvidia-smi", "-i", GPU, "--query-compute-apps=pid,used_memory",
                        "--format=csv,noheader,nounits"], capture_output=True, text=True)
    for line in r.stdout.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid):
            try:
                return int(parts[1])
            except ValueError:
                return None
    return 0


class Sampler:
    """The GPU's memory in use every 0.25 s (an nvidia-smi each) while it runs."""

    def __init__(self, out):
        self.out, self.samples, self.stop_at = out, [], threading.Event()
        self.t0 = time.perf_counter()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop_at.is_set():
            try:
                used, free = memory(self.out)
                self.samples.append([round(time.perf_counter() - self.t0, 2), used, free])
            except Exception:  # a failed reading is left out
                pass
            self.stop_at.wait(0.25)

    def stop(self):
        self.stop_at.set()
        self.thread.join(timeout=10)
        return self.samples


class Proc:
    """A process speaking JSON lines on its stdout; its stderr to `log`. Its lines are read by a
    thread, so that a wait for one never misses a line already read."""

    def __init__(self, cmd, env, log_path, cgroup=None):
        self.log = open(log_path, "w")
        self.p = subprocess.Popen(cmd, env=env, text=True, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=self.log)
        if cgroup:
            with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                f.write(str(self.p.pid))
        self.lines = queue.Queue()
        threading.Thread(target=self.read, daemon=True).start()

    def read(self):
        for line in self.p.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def line(self, timeout=LINE_TIMEOUT_S):
        """The process's next JSON line; none in time, or an end, is an error."""
        try:
            l = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"process {self.p.pid} did not answer within {timeout} s")
        if l is None:
            self.p.wait()
            raise RuntimeError(f"process {self.p.pid} ended (exit {self.p.returncode})")
        try:
            return json.loads(l)
        except json.JSONDecodeError:
            raise RuntimeError(f"process {self.p.pid} said {l.strip()!r}")

    def send(self, what):
        self.p.stdin.write(what + "\n")
        self.p.stdin.flush()

    def close(self):
        """Closes its stdin: the tenants free their memory and exit."""
        try:
            self.p.stdin.close()
        except OSError:
            pass

    def alive(self):
        return self.p.poll() is None

    def wait(self, timeout):
        try:
            return self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self):
        """Ends it: its stdin closed (it frees its memory and exits), killed after 5 s (a
        process still frozen cannot exit by itself)."""
        self.close()
        if self.wait(5) is None:
            self.p.kill()
            self.p.wait()
        self.log.close()


def model(sock):
    """The daemon's model (JSON) from its socket: for sequencing and the record, never the
    verdict."""
    return json.loads(daemon_snapshot.read(sock))


def container_in(snap, cid):
    for c in snap.get("containers") or []:
        if c.get("container_id") == cid:
            return c
    return None


def tenant_env(limiter, region, extra=()):
    env = dict(os.environ, LD_PRELOAD=limiter, CUDA_DEVICE_MEMORY_SHARED_CACHE=region,
               LIBCUDA_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES=GPU, CUDA_DEVICE_ORDER="PCI_BUS_ID")
    for k in ("VGPU_OOM_WAIT", "VGPU_FREEZE_AFTER", "CUDA_DEVICE_MEMORY_LIMIT"):
        env.pop(k, None)
    env.update(extra)
    if SIM:
        env.update(VGPU_CONTEXT_BYTES="0", VGPU_REAL_LIBCUDA=sim_paths()[1])
    return env


def mib(b):
    return round(b / (1 << 20), 1)


def one(agent, limiter, out, cg_root, run):
    """One run ("on" or "control"): the record, with its goals and `ok`."""
    on = run == "on"
    d = os.path.join(out, run)
    os.makedirs(d, exist_ok=True)
    sock = os.path.join(d, "agent.sock")
    r = {"run": run, "freeze_on_demand": f"{IDLE_S}s" if on else None,
         "oom_wait": f"{WAIT_S}s", "a_mib": A_MIB, "reserve_mib": RESERVE_MIB}
    ids = {k: ((run + k).encode().hex() + "0" * 64)[:64] for k in ("a", "b")}
    r["containers"] = ids
    cgs = {k: os.path.join(cg_root, "docker", ids[k]) for k in ids}
    for cg in cgs.values():
        os.makedirs(cg)
    regions = {k: os.path.join(d, f"{k}.region") for k in ids}
    for p in list(regions.values()) + [v + ".ctl" for v in regions.values()]:
        if os.path.exists(p):
            os.remove(p)
    denv = sim_env(d, {k: v for k, v in os.environ.items()
                         if k not in ("VGPU_FREEZE_ON_DEMAND", "VGPU_FREEZE_AFTER", "LD_PRELOAD")})
    dcmd = [agent, "run", "--socket", sock, "--region-dir", d, "--metrics-listen", "off",
            # Room for A's bytes as the limiter counts them (its context too).
            "--freeze-host-budget", f"{2 * A_MIB + 4096}m"]
    if on:
        dcmd += ["--freeze-on-demand", f"{IDLE_S}s"]
    if SIM:
        dcmd += ["--checkpoint-libcuda", sim_paths()[1], "--no-nvml"]
    r["daemon_cmd"] = " ".join(dcmd)
    daemon_log = os.path.join(d, "daemon.log")
    with open(daemon_log, "w") as dlog:
        daemon = subprocess.Popen(dcmd, stdout=dlog, stderr=subprocess.STDOUT, env=denv)
    a = b = filler = sampler = None
    try:
        for _ in range(600):
            if os.path.exists(sock) or daemon.poll() is not None:
                break
            time.sleep(0.1)
        if not os.path.exists(sock):
            raise RuntimeError(f"the daemon did not serve its socket (exit {daemon.poll()})")
        u0 = used_mib(d)
        r["idle_used_mib"] = u0

        # A: holds its pattern, then makes no CUDA call.
        if SIM:
            exe, lib = sim_paths()
            a = Proc([exe, "--lib", lib, "pattern", "--bytes", f"{A_MIB}m"],
                     sim_env(d, tenant_env(limiter, regions["a"])),
                     os.path.join(d, "a.log"), cgs["a"])
        else:
            a = Proc([sys.executable, "-c", TENANT_A, str(A_MIB)],
                     tenant_env(limiter, regions["a"]), os.path.join(d, "a.log"), cgs["a"])
            a.send("go")
        first = a.line()
        if first.get("result") != 0:
            raise RuntimeError(f"A did not start: {first}")
        a_pid = a.p.pid
        ua = used_mib(d)
        a_held = ua - u0
        r["a_held_mib"] = a_held
        r["a_pid_mib_held"] = pid_mib(a_pid)

        # The filler: all but RESERVE MiB.
        if SIM:
            used, free = memory(d)
            filler = Proc([exe, "--lib", lib, "pattern", "--bytes",
                           f"{max(free - RESERVE_MIB, 1)}m"],
                          sim_env(d, {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}),
                          os.path.join(d, "filler.log"))
        else:
            fenv = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
            fenv.update(CUDA_VISIBLE_DEVICES=GPU, CUDA_DEVICE_ORDER="PCI_BUS_ID")
            filler = Proc([sys.executable, "-c", FILL, str(RESERVE_MIB)], fenv,
                          os.path.join(d, "filler.log"))
        fl = filler.line()
        if fl.get("result") != 0:
            raise RuntimeError(f"the filler did not start: {fl}")
        uf = used_mib(d)
        filler_mib = uf - ua
        r["filler_mib"] = filler_mib

        # B: its context (on the GPU; the simulated B starts at its allocation).
        b_env = tenant_env(limiter, regions["b"], {"VGPU_OOM_WAIT": f"{WAIT_S}s"})
        if not SIM:
            b = Proc([sys.executable, "-c", TENANT_B], b_env, os.path.join(d, "b.log"), cgs["b"])
            b.send("go")
            ready = b.line()
            if not ready.get("ready"):
                raise RuntimeError(f"B did not start: {ready}")
            r["b_mem_get_info_mib"] = [mib(ready["free"]), mib(ready["total"])]
        ub = used_mib(d)
        b_ctx = ub - uf
        r["b_context_mib"] = b_ctx

        # A idle, as the daemon sees it: from its first snapshot showing A.
        deadline = time.monotonic() + 60
        while True:
            try:
                if container_in(model(sock), ids["a"]):
                    break
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the daemon's model did not show container A within 60 s")
            time.sleep(0.2)
        time.sleep(IDLE_S + 2)

        # B's allocation: more than is free, less than is free without A.
        used_at_ask, free_at_ask = memory(d)
        ask_mib = free_at_ask + a_held // 2
        r.update(used_at_ask_mib=used_at_ask, free_at_ask_mib=free_at_ask, b_ask_mib=ask_mib)
        sampler = Sampler(d)
        t = time.perf_counter()
        if SIM:
            b = Proc([exe, "--lib", lib, "pattern", "--bytes", f"{ask_mib}m"], sim_env(d, b_env),
                     os.path.join(d, "b.log"), cgs["b"])
        else:
            b.send(f"alloc {ask_mib << 20}")
        got = b.line(timeout=WAIT_S + 60)
        b_elapsed = time.perf_counter() - t
        samples = sampler.stop()
        sampler = None
        r["b_result"] = got.get("result")
        r["b_waited_s"] = got.get("waited_s", round(b_elapsed, 3))
        r["b_written"] = got.get("written", True if SIM and got.get("result") == 0 else None)
        r["wait_samples"] = samples
        u_got = used_mib(d)
        r["used_when_b_answered_mib"] = u_got
        # Beside the verdict: what the agent's model says of A now (its next snapshot or two).
        r["agent_model_a_frozen_bytes"] = None
        for _ in range(3 if on else 1):
            try:
                c = container_in(model(sock), ids["a"]) or {}
                r["agent_model_a_frozen_bytes"] = (c.get("frozen") or {}).get("host_bytes")
            except (OSError, ValueError) as e:
                r["agent_model_a_frozen_bytes"] = f"not read: {e}"
            if r["agent_model_a_frozen_bytes"] is not None:
                break
            time.sleep(1)

        # B frees and leaves.
        b.close()
        if got.get("result") == 0:
            try:
                r["b_freed"] = b.line(timeout=60).get("freed")
            except RuntimeError as e:
                r["b_freed"] = f"no answer: {e}"
        r["b_exit"] = b.wait(30)
        # B's memory goes with its process, shortly after its exit: A's use is what is left
        # beside the filler (at most 5 s for B's to go; A makes no call meanwhile).
        for _ in range(10 if on else 2):
            time.sleep(0.5)
            u_gone = used_mib(d)
            a_on_gpu = u_gone - u0 - filler_mib
            if a_on_gpu <= (1 - GIVEN_BACK_MIN) * a_held:
                break
        r["a_on_gpu_after_b_mib"] = a_on_gpu
        r["a_pid_mib_after_b"] = pid_mib(a_pid)
        if on:
            r["given_back"] = round((a_held - a_on_gpu) / a_held, 4) if a_held > 0 else 0.0
        else:
            # Through B's wait (B's context beside A and the filler) and after it.
            during = [s[1] - u0 - filler_mib - b_ctx for s in samples]
            lowest = min(during + [a_on_gpu])
            r["a_lowest_on_gpu_mib"] = lowest
            r["kept"] = round(lowest / a_held, 4) if a_held > 0 else 0.0

        # A's signal: its next call thaws it if frozen, then its check.
        r["a_alive_before_signal"] = a.alive()
        t = time.perf_counter()
        a.send("check")
        # A thaw of 16 GiB takes ~4 s (docs/oversubscription.md); one that never comes is a miss
        # found within a minute.
        checking = a.line(timeout=60)
        v = a.line(timeout=60)
        r["a_answer_s"] = round(time.perf_counter() - t, 3)
        r["a_checking"] = checking.get("checking")
        r["a_result"] = v.get("result")
        r["a_corrupted"] = v.get("corrupted")
        r["a_first_call_s"] = v.get("first_call_s", r["a_answer_s"])
        r["a_check_s"] = v.get("check_s")
        r["a_first_call_ok"] = v.get("first_call_ok", True)
        r["a_on_gpu_after_check_mib"] = used_mib(d) - u0 - filler_mib
        r["a_alive_after_check"] = a.alive()
    except Exception as e:  # a run that cannot go on is a miss, said as such
        r["error"] = f"{type(e).__name__}: {e}"
    finally:
        if sampler:
            sampler.stop()
        for p in (b, a, filler):
            if p:
                p.stop()
        daemon.terminate()
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        for cg in cgs.values():
            rmdir_when_empty(cg)
    # The GPU back to its idle use once everything stopped (the killed processes' memory, a
    # frozen one's included).
    if "idle_used_mib" in r:
        end = None
        for _ in range(40):
            end = used_mib(d)
            if end <= r["idle_used_mib"] + END_SLACK_MIB:
                break
            time.sleep(0.5)
        r["end_used_mib"] = end
        r["back_to_idle"] = end is not None and end <= r["idle_used_mib"] + END_SLACK_MIB
    # The agent's own words (for diagnosis only).
    try:
        with open(daemon_log) as f:
            log = f.read()
        r["agent_log_froze_a_for_memory"] = any(
            f"container {ids['a']}: frozen" in l and "for memory" in l for l in log.splitlines())
        r["agent_log_thawed_a"] = f"container {ids['a']}: thawed at its next CUDA call" in log
    except OSError:
        pass
    r["goals"] = goals(r, on)
    r["ok"] = "error" not in r and all(r["goals"].values())
    return r


def goals(r, on):
    """Each goal of the run and whether it was met (the referee's figures only)."""
    g = {
        "gpu_had_less_free_than_b_asked": r.get("free_at_ask_mib") is not None
        and r.get("b_ask_mib", 0) > r["free_at_ask_mib"],
        "a_alive_and_answered": bool(r.get("a_alive_before_signal"))
        and r.get("a_checking") is True and r.get("a_result") == 0
        and r.get("a_first_call_ok") is True,
        "a_0_corrupted_words": r.get("a_corrupted") == 0,
        "gpu_back_to_idle": bool(r.get("back_to_idle")),
    }
    if on:
        g["b_allocation_succeeded_within_its_wait"] = (
            r.get("b_result") == 0 and r.get("b_written") is True
            and (r.get("b_waited_s") or 0) < WAIT_S)
        g["a_memory_given_back_while_frozen"] = r.get("given_back", 0) >= GIVEN_BACK_MIN
    else:
        g["b_out_of_memory_after_its_wait"] = (
            r.get("b_result") == CUDA_ERROR_OUT_OF_MEMORY
            and (r.get("b_waited_s") or 0) >= 0.95 * WAIT_S)
        g["a_kept_its_memory"] = r.get("kept", 0) >= KEPT_MIN
    return g


def say(r):
    """One line for a run."""
    head = (f"{r['run']} ({'--freeze-on-demand ' + r['freeze_on_demand'] if r['freeze_on_demand'] else 'no --freeze-on-demand'}, "
            f"VGPU_OOM_WAIT={r['oom_wait']})")
    if "a_held_mib" not in r:
        return f"{head}: ERROR {r.get('error')} -> MISS"
    parts = [f"A held {r['a_held_mib']} MiB"]
    if "b_ask_mib" in r:
        parts.append(f"{r['free_at_ask_mib']} MiB free, B asked {r['b_ask_mib']} MiB")
    if "b_result" in r:
        res = ("got it" if r["b_result"] == 0 else
               "out of memory" if r["b_result"] == CUDA_ERROR_OUT_OF_MEMORY else
               f"CUresult {r['b_result']}")
        parts.append(f"B {res} after {r['b_waited_s']} s")
    if "given_back" in r:
        parts.append(f"A off the GPU while frozen: {100 * r['given_back']:.1f}% given back "
                     f"({r['a_held_mib']} -> {r['a_on_gpu_after_b_mib']} MiB)")
    if "kept" in r:
        parts.append(f"A kept {100 * r['kept']:.1f}% on the GPU (lowest "
                     f"{r['a_lowest_on_gpu_mib']} MiB)")
    if "a_corrupted" in r:
        parts.append(f"A's first call {r['a_first_call_s']} s, {r['a_corrupted']} corrupted "
                     f"words")
    if "back_to_idle" in r:
        parts.append(f"GPU {'back to idle' if r['back_to_idle'] else 'NOT back to idle'} "
                     f"({r['idle_used_mib']} -> {r['end_used_mib']} MiB)")
    missed = [k for k, v in r["goals"].items() if not v]
    tail = "ok" if r["ok"] else "MISS" + (f" ({', '.join(missed)})" if missed else "")
    if "error" in r:
        tail += f"; ERROR {r['error']}"
    return f"{head}: " + "; ".join(parts) + f" -> {tail}"


def host_memory_mib():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) >> 10
    except OSError:
        pass
    return None


def main():
    agent, limiter, out = (os.path.abspath(a) for a in sys.argv[1:4])
    os.makedirs(out, exist_ok=True)
    # A time limit's SIGTERM unwinds through the clean-up (a frozen A or the filler left
    # running would hold the GPU for the checks after this one).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    root = cgroup2_root()
    cg_root = os.path.join(root or "/sys/fs/cgroup", f"vgpu-fod-{os.getpid()}")
    try:
        if root is None:
            raise OSError("no cgroup v2 mount")
        os.makedirs(os.path.join(cg_root, "docker"))
    except OSError as e:
        line = f"BLOCKED: cannot make a cgroup here ({e}); a container needs one"
        print(line)
        with open(os.path.join(out, "freeze-on-demand.txt"), "w") as f:
            f.write(line + "\n")
        return 2
    settings = {"sim": SIM, "gpu": GPU, "a_mib": A_MIB, "reserve_mib": RESERVE_MIB,
                "idle_s": IDLE_S, "wait_s": WAIT_S, "host_mem_available_mib": host_memory_mib()}
    print(json.dumps(settings), flush=True)
    results, lines = [], []
    try:
        for run in RUNS:
            r = one(agent, limiter, out, cg_root, run)
            results.append(r)
            lines.append(say(r))
            print(lines[-1], flush=True)
    finally:
        rmdir_when_empty(os.path.join(cg_root, "docker"))
        rmdir_when_empty(cg_root)
    verdict = "PASS" if results and all(r["ok"] for r in results) else "FAIL"
    lines.append(
        f"verdict: {verdict} (with --freeze-on-demand: B's allocation of more than the GPU had "
        f"free succeeds within VGPU_OOM_WAIT, idle A is off the GPU (>= 95%) and thaws at its "
        f"next call with 0 corrupted words; without: B gets out-of-memory after its wait and A "
        f"keeps its memory; NVML's figures, the GPU back to idle)")
    with open(os.path.join(out, "freeze-on-demand.json"), "w") as f:
        json.dump({"settings": settings, "results": results, "verdict": verdict}, f, indent=1)
    with open(os.path.join(out, "freeze-on-demand.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(lines[-1])
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())

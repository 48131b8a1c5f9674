#!/usr/bin/env python3
"""Freeze a container and thaw it at its next CUDA call, per framework (called by
validate-freeze-frameworks.sh).

Usage: validate_freeze_frameworks.py VGPU_AGENT LIMITER_SO OUT

Runs `vgpu-agent run` (its thaw watcher thaws a frozen container at its next CUDA call). Each
tenant in FREEZE_TENANTS (default "torch,jax,cupy,torch-2proc"; also `torch-expandable`:
PyTorch with `expandable_segments:True`) is a container of its own: a
docker-like cgroup (`vgpu-freeze-<pid>/docker/<id>` in the cgroup v2 hierarchy) and a region, with one
process (two for `*-2proc`) under the limiter holding FREEZE_MIB (default 1024) MiB of a
pattern.
For each: `vgpu-agent freeze --container ID` (timed), the device memory it gave back (the GPU's
memory in use before and while frozen, or the simulated device's), then each process is asked to
check its pattern: its first CUDA call thaws the container (the time to its answer is the thaw
as the application sees it), and it counts corrupted words.
Each process checks once before the freeze (a first use's cost, such as CuPy compiling its
comparison kernel, is paid there) and again after the first check that thawed it (nothing
frozen): the thaw is the first check's time after the freeze less the next one's. The freeze's path (the driver's checkpoint API, or the limiter's in-process path when
the tenants run with VGPU_FREEZE_IN_PROCESS=1) is read from `vgpu-agent freeze`'s output.
Verdict per tenant: the freeze succeeded, at least 95% of its memory given back (or, with
FREEZE_KEEP_MIB=N, at most N MiB per process left on the GPU: what the in-process path keeps, its
CUDA context and small allocations), every process answered with 0 corrupted words.
FREEZE_POOL=SIZE (e.g. 18g) runs the daemon with `--freeze-pool SIZE` (docs/oversubscription.md,
"The host pool") and its socket named to the tenants, waits until the pool is populated, and
reports for each tenant whether its freeze used the pool (its limiter's log says "the agent's
pool").
FREEZE_LINK=1 also times a pinned copy of FREEZE_MIB each way on the same GPU (best of 3), the
link the freeze and the thaw are compared with. Writes OUT/freeze-frameworks.{json,txt}; exit status 1 on a
miss, 2 if cgroups cannot be made here (BLOCKED).

SIM=1 runs the same with the simulated driver instead of a GPU (tenants `sim`, `sim-2proc`:
`cuda-exercise pattern`; SIM_BIN names the folder with cuda-exercise and libsimcuda.so), which
checks this script without a GPU.

Every tenant speaks one protocol on its stdin and stdout (as `cuda-exercise pattern` does): a
JSON line {"result": 0} when it holds its pattern; on "check": {"checking": true}, then
{"result": 0, "corrupted": N}.
"""

import json
import os
import re
import select
import shutil
import subprocess
import sys
import time

MIB = int(os.environ.get("FREEZE_MIB", "1024"))
KEEP_MIB = int(os.environ.get("FREEZE_KEEP_MIB", "0"))
SIM = os.environ.get("SIM") == "1"
DEFAULT = "sim,sim-2proc" if SIM else "torch,jax,cupy,torch-2proc"
TENANTS = os.environ.get("FREEZE_TENANTS", DEFAULT).split(",")
POOL = os.environ.get("FREEZE_POOL", "")
# How long the daemon may take to populate its pool (about 0.2-0.6 s per GiB on an H200 host).
POOL_READY_TIMEOUT_S = 240
# How long a tenant may take to answer (start-up, or a check whose first call thaws it).
LINE_TIMEOUT_S = 120

PROTOCOL = r"""
def serve(make, check):
    import json, sys
    make()
    print(json.dumps({"result": 0}), flush=True)
    for line in sys.stdin:
        if line.strip() == "check":
            print(json.dumps({"checking": True}), flush=True)
            print(json.dumps({"result": 0, "corrupted": int(check())}), flush=True)
"""

TORCH = PROTOCOL + r"""
import sys, torch
words = (int(sys.argv[1]) << 20) // 8
def pattern():
    x = torch.arange(words, device="cuda", dtype=torch.int64)
    return x.mul_(2654435761).remainder_(1 << 31)
held = {}
def make():
    held["x"] = pattern(); torch.cuda.synchronize()
def check():
    bad = int((held["x"] != pattern()).sum().item()); torch.cuda.synchronize()
    # The comparison's temporaries go back to the driver: the tenant holds its pattern alone.
    torch.cuda.empty_cache()
    return bad
serve(make, check)
"""

JAX = PROTOCOL + r"""
import os, sys
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import jax, jax.numpy as jnp
jax.config.update("jax_enable_x64", True)
words = (int(sys.argv[1]) << 20) // 8
def pattern():
    return (jnp.arange(words, dtype=jnp.int64) * 2654435761) % (1 << 31)
held = {}
def make():
    held["x"] = pattern().block_until_ready()
def check():
    return int(jnp.sum(held["x"] != pattern()))
serve(make, check)
"""

CUPY = PROTOCOL + r"""
import sys, cupy
words = (int(sys.argv[1]) << 20) // 8
def pattern():
    return (cupy.arange(words, dtype=cupy.int64) * 2654435761) % (1 << 31)
held = {}
def make():
    held["x"] = pattern(); cupy.cuda.Device().synchronize()
def check():
    bad = int((held["x"] != pattern()).sum())
    # The comparison's temporaries go back to the driver: the tenant holds its pattern alone.
    cupy.get_default_memory_pool().free_all_blocks()
    return bad
serve(make, check)
"""

CODE = {"torch": TORCH, "jax": JAX, "cupy": CUPY,
        # PyTorch's caching allocator on the virtual memory API (cuMemCreate + cuMemMap), as
        # JAX's default allocator is.
        "torch-expandable": TORCH}
ENV = {"torch-expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}}


SIM_LIB = None


def sim_paths():
    """cuda-exercise, and the simulated driver copied as `libcuda.so.1` (what `freeze` and the
    agent look for in a process's maps)."""
    global SIM_LIB
    b = os.environ.get("SIM_BIN", ".carry/bin")
    if SIM_LIB is None:
        d = os.path.abspath(os.path.join(os.environ.get("OUT", "/tmp"), "simlib"))
        os.makedirs(d, exist_ok=True)
        SIM_LIB = os.path.join(d, "libcuda.so.1")
        shutil.copy(os.path.join(b, "libsimcuda.so"), SIM_LIB)
    return os.path.abspath(os.path.join(b, "cuda-exercise")), SIM_LIB


def cgroup2_root():
    """Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup` on most hosts)."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if right.startswith("cgroup2 "):
                return left.split(" ")[4]
    return None


def rmdir_when_empty(path):
    """Removes a cgroup directory once its processes have left it (at most 5 s)."""
    for _ in range(50):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)


def sim_env(out, env):
    """The simulated device's environment (every process that uses it, the agent's too)."""
    if SIM:
        env.update(SIMCUDA_SHARED_DEVICE=os.path.join(out, "sim.gpu"),
                   SIMCUDA_CAPACITY=f"{4 * MIB + 1024}m")
    return env


def used_mib(out):
    """The GPU's memory in use (MiB), or the simulated device's charged bytes (MiB)."""
    if SIM:
        try:
            with open(os.path.join(out, "sim.gpu"), "rb") as f:
                b = f.read()
        except FileNotFoundError:
            return 0
        return int.from_bytes(b[256 * 8:257 * 8], "little") >> 20
    r = subprocess.run(["nvidia-smi", "-i", os.environ.get("CUDA_VISIBLE_DEVICES", "0"),
                        "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                       capture_output=True, text=True)
    return int(r.stdout.split()[0])


class Proc:
    def __init__(self, cmd, env, log):
        self.p = subprocess.Popen(cmd, env=env, text=True, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=log)

    def line(self, timeout=LINE_TIMEOUT_S):
        """The process's next JSON line; a process that does not answer in time is a miss."""
        ready, _, _ = select.select([self.p.stdout], [], [], timeout)
        if not ready:
            raise RuntimeError(f"process {self.p.pid} did not answer within {timeout} s")
        l = self.p.stdout.readline()
        if not l:
            raise RuntimeError(f"process {self.p.pid} ended (exit {self.p.poll()})")
        return json.loads(l)

    def send(self, what):
        self.p.stdin.write(what + "\n")
        self.p.stdin.flush()

    def stop(self):
        self.p.kill()
        self.p.wait()


def tenant_cmd(kind, mib):
    if kind.startswith("sim"):
        exe, lib = sim_paths()
        return [exe, "--lib", lib, "pattern", "--bytes", f"{mib}m"]
    return [sys.executable, "-c", CODE[kind], str(mib)]


def one(agent, limiter, out, cg_root, name):
    kind = name.removesuffix("-2proc")
    n = 2 if name.endswith("-2proc") else 1
    cid = (name.encode().hex() + "0" * 64)[:64]
    cg = os.path.join(cg_root, "docker", cid)
    os.makedirs(cg)
    region = os.path.join(out, f"{name}.region")
    env = dict(os.environ, LD_PRELOAD=limiter, CUDA_DEVICE_MEMORY_SHARED_CACHE=region,
               LIBCUDA_LOG_LEVEL="3")
    # One GPU per container, as a shared node gives it: a JAX process that sees two GPUs opens
    # a context on each, and the driver's restore of such a process failed (CUDA error 304 on
    # two H200s, driver 580.159.04, 2026-11-28).
    env.setdefault("CUDA_VISIBLE_DEVICES", "0")
    env.update(ENV.get(kind, {}))
    if POOL:
        env["VGPU_FREEZE_POOL_SOCKET"] = os.path.join(out, "pool", "freeze-pool.sock")
    if SIM:
        sim_env(out, env)
        env.update(VGPU_CONTEXT_BYTES="0", VGPU_REAL_LIBCUDA=sim_paths()[1])
    idle = used_mib(out)
    procs = []
    try:
        for i in range(n):
            log = open(os.path.join(out, f"{name}-{i}.log"), "w")
            p = Proc(tenant_cmd(kind, MIB), env, log)
            with open(os.path.join(cg, "cgroup.procs"), "w") as f:
                f.write(str(p.p.pid))
            procs.append(p)
        for p in procs:
            first = p.line()
            if first.get("result") != 0:
                raise RuntimeError(f"{name}: tenant did not start: {first}")
        # A check before the freeze, so that the one after it does not also pay for a first
        # use (CuPy compiles its comparison kernel at its first check: seconds).
        for p in procs:
            p.send("check")
            p.line()
            if p.line().get("corrupted") != 0:
                raise RuntimeError(f"{name}: the pattern is wrong before the freeze")
        held = used_mib(out) - idle
        t = time.perf_counter()
        fr = subprocess.run([agent, "freeze", "--container", cid] +
                            (["--libcuda", sim_paths()[1]] if SIM else []),
                            capture_output=True, text=True, env=sim_env(out, dict(os.environ)))
        freeze_s = time.perf_counter() - t
        time.sleep(1)
        frozen = used_mib(out) - idle
        answers = []
        for p in procs:
            t = time.perf_counter()
            p.send("check")
            checking = p.line()
            v = p.line()
            first_s = time.perf_counter() - t
            t = time.perf_counter()
            p.send("check")
            p.line()
            again = p.line()
            check_s = time.perf_counter() - t
            answers.append({"first_check_s": round(first_s, 3), "check_s": round(check_s, 3),
                            "thaw_s": round(first_s - check_s, 3),
                            "checking": checking.get("checking"), "result": v.get("result"),
                            "corrupted": v.get("corrupted"),
                            "corrupted_again": again.get("corrupted")})
    finally:
        for p in procs:
            p.stop()
        rmdir_when_empty(cg)
    given_back = (held - frozen) / held if held > 0 else 0.0
    kept_ok = given_back >= 0.95 or (KEEP_MIB > 0 and frozen <= KEEP_MIB * n)
    ok = (fr.returncode == 0 and kept_ok
          and all(a["result"] == 0 and a["corrupted"] == 0 and a["corrupted_again"] == 0
                  for a in answers))
    if "freezing through the driver" in fr.stdout:
        path = "driver (the in-process freeze did not complete)"
    elif "frozen in-process" in fr.stdout:
        path = "in-process"
    else:
        path = "driver"
    pooled, own_ms = [], []
    for i in range(n):
        try:
            with open(os.path.join(out, f"{name}-{i}.log")) as f:
                log = f.read()
        except OSError:
            log = ""
        pooled.append("the agent's pool" in log)
        # The limiter's own time, from the mark seen to its answer ("frozen in-process: N bytes
        # moved to host memory in X ms").
        m = re.search(r"frozen in-process: \d+ bytes moved to host memory in (\d+) ms", log)
        own_ms.append(int(m.group(1)) if m else None)
    return {"tenant": name, "pool": all(pooled) if pooled else False, "limiter_freeze_ms": own_ms, "processes": n, "mib_each": MIB, "held_mib": held,
            "frozen_mib": frozen, "given_back": round(given_back, 4), "path": path,
            "freeze_s": round(freeze_s, 3), "freeze_out": fr.stdout + fr.stderr,
            "answers": answers, "ok": ok}


def pool_ready(sock):
    """Waits until the daemon's model says its freeze pool holds its target populated."""
    import socket
    deadline = time.monotonic() + POOL_READY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            c = socket.socket(socket.AF_UNIX)
            c.connect(sock)
            data = b""
            while chunk := c.recv(1 << 20):
                data += chunk
            c.close()
            pool = json.loads(data)["agent"].get("freeze_pool") or {}
            if pool.get("size_bytes") and pool.get("ready_bytes", 0) >= pool["size_bytes"]:
                return True
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.5)
    return False


def pinned_link():
    """A pinned copy of MIB each way on this GPU, best of 3 (validate_freeze.py's)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from validate_freeze import LINK
    r = subprocess.run([sys.executable, "-c", LINK.replace("<< 30", "<< 20"), str(MIB)],
                       capture_output=True, text=True)
    d2h, h2d = (float(x) for x in r.stdout.split())
    return {"pinned_d2h_s": round(d2h, 3), "pinned_h2d_s": round(h2d, 3)}


def main():
    agent, limiter, out = (os.path.abspath(a) for a in sys.argv[1:4])
    os.makedirs(out, exist_ok=True)
    root = cgroup2_root()
    cg_root = os.path.join(root or "/sys/fs/cgroup", f"vgpu-freeze-{os.getpid()}")
    try:
        if root is None:
            raise OSError("no cgroup v2 mount")
        os.makedirs(os.path.join(cg_root, "docker"))
    except OSError as e:
        line = f"BLOCKED: cannot make a cgroup here ({e}); a container needs one"
        print(line)
        with open(os.path.join(out, "freeze-frameworks.txt"), "w") as f:
            f.write(line + "\n")
        return 2
    sock = os.path.join(out, "agent.sock")
    daemon_cmd = [agent, "run", "--socket", sock, "--region-dir", out, "--metrics-listen", "off"]
    if SIM:
        daemon_cmd += ["--checkpoint-libcuda", sim_paths()[1], "--no-nvml"]
    if POOL:
        daemon_cmd += ["--freeze-pool", POOL, "--freeze-host-budget", POOL,
                       "--freeze-pool-socket", os.path.join(out, "pool", "freeze-pool.sock")]
    daemon = subprocess.Popen(daemon_cmd, stdout=open(os.path.join(out, "daemon.log"), "w"),
                              stderr=subprocess.STDOUT, env=sim_env(out, dict(os.environ)))
    results, lines = [], []
    try:
        for _ in range(300):
            if os.path.exists(sock):
                break
            time.sleep(0.1)
        if POOL:
            t = time.perf_counter()
            ready = pool_ready(sock)
            lines.append(f"freeze pool {POOL}: " + (f"populated in {time.perf_counter() - t:.1f} s"
                                                    if ready else "NOT populated in time"))
            print(lines[-1], flush=True)
        for name in TENANTS:
            try:
                r = one(agent, limiter, out, cg_root, name)
            except Exception as e:  # a tenant that cannot run is a miss, said as such
                r = {"tenant": name, "ok": False, "error": str(e)}
            results.append(r)
            if "error" in r:
                lines.append(f"{name}: ERROR {r['error']} -> MISS")
            else:
                lines.append(
                    f"{name}: {r['processes']} process(es) x {MIB} MiB, {r['path']} path"
                    f"{' (the agent pool)' if r['pool'] else ''}; freeze "
                    f"{r['freeze_s']} s (the limiter's own: {r['limiter_freeze_ms']} ms), given back {100 * r['given_back']:.1f}% ({r['held_mib']} -> "
                    f"{r['frozen_mib']} MiB); thawed at the next call: "
                    + ", ".join(f"{a['thaw_s']} s (first check {a['first_check_s']} s, next "
                                f"{a['check_s']} s), {a['corrupted']} corrupted"
                                for a in r["answers"])
                    + f" -> {'ok' if r['ok'] else 'MISS'}")
            print(lines[-1], flush=True)
    finally:
        daemon.terminate()
        daemon.wait()
        rmdir_when_empty(os.path.join(cg_root, "docker"))
        rmdir_when_empty(cg_root)
    link = None
    if os.environ.get("FREEZE_LINK") == "1" and not SIM:
        try:
            link = pinned_link()
            lines.append(f"pinned copy of {MIB} MiB: to host {link['pinned_d2h_s']} s, to the GPU "
                         f"{link['pinned_h2d_s']} s")
        except Exception as e:  # the reference is reported missing, the verdict stands
            lines.append(f"pinned copy: not measured ({e})")
        print(lines[-1], flush=True)
    verdict = "PASS" if results and all(r["ok"] for r in results) else "FAIL"
    kept = f"at most {KEEP_MIB} MiB per process left" if KEEP_MIB else ">= 95% given back"
    lines.append(f"verdict: {verdict} (frozen by container, {kept}, thawed by the "
                 "next CUDA call with 0 corrupted words)")
    with open(os.path.join(out, "freeze-frameworks.json"), "w") as f:
        json.dump({"results": results, "link": link, "verdict": verdict}, f, indent=1)
    with open(os.path.join(out, "freeze-frameworks.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(lines[-1])
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())

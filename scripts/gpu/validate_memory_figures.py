#!/usr/bin/env python3
"""Free memory after initialisation against the bytes then allocatable (called by
validate-memory-figures.sh).

Usage: validate_memory_figures.py LIMITER_SO OUT

One process per case (framework x chunk size x limiter/native), which prints one JSON line:
`free` (right after initialisation), `total`, `allocatable` (chunks allocated until the
framework's out-of-memory error, each kept alive) and `chunks`.

Allowed slack between free and allocatable under the limiter (the verdict; native is reference):
- CuPy: one chunk (the memory pool asks the driver for each chunk as it is: 2 or 20 MiB).
- PyTorch: 20 MiB, the caching allocator's segment for requests between 1 and 10 MiB (a 2 MiB
  chunk may need a fresh 20 MiB segment that no longer fits), else one chunk.
- JAX with XLA_PYTHON_CLIENT_ALLOCATOR=platform (each array its own driver allocation): one chunk
  plus 2 MiB (XLA's own small buffers made at first use). JAX's default BFC allocator grows in
  regions of doubling size, so its allocatable figure is reported but not judged.
Writes OUT/memory-figures.json and OUT/memory-figures.txt.
"""

import json
import os
import statistics
import subprocess
import sys

MIB = 1 << 20
LIMIT = "4g"
ROUNDS = 2

CHILD = r"""
import json, sys, os
fw, chunk = sys.argv[1], int(sys.argv[2])
MIB = 1 << 20
keep = []
if fw == "torch":
    import torch
    torch.cuda.init()
    torch.zeros(1, device="cuda")  # the context, as a first operation makes it
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    while True:
        try:
            keep.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
        except torch.cuda.OutOfMemoryError:
            break
elif fw == "cupy":
    import cupy as cp
    cp.cuda.Device(0).use()
    cp.zeros(1)
    free, total = cp.cuda.runtime.memGetInfo()
    while True:
        try:
            keep.append(cp.empty(chunk, dtype=cp.uint8))
        except cp.cuda.memory.OutOfMemoryError:
            break
elif fw.startswith("jax"):
    import ctypes
    import jax, jax.numpy as jnp
    x = jnp.zeros(1); x.block_until_ready()
    cuda = ctypes.CDLL("libcuda.so.1")
    ctx = ctypes.c_void_p()
    # JAX's threads hold its context; this thread retains the same primary context to ask.
    cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0)
    cuda.cuCtxSetCurrent(ctx)
    f, t = ctypes.c_size_t(), ctypes.c_size_t()
    r = cuda.cuMemGetInfo_v2(ctypes.byref(f), ctypes.byref(t))
    if r != 0:
        raise SystemExit(f"cuMemGetInfo_v2: {r}")
    free, total = f.value, t.value
    while True:
        try:
            a = jnp.empty((chunk,), dtype=jnp.uint8)
            a.block_until_ready()
            keep.append(a)
        except Exception as e:  # XlaRuntimeError: RESOURCE_EXHAUSTED
            if "RESOURCE_EXHAUSTED" not in str(e) and "out of memory" not in str(e).lower():
                raise
            break
print(json.dumps({"free": free, "total": total, "allocatable": len(keep) * chunk,
                  "chunks": len(keep)}), flush=True)
"""


def slack(fw, chunk):
    if fw == "cupy":
        return chunk
    if fw == "torch":
        return max(20 * MIB, chunk)
    if fw == "jax-platform":
        return chunk + 2 * MIB
    return None  # jax-bfc: reported only


def available(fw):
    mod = "jax" if fw.startswith("jax") else fw
    return subprocess.run([sys.executable, "-c", f"import {mod}"], capture_output=True).returncode == 0


def case(limiter, out, fw, chunk, limited, tag):
    env = dict(os.environ)
    for k in ("LD_PRELOAD", "CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_MEMORY_SHARED_CACHE"):
        env.pop(k, None)
    env["CUDA_VISIBLE_DEVICES"] = env.get("CUDA_VISIBLE_DEVICES", "0")
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    if fw == "jax-platform":
        env["XLA_PYTHON_CLIENT_ALLOCATOR"] = "platform"
    if limited:
        region = os.path.join(out, "regions", f"{tag}.region")
        os.makedirs(os.path.dirname(region), exist_ok=True)
        for p in (region, region + ".ctl"):
            if os.path.exists(p):
                os.remove(p)
        env.update(LD_PRELOAD=limiter, CUDA_DEVICE_MEMORY_LIMIT=LIMIT,
                   CUDA_DEVICE_MEMORY_SHARED_CACHE=region)
    with open(os.path.join(out, tag + ".log"), "w") as log:
        try:
            r = subprocess.run([sys.executable, "-c", CHILD, fw, str(chunk)], env=env,
                               stdout=subprocess.PIPE, stderr=log, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            return {"error": "timeout"}
    lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
    if r.returncode != 0 or not lines:
        return {"error": f"exit {r.returncode}; see {tag}.log"}
    return json.loads(lines[-1])


def main():
    limiter, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    frameworks = [fw for fw in ("torch", "jax-platform", "jax-bfc", "cupy") if available(fw)]
    cases = [(fw, chunk, True) for fw in frameworks for chunk in (2 * MIB, 20 * MIB)]
    cases += [(fw, 20 * MIB, False) for fw in frameworks]
    results = {}
    for r in range(ROUNDS):
        order = cases if r % 2 == 0 else list(reversed(cases))
        for fw, chunk, limited in order:
            key = f"{fw}-{chunk // MIB}MiB-{'limited' if limited else 'native'}"
            res = case(limiter, out, fw, chunk, limited, f"r{r}-{key}")
            res["round"] = r
            print(key, json.dumps(res), flush=True)
            results.setdefault(key, {"fw": fw, "chunk": chunk, "limited": limited, "runs": []})
            results[key]["runs"].append(res)
    ok, lines = True, []
    for key, e in results.items():
        good_runs = [x for x in e["runs"] if "error" not in x]
        diffs = [x["free"] - x["allocatable"] for x in good_runs]
        e["free_mib"] = [round(x["free"] / MIB, 1) for x in good_runs]
        e["allocatable_mib"] = [round(x["allocatable"] / MIB, 1) for x in good_runs]
        e["free_minus_allocatable_mib"] = [round(d / MIB, 1) for d in diffs]
        allowed = slack(e["fw"], e["chunk"]) if e["limited"] else None
        e["allowed_slack_mib"] = None if allowed is None else allowed / MIB
        if allowed is None:
            verdict = "reference"
        elif len(good_runs) < len(e["runs"]) or not diffs:
            verdict, ok = "ERROR", False
        else:
            med = statistics.median(diffs)
            # Equal within the slack either way: a framework may hold a few bytes at the moment
            # it reads free memory (CuPy: 512 B) that it gives back before the allocation loop.
            good = all(abs(d) <= allowed for d in diffs)
            verdict = "ok" if good else "MISS"
            ok &= good
            e["median_diff_mib"] = round(med / MIB, 1)
        e["verdict"] = verdict
        lines.append(f"{key}: free {e['free_mib']} MiB, allocatable {e['allocatable_mib']} MiB, "
                     f"free - allocatable {e['free_minus_allocatable_mib']} MiB "
                     f"(allowed {e['allowed_slack_mib']}) -> {verdict}")
    lines.append(f"verdict: {'PASS' if ok else 'FAIL'} (limit {LIMIT}; frameworks {frameworks})")
    with open(os.path.join(out, "memory-figures.json"), "w") as f:
        json.dump({"limit": LIMIT, "rounds": ROUNDS, "cases": results,
                   "verdict": "PASS" if ok else "FAIL"}, f, indent=1)
    with open(os.path.join(out, "memory-figures.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

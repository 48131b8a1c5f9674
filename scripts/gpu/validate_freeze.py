#!/usr/bin/env python3
"""Freeze and thaw of a tenant on a GPU, against the host link (called by validate-freeze.sh).

Usage: validate_freeze.py VGPU_AGENT LIMITER_SO OUT

For each size in FREEZE_SIZES_GIB (default "4,16"):
- the host link: a pinned copy of that many bytes device-to-host and back (torch, best of 3);
- a tenant (PyTorch under the limiter, its own region) holds the bytes filled with a pattern;
  `vgpu-agent freeze --pid` (the driver's checkpoint API) and, after 2 s, `thaw --pid` are
  timed; the GPU memory the tenant gave back is read from
  `nvidia-smi --query-compute-apps` before and while frozen; after the thaw the tenant checks
  its pattern word for word.
Verdict per size: 0 corrupted words, at least 95% of its memory given back, and freeze and thaw
each within 2x the pinned copy (the issue's goal: the driver's path is expected to miss it, which
the verdict then says). Writes OUT/freeze.json and OUT/freeze.txt; exit status 1 on a miss.
"""

import json
import os
import subprocess
import sys
import time

SIZES = [int(x) for x in os.environ.get("FREEZE_SIZES_GIB", "4,16").split(",")]

TENANT = r"""
import sys, torch
n = int(sys.argv[1]) << 30
words = n // 8
# The pattern is made and checked 128 Mi words (1 GiB) at a time, so that the tenant holds little
# more than its n bytes (a 48 GiB tenant must not need 48 GiB more to check itself).
step = 1 << 27
def pattern(i, j):
    return torch.arange(i, j, device="cuda", dtype=torch.int64).mul_(2654435761).remainder_(1 << 31)
x = torch.empty(words, device="cuda", dtype=torch.int64)
for i in range(0, words, step):
    x[i:i + step] = pattern(i, min(i + step, words))
torch.cuda.synchronize()
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "check":
        bad = 0
        for i in range(0, words, step):
            j = min(i + step, words)
            bad += int((x[i:j] != pattern(i, j)).sum().item())
        torch.cuda.synchronize()
        print("corrupt", bad, flush=True)
"""

LINK = r"""
import sys, time, torch
n = int(sys.argv[1]) << 30
d = torch.empty(n, dtype=torch.uint8, device="cuda")
h = torch.empty(n, dtype=torch.uint8).pin_memory()
best = [1e9, 1e9]
for _ in range(3):
    torch.cuda.synchronize(); t = time.perf_counter(); h.copy_(d); torch.cuda.synchronize()
    best[0] = min(best[0], time.perf_counter() - t)
    t = time.perf_counter(); d.copy_(h); torch.cuda.synchronize()
    best[1] = min(best[1], time.perf_counter() - t)
print(best[0], best[1])
"""


def gpu_used_mib(pid):
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True, text=True).stdout
    for line in out.splitlines():
        p, m = [x.strip() for x in line.split(",")]
        if p == str(pid):
            return int(m)
    return 0


def device_used_mib():
    """GPU 0's memory in use (where nvidia-smi lists no processes, as in some containers)."""
    out = subprocess.run(
        ["nvidia-smi", "-i", "0", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True, text=True).stdout
    try:
        return int(out.split()[0])
    except (IndexError, ValueError):
        return 0


def timed(cmd):
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    return time.perf_counter() - t, r


def one(agent, limiter, out, gib):
    link = subprocess.run([sys.executable, "-c", LINK, str(gib)], capture_output=True, text=True)
    d2h, h2d = (float(x) for x in link.stdout.split())
    region = os.path.join(out, f"freeze-{gib}g.region")
    for p in (region, region + ".ctl"):
        if os.path.exists(p):
            os.remove(p)
    env = dict(os.environ, LD_PRELOAD=limiter, CUDA_DEVICE_MEMORY_SHARED_CACHE=region,
               LIBCUDA_LOG_LEVEL="3")
    log = open(os.path.join(out, f"tenant-{gib}g.log"), "w")
    idle = device_used_mib()
    t = subprocess.Popen([sys.executable, "-c", TENANT, str(gib)], env=env, text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
    try:
        if not t.stdout.readline().startswith("ready"):
            raise RuntimeError(f"tenant {gib} GiB did not start")
        before = gpu_used_mib(t.pid)
        dev_before = device_used_mib() - idle
        # A host process: named by pid (the driver's checkpoint API, no control-block mark).
        freeze_s, fr = timed([agent, "freeze", "--pid", str(t.pid)])
        time.sleep(2)
        frozen = gpu_used_mib(t.pid)
        dev_frozen = device_used_mib() - idle
        thaw_s, th = timed([agent, "thaw", "--pid", str(t.pid)])
        t.stdin.write("check\n")
        t.stdin.flush()
        line = t.stdout.readline().split()
        corrupt = int(line[1]) if len(line) == 2 else None
    finally:
        t.kill()
        t.wait()
    if not before:
        # nvidia-smi lists no process of this pid namespace: the device's use above idle.
        before, frozen = dev_before, max(dev_frozen, 0)
    given_back = (before - frozen) / before if before else 0.0
    ok = (corrupt == 0 and given_back >= 0.95 and freeze_s <= 2 * d2h and thaw_s <= 2 * h2d)
    return {"gib": gib, "pinned_d2h_s": round(d2h, 3), "pinned_h2d_s": round(h2d, 3),
            "freeze_s": round(freeze_s, 3), "thaw_s": round(thaw_s, 3),
            "gpu_mib_before": before, "gpu_mib_frozen": frozen,
            "given_back": round(given_back, 4), "corrupted_words": corrupt,
            "freeze_out": fr.stdout + fr.stderr, "thaw_out": th.stdout + th.stderr, "ok": ok}


FILL = r"""
import sys, torch
free, _ = torch.cuda.mem_get_info()
x = torch.empty(max(free - (int(sys.argv[1]) << 20), 0), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.read()
"""


def no_room(agent, limiter, out, gib=4):
    """A thaw that finds no room, then one after the room is back: does the process thaw intact?

    The driver's restore needs room for the process's memory; docs/oversubscription.md says a
    thaw without room fails and keeps the memory, and a later one finishes it. A driver on which
    a restore that failed for lack of room leaves the process unrestorable
    (NVIDIA/cuda-checkpoint#44, reported on 580.95.05) fails this check.
    """
    region = os.path.join(out, "no-room.region")
    env = dict(os.environ, LD_PRELOAD=limiter, CUDA_DEVICE_MEMORY_SHARED_CACHE=region,
               LIBCUDA_LOG_LEVEL="3")
    log = open(os.path.join(out, "no-room-tenant.log"), "w")
    t = subprocess.Popen([sys.executable, "-c", TENANT, str(gib)], env=env, text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
    fill = None
    r = {"gib": gib}
    try:
        if not t.stdout.readline().startswith("ready"):
            raise RuntimeError("tenant did not start")
        _, fr = timed([agent, "freeze", "--pid", str(t.pid)])
        r["freeze_rc"] = fr.returncode
        # Everything but 1 GiB taken by another process: the restore of 4 GiB cannot fit.
        fill = subprocess.Popen([sys.executable, "-c", FILL, "1024"], text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        if not fill.stdout.readline().startswith("ready"):
            raise RuntimeError("filler did not start")
        _, th1 = timed([agent, "thaw", "--pid", str(t.pid)])
        r["thaw_without_room_rc"] = th1.returncode
        r["thaw_without_room_out"] = th1.stdout + th1.stderr
        fill.kill()
        fill.wait()
        time.sleep(1)
        thaw_s, th2 = timed([agent, "thaw", "--pid", str(t.pid)])
        r["thaw_after_room_rc"] = th2.returncode
        r["thaw_after_room_out"] = th2.stdout + th2.stderr
        r["thaw_after_room_s"] = round(thaw_s, 3)
        if th2.returncode == 0:
            t.stdin.write("check\n")
            t.stdin.flush()
            line = t.stdout.readline().split()
            r["corrupted_words"] = int(line[1]) if len(line) == 2 else None
    finally:
        if fill:
            fill.kill()
        t.kill()
        t.wait()
    r["ok"] = (r.get("thaw_without_room_rc") != 0 and r.get("thaw_after_room_rc") == 0
               and r.get("corrupted_words") == 0)
    return r


def main():
    agent, limiter, out = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(out, exist_ok=True)
    if os.environ.get("FREEZE_NO_ROOM") == "1":
        r = no_room(agent, limiter, out)
        verdict = "PASS" if r["ok"] else "FAIL"
        r["verdict"] = verdict
        with open(os.path.join(out, "no-room.json"), "w") as f:
            json.dump(r, f, indent=1)
        print(json.dumps(r, indent=1))
        print(f"verdict: {verdict} (a thaw without room fails and keeps the memory; the next one, "
              "with room, thaws with 0 corrupted words)")
        return 0 if r["ok"] else 1
    results, lines = [], []
    for gib in SIZES:
        r = one(agent, limiter, out, gib)
        results.append(r)
        lines.append(
            f"{gib} GiB: freeze {r['freeze_s']} s (pinned D2H {r['pinned_d2h_s']} s), thaw "
            f"{r['thaw_s']} s (pinned H2D {r['pinned_h2d_s']} s), given back "
            f"{100 * r['given_back']:.1f}% ({r['gpu_mib_before']} -> {r['gpu_mib_frozen']} MiB), "
            f"corrupted words {r['corrupted_words']} -> {'ok' if r['ok'] else 'MISS'}")
        print(lines[-1], flush=True)
    verdict = "PASS" if all(r["ok"] for r in results) else "FAIL"
    lines.append(f"verdict: {verdict} (0 corrupted, >= 95% given back, each within 2x the "
                 "pinned copy)")
    with open(os.path.join(out, "freeze.json"), "w") as f:
        json.dump({"results": results, "verdict": verdict}, f, indent=1)
    with open(os.path.join(out, "freeze.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(lines[-1])
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())

"""Per-device memory limits on a real GPU machine (scripts/gpu/two-gpu.sh): one PyTorch process
under the limiter with CUDA_DEVICE_MEMORY_LIMIT_<d> set differently per device allocates 64 MiB
blocks on each device in turn until out-of-memory, holds them, and is compared per device with
nvidia-smi's per-process memory, the region (limiter_region.py) and `vgpu-agent stat --json`.
Then two processes of one container (one region), one per device, do the same.
Usage: validate_device_limits.py LIMITER_SO AGENT OUT DEVICES LIMITS_MIB
(e.g. 0,1 3072,5120). Prints PASS/FAIL per check and exits 1 on a failure."""
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import limiter_region  # noqa: E402

MIB = 1 << 20
BLOCK = 64 * MIB
limiter, agent, out_dir = sys.argv[1:4]
devices = [int(d) for d in sys.argv[4].split(",")]
limits = {d: int(m) * MIB for d, m in zip(devices, sys.argv[5].split(","))}
ok = True

WORKER = r"""
import json, os, sys, torch
got = {}
for d in [int(x) for x in sys.argv[1].split(",")]:
    blocks, err = [], None
    while True:
        try:
            blocks.append(torch.empty(%d, dtype=torch.uint8, device=f"cuda:{d}"))
        except torch.cuda.OutOfMemoryError as e:
            err = type(e).__name__
            break
    free, total = torch.cuda.mem_get_info(d)
    got[d] = {"got": sum(b.numel() for b in blocks), "error": err, "mem_get_info": [free, total]}
    globals().setdefault("held", []).append(blocks)
print(json.dumps({"pid": os.getpid(), "devices": got}), flush=True)
sys.stdin.readline()
""" % BLOCK


def check(what, good, detail):
    global ok
    ok &= bool(good)
    print(f"{'PASS' if good else 'FAIL'}: {what}: {detail}", flush=True)


def nvml_per_device():
    """{(pid, device index): used bytes} from nvidia-smi."""
    q = lambda args: subprocess.run(["nvidia-smi", *args, "--format=csv,noheader,nounits"],
                                    capture_output=True, text=True).stdout.splitlines()
    index = {}
    for line in q(["--query-gpu=index,uuid"]):
        i, uuid = [p.strip() for p in line.split(",")]
        index[uuid] = int(i)
    used = {}
    for line in q(["--query-compute-apps=pid,gpu_uuid,used_memory"]):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[1] in index:
            used[(int(parts[0]), index[parts[1]])] = int(parts[2]) * MIB
    return used


def start(region, devs):
    env = dict(os.environ, LD_PRELOAD=limiter, CUDA_DEVICE_MEMORY_SHARED_CACHE=region, PYTHONUNBUFFERED="1")
    env.pop("CUDA_DEVICE_MEMORY_LIMIT", None)
    for d, lim in limits.items():
        env[f"CUDA_DEVICE_MEMORY_LIMIT_{d}"] = str(lim)
    p = subprocess.Popen([sys.executable, "-c", WORKER, ",".join(map(str, devs))], env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    return p, json.loads(line) if line else {}


def judge(tag, region_dir, region, procs):
    time.sleep(1.0)  # nvidia-smi's sampling
    used = nvml_per_device()
    reg = limiter_region.read(region)
    stat = subprocess.run([agent, "stat", "--json", "--duration", "1s", "--no-daemon", "--region-dir", region_dir],
                          capture_output=True, text=True)
    with open(os.path.join(out_dir, f"device-limits-{tag}.stat.json"), "w") as f:
        f.write(stat.stdout or stat.stderr)
    try:
        report = json.loads(stat.stdout)
    except json.JSONDecodeError:
        report = {"processes": [], "containers": []}
    record = {"nvml": {f"{p}/{d}": b for (p, d), b in used.items()}, "region": reg, "workers": [w for _, w in procs]}
    with open(os.path.join(out_dir, f"device-limits-{tag}.json"), "w") as f:
        json.dump(record, f, indent=1)
    for d, lim in limits.items():
        on_d = [(w["pid"], w["devices"][str(d)]) for _, w in procs if str(d) in w["devices"]]
        smi = sum(used.get((pid, d), 0) for pid, _ in on_d)
        got = sum(x["got"] for _, x in on_d)
        refused = all(x["error"] for _, x in on_d)
        reserved = reg["devices"][d]["reserved"] if d < len(reg["devices"]) else None
        limit_in_region = reg["devices"][d]["limit"] if d < len(reg["devices"]) else None
        print(f"{tag} GPU{d}: limit {lim // MIB} MiB; allocated {got // MIB} MiB by pids {[p for p, _ in on_d]}; "
              f"nvidia-smi {smi // MIB} MiB; region reserved {(reserved or 0) // MIB} MiB (limit {(limit_in_region or 0) // MIB} MiB)")
        check(f"{tag} GPU{d}: the region holds this device's own limit", limit_in_region == lim, limit_in_region)
        check(f"{tag} GPU{d}: PyTorch refused with OutOfMemoryError", refused and got > 0, [x["error"] for _, x in on_d])
        check(f"{tag} GPU{d}: torch.cuda.mem_get_info({d}) says this device's limit",
              all(x["mem_get_info"][1] == lim for _, x in on_d), [x["mem_get_info"] for _, x in on_d])
        check(f"{tag} GPU{d}: region within the limit", reserved is not None and reserved <= lim, reserved)
        check(f"{tag} GPU{d}: nvidia-smi within the limit", 0 < smi <= lim, smi)
        check(f"{tag} GPU{d}: nvidia-smi agrees with the region (256 MiB or 10%)",
              reserved is not None and abs(smi - reserved) <= max(256 * MIB, reserved // 10), (smi, reserved))
        shown = [m for c in report.get("containers", []) for m in c.get("memory_by_device", []) if m["device"] == d]
        check(f"{tag} GPU{d}: stat --json shows the container's memory on this device",
              any(m.get("limiter") == reserved for m in shown), shown)


def run(tag, groups):
    tmp = tempfile.mkdtemp(prefix=f"devlimits-{tag}-", dir="/dev/shm")
    region = os.path.join(tmp, "container.cache")
    procs = [start(region, g) for g in groups]
    try:
        judge(tag, tmp, region, procs)
    finally:
        for p, _ in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
            p.wait(timeout=120)
    after = limiter_region.read(region)
    check(f"{tag}: exit returned everything", all(d["reserved"] == 0 for d in after["devices"]) and not after["slots"],
          [d["reserved"] for d in after["devices"][: len(limits)]])
    subprocess.run(["rm", "-rf", tmp])


run("one-process", [devices])
if len(devices) > 1:
    run("process-per-device", [[d] for d in devices])
print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)

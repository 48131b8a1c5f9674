"""A 1-GPU torch.distributed (backend nccl) workload whose NCCL calls are known, for validating the
agent's NCCL probes.

Usage: nccl_one_gpu.py READY GO DONE OUT.json

Warms up CUDA (no process group yet; libnccl.so.2 is already mapped by torch), checks that the
process maps a libnccl, creates READY and waits for GO (the agent attaches meanwhile). Then, inside
the agent's window: init_process_group (world size 1, rank 0, tcp://127.0.0.1:$MASTER_PORT,
default 29500, with device_id so the communicator is created at once by ncclCommInitRankConfig),
ALL_REDUCE x all_reduce, ALL_GATHER x all_gather_into_tensor and BROADCAST x broadcast of a 1 MiB
float32 tensor, a synchronize. Writes what it did to OUT.json (calls, bytes per call = count x
dtype size), creates DONE and sleeps until killed, keeping the process group alive, so that
teardown calls stay out of the window.
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist

ready, go, done, out = sys.argv[1:5]
ALL_REDUCE, ALL_GATHER, BROADCAST = 50, 20, 10
ELEMENTS = 1 << 18  # float32: 1 MiB
DTYPE_SIZE = 4

dev = torch.device("cuda", 0)
torch.cuda.set_device(dev)
x = torch.ones(ELEMENTS, dtype=torch.float32, device=dev)
gathered = torch.empty(ELEMENTS, dtype=torch.float32, device=dev)  # world size 1
torch.cuda.synchronize()

nccl_maps = sorted(
    {line.split()[-1] for line in open("/proc/self/maps") if "/libnccl.so" in line}
)
if not nccl_maps:
    sys.exit("no libnccl.so mapped after importing torch: the agent could not find it before GO")

open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.01)

t0 = time.time()
dist.init_process_group(
    backend="nccl",
    init_method=f"tcp://127.0.0.1:{os.environ.get('MASTER_PORT', '29500')}",
    world_size=1,
    rank=0,
    device_id=dev,
)
t_init = time.time()
for _ in range(ALL_REDUCE):
    dist.all_reduce(x)
for _ in range(ALL_GATHER):
    dist.all_gather_into_tensor(gathered, x)
for _ in range(BROADCAST):
    dist.broadcast(x, src=0)
torch.cuda.synchronize()
t1 = time.time()

per_call = ELEMENTS * DTYPE_SIZE
json.dump(
    {
        "pid": os.getpid(),
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "device": torch.cuda.get_device_name(0),
        "libnccl_mapped": nccl_maps,
        "world_size": 1,
        "rank": 0,
        # API -> what the probes should count. broadcast goes through ncclBcast, which NCCL
        # implements with ncclBroadcast (the probed symbol).
        "collectives": {
            "ncclAllReduce": {"calls": ALL_REDUCE, "bytes_per_call": per_call},
            "ncclAllGather": {"calls": ALL_GATHER, "bytes_per_call": per_call},
            "ncclBroadcast": {"calls": BROADCAST, "bytes_per_call": per_call},
        },
        "init_seconds": t_init - t0,
        "collective_seconds": t1 - t_init,
    },
    open(out, "w"),
    indent=1,
)
open(done, "w").close()
time.sleep(600)

"""Each rank of a torchrun job issues known NCCL collectives, for checking what `vgpu-agent stat`
and `top` show per rank (scripts/gpu/two-gpu.sh).

Usage: torchrun --standalone --nproc_per_node=N nccl_ranks.py DIR

Every rank warms CUDA up (no process group yet; torch has libnccl.so.2 mapped already), creates
DIR/ready-RANK and waits for DIR/go (the agent attaches meanwhile). Then, inside the agent's
window: init_process_group (backend nccl, with device_id, so the communicator is created at once
by ncclCommInitRankConfig), ALL_REDUCE x all_reduce of 1 MiB of float32, a synchronize; no
barrier (it would add an all_reduce). Writes what it issued to DIR/rank-RANK.json, creates
DIR/done-RANK and waits for DIR/stop, so that teardown stays out of the window.
Run with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT to have NCCL print each rank's commId.
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist

out = sys.argv[1]
ALL_REDUCE = int(os.environ.get("ALL_REDUCE", 200))
ELEMENTS = 1 << 18  # float32: 1 MiB
DTYPE_SIZE = 4
rank = int(os.environ["RANK"])
local = int(os.environ["LOCAL_RANK"])
world = int(os.environ["WORLD_SIZE"])

dev = torch.device("cuda", local)
torch.cuda.set_device(dev)
x = torch.ones(ELEMENTS, dtype=torch.float32, device=dev)
torch.cuda.synchronize()
nccl_maps = sorted({l.split()[-1] for l in open("/proc/self/maps") if "/libnccl.so" in l})
if not nccl_maps:
    sys.exit("no libnccl.so mapped after importing torch: the agent could not find it before go")


def wait(path, what):
    t0 = time.time()
    while not os.path.exists(path):
        if time.time() - t0 > 600:
            sys.exit(f"rank {rank}: {what} never came")
        time.sleep(0.01)


open(os.path.join(out, f"ready-{rank}"), "w").close()
wait(os.path.join(out, "go"), "go")
dist.init_process_group(backend="nccl", device_id=dev)
for _ in range(ALL_REDUCE):
    dist.all_reduce(x)
torch.cuda.synchronize()
json.dump(
    {
        "pid": os.getpid(),
        "rank": rank,
        "world_size": world,
        "device": local,
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "libnccl_mapped": nccl_maps,
        "collectives": {"ncclAllReduce": {"calls": ALL_REDUCE, "bytes_per_call": ELEMENTS * DTYPE_SIZE}},
    },
    open(os.path.join(out, f"rank-{rank}.json"), "w"),
)
open(os.path.join(out, f"done-{rank}"), "w").close()
wait(os.path.join(out, "stop"), "stop")
dist.destroy_process_group()

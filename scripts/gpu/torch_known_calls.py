"""A PyTorch workload whose CUDA driver calls are known, for validating `vgpu-agent stat`.

Usage: torch_known_calls.py READY GO DONE OUT.json

Warms up first (CUDA init, cuBLAS, one of each operation, empty cache), creates READY, waits for
GO (the agent attaches meanwhile), then does the known phase, writes what it did and what PyTorch
itself counted to OUT.json, creates DONE and sleeps until killed (so that exit-time calls stay out
of the agent's window).
"""
import json
import os
import sys
import time

import torch

ready, go, done, out = sys.argv[1:5]
N = 100
dev = torch.device("cuda")

a = torch.randn(1024, 1024, device=dev)
b = a @ a
src = torch.ones(1 << 18, device=dev)  # 1 MiB on the device, kept
host = torch.ones(1 << 18)  # 1 MiB pageable host memory
_ = src.cpu()
_ = host.to(dev)
torch.cuda.synchronize()
del a, b, _
torch.cuda.empty_cache()
torch.cuda.synchronize()

def stats():
    s = torch.cuda.memory_stats()
    return {
        "device_allocs": s.get("num_device_alloc", s.get("segment.all.allocated")),
        "device_frees": s.get("num_device_free", s.get("segment.all.freed")),
        "reserved": torch.cuda.memory_reserved(),
    }

before = stats()
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.01)

t0 = time.time()
for _ in range(N):
    torch.cuda.synchronize()  # cudaDeviceSynchronize -> cuCtxSynchronize
for _ in range(N):
    x = src.cpu()  # pageable D2H: cudaMemcpyAsync + cudaStreamSynchronize
for _ in range(N):
    y = host.to(dev)  # pageable H2D: cudaMemcpyAsync + cudaStreamSynchronize
del y
bufs = [torch.empty((64 << 20) + i * (2 << 20), dtype=torch.uint8, device=dev) for i in range(20)]
keep = bufs[:10]
del bufs
torch.cuda.empty_cache()  # frees the 10 dropped segments (and the H2D staging segment)
t1 = time.time()
after = stats()

json.dump(
    {
        "pid": os.getpid(),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "n": N,
        "before": before,
        "after": after,
        "device_allocs": after["device_allocs"] - before["device_allocs"],
        "device_frees": after["device_frees"] - before["device_frees"],
        "reserved_delta": after["reserved"] - before["reserved"],
        "kept_bytes": sum(t.numel() for t in keep),
        "seconds": t1 - t0,
    },
    open(out, "w"),
    indent=1,
)
open(done, "w").close()
time.sleep(600)

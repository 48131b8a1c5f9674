"""One limiter validation case, run under LD_PRELOAD=libvgpu_limiter.so by validate_limiter.py.
Usage: limiter_cases.py CASE. Allocates 64 MiB blocks until the framework reports out-of-memory,
prints {"phase": "holding", "got": bytes, ...}, waits for a line on stdin, releases everything
(empty_cache / free_all_blocks / del), allocates 256 MiB again, prints {"phase": "done", ...}."""
import json
import os
import sys

BLOCK = 64 << 20
case = sys.argv[1]


def say(**kw):
    print(json.dumps(dict(pid=os.getpid(), case=case, **kw)), flush=True)


def hold_then(release, again):
    sys.stdin.readline()
    release()
    try:
        again()
        say(phase="done", again_ok=True)
    except Exception as e:  # noqa: BLE001 - reported, the harness decides
        say(phase="done", again_ok=False, error=repr(e))


def torch_case():
    import torch
    blocks, err = [], None
    while True:
        try:
            blocks.append(torch.empty(BLOCK, dtype=torch.uint8, device="cuda"))
        except torch.cuda.OutOfMemoryError as e:
            err = type(e).__name__
            break
    free, total = torch.cuda.mem_get_info()
    say(phase="holding", got=len(blocks) * BLOCK, error=err, mem_get_info=[free, total])

    def release():
        blocks.clear()
        torch.cuda.empty_cache()
    hold_then(release, lambda: torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))


def cupy_case(async_pool):
    import cupy
    if async_pool:
        pool = cupy.cuda.MemoryAsyncPool()
    else:
        pool = cupy.cuda.MemoryPool()
    cupy.cuda.set_allocator(pool.malloc)
    blocks, err = [], None
    while True:
        try:
            blocks.append(cupy.empty(BLOCK, dtype=cupy.uint8))
        except cupy.cuda.memory.OutOfMemoryError as e:
            err = type(e).__name__
            break
    cupy.cuda.Device().synchronize()
    say(phase="holding", got=len(blocks) * BLOCK, error=err,
        mem_get_info=list(cupy.cuda.runtime.memGetInfo()))

    def release():
        blocks.clear()
        cupy.cuda.Device().synchronize()
        pool.free_all_blocks()
    hold_then(release, lambda: cupy.empty(256 << 20, dtype=cupy.uint8))


def jax_case():
    import jax
    import jax.numpy as jnp
    dev = jax.devices()[0]
    stats = dev.memory_stats() or {}
    blocks, err = [], None
    while True:
        try:
            blocks.append(jnp.zeros(BLOCK, dtype=jnp.uint8).block_until_ready())
        except Exception as e:  # XlaRuntimeError RESOURCE_EXHAUSTED
            err = type(e).__name__ + ": " + str(e).splitlines()[0][:160]
            break
    say(phase="holding", got=len(blocks) * BLOCK, error=err, bytes_limit=stats.get("bytes_limit"))

    def release():
        blocks.clear()
    hold_then(release, lambda: jnp.zeros(256 << 20, dtype=jnp.uint8).block_until_ready())


def ctypes_case():
    import ctypes
    cu = ctypes.CDLL("libcuda.so.1")
    ctx, dev = ctypes.c_void_p(), ctypes.c_int()
    assert cu.cuInit(0) == 0
    assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert cu.cuCtxSetCurrent(ctx) == 0
    ptrs, r = [], 0
    while True:
        p = ctypes.c_uint64()
        r = cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(BLOCK))
        if r != 0:
            break
        ptrs.append(p.value)
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
    say(phase="holding", got=len(ptrs) * BLOCK, error=f"CUresult {r}", mem_get_info=[free.value, total.value])

    def release():
        for p in ptrs:
            cu.cuMemFree_v2(ctypes.c_uint64(p))
        ptrs.clear()

    def again():
        p = ctypes.c_uint64()
        r = cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(256 << 20))
        if r != 0:
            raise RuntimeError(f"cuMemAlloc_v2 -> {r}")
    hold_then(release, again)


{
    "torch": torch_case,
    "torch-expandable": torch_case,
    "cupy": lambda: cupy_case(False),
    "cupy-async": lambda: cupy_case(True),
    "jax": jax_case,
    "ctypes": ctypes_case,
}[case]()

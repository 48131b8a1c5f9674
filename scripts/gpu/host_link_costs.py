#!/usr/bin/env python3
"""What moving a tenant's device memory to host memory and back costs on this host, piece by piece.

The freeze goal (docs/oversubscription.md) is "within 2x of a pinned copy of the same size". A
pinned copy assumes pinned host memory that already exists; a freeze must first get that host
memory. This measures each piece with the driver API alone (ctypes on libcuda, no framework), so
the in-process freeze's design rests on figures from the same host:

- the pinned copy itself, both ways (the link: the goal's reference);
- pinning host memory: one cuMemHostAlloc of the whole size, chunks of CHUNK_MIB from 1, 4 and 8
  threads (ctypes releases the GIL, so the threads' calls overlap in the driver);
- the freeze pipeline: threads pin chunks while one stream copies each pinned chunk as soon as it
  exists (what an in-process freeze does), and the same into memory pinned beforehand;
- a pageable copy into fresh and into touched memory (the driver stages it itself);
- the virtual memory API: cuMemCreate + cuMemMap + cuMemSetAccess of the whole size in
  granularity-sized or 1 GiB physical pieces, and cuMemUnmap + cuMemRelease back;
- host memory obtained without the driver and registered afterwards: anonymous memory (with or
  without transparent huge pages, `madvise(MADV_HUGEPAGE)`), populated by 1 or 8 threads
  (`madvise(MADV_POPULATE_WRITE)` on slices), then `cuMemHostRegister` of the whole or of
  CHUNK_MIB slices from 8 threads, then the copy: whether pinning's cost is the page faults
  (huge pages cut them 512-fold) or the registration itself.

PIECES (comma-separated names) restricts a run to those pieces.

Usage: python3 host_link_costs.py [GIB] (default 16). Writes one JSON object to stdout and a table
to stderr. The verdict (exit 1) fails if a measured copy moved less than it was asked to, so a
broken measurement never reads as a figure.
"""
import ctypes as C
import json
import mmap
import os
import sys
import threading
import time

GIB = 1 << 30
MIB = 1 << 20
CHUNK_MIB = int(os.environ.get("CHUNK_MIB", "256"))
SIZE_GIB = int(sys.argv[1]) if len(sys.argv) > 1 else 16
ROUNDS = int(os.environ.get("ROUNDS", "2"))

cu = C.CDLL("libcuda.so.1")
u64 = C.c_uint64


def ok(r, what):
    if r != 0:
        raise RuntimeError(f"{what}: CUresult {r}")


ok(cu.cuInit(0), "cuInit")
dev = C.c_int()
ok(cu.cuDeviceGet(C.byref(dev), int(os.environ.get("DEVICE", "0"))), "cuDeviceGet")
ctx = C.c_void_p()
ok(cu.cuDevicePrimaryCtxRetain(C.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


def bind():
    ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


def sync():
    ok(cu.cuCtxSynchronize(), "cuCtxSynchronize")


size = SIZE_GIB * GIB
chunk = CHUNK_MIB * MIB
chunks = size // chunk
dptr = u64()
ok(cu.cuMemAlloc_v2(C.byref(dptr), C.c_size_t(size)), "cuMemAlloc_v2")
ok(cu.cuMemsetD8_v2(dptr, 0x5A, C.c_size_t(size)), "cuMemsetD8")
sync()
stream = C.c_void_p()
ok(cu.cuStreamCreate(C.byref(stream), 1), "cuStreamCreate")


def host_alloc(n):
    p = C.c_void_p()
    ok(cu.cuMemHostAlloc(C.byref(p), C.c_size_t(n), 0), "cuMemHostAlloc")
    return p.value


def host_free(p):
    ok(cu.cuMemFreeHost(C.c_void_p(p)), "cuMemFreeHost")


def timed(f):
    t = time.perf_counter()
    r = f()
    return time.perf_counter() - t, r


def pinned_copies():
    h = host_alloc(size)
    try:
        down, _ = timed(lambda: (ok(cu.cuMemcpyDtoH_v2(C.c_void_p(h), dptr, C.c_size_t(size)), "DtoH")))
        up, _ = timed(lambda: (ok(cu.cuMemcpyHtoD_v2(dptr, C.c_void_p(h), C.c_size_t(size)), "HtoD")))
        first = C.cast(C.c_void_p(h), C.POINTER(C.c_uint8))[size - 1]
        if first != 0x5A:
            raise RuntimeError("pinned copy moved the wrong bytes")
    finally:
        free_t, _ = timed(lambda: host_free(h))
    return {"to_host_s": down, "to_gpu_s": up, "free_host_s": free_t}


def pin_whole():
    t, h = timed(lambda: host_alloc(size))
    f, _ = timed(lambda: host_free(h))
    return {"pin_s": t, "free_s": f}


def pin_chunks(threads):
    ptrs = [None] * chunks
    nxt = iter(range(chunks))
    lock = threading.Lock()

    def work():
        bind()
        while True:
            with lock:
                i = next(nxt, None)
            if i is None:
                return
            ptrs[i] = host_alloc(chunk)

    t0 = time.perf_counter()
    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    pin = time.perf_counter() - t0
    f, _ = timed(lambda: [host_free(p) for p in ptrs])
    return {"threads": threads, "pin_s": pin, "free_s": f}


def freeze_pipeline(threads, prepinned):
    """Chunks pinned by `threads` threads while the stream copies each one as soon as it exists."""
    ready = [threading.Event() for _ in range(chunks)]
    ptrs = [None] * chunks
    nxt = iter(range(chunks))
    lock = threading.Lock()
    if prepinned:
        for i in range(chunks):
            ptrs[i] = host_alloc(chunk)
            ready[i].set()

    def work():
        bind()
        while True:
            with lock:
                i = next(nxt, None)
            if i is None:
                return
            ptrs[i] = host_alloc(chunk)
            ready[i].set()

    t0 = time.perf_counter()
    ts = [] if prepinned else [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    for i in range(chunks):
        ready[i].wait()
        ok(cu.cuMemcpyDtoHAsync_v2(C.c_void_p(ptrs[i]), u64(dptr.value + i * chunk), C.c_size_t(chunk), stream), "DtoHAsync")
    ok(cu.cuStreamSynchronize(stream), "sync")
    total = time.perf_counter() - t0
    for t in ts:
        t.join()
    last = C.cast(C.c_void_p(ptrs[-1]), C.POINTER(C.c_uint8))[chunk - 1]
    t1 = time.perf_counter()
    for i in range(chunks):
        ok(cu.cuMemcpyHtoDAsync_v2(u64(dptr.value + i * chunk), C.c_void_p(ptrs[i]), C.c_size_t(chunk), stream), "HtoDAsync")
    ok(cu.cuStreamSynchronize(stream), "sync")
    back = time.perf_counter() - t1
    f, _ = timed(lambda: [host_free(p) for p in ptrs])
    if last != 0x5A:
        raise RuntimeError("pipeline copy moved the wrong bytes")
    return {"threads": threads, "prepinned": prepinned, "to_host_s": total, "to_gpu_s": back, "free_s": f}


def pageable(touched):
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buf = (C.c_char * size).from_buffer(m)
    addr = C.addressof(buf)
    if touched:
        C.memset(addr, 1, size)
    down, _ = timed(lambda: ok(cu.cuMemcpyDtoH_v2(C.c_void_p(addr), dptr, C.c_size_t(size)), "DtoH pageable"))
    up, _ = timed(lambda: ok(cu.cuMemcpyHtoD_v2(dptr, C.c_void_p(addr), C.c_size_t(size)), "HtoD pageable"))
    good = buf[size - 1] == b"\x5a"
    del buf
    m.close()
    if not good:
        raise RuntimeError("pageable copy moved the wrong bytes")
    return {"touched": touched, "to_host_s": down, "to_gpu_s": up}


class Loc(C.Structure):
    _fields_ = [("type", C.c_int), ("id", C.c_int)]


class Prop(C.Structure):
    _fields_ = [("type", C.c_int), ("requestedHandleTypes", C.c_int), ("location", Loc),
                ("win32HandleMetaData", C.c_void_p), ("compressionType", C.c_ubyte),
                ("gpuDirectRDMACapable", C.c_ubyte), ("usage", C.c_ushort), ("reserved", C.c_ubyte * 4)]


class Access(C.Structure):
    _fields_ = [("location", Loc), ("flags", C.c_int)]


def vmm(piece):
    prop = Prop()
    prop.type = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = 1  # CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = dev.value
    gran = C.c_size_t()
    ok(cu.cuMemGetAllocationGranularity(C.byref(gran), C.byref(prop), 0), "granularity")
    piece = piece or gran.value
    va = u64()
    ok(cu.cuMemAddressReserve(C.byref(va), C.c_size_t(size), C.c_size_t(0), u64(0), u64(0)), "reserve")
    acc = Access()
    acc.location.type = 1
    acc.location.id = dev.value
    acc.flags = 3
    handles = []
    t0 = time.perf_counter()
    for off in range(0, size, piece):
        h = u64()
        ok(cu.cuMemCreate(C.byref(h), C.c_size_t(piece), C.byref(prop), u64(0)), "cuMemCreate")
        ok(cu.cuMemMap(u64(va.value + off), C.c_size_t(piece), C.c_size_t(0), h, u64(0)), "cuMemMap")
        handles.append(h)
    ok(cu.cuMemSetAccess(va, C.c_size_t(size), C.byref(acc), C.c_size_t(1)), "cuMemSetAccess")
    create = time.perf_counter() - t0
    t1 = time.perf_counter()
    ok(cu.cuMemUnmap(va, C.c_size_t(size)), "cuMemUnmap")
    for h in handles:
        ok(cu.cuMemRelease(h), "cuMemRelease")
    release = time.perf_counter() - t1
    ok(cu.cuMemAddressFree(va, C.c_size_t(size)), "cuMemAddressFree")
    return {"piece_bytes": piece, "granularity": gran.value, "create_map_s": create, "unmap_release_s": release}


libc = C.CDLL(None, use_errno=True)
libc.mmap.restype = C.c_void_p
libc.mmap.argtypes = [C.c_void_p, C.c_size_t, C.c_int, C.c_int, C.c_int, C.c_long]
libc.munmap.argtypes = [C.c_void_p, C.c_size_t]
libc.madvise.argtypes = [C.c_void_p, C.c_size_t, C.c_int]
MADV_HUGEPAGE = 14
MADV_POPULATE_WRITE = 23
HUGE = 2 * MIB


def registered(huge, populate_threads, register_threads):
    """Anonymous memory, populated by threads, registered with the driver, then the copy."""
    t0 = time.perf_counter()
    raw = libc.mmap(None, size + HUGE, 3, 0x22, -1, 0)  # PROT_READ|WRITE, MAP_PRIVATE|ANONYMOUS
    if raw in (None, C.c_void_p(-1).value):
        raise RuntimeError(f"mmap: errno {C.get_errno()}")
    base = (raw + HUGE - 1) // HUGE * HUGE
    if huge and libc.madvise(base, size, MADV_HUGEPAGE) != 0:
        raise RuntimeError(f"madvise(MADV_HUGEPAGE): errno {C.get_errno()}")
    errors = []

    def populate(lo, hi):
        if libc.madvise(base + lo, hi - lo, MADV_POPULATE_WRITE) != 0:
            errors.append(C.get_errno())

    def split(n):
        step = (size // n + HUGE - 1) // HUGE * HUGE
        return [(lo, min(lo + step, size)) for lo in range(0, size, step)]

    ts = [threading.Thread(target=populate, args=r) for r in split(populate_threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise RuntimeError(f"madvise(MADV_POPULATE_WRITE): errno {errors[0]}")
    populated = time.perf_counter() - t0

    def register(lo, hi):
        bind()
        r = cu.cuMemHostRegister_v2(C.c_void_p(base + lo), C.c_size_t(hi - lo), 0)
        if r != 0:
            errors.append(r)

    pieces = [(0, size)] if register_threads == 1 else [(lo, min(lo + chunk, size)) for lo in range(0, size, chunk)]
    t1 = time.perf_counter()
    queue = iter(pieces)
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                p = next(queue, None)
            if p is None:
                return
            register(*p)

    ts = [threading.Thread(target=worker) for _ in range(register_threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise RuntimeError(f"cuMemHostRegister: CUresult {errors[0]}")
    reg = time.perf_counter() - t1
    down, _ = timed(lambda: ok(cu.cuMemcpyDtoH_v2(C.c_void_p(base), dptr, C.c_size_t(size)), "DtoH registered"))
    up, _ = timed(lambda: ok(cu.cuMemcpyHtoD_v2(dptr, C.c_void_p(base), C.c_size_t(size)), "HtoD registered"))
    good = C.cast(C.c_void_p(base + size - 1), C.POINTER(C.c_uint8))[0] == 0x5A
    t2 = time.perf_counter()
    for lo, _ in pieces:
        ok(cu.cuMemHostUnregister(C.c_void_p(base + lo)), "cuMemHostUnregister")
    libc.munmap(raw, size + HUGE)
    release = time.perf_counter() - t2
    if not good:
        raise RuntimeError("registered copy moved the wrong bytes")
    return {"huge_pages": huge, "populate_threads": populate_threads, "register_threads": register_threads,
            "populate_s": populated, "register_s": reg, "to_host_s": down, "to_gpu_s": up,
            "freeze_s": populated + reg + down, "release_s": release}


def thp_setting():
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return f.read().strip()
    except OSError as e:
        return f"unreadable: {e}"


ONLY = {p for p in os.environ.get("PIECES", "").split(",") if p}
result = {"size_gib": SIZE_GIB, "chunk_mib": CHUNK_MIB, "transparent_hugepage": thp_setting(), "rounds": []}
failed = False
for r in range(ROUNDS):
    rnd = {}
    for name, f in [
        ("pinned_copy", pinned_copies),
        ("pin_whole", pin_whole),
        ("pin_chunks_1", lambda: pin_chunks(1)),
        ("pin_chunks_4", lambda: pin_chunks(4)),
        ("pin_chunks_8", lambda: pin_chunks(8)),
        ("pipeline_4", lambda: freeze_pipeline(4, False)),
        ("pipeline_8", lambda: freeze_pipeline(8, False)),
        ("pipeline_prepinned", lambda: freeze_pipeline(0, True)),
        ("pageable_fresh", lambda: pageable(False)),
        ("pageable_touched", lambda: pageable(True)),
        ("vmm_granularity", lambda: vmm(0)),
        ("vmm_1gib", lambda: vmm(GIB)),
        ("registered_small_1", lambda: registered(False, 1, 1)),
        ("registered_small_8", lambda: registered(False, 8, 8)),
        ("registered_huge_1", lambda: registered(True, 1, 1)),
        ("registered_huge_8", lambda: registered(True, 8, 1)),
        ("registered_huge_8x8", lambda: registered(True, 8, 8)),
    ]:
        if ONLY and name not in ONLY:
            continue
        try:
            rnd[name] = f()
        except Exception as e:  # a failed piece is reported, and fails the verdict
            rnd[name] = {"error": str(e)}
            failed = True
        print(f"round {r} {name}: {rnd[name]}", file=sys.stderr, flush=True)
    result["rounds"].append(rnd)
print(json.dumps(result, indent=1))
print("verdict:", "FAIL (a measurement failed)" if failed else "PASS (every piece measured)", file=sys.stderr)
sys.exit(1 if failed else 0)

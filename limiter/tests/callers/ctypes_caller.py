"""Reaches the limiter from Python ctypes (dlopen + dlsym through libcuda's handle) and through
cuGetProcAddress_v2, with CUDA_DEVICE_MEMORY_LIMIT=1g against the simulated driver."""
import ctypes

GIB = 1 << 30
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0

free, total = ctypes.c_size_t(), ctypes.c_size_t()
assert cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0
assert total.value == GIB, total.value
assert free.value == GIB, free.value

ptr = ctypes.c_uint64()
assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(2 * GIB)) == 2

fn, status = ctypes.c_void_p(), ctypes.c_int(-1)
r = cuda.cuGetProcAddress_v2(b"cuMemAlloc", ctypes.byref(fn), 12000, ctypes.c_uint64(0), ctypes.byref(status))
assert r == 0 and status.value == 0, (r, status.value)
alloc = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t)(fn.value)
assert alloc(ctypes.byref(ptr), 2 * GIB) == 2
assert alloc(ctypes.byref(ptr), GIB) == 0
assert alloc(ctypes.byref(ptr), 1) == 2
print("ok: ctypes")

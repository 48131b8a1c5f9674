#!/usr/bin/env bash
# NVML's per-process list under the limiter. Run on the GPU machine from the
# repo root after `cargo xtask bundle`. Two PyTorch processes of one "container" (one region,
# CUDA_DEVICE_MEMORY_LIMIT=8g) hold 1 GiB and 2 GiB; a third process outside it holds 512 MiB.
# nvidia-smi (which loads libnvidia-ml with dlopen) and pynvml are run natively (the driver's
# host list: all three) and with the limiter preloaded in the container's environment (the two
# container processes, with what the region charges them). PASS if pynvml's container view lists
# exactly its two pids with the region's charges and the native views list all three.
# nvidia-smi's container view is printed for reference only: nvidia-smi (driver 580) resolves no
# process-list function by name (it reaches NVML through its internal export table), so no
# preloaded library sees those calls; it shows the driver's host view.
set -u
OUT=${OUT:-/tmp/out-nvml-list}
mkdir -p "$OUT"
BIN=$PWD/.carry/bin
LIM=$BIN/libvgpu_limiter.so
TS=$(mktemp -d -p /dev/shm)
# Scratch files and regions go when the script ends (a dry run must not leave them in /dev/shm).
trap 'rm -rf "$TS"' EXIT
REGION=$TS/ctr.cache
{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
} | tee "$OUT/env.txt"
hold() { # hold MIB FILE: allocate MIB through PyTorch, write the pid, sleep until FILE goes away
  python3 -c "
import os, sys, time, torch
x = torch.empty(int(sys.argv[1]) << 20, dtype=torch.uint8, device='cuda')
torch.cuda.synchronize()
open(sys.argv[2], 'w').write(str(os.getpid()))
while os.path.exists(sys.argv[2]): time.sleep(0.1)
" "$1" "$2"
}
container() { LD_PRELOAD=$LIM CUDA_DEVICE_MEMORY_LIMIT=8g CUDA_DEVICE_MEMORY_SHARED_CACHE=$REGION "$@"; }
container hold 1024 "$TS/a" & container hold 2048 "$TS/b" & hold 512 "$TS/c" &
for f in a b c; do for _ in $(seq 600); do [ -s "$TS/$f" ] && break; sleep 0.1; done; done
A=$(cat "$TS/a"); B=$(cat "$TS/b"); C=$(cat "$TS/c")
echo "container pids $A $B, outside pid $C" | tee "$OUT/pids.txt"
Q="--query-compute-apps=pid,used_memory --format=csv,noheader,nounits"
nvidia-smi $Q > "$OUT/native-smi.csv" 2>&1
container nvidia-smi $Q > "$OUT/container-smi.csv" 2>&1
PYQ='
import pynvml as n
n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0)
for p in n.nvmlDeviceGetComputeRunningProcesses(h): print(f"{p.pid}, {p.usedGpuMemory >> 20}")
m = n.nvmlDeviceGetMemoryInfo(h); print(f"memory total {m.total >> 20} used {m.used >> 20}")'
python3 -c "$PYQ" > "$OUT/native-pynvml.txt" 2>&1
container python3 -c "$PYQ" > "$OUT/container-pynvml.txt" 2>&1
rm -f "$TS/a" "$TS/b" "$TS/c"; wait
for f in native-smi.csv container-smi.csv native-pynvml.txt container-pynvml.txt; do echo "== $f"; cat "$OUT/$f"; done
python3 - "$OUT" "$A" "$B" "$C" <<'PY' | tee "$OUT/verdict.txt"
import sys
out, a, b, c = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def rows(name):
    r = {}
    for line in open(f"{out}/{name}"):
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            r[int(parts[0])] = int(parts[1])
    return r
# What the region charges: the allocation plus the default context charge (VGPU_CONTEXT_BYTES,
# 544 MiB), in 2 MiB granules.
want = {a: 1024 + 544, b: 2048 + 544}
ok = True
r = rows("container-smi.csv")
print(f"container-smi.csv: {r} (reference only: nvidia-smi does not use NVML's public entry points)")
for name in ["container-pynvml.txt"]:
    r = rows(name)
    good = r == want
    print(f"{name}: {r} -> {'PASS' if good else 'FAIL'} (want exactly {want}: the container's pids and charges)")
    ok &= good
for name in ["native-smi.csv", "native-pynvml.txt"]:
    r = rows(name)
    good = {a, b, c} <= set(r)
    print(f"{name}: {r} -> {'PASS' if good else 'FAIL'} (want all three)")
    ok &= good
print("PASS" if ok else "FAIL")
PY
rm -rf "$TS"

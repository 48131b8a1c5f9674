#!/usr/bin/env bash
# The NVML side of /metrics on a real GPU: what the dashboards' GPU panels and the
# VgpuMemoryNotSeenByLimiter alert read, which a machine without a GPU cannot show. Run on the GPU
# machine from the repo root after `cargo xtask bundle`. The agent runs at its defaults (series per
# API kind); a PyTorch process under the limiter (4 GiB limit) holds 1 GiB and one beside it in
# the same "container" (the host) runs without the limiter and holds 1 GiB: the limiter does not
# see that one. PASS if /metrics has the GPU's memory and utilisation, NVML's view of the host
# container exceeds the limiter's by at least 1 GiB - 64 MiB while a limit is set (the alert's
# input: 256 MiB is its threshold), the series are per kind (no `api` label) and the snapshot age
# is under 5 s.
set -u
OUT=${OUT:-/tmp/out-metrics-nvml}
mkdir -p "$OUT"
BIN=$PWD/.carry/bin
LIM=$BIN/libvgpu_limiter.so
TS=$(mktemp -d -p /dev/shm)
PORT=19400
AGENT=""
cleanup() { rm -f "$TS/a" "$TS/b"; [ -n "$AGENT" ] && kill "$AGENT" 2>/dev/null; wait; rm -rf "$TS"; }
trap cleanup EXIT
{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
} | tee "$OUT/env.txt"
"$BIN/vgpu-agent" run --socket "$TS/agent.sock" --metrics-listen "127.0.0.1:$PORT" \
  --region-dir "$TS" --no-calibrate > "$OUT/agent.log" 2>&1 &
AGENT=$!
hold() { # hold MIB FILE: allocate MIB through PyTorch, write the pid, sleep until FILE goes away
  python3 -c "
import os, sys, time, torch
x = torch.empty(int(sys.argv[1]) << 20, dtype=torch.uint8, device='cuda')
torch.cuda.synchronize()
open(sys.argv[2], 'w').write(str(os.getpid()))
while os.path.exists(sys.argv[2]): time.sleep(0.1)
" "$1" "$2"
}
LD_PRELOAD=$LIM CUDA_DEVICE_MEMORY_LIMIT=4g CUDA_DEVICE_MEMORY_SHARED_CACHE=$TS/ctr.cache hold 1024 "$TS/a" &
hold 1024 "$TS/b" &
for f in a b; do for _ in $(seq 600); do [ -s "$TS/$f" ] && break; sleep 0.1; done; done
sleep 5
python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$PORT/metrics').read().decode())" \
  > "$OUT/metrics.txt" 2>&1
grep -E '^vgpu_(gpu_|container_memory_(used|limit)|agent_snapshot_age)' "$OUT/metrics.txt"
python3 - "$OUT/metrics.txt" <<'PY' | tee "$OUT/verdict.txt"
import re, sys
samples = {}
for line in open(sys.argv[1]):
    m = re.match(r'^([a-z_]+)\{(.*)\} (\S+)$', line.strip())
    if m:
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        samples.setdefault(m.group(1), []).append((labels, float(m.group(3))))
def total(name, **want):
    return sum(v for l, v in samples.get(name, []) if all(l.get(k) == x for k, x in want.items()))
checks = {
    "GPU memory used (NVML)": total("vgpu_gpu_memory_used_bytes") > 2 << 30,
    "GPU utilisation (NVML)": "vgpu_gpu_utilization_ratio" in samples,
    "a memory limit from the region": total("vgpu_container_memory_limit_bytes") == 4 << 30,
    "NVML sees the process beside the limiter":
        total("vgpu_container_memory_used_bytes", view="nvml", device="0")
        - total("vgpu_container_memory_used_bytes", view="limiter", device="0") >= (1 << 30) - (64 << 20),
    "series per kind (no api label)": all("api" not in l for l, _ in samples.get("vgpu_api_calls_total", [])),
    "a fresh snapshot": 0 <= total("vgpu_agent_snapshot_age_seconds") < 5,
}
for k, ok in checks.items():
    print(f"{'ok  ' if ok else 'FAIL'} {k}")
print("PASS" if all(checks.values()) else "FAIL")
PY

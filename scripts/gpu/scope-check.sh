#!/usr/bin/env bash
# Processes under the limiter take no probe trap for launches, synchronisations and copies, on a
# GPU host: a PyTorch loop (a small matmul, a device-to-host copy and a synchronisation a step)
# under the limiter beside `vgpu-agent run` at its defaults; once the daemon has seen the
# process's region slot, its driver library is probed for the other processes only
# (`processes_scoped` without the pid), and the probes count none of its later calls while the
# limiter counts them all. From the repo root after `cargo xtask bundle` (binaries in
# .carry/bin). Results under $OUT (default /tmp/out-scope-check): scope.txt, the daemon's log, a
# `stat --json` taken from the daemon at the end, and what the process maps of libcuda.
# Exit status: 1 if, in the last window, the library was not scoped away from the process or the
# probes counted its calls (the first window, taken mid-run, is shown but may straddle the moment
# the daemon saw the process's slot).
set -u
OUT=${OUT:-/tmp/out-scope-check}
SECS=${SECS:-12}
BIN=$PWD/.carry/bin
mkdir -p "$OUT"
[ "$(id -u)" = 0 ] || { echo "scope-check.sh: run as root"; exit 1; }
TS=$(mktemp -d -p /dev/shm scope.XXXXXX)
DAEMON=
cleanup() {
  [ -n "$DAEMON" ] && kill -INT "$DAEMON" 2>/dev/null && wait "$DAEMON" 2>/dev/null
  rm -rf "$TS"
}
trap cleanup EXIT
mkdir -p "$TS/regions/ctr"
"$BIN/vgpu-agent" run --socket "$TS/agent.sock" --region-dir "$TS/regions" --metrics-listen off \
  > "$OUT/daemon.log" 2>&1 &
DAEMON=$!
for _ in $(seq 300); do [ -S "$TS/agent.sock" ] && break; sleep 0.1; done
cat > "$TS/loop.py" <<'EOF'
import os, sys, time, torch
secs = float(sys.argv[1])
a = torch.randn(256, 256, device="cuda")
torch.cuda.synchronize()
print("ready", os.getpid(), flush=True)
t = time.time()
steps = 0
while time.time() - t < secs:
    b = a @ a
    b.sum().item()          # a device-to-host copy
    torch.cuda.synchronize()
    steps += 1
print("steps", steps, flush=True)
time.sleep(3)               # still alive when the daemon is asked
EOF
LD_PRELOAD="$BIN/libvgpu_limiter.so" CUDA_DEVICE_MEMORY_LIMIT=16g \
  CUDA_DEVICE_MEMORY_SHARED_CACHE="$TS/regions/ctr/ctr.cache" \
  python3 "$TS/loop.py" "$SECS" > "$OUT/loop.txt" 2>&1 &
LOOP=$!
sleep $((SECS / 2 + 4))
grep libcuda "/proc/$LOOP/maps" | head -3 > "$OUT/maps.txt" 2>&1
for f in $(awk '{print $6}' "$OUT/maps.txt" | sort -u); do stat -L -c '%n dev=%d inode=%i' "$f"; done >> "$OUT/maps.txt" 2>&1
{ echo "region mappings:"; grep -F ctr.cache "/proc/$LOOP/maps"; stat -c '%n dev=%d inode=%i' "$TS/regions/ctr/ctr.cache"
  echo "shared file mappings: $(awk '$2 ~ /s/ && $6 != ""' "/proc/$LOOP/maps" | wc -l)"
  ls -l "/proc/$LOOP/map_files" | grep -F ctr.cache | head -3; } >> "$OUT/maps.txt" 2>&1
"$BIN/vgpu-agent" stat --socket "$TS/agent.sock" --duration 2s --json > "$OUT/stat-mid.json" 2> "$OUT/stat-mid.err"
sleep $((SECS / 2))
"$BIN/vgpu-agent" stat --socket "$TS/agent.sock" --duration 1s --json > "$OUT/stat-end.json" 2> "$OUT/stat-end.err"
wait "$LOOP"
python3 - "$OUT" "$LOOP" <<'EOF' | tee "$OUT/scope.txt"
import json, sys
out, pid = sys.argv[1], int(sys.argv[2])
ok = True
# The verdict is the last window's: the first may straddle the moment the daemon saw the slot.
for name in ("stat-mid", "stat-end"):
    judged = name == "stat-end"
    r = json.load(open(f"{out}/{name}.json"))
    libs = [(l["path"], l.get("processes_scoped")) for l in r["probes"]["libraries"] if "libcuda" in l["path"]]
    print(name, "libcuda libraries:", libs)
    scoped = [s for _, s in libs if s is not None]
    if not scoped or any(pid in s for s in scoped):
        print(f"  {'FAIL' if judged else 'not yet'}: not scoped away from pid {pid}")
        ok = ok and not judged
    rows = [p for p in r["processes"] if p["pid"] == pid]
    if not rows:
        print(f"  FAIL: pid {pid} not in the report"); ok = ok and not judged; continue
    hr = ("launch", "sync", "copy")
    probes = sum(a["calls"] for a in rows[0]["apis"] if a["source"] == "probes" and a["kind"] in hr)
    limiter = sum(a["calls"] for a in rows[0]["apis"] if a["source"] == "limiter" and a["kind"] in hr)
    print(f"  pid {pid} within the window: probes {probes} launch/sync/copy calls, limiter {limiter}")
    if probes != 0 or limiter == 0:
        print(f"  {'FAIL' if judged else 'not yet'}: the probes counted its calls, or the limiter none")
        ok = ok and not judged
print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
EOF

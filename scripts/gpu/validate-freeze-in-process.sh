#!/usr/bin/env bash
# GPU validation of the limiter's in-process freeze path (VGPU_FREEZE_IN_PROCESS=1,
# docs/oversubscription.md "The in-process path"), through validate-freeze-frameworks.sh (each
# tenant a container, `vgpu-agent freeze --container` beside `vgpu-agent run`, thawed by its next
# CUDA call, pattern checked word for word):
# - FRAMEWORKS=1 (default): PyTorch, JAX (its default allocator), CuPy, a two-process PyTorch
#   container and PyTorch with expandable segments (FRAMEWORK_TENANTS), 1 GiB each, in-process (at
#   most 768 MiB per process may stay on the GPU: its CUDA context); FRAMEWORKS_POOL=SIZE gives
#   the daemon a freeze pool of SIZE for them;
# - SIZES_MIB (default 4096,16384): a PyTorch tenant of each size in-process, timed beside a pinned
#   copy of the same size (FREEZE_LINK=1);
# - POOL_SIZES_MIB (default 4096,16384): the same in-process tenant with the daemon's freeze pool
#   (`vgpu-agent run --freeze-pool`, sized to the tenant plus 2 GiB), its host memory populated
#   before the freeze;
# - DRIVER_MIB (default 16384): the same tenant frozen by the driver's checkpoint API, the
#   baseline, in the same run.
# Verdict: every run passes its own (frozen, memory given back, 0 corrupted words), every
# in-process thaw of 16 GiB or more takes at most 2x the pinned copy to the GPU, and every freeze
# of 16 GiB or more with the pool used the pool and took at most 2x the pinned copy to the host.
# A freeze without the pool is reported against the same goal but not held to it (host memory
# populated at the freeze cannot be had that fast: see docs/oversubscription.md). Results: $OUT/summary.txt, $OUT/<run>/freeze-frameworks.{json,txt}.
# SIZE_TENANT (default torch) is the tenant of the sized runs (SIM=1 SIZE_TENANT=sim checks this
# script on the simulated driver). Run as root from the repo root after `cargo xtask bundle`;
# builds nothing. ~6 min with the defaults.
set -u
OUT=${OUT:-/tmp/out-freeze-in-process}
mkdir -p "$OUT"
rc=0
run() {
  local name=$1
  shift
  env "$@" OUT="$OUT/$name" bash scripts/gpu/validate-freeze-frameworks.sh >"$OUT/$name.log" 2>&1 || rc=1
  tail -n 4 "$OUT/$name.log"
}
if [ "${FRAMEWORKS:-1}" = 1 ]; then
  run frameworks-in-process VGPU_FREEZE_IN_PROCESS=1 FREEZE_KEEP_MIB=768 \
    FREEZE_TENANTS="${FRAMEWORK_TENANTS:-torch,jax,cupy,torch-2proc,torch-expandable}" \
    FREEZE_POOL="${FRAMEWORKS_POOL:-}"
fi
for m in $(echo "${SIZES_MIB-4096,16384}" | tr ',' ' '); do
  run "torch-${m}m-in-process" VGPU_FREEZE_IN_PROCESS=1 FREEZE_MIB="$m" FREEZE_TENANTS="${SIZE_TENANT:-torch}" \
    FREEZE_LINK=1 FREEZE_KEEP_MIB=768
done
n=0
for m in $(echo "${POOL_SIZES_MIB-4096,16384}" | tr ',' ' '); do
  n=$((n + 1)) # a size may come again (repeats): each run its own folder
  run "torch-${m}m-${n}-in-process-pool" VGPU_FREEZE_IN_PROCESS=1 FREEZE_MIB="$m" FREEZE_TENANTS="${SIZE_TENANT:-torch}" \
    FREEZE_LINK=1 FREEZE_KEEP_MIB=768 FREEZE_POOL="$(( (m + 1023) / 1024 + 2 ))g"
done
for m in $(echo "${DRIVER_MIB-16384}" | tr ',' ' '); do
  run "torch-${m}m-driver" FREEZE_MIB="$m" FREEZE_TENANTS="${SIZE_TENANT:-torch}" FREEZE_LINK=1
done
python3 - "$OUT" <<'EOF' | tee "$OUT/summary.txt"
import json, os, sys
out = sys.argv[1]
fast = True
for name in sorted(os.listdir(out)):
    path = os.path.join(out, name, "freeze-frameworks.json")
    if not os.path.exists(path):
        continue
    d = json.load(open(path))
    link = d.get("link") or {}
    for r in d["results"]:
        if "error" in r:
            print(f"{name} {r['tenant']}: ERROR {r['error']}")
            continue
        thaw = max(a["thaw_s"] for a in r["answers"])
        pooled = name.endswith("-pool")
        line = (f"{name} {r['tenant']}: {r['path']} path"
                f"{' (the agent pool)' if r.get('pool') else ''}, {r['held_mib']} MiB held -> "
                f"{r['frozen_mib']} MiB frozen; freeze {r['freeze_s']} s (the limiter's own "
                f"{r.get('limiter_freeze_ms')} ms), thaw {thaw} s")
        if link:
            fr, th = r["freeze_s"] / link["pinned_d2h_s"], thaw / link["pinned_h2d_s"]
            line += (f"; pinned copy {link['pinned_d2h_s']} / {link['pinned_h2d_s']} s: freeze "
                     f"{fr:.1f}x, thaw {th:.1f}x")
            if r["path"] == "in-process" and r["mib_each"] >= 16384 and th > 2:
                fast = False
                line += " (thaw over 2x)"
            if pooled and r["mib_each"] >= 16384 and (fr > 2 or not r.get("pool")):
                fast = False
                line += " (freeze over 2x)" if r.get("pool") else " (the pool was not used)"
        print(line + (" ok" if r["ok"] else " MISS"))
print("thaw, and the freeze with the pool, within 2x of the link at 16 GiB and more:",
      "yes" if fast else "NO")
sys.exit(0 if fast else 1)
EOF
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
[ $rc -eq 0 ] && echo PASS || echo FAIL
exit $rc

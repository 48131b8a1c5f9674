"""Compares `vgpu-agent stat --json` with what torch_known_calls.py did. Prints a report and
exits 1 on a mismatch."""
import json
import sys

expected = json.load(open(sys.argv[1]))
report = json.load(open(sys.argv[2]))
pid = expected["pid"]
rows = [p for p in report["processes"] if p["pid"] == pid]
if not rows:
    print(f"FAIL: pid {pid} not in the report"); sys.exit(1)
row = rows[0]
apis = {a["api"]: a for a in row["apis"]}

def calls(*names):
    return sum(apis.get(n, {}).get("calls", 0) for n in names)

n = expected["n"]
checks = [
    ("cuCtxSynchronize(_v2) calls (torch.cuda.synchronize x N, + empty_cache's device sync)", calls("cuCtxSynchronize", "cuCtxSynchronize_v2"), None),
    ("cuStreamSynchronize calls (one per pageable copy)", calls("cuStreamSynchronize"), 2 * n),
    ("D2H copies (cuMemcpyDtoH*)", calls("cuMemcpyDtoHAsync_v2", "cuMemcpyDtoH_v2", "cuMemcpyDtoHAsync_v2_ptsz", "cuMemcpyDtoH_v2_ptds"), n),
    ("H2D copies (cuMemcpyHtoD*)", calls("cuMemcpyHtoDAsync_v2", "cuMemcpyHtoD_v2", "cuMemcpyHtoDAsync_v2_ptsz", "cuMemcpyHtoD_v2_ptds"), n),
    ("cuMemAlloc_v2 calls vs torch num_device_alloc", calls("cuMemAlloc_v2"), expected["device_allocs"]),
    ("cuMemFree_v2 calls vs torch num_device_free", calls("cuMemFree_v2"), expected["device_frees"]),
    ("live bytes (probes) vs torch reserved delta", row["live_bytes"], expected["reserved_delta"]),
]
ok = True
print(f"pid {pid}, torch {expected['torch']}, {expected['device']}")
for what, got, want in checks:
    if want is None:
        status = f"(n = {n}; reported {got})"
        if not (n <= got <= n + 2):
            ok = False; status = f"MISMATCH (want {n}..{n+2})"
    else:
        status = "ok" if got == want else f"MISMATCH (want {want})"
        if what.startswith("live bytes") and got != want and abs(got - want) < (2 << 20):
            status = f"within the 2 MiB granularity (want {want})"
        elif got != want:
            ok = False
    print(f"  {what}: {got} {status}")
print("  all APIs seen:", ", ".join(f"{k}={v['calls']}" for k, v in sorted(apis.items())))
print("  probe cost:", json.dumps(report["probes"].get("cost")))
print("  health:", json.dumps(report["health"]))
print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)

"""Compares `vgpu-agent stat --json` with what nccl_one_gpu.py did. Prints PASS/FAIL per check and
exits 1 on a failure."""
import json
import sys

expected = json.load(open(sys.argv[1]))
report = json.load(open(sys.argv[2]))
pid = expected["pid"]
rows = [p for p in report["processes"] if p["pid"] == pid]
if not rows:
    print(f"FAIL: pid {pid} not in the report")
    sys.exit(1)
row = rows[0]
apis = {a["api"]: a for a in row["apis"]}
ok = True


def check(what, good, detail):
    global ok
    ok &= bool(good)
    print(f"{'PASS' if good else 'FAIL'}: {what}: {detail}")


print(f"pid {pid}, torch {expected['torch']}, NCCL {expected['nccl']}, {expected['device']}")
print(f"libnccl mapped: {expected['libnccl_mapped']}")
libs = [l for l in report["probes"]["libraries"] if "nccl" in l["kinds_attached"]]
check(
    "a libnccl attached with the nccl kind",
    any(l["path"] in expected["libnccl_mapped"] for l in libs),
    [(l["path"], l["symbols_attached"], l["found_by"]) for l in libs],
)

total_bytes = 0
for name, want in expected["collectives"].items():
    a = apis.get(name, {})
    got = (a.get("calls", 0), a.get("errors", 0), a.get("bytes", 0))
    exp = (want["calls"], 0, want["calls"] * want["bytes_per_call"])
    total_bytes += exp[2]
    check(f"{name} (calls, errors, bytes)", got == exp, f"reported {got}, made {exp}")
    if a:
        check(f"{name} latency named host_enqueue", a.get("latency") == "host_enqueue",
              f"kind {a.get('kind')}, p50 {a.get('p50_ns')} ns, p99 {a.get('p99_ns')} ns")

init = apis.get("ncclCommInitRankConfig", {})
check("ncclCommInitRankConfig called and succeeded", init.get("calls", 0) >= 1 and init.get("errors", 1) == 0,
      f"calls {init.get('calls', 0)}, errors {init.get('errors')}, p50 {init.get('p50_ns')} ns")
unexpected = {n: a["calls"] for n, a in apis.items()
              if a["kind"] == "nccl" and n not in expected["collectives"] and n != "ncclCommInitRankConfig"}
print(f"note: other NCCL calls seen: {unexpected or 'none'}")

comms = row.get("communicators", [])
mine = [c for c in comms if c["rank"] == expected["rank"] and c["nranks"] == expected["world_size"]]
check(
    f"a communicator with rank {expected['rank']} of {expected['world_size']} carrying every collective byte",
    any(c["bytes"] == total_bytes and c["errors"] == 0 for c in mine),
    f"{comms} (want bytes {total_bytes})",
)
health = {k: v for k, v in report["health"].items() if v}
check("no NCCL health problems", not health.get("nccl_unknown_datatype") and not health.get("nccl_dropped"),
      health or "all zero")
print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)

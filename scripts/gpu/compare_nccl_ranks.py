"""Compares `vgpu-agent stat --json` with what each rank of nccl_ranks.py issued and with the
commId NCCL printed for it (NCCL_DEBUG=INFO). Usage: compare_nccl_ranks.py DIR STAT.json
WORKLOAD.log. Prints PASS/FAIL per check, exits 1 on a failure."""
import glob
import json
import re
import sys

d, stat_path, log_path = sys.argv[1:4]
report = json.load(open(stat_path))
ranks = [json.load(open(p)) for p in sorted(glob.glob(f"{d}/rank-*.json"))]
ok = True


def check(what, good, detail):
    global ok
    ok &= bool(good)
    print(f"{'PASS' if good else 'FAIL'}: {what}: {detail}")


# NCCL's own lines: "... comm 0x.. rank R nranks N cudaDev D nvmlDev D busId B commId 0x.. - Init START"
nccl_ids = {}
for line in open(log_path, errors="replace"):
    m = re.search(r" rank (\d+) nranks (\d+) .*commId (0x[0-9a-f]+)", line)
    if m:
        nccl_ids[int(m.group(1))] = m.group(3)
world = ranks[0]["world_size"] if ranks else 0
check("NCCL printed a commId for every rank (NCCL_DEBUG=INFO)", len(nccl_ids) == world and world > 0, nccl_ids)
check("every rank wrote what it issued", len(ranks) == world and world > 0, [r["rank"] for r in ranks])
ids = set()
for r in ranks:
    rows = [p for p in report["processes"] if p["pid"] == r["pid"]]
    if not rows:
        check(f"rank {r['rank']} (pid {r['pid']}) in the report", False, "missing")
        continue
    row = rows[0]
    apis = {a["api"]: a for a in row["apis"]}
    for name, want in r["collectives"].items():
        a = apis.get(name, {})
        got = (a.get("calls", 0), a.get("errors", 0), a.get("bytes", 0))
        exp = (want["calls"], 0, want["calls"] * want["bytes_per_call"])
        check(f"rank {r['rank']} {name} (calls, errors, bytes)", got == exp, f"reported {got}, issued {exp}")
    comms = [c for c in row.get("communicators", []) if not c["destroyed"]]
    mine = [c for c in comms if c.get("rank") == r["rank"] and c.get("nranks") == world]
    want_bytes = sum(w["calls"] * w["bytes_per_call"] for w in r["collectives"].values())
    want_calls = 1 + sum(w["calls"] for w in r["collectives"].values())  # + its creation
    good = [c for c in mine if c["bytes"] == want_bytes and c["calls"] == want_calls and c["errors"] == 0]
    check(
        f"rank {r['rank']}: a communicator rank {r['rank']} of {world} with every collective (calls {want_calls} with its creation, bytes {want_bytes})",
        len(good) == 1,
        comms,
    )
    for c in good:
        ids.add(c.get("comm_id"))
        if r["rank"] in nccl_ids:
            check(f"rank {r['rank']}: comm_id is NCCL's commId", c.get("comm_id") == nccl_ids[r["rank"]],
                  f"agent {c.get('comm_id')}, NCCL {nccl_ids[r['rank']]}")
check("one communicator id for all ranks", len(ids) == 1 and None not in ids, ids)
print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)

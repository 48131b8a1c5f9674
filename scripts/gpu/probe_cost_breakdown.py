"""probe-cost-breakdown.sh's helpers.

  probe_cost_breakdown.py --progs PID   each eBPF program PID holds: one JSON line with its name,
                                        run_cnt and run_time_ns (kernel.bpf_stats_enabled=1)
  probe_cost_breakdown.py OUT           the breakdown of OUT's runs (see probe-cost-breakdown.sh);
                                        exits 1 if a configuration has no figure or its median is
                                        outside native's spread
"""
import ctypes, glob, json, os, re, statistics, sys

BPF_PROG_GET_FD_BY_ID, BPF_OBJ_GET_INFO_BY_FD, SYS_BPF = 13, 15, 321


def prog_name(prog_id):
    """The program's name as the kernel keeps it (15 bytes), through the bpf syscall."""
    libc = ctypes.CDLL(None, use_errno=True)
    attr = ctypes.create_string_buffer(128)
    ctypes.c_uint32.from_buffer(attr, 0).value = prog_id
    fd = libc.syscall(SYS_BPF, BPF_PROG_GET_FD_BY_ID, attr, 128)
    if fd < 0:
        return f"id{prog_id}"
    try:
        info = ctypes.create_string_buffer(256)
        attr = ctypes.create_string_buffer(128)
        ctypes.c_uint32.from_buffer(attr, 0).value = fd
        ctypes.c_uint32.from_buffer(attr, 4).value = 256
        ctypes.c_uint64.from_buffer(attr, 8).value = ctypes.addressof(info)
        if libc.syscall(SYS_BPF, BPF_OBJ_GET_INFO_BY_FD, attr, 128) < 0:
            return f"id{prog_id}"
        return info.raw[64:80].split(b"\0")[0].decode(errors="replace")
    finally:
        os.close(fd)


def progs(pid):
    for fdinfo in glob.glob(f"/proc/{pid}/fdinfo/*"):
        try:
            text = open(fdinfo).read()
        except OSError:
            continue
        if "prog_type:" not in text:
            continue
        f = dict(re.findall(r"^(\w+):\s*(\S+)", text, re.M))
        pid_ = int(f.get("prog_id", 0))
        print(json.dumps({"name": prog_name(pid_), "id": pid_, "run_cnt": int(f.get("run_cnt", 0)),
                          "run_time_ns": int(f.get("run_time_ns", 0))}))


def med(v):
    return statistics.median(v) if v else float("nan")


def breakdown(out):
    runs = {}
    for line in open(os.path.join(out, "results.txt")):
        m = re.match(r"RESULT ([\w-]+)-(\d+) all_reduce ([\d.]+) ms/step \((\d+) steps\)", line)
        if m:
            runs.setdefault(m.group(1), {})[int(m.group(2))] = (float(m.group(3)), int(m.group(4)))
    ok = "native" in runs
    native = [v[0] for v in runs.get("native", {}).values()]
    nmed = med(native)
    print("## ms per step (all_reduce, K=%s), median and spread" % os.environ.get("K", "1024"))
    for cfg, rs in runs.items():
        v = [x[0] for x in rs.values()]
        within = min(native) <= med(v) <= max(native) if native else False
        ok = ok and (cfg == "native" or within)
        print(f"{cfg:14s} median {med(v):.3f} ({(med(v) / nmed - 1) * 100:+.1f}%, "
              f"{(med(v) - nmed) * 1000:+.1f} us/step) runs {sorted(v)}"
              f"{'' if cfg == 'native' else ('  within native spread' if within else '  OUTSIDE native spread')}")
    for cfg, rs in runs.items():
        if not cfg.startswith("agent"):
            continue
        print(f"\n## {cfg}")
        per_step_probe, per_step_prog = [], []
        for r, (ms, steps) in sorted(rs.items()):
            snap_path = os.path.join(out, f"snapshot-{cfg}-{r}.json")
            prog_path = os.path.join(out, f"progs-{cfg}-{r}.txt")
            cpu_path = os.path.join(out, f"daemon-cpu-{cfg}-{r}.txt")
            if not os.path.exists(snap_path):
                print(f"round {r}: no snapshot"); ok = False; continue
            snap = json.load(open(snap_path))
            progs_ = [json.loads(l) for l in open(prog_path)] if os.path.exists(prog_path) else []
            # Prices per prologue class (entry + return hit, the daemon's calibration).
            classes = {c["prologue"]: c["last_per_hit_ns"]
                       for c in (snap["agent"].get("probe_cost") or {}).get("classes", [])}
            libs = {l["path"]: l.get("prologues", {}) for l in snap["agent"].get("libraries", [])}
            print(f"round {r}: {ms:.3f} ms/step, {steps} steps; prices per hit by class (ns): "
                  + ", ".join(f"{k} {v:.0f}" for k, v in sorted(classes.items())))
            for path, pro in libs.items():
                print(f"  library {path}: prologues {pro}")
            # The measured window's counts where the workload marked it (snapshots and program
            # counts at its start and end), else the daemon's whole life (start-up included).
            w0 = os.path.join(out, f"snapshot-start-{cfg}-{r}.json")
            w1 = os.path.join(out, f"snapshot-end-{cfg}-{r}.json")
            g0 = os.path.join(out, f"progs-start-{cfg}-{r}.txt")
            g1 = os.path.join(out, f"progs-end-{cfg}-{r}.txt")
            windowed = all(os.path.exists(x) for x in (w0, w1, g0, g1))
            base = {}
            if windowed:
                for q in json.load(open(w0))["processes"]:
                    base[q["key"]["pid"]] = {a["api"]: a["calls"] for a in q["apis"]
                                             if a["source"] == "probes"}
                snap_w = json.load(open(w1))
                p0 = {(q["name"], q["id"]): q for q in map(json.loads, open(g0))}
                progs_ = []
                for q in map(json.loads, open(g1)):
                    b = p0.get((q["name"], q["id"]), {"run_cnt": 0, "run_time_ns": 0})
                    progs_.append(dict(q, run_cnt=q["run_cnt"] - b["run_cnt"],
                                       run_time_ns=q["run_time_ns"] - b["run_time_ns"]))
            else:
                snap_w = snap
            scope = "in the measured window" if windowed else "over the daemon's life"
            ranks = [p for p in snap_w["processes"]
                     if any(a["source"] == "probes" and a["kind"] == "nccl" for a in p["apis"])]

            def probed(p):
                before = base.get(p["key"]["pid"], {})
                return {a["api"]: a["calls"] - before.get(a["api"], 0)
                        for a in p["apis"] if a["source"] == "probes"}

            for p in ranks:
                top = sorted(probed(p).items(), key=lambda kv: -kv[1])[:8]
                # The agent's counts from its probes: where a budget sampled a kind, the calls
                # it estimates (all of them), not the probe hits (the programs' runs, below).
                print(f"  pid {p['key']['pid']} ({p['comm']}): calls per step counted by the probes {scope} "
                      + ", ".join(f"{k} {v / steps:.2f}" for k, v in top))
            # Probe hits are the entry programs' runs; the agent's own calibration runs are not
            # the workload's.
            workload = [q for q in progs_ if not q["name"].startswith("calib")]
            hits = sum(q["run_cnt"] for q in workload if "entry" in q["name"])
            prog_ns = sum(q["run_time_ns"] for q in workload)
            rank_calls = sum(v for p in ranks for v in probed(p).values())
            if progs_:
                print("  eBPF programs (runs, ns per run): " + ", ".join(
                    f"{q['name']} {q['run_cnt']} {q['run_time_ns'] / max(q['run_cnt'], 1):.0f}"
                    for q in sorted(progs_, key=lambda q: -q["run_cnt"]) if q["run_cnt"]))
            if rank_calls and ranks:
                # Per step and per rank: the programs' own time and the hits at the class price
                # of the library's main class.
                prog_per_step = prog_ns / len(ranks) / steps / 1000
                # The ranks' hits are nearly all on push-class functions (libcuda 580, PyTorch's
                # libnccl): priced at the push class.
                price = classes.get("push", float("nan"))
                hit_per_step = hits / len(ranks) / steps
                calls_per_step = rank_calls / len(ranks) / steps
                print(f"  per rank per step {scope}: {calls_per_step:.2f} calls counted, {hit_per_step:.2f} "
                      f"probe hits ({100 * hit_per_step / max(calls_per_step, 1e-9):.0f}% of them); eBPF "
                      f"program time {prog_per_step:.2f} us; at the push class's price {price:.0f} ns: "
                      f"{hit_per_step * price / 1000:.2f} us ({hit_per_step * price / 1e3 / (ms * 1e3) * 100:.2f}% "
                      "of the step)")
                per_step_probe.append(hit_per_step * price / 1000)
                per_step_prog.append(prog_per_step)
            nv = snap["agent"].get("nvml_calls") or {}
            if nv:
                print("  NVML queries over the daemon's life (calls, ms in all, longest ms): " + ", ".join(
                    f"{k} {v['calls']} {v['seconds'] * 1e3:.1f} {v['max_seconds'] * 1e3:.2f}"
                    for k, v in sorted(nv.items(), key=lambda kv: -kv[1]["seconds"])))
            if os.path.exists(cpu_path):
                by = {}
                for line in open(cpu_path):
                    parts = line.rsplit(None, 2)
                    if len(parts) == 3:
                        by[parts[0]] = by.get(parts[0], 0) + int(parts[1]) + int(parts[2])
                tot = sum(by.values())
                print(f"  daemon CPU over its life: {tot / 100:.2f} s; by thread: "
                      + ", ".join(f"{k} {v / 100:.2f}" for k, v in sorted(by.items(), key=lambda kv: -kv[1])))
        if per_step_probe:
            print(f"  median per rank per step: probes {med(per_step_probe):.2f} us at calibrated prices, "
                  f"of which eBPF program time {med(per_step_prog):.2f} us")
    for cfg in os.environ.get("CONFIGS", "native limiter agent agent-pinned agent-nonvml").split():
        if cfg not in runs:
            print(f"no runs of {cfg}")
    return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1] == "--progs":
        progs(int(sys.argv[2]))
    else:
        sys.exit(breakdown(sys.argv[1]))

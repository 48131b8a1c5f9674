#!/usr/bin/env python3
"""What a probe hit costs the attributed process, from its own per-launch trace, against what
could estimate it from outside the process.

  probe_hit_trace.py sample PID OUT.npy   read the user-mode instructions PID's main thread
                                           retires, every ~1 ms until it exits (perf_event_open;
                                           writes nothing when the host has no hardware counter)
  probe_hit_trace.py analyse RAW          every RAW/<tag>.trace (attribute_micro's TRACE) with its
                                           RAW/<tag>.pmu.npy and RAW/<tag>.json (the agent's report)
  probe_hit_trace.py windows JSON...      over the windows of several analyses (their
                                           hit-trace.json): the range of a hit's cost, and how the
                                           agent's prices around each window follow it

For each run the analysis prints:
- truth: what a hit costs per probed launch (the trimmed mean of the probed launches less that of
  the unprobed ones, as attribute_micro does), over the run and per tenth of it;
- by reference: the windows' excess over the pace of the synchronisations in the gaps, per probed
  launch (what the agent could measure from its own counts when a reference kind stays attached);
- by instructions: the same from the rate of user-mode instructions in windows and gaps (the
  launches' own work does not change when probed; only their wall time does);
- agent: what the agent charged per probed launch, and its calibration's price;
- per window: the hit's cost in the window (its launches less the unprobed ones within 200 ms of
  it) against the agent's re-measurements of the price within 100 ms of it (from the agent's
  debug log, RAW/<tag>.err), to tell a price that moves with the host from one that moves with
  the process.
Verdict: PASS when each estimate that the run allows is within 10% of its truth.
"""
import ctypes
import glob
import json
import os
import re
import statistics
import struct
import sys
import time

PERF_TYPE_HARDWARE = 0
PERF_COUNT_HW_INSTRUCTIONS = 1
EXCLUDE_KERNEL, EXCLUDE_HV = 1 << 5, 1 << 6


def sample(pid, out):
    import numpy as np

    libc = ctypes.CDLL(None, use_errno=True)
    # perf_event_attr, its first 64 bytes (PERF_ATTR_SIZE_VER0).
    attr = struct.pack("IIQQQQQII Q", PERF_TYPE_HARDWARE, 64, PERF_COUNT_HW_INSTRUCTIONS, 0, 0, 0,
                       EXCLUDE_KERNEL | EXCLUDE_HV, 0, 0, 0)
    buf = ctypes.create_string_buffer(attr, 64)
    fd = libc.syscall(298, buf, pid, -1, -1, 0)
    if fd < 0:
        print(f"pmu: perf_event_open failed: {os.strerror(ctypes.get_errno())}", file=sys.stderr)
        return
    rows = []
    word = ctypes.c_uint64()
    while os.path.exists(f"/proc/{pid}"):
        t = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        if libc.read(fd, ctypes.byref(word), 8) != 8:
            break
        rows.append((t, word.value))
        time.sleep(0.0005)
    np.save(out, np.array(rows, dtype=np.int64))


def trimmed_mean(v):
    import numpy as np

    v = np.sort(v)
    cut = len(v) // 100
    return float(v[cut:len(v) - cut].mean()) if len(v) > 2 * cut else 0.0


def analyse_one(raw, tag):
    import numpy as np

    rec = np.fromfile(f"{raw}/{tag}.trace", dtype=np.dtype([("start", "<u8"), ("ns", "<f4"), ("flags", "<u4")]))
    rec = rec[(rec["flags"] & 8) == 0]  # launches past the limiter are not in question here
    before, after, sync = rec["flags"] & 1, (rec["flags"] >> 1) & 1, (rec["flags"] >> 2) & 1
    probed, unprobed = (before == 1) & (after == 1), (before == 0) & (after == 0)
    out = {"tag": tag, "launches": len(rec), "probed": int(probed.sum())}
    ns = rec["ns"].astype(np.float64)
    out["truth"] = trimmed_mean(ns[probed]) - trimmed_mean(ns[unprobed])
    tenths = []
    for part in np.array_split(np.arange(len(rec)), 10):
        p, u = part[probed[part]], part[unprobed[part]]
        if len(p) > 500 and len(u) > 500:
            tenths.append(trimmed_mean(ns[p]) - trimmed_mean(ns[u]))
    out["truth_tenths"] = tenths
    # What a hit costs the loop as a whole: the time from a launch's start to the next one's,
    # probed against unprobed, leaving out the launches a synchronisation follows (the code after
    # a trap may run slower too, outside the launch's own bracket).
    start_all = rec["start"].astype(np.int64)
    step = np.append(np.diff(start_all), 0).astype(np.float64)
    plain = (sync == 0)
    both_probed = probed & np.append(probed[1:], False) & plain
    both_unprobed = unprobed & np.append(unprobed[1:], False) & plain
    out["iteration_truth"] = trimmed_mean(step[both_probed]) - trimmed_mean(step[both_unprobed])
    # Windows: the runs of probed launches; each from its first launch's start to its last's end.
    start = rec["start"].astype(np.int64)
    end = start + ns.astype(np.int64)
    edges = np.flatnonzero(np.diff(np.concatenate(([0], probed.astype(np.int8), [0]))))
    runs = list(zip(edges[::2], edges[1::2]))  # [first, past-last)
    runs = [(a, b) for a, b in runs if b - a >= 50]
    out["windows"] = len(runs)
    if len(runs) >= 3:
        # By reference: window time over what the gaps' pace of synchronisations predicts.
        win_t = sum(end[b - 1] - start[a] for a, b in runs)
        win_calls = sum(b - a for a, b in runs)
        win_refs = sum(int(sync[a:b].sum()) for a, b in runs)
        gaps = [(runs[i][1], runs[i + 1][0]) for i in range(len(runs) - 1)]
        gap_t = sum(start[b] - end[a - 1] for a, b in gaps)
        gap_refs = sum(int(sync[a:b].sum()) for a, b in gaps)
        if win_refs > 20 and gap_refs > 20:
            out["by_reference"] = (win_t - win_refs * gap_t / gap_refs) / win_calls
        # By instructions: user-mode instructions per ns in windows and in gaps.
        pmu_path = f"{raw}/{tag}.pmu.npy"
        if os.path.exists(pmu_path):
            pmu = np.load(pmu_path)
            if len(pmu) > 10 and pmu[-1, 1] > 0:
                spans = [(start[a], end[b - 1], 1) for a, b in runs] + [(end[a - 1], start[b], 0) for a, b in gaps]
                acc = {0: [0, 0], 1: [0, 0]}
                for (t0, i0), (t1, i1) in zip(pmu[:-1], pmu[1:]):
                    for s0, s1, kind in spans:
                        if s0 <= t0 and t1 <= s1:
                            acc[kind][0] += i1 - i0
                            acc[kind][1] += t1 - t0
                            break
                if acc[0][1] > 0 and acc[1][1] > 0:
                    rate_gap = acc[0][0] / acc[0][1]
                    rate_win = acc[1][0] / acc[1][1]
                    per_launch = win_t / win_calls  # a loop iteration in a window, hit included
                    out["by_instructions"] = per_launch * (1 - rate_win / rate_gap)
                    # The assumption: a launch's user-mode instructions do not change when probed.
                    gap_calls = sum(b - a for a, b in gaps)
                    out["instructions_per_launch"] = {
                        "windows": acc[1][0] / max(1, win_calls * acc[1][1] / win_t),
                        "gaps": acc[0][0] / max(1, gap_calls * acc[0][1] / gap_t),
                    }
    # Per window: its own truth, and the agent's prices measured around it.
    prices = []
    try:
        for line in open(f"{raw}/{tag}.err"):
            m = re.search(r"hit price (\w+) at (\d+) ns on CPU (\d+): (\d+) ns", line)
            if m:
                prices.append((int(m.group(2)), float(m.group(4)), int(m.group(3))))
    except OSError:
        pass
    per_window = []
    for a, b in runs:
        t0, t1 = start[a], end[b - 1]
        near = unprobed & (start > t0 - 200_000_000) & (start < t1 + 200_000_000)
        if near.sum() < 500:
            continue
        w = {"start_ns": int(t0), "seconds": (t1 - t0) / 1e9, "calls": int(b - a),
             "truth": trimmed_mean(ns[a:b]) - trimmed_mean(ns[near])}
        w["unprobed_ns"] = trimmed_mean(ns[near])
        w["iteration_truth"] = trimmed_mean(step[a:b - 1][~sync[a:b - 1].astype(bool)]) - trimmed_mean(step[near & both_unprobed])
        around = [(p, c) for t, p, c in prices if t0 - 100_000_000 <= t <= t1 + 100_000_000]
        if around:
            w["prices_around"] = around
        per_window.append(w)
    out["per_window"] = per_window
    try:
        report = json.load(open(f"{raw}/{tag}.json"))
        pid = int(open(f"{raw}/{tag}.pid").read())
        p = next(p for p in report["processes"] if p["pid"] == pid)
        n = sum(a.get("probed_calls", a["calls"] if a["measured_by"] == "probes" else 0) for a in p["apis"])
        n += p.get("unpaired_probe_hits", 0)
        out["agent_charged"] = p["components"]["probe_cost"] * 1e9 / max(n, 1)
        out["agent_price"] = report["sampling"].get("probe_cost_per_class_ns")
    except (OSError, StopIteration, KeyError, ValueError) as e:
        out["agent_error"] = str(e)
    return out


def analyse(raw):
    rows, verdicts = [], []
    for path in sorted(glob.glob(f"{raw}/*.trace")):
        tag = os.path.basename(path)[:-len(".trace")]
        r = analyse_one(raw, tag)
        rows.append(r)
        t = r["truth"]
        tenths = r["truth_tenths"]
        line = (f"{tag}: truth {t:.0f} ns per probed launch ({r['probed']} of {r['launches']} probed, "
                f"{r['windows']} windows; the loop's {r['iteration_truth']:.0f}); tenths {min(tenths):.0f}-{max(tenths):.0f}" if tenths else f"{tag}: truth {t:.0f}")
        for key in ("by_reference", "by_instructions", "agent_charged"):
            if key in r:
                err = (r[key] - t) / t
                line += f"; {key} {r[key]:.0f} ({err * 100:+.1f}%)"
                if key != "agent_charged":
                    verdicts.append(abs(err) <= 0.10)
        if "instructions_per_launch" in r:
            ipl = r["instructions_per_launch"]
            line += f"; user instructions per launch {ipl['windows']:.0f} probed, {ipl['gaps']:.0f} not"
        if "agent_price" in r:
            line += f"; agent's price {r['agent_price']}"
        print(line)
        for w in r.get("per_window", []):
            around = w.get("prices_around")
            print(f"    window at {w['start_ns'] / 1e9:.3f} s, {w['seconds'] * 1e3:.0f} ms, {w['calls']} launches: "
                  f"truth {w['truth']:.0f} ns (the loop's {w['iteration_truth']:.0f}; unprobed launch {w['unprobed_ns']:.0f}); "
                  "prices around it " + (", ".join(f"{p:.0f} (CPU {c})" for p, c in around) if around else "none"))
    json.dump(rows, open(f"{raw}/../hit-trace.json", "w"), indent=1)
    ok = bool(verdicts) and all(verdicts)
    print(f"{sum(verdicts)} of {len(verdicts)} estimates from outside the process within 10% of the truth: "
          f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def windows(paths):
    truth, price = [], []
    for path in paths:
        for run in json.load(open(path)):
            for w in run.get("per_window", []):
                around = [p[0] if isinstance(p, list) else p for p in w.get("prices_around", [])]
                if around:
                    truth.append(w["truth"])
                    price.append(statistics.mean(around))
    if len(truth) < 3:
        print("fewer than 3 windows with prices around them")
        return 1
    r = statistics.correlation(truth, price)
    errors = sorted(abs(p - t) / t for t, p in zip(truth, price))
    bias = (statistics.mean(price) - statistics.mean(truth)) / statistics.mean(truth)
    print(f"{len(truth)} windows: a hit cost the process {min(truth):.0f}-{max(truth):.0f} ns "
          f"(mean {statistics.mean(truth):.0f}); the agent's prices around them: correlation "
          f"{r:.2f}, median error {statistics.median(errors) * 100:.1f}%, mean {bias * 100:+.1f}%")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "sample":
        sample(int(sys.argv[2]), sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "analyse":
        sys.exit(analyse(sys.argv[2]))
    elif len(sys.argv) >= 3 and sys.argv[1] == "windows":
        sys.exit(windows(sys.argv[2:]))
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)

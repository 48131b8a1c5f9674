#!/usr/bin/env python3
"""The share of a process's time its probe hits took, measured inside the process, against the
agent's probe budget (scripts/gpu/validate-budget.sh).

  probe_budget_share.py TRACE PID SNAPSHOT BUDGET   one run: prints a line and a JSON object
  probe_budget_share.py verdict RESULTS.jsonl BUDGET TOLERANCE

TRACE is attribute_micro's per-launch trace (TRACE=PATH: start ns, time ns, flags: bit 0 the
breakpoint at libcuda's cuLaunchKernel before the call, bit 1 after). A window is a run of
launches that met the breakpoint before or after; it is widened by MARGIN_MS on each side so that
what attaching and detaching cost the process (the page the breakpoint is written to is replaced
under it) falls inside. Its cost is the time of its loop iterations (one launch's start to the
next's: what the process lost anywhere in the loop, not only inside the call) less what they take
at the trimmed mean of the untouched iterations within 200 ms of it. The share is the windows' cost
over the loop's wall time (its first 100 launches, which load the kernel, left out). SNAPSHOT is the daemon's snapshot taken before the process exited: its
`probe_seconds` for PID (the agent's own figure, printed beside, not the referee).
"""
import json
import sys

MARGIN_NS = 5_000_000
WARMUP = 100
AROUND_NS = 200_000_000


def trimmed_mean(v):
    import numpy as np

    v = np.sort(v)
    cut = len(v) // 100
    return float(v[cut:len(v) - cut].mean()) if len(v) > 2 * cut else float("nan")


def windows(touched, start):
    """[first, last] launch indices of each run of touched launches (runs closer than 1 ms merged)."""
    import numpy as np

    idx = np.flatnonzero(touched)
    if len(idx) == 0:
        return []
    breaks = np.flatnonzero(np.diff(start[idx]) > 1_000_000)
    firsts = np.concatenate(([idx[0]], idx[breaks + 1]))
    lasts = np.concatenate((idx[breaks], [idx[-1]]))
    return list(zip(firsts.tolist(), lasts.tolist()))


def share(trace, pid, snapshot, budget):
    import numpy as np

    rec = np.fromfile(trace, dtype=np.dtype([("start", "<u8"), ("ns", "<f4"), ("flags", "<u4")]))
    # The first launches load the kernel's module and warm the driver up (milliseconds, probed
    # or not): not the probes' cost.
    rec = rec[WARMUP:]
    start = rec["start"].astype(np.int64)
    # A loop iteration: from one launch's start to the next's.
    it = np.diff(start).astype(np.float64)
    start, flags = start[:-1], rec["flags"][:-1]
    touched = (flags & 3) != 0
    wall = float(start[-1] - start[0] + it[-1])
    spans = windows(touched, start)
    # Every iteration inside a widened window.
    inside = np.zeros(len(it), dtype=bool)
    bounds = []
    for first, last in spans:
        a = np.searchsorted(start, start[first] - MARGIN_NS)
        b = np.searchsorted(start, start[last] + MARGIN_NS, side="right")
        inside[a:b] = True
        bounds.append((a, b, first, last))
    cost, per_window = 0.0, []
    for a, b, first, last in bounds:
        lo = np.searchsorted(start, start[a] - AROUND_NS)
        hi = np.searchsorted(start, start[b - 1] + AROUND_NS, side="right")
        around = it[lo:hi][~inside[lo:hi]]
        base = trimmed_mean(around) if len(around) >= 100 else trimmed_mean(it[~inside])
        c = float(it[a:b].sum() - (b - a) * base)
        cost += c
        per_window.append(dict(start_s=float((start[first] - start[0]) / 1e9),
                               ms=float((start[last] - start[first]) / 1e6),
                               hits=int(touched[first:last + 1].sum()), cost_ms=c / 1e6,
                               per_hit_ns=c / max(1, int(touched[first:last + 1].sum()))))
    agent = None
    try:
        snap = json.load(open(snapshot))
        p = next((p for p in snap.get("processes", []) if p.get("key", {}).get("pid") == pid), None)
        agent = p.get("probe_seconds") if p else None
    except (OSError, ValueError) as e:
        print(f"snapshot {snapshot}: {e}", file=sys.stderr)
    out = dict(launches=int(len(rec)), wall_s=wall / 1e9, windows=len(spans), hits=int(touched.sum()),
               probe_ms=cost / 1e6, share=cost / wall, budget=budget,
               agent_probe_ms=None if agent is None else agent * 1e3,
               agent_share=None if agent is None else agent * 1e9 / wall, per_window=per_window)
    agent_txt = "no figure" if agent is None else f"{agent * 1e3:.2f} ms ({out['agent_share'] * 100:.3f}%)"
    print(f"{out['launches']} launches in {wall / 1e9:.1f} s, {len(spans)} windows, {out['hits']} launches hit: "
          f"the probes took {cost / 1e6:.2f} ms, {out['share'] * 100:.3f}% of the loop (budget {budget * 100:.2f}%); "
          f"the agent's own figure {agent_txt}")
    for w in per_window:
        print(f"    window at {w['start_s']:.2f} s, {w['ms']:.0f} ms, {w['hits']} hits: {w['cost_ms']:.2f} ms "
              f"({w['per_hit_ns']:.0f} ns a hit, attach and detach included)")
    print("RESULT " + json.dumps(out))
    return 0


def verdict(results, budget, tolerance):
    rows = [json.loads(l[len("RESULT "):]) for l in open(results) if l.startswith("RESULT ")]
    ok = bool(rows)
    for i, r in enumerate(rows, 1):
        held = r["share"] <= budget * (1 + tolerance)
        ok = ok and held and r["windows"] > 0
        agent = "none" if r["agent_share"] is None else f"{r['agent_share'] * 100:.3f}%"
        print(f"round {i}: {r['share'] * 100:.3f}% of the loop in {r['windows']} windows (the agent's figure {agent}); "
              f"held to {budget * 100:.2f}% (+{tolerance * 100:.0f}%): {'yes' if held else 'NO'}"
              + ("" if r["windows"] else "; no window: nothing was measured"))
    print(f"verdict: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "verdict":
        sys.exit(verdict(sys.argv[2], float(sys.argv[3]), float(sys.argv[4])))
    if len(sys.argv) == 5:
        sys.exit(share(sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])))
    print(__doc__, file=sys.stderr)
    sys.exit(2)

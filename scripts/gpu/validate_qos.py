#!/usr/bin/env python3
"""QoS tiers on a GPU, checked by completed work (called by validate-qos.sh).

Usage: validate_qos.py LIMITER_SO OUT

Every tenant runs under the limiter with its own region and the same QoS board
(VGPU_QOS_BOARD=OUT/qos.board). Three parts (QOS_PARTS, default "shares,burst,latency"):

shares   Tenants A and B run matmuls launched without a sync per launch (a batch of 16, an event,
         a wait only when 8 batches are in flight), each alone (no tier) and then together,
         guaranteed 30% and 70%, over QOS_SHARE_S (60) s after 8 s of warm-up. A tenant's share =
         its work together / its work alone (12 s). Verdict: the median of QOS_ROUNDS (3) rotated
         rounds within 27-33 and 67-73%.
burst    A (30%) and B (70%) together; B idles for 3 s (a pause file) and resumes. Each reports
         its work every 100 ms. Verdict: A reaches 90% of its solo rate within 1 s of B's
         pause, B is back to 90% of its together-rate within 1 s of resuming, and A is back to
         90% of its together-rate within 1 s of B's resuming too (it keeps its guarantee). The
         per-100 ms counts are written to OUT/qos-burst.csv (plot them).
latency  L: a batch-1 transformer forward pass in a loop with a sync per step, alone, then in the
         latency tier beside a saturating best-effort matmul tenant. Verdict: L's P99 step time
         beside it within +15% of alone; the best-effort tenant's rate is reported.
paced    The same with a request every QOS_PACE_MS (10) ms instead of back to back, so that the
         GPU has idle time between requests for the best-effort tenant (its rate reported).

Writes OUT/qos.json and OUT/qos.txt; exit status 1 if a verdict fails.
"""

import json
import os
import statistics
import subprocess
import sys
import time

from tenants import MATMUL, Tenant, fresh_region, limiter_env

PARTS = os.environ.get("QOS_PARTS", "shares,burst,latency,paced").split(",")
PACE_MS = float(os.environ.get("QOS_PACE_MS", "10"))
ROUNDS = int(os.environ.get("QOS_ROUNDS", "3"))
WARM_S = 8.0
MEASURE_S = 12.0
SHARE_S = float(os.environ.get("QOS_SHARE_S", "60"))

INFER = r"""
import os, time, torch
pace_ns = int(float(os.environ.get("PACE_MS", "0")) * 1e6)
torch.backends.cuda.matmul.allow_tf32 = True
layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
model = torch.nn.TransformerEncoder(layer, 6).cuda().half().eval()
x = torch.randn(1, 128, 512, device="cuda", dtype=torch.float16)
with torch.no_grad():
    for _ in range(20):
        model(x)
    torch.cuda.synchronize()
    print("ready", flush=True)
    due = time.perf_counter_ns()
    while True:
        if pace_ns:
            # A request every PACE_MS: wait for the next one (a late step starts at once).
            due += pace_ns
            now = time.perf_counter_ns()
            if due > now:
                time.sleep((due - now) / 1e9)
            else:
                due = now
        t0 = time.perf_counter_ns()
        model(x)
        torch.cuda.synchronize()
        print("S", time.monotonic_ns(), time.perf_counter_ns() - t0, flush=True)
"""


def tenant(limiter, out, name, code, env_extra):
    """A tenant in a region of its own, on the run's QoS board."""
    region = fresh_region(os.path.join(out, "regions", name + ".region"))
    env = limiter_env(limiter, region, 3,
                      unset=("CUDA_DEVICE_SM_LIMIT", "VGPU_QOS_TIER", "VGPU_QOS_GUARANTEE",
                             "CUDA_TASK_PRIORITY"),
                      VGPU_QOS_BOARD=os.path.join(out, "qos.board"), **env_extra)
    return Tenant(name, code, env, os.path.join(out, name + ".log"))


def window(warm=WARM_S, measure=MEASURE_S):
    time.sleep(warm)
    t0 = time.monotonic_ns()
    time.sleep(measure)
    t1 = time.monotonic_ns()
    time.sleep(0.3)
    return t0, t1


def fresh_board(out):
    p = os.path.join(out, "qos.board")
    if os.path.exists(p):
        os.remove(p)


def solo_rate(limiter, out, name, tag):
    fresh_board(out)
    t = tenant(limiter, out, f"{tag}-{name}-solo", MATMUL, {}).wait_ready()
    try:
        t0, t1 = window(4.0)
        return t.rate(t0, t1)
    finally:
        t.stop()


def shares(limiter, out):
    rounds = []
    for r in range(ROUNDS):
        order = ["A", "B"] if r % 2 == 0 else ["B", "A"]
        solo = {n: solo_rate(limiter, out, n, f"r{r}") for n in order}
        fresh_board(out)
        env = {"A": {"VGPU_QOS_GUARANTEE": "30"}, "B": {"VGPU_QOS_GUARANTEE": "70"}}
        ts = {n: tenant(limiter, out, f"r{r}-{n}-tier", MATMUL, env[n]) for n in order}
        try:
            for t in ts.values():
                t.wait_ready()
            t0, t1 = window(measure=SHARE_S)
            share = {n: round(100 * ts[n].rate(t0, t1) / solo[n], 1) for n in ts}
        finally:
            for t in ts.values():
                t.stop()
        entry = {"round": r, "order": order, "solo": solo, "share": share}
        print(json.dumps(entry), flush=True)
        rounds.append(entry)
    med = {n: statistics.median(x["share"][n] for x in rounds) for n in ("A", "B")}
    ok = 27 <= med["A"] <= 33 and 67 <= med["B"] <= 73
    return {"rounds": rounds, "median": med, "ok": ok,
            "line": f"shares: guaranteed 30/70 got {med['A']}/{med['B']}% of their solo work "
                    f"(median of {ROUNDS}; {[x['share'] for x in rounds]}) -> {'ok' if ok else 'MISS'}"}


def burst(limiter, out):
    solo_a = solo_rate(limiter, out, "A", "burst")
    fresh_board(out)
    pause = os.path.join(out, "burst.pause")
    if os.path.exists(pause):
        os.remove(pause)
    a = tenant(limiter, out, "burst-A", MATMUL, {"VGPU_QOS_GUARANTEE": "30"})
    b = tenant(limiter, out, "burst-B", MATMUL, {"VGPU_QOS_GUARANTEE": "70", "PAUSE_FILE": pause})
    try:
        a.wait_ready()
        b.wait_ready()
        time.sleep(WARM_S)
        t_before = time.monotonic_ns()
        time.sleep(3)
        t_pause = time.monotonic_ns()
        open(pause, "w").close()
        time.sleep(3)
        t_resume = time.monotonic_ns()
        os.remove(pause)
        time.sleep(3)
        t_end = time.monotonic_ns()
        time.sleep(0.3)
    finally:
        a.stop()
        b.stop()
    b_together = b.rate(t_before, t_pause)
    a_together = a.rate(t_before, t_pause)

    def bins(t, start, end):
        out_ = []
        s = start
        while s + 100_000_000 <= end:
            out_.append((s, t.rate(s, s + 100_000_000)))
            s += 100_000_000
        return out_

    a_bins = bins(a, t_before, t_end)
    b_bins = bins(b, t_before, t_end)
    with open(os.path.join(out, "qos-burst.csv"), "w") as f:
        f.write("t_s,a_per_s,b_per_s\n")
        for (s, ra), (_, rb) in zip(a_bins, b_bins):
            f.write(f"{(s - t_pause) / 1e9:.1f},{ra:.1f},{rb:.1f}\n")
    subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                 "plot_qos_burst.py"),
                    os.path.join(out, "qos-burst.csv"), os.path.join(out, "qos-burst.svg")],
                   check=False)
    a_up = next((s for s, r in a_bins if s >= t_pause and r >= 0.9 * solo_a), None)
    b_back = next((s for s, r in b_bins if s >= t_resume and r >= 0.9 * b_together), None)
    # A after B's resumption: its rate over 300 ms windows (single 100 ms bins can be empty
    # when a report falls just outside them), back to 90% of what it had beside B.
    a_back = next((s for s in range(t_resume, t_end - 300_000_000, 100_000_000)
                   if a.rate(s, s + 300_000_000) >= 0.9 * a_together), None)
    up_s = None if a_up is None else round((a_up - t_pause) / 1e9 + 0.1, 2)
    back_s = None if b_back is None else round((b_back - t_resume) / 1e9 + 0.1, 2)
    a_back_s = None if a_back is None else round((a_back - t_resume) / 1e9 + 0.3, 2)
    ok = (up_s is not None and up_s <= 1.0 and back_s is not None and back_s <= 1.0
          and a_back_s is not None and a_back_s <= 1.0)
    return {"solo_a": solo_a, "a_together": a_together, "b_together": b_together,
            "a_reached_90pct_s": up_s, "b_back_90pct_s": back_s, "a_back_90pct_s": a_back_s,
            "ok": ok,
            "line": f"burst: A reached 90% of its solo rate {up_s} s after B idled, B was back "
                    f"to 90% {back_s} s after it resumed, A back to 90% of its share {a_back_s} s "
                    f"after B resumed (within 1 s each) -> {'ok' if ok else 'MISS'}"}


def p99(steps):
    xs = sorted(d for _, d in steps)
    return xs[int(0.99 * (len(xs) - 1))] / 1e6 if xs else None


def latency(limiter, out, pace_ms=None):
    tag = "lat" if pace_ms is None else "paced"
    extra = {} if pace_ms is None else {"PACE_MS": str(pace_ms)}
    fresh_board(out)
    alone = tenant(limiter, out, f"{tag}-alone", INFER, {"VGPU_QOS_TIER": "latency", **extra})
    try:
        alone.wait_ready()
        t0, t1 = window(4.0)
        p_alone = p99([s for s in alone.steps if t0 <= s[0] <= t1])
    finally:
        alone.stop()
    solo_be = solo_rate(limiter, out, "BE", tag)
    fresh_board(out)
    be = tenant(limiter, out, f"{tag}-be", MATMUL, {"VGPU_QOS_TIER": "best-effort"})
    lat = tenant(limiter, out, f"{tag}-beside", INFER, {"VGPU_QOS_TIER": "latency", **extra})
    try:
        be.wait_ready()
        lat.wait_ready()
        t0, t1 = window()
        p_beside = p99([s for s in lat.steps if t0 <= s[0] <= t1])
        be_rate = be.rate(t0, t1)
    finally:
        lat.stop()
        be.stop()
    ok = p_alone is not None and p_beside is not None and p_beside <= 1.15 * p_alone
    what = "back to back" if pace_ms is None else f"a step every {pace_ms} ms"
    return {"pace_ms": pace_ms, "p99_alone_ms": p_alone, "p99_beside_ms": p_beside,
            "best_effort_share_of_solo": round(100 * be_rate / solo_be, 1), "ok": ok,
            "line": f"{'latency' if pace_ms is None else 'paced'}: ({what}) P99 {p_alone} ms alone, {p_beside} ms beside a best-effort "
                    f"matmul (within +15%?), best effort got {round(100 * be_rate / solo_be, 1)}% "
                    f"of its solo work -> {'ok' if ok else 'MISS'}"}


def paced(limiter, out):
    return latency(limiter, out, PACE_MS)


def main():
    limiter, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    parts = {"shares": shares, "burst": burst, "latency": latency, "paced": paced}
    summary, lines, ok = {}, [], True
    for name in PARTS:
        res = parts[name](limiter, out)
        summary[name] = res
        lines.append(res["line"])
        print(res["line"], flush=True)
        ok &= res["ok"]
    summary["verdict"] = "PASS" if ok else "FAIL"
    lines.append(f"verdict: {summary['verdict']}")
    with open(os.path.join(out, "qos.json"), "w") as f:
        json.dump(summary, f, indent=1)
    with open(os.path.join(out, "qos.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(lines[-1])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

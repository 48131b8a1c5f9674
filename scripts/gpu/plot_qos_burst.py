#!/usr/bin/env python3
"""Plots validate_qos.py's burst part (qos-burst.csv) as an SVG, without plotting libraries.

Usage: plot_qos_burst.py QOS_BURST_CSV OUT_SVG [TITLE]

The CSV has t_s (seconds from B's pause), a_per_s and b_per_s (each tenant's completed matmuls
per second over 100 ms). The plot marks B's pause (t = 0) and resumption (t = 3 s).
"""

import csv
import sys

W, H, PAD = 720, 300, 48


def main():
    src, dst = sys.argv[1], sys.argv[2]
    title = sys.argv[3] if len(sys.argv) > 3 else "QoS burst: A guaranteed 30%, B 70%"
    rows = [(float(r["t_s"]), float(r["a_per_s"]), float(r["b_per_s"]))
            for r in csv.DictReader(open(src))]
    t0, t1 = rows[0][0], rows[-1][0]
    top = max(max(a, b) for _, a, b in rows) * 1.1 or 1.0

    def x(t):
        return PAD + (t - t0) / (t1 - t0) * (W - 2 * PAD)

    def y(v):
        return H - PAD - v / top * (H - 2 * PAD)

    def line(col, colour):
        pts = " ".join(f"{x(r[0]):.1f},{y(r[col]):.1f}" for r in rows)
        return f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{pts}"/>'

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{PAD}" y="20" font-size="14">{title}</text>',
           f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" stroke="black"/>',
           f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{H - PAD}" stroke="black"/>']
    for t in range(int(t0), int(t1) + 1):
        out.append(f'<text x="{x(t):.1f}" y="{H - PAD + 16}" text-anchor="middle">{t}</text>')
    for frac in (0.0, 0.5, 1.0):
        v = top / 1.1 * frac
        out.append(f'<text x="{PAD - 4}" y="{y(v) + 4:.1f}" text-anchor="end">{v / 1000:.0f}k</text>')
    for t, label in ((0.0, "B idles"), (3.0, "B resumes")):
        if t0 <= t <= t1:
            out.append(f'<line x1="{x(t):.1f}" y1="{PAD}" x2="{x(t):.1f}" y2="{H - PAD}" '
                       f'stroke="grey" stroke-dasharray="4 3"/>')
            out.append(f'<text x="{x(t) + 4:.1f}" y="{PAD + 12}">{label}</text>')
    out.append(line(1, "#1f77b4"))
    out.append(line(2, "#d62728"))
    out.append(f'<text x="{W - PAD - 150}" y="{PAD - 8}" fill="#1f77b4">A (guaranteed 30)</text>')
    out.append(f'<text x="{W - PAD - 40}" y="{PAD - 8}" fill="#d62728">B (70)</text>')
    out.append(f'<text x="{W / 2}" y="{H - 8}" text-anchor="middle">seconds from B\'s pause; '
               f'completed matmuls per second over 100 ms</text>')
    out.append("</svg>")
    open(dst, "w").write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# Screenshot of `vgpu-agent top` on the GPU machine, for the README. Run as
# root from the repo root after `cargo xtask bundle` (binaries in .carry/bin). Needs tmux and
# python3; with Pillow (python3-pil) and a monospace font (fonts-dejavu-core) it renders PNGs,
# else it leaves the colour HTML and text captures. Results go to $OUT (default /tmp/out):
#   top.txt/.html/.png (the table), top-tree.* (containers expanded), top-detail.* (a process).
# Two workloads in two cgroups shaped like a docker container and a Kubernetes pod: a PyTorch
# loop when torch is importable (else cuda-exercise alloc-free rounds), and cuda-exercise
# pressure under the limiter with a 2 GiB limit it keeps hitting.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
BIN=$PWD/.carry/bin
# On tmpfs, as regions are deployed (docs/region.md): on a disk filesystem a region's first
# touches cost the limiter milliseconds, which the screenshot's hook times would show.
T=$(mktemp -d -p /dev/shm vgpu-shot.XXXXXX)
[ "$(id -u)" = 0 ] || { echo "run as root (cgroups, probes)"; exit 1; }
command -v tmux >/dev/null || { echo "tmux is missing: apt-get install -y tmux"; exit 1; }
CG=/sys/fs/cgroup/vgpu-shot-$$
DOCKER=$CG/docker/5c4eef1e2d3c4b5a69788796a5b4c3d2e1f0fedcba9876543210fedcba98765
POD=$CG/kubepods/burstable/pod7d1c0ffe-0000-4000-8000-00000000be11/9b1e2d3c4b5a69788796a5b4c3d2e1f0fedcba9876543210fedcba9876543a
mkdir -p "$DOCKER" "$POD" "$T/regions/pod"
SOCK=vgpu-shot-$$
cleanup() {
  tmux -L "$SOCK" kill-server 2>/dev/null
  for c in "$DOCKER" "$POD"; do echo 1 > "$c/cgroup.kill" 2>/dev/null; done
  sleep 1
  rmdir "$POD" "$DOCKER" 2>/dev/null; rmdir -p --ignore-fail-on-non-empty "$(dirname "$POD")" "$(dirname "$DOCKER")" 2>/dev/null
  rmdir "$CG" 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT

if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  sh -c "echo \$\$ > $DOCKER/cgroup.procs; exec python3 -c '
import torch, time
x = torch.randn(8192, 8192, device=\"cuda\")
while True:
    for _ in range(50):
        y = x @ x
    torch.cuda.synchronize()
    time.sleep(0.05)
'" >/dev/null 2>&1 &
else
  sh -c "echo \$\$ > $DOCKER/cgroup.procs; while :; do '$BIN/cuda-exercise' alloc-free --ops 400 --max-size 256m; done" >/dev/null 2>&1 &
fi
LIMITER=$BIN/libvgpu_limiter.so
[ -e "$LIMITER" ] || LIMITER=$PWD/target/release/libvgpu_limiter.so
sh -c "echo \$\$ > $POD/cgroup.procs; export LD_PRELOAD='$LIMITER' CUDA_DEVICE_MEMORY_LIMIT=2g CUDA_DEVICE_MEMORY_SHARED_CACHE='$T/regions/pod/vgpu.cache'; exec '$BIN/cuda-exercise' pressure --chunk 256m --delay-ms 300 --seconds 600" >"$OUT/pod-workload.log" 2>&1 &
POD_PID=$!

tmux -L "$SOCK" -f /dev/null new-session -d -s top -x 160 -y 48 \
  "TERM=xterm-256color '$BIN/vgpu-agent' top --no-daemon --interval 1s --region-dir '$T/regions' 2>'$OUT/top.stderr'"
capture() { # name
  tmux -L "$SOCK" capture-pane -p -t top > "$OUT/$1.txt"
  tmux -L "$SOCK" capture-pane -p -e -t top > "$OUT/$1.ansi"
}
sleep 10; capture top
# The pod's workload must still run for the capture to show it (its output: pod-workload.log).
kill -0 "$POD_PID" 2>/dev/null || { echo "warning: the pod's workload exited before the capture:"; tail -n 20 "$OUT/pod-workload.log"; }
tmux -L "$SOCK" send-keys -t top t; sleep 2; capture top-tree
tmux -L "$SOCK" send-keys -t top g j Enter; sleep 2; capture top-detail
tmux -L "$SOCK" send-keys -t top q; sleep 1
cat "$OUT/top.txt"

python3 - "$OUT" <<'PY'
import html, re, sys, os
out = sys.argv[1]
BASE = [(0,0,0),(205,49,49),(13,188,121),(229,229,16),(36,114,200),(188,63,188),(17,168,205),(229,229,229),
        (102,102,102),(241,76,76),(35,209,139),(245,245,67),(59,142,234),(214,112,214),(41,184,219),(255,255,255)]
def c256(n):
    if n < 16: return BASE[n]
    if n < 232:
        n -= 16; v = [0, 95, 135, 175, 215, 255]
        return (v[n // 36], v[n // 6 % 6], v[n % 6])
    g = 8 + (n - 232) * 10; return (g, g, g)
FG, BG = (220, 220, 220), (24, 24, 24)
def parse(text):
    """Lines of (char, fg, bg, bold) from tmux's capture with escapes."""
    lines = []
    for raw in text.split("\n"):
        fg, bg, bold, rev, cells = FG, BG, False, False, []
        for tok in re.split(r"(\x1b\[[0-9;]*m)", raw):
            m = re.fullmatch(r"\x1b\[([0-9;]*)m", tok)
            if not m:
                for ch in tok:
                    f, b = (bg, fg) if rev else (fg, bg)
                    cells.append((ch, f, b, bold))
                continue
            p = [int(x) if x else 0 for x in m.group(1).split(";")]
            i = 0
            while i < len(p):
                v = p[i]
                if v == 0: fg, bg, bold, rev = FG, BG, False, False
                elif v == 1: bold = True
                elif v == 7: rev = True
                elif v == 22: bold = False
                elif v == 27: rev = False
                elif 30 <= v <= 37: fg = BASE[v - 30]
                elif 90 <= v <= 97: fg = BASE[v - 82]
                elif 40 <= v <= 47: bg = BASE[v - 40]
                elif 100 <= v <= 107: bg = BASE[v - 92]
                elif v == 39: fg = FG
                elif v == 49: bg = BG
                elif v in (38, 48) and i + 1 < len(p):
                    if p[i + 1] == 5 and i + 2 < len(p):
                        col = c256(p[i + 2]); i += 2
                    elif p[i + 1] == 2 and i + 4 < len(p):
                        col = tuple(p[i + 2:i + 5]); i += 4
                    else:
                        col = FG if v == 38 else BG
                    if v == 38: fg = col
                    else: bg = col
                i += 1
        lines.append(cells)
    return lines
for name in ("top", "top-tree", "top-detail"):
    path = os.path.join(out, name + ".ansi")
    if not os.path.exists(path): continue
    lines = parse(open(path, encoding="utf-8", errors="replace").read())
    rgb = lambda c: "#%02x%02x%02x" % c
    with open(os.path.join(out, name + ".html"), "w") as h:
        h.write('<pre style="background:%s;color:%s;font-family:monospace;line-height:1.2">' % (rgb(BG), rgb(FG)))
        for cells in lines:
            for ch, f, b, bold in cells:
                h.write('<span style="color:%s;background:%s%s">%s</span>' % (rgb(f), rgb(b), ";font-weight:bold" if bold else "", html.escape(ch)))
            h.write("\n")
        h.write("</pre>\n")
    try:
        from PIL import Image, ImageDraw, ImageFont
    except ImportError:
        print(f"{name}: Pillow not installed (apt-get install -y python3-pil): HTML only"); continue
    font = bold_font = None
    for d in ("/usr/share/fonts/truetype/dejavu", "/usr/share/fonts/truetype/liberation"):
        for reg, bld in (("DejaVuSansMono.ttf", "DejaVuSansMono-Bold.ttf"), ("LiberationMono-Regular.ttf", "LiberationMono-Bold.ttf")):
            if os.path.exists(os.path.join(d, reg)):
                font = ImageFont.truetype(os.path.join(d, reg), 16)
                bold_font = ImageFont.truetype(os.path.join(d, bld), 16) if os.path.exists(os.path.join(d, bld)) else font
                break
        if font: break
    if font is None:
        print(f"{name}: no monospace TrueType font (apt-get install -y fonts-dejavu-core): HTML only"); continue
    cw = round(font.getlength("M")); ch_h = 20
    width = max(len(c) for c in lines) * cw + 16
    img = Image.new("RGB", (width, len(lines) * ch_h + 16), BG)
    d = ImageDraw.Draw(img)
    for y, cells in enumerate(lines):
        for x, (ch, f, b, bold) in enumerate(cells):
            px, py = 8 + x * cw, 8 + y * ch_h
            if b != BG: d.rectangle([px, py, px + cw, py + ch_h], fill=b)
            if ch != " ": d.text((px, py), ch, fill=f, font=bold_font if bold else font)
    img.save(os.path.join(out, name + ".png"))
    print("wrote", os.path.join(out, name + ".png"))
PY

"""Counts what the limiter touches per stretch between driver calls in a lackey trace
(scripts/vm/lackey-stretches.sh runs it). Arguments: TRACE MAPS LIMITER_SO SIMCUDA_SO."""
import sys, collections, re, subprocess
trace, maps, limpath, simpath = sys.argv[1:5]
regions = []
for l in open(maps):
    p = l.split()
    a, b = (int(x, 16) for x in p[0].split('-'))
    name = p[5] if len(p) > 5 else '[anon]'
    regions.append((a, b, name, p[1], int(p[2], 16)))
def region_of(x):
    for a, b, n, perm, off in regions:
        if a <= x < b:
            return a, b, n, perm, off
    return None
lim = [r for r in regions if r[2].endswith('libvgpu_limiter.so')]
sim = [r for r in regions if r[2].endswith('libsimcuda.so')]
lim_x = [(a, b) for a, b, n, perm, off in lim if 'x' in perm]
lim_base = min(a for a, *_ in lim)
sim_base = min(a for a, *_ in sim)
def sym_addr(path, name):
    out = subprocess.run(['nm', '-D', '--defined-only', path], capture_output=True, text=True).stdout
    for l in out.splitlines():
        p = l.split()
        if p[-1] == name:
            return int(p[0], 16)
alloc_e = sim_base + sym_addr(simpath, 'cuMemAlloc_v2')
free_e = sim_base + sym_addr(simpath, 'cuMemFree_v2')
def in_lim(x):
    return any(a <= x < b for a, b in lim_x)
def classify(x):
    r = region_of(x)
    if r is None: return 'unmapped'
    a, b, n, perm, off = r
    if n.endswith('libvgpu_limiter.so'):
        return f'limiter {perm} +{x - lim_base:#x}'[:40]
    return n.split('/')[-1]
stretches = []  # (name, instrs, code_lines, data_lines{line:class})
cur = None
for l in open(trace):
    if l.startswith('I'):
        x = int(l[3:].split(',')[0], 16)
        if x == alloc_e or x == free_e:
            if cur: stretches.append(cur)
            cur = ['after_alloc' if x == alloc_e else 'after_free', 0, set(), {}]
            last_lim = False
            continue
        last_lim = in_lim(x)
        if cur is not None and last_lim:
            cur[1] += 1
            cur[2].add(x >> 6)
    elif cur is not None and last_lim and l[:2] in (' L', ' S', ' M'):
        x = int(l[3:].split(',')[0], 16)
        cur[3][x >> 6] = classify(x)
# drop the first 20 and last 5 stretches
st = stretches[20:-5]
for kind in ('after_alloc', 'after_free'):
    s = [x for x in st if x[0] == kind]
    n = len(s)
    if not n: continue
    instr = sum(x[1] for x in s) / n
    code_lines = sum(len(x[2]) for x in s) / n
    code_pages = sum(len({c >> 6 for c in x[2]}) for x in s) / n
    data_lines = sum(len(x[3]) for x in s) / n
    pages = collections.Counter()
    lines_by = collections.Counter()
    for x in s:
        seen = set()
        for line, cls in x[3].items():
            key = (line >> 6, cls.split(' +')[0] if 'limiter' not in cls else cls.rsplit(' +',1)[0])
            lines_by[key[1]] += 1
            seen.add(key)
        for k in seen: pages[k[1]] += 1
    print(f'{kind}: {n} stretches, instructions {instr:.0f}, code lines {code_lines:.1f}, code pages {code_pages:.1f}, data lines {data_lines:.1f}')
    for cls, c in sorted(pages.items(), key=lambda kv: -kv[1]):
        print(f'   {cls:40} pages {c / n:4.1f}  lines {lines_by[cls] / n:4.1f}')
    # code pages detail
    cp = collections.Counter()
    for x in s:
        for pg in {c >> 6 for c in x[2]}: cp[pg] += 1
    print('   code pages (offset: share):', ', '.join(f'{(pg << 12) - lim_base:#x}:{c/n:.1f}' for pg, c in sorted(cp.items())))
    # The same without the stretches that polled the control block (at most every 10 ms of the
    # TSC, so under valgrind's slowdown a varying share of them): the figures to compare builds by.
    q = [x for x in s if not any(c.endswith('.ctl') for c in x[3].values())]
    if q:
        m = len(q)
        print(f'{kind} without the control poll: {m} stretches, instructions {sum(x[1] for x in q) / m:.0f}, '
              f'code lines {sum(len(x[2]) for x in q) / m:.1f}, '
              f'code pages {sum(len({c >> 6 for c in x[2]}) for x in q) / m:.1f}, '
              f'data lines {sum(len(x[3]) for x in q) / m:.1f}')

# Which lines of .text.hot run (executed at least 100 times in the trace): '#' per line.
sec = subprocess.run(['readelf', '-SW', limpath], capture_output=True, text=True).stdout
for l in sec.splitlines():
    if '.text.hot' in l:
        f = l.split(']')[1].split()
        lo = int(f[2], 16)
        hi = lo + int(f[4], 16)
        ran = collections.Counter()
        for line in open(trace):
            if line.startswith('I'):
                x = int(line[3:].split(',')[0], 16) - lim_base
                if lo <= x < hi:
                    ran[x >> 6] += 1
        hot = [k for k in ran if ran[k] >= 100]
        print(f'.text.hot {lo:#x}-{hi:#x}: {len(hot)} lines run, on {len({k >> 6 for k in hot})} pages')
        row = ''.join('#' if ran[lo // 64 + i] >= 100 else '.' for i in range((hi - lo + 63) // 64))
        for i in range(0, len(row), 64):
            print(f'  {lo + i * 64:#x} {row[i:i + 64]}')

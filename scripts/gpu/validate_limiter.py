"""GPU validation of the limiter: each case of limiter_cases.py under
CUDA_DEVICE_MEMORY_LIMIT=4g with its own region, then nvidia-smi's per-process memory against the
region's accounting. Usage: validate_limiter.py LIMITER_SO AGENT OUT [CASE...]"""
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import limiter_region  # noqa: E402

MIB = 1 << 20
LIMIT = 4096 * MIB
CASES = ["torch", "torch-expandable", "cupy", "cupy-async", "jax", "ctypes"]
HERE = os.path.dirname(os.path.abspath(__file__))


def nvml_used(pid):
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
    except FileNotFoundError:
        return None
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid):
            return int(parts[1]) * MIB
    return None


def run_case(case, limiter, agent, out_dir):
    tmp = tempfile.mkdtemp(prefix=f"limiter-{case}-")
    region = os.path.join(tmp, "container.region")
    env = dict(os.environ, LD_PRELOAD=limiter, CUDA_DEVICE_MEMORY_LIMIT="4g",
               CUDA_DEVICE_MEMORY_SHARED_CACHE=region, LIBCUDA_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    if case == "torch-expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    res = {"case": case, "checks": {}, "region_file": region}
    log = open(os.path.join(out_dir, f"{case}.log"), "w")
    p = subprocess.Popen([sys.executable, os.path.join(HERE, "limiter_cases.py"), case], env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
    line = p.stdout.readline()
    if not line:
        p.wait()
        res["error"] = f"no output (exit {p.returncode}); see {case}.log"
        res["pass"] = False
        return res
    holding = json.loads(line)
    res["holding"] = holding
    time.sleep(1.0)  # let nvidia-smi's sampling catch up
    used = nvml_used(p.pid)
    reg = limiter_region.read(region)
    slot = next((s for s in reg["slots"] if s["pid"] == p.pid), None)
    held = slot["held"][0] if slot else None
    context = slot["context"][0] if slot else None
    res.update(nvml_used=used, region_held=held, region_context=context,
               region_reserved=reg["devices"][0]["reserved"], region_limit=reg["devices"][0]["limit"])
    stat = subprocess.run([agent, "stat", "--json", "--duration", "1s", "--region-dir", tmp],
                          capture_output=True, text=True)
    with open(os.path.join(out_dir, f"{case}.stat.json"), "w") as f:
        f.write(stat.stdout or stat.stderr)
    got = holding.get("got", 0)
    c = res["checks"]
    c["failed_cleanly_at_the_limit"] = holding.get("error") is not None and got > 0
    c["got_within_limit"] = got <= LIMIT
    room = LIMIT - (context or 0)
    # JAX preallocates 75 % of the total it is shown (the limit) and allocates inside that.
    c["got_close_to_limit"] = got >= (0.7 * room if case == "jax" else room - 512 * MIB)
    c["region_within_limit"] = held is not None and held <= LIMIT
    c["nvml_within_limit"] = used is not None and used <= LIMIT
    c["nvml_agrees_with_region"] = (used is not None and held is not None
                                    and abs(used - held) <= max(256 * MIB, held // 10))
    if case == "jax":
        bl = holding.get("bytes_limit")
        c["jax_bytes_limit_within_limit"] = bl is not None and bl <= LIMIT
    p.stdin.write("go\n")
    p.stdin.flush()
    done = p.stdout.readline()
    p.wait(timeout=120)
    res["done"] = json.loads(done) if done else None
    c["allocates_again_after_release"] = bool(res["done"] and res["done"].get("again_ok"))
    after = limiter_region.read(region)
    c["exit_returned_everything"] = after["devices"][0]["reserved"] == 0 and not after["slots"]
    res["pass"] = all(c.values())
    return res


def main():
    limiter, agent, out_dir = sys.argv[1:4]
    cases = sys.argv[4:] or CASES
    results = []
    for case in cases:
        try:
            r = run_case(case, limiter, agent, out_dir)
        except Exception as e:  # noqa: BLE001 - one broken case must not hide the others
            r = {"case": case, "pass": False, "error": repr(e)}
        results.append(r)
        failed = [k for k, v in r.get("checks", {}).items() if not v]
        print(f"{'PASS' if r['pass'] else 'FAIL'} {case}: got {r.get('holding', {}).get('got')} "
              f"nvml {r.get('nvml_used')} region {r.get('region_held')} "
              f"(context {r.get('region_context')}) {'failed: ' + ', '.join(failed) if failed else ''}"
              f"{r.get('error', '')}", flush=True)
    with open(os.path.join(out_dir, "validate-limiter.json"), "w") as f:
        json.dump(results, f, indent=1)
    sys.exit(0 if all(r["pass"] for r in results) else 1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Validates deploy/ offline, as `./x test` runs it:

1. Each overlay (overlays/standalone, overlays/hami) is rendered by `kubectl kustomize` (the
   kubectl of `cargo xtask setup`); the rendered core objects are validated against the
   Kubernetes OpenAPI schemas that `kubernetes-validate` bundles (strict: unknown fields fail),
   for the oldest and newest Kubernetes versions we support; the ServiceMonitor and
   PrometheusRule against the monitoring.coreos.com/v1 fields they use (their CRD schemas are not
   bundled); the objects against each other (selectors, the metrics port, capabilities,
   read-only mounts) and against what the overlay is for (nodes and region directories).
2. The alert rules: scripts/gen-alerts.py writes exactly the checked-in files; the
   PrometheusRule holds the same groups as the plain rules file; `promtool check rules` and
   `promtool test rules` pass; every alert has a test that fires it and a runbook section in
   docs/alerts.md; every metric a rule names is in docs/metrics.md's table.
"""
import os
import re
import subprocess
import sys
import tempfile

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
VERSIONS = ["1.29.0", "1.37.0"]
CORE_KINDS = {"Namespace", "ServiceAccount", "DaemonSet", "Service"}
OVERLAYS = ["standalone", "hami"]
HAMI_REGIONS = "/usr/local/vgpu/containers"
VGPU_REGIONS = "/var/lib/vgpu-agent/regions"
RULES = os.path.join(HERE, "alerts/vgpu-agent.rules.yml")
RULE_TESTS = os.path.join(HERE, "alerts/vgpu-agent.tests.yml")
PROMETHEUS_RULE = os.path.join(HERE, "components/prometheus-operator/prometheusrule.yaml")


def fail(msg):
    print(f"deploy: {msg}", file=sys.stderr)
    sys.exit(1)


def tool(name):
    """A tool beside this Python (the venv of `cargo xtask setup`), else on PATH."""
    exe = os.path.join(os.path.dirname(sys.executable), name)
    return exe if os.path.exists(exe) else name


def run(args, what):
    try:
        r = subprocess.run(args, capture_output=True, text=True)
    except FileNotFoundError:
        fail(f"{args[0]} not found: run `cargo xtask setup`")
    if r.returncode != 0:
        fail(f"{what} failed:\n{r.stdout}{r.stderr}")
    return r.stdout


def render(overlay):
    out = run([tool("kubectl"), "kustomize", os.path.join(HERE, "overlays", overlay)],
              f"kubectl kustomize overlays/{overlay}")
    objs = [o for o in yaml.safe_load_all(out) if o]
    kinds = sorted(o["kind"] for o in objs)
    want = sorted(CORE_KINDS | {"ServiceMonitor", "PrometheusRule"})
    if kinds != want:
        fail(f"overlays/{overlay} renders {kinds}, not {want}")
    return {o["kind"]: o for o in objs}


def validate_schemas(overlay, objs):
    with tempfile.TemporaryDirectory() as d:
        files = []
        for kind in sorted(CORE_KINDS):
            path = os.path.join(d, f"{kind}.yaml")
            with open(path, "w") as f:
                yaml.safe_dump(objs[kind], f)
            files.append(path)
        for v in VERSIONS:
            run([tool("kubernetes-validate"), "--strict", "--quiet", "-k", v, *files],
                f"schema validation of overlays/{overlay} against Kubernetes {v}")


def check_service_monitor(sm):
    if sm.get("apiVersion") != "monitoring.coreos.com/v1":
        fail("the ServiceMonitor is not monitoring.coreos.com/v1")
    spec = sm["spec"]
    allowed_spec = {"selector", "namespaceSelector", "endpoints", "jobLabel", "targetLabels", "podTargetLabels"}
    if set(spec) - allowed_spec:
        fail(f"unknown ServiceMonitor spec fields {set(spec) - allowed_spec}")
    allowed_ep = {"port", "path", "interval", "scrapeTimeout", "relabelings", "metricRelabelings", "scheme", "honorLabels"}
    for ep in spec["endpoints"]:
        if set(ep) - allowed_ep:
            fail(f"unknown endpoint fields {set(ep) - allowed_ep}")
        for r in ep.get("relabelings", []):
            if not set(r) <= {"sourceLabels", "targetLabel", "regex", "replacement", "action", "separator"}:
                fail(f"bad relabeling {r}")


def check_prometheus_rule(pr):
    if pr.get("apiVersion") != "monitoring.coreos.com/v1":
        fail("the PrometheusRule is not monitoring.coreos.com/v1")
    if set(pr["spec"]) != {"groups"}:
        fail(f"unknown PrometheusRule spec fields {set(pr['spec'])}")
    for g in pr["spec"]["groups"]:
        if set(g) - {"name", "interval", "rules"}:
            fail(f"unknown rule group fields {set(g)}")
        for r in g["rules"]:
            if set(r) - {"alert", "record", "expr", "for", "labels", "annotations"}:
                fail(f"unknown rule fields {set(r)}")
            if not isinstance(r["expr"], str) or ("for" in r and not re.fullmatch(r"\d+[smh]", r["for"])):
                fail(f"rule {r.get('alert')}: expr must be a string, for a duration")
    with open(RULES) as f:
        plain = yaml.safe_load(f)
    if pr["spec"]["groups"] != plain["groups"]:
        fail("the PrometheusRule and deploy/alerts/vgpu-agent.rules.yml hold different rules: "
             "run scripts/gen-alerts.py")


def check_together(overlay, objs):
    ds, svc, sm = objs["DaemonSet"], objs["Service"], objs["ServiceMonitor"]
    namespaces = {o["metadata"].get("namespace") for k, o in objs.items() if k != "Namespace"}
    if namespaces != {objs["Namespace"]["metadata"]["name"]}:
        fail(f"overlays/{overlay}: objects in namespaces {namespaces}")
    pod = ds["spec"]["template"]
    labels = pod["metadata"]["labels"]
    if ds["spec"]["selector"]["matchLabels"].items() - labels.items():
        fail("the DaemonSet's selector does not match its pods")
    if svc["spec"]["selector"].items() - labels.items():
        fail("the Service selects no agent pod")
    spec = sm["spec"]
    if spec["selector"]["matchLabels"].items() - svc["metadata"]["labels"].items():
        fail("the ServiceMonitor selects no Service")
    c = pod["spec"]["containers"][0]
    port = {p["name"]: p["containerPort"] for p in c["ports"]}["metrics"]
    args = c["args"]
    listen = [a for a in args if a.startswith("--metrics-listen=")]
    if listen != [f"--metrics-listen=0.0.0.0:{port}"]:
        fail(f"--metrics-listen {listen} does not serve the metrics port {port}")
    if svc["spec"]["ports"][0]["targetPort"] != "metrics" or spec["endpoints"][0]["port"] != "metrics":
        fail("the Service and ServiceMonitor must use the `metrics` port")
    if not pod["spec"].get("hostPID"):
        fail("the agent needs hostPID")
    caps = c["securityContext"]["capabilities"]
    if caps.get("drop") != ["ALL"] or sorted(caps["add"]) != ["BPF", "CHECKPOINT_RESTORE", "DAC_READ_SEARCH", "PERFMON", "SYS_PTRACE"]:
        fail(f"capabilities changed: {caps}; update README.md's justification and this check")
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    volumes = {v["name"] for v in pod["spec"]["volumes"]}
    if {m["name"] for m in mounts.values()} - volumes:
        fail(f"overlays/{overlay}: a mount names no volume")
    # What each overlay is for: its nodes and the region directories it reads.
    regions = [a.split("=", 1)[1] for a in args if a.startswith("--region-dir=")]
    nodes = pod["spec"]["nodeSelector"]
    want_regions, want_nodes = {
        "standalone": ([VGPU_REGIONS], {"nvidia.com/gpu.present": "true"}),
        "hami": ([VGPU_REGIONS, HAMI_REGIONS], {"gpu": "on"}),
    }[overlay]
    if regions != want_regions or nodes != want_nodes:
        fail(f"overlays/{overlay}: regions {regions} on nodes {nodes}, want {want_regions} on {want_nodes}")
    for path in ["/sys/fs/cgroup", "/sys/kernel/btf", "/host", *regions]:
        if not mounts.get(path, {}).get("readOnly"):
            fail(f"overlays/{overlay}: {path} must be mounted read-only")


def exported_metrics():
    """Series names in docs/metrics.md's generated table (kept equal to the code by a test)."""
    with open(os.path.join(ROOT, "docs/metrics.md")) as f:
        doc = f.read()
    table = doc.split("<!-- metrics table")[1].split("<!-- end of metrics table")[0]
    return set(re.findall(r"`(vgpu_[a-z0-9_]+)`", table))


def check_alerts():
    run([sys.executable, os.path.join(ROOT, "scripts/gen-alerts.py"), "--check"], "scripts/gen-alerts.py --check")
    run(["promtool", "check", "rules", RULES], "promtool check rules")
    # promtool resolves rule_files relative to the test file.
    out = run(["promtool", "test", "rules", RULE_TESTS], "promtool test rules")
    with open(RULES) as f:
        rules = [r for g in yaml.safe_load(f)["groups"] for r in g["rules"]]
    with open(RULE_TESTS) as f:
        tests = yaml.safe_load(f)["tests"]
    fired = {t["alertname"] for case in tests for t in case.get("alert_rule_test", []) if t.get("exp_alerts")}
    with open(os.path.join(ROOT, "docs/alerts.md")) as f:
        runbook = f.read()
    sections = {h[3:].strip().lower() for h in runbook.splitlines() if h.startswith("## ")}
    known = exported_metrics()
    for r in rules:
        name = r["alert"]
        if name not in fired:
            fail(f"alert {name} has no promtool test case that fires it")
        anchor = r["annotations"].get("runbook_url", "").rsplit("#", 1)[-1]
        if anchor != name.lower() or anchor not in sections:
            fail(f"alert {name}: runbook_url #{anchor} has no section in docs/alerts.md")
        for m in set(re.findall(r"\bvgpu_[a-z0-9_]+", r["expr"])) - known:
            fail(f"alert {name} names {m}, which the agent does not export (docs/metrics.md)")
    return len(rules), out.strip().splitlines()[-1].strip()


def check_freeze_pool():
    """The freeze pool component on the standalone overlay: rendered and valid, and what the
    pool needs (its flags within the host budget, SYS_ADMIN for its tmpfs, a memory limit that
    holds it) on top of what the base has."""
    with tempfile.TemporaryDirectory(dir=HERE) as tmp:
        with open(os.path.join(tmp, "kustomization.yaml"), "w") as f:
            f.write("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
                    "resources:\n  - ../overlays/standalone\n"
                    "components:\n  - ../components/freeze-pool\n")
        out = run([tool("kubectl"), "kustomize", tmp], "kubectl kustomize with components/freeze-pool")
    objs = {o["kind"]: o for o in yaml.safe_load_all(out) if o}
    validate_schemas("standalone+freeze-pool", objs)
    c = objs["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]
    args = c["args"]
    flag = lambda name: [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]
    pool, budget = flag("freeze-pool"), flag("freeze-host-budget")
    if len(pool) != 1 or len(budget) != 1 or pool != budget:
        fail(f"components/freeze-pool: --freeze-pool {pool} must equal --freeze-host-budget {budget}")
    gib = lambda v: int(re.fullmatch(r"(\d+)[gG](i)?", v).group(1))
    limit = c["resources"]["limits"]["memory"]
    if gib(limit.removesuffix("i")) < gib(pool[0]) + 1:
        fail(f"components/freeze-pool: a memory limit of {limit} cannot hold a {pool[0]} pool")
    caps = sorted(c["securityContext"]["capabilities"]["add"])
    if caps != ["BPF", "CHECKPOINT_RESTORE", "DAC_READ_SEARCH", "PERFMON", "SYS_ADMIN", "SYS_PTRACE"]:
        fail(f"components/freeze-pool: capabilities {caps}: the base's and SYS_ADMIN")
    sock = flag("freeze-pool-socket")
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    if len(sock) != 1 or os.path.dirname(os.path.dirname(sock[0])) not in mounts:
        fail(f"components/freeze-pool: the socket {sock} is not under a host directory the pod mounts")


def main():
    check_freeze_pool()
    for overlay in OVERLAYS:
        objs = render(overlay)
        validate_schemas(overlay, objs)
        check_service_monitor(objs["ServiceMonitor"])
        check_prometheus_rule(objs["PrometheusRule"])
        check_together(overlay, objs)
    rules, promtool = check_alerts()
    print(f"deploy: overlays {', '.join(OVERLAYS)} (and standalone with components/freeze-pool) "
          f"rendered by kubectl kustomize and valid "
          f"(Kubernetes {', '.join(VERSIONS)}); {rules} alert rules, promtool test rules: {promtool}")


if __name__ == "__main__":
    main()

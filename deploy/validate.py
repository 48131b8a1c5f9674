#!/usr/bin/env python3
"""Validates deploy/*.yaml offline: the core kinds against the Kubernetes OpenAPI schemas that the
`kubernetes-validate` package bundles (strict: unknown fields fail), for the oldest and newest
Kubernetes versions we support; the ServiceMonitor against the fields of monitoring.coreos.com/v1
that it uses; and the manifests against each other (selectors, port names, the metrics port)."""
import os
import subprocess
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
VERSIONS = ["1.29.0", "1.37.0"]
CORE = ["namespace.yaml", "serviceaccount.yaml", "daemonset.yaml", "service.yaml"]


def load(name):
    with open(os.path.join(HERE, name)) as f:
        return yaml.safe_load(f)


def fail(msg):
    print(f"deploy: {msg}", file=sys.stderr)
    sys.exit(1)


def main():
    for v in VERSIONS:
        files = [os.path.join(HERE, f) for f in CORE]
        # The kubernetes-validate beside this Python (the venv of `cargo xtask setup`), else PATH.
        exe = os.path.join(os.path.dirname(sys.executable), "kubernetes-validate")
        exe = exe if os.path.exists(exe) else "kubernetes-validate"
        r = subprocess.run([exe, "--strict", "--quiet", "-k", v, *files])
        if r.returncode != 0:
            fail(f"schema validation against Kubernetes {v} failed")

    ds, svc, sm, kust = (load(f) for f in
                         ["daemonset.yaml", "service.yaml", "servicemonitor.yaml", "kustomization.yaml"])
    # The ServiceMonitor: the monitoring.coreos.com/v1 fields it uses, with their types.
    if sm.get("apiVersion") != "monitoring.coreos.com/v1" or sm.get("kind") != "ServiceMonitor":
        fail("servicemonitor.yaml is not a monitoring.coreos.com/v1 ServiceMonitor")
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

    # The pieces fit together.
    pod = ds["spec"]["template"]
    labels = pod["metadata"]["labels"]
    if ds["spec"]["selector"]["matchLabels"].items() - labels.items():
        fail("the DaemonSet's selector does not match its pods")
    if svc["spec"]["selector"].items() - labels.items():
        fail("the Service selects no agent pod")
    if spec["selector"]["matchLabels"].items() - svc["metadata"]["labels"].items():
        fail("the ServiceMonitor selects no Service")
    c = pod["spec"]["containers"][0]
    port = {p["name"]: p["containerPort"] for p in c["ports"]}["metrics"]
    listen = [a for a in c["args"] if a.startswith("--metrics-listen=")]
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
    for path in ["/sys/fs/cgroup", "/sys/kernel/btf", "/host", "/usr/local/vgpu/containers", "/var/lib/vgpu-agent/regions"]:
        if not mounts.get(path, {}).get("readOnly"):
            fail(f"{path} must be mounted read-only")
    listed = set(kust["resources"])
    present = {f for f in os.listdir(HERE) if f.endswith(".yaml") and f != "kustomization.yaml"}
    if listed != present:
        fail(f"kustomization.yaml lists {sorted(listed)}, the directory has {sorted(present)}")
    print(f"deploy: {len(present)} manifests valid (Kubernetes {', '.join(VERSIONS)})")


if __name__ == "__main__":
    main()

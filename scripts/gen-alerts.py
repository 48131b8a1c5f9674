#!/usr/bin/env python3
"""Writes vgpu-agent's Prometheus alert rules, once as a plain rules file
(deploy/alerts/vgpu-agent.rules.yml, for `rule_files:`) and once as a PrometheusRule for the
Prometheus Operator (deploy/components/prometheus-operator/prometheusrule.yaml), from the one
list below, so the two cannot drift. docs/alerts.md is the runbook each rule links to;
deploy/alerts/vgpu-agent.tests.yml holds the `promtool test rules` cases; deploy/validate.py
(`./x test`) checks all of them.

  python3 scripts/gen-alerts.py                      # write both files
  python3 scripts/gen-alerts.py --nccl-idle 30m      # another idle time for the NCCL rule
  python3 scripts/gen-alerts.py --runbook-base https://git.example/vgpu-agent/blob/main/
  python3 scripts/gen-alerts.py --check              # exit 1 if the files differ from the list
"""
import argparse
import os
import sys

import yaml

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
RULES = os.path.join(ROOT, "deploy/alerts/vgpu-agent.rules.yml")
PROMETHEUS_RULE = os.path.join(ROOT, "deploy/components/prometheus-operator/prometheusrule.yaml")

# A container's identity on a node, as every per-container series carries it.
CTR = "instance, namespace, pod, container"
WHO = "{{ $labels.namespace }}/{{ $labels.pod }}/{{ $labels.container }} on {{ $labels.instance }}"


def rules(nccl_idle, runbook_base):
    def rule(name, expr, for_, severity, summary, description):
        r = {"alert": name, "expr": expr}
        if for_:
            r["for"] = for_
        r["labels"] = {"severity": severity}
        r["annotations"] = {
            "summary": summary,
            "description": description,
            "runbook_url": f"{runbook_base}docs/alerts.md#{name.lower()}",
        }
        return r

    return [
        rule("VgpuContainerAtMemoryLimit",
             f"max by ({CTR}, device) (\n"
             f"  vgpu_container_memory_reserved_bytes / vgpu_container_memory_limit_bytes\n"
             f") >= 0.95\n",
             "5m", "warning",
             "A container holds 95% or more of its GPU memory limit",
             f"{WHO} holds {{{{ $value | humanizePercentage }}}} of its GPU {{{{ $labels.device }}}} "
             "memory limit: its next allocations will be denied."),
        rule("VgpuAllocationsDenied",
             f"sum by ({CTR}, device) (\n"
             f"  increase(vgpu_container_allocations_denied_total[5m])\n"
             f") > 0\n",
             None, "warning",
             "The limiter denied a container's GPU allocations",
             f"{WHO}: {{{{ $value | humanize }}}} allocations on GPU {{{{ $labels.device }}}} denied "
             "in the last 5 minutes (over its memory limit); the application saw out-of-memory errors."),
        rule("VgpuThrottledBeyondShare",
             f"sum by ({CTR}) (rate(vgpu_throttled_seconds_total[10m]))\n"
             f"> on ({CTR})\n"
             f"  1.1 * (1 - max by ({CTR}) (vgpu_container_sm_limit_ratio))\n",
             "15m", "warning",
             "A container is held back by its SM limit longer than its share accounts for",
             f"{WHO} spent {{{{ $value | humanizePercentage }}}} of the time throttled by the "
             "limiter, more than the idle part of its SM share (1 - share)."),
        rule("VgpuQosGuaranteeNotMet",
             f"(\n"
             f"    max by ({CTR}, device) (vgpu_container_qos_guarantee_ratio)\n"
             f"  - on ({CTR}, device)\n"
             f"    max by ({CTR}, device) (vgpu_container_gpu_busy_ratio{{source=\"limiter\"}})\n"
             f") > 0.05\n"
             f"and on ({CTR})\n"
             f"  sum by ({CTR}) (rate(vgpu_throttled_seconds_total[5m])) > 0\n"
             f"or\n"
             f"  max by ({CTR}, device) (vgpu_container_qos_guarantee_short) > 0\n",
             "10m", "warning",
             "A guaranteed container does not get its guaranteed GPU share",
             f"{WHO} is held back on GPU {{{{ $labels.device }}}} and gets less of it than its "
             "guarantee, short by {{ $value | humanizePercentage }} (100% when the guarantees on "
             "the GPU add up to more than it): see docs/qos.md."),
        rule("VgpuMemoryViewDrift",
             f"max by ({CTR}, between) (vgpu_container_memory_drift_bytes) > 0\n",
             "10m", "warning",
             "Two views of a container's GPU memory disagree",
             f"{WHO}: the {{{{ $labels.between }}}} views of a process's GPU memory differ by "
             "{{ $value | humanize1024 }}B (over max(64 MiB, 5%))."),
        rule("VgpuMemoryNotSeenByLimiter",
             f"(\n"
             f"    sum by ({CTR}, device) (vgpu_container_memory_used_bytes{{view=\"nvml\"}})\n"
             f"  - on ({CTR}, device)\n"
             f"    (\n"
             f"        sum by ({CTR}, device) (vgpu_container_memory_used_bytes{{view=\"limiter\"}})\n"
             f"      or\n"
             f"        0 * sum by ({CTR}, device) (vgpu_container_memory_used_bytes{{view=\"nvml\"}})\n"
             f"    )\n"
             f") > 268435456\n"
             f"and on ({CTR}, device) vgpu_container_memory_limit_bytes\n",
             "10m", "critical",
             "A limited container uses GPU memory that its limiter does not account",
             f"{WHO} uses {{{{ $value | humanize1024 }}}}B more on GPU {{{{ $labels.device }}}} than "
             "its limiter holds (NVML against the region): a process bypasses the limiter, so its "
             "limit does not hold."),
        rule("VgpuProbesDown",
             "vgpu_agent_probes_up == 0\n",
             "5m", "warning",
             "vgpu-agent's eBPF probes are not running",
             "vgpu-agent on {{ $labels.instance }} runs without its eBPF probes: calls of "
             "processes without the limiter, NCCL and probe-tracked memory are not seen."),
        rule("VgpuProbeEventsLost",
             "sum by (instance, cause) (\n"
             "  increase(vgpu_agent_events_lost_total{cause=~\"inflight_dropped|alloc_table_full|stats_dropped|nccl_dropped\"}[10m])\n"
             ") > 0\n",
             None, "warning",
             "vgpu-agent's probes are losing events",
             "vgpu-agent on {{ $labels.instance }} lost {{ $value | humanize }} probe events "
             "({{ $labels.cause }}) in the last 10 minutes: its per-API figures undercount."),
        rule("VgpuSnapshotStale",
             "vgpu_agent_snapshot_age_seconds > 30\n",
             "2m", "critical",
             "vgpu-agent's metrics are stale",
             "vgpu-agent on {{ $labels.instance }} serves a snapshot {{ $value | humanizeDuration }} "
             "old: its collection is stuck, and every figure of the node is out of date."),
        rule("VgpuNcclCommunicatorIdle",
             f"sum by ({CTR}) (vgpu_nccl_communicators) > 0\n"
             f"unless on ({CTR})\n"
             f"  sum by ({CTR}) (increase(vgpu_api_calls_total{{kind=\"nccl\"}}[{nccl_idle}])) > 0\n",
             "5m", "warning",
             f"A container's NCCL communicators made no call for {nccl_idle}",
             f"{WHO} has {{{{ $value }}}} NCCL communicators and made no NCCL call in {nccl_idle}: "
             "a collective may be hung (a peer rank died or stalls)."),
    ]


class Literal(str):
    pass


def literal(dumper, data):
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")


yaml.add_representer(Literal, literal, Dumper=yaml.SafeDumper)


def as_yaml(obj):
    def lit(v):
        if isinstance(v, dict):
            return {k: lit(x) for k, x in v.items()}
        if isinstance(v, list):
            return [lit(x) for x in v]
        if isinstance(v, str) and "\n" in v:
            return Literal(v)
        return v
    return yaml.safe_dump(lit(obj), sort_keys=False, width=100000, default_flow_style=False)


HEADER = "# Generated by scripts/gen-alerts.py from its rule list: edit the script and run it.\n"


def files(nccl_idle, runbook_base):
    groups = [{"name": "vgpu-agent", "rules": rules(nccl_idle, runbook_base)}]
    plain = HEADER + "# Runbook: docs/alerts.md. Tests: vgpu-agent.tests.yml (promtool test rules).\n" \
        + as_yaml({"groups": groups})
    operator = HEADER + "# The same rules as deploy/alerts/vgpu-agent.rules.yml, for the Prometheus Operator:\n" \
        "# add the labels your Prometheus' ruleSelector wants (kube-prometheus-stack: release=<name>).\n" \
        + as_yaml({
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": {"name": "vgpu-agent", "namespace": "vgpu-agent",
                         "labels": {"app.kubernetes.io/name": "vgpu-agent"}},
            "spec": {"groups": groups},
        })
    return {RULES: plain, PROMETHEUS_RULE: operator}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nccl-idle", default="15m",
                   help="how long communicators may go without an NCCL call (default 15m)")
    p.add_argument("--runbook-base", default="",
                   help="prefix of each rule's runbook_url, e.g. your repository's URL (default: a path in the repository)")
    p.add_argument("--check", action="store_true", help="only check that the files are up to date")
    a = p.parse_args()
    stale = []
    for path, text in files(a.nccl_idle, a.runbook_base).items():
        old = open(path).read() if os.path.exists(path) else None
        if old != text:
            stale.append(os.path.relpath(path, ROOT))
            if not a.check:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w") as f:
                    f.write(text)
    if a.check and stale:
        print(f"gen-alerts: {', '.join(stale)} out of date: run scripts/gen-alerts.py", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Writes the Grafana dashboards in dashboards/ (run after changing a panel; agent/tests/dashboards.rs checks them).

The agent exports API series per kind by default and per API with --metrics-per-api, so panels
group by (kind, api): per kind by default, per API with the flag. Latency distributions per
container exist only with the flag; panels fall back to the node's histogram per kind
(vgpu_node_api_latency_seconds) or to the mean (time / calls)."""
import json, os
OUT=os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'dashboards')
DS={"type":"prometheus","uid":"${DS_PROMETHEUS}"}
def inputs():
    return [{"name":"DS_PROMETHEUS","label":"Prometheus","description":"The Prometheus (or Mimir) that scrapes vgpu-agent","type":"datasource","pluginId":"prometheus","pluginName":"Prometheus"}]
def var_ds():
    return {"name":"DS_PROMETHEUS","label":"Data source","type":"datasource","query":"prometheus","current":{},"hide":0,"refresh":1}
def var_q(name, q, multi=True, label=None):
    return {"name":name,"label":label or name,"type":"query","datasource":DS,"query":{"query":q,"refId":"var-"+name},"definition":q,"refresh":2,"includeAll":True,"multi":multi,"allValue":".*","current":{},"sort":1,"hide":0}
pid=[0]
def panel(title, exprs, unit="short", kind="timeseries", w=12, h=8, desc="", legend=None):
    pid[0]+=1
    targets=[]
    for i,e in enumerate(exprs):
        if isinstance(e, tuple): e, leg = e
        else: leg = legend or ""
        t={"refId":chr(65+i),"datasource":DS,"expr":e,"legendFormat":leg}
        if kind=="table": t.update({"format":"table","instant":True})
        if kind=="heatmap": t.update({"format":"heatmap"})
        targets.append(t)
    p={"id":pid[0],"title":title,"type":kind,"datasource":DS,"targets":targets,"description":desc,
       "fieldConfig":{"defaults":{"unit":unit},"overrides":[]},"options":{},"gridPos":{"h":h,"w":w,"x":0,"y":0}}
    return p
def row(title):
    pid[0]+=1
    return {"id":pid[0],"type":"row","title":title,"collapsed":False,"panels":[],"gridPos":{"h":1,"w":24,"x":0,"y":0}}
def layout(panels):
    x=y=0; rowh=0
    for p in panels:
        g=p["gridPos"]
        if p["type"]=="row" or x+g["w"]>24:
            y+=rowh; x=0; rowh=0
        g["x"]=x; g["y"]=y
        if p["type"]=="row":
            y+=1; continue
        x+=g["w"]; rowh=max(rowh,g["h"])
    return panels
def dash(uid,title,desc,vars,panels,links=True):
    pid[0]=0
    return {"__inputs":inputs(),"__requires":[{"type":"grafana","id":"grafana","name":"Grafana","version":"10.0.0"},{"type":"datasource","id":"prometheus","name":"Prometheus","version":"1.0.0"}],
      "uid":uid,"title":title,"description":desc,"tags":["vgpu-agent","gpu"],"timezone":"browser","schemaVersion":39,"version":1,"editable":True,
      "refresh":"30s","time":{"from":"now-1h","to":"now"},
      "templating":{"list":[var_ds()]+vars},"annotations":{"list":[]},
      "links":[{"title":"vgpu-agent dashboards","type":"dashboards","tags":["vgpu-agent"],"asDropdown":True}] if links else [],
      "panels":layout(panels)}
N='instance=~"$instance"'
C='instance=~"$instance", namespace=~"$namespace", pod=~"$pod", container=~"$container"'
K='kind=~"$kind"'
RI='$__rate_interval'
fleet_vars=[var_q("instance","label_values(vgpu_agent_probes_up, instance)",label="Node")]
fleet=[
 row("GPUs"),
 panel("GPU memory used per node",[f'sum by (instance) (vgpu_gpu_memory_used_bytes{{{N}}})'],"bytes",legend="{{instance}}"),
 panel("GPU utilisation per device",[f'vgpu_gpu_utilization_ratio{{{N}}}'],"percentunit",legend="{{instance}} gpu {{device}}"),
 panel("Memory held against limits per node",[ (f'sum by (instance) (vgpu_container_memory_used_bytes{{{N}, view="limiter"}})',"held {{instance}}"),(f'sum by (instance) (vgpu_container_memory_limit_bytes{{{N}}})',"limits {{instance}}")],"bytes"),
 panel("GPU processes per node",[f'sum by (instance) (vgpu_container_processes{{{N}}})'],"short",legend="{{instance}}"),
 row("Workload"),
 panel("CUDA and NCCL calls per second by kind",[f'sum by (kind) (rate(vgpu_api_calls_total{{{N}}}[{RI}]))'],"reqps",legend="{{kind}}"),
 panel("API latency p50 and p99 by kind",[(f'histogram_quantile(0.5, sum by (le, kind) (rate(vgpu_node_api_latency_seconds_bucket{{{N}}}[{RI}])))',"p50 {{kind}}"),(f'histogram_quantile(0.99, sum by (le, kind) (rate(vgpu_node_api_latency_seconds_bucket{{{N}}}[{RI}])))',"p99 {{kind}}")],"s",desc="Every container of the selected nodes together (vgpu_node_api_latency_seconds)."),
 panel("API errors per second by node",[f'sum by (instance) (rate(vgpu_api_errors_total{{{N}}}[{RI}]))'],"reqps",legend="{{instance}}"),
 panel("Allocations denied per second",[f'sum by (instance, namespace, pod, container) (rate(vgpu_container_allocations_denied_total{{{N}}}[{RI}]))'],"reqps",legend="{{namespace}}/{{pod}}/{{container}}"),
 panel("Throttled and synchronisation time (share of a thread)",[(f'sum by (instance) (rate(vgpu_throttled_seconds_total{{{N}}}[{RI}]))',"throttled {{instance}}"),(f'sum by (instance) (rate(vgpu_sync_seconds_total{{{N}}}[{RI}]))',"sync {{instance}}")],"percentunit"),
 panel("Top 10 containers by GPU memory held",[f'topk(10, sum by (instance, namespace, pod, container) (vgpu_container_memory_used_bytes{{{N}, view="limiter"}}))'],"bytes",kind="table",w=24),
 row("Agent health"),
 panel("Probes",[(f'vgpu_agent_probes_up{{{N}}}',"up {{instance}}"),(f'vgpu_agent_probes_attached{{{N}}}',"attached {{instance}}")],"short"),
 panel("Events lost per second",[f'sum by (instance, cause) (rate(vgpu_agent_events_lost_total{{{N}}}[{RI}]))'],"short",legend="{{instance}} {{cause}}"),
 panel("Regions with errors",[f'vgpu_agent_region_errors{{{N}}}'],"short",legend="{{instance}}"),
 panel("Spans dropped per second",[f'sum by (instance, reason) (rate(vgpu_agent_spans_dropped_total{{{N}}}[{RI}]))'],"short",legend="{{instance}} {{reason}}"),
 panel("Probe cost per call",[f'vgpu_agent_probe_cost_seconds{{{N}}}'],"s",legend="{{instance}}"),
 panel("Snapshot age",[f'vgpu_agent_snapshot_age_seconds{{{N}}}'],"s",legend="{{instance}}",desc="Seconds since the snapshot behind /metrics was taken, at each scrape (VgpuSnapshotStale fires over 30 s)."),
]
cont_vars=[var_q("instance","label_values(vgpu_container_processes, instance)",label="Node"),
 var_q("namespace",'label_values(vgpu_container_processes{instance=~"$instance"}, namespace)'),
 var_q("pod",'label_values(vgpu_container_processes{instance=~"$instance", namespace=~"$namespace"}, pod)'),
 var_q("container",'label_values(vgpu_container_processes{instance=~"$instance", namespace=~"$namespace", pod=~"$pod"}, container)'),
 var_q("kind",'label_values(vgpu_api_calls_total{instance=~"$instance", container=~"$container"}, kind)',label="API kind")]
cont=[
 row("Memory"),
 panel("GPU memory used by view and device, with the limit",[(f'sum by (container, device, view) (vgpu_container_memory_used_bytes{{{C}}})',"{{container}} gpu {{device}} {{view}}"),(f'sum by (container, device) (vgpu_container_memory_limit_bytes{{{C}}})',"{{container}} gpu {{device}} limit")],"bytes"),
 panel("Reserved in the region",[f'sum by (container, device) (vgpu_container_memory_reserved_bytes{{{C}}})'],"bytes",legend="{{container}} gpu {{device}}"),
 panel("Live allocations",[f'sum by (container) (vgpu_container_allocations{{{C}}})'],"short",legend="{{container}}"),
 panel("Memory view drift",[f'max by (container, between) (vgpu_container_memory_drift_bytes{{{C}}})'],"bytes",legend="{{container}} {{between}}"),
 row("Calls"),
 panel("Calls per second by kind (by API with --metrics-per-api)",[f'sum by (kind, api) (rate(vgpu_api_calls_total{{{C}, {K}}}[{RI}]))'],"reqps",legend="{{kind}} {{api}}"),
 panel("Errors per second by kind (by API with --metrics-per-api)",[f'sum by (kind, api) (rate(vgpu_api_errors_total{{{C}, {K}}}[{RI}]))'],"reqps",legend="{{kind}} {{api}}"),
 panel("Mean latency by kind (by API with --metrics-per-api)",[f'sum by (kind, api) (rate(vgpu_api_time_seconds_total{{{C}, {K}}}[{RI}])) / sum by (kind, api) (rate(vgpu_api_calls_total{{{C}, {K}}}[{RI}]))'],"s",legend="{{kind}} {{api}}"),
 panel("Latency p50 and p99: the container's by API with --metrics-per-api, else the node's by kind",[(f'histogram_quantile(0.5, sum by (le, kind, api) (rate(vgpu_api_latency_seconds_bucket{{{C}, {K}}}[{RI}])))',"p50 {{api}}"),(f'histogram_quantile(0.99, sum by (le, kind, api) (rate(vgpu_api_latency_seconds_bucket{{{C}, {K}}}[{RI}])))',"p99 {{api}}"),(f'histogram_quantile(0.99, sum by (le, kind) (rate(vgpu_node_api_latency_seconds_bucket{{instance=~"$instance", {K}}}[{RI}])))',"node p99 {{kind}}")],"s",desc="Per container and API only with --metrics-per-api; the node's p99 per kind (every container) always."),
 panel("Latency distribution: the container's with --metrics-per-api, else the node's",[f'sum by (le) (rate(vgpu_api_latency_seconds_bucket{{{C}, {K}}}[{RI}])) or sum by (le) (rate(vgpu_node_api_latency_seconds_bucket{{instance=~"$instance", {K}}}[{RI}]))'],"s",kind="heatmap",legend="{{le}}"),
 panel("Bytes per second by kind (allocations, copies; by API with --metrics-per-api)",[f'sum by (kind, api) (rate(vgpu_api_bytes_total{{{C}, kind!="nccl"}}[{RI}]))'],"Bps",legend="{{kind}} {{api}}"),
 row("Time and limits"),
 panel("Synchronisation and throttled time (share of a thread)",[(f'sum by (container) (rate(vgpu_sync_seconds_total{{{C}}}[{RI}]))',"sync {{container}}"),(f'sum by (container) (rate(vgpu_throttled_seconds_total{{{C}}}[{RI}]))',"throttled {{container}}")],"percentunit"),
 panel("Allocations denied per second",[(f'sum by (container, device) (rate(vgpu_container_allocations_denied_total{{{C}}}[{RI}]))',"{{container}} gpu {{device}}"),(f'sum by (container, api) (rate(vgpu_api_denied_total{{{C}}}[{RI}]))',"{{container}} {{api}} (calls)")],"reqps"),
 panel("SM share limit",[f'vgpu_container_sm_limit_ratio{{{C}}}'],"percentunit",legend="{{container}} gpu {{device}}"),
 panel("Limiter hook time per second",[f'sum by (kind, api) (rate(vgpu_api_hook_seconds_total{{{C}}}[{RI}]))'],"percentunit",legend="{{kind}} {{api}}"),
 row("NCCL"),
 panel("NCCL bytes per second (by API with --metrics-per-api)",[f'sum by (container, api) (rate(vgpu_api_bytes_total{{{C}, kind="nccl"}}[{RI}]))'],"Bps",legend="{{container}} {{api}}"),
 panel("NCCL calls per second (by API with --metrics-per-api)",[f'sum by (container, api) (rate(vgpu_api_calls_total{{{C}, kind="nccl"}}[{RI}]))'],"reqps",legend="{{container}} {{api}}"),
 panel("NCCL communicators",[f'sum by (container) (vgpu_nccl_communicators{{{C}}})'],"short",legend="{{container}}"),
]
att_vars=cont_vars[:4]
att=[
 row("Where the time inside the CUDA API went"),
 panel("API time per second by kind (share of a thread)",[f'sum by (kind) (rate(vgpu_api_time_seconds_total{{{C}}}[{RI}]))'],"percentunit",legend="{{kind}}",desc="Driver time, synchronisation waits and NCCL enqueue time (vgpu_api_time_seconds_total)."),
 panel("Overheads: limiter hook, throttling, probes",[(f'sum(rate(vgpu_api_hook_seconds_total{{{C}}}[{RI}]))',"limiter hook"),(f'sum(rate(vgpu_throttled_seconds_total{{{C}}}[{RI}]))',"throttled"),(f'sum(rate(vgpu_api_calls_total{{{C}, source="probes"}}[{RI}])) * scalar(max(vgpu_agent_probe_cost_seconds{{instance=~"$instance"}}))',"probes (calls x measured cost)")],"percentunit",desc="Probe cost is the probed call rate times the cost per probed call the agent measured at start."),
 panel("Top 10 containers by time in the API",[f'topk(10, sum by (instance, namespace, pod, container) (rate(vgpu_api_time_seconds_total{{{C}}}[{RI}])))'],"percentunit",kind="table",w=24),
 row("What changed"),
 panel("p99 latency by kind now and a day ago (the container's with --metrics-per-api, else the node's)",[(f'histogram_quantile(0.99, sum by (le, kind) (rate(vgpu_api_latency_seconds_bucket{{{C}}}[{RI}])) or sum by (le, kind) (rate(vgpu_node_api_latency_seconds_bucket{{instance=~"$instance"}}[{RI}])))',"now {{kind}}"),(f'histogram_quantile(0.99, sum by (le, kind) (rate(vgpu_api_latency_seconds_bucket{{{C}}}[{RI}] offset 1d)) or sum by (le, kind) (rate(vgpu_node_api_latency_seconds_bucket{{instance=~"$instance"}}[{RI}] offset 1d)))',"1d ago {{kind}}")],"s"),
 panel("Calls per second by kind now and a day ago",[(f'sum by (kind) (rate(vgpu_api_calls_total{{{C}}}[{RI}]))',"now {{kind}}"),(f'sum by (kind) (rate(vgpu_api_calls_total{{{C}}}[{RI}] offset 1d))',"1d ago {{kind}}")],"reqps"),
 panel("Error share by kind (by API with --metrics-per-api)",[f'sum by (kind, api) (rate(vgpu_api_errors_total{{{C}}}[{RI}])) / sum by (kind, api) (rate(vgpu_api_calls_total{{{C}}}[{RI}]))'],"percentunit",legend="{{kind}} {{api}}"),
 panel("Neighbours on the same node: GPU memory held",[f'sum by (namespace, pod, container) (vgpu_container_memory_used_bytes{{instance=~"$instance", view="limiter"}})'],"bytes",legend="{{namespace}}/{{pod}}/{{container}}"),
 row("Trouble signs"),
 panel("Memory view drift",[f'max by (container, between) (vgpu_container_memory_drift_bytes{{{C}}})'],"bytes",legend="{{container}} {{between}}"),
 panel("Denials and errors per second",[(f'sum(rate(vgpu_container_allocations_denied_total{{{C}}}[{RI}]))',"denied"),(f'sum(rate(vgpu_api_errors_total{{{C}}}[{RI}]))',"errors")],"reqps"),
 panel("Agent: events lost, region errors, warnings",[(f'sum by (cause) (increase(vgpu_agent_events_lost_total{{instance=~"$instance"}}[{RI}]))',"lost {{cause}}"),(f'vgpu_agent_region_errors{{instance=~"$instance"}}',"region errors"),(f'vgpu_agent_warnings{{instance=~"$instance"}}',"warnings")],"short"),
 panel("Kernel-launch probe time (share)",[f'rate(vgpu_agent_launch_probes_seconds_total{{instance=~"$instance"}}[{RI}])'],"percentunit",legend="{{instance}}"),
]
for name,d in [("vgpu-fleet.json",dash("vgpu-fleet","vgpu-agent: fleet overview","Every GPU node that runs vgpu-agent: memory, utilisation, calls, denials, throttling and the agent's health.",fleet_vars,fleet)),
               ("vgpu-container.json",dash("vgpu-container","vgpu-agent: container drill-down","One container (or pod): memory against its limit, calls, latency, synchronisation, throttling, NCCL.",cont_vars,cont)),
               ("vgpu-attribution.json",dash("vgpu-attribution","vgpu-agent: incident and attribution","Where the time inside the CUDA API went and what changed: driver, synchronisation, NCCL, limiter hook, throttling, probe cost; against a day before.",att_vars,att))]:
    json.dump(d, open(os.path.join(OUT,name),'w'), indent=2); open(os.path.join(OUT,name),'a').write('\n')

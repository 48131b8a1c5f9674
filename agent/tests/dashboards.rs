//! Every query in dashboards/*.json names only metrics the agent exports, with labels those
//! metrics have (no privileges needed). dashboards_data.rs checks that every panel has data.

#[allow(dead_code)]
#[path = "../src/export/defs.rs"]
mod defs;
mod support;

use support::dashboards::*;

/// Labels Prometheus adds at scrape time.
const TARGET_LABELS: &[&str] = &["instance", "job"];

#[test]
fn every_query_names_exported_metrics_with_their_labels() {
    let ds = dashboards();
    assert_eq!(ds.len(), 3, "fleet, container and attribution dashboards");
    let mut checked = 0;
    for (path, d) in &ds {
        let name = path.file_name().unwrap().to_string_lossy();
        let qs = queries(d);
        assert!(qs.len() >= 10, "{name}: only {} queries", qs.len());
        for (at, expr) in qs {
            let (sels, grouping) = parse(&expr);
            assert!(!sels.is_empty(), "{name} {at}: no metric in {expr}");
            let mut allowed: Vec<&str> = TARGET_LABELS.to_vec();
            for s in &sels {
                let def = defs::ALL
                    .iter()
                    .find(|d| d.series_names().contains(&s.metric))
                    .unwrap_or_else(|| {
                        panic!(
                            "{name} {at}: {} is not a metric the agent exports",
                            s.metric
                        )
                    });
                let mut labels = defs::label_names(def);
                labels.extend(TARGET_LABELS);
                if s.metric.ends_with("_bucket") {
                    labels.push("le");
                }
                for l in &s.labels {
                    assert!(
                        labels.contains(&l.as_str()),
                        "{name} {at}: {} has no label {l}",
                        s.metric
                    );
                }
                allowed.extend(labels);
                checked += 1;
            }
            for g in grouping.iter().filter(|g| !g.is_empty()) {
                assert!(
                    allowed.contains(&g.as_str()),
                    "{name} {at}: grouping by {g}, which none of its metrics has"
                );
            }
        }
    }
    assert!(checked > 60, "only {checked} selectors checked");
}

#[test]
fn datasource_is_templated() {
    for (path, d) in dashboards() {
        let vars = d["templating"]["list"].as_array().unwrap();
        assert!(
            vars.iter()
                .any(|v| v["type"] == "datasource" && v["name"] == "DS_PROMETHEUS"),
            "{}",
            path.display()
        );
        assert_eq!(d["__inputs"][0]["name"], "DS_PROMETHEUS");
        for p in panels(&d).into_iter().filter(|p| p["type"] != "row") {
            assert_eq!(
                p["datasource"]["uid"],
                "${DS_PROMETHEUS}",
                "{}",
                path.display()
            );
        }
    }
}

#[test]
fn the_parser_finds_metrics_and_labels() {
    let (s, g) = parse(
        r#"histogram_quantile(0.99, sum by (le, api) (rate(vgpu_api_latency_seconds_bucket{container=~"$c", api="x{y}"}[$__rate_interval] offset 1d))) / scalar(max(vgpu_agent_probe_cost_seconds))"#,
    );
    let names: Vec<&str> = s.iter().map(|s| s.metric.as_str()).collect();
    assert_eq!(
        names,
        [
            "vgpu_api_latency_seconds_bucket",
            "vgpu_agent_probe_cost_seconds"
        ]
    );
    assert_eq!(s[0].labels, ["container", "api"]);
    assert_eq!(g, ["le", "api"]);
    let (s, g) = parse("label_values(vgpu_container_processes{namespace=~\"$ns\"}, pod)");
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].metric, "vgpu_container_processes");
    assert_eq!(s[0].labels, ["namespace"]);
    assert_eq!(g, ["pod"]);
}

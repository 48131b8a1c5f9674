//! The body a scrape gets: prometheus-client's text, its 0.0.4 form, the scrape's tail (age,
//! `# EOF`) and the gzip member spliced from the shared deflate and the tail.

use std::io::Read;

use super::*;
use crate::export::metrics::{MetricsOptions, MetricsView, SpanCounters, tests};

/// A model with every family: 3 containers with regions, a GPU, agent figures, odd label values.
fn exposition() -> Exposition {
    let mut s = tests::with_a_region_and_a_gpu(tests::synthetic(3, 5));
    s.agent.events_lost = [("stack_full".to_owned(), 2)].into();
    // A label value that needs escaping.
    s.containers[1].name = "ml/pod-1/we\"ird\\na\nme".into();
    let mut v = MetricsView::new(
        MetricsOptions {
            pid_labels: true,
            per_api: true,
        },
        Arc::new(SpanCounters::default()),
    );
    v.update(&s)
}

fn gunzip(gz: &[u8]) -> String {
    let mut text = String::new();
    flate2::read::GzDecoder::new(gz)
        .read_to_string(&mut text)
        .unwrap();
    text
}

#[test]
fn openmetrics_is_prometheus_clients_text_with_escaped_labels() {
    let body = Body::encode(&exposition());
    let om = body.text(Format::OpenMetrics);
    assert!(om.contains("we\\\"ird\\\\na\\nme"), "{om}");
    assert!(
        om.contains("vgpu_api_latency_seconds_bucket{le=\"+Inf\",container="),
        "{om}"
    );
    assert!(om.contains("vgpu_agent_probes_up{} 1\n"), "{om}");
    assert!(
        om.contains("# UNIT vgpu_api_latency_seconds seconds\n"),
        "{om}"
    );
    assert!(om.ends_with("# EOF\n") && om.matches("# EOF").count() == 1);
    assert_eq!(body.len(Format::OpenMetrics), om.len());
}

#[test]
fn text_format_differs_only_in_the_heads() {
    let body = Body::encode(&exposition());
    let (om, text) = (body.text(Format::OpenMetrics), body.text(Format::Text));
    assert_eq!(body.len(Format::Text), text.len());
    assert!(
        text.contains("# HELP vgpu_api_calls_total CUDA driver"),
        "{text}"
    );
    assert!(text.contains("# TYPE vgpu_api_calls_total counter\n"));
    assert!(text.contains("# TYPE vgpu_api_latency_seconds histogram\n"));
    assert!(!text.contains("# UNIT") && !text.contains("# EOF"));
    let samples = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| !l.starts_with('#'))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(samples(&om), samples(&text));
    let heads = |t: &str, p: &str| t.lines().filter(|l| l.starts_with(p)).count();
    assert_eq!(heads(&om, "# HELP"), heads(&text, "# HELP"));
    assert_eq!(heads(&om, "# TYPE"), heads(&text, "# TYPE"));
}

#[test]
fn a_family_with_a_help_text_turns_into_0_0_4_heads() {
    let om = "# HELP a_total_x Calls.\n# TYPE a_total_x counter\n# UNIT a_total_x seconds\n\
              a_total_x_total{k=\"v\"} 1\n# HELP g A gauge.\n# TYPE g gauge\ng{} 2.5\n# EOF\n";
    assert_eq!(
        to_prometheus_text(om),
        "# HELP a_total_x_total Calls.\n# TYPE a_total_x_total counter\n\
         a_total_x_total{k=\"v\"} 1\n# HELP g A gauge.\n# TYPE g gauge\ng{} 2.5\n"
    );
}

#[test]
fn gzip_holds_the_same_text_and_shares_the_deflate_between_scrapes() {
    let latest = Latest::with_snapshot_age();
    latest.set(Body::encode(&exposition()));
    let (a, b) = (latest.get(), latest.get());
    for f in [Format::OpenMetrics, Format::Text] {
        for body in [&a, &b] {
            let gz = body.gzipped(f);
            let text = gunzip(gz);
            assert_eq!(text, body.text(f));
            assert!(gz.len() < text.len() / 3, "{} of {}", gz.len(), text.len());
            assert!(std::ptr::eq(gz, body.gzipped(f)), "kept, not made again");
        }
        assert!(
            std::ptr::eq(a.shared.deflated(f), b.shared.deflated(f)),
            "one deflate of the shared text per refresh"
        );
    }
    // Another refresh: a new body.
    latest.set(Body::encode(&Exposition::default()));
    assert_eq!(gunzip(latest.get().gzipped(Format::OpenMetrics)), "# EOF\n");
}

#[test]
fn once_a_scraper_asks_for_gzip_each_refresh_deflates_ahead_of_the_scrapes() {
    let latest = Latest::default();
    latest.set(Body::encode(&exposition()));
    let first = latest.get();
    assert!(first.shared.deflated[0].get().is_none(), "nobody asked yet");
    let _ = first.gzipped(Format::OpenMetrics);
    latest.set(Body::encode(&exposition()));
    let next = latest.get();
    assert!(!Arc::ptr_eq(&first.shared, &next.shared));
    assert!(next.shared.deflated[0].get().is_some(), "deflated when set");
    assert!(
        next.shared.deflated[1].get().is_none(),
        "only the format asked for"
    );
    assert_eq!(
        gunzip(next.gzipped(Format::OpenMetrics)),
        next.text(Format::OpenMetrics)
    );
}

#[test]
fn the_snapshot_age_is_the_time_since_the_snapshot_at_each_scrape() {
    let taken = SystemTime::now() - std::time::Duration::from_secs(90);
    let e = Exposition {
        families: vec![],
        taken_at_unix_ms: Some(taken.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64),
    };
    let latest = Latest::with_snapshot_age();
    latest.set(Body::encode(&e));
    let om = latest.get().text(Format::OpenMetrics);
    let age: f64 = om
        .lines()
        .find_map(|l| l.strip_prefix("vgpu_agent_snapshot_age_seconds{} "))
        .unwrap_or_else(|| panic!("{om}"))
        .parse()
        .unwrap();
    assert!((90.0..100.0).contains(&age), "{age}");
    assert!(om.contains("# TYPE vgpu_agent_snapshot_age_seconds gauge\n"));
    assert!(om.ends_with("# EOF\n"));
    let text = latest.get().text(Format::Text);
    assert!(
        text.contains("vgpu_agent_snapshot_age_seconds{} "),
        "{text}"
    );
    // Without the option (and without a snapshot time) there is no age.
    let plain = Latest::default();
    plain.set(Body::encode(&e));
    assert!(!plain.get().text(Format::OpenMetrics).contains("age"));
    assert_eq!(
        age_seconds(5_000, UNIX_EPOCH),
        0.0,
        "a clock that went back"
    );
    assert_eq!(
        age_seconds(5_000, UNIX_EPOCH + std::time::Duration::from_millis(7_500)),
        2.5
    );
}

#[test]
fn an_empty_body_is_a_valid_exposition() {
    let latest = Latest::default();
    assert_eq!(latest.get().text(Format::OpenMetrics), "# EOF\n");
    assert_eq!(latest.get().text(Format::Text), "");
    assert_eq!(
        Body::encode(&Exposition::default()).text(Format::OpenMetrics),
        "# EOF\n"
    );
}

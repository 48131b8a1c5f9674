//! Encoding an [`Exposition`] once per refresh with the prometheus-client crate; scrapes share it.
//!
//! prometheus-client writes the OpenMetrics text. The Prometheus text format 0.0.4 (for clients
//! that do not ask for OpenMetrics) shares the sample lines; only the family heads differ
//! (counters' `# HELP`/`# TYPE` name the `_total` series; no `# UNIT`, no `# EOF`), so it is
//! made from the OpenMetrics text line by line ([`to_prometheus_text`]).
//!
//! What a scrape gets is that text plus a tail made at the scrape ([`Body`]): `# EOF`, and with
//! [`Latest::with_snapshot_age`] the `vgpu_agent_snapshot_age_seconds` gauge, the seconds since
//! the snapshot was taken at that moment (so a stalled refresh shows as a growing age, not as a
//! frozen body). A scrape sends the shared text without copying it ([`Body::pieces`]), then its
//! tail. gzip: the shared text is deflated once up to a sync point (by the first scrape
//! that asks for it, and once one has, by each refresh as it sets the body, off the scrapes'
//! path), and each scrape appends its tail as the final deflate block of the same gzip member,
//! with the CRC continued over it: a scrape compresses a few hundred bytes.
//!
//! Why the crate's encoder (the scrape benchmark, docs/benchmarks.md): at the default, series per
//! kind, 100 containers make a 634 kB body that it encodes and deflates in 3-13 ms (p50) per
//! refresh, with scrapes under 25 ms at p99 on a loaded 2-core VM (target: 50 ms). It is about 10
//! times slower than the hand-written encoder it replaced on the 12.6 MB of `--metrics-per-api`
//! (110-290 ms against 14-19 ms per refresh): that flag's price, for nodes with few containers.

use std::{
    sync::{
        Arc, Mutex, OnceLock,
        atomic::{AtomicBool, Ordering::Relaxed},
    },
    time::{SystemTime, UNIX_EPOCH},
};

use flate2::{Compress, Compression, FlushCompress, Status};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, NoLabelSet},
    metrics::MetricType,
    registry::{Registry, Unit as PcUnit},
};

use super::{
    defs::{self, Type, Unit},
    metrics::{Exposition, FamilyData, Value},
};

/// The two text formats a scraper can get.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `application/openmetrics-text; version=1.0.0`.
    OpenMetrics,
    /// `text/plain; version=0.0.4`.
    Text,
}

impl Format {
    fn index(self) -> usize {
        match self {
            Format::OpenMetrics => 0,
            Format::Text => 1,
        }
    }
}

const EOF: &str = "# EOF\n";

/// The gzip header: deflate, no name or time, unknown OS (as flate2 writes it).
const GZIP_HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];

/// What one refresh encoded: every family's text in both formats, shared by the scrapes.
#[derive(Debug, Default)]
struct Encoded {
    text: [String; 2],
    /// When the snapshot was taken (Unix ms).
    taken_at_unix_ms: Option<u64>,
    /// The gzip header and `text` raw-deflated up to a sync point, and the text's CRC-32, once a
    /// scrape asks for gzip.
    deflated: [OnceLock<(Vec<u8>, u32)>; 2],
}

impl Encoded {
    fn deflated(&self, f: Format) -> &(Vec<u8>, u32) {
        self.deflated[f.index()].get_or_init(|| {
            let text = self.text[f.index()].as_bytes();
            let mut crc = crc32fast::Hasher::new();
            crc.update(text);
            let mut gz = GZIP_HEADER.to_vec();
            gz.extend(deflate(text, FlushCompress::Sync));
            (gz, crc.finalize())
        })
    }
}

/// A refresh's text in one format (uncompressed, or the start of its gzip member), as bytes
/// that scrapes share without copying.
struct SharedText {
    encoded: Arc<Encoded>,
    format: Format,
    gzip: bool,
}

impl AsRef<[u8]> for SharedText {
    fn as_ref(&self) -> &[u8] {
        if self.gzip {
            &self.encoded.deflated(self.format).0
        } else {
            self.encoded.text[self.format.index()].as_bytes()
        }
    }
}

/// Raw deflate of `input`, ended with `flush` (`Sync`: byte-aligned, more blocks may follow;
/// `Finish`: the final block).
fn deflate(input: &[u8], flush: FlushCompress) -> Vec<u8> {
    let mut c = Compress::new(Compression::fast(), false);
    let mut out = Vec::with_capacity(input.len() / 4 + 128);
    loop {
        let consumed = c.total_in() as usize;
        // Compressing into a Vec's spare capacity only fails on a full Vec (grown below).
        let status = c.compress_vec(&input[consumed..], &mut out, flush);
        // zlib's rule: the flush is complete once all input is in and output space is left.
        let done = matches!(status, Ok(Status::StreamEnd))
            || (c.total_in() as usize == input.len() && out.len() < out.capacity());
        if done {
            return out;
        }
        out.reserve(out.capacity().max(128));
    }
}

/// What a scrape writes: the refresh's text and this scrape's tail.
#[derive(Debug)]
pub struct Body {
    shared: Arc<Encoded>,
    tail: [String; 2],
    /// [`Body::gzipped`]'s result, kept.
    #[cfg(test)]
    gzip: [OnceLock<Vec<u8>>; 2],
    /// The [`Latest`]'s flags that make its next refreshes deflate ahead of the scrapes.
    gzip_asked: Option<Arc<[AtomicBool; 2]>>,
}

impl Body {
    /// Encodes an exposition; the body has no snapshot age (see [`Latest::with_snapshot_age`]).
    pub fn encode(e: &Exposition) -> Body {
        let om = encode_families(&e.families);
        let text = to_prometheus_text(&om);
        let shared = Arc::new(Encoded {
            text: [om, text],
            taken_at_unix_ms: e.taken_at_unix_ms,
            deflated: Default::default(),
        });
        Body::scrape(shared, None, None)
    }

    /// A scrape's body: the shared text, the age (if given) and `# EOF`; a gzip scrape raises
    /// `gzip_asked` for the next refreshes.
    fn scrape(
        shared: Arc<Encoded>,
        age_seconds: Option<f64>,
        gzip_asked: Option<Arc<[AtomicBool; 2]>>,
    ) -> Body {
        let age = age_seconds
            .map(|a| {
                encode_families(&[FamilyData::of(
                    &defs::AGENT_SNAPSHOT_AGE,
                    vec![(vec![], Value::Float(a))],
                )])
            })
            .unwrap_or_default();
        let text = to_prometheus_text(&age);
        Body {
            shared,
            tail: [age + EOF, text],
            #[cfg(test)]
            gzip: Default::default(),
            gzip_asked,
        }
    }

    /// The size of the uncompressed body.
    pub fn len(&self, f: Format) -> usize {
        self.shared.text[f.index()].len() + self.tail[f.index()].len()
    }

    /// The body gzip-compressed (one gzip member: the shared text's deflate, compressed once per
    /// refresh, then this scrape's tail as the final block).
    #[cfg(test)]
    pub fn gzipped(&self, f: Format) -> &[u8] {
        self.gzip[f.index()].get_or_init(|| {
            let [head, tail] = self.pieces(f, true);
            [head, tail].concat()
        })
    }

    /// The body as two pieces to send one after the other: the refresh's text (shared by every
    /// scrape of that refresh, not copied), then this scrape's tail. With `gzip`, together they
    /// are one gzip member: the shared text's deflate (made once per refresh), then the tail as
    /// the final deflate block, the CRC and the length.
    pub fn pieces(&self, f: Format, gzip: bool) -> [bytes::Bytes; 2] {
        let tail = self.tail[f.index()].as_bytes();
        let shared = |gzip| {
            bytes::Bytes::from_owner(SharedText {
                encoded: Arc::clone(&self.shared),
                format: f,
                gzip,
            })
        };
        if !gzip {
            return [shared(false), bytes::Bytes::copy_from_slice(tail)];
        }
        if let Some(asked) = &self.gzip_asked {
            asked[f.index()].store(true, Relaxed);
        }
        let (_, crc) = self.shared.deflated(f);
        let mut crc = crc32fast::Hasher::new_with_initial(*crc);
        crc.update(tail);
        let mut end = deflate(tail, FlushCompress::Finish);
        end.extend_from_slice(&crc.finalize().to_le_bytes());
        // ISIZE: the uncompressed length modulo 2^32 (RFC 1952).
        end.extend_from_slice(&(self.len(f) as u32).to_le_bytes());
        [shared(true), bytes::Bytes::from(end)]
    }

    /// The uncompressed body as text.
    #[cfg(test)]
    pub fn text(&self, f: Format) -> String {
        [self.shared.text[f.index()].as_str(), &self.tail[f.index()]].concat()
    }
}

/// The body that scrapes get: replaced at each refresh, shared by the scrapes until the next.
///
/// Once a scraper has asked for gzip in a format, each refresh deflates its text in that format
/// when it is set (on the refresh's thread), so scrapes only compress their tail.
#[derive(Debug, Default)]
pub struct Latest {
    shared: Mutex<Arc<Encoded>>,
    snapshot_age: bool,
    /// Per format: a scraper asked for gzip (set by its [`Body::gzipped`]).
    gzip_asked: Arc<[AtomicBool; 2]>,
}

impl Latest {
    /// Scrapes also get `vgpu_agent_snapshot_age_seconds`, computed at each scrape.
    pub fn with_snapshot_age() -> Latest {
        Latest {
            snapshot_age: true,
            ..Default::default()
        }
    }

    pub fn set(&self, body: Body) {
        for f in [Format::OpenMetrics, Format::Text] {
            // A flag, no data: a scrape that raced past it deflates the text itself (once).
            if self.gzip_asked[f.index()].load(Relaxed) {
                body.shared.deflated(f);
            }
        }
        *self.shared.lock().unwrap_or_else(|p| p.into_inner()) = body.shared;
    }

    /// This scrape's body.
    pub fn get(&self) -> Arc<Body> {
        let shared = Arc::clone(&self.shared.lock().unwrap_or_else(|p| p.into_inner()));
        let age = shared
            .taken_at_unix_ms
            .filter(|_| self.snapshot_age)
            .map(|taken| age_seconds(taken, SystemTime::now()));
        Arc::new(Body::scrape(
            shared,
            age,
            Some(Arc::clone(&self.gzip_asked)),
        ))
    }
}

/// Seconds from `taken_at_unix_ms` to `now` (0 if the clock went back).
fn age_seconds(taken_at_unix_ms: u64, now: SystemTime) -> f64 {
    let now_ms = now
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    now_ms.saturating_sub(taken_at_unix_ms) as f64 / 1e3
}

/// The families as prometheus-client writes them (OpenMetrics text, no `# EOF`).
fn encode_families(families: &[FamilyData]) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Families(families.to_vec())));
    let size: usize = families.iter().map(|f| f.samples.len() * 160 + 256).sum();
    let mut s = String::with_capacity(size);
    // Writing into a String cannot fail, and every family's samples match its type (built by
    // families.rs from the same table).
    let _ = prometheus_client::encoding::text::encode_registry(&mut s, &registry);
    s
}

/// An exposition's families, as a prometheus-client collector.
#[derive(Debug)]
struct Families(Vec<FamilyData>);

impl Collector for Families {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for fam in &self.0 {
            encode_family(&mut encoder, fam)?;
        }
        Ok(())
    }
}

fn unit(u: Unit) -> PcUnit {
    match u {
        Unit::Seconds => PcUnit::Seconds,
        Unit::Bytes => PcUnit::Bytes,
        // Prometheus names shares `_ratio` (prometheus-client says `ratios`).
        Unit::Ratio => PcUnit::Other("ratio".into()),
    }
}

fn encode_family(enc: &mut DescriptorEncoder, fam: &FamilyData) -> Result<(), std::fmt::Error> {
    let def = fam.def;
    let unit = def.unit.map(unit);
    let mtype = match def.kind {
        Type::Counter => MetricType::Counter,
        Type::Gauge => MetricType::Gauge,
        Type::Histogram => MetricType::Histogram,
    };
    let mut m = enc.encode_descriptor(def.base, def.help, unit.as_ref(), mtype)?;
    let mut labels: Vec<(&str, &str)> = Vec::with_capacity(fam.names.len());
    for (values, v) in &fam.samples {
        labels.clear();
        labels.extend(
            fam.names
                .iter()
                .copied()
                .zip(values.iter().map(String::as_str)),
        );
        let mut s = m.encode_family(&labels)?;
        match (def.kind, v) {
            (Type::Counter, Value::Int(n)) => s.encode_counter::<NoLabelSet, _, u64>(n, None)?,
            (Type::Counter, Value::Float(x)) => s.encode_counter::<NoLabelSet, _, f64>(x, None)?,
            // Gauges of counts and bytes stay far below i64::MAX.
            (Type::Gauge, Value::Int(n)) => s.encode_gauge(&(*n as i64))?,
            (Type::Gauge, Value::Float(x)) => s.encode_gauge(x)?,
            (Type::Histogram, Value::Histogram(sum, count, buckets)) => {
                s.encode_histogram::<NoLabelSet>(*sum, *count, buckets, None)?
            }
            _ => return Err(std::fmt::Error),
        }
    }
    Ok(())
}

/// OpenMetrics text to the Prometheus text format 0.0.4, line by line: counters' `# HELP` and
/// `# TYPE` name the `_total` series; `# UNIT` and `# EOF` go; sample lines stay.
fn to_prometheus_text(om: &str) -> String {
    let mut out = String::with_capacity(om.len());
    // The family of the last `# HELP`, held until its `# TYPE` says whether it is a counter.
    let mut help: Option<(&str, &str)> = None;
    for line in om.split_inclusive('\n') {
        if !line.starts_with('#') {
            out.push_str(line);
            continue;
        }
        let body = line.trim_end_matches('\n');
        if let Some(rest) = body.strip_prefix("# HELP ") {
            help = Some(rest.split_once(' ').unwrap_or((rest, "")));
        } else if let Some(rest) = body.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            let total = if kind == "counter" { "_total" } else { "" };
            if let Some((h_name, text)) = help.take() {
                out.push_str(&format!("# HELP {h_name}{total} {text}\n"));
            }
            out.push_str(&format!("# TYPE {name}{total} {kind}\n"));
        }
        // `# UNIT` and `# EOF` have no 0.0.4 form.
    }
    out
}

#[cfg(test)]
mod tests {
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
}

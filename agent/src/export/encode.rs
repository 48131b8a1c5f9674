//! Encoding an [`Exposition`] once per refresh into a [`Body`] that every scrape shares.
//!
//! The text is the OpenMetrics text that prometheus-client writes for the same families, byte for
//! byte (the tests encode the same expositions with prometheus-client and compare), with two
//! differences in how it is made: a series' label set is encoded once and reused for its
//! `_sum`, `_count` and bucket lines, and the bucket bounds are formatted once per family.
//!
//! The Prometheus text format 0.0.4 (for clients that do not ask for OpenMetrics) shares the
//! sample lines; only the family heads differ (counters' `# HELP`/`# TYPE` name the `_total`
//! series; no `# UNIT`, no `# EOF`). A gzip-compressed copy of either form is made on the first
//! scrape that asks for it and kept with the body, so scrapes between two refreshes share it.

use std::{
    io::Write,
    ops::Range,
    sync::{Arc, Mutex, OnceLock},
};

use super::{
    defs::{self, Type},
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

/// One family's heads (one per format) and where its sample lines are.
#[derive(Debug)]
struct Part {
    heads: [String; 2],
    lines: Range<usize>,
}

const EOF: &[u8] = b"# EOF\n";

/// An encoded exposition.
#[derive(Debug, Default)]
pub struct Body {
    /// Every family's sample lines, one family after the other.
    lines: Vec<u8>,
    parts: Vec<Part>,
    /// The whole body of each format, gzip-compressed, once asked for.
    gzip: [OnceLock<Vec<u8>>; 2],
}

impl Body {
    pub fn encode(e: &Exposition) -> Body {
        let size: usize = e.families.iter().map(|f| f.samples.len() * 160).sum();
        let mut lines = Vec::with_capacity(size);
        let mut parts = Vec::with_capacity(e.families.len());
        for fam in &e.families {
            let start = lines.len();
            encode_lines(&mut lines, fam);
            parts.push(Part {
                heads: heads(fam),
                lines: start..lines.len(),
            });
        }
        Body {
            lines,
            parts,
            gzip: Default::default(),
        }
    }

    /// The size of the uncompressed body.
    pub fn len(&self, f: Format) -> usize {
        let heads: usize = self.parts.iter().map(|p| p.heads[f.index()].len()).sum();
        let eof = if f == Format::OpenMetrics {
            EOF.len()
        } else {
            0
        };
        heads + self.lines.len() + eof
    }

    /// Writes the uncompressed body.
    pub fn write_to(&self, f: Format, w: &mut impl Write) -> std::io::Result<()> {
        for p in &self.parts {
            w.write_all(p.heads[f.index()].as_bytes())?;
            w.write_all(&self.lines[p.lines.clone()])?;
        }
        if f == Format::OpenMetrics {
            w.write_all(EOF)?;
        }
        Ok(())
    }

    /// The body gzip-compressed (made on the first call for each format, then kept).
    pub fn gzipped(&self, f: Format) -> &[u8] {
        self.gzip[f.index()].get_or_init(|| {
            let mut gz = flate2::write::GzEncoder::new(
                Vec::with_capacity(self.len(f) / 8),
                flate2::Compression::fast(),
            );
            // Writing into a Vec cannot fail.
            let _ = self.write_to(f, &mut gz);
            gz.finish().unwrap_or_default()
        })
    }

    /// The uncompressed body as text.
    #[cfg(test)]
    pub fn text(&self, f: Format) -> String {
        let mut v = Vec::with_capacity(self.len(f));
        self.write_to(f, &mut v).unwrap();
        String::from_utf8(v).unwrap()
    }
}

/// The body that scrapes get: replaced at each refresh, shared by the scrapes until the next.
#[derive(Debug, Default)]
pub struct Latest(Mutex<Arc<Body>>);

impl Latest {
    pub fn set(&self, body: Body) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(body);
    }

    pub fn get(&self) -> Arc<Body> {
        Arc::clone(&self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// `# HELP`, `# TYPE` (and `# UNIT`) lines of a family, in OpenMetrics and in text 0.0.4.
fn heads(fam: &FamilyData) -> [String; 2] {
    let def = fam.def;
    let name = def.family();
    let kind = match def.kind {
        Type::Counter => "counter",
        Type::Gauge => "gauge",
        Type::Histogram => "histogram",
    };
    let mut om = format!("# HELP {name} {}\n# TYPE {name} {kind}\n", def.help);
    if let Some(u) = def.unit {
        om.push_str(&format!("# UNIT {name} {}\n", u.as_str()));
    }
    let text_name = match def.kind {
        Type::Counter => format!("{name}_total"),
        _ => name,
    };
    let text = format!(
        "# HELP {text_name} {}\n# TYPE {text_name} {kind}\n",
        def.help
    );
    [om, text]
}

/// `k="v",k="v"` (values escaped as OpenMetrics says: `\\`, `\"`, `\n`).
fn label_set(out: &mut Vec<u8>, names: &[&str], values: &[String]) {
    for (i, (k, v)) in names.iter().zip(values).enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(k.as_bytes());
        out.extend_from_slice(b"=\"");
        if v.bytes().any(|b| matches!(b, b'\\' | b'"' | b'\n')) {
            for b in v.bytes() {
                match b {
                    b'\\' => out.extend_from_slice(b"\\\\"),
                    b'"' => out.extend_from_slice(b"\\\""),
                    b'\n' => out.extend_from_slice(b"\\n"),
                    _ => out.push(b),
                }
            }
        } else {
            out.extend_from_slice(v.as_bytes());
        }
        out.push(b'"');
    }
}

fn int(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

fn float(out: &mut Vec<u8>, v: f64) {
    out.extend_from_slice(dtoa::Buffer::new().format(v).as_bytes());
}

/// `name{labels} ` (`name{} ` for an empty label set, as prometheus-client writes it).
fn series(out: &mut Vec<u8>, name: &[u8], labels: &[u8]) {
    out.extend_from_slice(name);
    out.push(b'{');
    out.extend_from_slice(labels);
    out.extend_from_slice(b"} ");
}

fn encode_lines(out: &mut Vec<u8>, fam: &FamilyData) {
    let def = fam.def;
    let base = def.family();
    let names = defs::label_names(def);
    let suffixed = |s: &str| format!("{base}{s}").into_bytes();
    let (total, sum, count, bucket) = (
        suffixed("_total"),
        suffixed("_sum"),
        suffixed("_count"),
        suffixed("_bucket"),
    );
    // Bucket bounds as label values, formatted once (every series of a family has the same).
    let mut bounds: Vec<(f64, Vec<u8>)> = Vec::new();
    let mut labels = Vec::with_capacity(256);
    for (values, v) in &fam.samples {
        labels.clear();
        label_set(&mut labels, &names, values);
        match (def.kind, v) {
            (Type::Counter, Value::Int(n)) => {
                series(out, &total, &labels);
                int(out, *n);
            }
            (Type::Counter, Value::Float(x)) => {
                series(out, &total, &labels);
                float(out, *x);
            }
            (_, Value::Int(n)) => {
                series(out, base.as_bytes(), &labels);
                int(out, *n);
            }
            (_, Value::Float(x)) => {
                series(out, base.as_bytes(), &labels);
                float(out, *x);
            }
            (_, Value::Histogram(s, c, buckets)) => {
                series(out, &sum, &labels);
                float(out, *s);
                out.push(b'\n');
                series(out, &count, &labels);
                int(out, *c);
                out.push(b'\n');
                let mut cumulative = 0;
                for (i, (le, n)) in buckets.iter().enumerate() {
                    if bounds
                        .get(i)
                        .is_none_or(|(b, _)| b.to_bits() != le.to_bits())
                    {
                        let text = if *le == f64::INFINITY {
                            b"+Inf".to_vec()
                        } else {
                            dtoa::Buffer::new().format(*le).as_bytes().to_vec()
                        };
                        bounds.truncate(i);
                        bounds.push((*le, text));
                    }
                    cumulative += n;
                    out.extend_from_slice(&bucket);
                    out.extend_from_slice(b"{le=\"");
                    out.extend_from_slice(&bounds[i].1);
                    out.push(b'"');
                    if !labels.is_empty() {
                        out.push(b',');
                        out.extend_from_slice(&labels);
                    }
                    out.extend_from_slice(b"} ");
                    int(out, cumulative);
                    out.push(b'\n');
                }
                continue;
            }
        }
        out.push(b'\n');
    }
}

#[cfg(test)]
#[path = "encode_tests.rs"]
mod tests;

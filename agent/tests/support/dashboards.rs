//! The Grafana dashboards of dashboards/ and a PromQL reader good enough for their queries: the
//! metric selectors (with the label names their matchers use) and the grouping labels.

use std::path::PathBuf;

use serde_json::Value;

const FUNCTIONS: &[&str] = &[
    "abs",
    "absent",
    "absent_over_time",
    "avg",
    "avg_over_time",
    "bottomk",
    "ceil",
    "changes",
    "clamp",
    "clamp_max",
    "clamp_min",
    "count",
    "count_over_time",
    "count_values",
    "delta",
    "deriv",
    "exp",
    "floor",
    "group",
    "histogram_quantile",
    "idelta",
    "increase",
    "irate",
    "label_join",
    "label_replace",
    "label_values",
    "ln",
    "log2",
    "max",
    "max_over_time",
    "min",
    "min_over_time",
    "quantile",
    "quantile_over_time",
    "rate",
    "resets",
    "round",
    "scalar",
    "sort",
    "sort_desc",
    "sqrt",
    "stddev",
    "sum",
    "sum_over_time",
    "time",
    "timestamp",
    "topk",
    "vector",
];
const KEYWORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
];
/// A selector in a query: the metric name and the label names its matchers use.
#[derive(Debug)]
pub struct Selector {
    pub metric: String,
    pub labels: Vec<String>,
}

fn ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// The label names in a `{...}` matcher list (`a="x", b=~"y"`).
fn matcher_labels(inner: &str) -> Vec<String> {
    let mut out = vec![];
    let mut in_str = false;
    let mut cur = String::new();
    let mut prev = '\0';
    for c in inner.chars() {
        if in_str {
            if c == '"' && prev != '\\' {
                in_str = false;
            }
        } else if c == '"' {
            in_str = true;
        } else if ident_char(c) {
            cur.push(c);
        } else if !cur.is_empty() {
            if matches!(c, '=' | '!' | ' ') {
                out.push(std::mem::take(&mut cur));
            } else {
                cur.clear();
            }
        }
        prev = c;
    }
    out.retain(|l| !l.is_empty());
    out
}

/// Metric selectors and `by`/`without`/`on` label lists of a PromQL expression, or of Grafana's
/// `label_values(selector, label)` (its label counts as a grouping label).
pub fn parse(expr: &str) -> (Vec<Selector>, Vec<String>) {
    if let Some(inner) = expr
        .trim()
        .strip_prefix("label_values(")
        .and_then(|e| e.strip_suffix(')'))
    {
        let (sel, label) = inner
            .rsplit_once(',')
            .expect("label_values(selector, label)");
        let (sels, mut grouping) = parse_promql(sel);
        grouping.push(label.trim().to_owned());
        return (sels, grouping);
    }
    parse_promql(expr)
}

fn parse_promql(expr: &str) -> (Vec<Selector>, Vec<String>) {
    let chars: Vec<char> = expr.chars().collect();
    let (mut sels, mut grouping) = (vec![], vec![]);
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c == '[' {
            // A range or subquery duration.
            while i < chars.len() && chars[i] != ']' {
                i += 1;
            }
            i += 1;
        } else if c == '$' {
            // A Grafana variable such as $__rate_interval.
            i += 1;
            while i < chars.len() && ident_char(chars[i]) {
                i += 1;
            }
        } else if c.is_ascii_digit() {
            // A number or a duration (0.99, 5m, 1d).
            while i < chars.len() && (ident_char(chars[i]) || chars[i] == '.') {
                i += 1;
            }
        } else if c == '{' {
            // The closing brace outside quoted label values.
            let mut end = i + 1;
            let mut quoted = false;
            while end < chars.len() && (quoted || chars[end] != '}') {
                match chars[end] {
                    '\\' if quoted => end += 1,
                    '"' => quoted = !quoted,
                    _ => {}
                }
                end += 1;
            }
            assert!(end < chars.len(), "unclosed {{ in {expr}");
            let labels = matcher_labels(&chars[i + 1..end].iter().collect::<String>());
            // `{...}` right after a metric name belongs to it.
            if let Some(last) = sels
                .last_mut()
                .filter(|s: &&mut Selector| s.labels.is_empty())
            {
                last.labels = labels;
            }
            i = end + 1;
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && ident_char(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut j = i;
            while j < chars.len() && chars[j] == ' ' {
                j += 1;
            }
            let next = chars.get(j).copied();
            if matches!(word.as_str(), "by" | "without" | "on" | "ignoring") && next == Some('(') {
                let end = j + chars[j..].iter().position(|&c| c == ')').expect("closed (");
                let list: String = chars[j + 1..end].iter().collect();
                grouping.extend(list.split(',').map(|s| s.trim().to_owned()));
                i = end + 1;
            } else if FUNCTIONS.contains(&word.as_str()) || KEYWORDS.contains(&word.as_str()) {
                continue;
            } else {
                // A metric name; `label_values(metric, label)` gives one too.
                sels.push(Selector {
                    metric: word,
                    labels: vec![],
                });
            }
        } else {
            i += 1;
        }
    }
    (sels, grouping)
}

pub fn dashboards() -> Vec<(PathBuf, Value)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../dashboards");
    let mut out = vec![];
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "json") {
            let v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            out.push((p, v));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

pub fn panels(v: &Value) -> Vec<&Value> {
    let mut out = vec![];
    for p in v["panels"].as_array().into_iter().flatten() {
        out.push(p);
        out.extend(panels(p));
    }
    out
}

/// (where, expression) of every panel target and query variable.
pub fn queries(d: &Value) -> Vec<(String, String)> {
    let mut out = vec![];
    for p in panels(d) {
        for t in p["targets"].as_array().into_iter().flatten() {
            let e = t["expr"].as_str().expect("every target has an expr");
            out.push((format!("panel {:?}", p["title"]), e.to_owned()));
        }
    }
    for v in d["templating"]["list"].as_array().unwrap() {
        if v["type"] == "query" {
            let q = v["query"]["query"]
                .as_str()
                .or(v["query"].as_str())
                .unwrap();
            out.push((format!("variable {}", v["name"]), q.to_owned()));
        }
    }
    out
}

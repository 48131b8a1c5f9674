//! The agent's layers, checked from its source: every `crate::` (and `super::` that climbs to the
//! crate root) path in non-test code names a top-level module, and each top-level module may only
//! name modules of the layers its own layer declares below it. agent/README.md lists the same
//! layers for readers.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

/// One layer: its name, the top-level modules in it, and the layers (by name) it may import.
/// Modules in one layer may import each other as long as no cycle forms.
struct Layer {
    name: &'static str,
    modules: &'static [&'static str],
    may_use: &'static [&'static str],
}

/// The layer table, bottom first.
const LAYERS: &[Layer] = &[
    // Process plumbing with no knowledge of GPUs: the one module that calls libc (`sys`), unit
    // parsing and formatting, the shared tokio runtime, the process-wide signal flags and the
    // worker pool for reads that may block.
    Layer {
        name: "base",
        modules: &["sys", "units", "runtime", "signals", "pool"],
        may_use: &[],
    },
    // Plain data every other layer reports in (processes, devices, probe states, GPU use), and
    // the scrubbing of the tenant-written strings in it. It reads no file and calls nothing.
    Layer {
        name: "model",
        modules: &["model", "sanitize"],
        may_use: &["base"],
    },
    // Facts about the host that commands may read too: its paths, process and container
    // identity (/proc, cgroups, runtimes), and the daemon's snapshot socket (client side).
    Layer {
        name: "host",
        modules: &["host", "identity", "client"],
        may_use: &["base", "model"],
    },
    // The GPU-facing sources only the collector drives: the library scan, NVML, and the eBPF
    // probes with their session.
    Layer {
        name: "probing",
        modules: &["discovery", "nvml", "probes"],
        may_use: &["base", "model", "host"],
    },
    // Joins the sources into one model snapshot per tick.
    Layer {
        name: "collector",
        modules: &["collector"],
        may_use: &["base", "model", "host", "probing"],
    },
    // The exporters (Prometheus, OTLP): they read the model only.
    Layer {
        name: "views",
        modules: &["export"],
        may_use: &["base", "model"],
    },
    // The commands users run (`top`, `stat`, `attribute`, `limit`, `cdi`): they get snapshots
    // from a collector or the daemon's socket and render them, or read and write limits. Never
    // the probes, NVML or the scan.
    Layer {
        name: "commands",
        modules: &["tui", "stat", "attribute", "limit", "cdi"],
        may_use: &["base", "model", "host", "collector", "views"],
    },
    // The long-running daemon and the binary's entry point: they start everything.
    Layer {
        name: "top",
        modules: &["daemon", "main"],
        may_use: &["*"],
    },
];

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    Punct(char),
    /// `::`
    PathSep,
}

/// Splits Rust source into identifiers and punctuation, dropping comments, strings, chars and
/// numbers: enough to follow paths and braces.
fn tokenize(src: &str) -> Vec<Tok> {
    let b: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let n = b.len();
    while i < n {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < n && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < n {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == 'r' && (next == Some('"') || (next == Some('#') && raw_string_at(&b, i)))
            || (c == 'b' && next == Some('r') && raw_string_at(&b, i + 1))
        {
            if c == 'b' {
                i += 1;
            }
            i += 1;
            let mut hashes = 0;
            while b[i] == '#' {
                hashes += 1;
                i += 1;
            }
            i += 1;
            loop {
                if b[i] == '"' && (0..hashes).all(|k| b.get(i + 1 + k) == Some(&'#')) {
                    i += 1 + hashes;
                    break;
                }
                i += 1;
            }
        } else if c == '"' || (c == 'b' && next == Some('"')) {
            i += if c == 'b' { 2 } else { 1 };
            while b[i] != '"' {
                if b[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
        } else if c == '\'' || (c == 'b' && next == Some('\'')) {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            let start = if c == 'b' { i + 1 } else { i };
            if b.get(start + 1) == Some(&'\\') {
                i = start + 3;
                while b[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if b.get(start + 2) == Some(&'\'') {
                i = start + 3;
            } else {
                i = start + 1;
                while i < n && (b[i].is_alphanumeric() || b[i] == '_') {
                    i += 1;
                }
            }
        } else if c.is_alphabetic() || c == '_' {
            let s = i;
            while i < n && (b[i].is_alphanumeric() || b[i] == '_') {
                i += 1;
            }
            out.push(Tok::Ident(b[s..i].iter().collect()));
        } else if c.is_ascii_digit() {
            while i < n && (b[i].is_alphanumeric() || b[i] == '_' || b[i] == '.') {
                if b[i] == '.' && !b.get(i + 1).is_some_and(|d| d.is_ascii_digit()) {
                    break;
                }
                i += 1;
            }
        } else if c == ':' && next == Some(':') {
            out.push(Tok::PathSep);
            i += 2;
        } else {
            if !c.is_whitespace() {
                out.push(Tok::Punct(c));
            }
            i += 1;
        }
    }
    out
}

fn raw_string_at(b: &[char], i: usize) -> bool {
    // `r"` or `r#...#"` at i (i points at the `r`).
    let mut j = i + 1;
    while b.get(j) == Some(&'#') {
        j += 1;
    }
    b.get(j) == Some(&'"')
}

fn ident(t: Option<&Tok>) -> Option<&str> {
    match t {
        Some(Tok::Ident(s)) => Some(s),
        _ => None,
    }
}

/// A `mod name;` declaration.
#[derive(Debug, PartialEq)]
struct Child {
    name: String,
    /// Declared with `#[path = ..]`.
    has_path: bool,
    /// Declared under `#[cfg(test)]`.
    test: bool,
}

/// What one file contributes: the top-level modules it names, and the module files it declares.
#[derive(Default)]
struct FileScan {
    uses: BTreeSet<String>,
    /// libc functions called (`libc::name(`).
    libc_calls: BTreeSet<String>,
    children: Vec<Child>,
}

/// Walks one file's tokens. `module` is the file's module path below the crate root.
fn scan_file(toks: &[Tok], module: &[String]) -> FileScan {
    let mut scan = FileScan::default();
    // The inline-module stack: Some(name) for `mod name {`, None for any other brace.
    let mut braces: Vec<Option<String>> = Vec::new();
    let mut pending_test = false;
    let mut pending_path = false;
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            Tok::Punct('#') if toks.get(i + 1) == Some(&Tok::Punct('[')) => {
                let end = matching(toks, i + 1, '[', ']');
                let attr = &toks[i + 2..end];
                if ident(attr.first()) == Some("cfg")
                    && attr.get(2) == Some(&Tok::Ident("test".into()))
                    && attr.len() == 4
                {
                    pending_test = true;
                }
                if ident(attr.first()) == Some("path") {
                    pending_path = true;
                }
                i = end + 1;
                continue;
            }
            Tok::Ident(kw) if kw == "mod" => {
                let name = ident(toks.get(i + 1)).unwrap_or_default().to_string();
                if toks.get(i + 2) == Some(&Tok::Punct(';')) {
                    scan.children.push(Child {
                        name,
                        has_path: pending_path,
                        test: pending_test,
                    });
                    pending_test = false;
                    pending_path = false;
                    i += 3;
                    continue;
                }
                if pending_test {
                    i = matching(toks, i + 2, '{', '}') + 1;
                    pending_test = false;
                    continue;
                }
                braces.push(Some(name));
                i += 3;
                continue;
            }
            Tok::Ident(kw) if pending_test && kw != "pub" && kw != "crate" => {
                // A test-only item other than a module: skip it whole.
                i = skip_item(toks, i);
                pending_test = false;
                continue;
            }
            Tok::Ident(kw)
                if kw == "libc"
                    && toks.get(i + 1) == Some(&Tok::PathSep)
                    && toks.get(i + 3) == Some(&Tok::Punct('(')) =>
            {
                if let Some(f) = ident(toks.get(i + 2)) {
                    scan.libc_calls.insert(f.to_string());
                }
                i += 3;
                continue;
            }
            Tok::Ident(kw) if kw == "crate" && toks.get(i + 1) == Some(&Tok::PathSep) => {
                i = record_tops(toks, i + 2, &mut scan.uses);
                continue;
            }
            Tok::Ident(kw) if kw == "super" => {
                let mut here: Vec<String> = module.to_vec();
                here.extend(braces.iter().flatten().cloned());
                let mut j = i;
                while ident(toks.get(j)) == Some("super") && toks.get(j + 1) == Some(&Tok::PathSep)
                {
                    here.pop();
                    j += 2;
                }
                i = if j == i {
                    // `pub(super)`, `use super::{..}` at the root is not used.
                    i + 1
                } else if here.is_empty() {
                    record_tops(toks, j, &mut scan.uses)
                } else {
                    j
                };
                continue;
            }
            Tok::Punct('{') => braces.push(None),
            Tok::Punct('}') => {
                braces.pop();
            }
            _ => {}
        }
        i += 1;
    }
    scan
}

/// Index of the bracket closing the one opened at `open`.
fn matching(toks: &[Tok], open: usize, o: char, c: char) -> usize {
    let mut depth = 0;
    for (k, t) in toks.iter().enumerate().skip(open) {
        if *t == Tok::Punct(o) {
            depth += 1;
        } else if *t == Tok::Punct(c) {
            depth -= 1;
            if depth == 0 {
                return k;
            }
        }
    }
    toks.len() - 1
}

/// Skips one item starting at `i` (`use ...;`, `fn .. { }`, `let ..;`), returning the index
/// after it.
fn skip_item(toks: &[Tok], mut i: usize) -> usize {
    let mut depth = 0;
    while i < toks.len() {
        match toks[i] {
            Tok::Punct('{') | Tok::Punct('(') | Tok::Punct('[') => depth += 1,
            Tok::Punct('}') | Tok::Punct(')') | Tok::Punct(']') => {
                depth -= 1;
                if depth == 0 && toks[i] == Tok::Punct('}') {
                    return if toks.get(i + 1) == Some(&Tok::Punct(';')) {
                        i + 2
                    } else {
                        i + 1
                    };
                }
            }
            Tok::Punct(';') if depth == 0 => return i + 1,
            _ => {}
        }
        i += 1;
    }
    i
}

/// At `i` just after `crate::` (or a `super::` chain that reached the root): records the
/// top-level module named there, or each one in a `{a::.., b, c::{..}}` group.
fn record_tops(toks: &[Tok], i: usize, uses: &mut BTreeSet<String>) -> usize {
    match toks.get(i) {
        Some(Tok::Ident(name)) => {
            if name != "self" {
                uses.insert(name.clone());
            }
            i + 1
        }
        Some(Tok::Punct('{')) => {
            let end = matching(toks, i, '{', '}');
            let mut depth = 1;
            let mut expect = true;
            for t in &toks[i + 1..end] {
                match t {
                    Tok::Punct('{') => depth += 1,
                    Tok::Punct('}') => depth -= 1,
                    Tok::Punct(',') if depth == 1 => {
                        expect = true;
                        continue;
                    }
                    Tok::Ident(name) if depth == 1 && expect && name != "self" => {
                        uses.insert(name.clone());
                    }
                    _ => {}
                }
                expect = false;
            }
            end + 1
        }
        _ => i,
    }
}

/// Every non-test source file of the binary with its module path, found by following `mod`
/// declarations from main.rs.
fn module_files() -> Vec<(PathBuf, Vec<String>, FileScan)> {
    let src = src_dir();
    let mut out = Vec::new();
    let mut todo = vec![(src.join("main.rs"), Vec::<String>::new())];
    while let Some((file, module)) = todo.pop() {
        let text =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let scan = scan_file(&tokenize(&text), &module);
        let stem = file.file_stem().unwrap().to_str().unwrap();
        let dir = if stem == "mod" || stem == "main" {
            file.parent().unwrap().to_path_buf()
        } else {
            file.with_extension("")
        };
        for Child {
            name,
            has_path,
            test,
        } in &scan.children
        {
            if *test {
                continue;
            }
            assert!(
                !has_path,
                "{}: `#[path]` on a non-test module is not followed by this check",
                file.display()
            );
            let flat = dir.join(format!("{name}.rs"));
            let child = if flat.exists() {
                flat
            } else {
                dir.join(name).join("mod.rs")
            };
            let mut m = module.clone();
            m.push(name.clone());
            todo.push((child, m));
        }
        out.push((file, module, scan));
    }
    out
}

/// Top-level module -> the other top-level modules it names, and the files that name them.
fn edges() -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let src = src_dir();
    let mut g: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (file, module, scan) in module_files() {
        let top = module.first().cloned().unwrap_or_else(|| "main".into());
        let shown = file.strip_prefix(&src).unwrap().display().to_string();
        let entry = g.entry(top.clone()).or_default();
        for used in scan.uses {
            if used != top {
                entry.entry(used).or_default().insert(shown.clone());
            }
        }
    }
    g
}

fn layer_of(module: &str) -> Option<&'static Layer> {
    LAYERS.iter().find(|l| l.modules.contains(&module))
}

/// Violations of the layer table, one line each.
fn layer_violations(g: &BTreeMap<String, BTreeMap<String, BTreeSet<String>>>) -> Vec<String> {
    let mut bad = Vec::new();
    for (from, tos) in g {
        let Some(lf) = layer_of(from) else {
            bad.push(format!(
                "`{from}` is in no layer: add it to LAYERS and agent/README.md"
            ));
            continue;
        };
        for (to, files) in tos {
            let Some(lt) = layer_of(to) else {
                bad.push(format!(
                    "`{to}` is in no layer: add it to LAYERS and agent/README.md"
                ));
                continue;
            };
            let allowed =
                lf.name == lt.name || lf.may_use.iter().any(|u| *u == "*" || *u == lt.name);
            if !allowed {
                let files: Vec<_> = files.iter().cloned().collect();
                bad.push(format!(
                    "`{from}` ({} layer) uses `{to}` ({} layer) in {}",
                    lf.name,
                    lt.name,
                    files.join(", ")
                ));
            }
        }
    }
    bad
}

/// A cycle among top-level modules, if any, as `a -> b -> a`.
fn find_cycle(g: &BTreeMap<String, BTreeMap<String, BTreeSet<String>>>) -> Option<String> {
    fn visit(
        g: &BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
        node: &str,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<String> {
        if let Some(pos) = stack.iter().position(|s| s == node) {
            let mut cycle = stack[pos..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle.join(" -> "));
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.to_string());
        for next in g.get(node).into_iter().flat_map(|m| m.keys()) {
            if let Some(c) = visit(g, next, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    g.keys()
        .find_map(|n| visit(g, n, &mut Vec::new(), &mut done))
}

#[test]
fn top_level_modules_form_no_cycle() {
    let g = edges();
    if let Some(cycle) = find_cycle(&g) {
        panic!("import cycle among the agent's top-level modules: {cycle}");
    }
}

#[test]
fn every_import_goes_down_the_layer_table() {
    let bad = layer_violations(&edges());
    assert!(bad.is_empty(), "layer violations:\n  {}", bad.join("\n  "));
}

#[test]
fn only_sys_calls_libc() {
    let src = src_dir();
    let mut bad = Vec::new();
    for (file, module, scan) in module_files() {
        if module.first().map(String::as_str) != Some("sys") && !scan.libc_calls.is_empty() {
            let shown = file.strip_prefix(&src).unwrap().display().to_string();
            bad.push(format!("{shown}: {:?}", scan.libc_calls));
        }
    }
    assert!(
        bad.is_empty(),
        "libc called outside sys/ (add a typed function there):\n  {}",
        bad.join("\n  ")
    );
}

#[test]
fn every_top_level_module_is_in_exactly_one_layer() {
    let g = edges();
    for module in g.keys() {
        let n = LAYERS
            .iter()
            .filter(|l| l.modules.contains(&module.as_str()))
            .count();
        assert_eq!(n, 1, "`{module}` is in {n} layers");
    }
}

#[test]
fn the_scanner_sees_grouped_super_and_test_paths() {
    let src = r#"
        use crate::{model::{Gpu, Proc}, units, sys::clock};
        // crate::commented::Out
        const S: &str = "crate::in_string";
        pub(super) fn f() { let _ = super::probes::X; unsafe { libc::kill(1, libc::SIGTERM) }; }
        mod inner { fn g() { let _ = super::super::nvml::Y; } }
        #[cfg(test)]
        mod tests { use crate::tui::T; }
        #[cfg(test)]
        use crate::export::E;
        #[cfg(test)]
        mod more_tests;
        mod child;
    "#;
    let scan = scan_file(&tokenize(src), &["collector".to_string()]);
    let uses: Vec<_> = scan.uses.iter().map(String::as_str).collect();
    assert_eq!(uses, ["model", "nvml", "probes", "sys", "units"]);
    assert_eq!(scan.libc_calls.iter().collect::<Vec<_>>(), ["kill"]);
    assert_eq!(
        scan.children,
        [
            Child {
                name: "more_tests".into(),
                has_path: false,
                test: true
            },
            Child {
                name: "child".into(),
                has_path: false,
                test: false
            }
        ]
    );
}

#[test]
fn a_command_importing_a_probe_is_reported() {
    let mut g = edges();
    g.entry("tui".into())
        .or_default()
        .entry("probes".into())
        .or_default()
        .insert("tui/mod.rs".into());
    let bad = layer_violations(&g);
    assert!(
        bad.iter()
            .any(|b| b.starts_with("`tui` (commands layer) uses `probes`")),
        "{bad:?}"
    );
    g.entry("model".into())
        .or_default()
        .entry("tui".into())
        .or_default()
        .insert("model/mod.rs".into());
    g.entry("tui".into())
        .or_default()
        .entry("model".into())
        .or_default()
        .insert("tui/mod.rs".into());
    assert!(find_cycle(&g).is_some());
}

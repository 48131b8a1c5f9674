//! The limiter's layers hold: no module imports one of a higher layer, no import cycle among
//! its modules, and the pure logic (`limiter-core`) has no `unsafe`, no statics and no system
//! calls. Read from the sources: every `use` of `crate::`, `super::` and `self::` paths and every
//! such path written in code (test modules and files left out), resolved to the module it names.
//!
//! Layers, lowest first: `platform`, `runtime`, `hints`, `hooks` (limiter/src/lib.rs says what
//! each holds). A module may import its own layer and those below.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::Path,
};

const LAYERS: [&str; 4] = ["platform", "runtime", "hints", "hooks"];

/// Every module of `src` (by path, `a::b`) and the text that counts (test code cut off).
fn modules(src: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let rel = path.strip_prefix(src).unwrap().with_extension("");
            let mut parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            let name = parts.last().unwrap().clone();
            if name == "tests" || name == "test_support" || name == "lib" {
                continue;
            }
            if name == "mod" {
                parts.pop();
            }
            let text = fs::read_to_string(&path).unwrap();
            // Unit tests sit at the end of a file, after `#[cfg(test)] mod tests`.
            let code = match text.find("#[cfg(test)]\nmod tests") {
                Some(i) => &text[..i],
                None => &text[..],
            };
            out.insert(parts.join("::"), strip_comments(code));
        }
    }
    out
}

/// The code without comments (a path in a comment is not an import).
fn strip_comments(code: &str) -> String {
    code.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The paths a `use` tree names, written from its root: `a::{b, c::d as e}` gives `a::b`,
/// `a::c::d`.
fn expand(tree: &str) -> Vec<String> {
    // Renames (`x as y`) name nothing new: drop them, then the spaces.
    let mut words: Vec<&str> = tree.split_whitespace().collect();
    while let Some(i) = words.iter().position(|w| *w == "as") {
        let alias = words.get(i + 1).map_or("", |w| {
            w.trim_start_matches(|c: char| c.is_alphanumeric() || c == '_')
        });
        words.splice(i..(i + 2).min(words.len()), std::iter::once(alias));
    }
    let tree: String = words.concat();
    let mut out = Vec::new();
    expand_into("", &tree, &mut out);
    out
}

fn expand_into(prefix: &str, tree: &str, out: &mut Vec<String>) {
    for item in split_top(tree) {
        match item.find('{') {
            Some(i) => {
                let head = item[..i].trim_end_matches("::");
                let inner = &item[i + 1..item.len() - 1];
                expand_into(&join(prefix, head), inner, out);
            }
            None if item == "self" => out.push(prefix.to_string()),
            None if !item.is_empty() => out.push(join(prefix, item)),
            None => {}
        }
    }
}

fn join(prefix: &str, tail: &str) -> String {
    match (prefix.is_empty(), tail.is_empty()) {
        (true, _) => tail.to_string(),
        (_, true) => prefix.to_string(),
        _ => format!("{prefix}::{tail}"),
    }
}

/// Splits at the commas outside braces.
fn split_top(s: &str) -> Vec<&str> {
    let (mut depth, mut start, mut out) = (0, 0, Vec::new());
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// The crate-relative paths module `module` refers to: its `use` items and the paths in its code.
fn referenced(module: &str, code: &str, is_dir_module: bool) -> Vec<String> {
    let mut paths = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("use ") {
        let before = rest[..i].chars().last();
        rest = &rest[i + 4..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let end = rest.find(';').unwrap_or(rest.len());
        paths.extend(expand(&rest[..end]));
        rest = &rest[end..];
    }
    for word in code.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':' || c == '$')) {
        let word = word.trim_start_matches('$');
        // `a::{` heads of `use` trees are read above.
        if word.ends_with("::") {
            continue;
        }
        if word.starts_with("crate::") || word.starts_with("super::") || word.starts_with("self::")
        {
            paths.push(word.to_string());
        }
    }
    // `super` of a file module is its directory's module; of a `mod.rs`, the one above.
    let own: Vec<&str> = module.split("::").collect();
    let parent = if is_dir_module {
        &own[..own.len().saturating_sub(1)]
    } else {
        &own[..own.len() - 1]
    };
    paths
        .into_iter()
        .filter_map(|p| {
            let mut segs: Vec<&str> = p.split("::").collect();
            let base: Vec<String> = match segs.first().copied() {
                Some("crate") => Vec::new(),
                Some("super") => parent.iter().map(|s| s.to_string()).collect(),
                Some("self") if is_dir_module => own.iter().map(|s| s.to_string()).collect(),
                Some("self") => parent.iter().map(|s| s.to_string()).collect(),
                _ => return None,
            };
            segs.remove(0);
            let mut full = base;
            full.extend(segs.iter().map(|s| s.to_string()));
            Some(full.join("::"))
        })
        .collect()
}

/// The longest module path that `path` starts with.
fn module_of<'a>(path: &str, modules: &'a BTreeMap<String, String>) -> Option<&'a str> {
    let segs: Vec<&str> = path.split("::").collect();
    (1..=segs.len())
        .rev()
        .map(|n| segs[..n].join("::"))
        .find_map(|p| modules.get_key_value(&p).map(|(k, _)| k.as_str()))
}

fn layer(module: &str) -> usize {
    let top = module.split("::").next().unwrap();
    LAYERS
        .iter()
        .position(|l| *l == top)
        .unwrap_or_else(|| panic!("module {module} is in no layer: add it to LAYERS"))
}

fn import_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = modules(&src);
    let dir_modules: BTreeSet<String> = modules
        .keys()
        .filter(|m| {
            let rel = m.replace("::", "/");
            src.join(&rel).join("mod.rs").exists()
        })
        .cloned()
        .collect();
    let mut graph = BTreeMap::new();
    for (m, code) in &modules {
        let targets: BTreeSet<String> = referenced(m, code, dir_modules.contains(m))
            .iter()
            .filter_map(|p| module_of(p, &modules))
            .filter(|t| t != m)
            .map(str::to_string)
            .collect();
        graph.insert(m.clone(), targets);
    }
    graph
}

#[test]
fn no_module_imports_a_higher_layer() {
    let graph = import_graph();
    assert!(graph.contains_key("hooks::memory") && graph.contains_key("platform::driver"));
    let upward: Vec<String> = graph
        .iter()
        .flat_map(|(m, ts)| {
            ts.iter()
                .filter(|t| layer(t) > layer(m))
                .map(move |t| format!("{m} -> {t}"))
        })
        .collect();
    assert!(upward.is_empty(), "imports of a higher layer: {upward:#?}");
}

#[test]
fn no_import_cycle_among_modules() {
    let graph = import_graph();
    // Depth-first search; a back edge closes a cycle.
    fn visit(
        m: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(m) {
            Some(2) => return None,
            Some(1) => {
                let i = path.iter().position(|p| p == m).unwrap();
                let mut cycle = path[i..].to_vec();
                cycle.push(m.to_string());
                return Some(cycle);
            }
            _ => {}
        }
        state.insert(m.to_string(), 1);
        path.push(m.to_string());
        for t in &graph[m] {
            if let Some(c) = visit(t, graph, state, path) {
                return Some(c);
            }
        }
        path.pop();
        state.insert(m.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for m in graph.keys() {
        if let Some(cycle) = visit(m, &graph, &mut state, &mut Vec::new()) {
            panic!("import cycle: {}", cycle.join(" -> "));
        }
    }
}

#[test]
fn the_reader_resolves_imports() {
    assert_eq!(
        expand("crate::{a::{self, b}, c::d as _, e}"),
        ["crate::a", "crate::a::b", "crate::c::d", "crate::e"]
    );
    let graph = import_graph();
    // Known edges, so that a reader that finds nothing cannot pass the two tests above.
    for (from, to) in [
        ("hooks::memory", "hooks::gate"),
        ("hooks::memory", "runtime::process"),
        ("runtime::process", "runtime::state"),
        ("runtime", "runtime::state"),
        ("platform::guard", "platform::thread_words"),
        ("hints", "runtime"),
    ] {
        assert!(
            graph[from].contains(to),
            "{from} -> {to} not seen: {:?}",
            graph[from]
        );
    }
}

/// `limiter-core` is logic only: the compiler forbids `unsafe` there (`#![forbid(unsafe_code)]`);
/// this checks the rest of the promise, no statics and no C library, outside its tests.
#[test]
fn the_core_has_no_statics_and_no_system_calls() {
    let core = Path::new(env!("CARGO_MANIFEST_DIR")).join("../limiter-core");
    let lib = fs::read_to_string(core.join("src/lib.rs")).unwrap();
    assert!(lib.contains("#![forbid(unsafe_code)]"));
    let manifest = fs::read_to_string(core.join("Cargo.toml")).unwrap();
    let deps = manifest
        .split("[dependencies]")
        .nth(1)
        .unwrap()
        .split("\n[")
        .next()
        .unwrap();
    assert!(!deps.contains("libc"), "limiter-core depends on libc");
    for (m, code) in modules(&core.join("src")) {
        for word in [
            "static ",
            "thread_local!",
            "libc::",
            "extern \"C\"",
            "std::env::",
        ] {
            let found = code
                .lines()
                .any(|l| l.contains(word) && !l.contains("'static "));
            assert!(!found, "limiter-core's {m} has `{word}`");
        }
    }
}

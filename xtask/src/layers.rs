//! The layers check: no import cycle among the modules of any workspace crate, and every import of
//! a crate with a layer table going to a module of its own layer or one below.
//!
//! Each crate's sources are read with `syn` from its root (`src/lib.rs`, `src/main.rs`), following
//! `mod` declarations; test code (`#[cfg(test)]` items and modules) is left out. Every `use` item
//! and every path written in code or in a macro's tokens is resolved to the module that DEFINES
//! what it names: through `crate::`, `self::`, `super::`, a child module's name, the names other
//! `use` items bind (so through `pub use` re-exports, however many) and glob imports (`use m::*`
//! imports the module `m`, and names are looked up through it). Paths into other crates are left
//! out. An import gives an edge from the importing module to the defining one; a strongly
//! connected component of more than one module is a cycle, reported with every edge in it and the
//! file and line of each import.
//!
//! A crate's layer table is a `# Layers` section of its root's doc comment, lowest first:
//!
//! ```text
//! # Layers
//!
//! 1. base: `sys`, `units`. What the layer holds.
//! 2. views: `export`; never `nvml`. What it holds.
//! ```
//!
//! Every top-level module sits in exactly one layer; a module may import modules of its own layer
//! and of the layers below, never those a `never` clause names. The crate root itself may import
//! anything. `cargo xtask layers` prints the tables and the cycles; the tests at the end run the
//! check over the workspace and over small crates with each kind of path it must see through.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};
use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// A module of one crate: the crate root is `[]`.
#[derive(Debug, Default)]
struct Module {
    path: Vec<String>,
    /// The file it is written in, relative to the crate's package directory.
    file: PathBuf,
    parent: Option<usize>,
    children: BTreeMap<String, usize>,
    /// Names of the items it defines, modules left out.
    items: BTreeSet<String>,
    /// Names bound by its `use` items: name -> (path as written, line).
    uses: Vec<Use>,
    /// Paths written in its code (two segments or more) with their lines.
    refs: Vec<(Vec<String>, usize)>,
    /// Functions of the C library it calls (`libc::name(..)`).
    libc_calls: BTreeSet<String>,
    /// It declares a `static`, a `thread_local!`, or an `extern` block or function.
    has_static_or_extern: bool,
}

#[derive(Debug, Clone)]
struct Use {
    /// The bound name; `None` for a glob (`use a::*`).
    name: Option<String>,
    path: Vec<String>,
    line: usize,
}

/// What a path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// A module of this crate.
    Module(usize),
    /// An item defined in this module of this crate.
    Item(usize),
    /// Something of another crate, a generic parameter, a local: no edge.
    Outside,
}

/// One crate root's module tree.
#[derive(Debug)]
pub struct Crate {
    /// The package's directory relative to the workspace, with ` (lib)` or ` (bin)` where the
    /// package has both roots.
    pub name: String,
    modules: Vec<Module>,
    /// The layer table from the root's doc comment, if it has one.
    layers: Option<Vec<Layer>>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Layer {
    pub name: String,
    pub modules: Vec<String>,
    pub never: Vec<String>,
}

/// An import edge: the module that imports, the one that defines, and where.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Edge {
    from: usize,
    to: usize,
    file: PathBuf,
    line: usize,
}

/// Reads files: from disk for the workspace, from a map in the tests.
type Reader<'a> = dyn Fn(&Path) -> Option<String> + 'a;

impl Crate {
    /// Reads the crate whose root is `root` (relative to what `read` reads from).
    fn load(name: &str, root: &Path, read: &Reader) -> Result<Crate> {
        let text = read(root).with_context(|| format!("{}: cannot read", root.display()))?;
        let file = syn::parse_file(&text).with_context(|| format!("{}", root.display()))?;
        let layers = parse_layers(&doc_text(&file.attrs))
            .with_context(|| format!("{}: the `# Layers` section", root.display()))?;
        let mut krate = Crate {
            name: name.to_string(),
            modules: vec![Module {
                file: root.to_path_buf(),
                ..Module::default()
            }],
            layers,
        };
        let dir = root.parent().unwrap().to_path_buf();
        krate.read_items(0, &file.items, &dir, root, read)?;
        Ok(krate)
    }

    /// Records module `m`'s items; `dir` is where its `mod x;` children's files are.
    fn read_items(
        &mut self,
        m: usize,
        items: &[syn::Item],
        dir: &Path,
        file: &Path,
        read: &Reader,
    ) -> Result<()> {
        for item in items {
            if is_test(item_attrs(item)) {
                continue;
            }
            match item {
                syn::Item::Mod(module) => {
                    let name = module.ident.to_string();
                    let child = self.modules.len();
                    let mut path = self.modules[m].path.clone();
                    path.push(name.clone());
                    self.modules[m].children.insert(name.clone(), child);
                    self.modules.push(Module {
                        path,
                        parent: Some(m),
                        ..Module::default()
                    });
                    if module.attrs.iter().any(|a| a.path().is_ident("path")) {
                        bail!(
                            "{}: `#[path]` on a non-test module is not followed by the layers check",
                            file.display()
                        );
                    }
                    match &module.content {
                        Some((_, inner)) => {
                            self.modules[child].file = file.to_path_buf();
                            self.read_items(child, inner, &dir.join(&name), file, read)?;
                        }
                        None => {
                            let flat = dir.join(format!("{name}.rs"));
                            let nested = dir.join(&name).join("mod.rs");
                            let (child_file, text) = match read(&flat) {
                                Some(t) => (flat, t),
                                None => {
                                    let t = read(&nested).with_context(|| {
                                        format!("{}: no file for `mod {name}`", file.display())
                                    })?;
                                    (nested, t)
                                }
                            };
                            let parsed = syn::parse_file(&text)
                                .with_context(|| format!("{}", child_file.display()))?;
                            self.modules[child].file = child_file.clone();
                            self.read_items(
                                child,
                                &parsed.items,
                                &dir.join(&name),
                                &child_file,
                                read,
                            )?;
                        }
                    }
                }
                syn::Item::Use(u) => {
                    let mut uses = Vec::new();
                    flatten_use(&u.tree, &mut Vec::new(), &mut uses);
                    if u.leading_colon.is_none() {
                        self.modules[m].uses.extend(uses);
                    }
                }
                other => {
                    if let Some(name) = item_name(other) {
                        self.modules[m].items.insert(name);
                    }
                    if let syn::Item::ForeignMod(f) = other {
                        for fi in &f.items {
                            let name = match fi {
                                syn::ForeignItem::Fn(f) => Some(&f.sig.ident),
                                syn::ForeignItem::Static(s) => Some(&s.ident),
                                syn::ForeignItem::Type(t) => Some(&t.ident),
                                _ => None,
                            };
                            if let Some(n) = name {
                                self.modules[m].items.insert(n.to_string());
                            }
                        }
                    }
                    let mut v = CodeVisitor::default();
                    v.visit_item(other);
                    let module = &mut self.modules[m];
                    module.refs.extend(v.refs);
                    module.uses.extend(v.uses);
                    module.libc_calls.extend(v.libc_calls);
                    module.has_static_or_extern |= v.static_or_extern;
                }
            }
        }
        Ok(())
    }

    /// The module's name as written in reports: `a::b`, or `crate` for the root.
    fn name_of(&self, m: usize) -> String {
        match self.modules[m].path.is_empty() {
            true => "crate".to_string(),
            false => self.modules[m].path.join("::"),
        }
    }

    fn find(&self, path: &str) -> Option<usize> {
        self.modules.iter().position(|m| m.path.join("::") == path)
    }

    /// What `segs`, written in module `m`, names.
    fn resolve(&self, m: usize, segs: &[String]) -> Target {
        self.resolve_guarded(m, segs, &mut BTreeSet::new())
    }

    fn resolve_guarded(
        &self,
        m: usize,
        segs: &[String],
        seen: &mut BTreeSet<(usize, Vec<String>)>,
    ) -> Target {
        if segs.is_empty() || !seen.insert((m, segs.to_vec())) {
            return Target::Outside;
        }
        let mut rest = segs;
        let mut here = match segs[0].as_str() {
            "crate" => {
                rest = &segs[1..];
                Target::Module(0)
            }
            "self" => {
                rest = &segs[1..];
                Target::Module(m)
            }
            "super" => {
                let mut at = m;
                while rest.first().is_some_and(|s| s == "super") {
                    match self.modules[at].parent {
                        Some(p) => at = p,
                        None => return Target::Outside,
                    }
                    rest = &rest[1..];
                }
                Target::Module(at)
            }
            // The first segment of any other path is looked up where it is written.
            first => match self.lookup(m, first, seen) {
                Some(t) => {
                    rest = &segs[1..];
                    t
                }
                None => return Target::Outside,
            },
        };
        for seg in rest {
            match here {
                Target::Module(at) => match self.lookup(at, seg, seen) {
                    Some(t) => here = t,
                    // Not found through the module: unknown, not an import.
                    None => return Target::Outside,
                },
                // An associated item, a variant: the item's module defines it.
                Target::Item(_) | Target::Outside => break,
            }
        }
        here
    }

    /// The name `name` in module `m`'s namespace: a child module, an item it defines, a name one
    /// of its `use` items binds, or a name of a module it imports whole (`use a::*`).
    fn lookup(
        &self,
        m: usize,
        name: &str,
        seen: &mut BTreeSet<(usize, Vec<String>)>,
    ) -> Option<Target> {
        let module = &self.modules[m];
        if let Some(&c) = module.children.get(name) {
            return Some(Target::Module(c));
        }
        if module.items.contains(name) {
            return Some(Target::Item(m));
        }
        for u in &module.uses {
            if u.name.as_deref() == Some(name) {
                return Some(self.resolve_guarded(m, &u.path, seen));
            }
        }
        for u in module.uses.iter().filter(|u| u.name.is_none()) {
            if let Target::Module(g) = self.resolve_guarded(m, &u.path, seen)
                && g != m
                && let Some(t) = self.lookup(g, name, seen)
            {
                return Some(t);
            }
        }
        None
    }

    /// Every import edge between two different modules.
    fn edges(&self) -> Vec<Edge> {
        let mut out = BTreeSet::new();
        for (m, module) in self.modules.iter().enumerate() {
            let paths = module
                .uses
                .iter()
                .map(|u| (&u.path, u.line))
                .chain(module.refs.iter().map(|(p, l)| (p, *l)));
            for (path, line) in paths {
                let to = match self.resolve(m, path) {
                    Target::Module(t) | Target::Item(t) => t,
                    Target::Outside => continue,
                };
                if to != m {
                    out.insert(Edge {
                        from: m,
                        to,
                        file: module.file.clone(),
                        line,
                    });
                }
            }
        }
        out.into_iter().collect()
    }

    /// The import cycles: each strongly connected component of more than one module, with its
    /// modules' names (sorted) and a report (the modules, then every edge inside with where it is
    /// written).
    pub fn cycles(&self) -> Vec<(Vec<String>, String)> {
        let edges = self.edges();
        let mut next: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); self.modules.len()];
        for e in &edges {
            next[e.from].insert(e.to);
        }
        let mut out = Vec::new();
        for scc in tarjan(&next) {
            if scc.len() < 2 {
                continue;
            }
            let set: BTreeSet<usize> = scc.iter().copied().collect();
            let mut names: Vec<String> = set.iter().map(|&m| self.name_of(m)).collect();
            names.sort();
            let mut report = format!(
                "{}: a cycle of {} modules: {}",
                self.name,
                names.len(),
                names.join(", ")
            );
            // One line per pair of modules, with every place it is written.
            let mut pairs: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
            for e in edges
                .iter()
                .filter(|e| set.contains(&e.from) && set.contains(&e.to))
            {
                pairs
                    .entry((self.name_of(e.from), self.name_of(e.to)))
                    .or_default()
                    .push(format!("{}:{}", e.file.display(), e.line));
            }
            for ((from, to), places) in pairs {
                let _ = write!(report, "\n    {from} -> {to} ({})", places.join(", "));
            }
            out.push((names, report));
        }
        out
    }

    /// Imports that break the layer table, and top-level modules outside it.
    pub fn layer_violations(&self) -> Vec<String> {
        let Some(layers) = &self.layers else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let layer_of = |top: &str| {
            layers
                .iter()
                .position(|l| l.modules.iter().any(|m| m == top))
        };
        for name in self.modules[0].children.keys() {
            let n = layers.iter().filter(|l| l.modules.contains(name)).count();
            if n != 1 {
                out.push(format!(
                    "{}: `{name}` is in {n} layers of the table (it belongs in exactly one)",
                    self.name
                ));
            }
        }
        for l in layers {
            for m in l.modules.iter().chain(&l.never) {
                if !self.modules[0].children.contains_key(m) {
                    out.push(format!(
                        "{}: the layer table names `{m}`, which is no top-level module",
                        self.name
                    ));
                }
            }
        }
        for e in self.edges() {
            let (from, to) = (&self.modules[e.from].path, &self.modules[e.to].path);
            let (Some(from_top), Some(to_top)) = (from.first(), to.first()) else {
                continue;
            };
            if from_top == to_top {
                continue;
            }
            let (Some(lf), Some(lt)) = (layer_of(from_top), layer_of(to_top)) else {
                continue;
            };
            let why = if lt > lf {
                format!("layer {} is above {}", layers[lt].name, layers[lf].name)
            } else if layers[lf].never.contains(to_top) {
                format!("layer {} never imports `{to_top}`", layers[lf].name)
            } else {
                continue;
            };
            out.push(format!(
                "{}: {} -> {} ({}:{}): {why}",
                self.name,
                self.name_of(e.from),
                self.name_of(e.to),
                e.file.display(),
                e.line
            ));
        }
        out
    }

    /// Whether `path` (`a::b`, or `a::b::Item`) names a module of this crate or an item one of its
    /// modules defines or binds.
    fn names(&self, path: &str) -> bool {
        let segs: Vec<String> = path.split("::").map(str::to_string).collect();
        if self.find(path).is_some() {
            return true;
        }
        let (last, parent) = segs.split_last().unwrap();
        self.find(&parent.join("::")).is_some_and(|m| {
            self.modules[m].items.contains(last)
                || self.modules[m]
                    .uses
                    .iter()
                    .any(|u| u.name.as_deref() == Some(last))
        })
    }

    #[cfg(test)]
    /// The files whose code calls these C library functions (`libc::name(..)`).
    fn libc_callers(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for m in &self.modules {
            if !m.libc_calls.is_empty() {
                out.entry(m.file.display().to_string())
                    .or_default()
                    .extend(m.libc_calls.iter().cloned());
            }
        }
        out
    }
}

/// Strongly connected components (Tarjan), each a list of nodes.
fn tarjan(next: &[BTreeSet<usize>]) -> Vec<Vec<usize>> {
    struct State<'a> {
        next: &'a [BTreeSet<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        counter: usize,
        out: Vec<Vec<usize>>,
    }
    fn connect(s: &mut State, v: usize) {
        s.index[v] = Some(s.counter);
        s.low[v] = s.counter;
        s.counter += 1;
        s.stack.push(v);
        s.on_stack[v] = true;
        for &w in s.next[v].iter() {
            match s.index[w] {
                None => {
                    connect(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on_stack[w] => s.low[v] = s.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut scc = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on_stack[w] = false;
                scc.push(w);
                if w == v {
                    break;
                }
            }
            s.out.push(scc);
        }
    }
    let n = next.len();
    let mut s = State {
        next,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        counter: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if s.index[v].is_none() {
            connect(&mut s, v);
        }
    }
    s.out
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    match item {
        syn::Item::Const(i) => &i.attrs,
        syn::Item::Enum(i) => &i.attrs,
        syn::Item::ExternCrate(i) => &i.attrs,
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::ForeignMod(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Macro(i) => &i.attrs,
        syn::Item::Mod(i) => &i.attrs,
        syn::Item::Static(i) => &i.attrs,
        syn::Item::Struct(i) => &i.attrs,
        syn::Item::Trait(i) => &i.attrs,
        syn::Item::TraitAlias(i) => &i.attrs,
        syn::Item::Type(i) => &i.attrs,
        syn::Item::Union(i) => &i.attrs,
        syn::Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

/// The name an item defines (modules and `use` items are read on their own).
fn item_name(item: &syn::Item) -> Option<String> {
    let ident = match item {
        syn::Item::Const(i) => &i.ident,
        syn::Item::Enum(i) => &i.ident,
        syn::Item::Fn(i) => &i.sig.ident,
        syn::Item::Static(i) => &i.ident,
        syn::Item::Struct(i) => &i.ident,
        syn::Item::Trait(i) => &i.ident,
        syn::Item::TraitAlias(i) => &i.ident,
        syn::Item::Type(i) => &i.ident,
        syn::Item::Union(i) => &i.ident,
        syn::Item::Macro(i) => i.ident.as_ref()?,
        _ => return None,
    };
    Some(ident.to_string())
}

/// Test-only: `#[cfg(test)]`, `#[cfg(all(test, ..))]`, `#[test]`.
fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        if a.path().is_ident("test") {
            return true;
        }
        if !a.path().is_ident("cfg") {
            return false;
        }
        let Ok(list) = a.meta.require_list() else {
            return false;
        };
        let words: Vec<String> = list
            .tokens
            .clone()
            .into_iter()
            .filter_map(|t| match t {
                TokenTree::Ident(i) => Some(i.to_string()),
                _ => None,
            })
            .collect();
        words.iter().any(|w| w == "test") && !words.iter().any(|w| w == "not" || w == "any")
    })
}

/// The bindings of a `use` tree: `a::{b, c::d as e, f::*, self}` binds `b` (a::b), `e` (a::c::d),
/// everything of `a::f`, and `a` (a).
fn flatten_use(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<Use>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            flatten_use(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => out.push(binding(prefix, &n.ident, &n.ident)),
        syn::UseTree::Rename(r) => out.push(binding(prefix, &r.ident, &r.rename)),
        syn::UseTree::Glob(g) => out.push(Use {
            name: None,
            path: prefix.clone(),
            line: g.star_token.span.start().line,
        }),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                flatten_use(t, prefix, out);
            }
        }
    }
}

fn binding(prefix: &[String], ident: &syn::Ident, bound: &syn::Ident) -> Use {
    let mut path = prefix.to_vec();
    let own = if ident == "self" {
        prefix.last().cloned().unwrap_or_default()
    } else {
        path.push(ident.to_string());
        ident.to_string()
    };
    // `as _` binds no name but still imports (a trait).
    let name = match bound.to_string().as_str() {
        "_" => String::new(),
        "self" => own,
        other => other.to_string(),
    };
    Use {
        name: Some(name),
        path,
        line: ident.span().start().line,
    }
}

/// The paths, `use` items, C library calls and statics in one item's code (test parts left out).
#[derive(Default)]
struct CodeVisitor {
    refs: Vec<(Vec<String>, usize)>,
    uses: Vec<Use>,
    libc_calls: BTreeSet<String>,
    static_or_extern: bool,
}

impl<'ast> Visit<'ast> for CodeVisitor {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if is_test(item_attrs(item)) {
            return;
        }
        match item {
            syn::Item::Use(u) if u.leading_colon.is_none() => {
                flatten_use(&u.tree, &mut Vec::new(), &mut self.uses);
            }
            syn::Item::Static(_) | syn::Item::ForeignMod(_) => {
                self.static_or_extern = true;
                syn::visit::visit_item(self, item);
            }
            _ => syn::visit::visit_item(self, item),
        }
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let attrs = match item {
            syn::ImplItem::Const(i) => &i.attrs,
            syn::ImplItem::Fn(i) => &i.attrs,
            syn::ImplItem::Type(i) => &i.attrs,
            syn::ImplItem::Macro(i) => &i.attrs,
            _ => return,
        };
        if !is_test(attrs) {
            syn::visit::visit_impl_item(self, item);
        }
    }

    fn visit_signature(&mut self, sig: &'ast syn::Signature) {
        if sig.abi.is_some() {
            self.static_or_extern = true;
        }
        syn::visit::visit_signature(self, sig);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() && path.segments.len() >= 2 {
            let segs: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
            self.refs
                .push((segs, path.segments[0].ident.span().start().line));
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_expr_call(&mut self, call: &'ast syn::ExprCall) {
        if let syn::Expr::Path(p) = &*call.func
            && p.path.segments.len() == 2
            && p.path.segments[0].ident == "libc"
        {
            self.libc_calls.insert(p.path.segments[1].ident.to_string());
        }
        syn::visit::visit_expr_call(self, call);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        if mac.path.is_ident("thread_local") {
            self.static_or_extern = true;
        }
        self.scan_tokens(mac.tokens.clone());
        syn::visit::visit_macro(self, mac);
    }
}

impl CodeVisitor {
    /// Paths in a macro's tokens (`format!("{}", crate::a::B)`, `matches!(x, m::E::V)`), which
    /// `syn` leaves unparsed: every run of `ident :: ident ...`, and C library calls.
    fn scan_tokens(&mut self, tokens: TokenStream) {
        let toks: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < toks.len() {
            match &toks[i] {
                TokenTree::Group(g) => {
                    self.scan_tokens(g.stream());
                    i += 1;
                }
                TokenTree::Ident(first) => {
                    let after_colons = i > 0 && is_colon(&toks[i - 1]);
                    let mut segs = vec![first.to_string()];
                    let mut j = i + 1;
                    while j + 2 < toks.len() + 1
                        && is_path_sep(&toks, j)
                        && let Some(TokenTree::Ident(next)) = toks.get(j + 2)
                    {
                        segs.push(next.to_string());
                        j += 3;
                    }
                    if segs.len() >= 2 && !after_colons {
                        if segs.len() == 2
                            && segs[0] == "libc"
                            && matches!(toks.get(j), Some(TokenTree::Group(g)) if g.delimiter() == proc_macro2::Delimiter::Parenthesis)
                        {
                            self.libc_calls.insert(segs[1].clone());
                        }
                        self.refs.push((segs, first.span().start().line));
                    }
                    i = j;
                }
                _ => i += 1,
            }
        }
    }
}

fn is_colon(t: &TokenTree) -> bool {
    matches!(t, TokenTree::Punct(p) if p.as_char() == ':')
}

/// `::` at `j` (two joint `:` puncts).
fn is_path_sep(toks: &[TokenTree], j: usize) -> bool {
    matches!(
        (toks.get(j), toks.get(j + 1)),
        (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
            if a.as_char() == ':' && b.as_char() == ':' && a.spacing() == proc_macro2::Spacing::Joint
    )
}

/// The text of `//!` doc comments.
fn doc_text(attrs: &[syn::Attribute]) -> String {
    let mut out = String::new();
    for a in attrs {
        if let syn::Meta::NameValue(nv) = &a.meta
            && nv.path.is_ident("doc")
            && let syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) = &nv.value
        {
            let line = s.value();
            out.push_str(line.strip_prefix(' ').unwrap_or(&line));
            out.push('\n');
        }
    }
    out
}

/// The `# Layers` section of a crate root's doc: numbered items `N. name: `a`, `b`; never `c`.
/// Text.`, continuation lines indented.
fn parse_layers(doc: &str) -> Result<Option<Vec<Layer>>> {
    let mut lines = doc.lines().skip_while(|l| l.trim() != "# Layers");
    if lines.next().is_none() {
        return Ok(None);
    }
    let mut entries: Vec<String> = Vec::new();
    for line in lines {
        if line.starts_with('#') {
            break;
        }
        let numbered = line
            .split_once(". ")
            .is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
        if numbered {
            entries.push(line.split_once(". ").unwrap().1.to_string());
        } else if line.starts_with("   ")
            && let Some(last) = entries.last_mut()
        {
            last.push(' ');
            last.push_str(line.trim());
        }
    }
    if entries.is_empty() {
        bail!("no numbered layers (`1. name: `module`, ... Description.`)");
    }
    let mut layers = Vec::new();
    for e in entries {
        let (name, rest) = e
            .split_once(": ")
            .with_context(|| format!("`{e}`: no `name: ` at the start"))?;
        let (modules, rest) = backticked_list(rest);
        if modules.is_empty() {
            bail!("layer {name}: no `module` after the colon");
        }
        let never = match rest.strip_prefix("; never ") {
            Some(r) => backticked_list(r).0,
            None => Vec::new(),
        };
        layers.push(Layer {
            name: name.to_string(),
            modules,
            never,
        });
    }
    Ok(Some(layers))
}

/// A list `` `a`, `b` `` at the start of `s`, and what follows it.
fn backticked_list(mut s: &str) -> (Vec<String>, &str) {
    let mut out = Vec::new();
    while let Some(r) = s.strip_prefix('`') {
        let Some((word, after)) = r.split_once('`') else {
            break;
        };
        out.push(word.to_string());
        s = after;
        match s.strip_prefix(", ") {
            Some(r) if r.starts_with('`') => s = r,
            _ => break,
        }
    }
    (out, s)
}

/// A layer table as docs/architecture.md shows it.
fn render_layers(layers: &[Layer]) -> String {
    let ticked = |ms: &[String]| {
        ms.iter()
            .map(|m| format!("`{m}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut out = String::from("| # | layer | modules | never imports |\n|---|---|---|---|\n");
    for (i, l) in layers.iter().enumerate() {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            i + 1,
            l.name,
            ticked(&l.modules),
            ticked(&l.never)
        );
    }
    out
}

/// Every crate's layer table, between the markers docs/architecture.md holds them in.
fn rendered_tables(crates: &[Crate]) -> String {
    let mut out = String::new();
    for c in crates {
        if let Some(l) = &c.layers {
            let _ = write!(out, "\n`{}`, lowest first:\n\n{}", c.name, render_layers(l));
        }
    }
    out.push('\n');
    out
}

const TABLES_BEGIN: &str = "<!-- layer tables (cargo xtask layers --bless writes them) -->\n";
const TABLES_END: &str = "<!-- end of layer tables -->\n";

/// What in docs/architecture.md is no longer true: a file or folder (`agent/src/x.rs`) or a
/// module or item path (`collector::assemble`, `region::Region`) in backticks that does not
/// exist, or layer tables that differ from the crates' own.
fn doc_problems(doc: &str, crates: &[Crate]) -> Vec<String> {
    let root = workspace();
    let mut out = Vec::new();
    match (doc.find(TABLES_BEGIN), doc.find(TABLES_END)) {
        (Some(b), Some(e)) if doc[b + TABLES_BEGIN.len()..e] == rendered_tables(crates) => {}
        _ => out.push(
            "the layer tables differ from the crates' (`cargo xtask layers --bless` writes them)"
                .to_string(),
        ),
    }
    for (n, span) in doc.split('`').enumerate() {
        // Odd pieces are inside backticks.
        if n % 2 == 0 || span.contains(' ') {
            continue;
        }
        let is_ident = |s: &str| {
            !s.is_empty()
                && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !s.starts_with(|c: char| c.is_ascii_digit())
        };
        if span.contains('/')
            && (span.ends_with(".rs") || span.ends_with('/') || span.ends_with(".md"))
        {
            if !root.join(span).exists() {
                out.push(format!("`{span}`: no such file or folder"));
            }
        } else if span.contains("::") && span.split("::").all(is_ident) {
            let first = span.split("::").next().unwrap();
            if ["std", "core", "alloc"].contains(&first) {
                continue;
            }
            // `crate_name::path` names a path in that crate; any other, a path in some crate.
            let named = crates.iter().any(|c| {
                let krate = c.name.split(' ').next().unwrap();
                let krate = krate.rsplit('/').next().unwrap().replace('-', "_");
                match span.strip_prefix(&format!("{krate}::")) {
                    Some(rest) => c.names(rest),
                    None => c.names(span),
                }
            });
            if !named {
                out.push(format!("`{span}`: no such module or item in any crate"));
            }
        }
    }
    out
}

fn architecture_doc() -> PathBuf {
    workspace().join("docs/architecture.md")
}

/// The workspace's directory.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Every crate root of the workspace's members.
pub fn workspace_crates() -> Result<Vec<Crate>> {
    let root = workspace();
    let manifest = fs::read_to_string(root.join("Cargo.toml"))?;
    let members = manifest
        .split("members = [")
        .nth(1)
        .context("no members in Cargo.toml")?
        .split(']')
        .next()
        .unwrap();
    let read = |p: &Path| fs::read_to_string(root.join(p)).ok();
    let mut out = Vec::new();
    for member in members.split(',').map(|m| m.trim().trim_matches('"')) {
        if member.is_empty() {
            continue;
        }
        let roots: Vec<&str> = ["lib", "main"]
            .into_iter()
            .filter(|r| root.join(member).join(format!("src/{r}.rs")).exists())
            .collect();
        for r in &roots {
            let name = match roots.len() {
                1 => member.to_string(),
                _ => format!("{member} ({})", if *r == "lib" { "lib" } else { "bin" }),
            };
            out.push(Crate::load(
                &name,
                &Path::new(member).join(format!("src/{r}.rs")),
                &read,
            )?);
        }
    }
    Ok(out)
}

/// Import cycles not broken yet, each as its crate and its modules (sorted, `crate` for the
/// root): the check fails on any other cycle, and on one of these that is gone (so the list only
/// shrinks). Each is a parent module and its children importing each other, or siblings sharing
/// items that belong in a module below both.
const KNOWN_CYCLES: &[(&str, &str)] = &[];

/// Problems of the whole workspace: cycles (but the known ones), layer violations.
pub fn problems(crates: &[Crate]) -> Vec<String> {
    problems_with(crates, KNOWN_CYCLES)
}

fn problems_with(crates: &[Crate], known: &[(&str, &str)]) -> Vec<String> {
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for c in crates {
        for (names, report) in c.cycles() {
            let key = (c.name.as_str(), names.join(", "));
            if known.iter().any(|(k, m)| *k == key.0 && *m == key.1) {
                seen.insert(key);
            } else {
                out.push(report);
            }
        }
        out.extend(c.layer_violations());
    }
    for (k, m) in known {
        if !seen.contains(&(*k, m.to_string())) {
            out.push(format!(
                "{k}: the known cycle {m} is gone: take it out of KNOWN_CYCLES in xtask/src/layers.rs"
            ));
        }
    }
    out
}

/// `cargo xtask layers [--bless | --edges CRATE]`: prints every crate's layer table and every
/// problem (docs/architecture.md's included); fails on a problem. `--bless` first writes the
/// tables into docs/architecture.md; `--edges` prints the crate's import edges instead.
pub fn run(args: &[String]) -> Result<()> {
    let crates = workspace_crates()?;
    if let [flag, name] = args
        && flag == "--edges"
    {
        let c = crates
            .iter()
            .find(|c| &c.name == name)
            .with_context(|| format!("no crate {name}"))?;
        for e in c.edges() {
            println!(
                "{} -> {} ({}:{})",
                c.name_of(e.from),
                c.name_of(e.to),
                e.file.display(),
                e.line
            );
        }
        return Ok(());
    }
    for c in &crates {
        if let Some(l) = &c.layers {
            println!("{}:\n{}", c.name, render_layers(l));
        }
    }
    if args.first().is_some_and(|a| a == "--bless") {
        let path = architecture_doc();
        let doc = fs::read_to_string(&path)?;
        let (Some(b), Some(e)) = (doc.find(TABLES_BEGIN), doc.find(TABLES_END)) else {
            bail!("{}: no layer table markers", path.display());
        };
        let fresh = format!(
            "{}{}{}",
            &doc[..b + TABLES_BEGIN.len()],
            rendered_tables(&crates),
            &doc[e..]
        );
        fs::write(&path, fresh)?;
    }
    println!("{} known import cycles not broken yet", KNOWN_CYCLES.len());
    let mut problems = problems(&crates);
    let doc = fs::read_to_string(architecture_doc())?;
    problems.extend(
        doc_problems(&doc, &crates)
            .into_iter()
            .map(|p| format!("docs/architecture.md: {p}")),
    );
    for p in &problems {
        println!("{p}");
    }
    if !problems.is_empty() {
        bail!("{} import cycles or layer violations", problems.len());
    }
    println!("no import cycle but the known ones, no layer violation, docs/architecture.md true");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A crate from `(path, text)` pairs; its root is `src/lib.rs`.
    fn synthetic(files: &[(&str, &str)]) -> Crate {
        let files: BTreeMap<PathBuf, String> = files
            .iter()
            .map(|(p, t)| (PathBuf::from(p), t.to_string()))
            .collect();
        Crate::load("synthetic", Path::new("src/lib.rs"), &|p| {
            files.get(p).cloned()
        })
        .unwrap()
    }

    fn edge_names(c: &Crate) -> BTreeSet<(String, String)> {
        c.edges()
            .iter()
            .map(|e| (c.name_of(e.from), c.name_of(e.to)))
            .collect()
    }

    fn has_edge(c: &Crate, from: &str, to: &str) -> bool {
        edge_names(c).contains(&(from.to_string(), to.to_string()))
    }

    #[test]
    fn the_workspace_has_no_import_cycle_and_keeps_its_layers() {
        let crates = workspace_crates().unwrap();
        for expected in ["agent", "region", "limiter", "limiter-core", "xtask"] {
            assert!(
                crates.iter().any(|c| c.name == expected),
                "{expected} not read"
            );
        }
        // Known edges, so that a reader that finds nothing cannot pass.
        let limiter = crates.iter().find(|c| c.name == "limiter").unwrap();
        assert!(has_edge(limiter, "hooks::memory", "hooks::gate"));
        assert!(has_edge(limiter, "runtime::process", "runtime::state"));
        let agent = crates.iter().find(|c| c.name == "agent").unwrap();
        assert!(has_edge(agent, "tui", "model"));
        assert!(agent.layers.is_some() && limiter.layers.is_some());
        // Every crate of the product and its test tools keeps a layer table.
        for name in [
            "agent",
            "agent-common",
            "region",
            "tenant-fs",
            "limiter",
            "limiter-core",
            "testing/sim-cuda",
            "testing/cuda-exercise",
            "xtask",
        ] {
            let c = crates.iter().find(|c| c.name == name).unwrap();
            assert!(c.layers.is_some(), "{name} has no `# Layers` table");
        }
        let problems = problems(&crates);
        assert!(problems.is_empty(), "\n{}", problems.join("\n"));
    }

    #[test]
    fn the_architecture_doc_names_what_exists() {
        let crates = workspace_crates().unwrap();
        let doc = fs::read_to_string(architecture_doc()).unwrap();
        assert!(doc.contains("`agent/src/collector/regions.rs`"));
        let problems = doc_problems(&doc, &crates);
        assert!(
            problems.is_empty(),
            "docs/architecture.md:\n{}",
            problems.join("\n")
        );
        let stale = doc.replace("`collector::assemble`", "`collector::gone`");
        assert!(
            doc_problems(&stale, &crates)
                .iter()
                .any(|p| p.contains("collector::gone"))
        );
        let stale = doc.replace(
            "`agent/src/collector/regions.rs`",
            "`agent/src/collector/gone.rs`",
        );
        assert!(
            doc_problems(&stale, &crates)
                .iter()
                .any(|p| p.contains("gone.rs"))
        );
    }

    #[test]
    fn only_the_agents_sys_module_calls_the_c_library() {
        let crates = workspace_crates().unwrap();
        let agent = crates.iter().find(|c| c.name == "agent").unwrap();
        let callers = agent.libc_callers();
        assert!(callers.keys().any(|f| f.starts_with("agent/src/sys/")));
        let outside: Vec<_> = callers
            .iter()
            .filter(|(f, _)| !f.starts_with("agent/src/sys/"))
            .collect();
        assert!(
            outside.is_empty(),
            "libc called outside sys/ (add a typed function there): {outside:?}"
        );
    }

    /// `limiter-core` is logic only: the compiler forbids `unsafe` there; this checks the rest of
    /// the promise, no statics and no C library or environment, outside its tests.
    #[test]
    fn the_limiter_core_has_no_statics_and_no_system_calls() {
        let crates = workspace_crates().unwrap();
        let core = crates.iter().find(|c| c.name == "limiter-core").unwrap();
        let lib = fs::read_to_string(workspace().join("limiter-core/src/lib.rs")).unwrap();
        assert!(lib.contains("#![forbid(unsafe_code)]"));
        let manifest = fs::read_to_string(workspace().join("limiter-core/Cargo.toml")).unwrap();
        let deps = manifest.split("[dependencies]").nth(1).unwrap();
        let deps = deps.split("\n[").next().unwrap();
        assert!(!deps.contains("libc"), "limiter-core depends on libc");
        for m in &core.modules {
            assert!(
                !m.has_static_or_extern,
                "{}: a static, thread_local! or extern",
                m.file.display()
            );
            let system = m.refs.iter().find(|(p, _)| {
                p[0] == "libc" || (p[0] == "std" && p[1] == "env") || (p[0] == "env")
            });
            assert!(system.is_none(), "{}: {system:?}", m.file.display());
        }
    }

    #[test]
    fn self_paths_resolve_from_the_module_they_are_written_in() {
        // In a.rs `self::` is `a`, whose child is `a::b`; b uses a's item.
        let c = synthetic(&[
            ("src/lib.rs", "mod a;"),
            ("src/a.rs", "mod b; pub struct A; use self::b::B;"),
            ("src/a/b.rs", "pub struct B; use super::A;"),
        ]);
        assert!(has_edge(&c, "a", "a::b"));
        assert!(has_edge(&c, "a::b", "a"));
        assert_eq!(c.cycles().len(), 1, "{:?}", c.cycles());
        assert_eq!(c.cycles()[0].0, ["a", "a::b"]);
        assert!(
            c.cycles()[0].1.contains("src/a.rs:1"),
            "{}",
            c.cycles()[0].1
        );
    }

    #[test]
    fn a_path_starting_with_a_child_module_is_an_import_of_it() {
        // platform::nvml and platform::nvml::sampler, in use items and in code.
        let c = synthetic(&[
            ("src/lib.rs", "mod platform;"),
            ("src/platform/mod.rs", "pub mod nvml;"),
            (
                "src/platform/nvml.rs",
                "pub mod sampler; pub struct Api; fn f() { sampler::sample(); }",
            ),
            (
                "src/platform/nvml/sampler.rs",
                "pub fn sample() { let _ = super::Api; }",
            ),
        ]);
        assert!(has_edge(&c, "platform::nvml", "platform::nvml::sampler"));
        assert!(has_edge(&c, "platform::nvml::sampler", "platform::nvml"));
        assert_eq!(c.cycles().len(), 1);
        // Known, it passes; gone, it is a problem of its own.
        let known = [("synthetic", "platform::nvml, platform::nvml::sampler")];
        assert!(problems_with(std::slice::from_ref(&c), &known).is_empty());
        assert_eq!(problems_with(std::slice::from_ref(&c), &[]).len(), 1);
        let c = synthetic(&[
            ("src/lib.rs", "mod a; pub struct Root;"),
            ("src/a.rs", "mod b; use b::X;"),
            ("src/a/b.rs", "pub struct X; use crate::a;"),
        ]);
        assert!(has_edge(&c, "a", "a::b") && has_edge(&c, "a::b", "a"));
    }

    #[test]
    fn re_exports_are_followed_to_the_defining_module() {
        // stat reaches probes::session's type through collector's re-export, and two hops.
        let c = synthetic(&[
            (
                "src/lib.rs",
                "mod collector; mod probes; mod stat; mod tui;",
            ),
            (
                "src/collector/mod.rs",
                "pub use crate::probes::session::TraceOptions; pub use self::TraceOptions as Opts;",
            ),
            ("src/probes/mod.rs", "pub mod session;"),
            ("src/probes/session.rs", "pub struct TraceOptions;"),
            ("src/stat.rs", "use crate::collector::TraceOptions;"),
            ("src/tui.rs", "fn f(_: crate::collector::Opts) {}"),
        ]);
        assert!(has_edge(&c, "stat", "probes::session"));
        assert!(has_edge(&c, "tui", "probes::session"));
        assert!(has_edge(&c, "collector", "probes::session"));
        assert!(!has_edge(&c, "stat", "collector"));
    }

    #[test]
    fn a_glob_imports_the_module_and_its_names() {
        let c = synthetic(&[
            ("src/lib.rs", "mod a; mod b; mod c;"),
            ("src/a.rs", "pub struct A; use crate::b::*;"),
            ("src/b.rs", "pub use crate::c::*;"),
            ("src/c.rs", "pub struct C; fn f() { let _ = crate::a::A; }"),
        ]);
        assert!(has_edge(&c, "a", "b"));
        assert!(has_edge(&c, "b", "c"));
        assert!(has_edge(&c, "c", "a"));
        assert_eq!(c.cycles().len(), 1);
        // A name found through the glob: `b::C` is c's.
        let c = synthetic(&[
            ("src/lib.rs", "mod a; mod b; mod c;"),
            ("src/a.rs", "fn f() { let _ = crate::b::C; }"),
            ("src/b.rs", "pub use crate::c::*;"),
            ("src/c.rs", "pub struct C;"),
        ]);
        assert!(has_edge(&c, "a", "c"));
        assert!(!has_edge(&c, "a", "b"));
    }

    #[test]
    fn super_climbs_from_the_module_and_test_code_is_left_out() {
        let c = synthetic(&[
            ("src/lib.rs", "mod x; mod y;"),
            ("src/x/mod.rs", "mod inner; pub struct X; use crate::y::Y;"),
            (
                "src/x/inner.rs",
                "fn f() { let _ = super::super::y::Y; format!(\"{}\", super::X); }",
            ),
            (
                "src/y.rs",
                "pub struct Y;\n#[cfg(test)]\nmod tests { use crate::x::X; }\n#[cfg(test)]\nuse crate::x::X;",
            ),
        ]);
        assert!(has_edge(&c, "x::inner", "y"));
        assert!(has_edge(&c, "x::inner", "x"));
        assert!(!has_edge(&c, "y", "x"));
        assert!(c.cycles().is_empty());
    }

    #[test]
    fn the_layer_table_is_read_and_enforced() {
        let c = synthetic(&[
            (
                "src/lib.rs",
                "//! # Layers\n//!\n//! 1. base: `a`, `b`. Below.\n//! 2. top: `c`; never `b`. Above\n//!    it all.\nmod a; mod b; mod c;",
            ),
            ("src/a.rs", "pub struct A; use crate::c::C;"),
            ("src/b.rs", "pub struct B;"),
            (
                "src/c.rs",
                "pub struct C; use crate::a::A; use crate::b::B;",
            ),
        ]);
        assert_eq!(
            c.layers.as_ref().unwrap()[1],
            Layer {
                name: "top".into(),
                modules: vec!["c".into()],
                never: vec!["b".into()]
            }
        );
        let bad = c.layer_violations();
        assert_eq!(bad.len(), 2, "{bad:?}");
        assert!(bad[0].contains("a -> c (src/a.rs:1): layer top is above base"));
        assert!(bad[1].contains("c -> b (src/c.rs:1): layer top never imports `b`"));
        let c = synthetic(&[
            (
                "src/lib.rs",
                "//! # Layers\n//!\n//! 1. base: `a`, `gone`.\nmod a; mod b;",
            ),
            ("src/a.rs", ""),
            ("src/b.rs", ""),
        ]);
        let bad = c.layer_violations();
        assert!(
            bad.iter().any(|b| b.contains("`b` is in 0 layers")),
            "{bad:?}"
        );
        assert!(bad.iter().any(|b| b.contains("names `gone`")), "{bad:?}");
    }

    #[test]
    fn tarjan_finds_each_component() {
        let next: Vec<BTreeSet<usize>> = vec![
            [1].into(),
            [2].into(),
            [0, 3].into(),
            [4].into(),
            [3].into(),
            [].into(),
        ];
        let mut sccs: Vec<Vec<usize>> = tarjan(&next)
            .into_iter()
            .map(|mut s| {
                s.sort();
                s
            })
            .collect();
        sccs.sort();
        assert_eq!(sccs, [vec![0, 1, 2], vec![3, 4], vec![5]]);
    }
}

//! The exported symbol set is exactly `limiter/exports.allow`: the hooks and `dlsym`, nothing else
//! (no Rust symbols, nothing from dependencies).

mod support;

use std::process::Command;

#[test]
fn exported_symbols_match_the_allow_list() {
    let so = &support::paths().limiter;
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(so)
        .output()
        .expect("run nm");
    assert!(out.status.success(), "{}", support::text(&out.stderr));
    let mut exported: Vec<String> = support::text(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_owned))
        .collect();
    exported.sort();
    let allow = include_str!("../exports.allow");
    let mut allowed: Vec<String> = allow
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    allowed.sort();
    assert_eq!(
        exported,
        allowed,
        "nm -D --defined-only {} differs from limiter/exports.allow",
        so.display()
    );
}

//! cuda-exercise against the real NVIDIA driver library, when `VGPU_TEST_LIBCUDA` names one
//! (e.g. Debian's libcuda1 535 unpacked on a machine without a GPU).

mod common;

use agent_common::api::{APIS, ApiKind};
use common::*;
use std::path::Path;

#[test]
fn counts_against_the_real_driver() {
    let Some(lib) = std::env::var_os("VGPU_TEST_LIBCUDA") else {
        eprintln!("note: VGPU_TEST_LIBCUDA is not set; skipping the test against the real libcuda");
        return;
    };
    let out = run_lib(
        Path::new(&lib),
        &["counts", "--per-api", "3", "--init"],
        &[],
    );
    let v = json(&out);
    let missing: Vec<&str> = v["missing"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    let mut called = 0;
    for a in APIS
        .iter()
        .filter(|a| a.kind != ApiKind::Info && !a.kind.is_nccl())
    {
        if missing.contains(&a.name) {
            continue;
        }
        called += 1;
        let calls = if a.name == "cuInit" { 4 } else { 3 };
        assert_eq!(stat(&v, a.name, "calls"), calls, "{}", a.name);
        // Without a GPU every call fails (cuInit with 100, most others with 3), except name
        // resolution, which needs no device.
        if a.name.starts_with("cuGetProcAddress") {
            continue;
        }
        assert_eq!(
            stat(&v, a.name, "errors"),
            calls,
            "{}: {}",
            a.name,
            v["calls"][a.name]
        );
    }
    assert!(
        called > 40,
        "only {called} traced APIs are exported by {lib:?}: {v}"
    );
}

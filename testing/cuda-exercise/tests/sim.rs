//! cuda-exercise against the simulated driver: counts, capacity, accounting, delays,
//! cuGetProcAddress and the exported symbol table.

mod common;

use agent_common::api::{APIS, ApiKind};
use common::*;
use object::{Object, ObjectSection, ObjectSymbol};
use std::collections::HashMap;

const PROBED: [ApiKind; 6] = [
    ApiKind::Alloc,
    ApiKind::Free,
    ApiKind::Sync,
    ApiKind::Copy,
    ApiKind::Launch,
    ApiKind::Lifecycle,
];

#[test]
fn counts_are_exact() {
    let v = json(&run_sim(
        &["counts", "--per-api", "7", "--init", "--size", "1000"],
        &[],
    ));
    assert_eq!(v["missing"].as_array().unwrap().len(), 0, "{v}");
    assert_eq!(v["pid"].as_u64().map(|p| p > 0), Some(true));
    for a in APIS.iter().filter(|a| PROBED.contains(&a.kind)) {
        let expect = if a.name == "cuInit" { 8 } else { 7 };
        assert_eq!(stat(&v, a.name, "calls"), expect, "{}", a.name);
        let bytes = match (a.size_arg, a.name) {
            (None, _) => 0,
            (Some(_), "cuMemCreate" | "cuMemMap" | "cuMemUnmap") => 7 * (2 << 20),
            (Some(_), _) => 7 * 1000,
        };
        assert_eq!(stat(&v, a.name, "bytes"), bytes, "{}", a.name);
    }
    // Info APIs are not part of the default set.
    assert!(v["calls"].get("cuMemGetInfo_v2").is_none());
    // After cuInit the sim's allocations succeed; frees of address 0 fail with INVALID_VALUE.
    assert_eq!(stat(&v, "cuMemAlloc_v2", "errors"), 0);
    assert_eq!(v["calls"]["cuMemFree_v2"]["codes"]["1"], 7);
}

#[test]
fn calls_before_init_fail_with_not_initialized() {
    let v = json(&run_sim(
        &[
            "counts",
            "--per-api",
            "3",
            "--apis",
            "cuMemAlloc_v2,cuCtxSynchronize",
        ],
        &[],
    ));
    assert_eq!(v["calls"]["cuMemAlloc_v2"]["codes"]["3"], 3, "{v}");
    assert_eq!(v["calls"]["cuCtxSynchronize"]["codes"]["3"], 3, "{v}");
    let v = json(&run_sim(
        &["counts", "--per-api", "3", "--apis", "cuMemAlloc_v2"],
        &[("SIMCUDA_REQUIRE_INIT", "0")],
    ));
    assert_eq!(stat(&v, "cuMemAlloc_v2", "errors"), 0, "{v}");
}

#[test]
fn allocations_past_capacity_fail_with_out_of_memory() {
    // 10 KiB capacity: two 4 KiB allocations fit, the other three do not.
    let v = json(&run_sim(
        &[
            "counts",
            "--per-api",
            "5",
            "--init",
            "--apis",
            "cuMemAlloc_v2",
            "--size",
            "4096",
        ],
        &[("SIMCUDA_CAPACITY", "10k")],
    ));
    assert_eq!(stat(&v, "cuMemAlloc_v2", "calls"), 5);
    assert_eq!(stat(&v, "cuMemAlloc_v2", "errors"), 3);
    assert_eq!(v["calls"]["cuMemAlloc_v2"]["codes"]["2"], 3, "{v}");
    assert_eq!(v["calls"]["cuMemAlloc_v2"]["codes"]["0"], 2, "{v}");
    assert_eq!(stat(&v, "cuMemAlloc_v2", "bytes"), 5 * 4096);
}

#[test]
fn failure_injection_every_nth_call() {
    let v = json(&run_sim(
        &[
            "counts",
            "--per-api",
            "10",
            "--init",
            "--apis",
            "cuStreamSynchronize",
        ],
        &[("SIMCUDA_FAIL", "cuStreamSynchronize:3")],
    ));
    assert_eq!(v["calls"]["cuStreamSynchronize"]["codes"]["999"], 3, "{v}");
    assert_eq!(v["calls"]["cuStreamSynchronize"]["codes"]["0"], 7, "{v}");
}

fn check_alloc_free(mix: &str, seed: &str, env: &[(&str, &str)]) -> serde_json::Value {
    let v = json(&run_sim(
        &[
            "alloc-free",
            "--ops",
            "400",
            "--seed",
            seed,
            "--max-size",
            "8m",
            "--api-mix",
            mix,
        ],
        env,
    ));
    let live = v["live_bytes"].as_u64().unwrap();
    assert_eq!(v["mem_info"]["result"], 0, "{v}");
    assert_eq!(
        v["mem_info"]["used"].as_u64().unwrap(),
        live,
        "live bytes disagree with cuMemGetInfo: {v}"
    );
    assert!(live > 0, "{v}");
    v
}

#[test]
fn alloc_free_live_bytes_match_mem_get_info() {
    for (mix, seed) in [("ptr", "1"), ("handle", "2"), ("all", "3")] {
        let v = check_alloc_free(mix, seed, &[]);
        assert_eq!(v["failed_allocations"], 0, "{v}");
        if mix != "ptr" {
            assert!(
                stat(&v, "cuMemCreate", "calls") > 0 && stat(&v, "cuMemRelease", "calls") > 0,
                "{v}"
            );
        }
        if mix != "handle" {
            for api in [
                "cuMemAlloc_v2",
                "cuMemAllocPitch_v2",
                "cuMemAllocAsync",
                "cuMemAllocFromPoolAsync_ptsz",
            ] {
                assert!(stat(&v, api, "calls") > 0, "{api}: {v}");
            }
        }
    }
    // The same seed gives the same sequence.
    let a = check_alloc_free("all", "9", &[]);
    let b = check_alloc_free("all", "9", &[]);
    assert_eq!(a["live_bytes"], b["live_bytes"]);
    assert_eq!(a["calls"], b["calls"]);
}

#[test]
fn alloc_free_under_a_small_capacity() {
    let v = check_alloc_free("all", "5", &[("SIMCUDA_CAPACITY", "48m")]);
    let failed = v["failed_allocations"].as_u64().unwrap();
    assert!(failed > 0, "expected out-of-memory failures: {v}");
    let oom: u64 = v["calls"]
        .as_object()
        .unwrap()
        .values()
        .map(|s| s["codes"].get("2").and_then(|c| c.as_u64()).unwrap_or(0))
        .sum();
    assert_eq!(
        oom, failed,
        "every failed allocation is an out-of-memory error: {v}"
    );
    assert!(v["mem_info"]["used"].as_u64().unwrap() <= 48 << 20);
}

#[test]
fn delay_makes_calls_take_at_least_that_long() {
    let v = json(&run_sim(
        &["latency", "--api", "cuMemFree_v2", "--calls", "50"],
        &[("SIMCUDA_DELAY_US", "200")],
    ));
    assert!(v["min_ns"].as_u64().unwrap() >= 200_000, "{v}");
    // Short delays are busy-waits: accurate.
    let v = json(&run_sim(
        &["latency", "--api", "cuCtxSynchronize", "--calls", "200"],
        &[("SIMCUDA_DELAY_US", "sync=20")],
    ));
    assert!(v["min_ns"].as_u64().unwrap() >= 20_000, "{v}");
    assert!(v["p50_ns"].as_u64().unwrap() < 1_000_000, "{v}");
    // A rule for one symbol leaves others alone.
    let v = json(&run_sim(
        &["latency", "--api", "cuMemFree_v2", "--calls", "50"],
        &[("SIMCUDA_DELAY_US", "cuMemAlloc_v2=5000")],
    ));
    assert!(v["p50_ns"].as_u64().unwrap() < 1_000_000, "{v}");
}

#[test]
fn launches_keep_the_device_busy_until_synchronised() {
    // 20 launches of 5 ms each return at once; the synchronisation waits for the simulated work.
    let v = json(&run_sim(
        &["launches", "--count", "20"],
        &[("SIMCUDA_LAUNCH_US", "5000")],
    ));
    assert_eq!(v["errors"], 0, "{v}");
    let launch_ns = v["launch_ns"].as_u64().unwrap();
    let sync_ns = v["sync_ns"].as_u64().unwrap();
    assert!(
        sync_ns >= 95_000_000,
        "synchronisation returned after {sync_ns} ns: {v}"
    );
    assert!(launch_ns < sync_ns, "{v}");
    // Without launch time there is nothing to wait for.
    let v = json(&run_sim(&["launches", "--count", "20"], &[]));
    assert!(v["sync_ns"].as_u64().unwrap() < 5_000_000, "{v}");
}

fn proc_address(args: &[&str]) -> serde_json::Value {
    let mut a = vec!["proc-address"];
    a.extend_from_slice(args);
    json(&run_sim(&a, &[]))
}

#[test]
fn get_proc_address_resolves_like_the_driver() {
    let v = proc_address(&["--symbol", "cuMemAlloc"]);
    assert_eq!(v["result"], 0, "{v}");
    assert_eq!(v["resolved"], "cuMemAlloc_v2", "{v}");
    assert_eq!(v["address"], v["exports"]["cuMemAlloc_v2"]);
    assert_eq!(v["status"], 0);
    let v = proc_address(&["--symbol", "cuMemAlloc", "--v1"]);
    assert_eq!(v["resolved"], "cuMemAlloc_v2", "{v}");
    let v = proc_address(&["--symbol", "cuLaunchKernel", "--flags", "2"]);
    assert_eq!(v["resolved"], "cuLaunchKernel_ptsz", "{v}");
    let v = proc_address(&["--symbol", "cuLaunchKernel", "--flags", "1"]);
    assert_eq!(v["resolved"], "cuLaunchKernel", "{v}");
    let v = proc_address(&["--symbol", "cuMemcpyHtoD", "--flags", "2"]);
    assert_eq!(v["resolved"], "cuMemcpyHtoD_v2_ptds", "{v}");
    let v = proc_address(&["--symbol", "cuMemAllocAsync", "--flags", "2"]);
    assert_eq!(v["resolved"], "cuMemAllocAsync_ptsz", "{v}");
    let v = proc_address(&["--symbol", "cuMemAlloc", "--cuda-version", "3000"]);
    assert_eq!(v["result"], 500, "{v}");
    assert_eq!(v["address"], 0);
    let v = proc_address(&["--symbol", "cuNoSuchFunction"]);
    assert_eq!(v["result"], 500, "{v}");
    assert_eq!(v["status"], 1, "{v}");
}

#[test]
fn every_traced_api_is_exported_at_its_own_address() {
    let data = std::fs::read(sim_build()).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let mut by_name = HashMap::new();
    for s in file.dynamic_symbols() {
        if s.is_definition() && s.kind() == object::SymbolKind::Text {
            by_name.insert(s.name().unwrap().to_string(), s.address());
        }
    }
    for a in APIS.iter().filter(|a| !a.kind.is_nccl()) {
        assert!(by_name.contains_key(a.name), "{} is not exported", a.name);
    }
    for extra in [
        "cuDriverGetVersion",
        "cuDeviceGetAttribute",
        "cuCtxCreate_v4",
        "cuGetProcAddress",
        "cuGetProcAddress_v2",
        "cuGetExportTable",
        "cuMemPoolTrimTo",
        "cuLibraryGetKernel",
        "cuGraphInstantiateWithFlags",
    ] {
        assert!(by_name.contains_key(extra), "{extra} is not exported");
    }
    let mut addrs: HashMap<u64, &str> = HashMap::new();
    for (n, a) in &by_name {
        if let Some(other) = addrs.insert(*a, n) {
            panic!("{n} and {other} share address {a:#x}");
        }
    }
    // The soname is the driver's: DT_SONAME (14) in .dynamic names a string in .dynstr.
    let section = |n: &str| file.section_by_name(n).and_then(|s| s.data().ok()).unwrap();
    let (dynamic, dynstr) = (section(".dynamic"), section(".dynstr"));
    let soname = dynamic
        .as_chunks::<16>()
        .0
        .iter()
        .map(|e| {
            (
                u64::from_le_bytes(e[..8].try_into().unwrap()),
                u64::from_le_bytes(e[8..].try_into().unwrap()),
            )
        })
        .find(|(tag, _)| *tag == 14)
        .map(|(_, off)| {
            let s = &dynstr[off as usize..];
            String::from_utf8_lossy(&s[..s.iter().position(|b| *b == 0).unwrap()]).into_owned()
        });
    assert_eq!(soname.as_deref(), Some("libcuda.so.1"));
}

#[test]
fn hold_keeps_memory_until_stdin_closes() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let mut child = Command::new(EXE)
        .arg("--lib")
        .arg(sim_lib())
        .args(["hold", "--bytes", "1g"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(first["pid"].as_u64(), Some(child.id() as u64), "{first}");
    assert_eq!(first["result"], 0, "{first}");
    assert_eq!(first["bytes"], 1u64 << 30);
    // Still running while stdin is open.
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(child.try_wait().unwrap().is_none());
    drop(child.stdin.take());
    let last: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(last["freed"], 0, "{last}");
    assert!(child.wait().unwrap().success());
}

#[test]
fn ready_and_wait_files_gate_the_first_call() {
    use std::process::{Command, Stdio};
    let dir = test_dir("gate");
    let (ready, go) = (dir.join("ready"), dir.join("go"));
    let child = Command::new(EXE)
        .arg("--lib")
        .arg(sim_lib())
        .arg("--ready-file")
        .arg(&ready)
        .arg("--wait-file")
        .arg(&go)
        .args(["counts", "--per-api", "2", "--apis", "cuCtxSynchronize"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while !ready.exists() {
        assert!(
            start.elapsed().as_secs() < 30,
            "the ready file never appeared"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    std::thread::sleep(std::time::Duration::from_millis(50));
    let mut child = child;
    assert!(
        child.try_wait().unwrap().is_none(),
        "cuda-exercise did not wait for the wait file"
    );
    std::fs::write(&go, b"").unwrap();
    let v = json(&child.wait_with_output().unwrap());
    assert_eq!(stat(&v, "cuCtxSynchronize", "calls"), 2);
}

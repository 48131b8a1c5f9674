//! Memory figures add up: from the moment a context exists (retained, as the runtime API does, or
//! created with any `cuCtxCreate` variant), its charge (`VGPU_CONTEXT_BYTES`) is held, so
//! `cuMemGetInfo` and NVML report as free exactly what can then be allocated (in 2 MiB
//! allocations until the first refusal). A limit smaller than one context's charge shows as free
//! 0, one warning in the limiter's log, and a flag in the process's slot of the region.

mod support;

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::Stdio,
    sync::OnceLock,
};

use region::reader::{RegionReader, SlotPhase};
use support::{cc, fake_nvml, fresh_region, paths, preloaded};

const MIB: u64 = 1 << 20;
/// The allocation size of the caller: what "equal within the granularity" allows.
const CHUNK: u64 = 2 * MIB;
const CONTEXT: u64 = 300 * MIB;

fn caller() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let libdir = format!("-L{}", paths().libdir.display());
        cc(
            "memory_figures.c",
            &format!("memory_figures-{}", std::process::id()),
            &[&libdir, "-lcuda", "-ldl"],
        )
    })
}

/// A number from the caller's JSON line.
fn field(json: &str, key: &str) -> i64 {
    let k = format!("\"{key}\":");
    let rest = &json[json.find(&k).unwrap_or_else(|| panic!("{key} in {json}")) + k.len()..];
    let end = rest.find([',', '}']).unwrap();
    rest[..end].trim_matches('"').parse().unwrap()
}

struct Figures {
    json: String,
    stderr: String,
    /// The process's slot while it was alive: context bytes held and refused on device 0.
    context_held: u64,
    context_refused: u64,
    /// What the slot holds on device 0 (what `top`, the detail view and the metrics show as the
    /// process's memory) and the container's reservation, once the caller freed its allocations.
    held: u64,
    reserved: u64,
}

fn run(how: &str, limit: &str) -> Figures {
    let region = fresh_region("figures");
    let mut child = preloaded(caller())
        .args([how, fake_nvml().to_str().unwrap()])
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", &region)
        .env("CUDA_DEVICE_MEMORY_LIMIT", limit)
        .env("VGPU_CONTEXT_BYTES", CONTEXT.to_string())
        .env("VGPU_REAL_LIBNVML", fake_nvml())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut json = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut json)
        .unwrap();
    let snap = RegionReader::open(&region).unwrap().snapshot().unwrap();
    let slot = snap
        .slots
        .iter()
        .find(|s| s.phase == SlotPhase::Live && s.pid == child.id())
        .unwrap_or_else(|| panic!("no live slot of the caller: {json}"));
    let (context_held, context_refused) = (slot.context_bytes[0], slot.context_refused[0]);
    let (held, reserved) = (slot.held[0], snap.devices[0].reserved);
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    let stderr = support::text(&out.stderr);
    assert!(
        out.status.success() && json.starts_with('{'),
        "{how}: {json}\n{stderr}"
    );
    Figures {
        json,
        stderr,
        context_held,
        context_refused,
        held,
        reserved,
    }
}

#[test]
fn free_after_a_context_appears_is_what_can_be_allocated() {
    for how in ["retain", "create_v2", "create_v3", "create_v4"] {
        let f = run(how, "1g");
        let j = &f.json;
        let free = field(j, "free") as u64;
        // The charge is held from the context's creation, before any allocation.
        assert_eq!(free, 1024 * MIB - CONTEXT, "{how}: {j}");
        assert_eq!(field(j, "total") as u64, 1024 * MIB, "{j}");
        let allocatable = field(j, "allocatable") as u64;
        assert!(
            allocatable <= free && free - allocatable < CHUNK,
            "{how}: free {free} but {allocatable} allocatable: {j}"
        );
        assert_eq!(field(j, "refusal"), 2, "CUDA_ERROR_OUT_OF_MEMORY: {j}");
        // NVML agrees: the context is used, the rest free.
        assert_eq!(field(j, "nvml_free") as u64, free, "{how}: {j}");
        assert_eq!(field(j, "nvml_used") as u64, CONTEXT, "{how}: {j}");
        // Freed again, the context stays charged (held until the process exits).
        assert_eq!(field(j, "free_after") as u64, free, "{how}: {j}");
        assert_eq!((f.context_held, f.context_refused), (CONTEXT, 0), "{how}");
        // The context counts in what the process and the container hold.
        assert_eq!((f.held, f.reserved), (CONTEXT, CONTEXT), "{how}");
        assert!(!f.stderr.contains("context's charge"), "{}", f.stderr);
    }
}

#[test]
fn a_limit_below_one_contexts_charge_is_free_0_a_warning_and_a_flag() {
    let f = run("retain", "256m");
    let j = &f.json;
    assert_eq!(field(j, "free"), 0, "{j}");
    assert_eq!(field(j, "allocatable"), 0, "{j}");
    assert_eq!(field(j, "refusal"), 2, "{j}");
    assert_eq!(field(j, "nvml_free"), 0, "{j}");
    // Said once (the context, cuMemGetInfo and the allocation were all refused it).
    let warning = "is smaller than one context's charge (300 MiB, VGPU_CONTEXT_BYTES)";
    assert_eq!(f.stderr.matches(warning).count(), 1, "{}", f.stderr);
    assert!(
        f.stderr.contains("the memory limit (256 MiB)"),
        "{}",
        f.stderr
    );
    assert_eq!((f.context_held, f.context_refused), (0, CONTEXT));
    assert_eq!((f.held, f.reserved), (0, 0));
}

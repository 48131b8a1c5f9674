//! Every interception path reaches the hooks: direct linking, `dlopen`+`dlsym` through libcuda's
//! handle, `cuGetProcAddress(_v2)` with versions and the per-thread-stream flag, and Python ctypes.
//! The simulated driver has 80 GiB and no limit, so "the limit is reported and enforced" proves
//! that the limiter's hook, not the driver, answered; `SIMCUDA_LOG=1` shows which driver variant a
//! hook forwarded to.

mod support;

use std::sync::OnceLock;

use support::{cc, expect_ok, paths, preloaded};

fn caller() -> &'static std::path::Path {
    static EXE: OnceLock<std::path::PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let libdir = format!("-L{}", paths().libdir.display());
        cc(
            "caller.c",
            "caller",
            &[&libdir, "-lcuda", "-ldl", "-lpthread"],
        )
    })
}

fn run_caller(mode: &str) -> (String, String) {
    let out = preloaded(caller())
        .arg(mode)
        .env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
        .env("SIMCUDA_LOG", "1")
        .output()
        .expect("run caller");
    expect_ok(out)
}

#[test]
fn direct_linking_reaches_the_hooks() {
    let (out, err) = run_caller("direct");
    assert!(
        out.contains("ok: direct: 2 GiB over a 1 GiB limit"),
        "{out}"
    );
    // The denied allocations never reached the driver; the granted ones did.
    assert_eq!(err.matches("simcuda: cuMemAlloc_v2 ").count(), 2, "{err}");
    // The per-thread-stream hook forwarded to the driver's _ptsz variant, not the legacy one.
    assert!(err.contains("simcuda: cuLaunchKernel_ptsz #1"), "{err}");
    assert!(!err.contains("simcuda: cuLaunchKernel #"), "{err}");
}

#[test]
fn dlsym_through_the_driver_handle_reaches_the_hooks() {
    let (out, _) = run_caller("dlsym");
    assert!(
        out.contains("ok: dlsym: RTLD_NEXT keeps the caller's identity"),
        "{out}"
    );
    assert!(
        out.contains("ok: dlsym: after the free 600 MiB fits again"),
        "{out}"
    );
}

#[test]
fn cu_get_proc_address_hands_out_the_hook_of_the_same_variant() {
    let (out, err) = run_caller("procaddress");
    assert!(out.contains("ok: procaddress: cuLaunchKernel (version 12000, flags 2) -> the limiter's cuLaunchKernel_ptsz"), "{out}");
    assert!(err.contains("simcuda: cuLaunchKernel_ptsz #1"), "{err}");
    assert!(!err.contains("simcuda: cuLaunchKernel #"), "{err}");
}

#[test]
fn threads_racing_for_memory_never_pass_the_limit() {
    let (out, _) = run_caller("race");
    assert!(
        out.contains("ok: race: 16 threads got exactly the limit (16 blocks"),
        "{out}"
    );
}

#[test]
fn python_ctypes_reaches_the_hooks() {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/callers/ctypes_caller.py"
    );
    let out = preloaded("python3")
        .arg(script)
        .env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
        .output()
        .expect("run python3");
    let (out, err) = expect_ok(out);
    assert!(out.contains("ok: ctypes"), "{out}\n{err}");
}

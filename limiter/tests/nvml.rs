//! NVML's memory information under the limit, against a stand-in libnvidia-ml (compiled here, two
//! devices of 80 GiB) and, for "nothing crashes without a GPU", the real Debian library when it is
//! installed (`/opt/vgpu-agent/test-driver/`, or `VGPU_TEST_LIBNVML`).

mod support;

use std::{path::PathBuf, sync::OnceLock};

use support::{cc, expect_ok, fake_nvml, paths, preloaded};

fn caller() -> &'static std::path::Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let libdir = format!("-L{}", paths().libdir.display());
        cc("nvml_caller.c", "nvml_caller", &[&libdir, "-lcuda", "-ldl"])
    })
}

fn run(mode: &str, nvml: &std::path::Path) -> String {
    let out = preloaded(caller())
        .args([mode, nvml.to_str().unwrap()])
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
        .env("CUDA_DEVICE_MEMORY_LIMIT_1", "2g")
        .env("SIMCUDA_DEVICES", "2")
        .env("VGPU_REAL_LIBNVML", nvml)
        .output()
        .unwrap();
    expect_ok(out).0
}

#[test]
fn nvml_reports_the_limit_and_the_containers_usage_by_uuid() {
    let out = run("mapped", fake_nvml());
    assert!(
        out.contains("ok: NVML device 1 is CUDA device 0 by UUID"),
        "{out}"
    );
    assert!(out.contains("ok: v2 likewise"), "{out}");
}

#[test]
fn before_cuinit_the_nvml_index_is_the_cuda_ordinal() {
    let out = run("before", fake_nvml());
    assert!(
        out.contains("ok: before cuInit: NVML index 0 = CUDA 0"),
        "{out}"
    );
}

#[test]
fn real_nvml_without_a_gpu_does_not_crash() {
    let real = std::env::var_os("VGPU_TEST_LIBNVML")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/opt/vgpu-agent/test-driver/libnvidia-ml.so.1"));
    if !real.exists() {
        eprintln!("note: {} missing; skipped", real.display());
        return;
    }
    let out = run("real", &real);
    assert!(out.contains("ok: real NVML without a GPU"), "{out}");
}

#[test]
fn the_process_list_shows_the_containers_processes_with_their_charges() {
    let out = run("mapped", fake_nvml());
    for line in [
        "ok: v1 with no room: INSUFFICIENT_SIZE and 2 needed",
        "ok: v1 lists this process (64 MiB) and the child (32 MiB), no host pids",
        "ok: v2 lists the two container processes",
        "ok: v3 lists the two container processes",
        "ok: a limited device the container does not use lists nobody",
        "ok: after the child exited only this process is listed",
    ] {
        assert!(out.contains(line), "missing {line:?} in\n{out}");
    }
}

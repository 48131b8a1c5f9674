//! GPU time measured inside the process: workloads under the limiter launch kernels of known
//! simulated duration (`SIMCUDA_KERNEL_US`), and `stat --json` shows each process's GPU-busy
//! share from the limiter (`source: limiter`) and its kernels by name, matching what the
//! workload launched.

mod support;

use std::time::Duration;

use serde_json::Value;
use support::*;

const ATTACH_TIMEOUT: Duration = Duration::from_secs(20);

/// The limiter's busy entry of a row on device 0.
fn limiter_busy(row: &Value) -> &Value {
    row["gpu_busy"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["source"] == "limiter" && b["device"] == 0)
        .unwrap_or_else(|| panic!("no limiter GPU busy figure in {row:#}"))
}

fn kernel<'a>(row: &'a Value, name: &str) -> &'a Value {
    row["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["name"] == name)
        .unwrap_or_else(|| panic!("no kernel {name} in {row:#}"))
}

fn close(got: f64, want: f64, rel: f64, what: &str) {
    assert!(
        (got - want).abs() <= want * rel,
        "{what}: {got} vs {want} (within {rel})"
    );
}

#[test]
fn stat_shows_the_limiters_gpu_time_and_top_kernels_of_known_durations() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    let regions = dir.path().join("regions");
    std::fs::create_dir_all(&regions).unwrap();
    let start = |name: &str, sample: Option<&str>, kernels_us: &str, kernels: &str| {
        let wdir = dir.path().join(name);
        std::fs::create_dir_all(&wdir).unwrap();
        let mut cmd = exercise(&lib);
        cmd.env("LD_PRELOAD", limiter_lib())
            .env("VGPU_REAL_LIBCUDA", &lib)
            .env(
                "CUDA_DEVICE_MEMORY_SHARED_CACHE",
                regions.join(format!("{name}.cache")),
            )
            .env("SIMCUDA_KERNEL_US", kernels_us);
        if let Some(s) = sample {
            cmd.env("VGPU_GPU_TIME_SAMPLE", s);
        }
        cmd.args([
            "--init-first",
            "--linger-ms",
            "5000",
            "paced",
            "--seconds",
            "2",
            "--sync-every",
            "1",
            "--kernels",
            kernels,
        ]);
        Workload::start(cmd, &wdir)
    };
    // Every launch timed: exact figures. Kernels of milliseconds: an event pair on an idle
    // stream also covers the few microseconds between the first event and the kernel's
    // submission (as on a GPU).
    let every = start("every", Some("1"), "big=3000,small=1000", "big,small,small");
    // The default, adaptive sampling: estimates.
    let sampled = start("sampled", None, "k=500", "k");
    let mut stat = Stat::start(&["--no-calibrate", "--region-dir", regions.to_str().unwrap()]);
    stat.wait_for(&attached(&lib), ATTACH_TIMEOUT);
    stat.wait_for("tracing for", ATTACH_TIMEOUT);
    let (epid, spid) = (every.pid(), sampled.pid());
    every.go();
    sampled.go();
    // Both are done launching and linger with their slots.
    std::thread::sleep(Duration::from_millis(3000));
    let report = stat.finish();
    let (emade, smade) = (every.finish(), sampled.finish());

    // Every launch: the kernels' launches are the workload's (the last pair is still in flight
    // when the thread stops launching), each taking its simulated time.
    let row = process(&report, epid);
    let (big, small) = (kernel(row, "big"), kernel(row, "small"));
    for (k, made, us) in [
        (big, &emade["kernels"]["big"], 3000.0),
        (small, &emade["kernels"]["small"], 1000.0),
    ] {
        let made = made.as_u64().unwrap();
        let launches = k["launches"].as_u64().unwrap();
        assert!(made - launches <= 1, "{launches} of {made} launches timed");
        assert_eq!(k["samples"], k["launches"], "every launch is a sample");
        assert_eq!(k["source"], "limiter");
        close(
            k["gpu_seconds"].as_f64().unwrap() / launches as f64,
            us * 1e-6,
            0.03,
            "GPU time per launch",
        );
    }
    close(big["share"].as_f64().unwrap(), 0.6, 0.03, "big's share");
    let busy = limiter_busy(row);
    let kernel_seconds =
        big["gpu_seconds"].as_f64().unwrap() + small["gpu_seconds"].as_f64().unwrap();
    close(
        busy["busy_seconds"].as_f64().unwrap(),
        kernel_seconds,
        0.001,
        "busy = kernels",
    );
    // Launching with a synchronisation after each: the GPU is busy most of the time, never more.
    let ratio = busy["busy_ratio"].as_f64().unwrap();
    assert!(ratio > 0.2 && ratio <= 1.0, "busy ratio {ratio}");

    // Adaptive: about 200 samples a second, each standing for the launches since the previous.
    let row = process(&report, spid);
    let k = kernel(row, "k");
    let made = smade["launches"].as_u64().unwrap() as f64;
    let samples = k["samples"].as_u64().unwrap();
    assert!((100..2000).contains(&samples), "{samples} samples in 2 s");
    assert!(
        (samples as f64) < made / 4.0,
        "{samples} samples of {made} launches"
    );
    close(
        k["launches"].as_f64().unwrap(),
        made,
        0.1,
        "launches stood for",
    );
    close(
        k["gpu_seconds"].as_f64().unwrap(),
        made * 500e-6,
        0.1,
        "estimated GPU time",
    );
    assert_eq!(k["share"], 1.0);
    let busy = limiter_busy(row);
    assert_eq!(busy["samples"].as_u64().unwrap(), samples);

    // Containers sum their processes (both workloads run in this test's cgroup).
    let c = report["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["pids"].as_array().unwrap().iter().any(|p| p == epid))
        .expect("the workloads' container");
    let names: Vec<&str> = c["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["name"].as_str().unwrap())
        .collect();
    for n in ["big", "small", "k"] {
        assert!(names.contains(&n), "{names:?}");
    }
}

//! What the `vgpu-agent attribute` tests share: the workloads they record, running the command
//! beside them, finding an API in a process's row of its report, the consistency every report
//! must have, and (for the accuracy benchmark, `attribute_accuracy.rs`) printing a figure against
//! its truth. The CI tests assert only what is deterministic on a loaded machine: counts, where
//! each figure lands, that the figures add up, and bounds that nesting makes certain (a call's
//! time as the simulated driver measured it inside the call is within what the probes measured
//! around it, which is within what the application measured around that).

use std::{
    path::Path,
    process::{Command, Stdio},
};

use serde_json::Value;

use super::*;

/// How long the agent may take to load its probes, calibrate them and attach to a library, or a
/// workload to load: a bound on a hang, not a timing (loading and verifying the probes took over
/// 20 s under a load average of 13 on the 2-vCPU VM).
pub const STARTUP: std::time::Duration = std::time::Duration::from_secs(120);

/// A process's row of one API in the report.
pub fn api_of<'a>(process: &'a Value, api: &str) -> Option<&'a Value> {
    process["apis"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["api"] == api)
}

/// A number in the report.
pub fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

const COMPONENTS: [&str; 7] = [
    "driver",
    "limiter_hook",
    "throttled",
    "sync_wait",
    "copy_wait",
    "nccl_host",
    "probe_cost",
];

/// What every report must satisfy: each process's time inside the API is the sum of its
/// components, each container's components the sum of its processes', the totals the sum of the
/// containers'; no component is negative; every estimate's uncertainty is marked exactly when it
/// is over 10% or unknown; and the files written say what was printed.
pub fn assert_consistent(report: &Value) {
    assert_eq!(report["schema"], "vgpu-agent.attribute/v1");
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 + 1e-9 * a.abs().max(b.abs());
    let sum = |c: &Value| COMPONENTS.iter().map(|n| num(&c[n])).sum::<f64>();
    let processes = report["processes"].as_array().unwrap();
    for p in processes {
        for n in COMPONENTS {
            assert!(num(&p["components"][n]) >= 0.0, "{n} in {p:#}");
        }
        assert!(
            close(num(&p["in_api_seconds"]), sum(&p["components"])),
            "{p:#}"
        );
        for a in p["apis"].as_array().unwrap() {
            for key in ["calls_uncertainty", "seconds_uncertainty"] {
                assert_marked_right(&a[key]);
            }
        }
        for u in p["uncertainty"]
            .as_object()
            .into_iter()
            .flat_map(|m| m.values())
        {
            assert_marked_right(u);
        }
    }
    let mut totals = [0.0; 7];
    for c in report["containers"].as_array().unwrap() {
        let mine: Vec<&Value> = processes
            .iter()
            .filter(|p| p["container"] == c["key"])
            .collect();
        assert_eq!(mine.len(), c["pids"].as_array().unwrap().len());
        for (i, n) in COMPONENTS.iter().enumerate() {
            let of_processes: f64 = mine.iter().map(|p| num(&p["components"][n])).sum();
            assert!(close(num(&c["components"][n]), of_processes), "{n}: {c:#}");
            totals[i] += num(&c["components"][n]);
        }
    }
    for (i, n) in COMPONENTS.iter().enumerate() {
        assert!(close(num(&report["totals"][n]), totals[i]), "total {n}");
    }
}

/// An uncertainty (when present) is marked exactly when its relative standard error is over
/// 10% or unknown.
fn assert_marked_right(u: &Value) {
    if u.is_null() {
        return;
    }
    let over = u["relative"].as_f64().is_none_or(|r| r > 0.10);
    assert_eq!(u["marked"].as_bool(), Some(over), "{u}");
}

/// The report's files in `dir` say what was printed.
pub fn assert_written(report: &Value, dir: &Path, api: &str) {
    let written: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    assert_eq!(written["processes"], report["processes"]);
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(html.contains("<svg") && html.contains(api));
}

/// Prints a figure against its truth, with the uncertainty the report gave it; returns how far
/// off it is (a share of the truth).
pub fn accuracy(what: &str, got: f64, truth: f64, uncertainty: Option<&Value>) -> f64 {
    let off = (got - truth).abs() / truth;
    let said = uncertainty
        .filter(|u| !u.is_null())
        .map(|u| match u["relative"].as_f64() {
            Some(r) => format!(", reported uncertainty ±{:.1}%", r * 100.0),
            None => ", reported uncertainty unknown".to_owned(),
        })
        .unwrap_or_default();
    eprintln!(
        "ACCURACY {what}: attributed {got:.6}, truth {truth:.6} ({:.1}% off{said})",
        off * 100.0
    );
    off
}

pub fn attribute_cmd(extra: &[&str]) -> Command {
    let mut agent = Command::new(agent_bin());
    agent
        .args([
            "attribute",
            "--json",
            "--no-daemon",
            "--no-nvml",
            "--duration",
            "120s",
            "--poll-interval",
            "100ms",
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    agent
}

/// `vgpu-agent attribute AGENT_ARGS`, once it has attached to `lib` and is recording.
pub fn start_recording(lib: &Path, agent_args: &[&str]) -> Stat {
    let mut stat = Stat::from_command(attribute_cmd(agent_args));
    stat.wait_for(&attached(lib), STARTUP);
    stat.wait_for("recording for", STARTUP);
    stat
}

/// What a recording made of its workloads: each one's pid and its own JSON output (in the order
/// they were given), and the report.
pub struct Recording {
    pub pids: Vec<u32>,
    pub made: Vec<Value>,
    pub report: Value,
}

/// Records `vgpu-agent attribute AGENT_ARGS` over workloads already loaded (and waiting), each
/// let go and run to its end in turn.
pub fn record(workloads: Vec<Workload>, lib: &Path, agent_args: &[&str]) -> Recording {
    let stat = start_recording(lib, agent_args);
    let pids: Vec<u32> = workloads.iter().map(|w| w.pid()).collect();
    let made: Vec<Value> = workloads
        .into_iter()
        .map(|w| {
            w.go();
            w.finish()
        })
        .collect();
    let report = stat.finish();
    Recording { pids, made, report }
}

/// What a recording made of one workload: its pid, its own JSON output, and the report.
pub struct RecordedWorkload {
    pub pid: u32,
    pub made: Value,
    pub report: Value,
}

/// Starts the workload `cmd` in `dir` and records it (see [`record`]).
pub fn record_one(cmd: Command, dir: &Path, lib: &Path, agent_args: &[&str]) -> RecordedWorkload {
    let workload = Workload::start(cmd, dir);
    let Recording {
        pids,
        mut made,
        report,
    } = record(vec![workload], lib, agent_args);
    RecordedWorkload {
        pid: pids[0],
        made: made.remove(0),
        report,
    }
}

/// Three workloads on `lib`, loaded and waiting, each lingering 300 ms at its end: `calls`
/// `cuMemAlloc_v2` delayed 45 us in the driver, `calls` `cuMemcpyHtoD_v2` delayed 30 us, and 50
/// launches of 1 ms of device work that one `cuCtxSynchronize` waits for.
pub fn delayed_calls_copies_and_a_sync(lib: &Path, dir: &Path, calls: u64) -> Vec<Workload> {
    let calls = calls.to_string();
    let latency = |api: &str, delay: &str| {
        let mut cmd = exercise(lib);
        cmd.env("SIMCUDA_DELAY_US", format!("{api}={delay}")).args([
            "--linger-ms",
            "300",
            "latency",
            "--api",
            api,
            "--calls",
            &calls,
            "--init",
        ]);
        cmd
    };
    let mut sync = exercise(lib);
    sync.env("SIMCUDA_LAUNCH_US", "1000")
        .args(["--linger-ms", "300", "launches", "--count", "50"]);
    [
        latency("cuMemAlloc_v2", "45"),
        latency("cuMemcpyHtoD_v2", "30"),
        sync,
    ]
    .into_iter()
    .enumerate()
    .map(|(i, cmd)| {
        let d = dir.join(format!("w{i}"));
        std::fs::create_dir_all(&d).unwrap();
        Workload::start(cmd, &d)
    })
    .collect()
}

/// `launches` launches on `lib` of 3 us of host time each, with a `cuCtxSynchronize` after every
/// `sync_every` (0: none), lingering 300 ms at its end.
pub fn delayed_launch_loop(lib: &Path, launches: u64, sync_every: u64) -> Command {
    let mut cmd = exercise(lib);
    cmd.env("SIMCUDA_DELAY_US", "cuLaunchKernel=3").args([
        "--linger-ms",
        "300",
        "launch-loop",
        "--count",
        &launches.to_string(),
        "--sync-every",
        &sync_every.to_string(),
    ]);
    cmd
}

/// The agent's arguments for sampling probes under a 2% budget in 10 ms windows.
pub const SAMPLED_2_PERCENT: [&str; 4] = ["--probe-budget", "2%", "--sample-window", "10ms"];

/// Records `launches` launches on `lib` under the limiter (an 8 GiB memory limit, `env` added to
/// the workload's environment), its region in `dir/regions` and the agent told of that directory
/// (`--region-dir`, then `agent_args`). The loop lingers 1 s at its end: past the agent's next
/// poll, since the limiter retires its region slot at exit.
pub fn record_limited_launches(
    dir: &Path,
    lib: &Path,
    launches: u64,
    env: &[(&str, &str)],
    agent_args: &[&str],
) -> RecordedWorkload {
    record_limited_loop(dir, lib, launches, env, &[], agent_args)
}

/// [`record_limited_launches`] with `loop_args` added to the workload's `launch-loop`.
fn record_limited_loop(
    dir: &Path,
    lib: &Path,
    launches: u64,
    env: &[(&str, &str)],
    loop_args: &[&str],
    agent_args: &[&str],
) -> RecordedWorkload {
    let regions = dir.join("regions");
    std::fs::create_dir_all(&regions).unwrap();
    let mut cmd = exercise(lib);
    cmd.env("LD_PRELOAD", limiter_lib())
        .env("VGPU_REAL_LIBCUDA", lib)
        .env("CUDA_DEVICE_MEMORY_LIMIT", "8g")
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", regions.join("ctr.cache"))
        .envs(env.iter().copied())
        .args([
            "--linger-ms",
            "1000",
            "launch-loop",
            "--count",
            &launches.to_string(),
        ])
        .args(loop_args);
    let mut all_args = vec!["--region-dir", regions.to_str().unwrap()];
    all_args.extend_from_slice(agent_args);
    record_one(cmd, dir, lib, &all_args)
}

/// Records `launches` launches of 3 us of host time each under the limiter (see
/// [`record_limited_launches`]), with the launch probes sampled under a 2% budget in 10 ms
/// windows.
pub fn record_delayed_launches_under_the_limiter(
    dir: &Path,
    lib: &Path,
    launches: u64,
) -> RecordedWorkload {
    record_limited_launches(
        dir,
        lib,
        launches,
        &[("SIMCUDA_DELAY_US", "cuLaunchKernel=3")],
        &SAMPLED_2_PERCENT,
    )
}

/// As [`record_delayed_launches_under_the_limiter`] with sampling windows of `window`, and every
/// other launch made straight to the simulated driver's implementation, past the limiter and the
/// probes (`launch-loop --direct-every 2`): their time, measured beside the hooked launches, is
/// the truth for the limiter's timing.
pub fn record_delayed_launches_beside_direct_ones(
    dir: &Path,
    lib: &Path,
    launches: u64,
    window: &str,
) -> RecordedWorkload {
    record_limited_loop(
        dir,
        lib,
        launches,
        &[("SIMCUDA_DELAY_US", "cuLaunchKernel=3")],
        &["--direct-every", "2"],
        &["--probe-budget", "2%", "--sample-window", window],
    )
}

/// The median of `v` (odd lengths; the upper middle otherwise).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

//! `cargo xtask bench <name>`: benchmarks that live in the repository (docs/benchmarks.md).

use anyhow::{Result, bail};

const BENCHES: &str = "region, agent, limiter, pairs-cold, startup, export, attribute, sm-shares";

pub fn run(args: &[String]) -> Result<()> {
    match args.first().map(String::as_str) {
        Some("region") => region(),
        Some("agent") => crate::bench_agent::run(),
        Some("limiter") => crate::bench_limiter::run(&args[1..]),
        Some("pairs-cold") => crate::bench_cold::run(&args[1..]),
        Some("startup") => crate::bench_startup::run(&args[1..]),
        Some("export") => crate::bench_export::run(),
        Some("attribute") => attribute(),
        Some("sm-shares") => sm_shares(),
        Some(other) => bail!("unknown benchmark {other:?}; available: {BENCHES}"),
        None => bail!("which benchmark? available: {BENCHES}"),
    }
}

fn region() -> Result<()> {
    crate::util::step("region: recording one call, reserve+release (criterion)");
    crate::util::run(&mut crate::util::cmd(
        "cargo",
        ["bench", "-p", "region", "--bench", "record"],
    ))?;
    crate::util::step("region: 64 processes starting on one region");
    crate::util::run(&mut crate::util::cmd(
        "cargo",
        [
            "run",
            "--release",
            "-p",
            "region",
            "--example",
            "startup_bench",
            "--",
            "--processes",
            "64",
        ],
    ))
}

/// How close `vgpu-agent attribute` comes to known truths on this machine (root): the ignored
/// tests of `agent/tests/attribute_accuracy.rs`, one at a time, their `ACCURACY` lines shown.
fn attribute() -> Result<()> {
    crate::util::step("attribute: accuracy against known truths (simulated driver, real probes)");
    crate::util::run(&mut crate::util::cmd(
        "cargo",
        [
            "test",
            "-p",
            "vgpu-agent",
            "--test",
            "attribute_accuracy",
            "--",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ],
    ))
}

/// How close SM shares come to their limits on this machine's clock, on the simulated driver: one
/// process per limit and launch path, threads, the NVML correction, processes of one container
/// and containers side by side. The ignored `share_*` tests of `limiter/tests/sm.rs` and
/// `sm_container.rs`, each run once: every figure is printed with its verdict (`within` or
/// `OUTSIDE` its tolerance), and the benchmark fails if any is outside.
fn sm_shares() -> Result<()> {
    for test in ["sm", "sm_container"] {
        crate::util::step(&format!(
            "sm-shares: limiter/tests/{test}.rs, the shares on this machine's clock"
        ));
        crate::util::run(&mut crate::util::cmd(
            "cargo",
            [
                "test",
                "-p",
                "limiter",
                "--test",
                test,
                "--",
                "--ignored",
                "--nocapture",
                "--test-threads",
                "1",
                "share_",
            ],
        ))?;
    }
    Ok(())
}

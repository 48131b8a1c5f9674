//! `cargo xtask bench <name>`: benchmarks that live in the repository (docs/benchmarks.md).

use anyhow::{Result, bail};

const BENCHES: &str = "region, agent, limiter, pairs-cold, startup, export";

pub fn run(args: &[String]) -> Result<()> {
    match args.first().map(String::as_str) {
        Some("region") => region(),
        Some("agent") => crate::bench_agent::run(),
        Some("limiter") => crate::bench_limiter::run(),
        Some("pairs-cold") => crate::bench_cold::run(&args[1..]),
        Some("startup") => crate::bench_startup::run(&args[1..]),
        Some("export") => crate::bench_export::run(),
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

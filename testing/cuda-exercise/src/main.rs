//! cuda-exercise: a workload that calls a CUDA driver library (the real libcuda or the simulated
//! one in `testing/sim-cuda`) a known number of times and prints what it did as JSON, so tests
//! can compare what vgpu-agent and the limiter report with the truth. See `testing/README.md`.

mod bench;
mod calls;
mod cli;
mod devices;
mod driver;
mod lookup;
mod memory;
mod nccl;
mod nccl_rank;
mod timing;

use agent_common::api::ApiId;
use clap::Parser;
use cli::{Cli, Command};
use driver::{CUresult, Driver};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Calls of one entry point.
#[derive(Default, Serialize)]
struct Stat {
    calls: u64,
    /// Calls whose result was not CUDA_SUCCESS.
    errors: u64,
    /// Sum of the size argument (APIs whose spec in agent_common::api has a size_arg).
    bytes: u64,
    /// Calls per result code.
    codes: BTreeMap<String, u64>,
}

#[derive(Default)]
struct Recorder {
    calls: BTreeMap<String, Stat>,
    missing: BTreeSet<String>,
}

impl Recorder {
    /// Records one call of `name` that passed `size` as its size argument (`None`: not exported).
    fn record(&mut self, name: &str, r: Option<CUresult>, size: u64) {
        let sized = ApiId::from_name(name)
            .and_then(|id| id.spec())
            .is_some_and(|sp| sp.size_arg.is_some());
        self.record_bytes(name, r, if sized { size } else { 0 });
    }

    /// Records one call of `name` that moved `bytes` (`None`: not exported).
    fn record_bytes(&mut self, name: &str, r: Option<CUresult>, bytes: u64) {
        let Some(rc) = r else {
            self.missing.insert(name.to_string());
            return;
        };
        let s = self.calls.entry(name.to_string()).or_default();
        s.calls += 1;
        s.errors += u64::from(rc != 0);
        s.bytes += bytes;
        *s.codes.entry(rc.to_string()).or_default() += 1;
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let linger = Duration::from_millis(cli.linger_ms);
    let result = run(cli);
    std::thread::sleep(linger);
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("cuda-exercise: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode, String> {
    let mut drv = Driver::open(&cli.lib)?;
    if cli.init_first {
        drv.init();
    }
    if let Some(p) = &cli.ready_file {
        std::fs::write(p, std::process::id().to_string())
            .map_err(|e| format!("{}: {e}", p.display()))?;
    }
    if let Some(p) = &cli.wait_file {
        wait_for_file(p, Duration::from_secs(60))?;
    }
    match cli.command {
        Command::Counts {
            per_api,
            apis,
            init,
            size,
            stream,
        } => calls::counts(&mut drv, per_api, apis, init, size as usize, stream),
        Command::AllocFree {
            ops,
            seed,
            max_size,
            api_mix,
        } => memory::alloc_free(&drv, ops, seed, max_size, api_mix),
        Command::Hold { bytes } => memory::hold(&drv, bytes as usize),
        Command::Fill { devices, chunk } => devices::fill(&drv, &devices, chunk),
        Command::Pressure {
            chunk,
            delay_ms,
            seconds,
        } => memory::pressure(&drv, chunk as usize, delay_ms, seconds),
        Command::Latency {
            api,
            calls,
            init,
            size,
        } => timing::latency(&drv, &api, calls, init, size as usize),
        Command::Launches { count } => timing::launches(&drv, count),
        Command::LaunchLoop {
            count,
            sync_every,
            direct_every,
        } => bench::launch_loop(&drv, count, sync_every, direct_every),
        Command::Paced {
            seconds,
            sync_every,
            held_ms,
            kernels,
        } => bench::paced(&drv, seconds, sync_every.max(1), held_ms, &kernels),
        Command::Pairs {
            count,
            size,
            barrier,
            outside,
        } => bench::pairs(&drv, count, size as usize, barrier.as_deref(), outside),
        Command::Steady {
            api,
            rate,
            seconds,
            size,
        } => timing::steady(&drv, &api, rate, seconds, size as usize),
        Command::Nccl {
            per_api,
            bad_datatype,
            nranks,
            use_comm,
        } => calls::nccl_counts(&drv, per_api, bad_datatype, nranks, use_comm),
        Command::NcclRank {
            nranks,
            rank,
            unique_id_file,
            all_reduce,
            count,
            datatype,
        } => nccl_rank::rank(
            &drv,
            &nccl_rank::RankArgs {
                nranks,
                rank,
                unique_id_file: &unique_id_file,
                all_reduce,
                count,
                datatype,
            },
        ),
        Command::ProcAddress {
            symbol,
            cuda_version,
            flags,
            v1,
        } => lookup::proc_address(&drv, &symbol, cuda_version, flags, v1),
    }
}

fn wait_for_file(p: &Path, limit: Duration) -> Result<(), String> {
    let start = Instant::now();
    while !p.exists() {
        if start.elapsed() > limit {
            return Err(format!("{} did not appear within {limit:?}", p.display()));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

fn print(v: serde_json::Value) {
    println!("{v}");
}

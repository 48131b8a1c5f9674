//! cuda-exercise: a workload that calls a CUDA driver library (the real libcuda or the simulated
//! one in `testing/sim-cuda`) a known number of times and prints what it did as JSON, so tests
//! can compare what vgpu-agent and the limiter report with the truth. See `testing/README.md`.
//!
//! # Layers
//!
//! Lowest first; a module imports modules of its own layer and of the layers below, and no
//! import cycle forms among modules (`cargo xtask layers` checks both).
//!
//! 1. base: `cli`, `driver`, `wait`. The command line, the loaded driver and the barrier files.
//! 2. records: `nccl`, `record`. What the calls returned, and the loaded NCCL.
//! 3. commands: `bench`, `calls`, `lookup`, `memory`, `nccl_rank`, `timing`, `devices`,
//!    `checkpoint`. The subcommands.

mod bench;
mod calls;
mod checkpoint;
mod cli;
mod devices;
mod driver;
mod lookup;
mod memory;
mod nccl;
mod nccl_rank;
mod record;
mod timing;
mod wait;

use clap::Parser;
use cli::{Cli, Command};
use driver::Driver;
use std::process::ExitCode;
use std::time::Duration;
use wait::wait_for_file;

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
        Command::Pattern { bytes } => checkpoint::pattern(&drv, bytes as usize),
        Command::VmmPattern { bytes, shareable } => {
            checkpoint::vmm_pattern(&drv, bytes as usize, shareable)
        }
        Command::Checkpoint {
            pid,
            op,
            timeout_ms,
        } => checkpoint::checkpoint(&drv, pid, op, timeout_ms),
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

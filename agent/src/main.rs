//! `vgpu-agent`: observability and enforcement for shared NVIDIA GPUs.

mod discovery;
mod host;
mod identity;
#[cfg_attr(
    not(test),
    expect(dead_code, reason = "wired by the collector (issue 5)")
)]
mod nvml;
mod probes;
mod stat;
mod trace;
mod units;

use std::{io::Write, path::PathBuf, process::ExitCode, time::Duration};

use clap::{Parser, Subcommand, ValueEnum};

use crate::{probes::ProbeError, trace::LaunchProbes};

#[derive(Parser)]
#[command(
    name = "vgpu-agent",
    version,
    about = "Observability and enforcement for shared NVIDIA GPUs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LaunchMode {
    Off,
    On,
    Sampled,
}

#[derive(Subcommand)]
enum Command {
    /// Trace CUDA driver calls for a while and print per-process and per-cgroup statistics.
    Stat {
        /// How long to trace (e.g. 10s, 500ms, 2m).
        #[arg(long, default_value = "10s", value_parser = units::parse_duration)]
        duration: Duration,
        /// Print JSON (schema in docs/stat-json.md) instead of a table.
        #[arg(long)]
        json: bool,
        /// Probe kernel launches too: `on`, `sampled` (in windows) or `off`. They cost about
        /// 1.7 us per launch while attached.
        #[arg(long, value_enum, num_args = 0..=1, default_value = "off", default_missing_value = "on")]
        probe_launches: LaunchMode,
        /// With `--probe-launches sampled`: how long each window lasts.
        #[arg(long, default_value = "1s", value_parser = units::parse_duration)]
        launch_window: Duration,
        /// With `--probe-launches sampled`: how often a window starts.
        #[arg(long, default_value = "10s", value_parser = units::parse_duration)]
        launch_period: Duration,
        /// Also probe this libcuda (repeatable); discovered libraries are always probed.
        #[arg(long = "libcuda", value_name = "PATH")]
        libcuda: Vec<PathBuf>,
        /// How often to look for new driver libraries in processes.
        #[arg(long, default_value = "500ms", value_parser = units::parse_duration)]
        poll_interval: Duration,
        /// Skip measuring the probe cost at start.
        #[arg(long)]
        no_calibrate: bool,
        /// Where the host's filesystem is (for the loader cache and driver directories), e.g.
        /// /host when the agent runs in a container with the host's root mounted there.
        #[arg(long, default_value = "/")]
        host_root: PathBuf,
    },
}

fn init_logging() {
    env_logger::Builder::from_env(env_logger::Env::default().filter_or("VGPU_LOG", "info"))
        .format(|buf, record| match record.level() {
            log::Level::Info => writeln!(buf, "vgpu-agent: {}", record.args()),
            log::Level::Warn => writeln!(buf, "vgpu-agent: warning: {}", record.args()),
            level => writeln!(
                buf,
                "vgpu-agent: {}: {}",
                level.as_str().to_lowercase(),
                record.args()
            ),
        })
        .init();
}

fn main() -> ExitCode {
    init_logging();
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vgpu-agent: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Stat {
            duration,
            json,
            probe_launches,
            launch_window,
            launch_period,
            libcuda,
            poll_interval,
            no_calibrate,
            host_root,
        } => {
            let launches = match probe_launches {
                LaunchMode::Off => LaunchProbes::Off,
                LaunchMode::On => LaunchProbes::On,
                LaunchMode::Sampled => {
                    anyhow::ensure!(
                        launch_window < launch_period,
                        "--launch-window ({launch_window:?}) must be shorter than --launch-period ({launch_period:?})"
                    );
                    LaunchProbes::Sampled {
                        window: launch_window,
                        period: launch_period,
                    }
                }
            };
            let opts = stat::StatOptions {
                duration,
                poll_interval,
                trace: trace::TraceOptions {
                    extra_libcuda: libcuda,
                    launches,
                    calibrate: !no_calibrate,
                    host: host::HostPaths::system().with_root(host_root),
                },
            };
            let report = match stat::run(opts) {
                Ok(r) => r,
                // The privilege message is the whole story; don't wrap it.
                Err(ProbeError::NotPrivileged(msg)) => anyhow::bail!("{msg}"),
                Err(e) => return Err(e.into()),
            };
            let mut out = std::io::stdout().lock();
            if json {
                serde_json::to_writer_pretty(&mut out, &report)?;
                writeln!(out)?;
            } else {
                write!(out, "{}", stat::render::table(&report))?;
            }
            Ok(())
        }
    }
}

//! `vgpu-agent`: observability and enforcement for shared NVIDIA GPUs.
//!
//! # Layers
//!
//! Lowest first. A top-level module imports modules of its own layer and of the layers below,
//! never one a `never` clause names, and no import cycle forms among modules (`cargo xtask
//! layers` checks both; it runs in `cargo test -p xtask`).
//!
//! 1. base: `sys`, `units`, `runtime`, `signals`, `pool`. Process plumbing with no knowledge of
//!    GPUs: `sys` is the one module that calls libc, unit parsing and formatting, the shared
//!    tokio runtime, the process-wide stop flag, the worker pool for reads that may block.
//! 2. model: `model`, `sanitize`. Plain data every other layer reports in (processes, devices,
//!    probe states and costs, GPU use), and the scrubbing of tenant-written strings in it. It
//!    reads no file and calls nothing.
//! 3. host: `host`, `identity`, `client`, `probe_options`. Facts about the host that commands may
//!    read too: its paths, process and container identity (/proc, cgroups, runtimes), the client
//!    side of the daemon's snapshot socket; and the probes' options, which commands fill in.
//! 4. probing: `discovery`, `nvml`, `probes`, `checkpoint`. The GPU-facing sources only the
//!    collector drives: the library scan, NVML, and the eBPF probes with their session; and the
//!    driver's checkpoint API, which `freeze` calls.
//! 5. collector: `collector`. Joins the sources into one model snapshot per tick.
//! 6. views: `export`; never `host`, `identity`, `client`, `discovery`, `nvml`, `probes`,
//!    `collector`. The exporters (Prometheus, OTLP): they read the model only.
//! 7. commands: `tui`, `stat`, `attribute`, `limit`, `cdi`, `freeze`, `freeze_pool`; never
//!    `discovery`, `nvml`, `probes`.
//!    What users run: they get snapshots from a collector or the daemon's socket and render
//!    them, or read and write limits and freeze marks; and the freeze pool the daemon serves,
//!    which reads what `freeze` reads. Never the probes, NVML (but through `checkpoint`'s
//!    measure) or the scan.
//! 8. top: `daemon`. The long-running daemon; the binary's entry point (this file) starts it or
//!    a command.

mod attribute;
mod cdi;
mod checkpoint;
mod client;
mod collector;
mod daemon;
mod discovery;
mod export;
mod freeze;
mod freeze_pool;
mod host;
mod identity;
mod limit;
mod model;
mod nvml;
mod pool;
mod probe_options;
mod probes;
mod runtime;
mod sanitize;
mod signals;
mod stat;
mod sys;
mod tui;
mod units;

use std::{
    io::Write,
    path::{Path, PathBuf},
    process::ExitCode,
    time::Duration,
};

use clap::{Parser, Subcommand, ValueEnum};

use crate::{model::probing::LaunchProbes, probes::ProbeError};

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

/// A probe cost budget: a share of wall time, or none (`off`).
#[derive(Clone, Copy, Debug)]
struct Budget(Option<f64>);

fn parse_budget(s: &str) -> Result<Budget, String> {
    if s == "off" {
        return Ok(Budget(None));
    }
    let pct: f64 = s
        .strip_suffix('%')
        .unwrap_or(s)
        .parse()
        .map_err(|_| format!("{s:?}: expected a percentage such as 1% or 0.5%, or off"))?;
    if !(pct > 0.0 && pct < 100.0) {
        return Err(format!("{s:?}: the budget must be above 0% and below 100%"));
    }
    Ok(Budget(Some(pct / 100.0)))
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LaunchMode {
    Off,
    On,
    Sampled,
}

/// Options shared by the commands that load probes and collect.
#[derive(clap::Args, Clone)]
struct CollectArgs {
    /// Probe kernel launches too: `on` or `sampled` (in the probe budget's windows, like
    /// synchronisations and copies; with `--probe-budget off`, `on` probes every launch and
    /// `sampled` attaches them for --launch-window every --launch-period) or `off`. They cost
    /// about 1.7 us per launch while attached. (Default: off; `sampled` for `attribute`.)
    #[arg(long, value_enum, num_args = 0..=1, default_missing_value = "on")]
    probe_launches: Option<LaunchMode>,
    /// With `--probe-launches sampled` and `--probe-budget off`: how long each window lasts
    /// (default 1s; 200ms for `attribute`).
    #[arg(long, value_parser = units::parse_duration)]
    launch_window: Option<Duration>,
    /// With `--probe-launches sampled` and `--probe-budget off`: how often a window starts.
    #[arg(long, default_value = "10s", value_parser = units::parse_duration)]
    launch_period: Duration,
    /// Keep the cost of the high-rate probes (launches, synchronisations, copies) under this
    /// share of each process's time by probing them in windows sized from their rates (e.g.
    /// 0.5%, 1%); figures of a kind it sampled are estimates and marked so. `off` probes
    /// synchronisations and copies always and launches as --probe-launches says. Processes
    /// under the limiter are never probed for these: their limiter records them exactly.
    /// (Default: 0.5%; 1% for `attribute`.)
    #[arg(long, value_parser = parse_budget)]
    probe_budget: Option<Budget>,
    /// With a probe budget: how long each sampling window lasts (default 100ms; 50ms for
    /// `attribute`).
    #[arg(long, value_parser = units::parse_duration)]
    sample_window: Option<Duration>,
    /// Also probe this libcuda (repeatable); discovered libraries are always probed.
    #[arg(long = "libcuda", value_name = "PATH")]
    libcuda: Vec<PathBuf>,
    /// Skip measuring the probe cost at start.
    #[arg(long)]
    no_calibrate: bool,
    /// Where the host's filesystem is (for the loader cache, driver directories and runtime
    /// sockets), e.g. /host when the agent runs in a container with the host's root mounted there.
    #[arg(long, default_value = "/")]
    host_root: PathBuf,
    /// Directories holding limiter regions (repeatable; searched 3 levels deep). Regions that
    /// GPU processes map are found without it.
    #[arg(long = "region-dir", value_name = "DIR")]
    region_dirs: Vec<PathBuf>,
    /// Do not read NVML.
    #[arg(long)]
    no_nvml: bool,
    /// Read NVML at most this often (rounded to a whole number of snapshots); the snapshots in
    /// between carry the last reading. Default: at every snapshot. A longer interval asks the
    /// driver less (docs/metrics.md, "What reading NVML costs") at the price of GPU figures,
    /// processes' GPU memory and GPU use that change only at each reading.
    #[arg(long, value_parser = units::parse_duration)]
    nvml_interval: Option<Duration>,
    /// Live allocations the probes track per process at most (its share of the kernel's
    /// allocation table, 262,144 entries shared by all processes); more are counted as untracked
    /// and the process's live-memory figure is marked incomplete.
    #[arg(long, default_value_t = agent_common::maps::ALLOC_QUOTA_DEFAULT)]
    probe_alloc_quota: u64,
    /// Aggregation rows (per API, NCCL communicator and allocation size class) per cgroup at most
    /// in the probes' kernel maps (16,384 rows each, shared by all containers); calls that
    /// need a row past it are counted as unaggregated and the process marked incomplete.
    #[arg(long, default_value_t = agent_common::maps::ROW_QUOTA_DEFAULT)]
    probe_row_quota: u64,
}

/// A command's defaults for the probes.
struct ProbeDefaults {
    launches: LaunchMode,
    /// With `--probe-launches sampled` and no budget: each window's length.
    launch_window: Duration,
    budget: f64,
    sample_window: Duration,
}

/// `run`, `stat` and `top`: watching at a cost within noise (docs/multi-gpu.md).
const WATCH: ProbeDefaults = ProbeDefaults {
    launches: LaunchMode::Off,
    launch_window: Duration::from_secs(1),
    budget: 0.005,
    sample_window: Duration::from_millis(100),
};

/// `attribute`: launches sampled too, and a larger budget in shorter windows for its estimates.
const ATTRIBUTE: ProbeDefaults = ProbeDefaults {
    launches: LaunchMode::Sampled,
    launch_window: Duration::from_millis(200),
    budget: 0.01,
    sample_window: Duration::from_millis(50),
};

impl CollectArgs {
    /// Probe options, with this command's defaults.
    fn trace_options(
        &self,
        defaults: &ProbeDefaults,
    ) -> anyhow::Result<probe_options::TraceOptions> {
        let (default_launches, default_window) = (defaults.launches, defaults.launch_window);
        let window = self.launch_window.unwrap_or(default_window);
        let budget = self
            .probe_budget
            .unwrap_or(Budget(Some(defaults.budget)))
            .0
            .map(|share| probe_options::Budget {
                share,
                window: self.sample_window.unwrap_or(defaults.sample_window),
            });
        // A budget holds for every high-rate kind: launches asked for come under it too.
        let launches = match self.probe_launches.unwrap_or(default_launches) {
            LaunchMode::Off => LaunchProbes::Off,
            LaunchMode::On | LaunchMode::Sampled if budget.is_some() => LaunchProbes::Budget,
            LaunchMode::On => LaunchProbes::On,
            LaunchMode::Sampled => {
                anyhow::ensure!(
                    window < self.launch_period,
                    "--launch-window ({window:?}) must be shorter than --launch-period ({:?})",
                    self.launch_period
                );
                LaunchProbes::Sampled {
                    window,
                    period: self.launch_period,
                }
            }
        };
        Ok(probe_options::TraceOptions {
            extra_libcuda: self.libcuda.clone(),
            launches,
            calibrate: !self.no_calibrate,
            host: host::HostPaths::system().with_root(self.host_root.clone()),
            spans: None,
            budget,
            quotas: probe_options::MapQuotas {
                allocs_per_process: self.probe_alloc_quota,
                rows_per_cgroup: self.probe_row_quota,
            },
        })
    }

    fn region_dirs(&self) -> Vec<PathBuf> {
        if self.region_dirs.is_empty() {
            collector::regions::DEFAULT_REGION_DIRS
                .iter()
                .map(PathBuf::from)
                .collect()
        } else {
            self.region_dirs.clone()
        }
    }
}

/// Which regions a `limit` command applies to.
#[derive(clap::Args)]
#[group(required = true, multiple = false)]
struct LimitTarget {
    /// The container (id or id prefix): every limiter region its processes map.
    #[arg(long)]
    container: Option<String>,
    /// A region file (the limiter's CUDA_DEVICE_MEMORY_SHARED_CACHE).
    #[arg(long)]
    region: Option<PathBuf>,
}

impl LimitTarget {
    fn target(&self) -> limit::Target {
        match (&self.container, &self.region) {
            (Some(c), _) => limit::Target::Container(c.clone()),
            (None, Some(r)) => limit::Target::Region(r.clone()),
            (None, None) => unreachable!("clap requires one of --container and --region"),
        }
    }
}

#[derive(Subcommand)]
enum LimitAction {
    /// Set the SM share and/or the memory limit (of every device, or of --device).
    Set {
        #[command(flatten)]
        target: LimitTarget,
        /// Only this device (CUDA ordinal as the container sees it).
        #[arg(long)]
        device: Option<u32>,
        /// SM share in percent (0 or 100: no SM limit).
        #[arg(long, value_parser = clap::value_parser!(u8).range(0..=100))]
        sm: Option<u8>,
        /// Memory limit: bytes with an optional k/m/g/t suffix (e.g. 4g), or none.
        #[arg(long, value_parser = limit::parse_memory)]
        memory: Option<u64>,
        /// QoS tier of the container on every device (docs/qos.md): latency, guaranteed (with
        /// --guarantee), best-effort, none (no tier), or env (the container's environment's).
        #[arg(long)]
        tier: Option<String>,
        /// Guaranteed share of each GPU in percent (the guaranteed tier).
        #[arg(long, value_parser = clap::value_parser!(u8).range(1..=100))]
        guarantee: Option<u8>,
    },
    /// Show the run-time changes in effect.
    Show {
        #[command(flatten)]
        target: LimitTarget,
    },
}

/// `--freeze-after`, `--freeze-on-demand`: a duration, or `off` (also `0`) for none.
fn parse_freeze_after(s: &str) -> Result<Option<Duration>, String> {
    match s {
        "off" | "0" => Ok(None),
        s => units::parse_duration(s).map(Some),
    }
}

/// `--freeze-pool`: bytes (`64g`), or `off` (also `0`, `none`) for none.
fn parse_pool_size(s: &str) -> Result<u64, String> {
    match s {
        "off" => Ok(0),
        s => limit::parse_memory(s),
    }
}

/// Prints what a freeze or thaw did for each process, also when some failed (the error then
/// lists those).
fn report_each(outcome: Result<Vec<String>, freeze::FreezeError>) -> anyhow::Result<()> {
    let done = match &outcome {
        Ok(lines) => lines,
        Err(freeze::FreezeError::Failed { done, .. }) => done,
        Err(_) => &Vec::new(),
    };
    for line in done {
        println!("{line}");
    }
    outcome.map(drop).map_err(Into::into)
}

/// Which processes `freeze` and `thaw` apply to.
#[derive(clap::Args)]
#[group(required = true, multiple = false)]
struct FreezeTarget {
    /// The container (id or id prefix): every process of it that maps libcuda.
    #[arg(long)]
    container: Option<String>,
    /// A process (host pid); repeat for several.
    #[arg(long)]
    pid: Vec<u32>,
}

impl FreezeTarget {
    fn target(&self) -> freeze::Target {
        match &self.container {
            Some(c) => freeze::Target::Container(c.clone()),
            None => freeze::Target::Pids(self.pid.clone()),
        }
    }
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
        /// How often to look for new driver libraries in processes.
        #[arg(long, default_value = "500ms", value_parser = units::parse_duration)]
        poll_interval: Duration,
        /// Read from the agent daemon on this socket when one answers (then no probes are
        /// loaded by this command).
        #[arg(long, default_value = daemon::DEFAULT_SOCKET)]
        socket: PathBuf,
        /// Never read from a daemon: load the probes in this process.
        #[arg(long)]
        no_daemon: bool,
        #[command(flatten)]
        collect: CollectArgs,
    },
    /// Record a window and show where the time inside CUDA and NCCL calls went.
    Attribute {
        /// How long to record.
        #[arg(long, default_value = "30s", value_parser = units::parse_duration)]
        duration: Duration,
        /// Only this container (id, id prefix or name).
        #[arg(long)]
        container: Option<String>,
        /// Only this process.
        #[arg(long)]
        pid: Option<u32>,
        /// A previous recording (report.json from --out) to compare with.
        #[arg(long)]
        baseline: Option<PathBuf>,
        /// Write report.json (docs/attribute.md) and report.html here.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[arg(long, default_value = "500ms", value_parser = units::parse_duration)]
        poll_interval: Duration,
        /// Read from the agent daemon on this socket when one answers.
        #[arg(long, default_value = daemon::DEFAULT_SOCKET)]
        socket: PathBuf,
        /// Never read from a daemon: load the probes in this process.
        #[arg(long)]
        no_daemon: bool,
        #[command(flatten)]
        collect: CollectArgs,
    },
    /// The live terminal view: GPUs, containers and their processes (htop-like).
    Top {
        /// How often to refresh.
        #[arg(long, default_value = "1s", value_parser = units::parse_duration)]
        interval: Duration,
        /// Read from the agent daemon on this socket when one answers.
        #[arg(long, default_value = daemon::DEFAULT_SOCKET)]
        socket: PathBuf,
        /// Never read from a daemon: load the probes in this process.
        #[arg(long)]
        no_daemon: bool,
        #[command(flatten)]
        collect: CollectArgs,
    },
    /// Change a container's limits at run time (written beside its region; applied within 1 s).
    Limit {
        #[command(subcommand)]
        action: LimitAction,
    },
    /// Freeze a container's GPU processes: their device memory moves to host memory and goes
    /// back to the GPU, they stay alive and their CUDA calls wait for the thaw (the driver's
    /// checkpoint API, driver 550 or newer).
    Freeze {
        #[command(flatten)]
        target: FreezeTarget,
        /// How long to wait for each process's CUDA calls in flight before giving up.
        #[arg(long, default_value = "10s", value_parser = units::parse_duration)]
        lock_timeout: Duration,
        /// The driver library.
        #[arg(long, default_value = "libcuda.so.1")]
        libcuda: PathBuf,
    },
    /// Thaw frozen processes: their memory comes back to the GPU and their CUDA calls proceed.
    Thaw {
        #[command(flatten)]
        target: FreezeTarget,
        /// The driver library.
        #[arg(long, default_value = "libcuda.so.1")]
        libcuda: PathBuf,
    },
    /// Inject the limiter into containers through CDI (`--device vgpu-agent.dev/limit=NAME`).
    Cdi {
        #[command(subcommand)]
        command: cdi::CdiCommand,
    },
    /// Run the agent daemon: collect at an interval and serve the model on a Unix socket.
    Run {
        /// Where to serve snapshots (JSON; docs/model.md).
        #[arg(long, default_value = daemon::DEFAULT_SOCKET)]
        socket: PathBuf,
        /// How often to take a snapshot.
        #[arg(long, default_value = "1s", value_parser = units::parse_duration)]
        interval: Duration,
        /// How long an exited process stays in the model (and its rows in the probe maps).
        #[arg(long, default_value = "60s", value_parser = units::parse_duration)]
        exited_retention: Duration,
        /// Serve Prometheus/OpenMetrics `/metrics` on this address (`off` disables).
        #[arg(long, default_value = "127.0.0.1:9400", value_parser = export::parse_listen)]
        metrics_listen: export::Listen,
        /// Also export per-process series (pid and comm labels: one series per process).
        #[arg(long)]
        metrics_pid_labels: bool,
        /// Export API series per API (`api` label) with a latency histogram per container and
        /// API, instead of per API kind (about 15 times the series; docs/metrics.md).
        #[arg(long)]
        metrics_per_api: bool,
        /// Send spans of sampled calls to this OTLP endpoint (e.g. http://127.0.0.1:4317 for
        /// gRPC, http://127.0.0.1:4318 for HTTP); no spans without it.
        #[arg(long, value_name = "URL")]
        otlp_endpoint: Option<String>,
        /// OTLP transport.
        #[arg(long, value_enum, default_value = "grpc")]
        otlp_protocol: export::otlp::OtlpProtocol,
        /// Spans waiting for export at most; more are dropped and counted.
        #[arg(long, default_value_t = 4096)]
        otlp_queue: usize,
        /// How often the containers' GPU time goes to the OTLP endpoint as metrics
        /// (`vgpu.container.gpu_busy`, `vgpu.container.kernel.time`); 0 sends none.
        #[arg(long, default_value = "10s", value_parser = units::parse_duration)]
        otlp_metrics_interval: Duration,
        /// Calls at least this slow become spans (NCCL calls always do); 0 turns it off.
        #[arg(long, default_value = "1ms", value_parser = units::parse_duration)]
        trace_slow: Duration,
        /// One in this many of the other probed calls becomes a span (per CPU); 0 turns it off.
        #[arg(long, default_value_t = 1000)]
        trace_sample_rate: u64,
        /// Of those, at most this many spans per second per container (0: no limit).
        #[arg(long, default_value_t = 10.0)]
        trace_container_rate: f64,
        /// NCCL spans, and slow-call spans, per second per container at most (each; 0: no
        /// limit), so that one container's flood cannot crowd out the others' spans.
        #[arg(long, default_value_t = 1000.0)]
        trace_container_event_rate: f64,
        /// The driver library whose checkpoint API thaws a container frozen by `freeze
        /// --container` at its next CUDA call (loaded at the first such thaw).
        #[arg(long, default_value = "libcuda.so.1", value_name = "PATH")]
        checkpoint_libcuda: PathBuf,
        /// Freeze a container whose processes under the limiter made no CUDA call for this long
        /// (its device memory to host memory, thawed by its next call); `off`: never. Without
        /// it, `VGPU_FREEZE_AFTER` in the agent's environment; neither: only the containers
        /// that ask for it (their own `VGPU_FREEZE_AFTER`), after their own time. A container
        /// asking for a shorter time than this gets it; never a longer one.
        #[arg(long, value_name = "DURATION")]
        freeze_after: Option<String>,
        /// While a container's allocation waits for device memory the GPU has no room for (its
        /// `VGPU_OOM_WAIT`), freeze other containers idle for this long, largest first, until
        /// they give back as much; `off`: never. Without it, `VGPU_FREEZE_ON_DEMAND` in the
        /// agent's environment; neither: off.
        #[arg(long, value_name = "DURATION")]
        freeze_on_demand: Option<String>,
        /// Host memory that frozen containers may hold together (e.g. 64g); a container that
        /// does not fit what is left stays running.
        #[arg(long, default_value = "16g", value_parser = limit::parse_memory)]
        freeze_host_budget: u64,
        /// Host memory to keep populated in huge pages beforehand and lend to processes freezing
        /// in-process (`VGPU_FREEZE_IN_PROCESS`), which then skip populating their own (e.g.
        /// 64g; whole GiB, at most --freeze-host-budget; `off`: none). Its pages are charged to
        /// the agent's memory cgroup. Needs CAP_SYS_ADMIN (a tmpfs of its own) and NVML.
        #[arg(long, default_value = "off", value_name = "SIZE", value_parser = parse_pool_size)]
        freeze_pool: u64,
        /// Where the freeze pool is served (the directory is mounted read-only into containers).
        #[arg(long, default_value = region::freeze_pool::DEFAULT_SOCKET, value_name = "PATH")]
        freeze_pool_socket: PathBuf,
        #[command(flatten)]
        collect: CollectArgs,
    },
}

fn init_logging() {
    env_logger::Builder::from_env(env_logger::Env::default().filter_or("VGPU_LOG", "info"))
        .format(|buf, record| {
            // Log lines name tenants' paths and processes: escapes in them stay inert.
            let message = record.args().to_string();
            let message = sanitize::inert(&message);
            match record.level() {
                log::Level::Info => writeln!(buf, "vgpu-agent: {message}"),
                log::Level::Warn => writeln!(buf, "vgpu-agent: warning: {message}"),
                level => writeln!(
                    buf,
                    "vgpu-agent: {}: {message}",
                    level.as_str().to_lowercase()
                ),
            }
        })
        .init();
}

fn main() -> ExitCode {
    init_logging();
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Errors name tenants' paths: escapes in them stay inert.
            eprintln!("vgpu-agent: error: {}", sanitize::inert(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Stat {
            duration,
            json,
            poll_interval,
            socket,
            no_daemon,
            collect,
        } => {
            let opts = stat::StatOptions {
                duration,
                poll_interval,
                trace: collect.trace_options(&WATCH)?,
                region_dirs: collect.region_dirs(),
                socket: (!no_daemon).then_some(socket),
                nvml: !collect.no_nvml,
                nvml_interval: collect.nvml_interval,
            };
            let report = match stat::run(opts) {
                Ok(r) => r,
                // The privilege message is the whole story; don't wrap it.
                Err(stat::StatError::Probes(ProbeError::NotPrivileged(msg))) => {
                    anyhow::bail!("{msg}")
                }
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
        Command::Attribute {
            duration,
            container,
            pid,
            baseline,
            out,
            json,
            poll_interval,
            socket,
            no_daemon,
            collect,
        } => {
            let trace = collect.trace_options(&ATTRIBUTE)?;
            let opts = attribute::AttributeOptions {
                duration,
                poll_interval,
                trace,
                region_dirs: collect.region_dirs(),
                socket: (!no_daemon).then_some(socket),
                nvml: !collect.no_nvml,
                nvml_interval: collect.nvml_interval,
                filter: attribute::filter::Filter { container, pid },
                baseline,
            };
            let report = match attribute::run(opts) {
                Ok(r) => r,
                Err(attribute::AttributeError::Window(collector::window::WindowError::Probes(
                    ProbeError::NotPrivileged(msg),
                ))) => {
                    anyhow::bail!("{msg}")
                }
                Err(e) => return Err(e.into()),
            };
            if let Some(dir) = &out {
                attribute::write(&report, dir)?;
                log::info!(
                    "wrote {} and {}",
                    dir.join("report.json").display(),
                    dir.join("report.html").display()
                );
            }
            let mut stdout = std::io::stdout().lock();
            if json {
                serde_json::to_writer_pretty(&mut stdout, &report)?;
                writeln!(stdout)?;
            } else {
                write!(stdout, "{}", attribute::table(&report))?;
            }
            Ok(())
        }
        Command::Top {
            interval,
            socket,
            no_daemon,
            collect,
        } => {
            anyhow::ensure!(!interval.is_zero(), "--interval must be longer than 0");
            tui::run(tui::TopOptions {
                interval,
                socket: (!no_daemon).then_some(socket),
                collector: collector::CollectorOptions {
                    trace: Some(collect.trace_options(&WATCH)?),
                    region_dirs: collect.region_dirs(),
                    host: host::HostPaths::system().with_root(collect.host_root.clone()),
                    nvml: !collect.no_nvml,
                    nvml_interval: collect.nvml_interval,
                    exited_retention: collector::EXITED_RETENTION,
                },
            })
        }
        Command::Limit { action } => {
            let lines = match action {
                LimitAction::Set {
                    target,
                    device,
                    sm,
                    memory,
                    tier,
                    guarantee,
                } => {
                    let qos = limit::QosChange::from_args(tier.as_deref(), guarantee)
                        .map_err(anyhow::Error::msg)?;
                    limit::set(&target.target(), device, sm, memory, qos)?
                }
                LimitAction::Show { target } => limit::show(&target.target())?,
            };
            // The lines name regions' paths, which tenants choose.
            for l in lines {
                println!("{}", sanitize::inert(&l));
            }
            Ok(())
        }
        Command::Freeze {
            target,
            lock_timeout,
            libcuda,
        } => {
            let pids = freeze::pids(&target.target(), Path::new("/proc"))?;
            // Loaded only where the driver's path is taken (not for an in-process freeze).
            let api = || checkpoint::room::open(&libcuda, Path::new("/proc"));
            report_each(match &target.container {
                Some(id) => freeze::freeze_container(api, id, &pids, lock_timeout),
                None => freeze::freeze_pids(api, &pids, lock_timeout, |pid| {
                    freeze::of_pid(Path::new("/proc"), pid)
                }),
            })
        }
        Command::Thaw { target, libcuda } => {
            let pids = freeze::pids(&target.target(), Path::new("/proc"))?;
            let api = || checkpoint::room::open(&libcuda, Path::new("/proc"));
            report_each(match &target.container {
                Some(id) => freeze::thaw_container(api, id, || Ok(pids.clone())),
                None => freeze::thaw(&api()?, &pids),
            })
        }
        Command::Cdi { command } => {
            for line in cdi::run(command)? {
                eprintln!("vgpu-agent: {line}");
            }
            Ok(())
        }
        Command::Run {
            socket,
            interval,
            exited_retention,
            metrics_listen,
            metrics_pid_labels,
            metrics_per_api,
            otlp_endpoint,
            otlp_protocol,
            otlp_queue,
            otlp_metrics_interval,
            trace_slow,
            trace_sample_rate,
            trace_container_rate,
            trace_container_event_rate,
            checkpoint_libcuda,
            freeze_after,
            freeze_on_demand,
            freeze_host_budget,
            freeze_pool,
            freeze_pool_socket,
            collect,
        } => {
            let freeze_after =
                match freeze_after.or_else(|| std::env::var("VGPU_FREEZE_AFTER").ok()) {
                    Some(s) => parse_freeze_after(&s)
                        .map_err(|e| anyhow::anyhow!("--freeze-after / VGPU_FREEZE_AFTER: {e}"))?,
                    None => None,
                };
            let freeze_on_demand =
                match freeze_on_demand.or_else(|| std::env::var("VGPU_FREEZE_ON_DEMAND").ok()) {
                    Some(s) => parse_freeze_after(&s).map_err(|e| {
                        anyhow::anyhow!("--freeze-on-demand / VGPU_FREEZE_ON_DEMAND: {e}")
                    })?,
                    None => None,
                };
            let mut trace = collect.trace_options(&WATCH)?;
            if otlp_endpoint.is_some() {
                trace.spans = Some(probe_options::SpanSampling {
                    slow_ns: trace_slow.as_nanos() as u64,
                    sample_every: trace_sample_rate,
                });
            }
            let opts = daemon::DaemonOptions {
                otlp: otlp_endpoint.map(|endpoint| export::otlp::OtlpConfig {
                    endpoint,
                    protocol: otlp_protocol,
                    queue: otlp_queue,
                    metrics_interval: (!otlp_metrics_interval.is_zero())
                        .then_some(otlp_metrics_interval),
                    container_rate: trace_container_rate,
                    container_event_rate: trace_container_event_rate,
                }),
                socket,
                interval,
                metrics: metrics_listen.0.map(|listen| daemon::MetricsConfig {
                    listen,
                    options: export::metrics::MetricsOptions {
                        pid_labels: metrics_pid_labels,
                        per_api: metrics_per_api,
                    },
                }),
                collector: collector::CollectorOptions {
                    trace: Some(trace),
                    region_dirs: collect.region_dirs(),
                    host: host::HostPaths::system().with_root(collect.host_root.clone()),
                    nvml: !collect.no_nvml,
                    nvml_interval: collect.nvml_interval,
                    exited_retention,
                },
                checkpoint_libcuda,
                idle_freeze: daemon::thaw::IdleFreeze {
                    after: freeze_after,
                    host_budget: freeze_host_budget,
                    on_demand: freeze_on_demand,
                },
                freeze_pool: (freeze_pool > 0).then_some(freeze_pool::Settings {
                    size: freeze_pool,
                    host_budget: freeze_host_budget,
                    socket: freeze_pool_socket,
                }),
            };
            daemon::run(opts)?;
            Ok(())
        }
    }
}

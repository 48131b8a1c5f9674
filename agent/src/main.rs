//! `vgpu-agent`: observability and enforcement for shared NVIDIA GPUs.

mod attribute;
mod cdi;
mod client;
mod collector;
mod daemon;
mod discovery;
mod export;
mod host;
mod identity;
mod limit;
mod model;
mod nvml;
mod pool;
mod probes;
mod runtime;
mod sanitize;
mod signals;
mod stat;
mod sys;
mod tui;
mod units;

use std::{io::Write, path::PathBuf, process::ExitCode, time::Duration};

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
    /// Probe kernel launches too: `on`, `sampled` (in windows) or `off`. They cost about
    /// 1.7 us per launch while attached.
    /// (Default: off; `attribute` samples 200 ms every 10 s.)
    #[arg(long, value_enum, num_args = 0..=1, default_missing_value = "on")]
    probe_launches: Option<LaunchMode>,
    /// With `--probe-launches sampled`: how long each window lasts (default 1s; 200ms for
    /// `attribute`).
    #[arg(long, value_parser = units::parse_duration)]
    launch_window: Option<Duration>,
    /// With `--probe-launches sampled`: how often a window starts.
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
    ) -> anyhow::Result<probes::session::TraceOptions> {
        let (default_launches, default_window) = (defaults.launches, defaults.launch_window);
        let window = self.launch_window.unwrap_or(default_window);
        let launches = match self.probe_launches.unwrap_or(default_launches) {
            LaunchMode::Off => LaunchProbes::Off,
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
        Ok(probes::session::TraceOptions {
            extra_libcuda: self.libcuda.clone(),
            launches,
            calibrate: !self.no_calibrate,
            host: host::HostPaths::system().with_root(self.host_root.clone()),
            spans: None,
            budget: self
                .probe_budget
                .unwrap_or(Budget(Some(defaults.budget)))
                .0
                .map(|share| probes::sampling::Budget {
                    share,
                    window: self.sample_window.unwrap_or(defaults.sample_window),
                }),
            quotas: probes::MapQuotas {
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
    },
    /// Show the run-time changes in effect.
    Show {
        #[command(flatten)]
        target: LimitTarget,
    },
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
                filter: attribute::report::Filter { container, pid },
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
                } => limit::set(&target.target(), device, sm, memory)?,
                LimitAction::Show { target } => limit::show(&target.target())?,
            };
            // The lines name regions' paths, which tenants choose.
            for l in lines {
                println!("{}", sanitize::inert(&l));
            }
            Ok(())
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
            trace_slow,
            trace_sample_rate,
            trace_container_rate,
            trace_container_event_rate,
            collect,
        } => {
            let mut trace = collect.trace_options(&WATCH)?;
            if otlp_endpoint.is_some() {
                trace.spans = Some(probes::SpanSampling {
                    slow_ns: trace_slow.as_nanos() as u64,
                    sample_every: trace_sample_rate,
                });
            }
            let opts = daemon::DaemonOptions {
                otlp: otlp_endpoint.map(|endpoint| export::otlp::OtlpConfig {
                    endpoint,
                    protocol: otlp_protocol,
                    queue: otlp_queue,
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
            };
            daemon::run(opts)?;
            Ok(())
        }
    }
}

#[cfg(test)]
mod layers_test {
    //! The agent's layers, checked from its source: every `crate::` (and `super::` that climbs to the
    //! crate root) path in non-test code names a top-level module, and each top-level module may only
    //! name modules of the layers its own layer declares below it. agent/README.md lists the same
    //! layers for readers.

    use std::{
        collections::{BTreeMap, BTreeSet},
        path::{Path, PathBuf},
    };

    /// One layer: its name, the top-level modules in it, and the layers (by name) it may import.
    /// Modules in one layer may import each other as long as no cycle forms.
    struct Layer {
        name: &'static str,
        modules: &'static [&'static str],
        may_use: &'static [&'static str],
    }

    /// The layer table, bottom first.
    const LAYERS: &[Layer] = &[
        // Process plumbing with no knowledge of GPUs: the one module that calls libc (`sys`), unit
        // parsing and formatting, the shared tokio runtime, the process-wide signal flags and the
        // worker pool for reads that may block.
        Layer {
            name: "base",
            modules: &["sys", "units", "runtime", "signals", "pool"],
            may_use: &[],
        },
        // Plain data every other layer reports in (processes, devices, probe states, GPU use), and
        // the scrubbing of the tenant-written strings in it. It reads no file and calls nothing.
        Layer {
            name: "model",
            modules: &["model", "sanitize"],
            may_use: &["base"],
        },
        // Facts about the host that commands may read too: its paths, process and container
        // identity (/proc, cgroups, runtimes), and the daemon's snapshot socket (client side).
        Layer {
            name: "host",
            modules: &["host", "identity", "client"],
            may_use: &["base", "model"],
        },
        // The GPU-facing sources only the collector drives: the library scan, NVML, and the eBPF
        // probes with their session.
        Layer {
            name: "probing",
            modules: &["discovery", "nvml", "probes"],
            may_use: &["base", "model", "host"],
        },
        // Joins the sources into one model snapshot per tick.
        Layer {
            name: "collector",
            modules: &["collector"],
            may_use: &["base", "model", "host", "probing"],
        },
        // The exporters (Prometheus, OTLP): they read the model only.
        Layer {
            name: "views",
            modules: &["export"],
            may_use: &["base", "model"],
        },
        // The commands users run (`top`, `stat`, `attribute`, `limit`, `cdi`): they get snapshots
        // from a collector or the daemon's socket and render them, or read and write limits. Never
        // the probes, NVML or the scan.
        Layer {
            name: "commands",
            modules: &["tui", "stat", "attribute", "limit", "cdi"],
            may_use: &["base", "model", "host", "collector", "views"],
        },
        // The long-running daemon and the binary's entry point: they start everything.
        Layer {
            name: "top",
            modules: &["daemon", "main"],
            may_use: &["*"],
        },
    ];

    fn src_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
    }

    #[derive(Clone, Debug, PartialEq)]
    enum Tok {
        Ident(String),
        Punct(char),
        /// `::`
        PathSep,
    }

    /// Splits Rust source into identifiers and punctuation, dropping comments, strings, chars and
    /// numbers: enough to follow paths and braces.
    fn tokenize(src: &str) -> Vec<Tok> {
        let b: Vec<char> = src.chars().collect();
        let mut out = Vec::new();
        let mut i = 0;
        let n = b.len();
        while i < n {
            let c = b[i];
            let next = b.get(i + 1).copied();
            if c == '/' && next == Some('/') {
                while i < n && b[i] != '\n' {
                    i += 1;
                }
            } else if c == '/' && next == Some('*') {
                let mut depth = 0;
                while i < n {
                    if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                        depth += 1;
                        i += 2;
                    } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
            } else if c == 'r' && (next == Some('"') || (next == Some('#') && raw_string_at(&b, i)))
                || (c == 'b' && next == Some('r') && raw_string_at(&b, i + 1))
            {
                if c == 'b' {
                    i += 1;
                }
                i += 1;
                let mut hashes = 0;
                while b[i] == '#' {
                    hashes += 1;
                    i += 1;
                }
                i += 1;
                loop {
                    if b[i] == '"' && (0..hashes).all(|k| b.get(i + 1 + k) == Some(&'#')) {
                        i += 1 + hashes;
                        break;
                    }
                    i += 1;
                }
            } else if c == '"' || (c == 'b' && next == Some('"')) {
                i += if c == 'b' { 2 } else { 1 };
                while b[i] != '"' {
                    if b[i] == '\\' {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
            } else if c == '\'' || (c == 'b' && next == Some('\'')) {
                // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
                let start = if c == 'b' { i + 1 } else { i };
                if b.get(start + 1) == Some(&'\\') {
                    i = start + 3;
                    while b[i] != '\'' {
                        i += 1;
                    }
                    i += 1;
                } else if b.get(start + 2) == Some(&'\'') {
                    i = start + 3;
                } else {
                    i = start + 1;
                    while i < n && (b[i].is_alphanumeric() || b[i] == '_') {
                        i += 1;
                    }
                }
            } else if c.is_alphabetic() || c == '_' {
                let s = i;
                while i < n && (b[i].is_alphanumeric() || b[i] == '_') {
                    i += 1;
                }
                out.push(Tok::Ident(b[s..i].iter().collect()));
            } else if c.is_ascii_digit() {
                while i < n && (b[i].is_alphanumeric() || b[i] == '_' || b[i] == '.') {
                    if b[i] == '.' && !b.get(i + 1).is_some_and(|d| d.is_ascii_digit()) {
                        break;
                    }
                    i += 1;
                }
            } else if c == ':' && next == Some(':') {
                out.push(Tok::PathSep);
                i += 2;
            } else {
                if !c.is_whitespace() {
                    out.push(Tok::Punct(c));
                }
                i += 1;
            }
        }
        out
    }

    fn raw_string_at(b: &[char], i: usize) -> bool {
        // `r"` or `r#...#"` at i (i points at the `r`).
        let mut j = i + 1;
        while b.get(j) == Some(&'#') {
            j += 1;
        }
        b.get(j) == Some(&'"')
    }

    fn ident(t: Option<&Tok>) -> Option<&str> {
        match t {
            Some(Tok::Ident(s)) => Some(s),
            _ => None,
        }
    }

    /// A `mod name;` declaration.
    #[derive(Debug, PartialEq)]
    struct Child {
        name: String,
        /// Declared with `#[path = ..]`.
        has_path: bool,
        /// Declared under `#[cfg(test)]`.
        test: bool,
    }

    /// What one file contributes: the top-level modules it names, and the module files it declares.
    #[derive(Default)]
    struct FileScan {
        uses: BTreeSet<String>,
        /// libc functions called (`libc::name(`).
        libc_calls: BTreeSet<String>,
        children: Vec<Child>,
    }

    /// Walks one file's tokens. `module` is the file's module path below the crate root.
    fn scan_file(toks: &[Tok], module: &[String]) -> FileScan {
        let mut scan = FileScan::default();
        // The inline-module stack: Some(name) for `mod name {`, None for any other brace.
        let mut braces: Vec<Option<String>> = Vec::new();
        let mut pending_test = false;
        let mut pending_path = false;
        let mut i = 0;
        while i < toks.len() {
            match &toks[i] {
                Tok::Punct('#') if toks.get(i + 1) == Some(&Tok::Punct('[')) => {
                    let end = matching(toks, i + 1, '[', ']');
                    let attr = &toks[i + 2..end];
                    if ident(attr.first()) == Some("cfg")
                        && attr.get(2) == Some(&Tok::Ident("test".into()))
                        && attr.len() == 4
                    {
                        pending_test = true;
                    }
                    if ident(attr.first()) == Some("path") {
                        pending_path = true;
                    }
                    i = end + 1;
                    continue;
                }
                Tok::Ident(kw) if kw == "mod" => {
                    let name = ident(toks.get(i + 1)).unwrap_or_default().to_string();
                    if toks.get(i + 2) == Some(&Tok::Punct(';')) {
                        scan.children.push(Child {
                            name,
                            has_path: pending_path,
                            test: pending_test,
                        });
                        pending_test = false;
                        pending_path = false;
                        i += 3;
                        continue;
                    }
                    if pending_test {
                        i = matching(toks, i + 2, '{', '}') + 1;
                        pending_test = false;
                        continue;
                    }
                    braces.push(Some(name));
                    i += 3;
                    continue;
                }
                Tok::Ident(kw) if pending_test && kw != "pub" && kw != "crate" => {
                    // A test-only item other than a module: skip it whole.
                    i = skip_item(toks, i);
                    pending_test = false;
                    continue;
                }
                Tok::Ident(kw)
                    if kw == "libc"
                        && toks.get(i + 1) == Some(&Tok::PathSep)
                        && toks.get(i + 3) == Some(&Tok::Punct('(')) =>
                {
                    if let Some(f) = ident(toks.get(i + 2)) {
                        scan.libc_calls.insert(f.to_string());
                    }
                    i += 3;
                    continue;
                }
                Tok::Ident(kw) if kw == "crate" && toks.get(i + 1) == Some(&Tok::PathSep) => {
                    i = record_tops(toks, i + 2, &mut scan.uses);
                    continue;
                }
                Tok::Ident(kw) if kw == "super" => {
                    let mut here: Vec<String> = module.to_vec();
                    here.extend(braces.iter().flatten().cloned());
                    let mut j = i;
                    while ident(toks.get(j)) == Some("super")
                        && toks.get(j + 1) == Some(&Tok::PathSep)
                    {
                        here.pop();
                        j += 2;
                    }
                    i = if j == i {
                        // `pub(super)`, `use super::{..}` at the root is not used.
                        i + 1
                    } else if here.is_empty() {
                        record_tops(toks, j, &mut scan.uses)
                    } else {
                        j
                    };
                    continue;
                }
                Tok::Punct('{') => braces.push(None),
                Tok::Punct('}') => {
                    braces.pop();
                }
                _ => {}
            }
            i += 1;
        }
        scan
    }

    /// Index of the bracket closing the one opened at `open`.
    fn matching(toks: &[Tok], open: usize, o: char, c: char) -> usize {
        let mut depth = 0;
        for (k, t) in toks.iter().enumerate().skip(open) {
            if *t == Tok::Punct(o) {
                depth += 1;
            } else if *t == Tok::Punct(c) {
                depth -= 1;
                if depth == 0 {
                    return k;
                }
            }
        }
        toks.len() - 1
    }

    /// Skips one item starting at `i` (`use ...;`, `fn .. { }`, `let ..;`), returning the index
    /// after it.
    fn skip_item(toks: &[Tok], mut i: usize) -> usize {
        let mut depth = 0;
        while i < toks.len() {
            match toks[i] {
                Tok::Punct('{') | Tok::Punct('(') | Tok::Punct('[') => depth += 1,
                Tok::Punct('}') | Tok::Punct(')') | Tok::Punct(']') => {
                    depth -= 1;
                    if depth == 0 && toks[i] == Tok::Punct('}') {
                        return if toks.get(i + 1) == Some(&Tok::Punct(';')) {
                            i + 2
                        } else {
                            i + 1
                        };
                    }
                }
                Tok::Punct(';') if depth == 0 => return i + 1,
                _ => {}
            }
            i += 1;
        }
        i
    }

    /// At `i` just after `crate::` (or a `super::` chain that reached the root): records the
    /// top-level module named there, or each one in a `{a::.., b, c::{..}}` group.
    fn record_tops(toks: &[Tok], i: usize, uses: &mut BTreeSet<String>) -> usize {
        match toks.get(i) {
            Some(Tok::Ident(name)) => {
                if name != "self" {
                    uses.insert(name.clone());
                }
                i + 1
            }
            Some(Tok::Punct('{')) => {
                let end = matching(toks, i, '{', '}');
                let mut depth = 1;
                let mut expect = true;
                for t in &toks[i + 1..end] {
                    match t {
                        Tok::Punct('{') => depth += 1,
                        Tok::Punct('}') => depth -= 1,
                        Tok::Punct(',') if depth == 1 => {
                            expect = true;
                            continue;
                        }
                        Tok::Ident(name) if depth == 1 && expect && name != "self" => {
                            uses.insert(name.clone());
                        }
                        _ => {}
                    }
                    expect = false;
                }
                end + 1
            }
            _ => i,
        }
    }

    /// Every non-test source file of the binary with its module path, found by following `mod`
    /// declarations from main.rs.
    fn module_files() -> Vec<(PathBuf, Vec<String>, FileScan)> {
        let src = src_dir();
        let mut out = Vec::new();
        let mut todo = vec![(src.join("main.rs"), Vec::<String>::new())];
        while let Some((file, module)) = todo.pop() {
            let text = std::fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let scan = scan_file(&tokenize(&text), &module);
            let stem = file.file_stem().unwrap().to_str().unwrap();
            let dir = if stem == "mod" || stem == "main" {
                file.parent().unwrap().to_path_buf()
            } else {
                file.with_extension("")
            };
            for Child {
                name,
                has_path,
                test,
            } in &scan.children
            {
                if *test {
                    continue;
                }
                assert!(
                    !has_path,
                    "{}: `#[path]` on a non-test module is not followed by this check",
                    file.display()
                );
                let flat = dir.join(format!("{name}.rs"));
                let child = if flat.exists() {
                    flat
                } else {
                    dir.join(name).join("mod.rs")
                };
                let mut m = module.clone();
                m.push(name.clone());
                todo.push((child, m));
            }
            out.push((file, module, scan));
        }
        out
    }

    /// Top-level module -> the other top-level modules it names, and the files that name them.
    fn edges() -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
        let src = src_dir();
        let mut g: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
        for (file, module, scan) in module_files() {
            let top = module.first().cloned().unwrap_or_else(|| "main".into());
            let shown = file.strip_prefix(&src).unwrap().display().to_string();
            let entry = g.entry(top.clone()).or_default();
            for used in scan.uses {
                if used != top {
                    entry.entry(used).or_default().insert(shown.clone());
                }
            }
        }
        g
    }

    fn layer_of(module: &str) -> Option<&'static Layer> {
        LAYERS.iter().find(|l| l.modules.contains(&module))
    }

    /// Violations of the layer table, one line each.
    fn layer_violations(g: &BTreeMap<String, BTreeMap<String, BTreeSet<String>>>) -> Vec<String> {
        let mut bad = Vec::new();
        for (from, tos) in g {
            let Some(lf) = layer_of(from) else {
                bad.push(format!(
                    "`{from}` is in no layer: add it to LAYERS and agent/README.md"
                ));
                continue;
            };
            for (to, files) in tos {
                let Some(lt) = layer_of(to) else {
                    bad.push(format!(
                        "`{to}` is in no layer: add it to LAYERS and agent/README.md"
                    ));
                    continue;
                };
                let allowed =
                    lf.name == lt.name || lf.may_use.iter().any(|u| *u == "*" || *u == lt.name);
                if !allowed {
                    let files: Vec<_> = files.iter().cloned().collect();
                    bad.push(format!(
                        "`{from}` ({} layer) uses `{to}` ({} layer) in {}",
                        lf.name,
                        lt.name,
                        files.join(", ")
                    ));
                }
            }
        }
        bad
    }

    /// A cycle among top-level modules, if any, as `a -> b -> a`.
    fn find_cycle(g: &BTreeMap<String, BTreeMap<String, BTreeSet<String>>>) -> Option<String> {
        fn visit(
            g: &BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
            node: &str,
            stack: &mut Vec<String>,
            done: &mut BTreeSet<String>,
        ) -> Option<String> {
            if let Some(pos) = stack.iter().position(|s| s == node) {
                let mut cycle = stack[pos..].to_vec();
                cycle.push(node.to_string());
                return Some(cycle.join(" -> "));
            }
            if done.contains(node) {
                return None;
            }
            stack.push(node.to_string());
            for next in g.get(node).into_iter().flat_map(|m| m.keys()) {
                if let Some(c) = visit(g, next, stack, done) {
                    return Some(c);
                }
            }
            stack.pop();
            done.insert(node.to_string());
            None
        }
        let mut done = BTreeSet::new();
        g.keys()
            .find_map(|n| visit(g, n, &mut Vec::new(), &mut done))
    }

    #[test]
    fn top_level_modules_form_no_cycle() {
        let g = edges();
        if let Some(cycle) = find_cycle(&g) {
            panic!("import cycle among the agent's top-level modules: {cycle}");
        }
    }

    #[test]
    fn every_import_goes_down_the_layer_table() {
        let bad = layer_violations(&edges());
        assert!(bad.is_empty(), "layer violations:\n  {}", bad.join("\n  "));
    }

    #[test]
    fn only_sys_calls_libc() {
        let src = src_dir();
        let mut bad = Vec::new();
        for (file, module, scan) in module_files() {
            if module.first().map(String::as_str) != Some("sys") && !scan.libc_calls.is_empty() {
                let shown = file.strip_prefix(&src).unwrap().display().to_string();
                bad.push(format!("{shown}: {:?}", scan.libc_calls));
            }
        }
        assert!(
            bad.is_empty(),
            "libc called outside sys/ (add a typed function there):\n  {}",
            bad.join("\n  ")
        );
    }

    #[test]
    fn every_top_level_module_is_in_exactly_one_layer() {
        let g = edges();
        for module in g.keys() {
            let n = LAYERS
                .iter()
                .filter(|l| l.modules.contains(&module.as_str()))
                .count();
            assert_eq!(n, 1, "`{module}` is in {n} layers");
        }
    }

    #[test]
    fn the_scanner_sees_grouped_super_and_test_paths() {
        let src = r#"
        use crate::{model::{Gpu, Proc}, units, sys::clock};
        // crate::commented::Out
        const S: &str = "crate::in_string";
        pub(super) fn f() { let _ = super::probes::X; unsafe { libc::kill(1, libc::SIGTERM) }; }
        mod inner { fn g() { let _ = super::super::nvml::Y; } }
        #[cfg(test)]
        mod tests { use crate::tui::T; }
        #[cfg(test)]
        use crate::export::E;
        #[cfg(test)]
        mod more_tests;
        mod child;
    "#;
        let scan = scan_file(&tokenize(src), &["collector".to_string()]);
        let uses: Vec<_> = scan.uses.iter().map(String::as_str).collect();
        assert_eq!(uses, ["model", "nvml", "probes", "sys", "units"]);
        assert_eq!(scan.libc_calls.iter().collect::<Vec<_>>(), ["kill"]);
        assert_eq!(
            scan.children,
            [
                Child {
                    name: "more_tests".into(),
                    has_path: false,
                    test: true
                },
                Child {
                    name: "child".into(),
                    has_path: false,
                    test: false
                }
            ]
        );
    }

    #[test]
    fn a_command_importing_a_probe_is_reported() {
        let mut g = edges();
        g.entry("tui".into())
            .or_default()
            .entry("probes".into())
            .or_default()
            .insert("tui/mod.rs".into());
        let bad = layer_violations(&g);
        assert!(
            bad.iter()
                .any(|b| b.starts_with("`tui` (commands layer) uses `probes`")),
            "{bad:?}"
        );
        g.entry("model".into())
            .or_default()
            .entry("tui".into())
            .or_default()
            .insert("model/mod.rs".into());
        g.entry("tui".into())
            .or_default()
            .entry("model".into())
            .or_default()
            .insert("tui/mod.rs".into());
        assert!(find_cycle(&g).is_some());
    }
}

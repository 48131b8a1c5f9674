//! The detail view of a container or a process: identity and memory (per GPU where there are
//! several), GPU use (SM and memory bandwidth, from NVML), NCCL communicators (a container's
//! ranks of one communicator together), memory and SM use over time, per-API counts and latency
//! histograms with the limiter's self-time per call, and the probe mode and what it costs.

use agent_common::hist::{bucket_lower_ns, bucket_upper_ns};
use ratatui::{
    Frame,
    layout::{Constraint, Layout, Rect},
    text::{Line, Span},
    widgets::{Block, Cell, Paragraph, Row, Table},
};

use super::{
    text::{fit, format_interval, rate, short_bytes, spark},
    theme::Theme,
};
use crate::{
    model::gpu_use::KernelShare,
    model::{
        ApiUsage, Communicator, Process, ProcessKey, Snapshot, Source, api_sums::ApiSums,
        by_device::DeviceMemory, probing::LaunchProbes,
    },
    tui::{
        app::Model,
        gpu_time::{GpuTime, Timing, gpu_time},
        rows::{Limit, RowId, container_label, container_row, short_key},
    },
    units::{bytes, nanos},
};

/// APIs of several processes added up per (API, source), the busiest first.
fn merge(procs: &[&Process]) -> Vec<ApiUsage> {
    let mut v = ApiSums::effective_of(procs).into_rows();
    v.sort_by(|a, b| b.calls.cmp(&a.calls).then(a.api.cmp(&b.api)));
    v
}

/// A count, `~`-prefixed where it is an estimate.
fn estimated(n: u64, estimate: bool) -> String {
    if estimate {
        format!("~{n}")
    } else {
        n.to_string()
    }
}

/// The histogram between its first and last non-empty buckets, with the range it covers.
fn histogram(a: &ApiUsage, width: usize) -> String {
    let first = a.hist.iter().position(|n| *n > 0);
    let last = a.hist.iter().rposition(|n| *n > 0);
    let (Some(f), Some(l)) = (first, last) else {
        return String::new();
    };
    let range = format!(
        " {}–{}",
        nanos(bucket_lower_ns(f)),
        nanos(bucket_upper_ns(l))
    );
    let bars = spark(
        &a.hist[f..=l],
        width.saturating_sub(range.chars().count()),
        None,
    );
    format!("{bars}{range}")
}

/// The per-API table; narrow terminals leave out errors and denials (the facts above say them).
fn api_table<'a>(apis: &[ApiUsage], width: u16, t: &Theme) -> Table<'a> {
    let wide = width >= 120;
    let mut cols: Vec<(&str, u16)> = vec![("API", 16), ("SOURCE", 7), ("CALLS", 9)];
    if wide {
        cols.extend([("ERR", 5), ("DENIED", 6)]);
    }
    cols.extend([("P50", 8), ("P99", 8), ("HOOK/CALL", 9)]);
    let fixed: u16 = cols.iter().map(|c| c.1 + 1).sum();
    let hist_width = width.saturating_sub(fixed).max(8);
    cols.push(("HISTOGRAM", hist_width));
    let header = Row::new(cols.iter().map(|c| Cell::from(c.0))).style(t.heading());
    let rows: Vec<Row> = apis
        .iter()
        .map(|a| {
            let q = |p| a.quantile_ns(p).map(nanos).unwrap_or_else(|| "-".into());
            let hook = if a.source == Source::Limiter && a.calls > 0 {
                nanos(a.hook_ns / a.calls)
            } else {
                "-".into()
            };
            let mut cells = vec![
                Cell::from(a.api.clone()),
                Cell::from(match a.source {
                    Source::Probes => "probes",
                    Source::Limiter => "limiter",
                }),
                // `~`: estimated from the calls a probe budget sampled.
                Cell::from(format!("{:>9}", estimated(a.calls, a.is_estimated()))),
            ];
            if wide {
                cells.push(Cell::from(format!("{:>5}", a.errors)));
                cells.push(Cell::from(Span::styled(
                    format!("{:>6}", a.denied),
                    if a.denied > 0 { t.bad() } else { t.dim() },
                )));
            }
            cells.extend([
                Cell::from(format!("{:>8}", q(0.5))),
                Cell::from(format!("{:>8}", q(0.99))),
                Cell::from(format!("{hook:>9}")),
                Cell::from(Span::styled(histogram(a, hist_width as usize), t.good())),
            ]);
            Row::new(cells)
        })
        .collect();
    let widths: Vec<Constraint> = cols
        .iter()
        .enumerate()
        .map(|(i, c)| {
            if i == 0 {
                Constraint::Min(c.1)
            } else {
                Constraint::Length(c.1)
            }
        })
        .collect();
    Table::new(rows, widths).header(header).column_spacing(1)
}

/// The probe mode and what it cost the processes shown.
fn probe_lines(s: &Snapshot, apis: &[ApiUsage], t: &Theme) -> Vec<Line<'static>> {
    let a = &s.agent;
    let mode = match (&a.probes_unavailable, a.launch_probes) {
        (Some(why), _) => {
            return vec![Line::from(Span::styled(
                format!("probes off: {why}"),
                t.warn(),
            ))];
        }
        (None, LaunchProbes::On) => "full (launches probed)".to_string(),
        (None, LaunchProbes::Budget) => format!(
            "launches under the probe budget ({:.0}s probed so far)",
            a.launch_probe_seconds
        ),
        (None, LaunchProbes::Sampled { window, period }) => format!(
            "sampled (launches probed {} of every {}, {:.0}s so far)",
            format_interval(window),
            format_interval(period),
            a.launch_probe_seconds
        ),
        (None, LaunchProbes::Off) => "launches off (the limiter counts them)".to_string(),
    };
    let probed: u64 = apis
        .iter()
        .filter(|u| u.source == Source::Probes)
        .map(|u| u.calls)
        .sum();
    let cost = match &a.probe_cost {
        Some(c) => format!(
            "{} per probed call; {} probed calls here cost about {}",
            nanos(c.per_hit_ns as u64),
            probed,
            nanos((c.per_hit_ns * probed as f64) as u64)
        ),
        None => format!("{probed} probed calls here (cost not measured: --no-calibrate)"),
    };
    vec![Line::from(vec![
        Span::styled("probes ", t.key()),
        Span::raw(format!("{mode}; {cost}")),
    ])]
}

/// What NVML says about these processes' use of each device in the latest window.
fn gpu_use_line(s: &Snapshot, keys: &[ProcessKey], t: &Theme) -> Line<'static> {
    let m = s.gpu_use_of(keys);
    let mut spans = vec![Span::styled("GPU use  ", t.key())];
    if m.devices.is_empty() && m.unavailable.is_empty() {
        let why = if s.gpus.is_empty() {
            "no NVML: not measured"
        } else {
            "not measured yet (NVML's per-process samples need two readings)"
        };
        spans.push(Span::styled(why, t.dim()));
        return Line::from(spans);
    }
    let mut parts: Vec<String> = m
        .devices
        .iter()
        .map(|d| {
            let over = d
                .window
                .map(|w| format!(" over {:.1}s", w.micros() as f64 / 1e6))
                .unwrap_or_default();
            format!(
                "GPU{} SM {:.0}%, memory bandwidth {:.0}%{over}",
                d.device, d.sm_util_pct, d.mem_util_pct
            )
        })
        .collect();
    parts.extend(
        m.unavailable
            .iter()
            .map(|(d, why)| format!("GPU{d} n/a (per-process utilisation {why})")),
    );
    spans.push(Span::raw(parts.join("; ")));
    Line::from(spans)
}

/// Memory per device, where there is more than one device (one device: the memory line says it).
fn memory_by_device_line(by: &[DeviceMemory], t: &Theme) -> Option<Line<'static>> {
    if by.len() < 2 {
        return None;
    }
    // The limiter's figure first, NVML's beside it: `GPU0 6.00 GiB (nvml 6.02 GiB)`.
    let parts: Vec<String> = by
        .iter()
        .map(|d| match (d.limiter, d.nvml) {
            (Some(l), Some(n)) => format!("GPU{} {} (nvml {})", d.device, bytes(l), bytes(n)),
            (Some(l), None) => format!("GPU{} {}", d.device, bytes(l)),
            (None, n) => format!(
                "GPU{} nvml {}",
                d.device,
                n.map(bytes).unwrap_or("-".into())
            ),
        })
        .collect();
    Some(Line::from(vec![
        Span::styled("memory by GPU  ", t.key()),
        Span::raw(parts.join("; ")),
    ]))
}

fn rank_of(c: &Communicator) -> String {
    let num = |v: Option<u32>| v.map(|v| v.to_string()).unwrap_or("?".into());
    format!("rank {}/{}", num(c.rank), num(c.nranks))
}

/// The NCCL communicators of these processes: per communicator (one NCCL communicator id), a
/// line, then a line per rank held here.
fn communicator_lines(s: &Snapshot, keys: &[ProcessKey], t: &Theme) -> Vec<Line<'static>> {
    let mut out = Vec::new();
    for g in s.communicator_groups(keys) {
        let head = match g.comm_id {
            Some(id) => format!(
                "commId {id}: {} rank{}{} here, {} calls, {}",
                g.ranks.len(),
                if g.ranks.len() == 1 { "" } else { "s" },
                g.nranks.map(|n| format!(" of {n}")).unwrap_or_default(),
                g.calls(),
                bytes(g.bytes())
            ),
            None => "no commId seen (created before the probes, or by ncclCommInitAll)".into(),
        };
        out.push(Line::from(vec![
            Span::styled("nccl  ", t.key()),
            Span::raw(head),
        ]));
        for r in &g.ranks {
            out.push(Line::from(format!(
                "  {} pid {} comm {}: {} calls, {}",
                rank_of(r.communicator),
                r.process.pid,
                r.communicator.comm,
                r.communicator.calls,
                bytes(r.communicator.bytes)
            )));
        }
    }
    out
}

fn series_line(
    what: &str,
    series: Option<&crate::tui::history::Series>,
    width: usize,
    max: impl Fn(u64) -> String,
    scale: Option<u64>,
    t: &Theme,
) -> Line<'static> {
    let Some(s) = series.filter(|s| !s.is_empty()) else {
        return Line::from(Span::styled(format!("{what}: no samples yet"), t.dim()));
    };
    let w = width.saturating_sub(30).max(8);
    Line::from(vec![
        Span::styled(format!("{what} "), t.key()),
        Span::styled(spark(&s.last(w), w, scale), t.good()),
        Span::raw(format!(" max {}", max(s.max()))),
    ])
}

fn process_facts(p: &Process, s: &Snapshot, t: &Theme) -> Vec<Line<'static>> {
    let mut out = vec![
        Line::from(vec![
            Span::styled(format!("process {} ", p.key.pid), t.title()),
            Span::raw(format!(
                "{}{}",
                p.comm,
                if p.alive { "" } else { " (exited)" }
            )),
        ]),
        Line::from(format!("command  {}", p.cmdline)),
    ];
    let container = s
        .containers
        .iter()
        .find(|c| c.key == p.container)
        .map(container_label)
        .unwrap_or_else(|| short_key(&p.container));
    out.push(Line::from(format!("container  {container}")));
    let m = &p.memory;
    let view = |name: &str, v: Option<u64>| v.map(|b| format!("{name} {}", bytes(b)));
    let views: Vec<String> = [
        view("limiter", m.limiter),
        view("probes", m.probes),
        view("nvml", m.nvml),
    ]
    .into_iter()
    .flatten()
    .collect();
    let mut mem = vec![Span::raw(format!("memory  {}", views.join(", ")))];
    if let Some(d) = &m.drift {
        mem.push(Span::styled(
            format!("  DRIFT {} between {}", bytes(d.bytes), d.between),
            t.bad(),
        ));
    }
    out.push(Line::from(mem));
    let l = &p.probe_losses;
    if !l.is_empty() {
        out.push(Line::from(Span::styled(
            format!(
                "probes INCOMPLETE  {} allocation(s) ({}) untracked, {} call(s) not counted, {} row(s) reset",
                l.allocations_untracked,
                bytes(l.bytes_untracked),
                l.calls_unaggregated,
                l.rows_reset
            ),
            t.bad(),
        )));
    }
    out.extend(memory_by_device_line(&p.memory_by_device(), t));
    out.push(gpu_use_line(s, &[p.key], t));
    if let Some(l) = &p.limiter {
        out.push(Line::from(format!(
            "limiter  slot {} held {} (context {}), throttled {}, dropped records {}{}",
            l.slot,
            bytes(l.held.iter().sum()),
            bytes(l.context_bytes.iter().sum()),
            nanos(l.throttled_ns),
            l.dropped_records,
            if l.shard_problems.is_empty() {
                String::new()
            } else {
                format!(", problems: {}", l.shard_problems.join("; "))
            }
        )));
    } else {
        out.push(Line::from(Span::styled(
            "limiter  not loaded in this process",
            t.dim(),
        )));
    }
    for c in &p.communicators {
        out.push(Line::from(format!(
            "nccl  comm {} {}{}: {} calls, {}{}",
            c.comm,
            rank_of(c),
            c.comm_id
                .as_deref()
                .map(|id| format!(" commId {id}"))
                .unwrap_or_default(),
            c.calls,
            bytes(c.bytes),
            if c.destroyed { " (destroyed)" } else { "" }
        )));
    }
    out
}

fn container_facts<'s>(
    s: &'s Snapshot,
    key: &str,
    t: &Theme,
) -> Option<(Vec<Line<'static>>, Vec<&'s Process>)> {
    let c = s.containers.iter().find(|c| c.key == key)?;
    let row = container_row(s, c);
    let procs: Vec<&Process> = c.processes.iter().filter_map(|k| s.process(*k)).collect();
    let mut out = vec![Line::from(vec![
        Span::styled("container ", t.title()),
        Span::raw(container_label(c)),
    ])];
    let mut ids = vec![format!("id {}", c.key)];
    if let Some(r) = &c.runtime {
        ids.push(format!("runtime {r}"));
    }
    if let Some(u) = &c.pod_uid {
        ids.push(format!("pod uid {u}"));
    }
    if let Some(q) = &c.qos {
        ids.push(format!("qos {q}"));
    }
    out.push(Line::from(ids.join("  ")));
    let pids: Vec<String> = procs.iter().map(|p| p.key.pid.to_string()).collect();
    let used = row.figures.memory.map(bytes).unwrap_or("-".into());
    let limit = match row.limit {
        Limit::None => "no limiter region".to_string(),
        Limit::Unlimited => "unlimited".to_string(),
        Limit::Bytes(b) => format!("limit {}", bytes(b)),
    };
    out.push(Line::from(format!(
        "processes {}  memory {used} ({limit}), denied {}",
        if pids.is_empty() {
            "none".into()
        } else {
            pids.join(" ")
        },
        row.figures.denied
    )));
    out.extend(memory_by_device_line(&s.memory_by_device(&c.processes), t));
    out.push(gpu_use_line(s, &c.processes, t));
    out.extend(communicator_lines(s, &c.processes, t));
    for r in &c.regions {
        let devs: Vec<String> = r
            .devices
            .iter()
            .map(|d| {
                format!(
                    "GPU{} {} of {}{}",
                    d.index,
                    bytes(d.reserved),
                    if d.memory_limit == 0 {
                        "unlimited".into()
                    } else {
                        bytes(d.memory_limit)
                    },
                    d.context_charge
                        .map(|c| format!(" (context {} per process)", bytes(c)))
                        .unwrap_or_default()
                )
            })
            .collect();
        out.push(Line::from(format!(
            "region {} ({}): {}; read retries {}",
            r.path,
            r.format,
            devs.join(", "),
            r.read_retries
        )));
        for d in r.devices.iter().filter(|d| d.limit_below_context()) {
            out.push(Line::from(Span::styled(
                format!(
                    "  warning: GPU{}'s limit {} is below one process's context charge ({}): \
                     every allocation is denied",
                    d.index,
                    bytes(d.memory_limit),
                    bytes(d.context_charge.unwrap_or(0))
                ),
                t.bad(),
            )));
            out.push(Line::from(Span::styled(
                "  set CUDA_DEVICE_MEMORY_LIMIT above the charge plus what the application needs \
                 (VGPU_CONTEXT_BYTES sets the charge)",
                t.bad(),
            )));
        }
        for p in &r.problems {
            out.push(Line::from(Span::styled(format!("  problem: {p}"), t.bad())));
        }
        if let Some(w) = &r.writable_by_others {
            out.push(Line::from(Span::styled(
                format!("  writable by other uids: {w}"),
                t.warn(),
            )));
        }
    }
    Some((out, procs))
}

pub fn render(frame: &mut Frame, area: Rect, model: &Model, id: &RowId, t: &Theme) {
    let Some(s) = &model.snapshot else {
        return;
    };
    let h = &model.history;
    let found = match id {
        RowId::Container(k) => container_facts(s, k, t)
            .map(|(lines, procs)| (lines, procs, h.containers.get(k), h.container_sm.get(k))),
        RowId::Process(k) => s.process(*k).map(|p| {
            (
                process_facts(p, s, t),
                vec![p],
                h.processes.get(k),
                h.process_sm.get(k),
            )
        }),
    };
    let Some((mut lines, procs, memory, sm)) = found else {
        frame.render_widget(
            Paragraph::new("this row has left the model (Esc goes back)").style(t.dim()),
            area,
        );
        return;
    };
    let apis = merge(&procs);
    let width = area.width as usize;
    lines.push(series_line(
        "memory over time",
        memory,
        width,
        short_bytes,
        None,
        t,
    ));
    if !s.gpus.is_empty() {
        lines.push(series_line(
            "SM over time",
            sm,
            width,
            |v| format!("{v}%"),
            Some(100),
            t,
        ));
    }
    lines.extend(probe_lines(s, &apis, t));
    let table = render_facts(frame, area, lines, t);
    if apis.is_empty() {
        frame.render_widget(
            Paragraph::new("no CUDA API calls seen").style(t.dim()),
            table,
        );
        return;
    }
    frame.render_widget(api_table(&apis, area.width, t), table);
}

/// Processes listed one per line in a container's GPU-time view before the rest are counted.
const GPU_TIME_PROCESSES: usize = 4;

/// `34%`, or `-` where not measured.
fn share(r: Option<f64>) -> String {
    r.map(|r| format!("{:.0}%", r * 100.0))
        .unwrap_or_else(|| "-".into())
}

/// Each GPU's busy share by source: the limiter's timing beside NVML's samples.
fn busy_lines(g: &GpuTime, t: &Theme) -> Vec<Line<'static>> {
    if g.devices.is_empty() {
        return vec![Line::from(Span::styled(
            "GPU0  no GPU figure: neither the limiter nor NVML measured these processes",
            t.dim(),
        ))];
    }
    g.devices
        .iter()
        .map(|d| {
            let mut spans = vec![Span::styled(format!("GPU{}  ", d.device), t.key())];
            if d.limiter.is_some() || d.samples > 0 {
                spans.push(Span::styled(
                    format!("limiter {}", share(d.limiter)),
                    t.good(),
                ));
                spans.push(Span::raw(format!(" ({} samples)  ", d.samples)));
            }
            match (&d.nvml, &d.nvml_unavailable) {
                (Some(n), _) => spans.push(Span::raw(format!("nvml {}", share(Some(*n))))),
                (None, Some(why)) => spans.push(Span::styled(
                    format!("nvml n/a (per-process utilisation {why})"),
                    t.dim(),
                )),
                (None, None) => spans.push(Span::styled("nvml -", t.dim())),
            }
            if d.limiter.is_none() && d.samples == 0 && d.nvml.is_some() {
                spans.push(Span::styled(" (NVML-sampled)", t.dim()));
            }
            Line::from(spans)
        })
        .collect()
}

/// How far the limiter's timing covers the processes, and each process's figures (a
/// container's, the first few).
fn coverage_lines(g: &GpuTime, container: bool, t: &Theme) -> Vec<Line<'static>> {
    let mut out = Vec::new();
    let n = g.processes.len();
    let timed = g.timed();
    let style = if g.timing() == Timing::Timed {
        t.good()
    } else {
        t.warn()
    };
    let said: Vec<String> = match g.timing() {
        Timing::Timed if timed == n => vec![
            format!(
                "timed by the limiter: {}",
                if container {
                    format!("all {n} processes")
                } else {
                    "this process".into()
                }
            ),
            "limiter: launches timed inside the processes, each tenant's own".into(),
            "nvml: SM samples, which on a shared GPU go to whichever process runs".into(),
        ],
        Timing::Timed => vec![
            format!("timed by the limiter: {timed} of {n} processes (the others: NVML's alone)"),
            "limiter: launches timed inside the processes, each tenant's own".into(),
            "nvml: SM samples, which on a shared GPU go to whichever process runs".into(),
        ],
        Timing::NoRecords => vec![
            "the limiter is loaded but timed no launch: the figure is NVML-sampled".into(),
            "(none yet, VGPU_GPU_TIME_SAMPLE=0, or a region without them: HAMi-core's)".into(),
            "on a shared GPU NVML's samples go to whichever process runs".into(),
        ],
        Timing::NoLimiter => vec![
            "not under the limiter: the figure is NVML-sampled, and kernels need the limiter"
                .into(),
            "on a shared GPU NVML's samples go to whichever process runs".into(),
        ],
    };
    for (i, line) in said.into_iter().enumerate() {
        out.push(Line::from(Span::styled(
            line,
            if i == 0 { style } else { t.dim() },
        )));
    }
    if g.sample_errors > 0 || g.samples_skipped > 0 {
        out.push(Line::from(Span::styled(
            format!(
                "samples: {} failed, {} not taken",
                g.sample_errors, g.samples_skipped
            ),
            t.warn(),
        )));
    }
    if container && n > 1 {
        for p in g.processes.iter().take(GPU_TIME_PROCESSES) {
            let limiter = match p.timing {
                Timing::Timed => format!("limiter {}", share(p.limiter)),
                Timing::NoRecords => "limiter: no record".into(),
                Timing::NoLimiter => "no limiter".into(),
            };
            out.push(Line::from(format!(
                "  {} {}  {limiter}  nvml {}",
                p.key.pid,
                p.comm,
                share(p.nvml)
            )));
        }
        if n > GPU_TIME_PROCESSES {
            out.push(Line::from(Span::styled(
                format!("  and {} more", n - GPU_TIME_PROCESSES),
                t.dim(),
            )));
        }
    }
    out
}

/// The top kernels: name, share of the timed GPU time, GPU time, launches and mean time per
/// launch, at most `rows` of them.
fn kernel_table<'a>(kernels: &[KernelShare], width: u16, rows: usize, t: &Theme) -> Table<'a> {
    let cols: [(&str, u16); 5] = [
        ("SHARE", 6),
        ("GPU TIME", 9),
        ("CALLS", 9),
        ("MEAN", 9),
        ("SAMPLES", 8),
    ];
    let fixed: u16 = cols.iter().map(|c| c.1 + 1).sum();
    let name_w = width.saturating_sub(fixed).max(12);
    let mut header = vec![Cell::from("KERNEL")];
    header.extend(
        cols.iter()
            .map(|(c, w)| Cell::from(format!("{c:>w$}", w = *w as usize))),
    );
    // Cut to the rows there are, the last saying how many more a taller terminal shows.
    let shown = if kernels.len() > rows {
        rows.saturating_sub(1)
    } else {
        kernels.len()
    };
    let mut body: Vec<Row> = kernels
        .iter()
        .take(shown)
        .map(|k| {
            let ns = (k.gpu_seconds * 1e9) as u64;
            let mean = ns
                .checked_div(k.launches)
                .map(nanos)
                .unwrap_or_else(|| "-".into());
            Row::new(vec![
                Cell::from(fit(&k.name, name_w as usize)),
                Cell::from(format!("{:>6}", format!("{:.0}%", k.share * 100.0))),
                Cell::from(format!("{:>9}", nanos(ns))),
                Cell::from(format!("{:>9}", rate(k.launches as f64))),
                Cell::from(format!("{mean:>9}")),
                Cell::from(format!("{:>8}", k.samples)),
            ])
        })
        .collect();
    if shown < kernels.len() && rows > 0 {
        body.push(Row::new(vec![Cell::from(Span::styled(
            format!("{} more kernels (taller screen)", kernels.len() - shown),
            t.dim(),
        ))]));
    }
    let mut widths = vec![Constraint::Min(name_w)];
    widths.extend(cols.iter().map(|c| Constraint::Length(c.1)));
    Table::new(body, widths)
        .header(Row::new(header).style(t.heading()))
        .column_spacing(1)
}

/// The GPU-time view of a container or a process: each GPU's busy share by source (the
/// limiter's timing, NVML's samples), how far the limiter's timing covers the processes, and
/// the top kernels by GPU time since each process started.
/// Draws a detail view's facts at the top of `area` (each line cut to its width, `Esc back`
/// under them); returns the area left below for its table.
fn render_facts(frame: &mut Frame, area: Rect, lines: Vec<Line>, t: &Theme) -> Rect {
    // Every line fits in 80 columns; narrower terminals cut them.
    let lines: Vec<Line> = lines
        .into_iter()
        .map(|l| {
            let text: String = l.spans.iter().map(|s| s.content.as_ref()).collect();
            if text.chars().count() > area.width as usize {
                Line::from(fit(&text, area.width as usize)).style(l.style)
            } else {
                l
            }
        })
        .collect();
    let [facts, table] = Layout::vertical([
        Constraint::Length(lines.len() as u16 + 1),
        Constraint::Min(0),
    ])
    .areas(area);
    frame.render_widget(
        Paragraph::new(lines)
            .block(Block::new().title_bottom(Line::from(Span::styled("Esc back", t.dim())))),
        facts,
    );
    table
}

pub fn render_gpu_time(frame: &mut Frame, area: Rect, model: &Model, id: &RowId, t: &Theme) {
    let Some(s) = &model.snapshot else {
        return;
    };
    let found = match id {
        RowId::Container(k) => s.containers.iter().find(|c| &c.key == k).map(|c| {
            // Named as the table names it: the label, and the short id unless the label has it.
            let label = container_label(c);
            let id = short_key(&c.key);
            let title = if c.key == "host" || label.contains(&id) {
                format!("container {label}")
            } else {
                format!("container {label} {id}")
            };
            (title, c.processes.clone(), true)
        }),
        RowId::Process(k) => s.process(*k).map(|p| {
            (
                format!("process {} {}", p.key.pid, p.comm),
                vec![p.key],
                false,
            )
        }),
    };
    let Some((title, keys, container)) = found else {
        frame.render_widget(
            Paragraph::new("this row has left the model (Esc goes back)").style(t.dim()),
            area,
        );
        return;
    };
    let g = gpu_time(s, &keys);
    let mut lines = vec![
        Line::from(vec![
            Span::styled("GPU time  ", t.title()),
            Span::raw(title),
        ]),
        Line::from(Span::styled(
            "busy share of each GPU over the latest interval, by source:",
            t.dim(),
        )),
    ];
    lines.extend(busy_lines(&g, t));
    if let RowId::Container(k) = id {
        // The container's QoS tier on each GPU where it has one (docs/qos.md).
        let tiers = s
            .containers
            .iter()
            .filter(|c| &c.key == k)
            .flat_map(|c| &c.regions)
            .flat_map(|r| &r.devices)
            .filter_map(|d| Some((d.index, d.qos.as_ref()?.summary())));
        for (index, summary) in tiers {
            lines.push(Line::from(vec![
                Span::styled(format!("QoS GPU{index} "), t.key()),
                Span::raw(summary),
            ]));
        }
    }
    lines.extend(coverage_lines(&g, container, t));
    if !g.kernels.is_empty() {
        lines.push(Line::from(vec![
            Span::styled("kernels ", t.key()),
            Span::raw("by GPU time since each process started (limiter, estimated)"),
        ]));
    }
    let table = render_facts(frame, area, lines, t);
    if !g.kernels.is_empty() {
        let rows = (table.height as usize).saturating_sub(1);
        frame.render_widget(kernel_table(&g.kernels, area.width, rows, t), table);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row a probe budget sampled stays marked estimated when rows are added up, and its
    /// count is shown `~`-prefixed; exact counts are not.
    #[test]
    fn sampled_rows_are_shown_as_estimates() {
        let snap = crate::tui::fixture::snapshot();
        let host = snap.processes.iter().find(|p| p.key.pid == 777).unwrap();
        let merged = merge(&[host]);
        let sync = merged
            .iter()
            .find(|a| a.api == "cuStreamSynchronize")
            .unwrap();
        assert!(sync.is_estimated());
        assert_eq!(sync.probed.map(|p| p.calls), Some(25));
        assert_eq!(estimated(sync.calls, sync.is_estimated()), "~100");
        let alloc = merged.iter().find(|a| a.api == "cuMemAlloc_v2").unwrap();
        assert_eq!(estimated(alloc.calls, alloc.is_estimated()), "64");
    }
}

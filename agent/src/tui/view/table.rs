//! The container table, with each expanded container's processes under it as a tree. Columns
//! that do not fit are left out, least important first; the name column takes the rest.

use ratatui::{
    Frame,
    layout::{Constraint, Rect},
    style::Style,
    text::{Line, Span},
    widgets::{Cell, Paragraph, Row, Table, Wrap},
};

use super::{
    text::{bar, fit, page_rows, percent, rate, short_bytes},
    theme::Theme,
};
use crate::{
    tui::{
        app::{Model, ViewState},
        rows::{
            BusyFigure, BusySource, Figures, Limit, RowKind, SortKey, Util, container_label,
            short_key,
        },
    },
    units::nanos,
};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Col {
    Procs,
    Memory,
    Gpu,
    Allocs,
    Launches,
    P99,
    Sync,
    Nccl,
    Throttled,
    Denied,
    Drift,
}

/// In display order: (column, title, width, importance: 0 is kept longest). Each width leaves
/// room for the sort mark after the title.
const COLUMNS: [(Col, &str, u16, u8); 11] = [
    (Col::Procs, "PROC", 5, 10),
    (Col::Memory, "GPU MEM / LIMIT", 20, 0),
    (Col::Gpu, "GPU%", 5, 1),
    (Col::Allocs, "ALLOC/s", 8, 3),
    (Col::Launches, "LAUNCH/s", 9, 7),
    (Col::P99, "API P99", 8, 2),
    (Col::Sync, "SYNC", 5, 6),
    (Col::Nccl, "NCCL/s", 7, 9),
    (Col::Throttled, "THROTL", 7, 8),
    (Col::Denied, "DENIED", 7, 4),
    (Col::Drift, "DRIFT", 5, 5),
];

const NAME_MIN: u16 = 27;

fn sort_of(c: Col) -> SortKey {
    match c {
        Col::Procs => SortKey::Processes,
        Col::Memory => SortKey::Memory,
        Col::Gpu => SortKey::Gpu,
        Col::Allocs => SortKey::Allocs,
        Col::Launches => SortKey::Launches,
        Col::P99 => SortKey::P99,
        Col::Sync => SortKey::Sync,
        Col::Nccl => SortKey::Nccl,
        Col::Throttled => SortKey::Throttled,
        Col::Denied => SortKey::Denied,
        Col::Drift => SortKey::Name,
    }
}

/// The columns that fit in `width` beside the name, in display order.
fn columns(width: u16) -> Vec<(Col, &'static str, u16)> {
    let mut by_importance: Vec<_> = COLUMNS.iter().collect();
    by_importance.sort_by_key(|c| c.3);
    let mut left = width.saturating_sub(NAME_MIN);
    let mut keep = Vec::new();
    for c in by_importance {
        if c.2 < left {
            left -= c.2 + 1;
            keep.push(c.0);
        }
    }
    COLUMNS
        .iter()
        .filter(|c| keep.contains(&c.0))
        .map(|c| (c.0, c.1, c.2))
        .collect()
}

fn memory_cell(
    f: &Figures,
    limit: Option<Limit>,
    below_context: Option<(u64, u64)>,
    width: usize,
    t: &Theme,
) -> Cell<'static> {
    let used = f.memory.map(short_bytes).unwrap_or_else(|| "-".into());
    if let Some((limit, charge)) = below_context {
        // Nothing can be allocated: say why instead of drawing an empty bar.
        let text = format!("⚠ {} < ctx {}", short_bytes(limit), short_bytes(charge));
        return Cell::from(Span::styled(fit(&text, width), t.bad()));
    }
    match limit {
        Some(Limit::Bytes(l)) => {
            let text = format!("{used}/{}", short_bytes(l));
            let bar_w = width.saturating_sub(text.len() + 1).max(1);
            let u = f.memory.unwrap_or(0);
            let style = if u >= l {
                t.bad()
            } else if u as f64 >= l as f64 * 0.9 {
                t.warn()
            } else {
                t.good()
            };
            Cell::from(Line::from(vec![
                Span::styled(bar(u, l, bar_w), style),
                Span::raw(format!(" {text}")),
            ]))
        }
        Some(Limit::Unlimited) => Cell::from(format!("{used:>5} unlimited")),
        Some(Limit::None) => Cell::from(Line::from(vec![
            Span::raw(format!("{used:>5} ")),
            Span::styled("no limiter", t.dim()),
        ])),
        None => Cell::from(format!("{used:>5}")),
    }
}

/// `45%`, `n/a` (the device gives no per-process utilisation) or `-` (not measured yet).
pub fn util_text(u: Util) -> String {
    match u {
        Util::Pct(v) => format!("{v:.0}%"),
        Util::NotAvailable => "n/a".into(),
        Util::Unknown => "-".into(),
    }
}

/// The GPU% cell: the share with its source, `L` the limiter's timing, `N` NVML's SM samples,
/// `+` both (some processes timed by the limiter, the others sampled by NVML).
fn busy_cell(b: BusyFigure, width: usize, t: &Theme) -> Cell<'static> {
    let mark = match (b.share, b.source) {
        (Util::NotAvailable | Util::Unknown, _) => "",
        (_, BusySource::Limiter) => "L",
        (_, BusySource::Nvml) => "N",
        (_, BusySource::Mixed) => "+",
    };
    let text = util_text(b.share);
    let pad = width.saturating_sub(text.chars().count() + mark.chars().count());
    let mark_style = if b.source == BusySource::Limiter {
        t.good()
    } else {
        t.dim()
    };
    Cell::from(Line::from(vec![
        Span::raw(format!("{}{text}", " ".repeat(pad))),
        Span::styled(mark, mark_style),
    ]))
}

fn figure_cells(
    f: &Figures,
    limit: Option<Limit>,
    below_context: Option<(u64, u64)>,
    cols: &[(Col, &str, u16)],
    t: &Theme,
) -> Vec<Cell<'static>> {
    let opt = |v: Option<f64>, fmt: fn(f64) -> String| v.map(fmt).unwrap_or_else(|| "-".into());
    cols.iter()
        .map(|(c, _, w)| (c, *w as usize))
        .map(|(c, w)| match c {
            Col::Procs => Cell::from(format!("{:>w$}", f.processes)),
            Col::Memory => memory_cell(f, limit, below_context, w, t),
            Col::Gpu => busy_cell(f.busy, w, t),
            Col::Allocs => Cell::from(format!("{:>w$}", opt(f.allocs_per_s, rate))),
            Col::Launches => Cell::from(format!("{:>w$}", opt(f.launches_per_s, rate))),
            Col::P99 => Cell::from(format!(
                "{:>w$}",
                f.p99_ns.map(nanos).unwrap_or_else(|| "-".into())
            )),
            Col::Sync => Cell::from(format!("{:>w$}", opt(f.sync_share, percent))),
            Col::Nccl => Cell::from(format!(
                "{:>w$}",
                match f.nccl_bytes_per_s {
                    Some(b) if b > 0.0 => short_bytes(b as u64),
                    Some(_) => "0".into(),
                    None => "-".into(),
                }
            )),
            Col::Throttled => {
                let s = opt(f.throttled_share, percent);
                let style = if f.throttled_share.unwrap_or(0.0) > 0.0 {
                    t.warn()
                } else {
                    Style::new()
                };
                Cell::from(Span::styled(format!("{s:>w$}"), style))
            }
            Col::Denied => Cell::from(Span::styled(
                format!("{:>w$}", f.denied),
                if f.denied > 0 { t.bad() } else { Style::new() },
            )),
            Col::Drift => match &f.drift {
                Some(_) => Cell::from(Span::styled("DRIFT", t.bad())),
                None => Cell::from(""),
            },
        })
        .collect()
}

pub fn render(frame: &mut Frame, area: Rect, model: &Model, state: &ViewState, t: &Theme) {
    let Some(snap) = &model.snapshot else {
        let text = format!(
            "waiting for the first snapshot from {} …",
            model.source.name
        );
        frame.render_widget(Paragraph::new(text).style(t.dim()), area);
        return;
    };
    let rows = state.rows(model);
    if rows.is_empty() {
        let text = if state.filter.is_empty() {
            let mut lines = vec![
                Line::from(Span::styled("nothing seen yet", t.title())),
                Line::from(
                    "No process has called the CUDA driver or opened a limiter region since the agent started.",
                ),
                Line::from(
                    "GPU processes appear here when they call libcuda (probes) or write a region (--region-dir).",
                ),
            ];
            if let Some(why) = &snap.agent.probes_unavailable {
                lines.push(Line::from(Span::styled(
                    format!("The probes are off: {why}"),
                    t.warn(),
                )));
            }
            lines
        } else {
            vec![Line::from(format!(
                "no container or process matches the filter {:?} (Esc clears it)",
                state.filter
            ))]
        };
        frame.render_widget(Paragraph::new(text).wrap(Wrap { trim: true }), area);
        return;
    }
    let cols = columns(area.width);
    let sort_mark = if state.descending { "▼" } else { "▲" };
    let mut header = vec![Cell::from(format!(
        "CONTAINER / PROCESS{}",
        if state.sort == SortKey::Name {
            sort_mark
        } else {
            ""
        }
    ))];
    header.extend(cols.iter().map(|(c, title, w)| {
        let mark = if sort_of(*c) == state.sort && *c != Col::Drift {
            sort_mark
        } else {
            ""
        };
        let text = format!("{title}{mark}");
        let text = if *c == Col::Memory || *c == Col::Drift {
            text
        } else {
            format!("{text:>w$}", w = *w as usize)
        };
        Cell::from(text)
    }));

    let visible = page_rows(area.height);
    let selected = state.selected_in(&rows).unwrap_or(0);
    let offset = selected.saturating_sub(visible.saturating_sub(1));
    let name_width = (area.width as usize)
        .saturating_sub(cols.iter().map(|c| c.2 as usize + 1).sum())
        .max(NAME_MIN as usize);
    let table_rows: Vec<Row> = rows
        .iter()
        .enumerate()
        .skip(offset)
        .take(visible)
        .map(|(i, r)| {
            let mut row = match &r.kind {
                RowKind::Container { row, expanded } => {
                    let c = row.container;
                    let label = container_label(c);
                    let id = if c.key == "host" || label.contains(&short_key(&c.key)) {
                        String::new()
                    } else {
                        format!(" {}", short_key(&c.key))
                    };
                    let mark = if *expanded { "▾ " } else { "▸ " };
                    let frozen = match &c.frozen {
                        Some(f) if f.in_process => " (frozen, in-process)",
                        Some(_) => " (frozen)",
                        None => "",
                    };
                    let name = fit(&format!("{mark}{label}{frozen}{id}"), name_width);
                    let mut cells = vec![Cell::from(name)];
                    cells.extend(figure_cells(
                        &row.figures,
                        Some(row.limit),
                        row.limit_below_context,
                        &cols,
                        t,
                    ));
                    Row::new(cells).style(Style::new())
                }
                RowKind::Process {
                    process,
                    figures,
                    last,
                } => {
                    let corner = if *last { " └ " } else { " ├ " };
                    let dead = if process.alive { "" } else { " (exited)" };
                    // Beside the pid, where a long command line cannot cut it off.
                    let waits = if process
                        .limiter
                        .as_ref()
                        .is_some_and(|l| l.waiting_for_memory.is_some())
                    {
                        " (waits for memory)"
                    } else {
                        ""
                    };
                    let cmd = if process.cmdline.is_empty() {
                        &process.comm
                    } else {
                        &process.cmdline
                    };
                    let name = fit(
                        &format!("{corner}{}{waits} {cmd}{dead}", process.key.pid),
                        name_width,
                    );
                    let mut cells = vec![Cell::from(name)];
                    cells.extend(figure_cells(figures, None, None, &cols, t));
                    Row::new(cells)
                }
            };
            if i == selected {
                row = row.style(t.selected());
            }
            row
        })
        .collect();
    let mut widths = vec![Constraint::Min(NAME_MIN)];
    widths.extend(cols.iter().map(|c| Constraint::Length(c.2)));
    let table = Table::new(table_rows, widths)
        .header(Row::new(header).style(t.heading()))
        .column_spacing(1);
    frame.render_widget(table, area);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn narrow_terminals_keep_the_important_columns() {
        let narrow: Vec<Col> = columns(80).iter().map(|c| c.0).collect();
        assert!(narrow.contains(&Col::Memory) && narrow.contains(&Col::P99));
        assert!(narrow.contains(&Col::Gpu), "who uses the GPU: {narrow:?}");
        assert!(!narrow.contains(&Col::Nccl), "{narrow:?}");
        let wide = columns(160);
        assert_eq!(wide.len(), COLUMNS.len(), "everything fits in 160 columns");
        let used: u16 = columns(80).iter().map(|c| c.2 + 1).sum();
        assert!(used + NAME_MIN <= 80);
        assert!(columns(10).is_empty());
    }
}

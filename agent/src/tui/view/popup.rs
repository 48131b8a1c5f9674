//! The footer (key hints, the filter prompt, feedback) and the dialogs drawn over the rest: help
//! and the signal confirmation.

use ratatui::{
    Frame,
    layout::{Constraint, Flex, Layout, Rect},
    text::{Line, Span},
    widgets::{Block, Clear, Paragraph, Wrap},
};

use super::theme::Theme;
use crate::tui::{
    app::{Confirm, Screen, ViewState},
    input::HELP,
    rows::SortKey,
};

fn sort_name(k: SortKey) -> &'static str {
    match k {
        SortKey::Name => "name",
        SortKey::Processes => "processes",
        SortKey::Memory => "memory",
        SortKey::Gpu => "gpu%",
        SortKey::Allocs => "allocs/s",
        SortKey::Launches => "launches/s",
        SortKey::P99 => "p99",
        SortKey::Sync => "sync",
        SortKey::Nccl => "nccl/s",
        SortKey::Throttled => "throttled",
        SortKey::Denied => "denied",
    }
}

pub fn footer(frame: &mut Frame, area: Rect, state: &ViewState, t: &Theme) {
    let line = if state.filter_editing {
        Line::from(vec![
            Span::styled("filter: ", t.key()),
            Span::raw(format!("{}█", state.filter)),
            Span::styled("  Enter keep  Esc clear", t.dim()),
        ])
    } else if let Some(s) = &state.status {
        Line::from(Span::styled(s.clone(), t.warn()))
    } else {
        let mut spans = Vec::new();
        let hints: &[(&str, &str)] = match state.screen {
            Screen::Table => &[
                ("Enter", "open"),
                ("/", "filter"),
                ("t", "tree"),
                ("K", "kill"),
                ("p", "pause"),
                ("?", "help"),
                ("q", "quit"),
            ],
            Screen::Detail(_) => &[
                ("Esc", "back"),
                ("u", "gpu time"),
                ("K", "signal"),
                ("?", "help"),
                ("q", "quit"),
            ],
            Screen::GpuTime(_) => &[
                ("Esc", "back"),
                ("K", "signal"),
                ("?", "help"),
                ("q", "quit"),
            ],
        };
        for (k, what) in hints {
            spans.push(Span::styled(*k, t.key()));
            spans.push(Span::raw(format!(" {what}  ")));
        }
        // Where there is room: what the header's counters mean is one key away.
        if area.width >= 100 {
            if state.screen == Screen::Table {
                spans.push(Span::styled("u", t.key()));
                spans.push(Span::raw(" gpu time  "));
            }
            spans.push(Span::styled("e", t.key()));
            spans.push(Span::raw(" lost/errors  "));
        }
        spans.push(Span::styled("s", t.key()));
        spans.push(Span::raw(format!(
            " sort:{}{}",
            sort_name(state.sort),
            if state.descending { "▼" } else { "▲" }
        )));
        if !state.filter.is_empty() {
            spans.push(Span::styled(
                format!("  filter: {}", state.filter),
                t.warn(),
            ));
        }
        Line::from(spans)
    };
    frame.render_widget(Paragraph::new(line), area);
}

pub(super) fn centered(area: Rect, width: u16, height: u16) -> Rect {
    let [v] = Layout::vertical([Constraint::Length(height.min(area.height))])
        .flex(Flex::Center)
        .areas(area);
    let [h] = Layout::horizontal([Constraint::Length(width.min(area.width))])
        .flex(Flex::Center)
        .areas(v);
    h
}

const COLUMNS_HELP: &[(&str, &str)] = &[
    (
        "GPU MEM / LIMIT",
        "used (limiter, NVML or probes) vs the region's limit",
    ),
    (
        "⚠ 512M < ctx 544M",
        "limit below one process's context charge: all denied",
    ),
    (
        "GPU%",
        "busy share: L limiter-timed, N NVML-sampled, + both",
    ),
    (
        "ALLOC/s LAUNCH/s",
        "allocations, kernel launches per second",
    ),
    (
        "API P99 SYNC",
        "p99 latency of CUDA calls; share blocked in sync",
    ),
    (
        "THROTL DENIED",
        "share throttled / allocations denied by the limiter",
    ),
    (
        "NCCL/s DRIFT",
        "NCCL bytes/s; memory views (limiter, probes, NVML) differ",
    ),
    (
        "lost errors",
        "header counters: e says what they count and lists them",
    ),
];

pub fn help(frame: &mut Frame, t: &Theme) {
    let area = centered(frame.area(), 80, 24);
    let key_w = 18;
    let mut lines: Vec<Line> = HELP
        .iter()
        .map(|(k, what)| {
            Line::from(vec![
                Span::styled(format!("{k:<key_w$}"), t.key()),
                Span::raw(*what),
            ])
        })
        .collect();
    lines.push(Line::from(""));
    for (c, what) in COLUMNS_HELP {
        lines.push(Line::from(vec![
            Span::styled(format!("{c:<key_w$}"), t.title()),
            Span::raw(*what),
        ]));
    }
    frame.render_widget(Clear, area);
    frame.render_widget(
        Paragraph::new(lines)
            .wrap(Wrap { trim: false })
            .block(Block::bordered().title(" help: any key closes ")),
        area,
    );
}

pub fn confirm(frame: &mut Frame, c: &Confirm, t: &Theme) {
    let area = centered(frame.area(), 60, 6);
    let lines = vec![
        Line::from(format!("Send SIGTERM to process {}?", c.label)),
        Line::from(""),
        Line::from(vec![
            Span::styled("Enter/y", t.key()),
            Span::raw(" SIGTERM   "),
            Span::styled("9", t.key()),
            Span::raw(" SIGKILL   "),
            Span::styled("Esc/n", t.key()),
            Span::raw(" cancel"),
        ]),
    ];
    frame.render_widget(Clear, area);
    frame.render_widget(
        Paragraph::new(lines)
            .wrap(Wrap { trim: true })
            .block(Block::bordered().title(" signal ").border_style(t.bad())),
        area,
    );
}

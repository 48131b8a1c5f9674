//! What the header's `lost`, `skipped` and `errors` count, and each of them (the `e` dialog):
//! lost or unmatched probe events by cause, with what each cause means; what each tenant made the
//! agent skip (libraries not attached, warnings not kept, processes whose maps were deferred or
//! whose read blocks); regions that could not be read and the agent's warnings, in full.

use agent_common::maps::Health;
use ratatui::{
    Frame,
    text::{Line, Span},
    widgets::{Block, Clear, Paragraph, Wrap},
};

use super::{popup::centered, theme::Theme};
use crate::{model::Snapshot, tui::app::Model};

/// What one lost event of each cause means (`agent_common::maps::Health`).
fn meaning(cause: &str) -> &'static str {
    match cause {
        c if c == Health::InflightDropped.name() => {
            "an entry probe could not store its in-flight record (map full): the call was not timed"
        }
        c if c == Health::ReturnWithoutEntry.name() => {
            "a call returned whose start the probes did not see (it began before they attached)"
        }
        c if c == Health::AllocTableFull.name() => {
            "the allocation table was full: the allocation is counted, not tracked as live memory"
        }
        c if c == Health::StatsDropped.name() => {
            "a per-API row could not be created (map full): the call was not counted"
        }
        c if c == Health::FreeUnknown.name() => {
            "a free of memory the probes did not see allocated (allocated before the agent \
             started, or a failed free)"
        }
        c if c == Health::UserReadFailed.name() => {
            "an out-pointer or stack argument could not be read"
        }
        c if c == Health::NcclUnknownDatatype.name() => {
            "an NCCL call named a datatype NCCL 2.28 does not define: counted with 0 bytes"
        }
        c if c == Health::NcclDropped.name() => {
            "an NCCL row or communicator could not be stored (map full)"
        }
        c if c == Health::RingFull.name() => {
            "a sampled call's span was lost: the span ring buffer was full"
        }
        c if c == Health::AllocQuota.name() => {
            "an allocation past its process's share of the allocation table: counted, not \
             tracked as live memory (the process is marked incomplete)"
        }
        c if c == Health::RowQuota.name() => {
            "a call whose new per-API row its cgroup had no room for (row quota): not counted \
             (the process is marked incomplete)"
        }
        _ => "lost or unmatched probe events",
    }
}

/// The regions that could not be read (their reason), the agent's warnings and what tenants
/// claimed that was not believed: what the header's `errors` counts.
pub fn errors(s: &Snapshot) -> Vec<String> {
    let mut out: Vec<String> = s
        .containers
        .iter()
        .flat_map(|c| &c.regions)
        .filter(|r| r.devices.is_empty() && !r.problems.is_empty())
        .map(|r| format!("region {}: {}", r.path, r.problems.join("; ")))
        .collect();
    out.extend(s.agent.warnings.iter().map(|w| format!("warning: {w}")));
    out.extend(
        s.agent
            .claims_refused
            .iter()
            .map(|c| format!("not believed: {c}")),
    );
    out.extend(
        s.agent
            .region_listing_cuts
            .iter()
            .map(crate::model::RegionListingCut::line),
    );
    out
}

fn lines(s: &Snapshot, t: &Theme) -> Vec<Line<'static>> {
    let a = &s.agent;
    let lost: u64 = a.events_lost.values().sum();
    let mut out = vec![Line::from(vec![
        Span::styled(format!("lost {lost}"), t.key()),
        Span::raw(
            "  probe events lost or unmatched since the probes attached, by cause \
             (calls at the edges of sampled launch windows are not counted):",
        ),
    ])];
    let mut causes: Vec<(&String, &u64)> = a.events_lost.iter().filter(|(_, n)| **n > 0).collect();
    causes.sort_by(|x, y| y.1.cmp(x.1));
    if causes.is_empty() {
        out.push(Line::from(Span::styled("  none", t.good())));
    }
    for (cause, n) in causes {
        out.push(Line::from(vec![
            Span::styled(format!("  {cause} {n}: "), t.warn()),
            Span::raw(meaning(cause)),
        ]));
    }
    out.push(Line::from(""));
    let skipped = crate::model::skips::by_tenant(a);
    if !skipped.is_empty() {
        out.push(Line::from(vec![
            Span::styled(format!("skipped {}", skipped.len()), t.key()),
            Span::raw(
                "  tenants whose processes made the agent skip libraries, warnings or maps \
                 reads (the agent goes on for everyone else):",
            ),
        ]));
        for row in skipped {
            out.push(Line::from(vec![
                Span::styled(format!("  {}: ", row.tenant), t.warn()),
                Span::raw(row.summary()),
            ]));
        }
        let m = &a.maps_scan;
        out.push(Line::from(format!(
            "  maps scan: {} processes, last cycle {:.2}s, {} deferred, {} blocked, {} polls late",
            m.processes,
            m.cycle_seconds,
            m.deferred,
            m.blocked.len(),
            m.late_polls
        )));
        out.push(Line::from(""));
    }
    let errors = errors(s);
    out.push(Line::from(vec![
        Span::styled(format!("errors {}", errors.len()), t.key()),
        Span::raw("  regions that could not be read, warnings, claims refused:"),
    ]));
    if errors.is_empty() {
        out.push(Line::from(Span::styled("  none", t.good())));
    }
    for e in errors {
        out.push(Line::from(Span::styled(format!("  {e}"), t.bad())));
    }
    if !a.nvml_problems.is_empty() {
        out.push(Line::from(""));
        out.push(Line::from(Span::styled(
            "NVML (not counted as errors):",
            t.key(),
        )));
        for p in &a.nvml_problems {
            out.push(Line::from(format!("  {p}")));
        }
    }
    out
}

pub fn render(frame: &mut Frame, model: &Model, t: &Theme) {
    let area = frame.area();
    let text = match &model.snapshot {
        Some(s) => lines(s, t),
        None => vec![Line::from("no snapshot yet")],
    };
    let width = area.width.saturating_sub(4).min(120);
    // As tall as the wrapped text (and the border), at most the screen.
    let inner = width.saturating_sub(2).max(1) as usize;
    let rows: usize = text.iter().map(|l| l.width().max(1).div_ceil(inner)).sum();
    let area = centered(area, width, (rows + 2).min(u16::MAX as usize) as u16);
    frame.render_widget(Clear, area);
    frame.render_widget(
        Paragraph::new(text)
            .wrap(Wrap { trim: false })
            .block(Block::bordered().title(" the header's counters: any key closes ")),
        area,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cause_has_its_own_meaning() {
        let generic = meaning("no such cause");
        for h in Health::ALL {
            assert_ne!(meaning(h.name()), generic, "{}", h.name());
        }
    }

    #[test]
    fn errors_are_what_the_header_counts() {
        let mut s = crate::tui::fixture::snapshot();
        s.agent.warnings = vec!["probe poll: x".into()];
        s.agent.claims_refused =
            vec!["region /r/x: slot 1: claims pid 7, which does not map this region".into()];
        s.containers[0].regions.push(crate::model::RegionInfo {
            path: "/r/bad".into(),
            format: "vgpu".into(),
            devices: vec![],
            problems: vec!["not a region".into()],
            read_retries: 0,
            writable_by_others: None,
            freeze_after_seconds: None,
        });
        s.agent.region_errors = 1;
        let e = errors(&s);
        assert_eq!(
            e.len(),
            s.agent.region_errors
                + s.agent.warnings.len()
                + s.agent.claims_refused.len()
                + s.agent.region_listing_cuts.len()
        );
        assert_eq!(
            e,
            vec![
                "region /r/bad: not a region",
                "warning: probe poll: x",
                "not believed: region /r/x: slot 1: claims pid 7, which does not map this region"
            ]
        );
    }
}

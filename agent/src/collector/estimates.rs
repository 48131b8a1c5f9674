//! The figures of kinds a probe budget sampled: what the probes saw in the windows, scaled to
//! the sampling's estimate of the whole (`probing::Exposure`), so that `top`, `stat` and the
//! metrics show a process's calls, not the share of them that happened to be probed. Each such
//! row keeps what the probes saw in [`ApiUsage::probed`] (for `attribute`, which estimates with
//! its own uncertainty) and is marked estimated in every view. Estimates are cumulative and never
//! go back (a reading includes the gap in progress, estimated provisionally: the next may lower
//! it), so they can be exported as counters.

use agent_common::ApiId;

use crate::model::{ApiUsage, Communicator, Probed, Snapshot, Source};

/// Scales the probes' rows of sampled kinds in `snap`, never below what `previous` showed.
pub(super) fn apply(snap: &mut Snapshot, previous: Option<&Snapshot>) {
    let exposure = snap.agent.sampling.as_ref().map(|s| &s.exposure);
    for p in &mut snap.processes {
        let by_kind = exposure.and_then(|e| e.get(&p.key.pid));
        let before = previous.and_then(|s| s.process(p.key));
        let scale_of = |kind: &str| {
            by_kind.and_then(|k| k.get(kind)).and_then(|e| {
                (e.probed_calls > 0).then(|| (e.estimated_calls / e.probed_calls as f64).max(1.0))
            })
        };
        for a in p
            .apis
            .iter_mut()
            .filter(|a| a.source == Source::Probes && sampled_api(&a.api))
        {
            let earlier = before.and_then(|b| {
                b.apis
                    .iter()
                    .find(|e| e.api == a.api && e.source == Source::Probes)
            });
            scale_row(a, scale_of(&a.kind), earlier);
        }
        let nccl = scale_of(agent_common::ApiKind::Nccl.name());
        for c in &mut p.communicators {
            let earlier = before.and_then(|b| b.communicators.iter().find(|e| e.comm == c.comm));
            scale_communicator(c, nccl, earlier);
        }
    }
}

/// Whether a budget samples this API's calls (not those that track state: allocations, frees,
/// lifecycle, an NCCL communicator's creation and end).
fn sampled_api(name: &str) -> bool {
    ApiId::from_name(name)
        .and_then(|a| a.spec())
        .is_some_and(|s| {
            agent_common::ApiKind::BUDGETED.contains(&s.kind)
                && (s.kind != agent_common::ApiKind::Nccl || s.is_nccl_call())
        })
}

/// The scale to apply now: the sampling's (above 1), else the earlier estimate's (`calls` over
/// the `probed` calls it stood for) once a figure was estimated; `None`: leave it as probed.
fn effective_scale(scale: Option<f64>, earlier: Option<(u64, u64)>) -> Option<f64> {
    match (scale, earlier) {
        (Some(s), _) if s > 1.0 => Some(s),
        (_, Some((calls, probed))) => Some(calls as f64 / probed.max(1) as f64),
        _ => None,
    }
}

/// `v` scaled, never below `floor` (the earlier estimate).
fn scaled(v: u64, scale: f64, floor: Option<u64>) -> u64 {
    ((v as f64 * scale).round() as u64).max(floor.unwrap_or(0))
}

/// [`scale_row`] for a communicator's calls, errors and bytes (NCCL's scale).
fn scale_communicator(c: &mut Communicator, scale: Option<f64>, earlier: Option<&Communicator>) {
    let earlier = earlier.filter(|e| e.probed_calls.is_some());
    let Some(scale) = effective_scale(
        scale,
        earlier.map(|e| (e.calls, e.probed_calls.unwrap_or(1))),
    ) else {
        return;
    };
    let probed = c.calls;
    c.calls = scaled(c.calls, scale, earlier.map(|e| e.calls));
    c.errors = scaled(c.errors, scale, earlier.map(|e| e.errors));
    c.bytes = scaled(c.bytes, scale, earlier.map(|e| e.bytes));
    c.probed_calls = Some(probed);
}

/// Scales one row by `scale` (the sampled kind's estimated calls per probed call), never below
/// its `earlier` estimate. A row is left as the probes saw it while its kind was never sampled
/// (no scale above 1 now or before); an estimated row stays estimated (its process's exposure
/// gone when it exited: the earlier scale is kept).
fn scale_row(a: &mut ApiUsage, scale: Option<f64>, earlier: Option<&ApiUsage>) {
    let earlier = earlier.filter(|e| e.is_estimated());
    let stood_for = |e: &ApiUsage| (e.calls, e.probed.map_or(1, |p| p.calls));
    let Some(scale) = effective_scale(scale, earlier.map(stood_for)) else {
        return;
    };
    let probed = Probed {
        calls: a.calls,
        errors: a.errors,
        bytes: a.bytes,
        total_ns: a.total_ns,
    };
    a.calls = scaled(probed.calls, scale, earlier.map(|e| e.calls));
    a.errors = scaled(probed.errors, scale, earlier.map(|e| e.errors));
    a.bytes = scaled(probed.bytes, scale, earlier.map(|e| e.bytes));
    a.total_ns = scaled(probed.total_ns, scale, earlier.map(|e| e.total_ns));
    a.probed = Some(probed);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(calls: u64) -> ApiUsage {
        ApiUsage {
            api: "cuStreamSynchronize".into(),
            kind: "sync".into(),
            source: Source::Probes,
            calls,
            errors: 0,
            bytes: 0,
            total_ns: calls * 1_000,
            hook_ns: 0,
            denied: 0,
            hist: vec![],
            latency: None,
            probed: None,
        }
    }

    #[test]
    fn a_sampled_row_is_scaled_and_keeps_what_the_probes_saw() {
        let mut a = row(100);
        scale_row(&mut a, Some(4.0), None);
        assert_eq!((a.calls, a.total_ns), (400, 400_000));
        assert_eq!(a.probed.map(|p| p.calls), Some(100));
        assert!(a.is_estimated());
        assert_eq!(a.as_probed().calls, 100);
    }

    #[test]
    fn a_row_probed_whole_is_left_alone() {
        let mut a = row(100);
        scale_row(&mut a, Some(1.0), None);
        scale_row(&mut a, None, None);
        assert_eq!(a.calls, 100);
        assert!(!a.is_estimated());
    }

    #[test]
    fn an_estimate_never_goes_back_and_stays_one() {
        let mut first = row(100);
        scale_row(&mut first, Some(4.0), None);
        // The gap estimate in progress was high: the next reading's scale is lower.
        let mut next = row(110);
        scale_row(&mut next, Some(3.0), Some(&first));
        assert_eq!(next.calls, 400, "not below the earlier 400");
        // Its process exited: no exposure now, the earlier scale (3.6) carries on.
        let mut gone = row(110);
        scale_row(&mut gone, None, Some(&next));
        assert!(gone.is_estimated());
        assert_eq!(gone.calls, 400);
        assert_eq!(gone.probed.map(|p| p.calls), Some(110));
    }
}

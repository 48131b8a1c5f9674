//! GPU use in the model: NVML's per-process busy time of one reading becomes the process's
//! percentages for the window, and is added to the busy time it had in the previous snapshot
//! (cumulative per process key, so a reused pid starts from zero).

use crate::{
    model::{
        NvmlProcess, Snapshot,
        gpu_use::{Busy, pct},
    },
    nvml::{DeviceReading, GpuProcess},
};

/// `/proc/self/ns/pid` of the host's initial pid namespace (`PROC_PID_INIT_INO`).
const INIT_PID_NS: u64 = 0xEFFF_FFFC;

/// One process on one device as the model holds it, for this reading alone (the busy time is
/// made cumulative by [`accumulate`]).
pub fn nvml_process(d: &DeviceReading, p: &GpuProcess) -> NvmlProcess {
    let measured = d.use_window.zip(p.busy);
    let window_us = d.use_window.map_or(0, |w| w.micros());
    NvmlProcess {
        device: d.index,
        used_memory: p.used_memory,
        sm_util_pct: measured.and_then(|(_, b)| pct(b.sm_busy_us, window_us)),
        mem_util_pct: measured.and_then(|(_, b)| pct(b.mem_busy_us, window_us)),
        use_window: measured.map(|(w, _)| w),
        use_unavailable: d.use_unavailable.clone(),
        busy: Busy {
            sm_us: measured.map_or(0, |(_, b)| b.sm_busy_us),
            mem_us: measured.map_or(0, |(_, b)| b.mem_busy_us),
            observed_us: measured.map_or(0, |_| window_us),
        },
    }
}

/// Each process's limiter-timed GPU busy share since `previous` (its estimated GPU time over the
/// interval), per device: what the gauges show beside NVML's. A process new since `previous`
/// has no share yet.
pub fn limiter_busy(previous: Option<&Snapshot>, snap: &mut Snapshot) {
    let (Some(prev), interval) = (previous, snap.interval_seconds) else {
        return;
    };
    if interval <= 0.0 {
        return;
    }
    for p in &mut snap.processes {
        let Some(before) = prev.process(p.key).and_then(|b| b.limiter.as_ref()) else {
            continue;
        };
        let Some(l) = &mut p.limiter else { continue };
        for t in &mut l.gpu_time {
            let earlier = before.gpu_time.iter().find(|e| e.device == t.device);
            let ns = t.since(earlier).estimated_ns;
            // One process keeps one device busy at most all the time: a timed kernel is counted
            // in the interval its pair is read back in, so an interval can hold a little of the
            // one before it (and a pair that waited behind queued work a little more).
            t.busy_ratio = Some((ns as f64 / 1e9 / interval).min(1.0));
        }
    }
}

/// Adds each process's busy time in `previous` to this snapshot's. A process that was on a
/// device before and is not listed there now (it released its context, or NVML left it out)
/// keeps its entry with its busy time, and is observed for the device's window: its counters
/// never go back while it is in the model.
pub fn accumulate(previous: Option<&Snapshot>, snap: &mut Snapshot) {
    let Some(prev) = previous else {
        return;
    };
    // Each device's latest window, from any process measured on it.
    let mut windows = std::collections::BTreeMap::new();
    for n in snap.processes.iter().flat_map(|p| &p.nvml) {
        if let Some(w) = n.use_window {
            windows.entry(n.device).or_insert(w);
        }
    }
    for p in &mut snap.processes {
        let Some(before) = prev.process(p.key) else {
            continue;
        };
        for b in &before.nvml {
            match p.nvml.iter_mut().find(|n| n.device == b.device) {
                // The same reading again (an exited process's last figures, carried): counted.
                Some(n) if n.use_window.is_some() && n.use_window == b.use_window => {
                    n.busy = b.busy;
                }
                Some(n) => n.busy.add(&b.busy),
                None if b.busy != Busy::default() => {
                    let observed = windows.get(&b.device).map_or(0, |w| w.micros());
                    p.nvml.push(NvmlProcess {
                        device: b.device,
                        used_memory: None,
                        sm_util_pct: None,
                        mem_util_pct: None,
                        use_window: None,
                        use_unavailable: None,
                        busy: Busy {
                            observed_us: b.busy.observed_us + observed,
                            ..b.busy
                        },
                    });
                }
                None => {}
            }
        }
        p.nvml.sort_by_key(|n| n.device);
    }
}

/// NVML names processes by host pid. In a pid namespace of its own (a container without
/// `hostPID`) the agent cannot match them to processes, or matches the wrong ones: say so.
pub fn pid_namespace_warning(own_pid_ns: Option<u64>, snap: &Snapshot) -> Option<String> {
    if own_pid_ns? == INIT_PID_NS {
        return None;
    }
    let n = snap.processes.iter().filter(|p| !p.nvml.is_empty()).count();
    (n > 0).then(|| {
        format!(
            "NVML names {n} processes by host pid, but the agent runs in a pid namespace of its \
             own: NVML's memory and GPU use cannot be matched to processes (run the agent in \
             the host's pid namespace, e.g. hostPID: true)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        model::{
            Process, ProcessKey,
            gpu_use::{UseWindow, window_use},
        },
        nvml::PidUse,
    };

    const SEC: u64 = 1_000_000;

    fn reading(from: u64, to: u64, procs: Vec<GpuProcess>) -> DeviceReading {
        DeviceReading {
            index: 0,
            processes: procs,
            use_window: Some(UseWindow {
                from_unix_us: from,
                to_unix_us: to,
                sample_period_us: SEC / 6,
            }),
            ..DeviceReading::default()
        }
    }

    fn gp(pid: u32, sm_us: u64) -> GpuProcess {
        GpuProcess {
            pid,
            used_memory: Some(1 << 30),
            busy: Some(PidUse {
                sm_busy_us: sm_us,
                mem_busy_us: sm_us / 4,
                samples: 6,
            }),
        }
    }

    fn snap(procs: Vec<(u32, Vec<NvmlProcess>)>) -> Snapshot {
        let mut s = crate::tui::fixture::empty();
        for (pid, nvml) in procs {
            let mut p = Process::with_apis(vec![]);
            p.key = ProcessKey {
                pid,
                start_ticks: 7,
            };
            p.nvml = nvml;
            s.processes.push(p);
        }
        s
    }

    #[test]
    fn percentages_of_the_window_and_n_a_where_not_measured() {
        let d = reading(10 * SEC, 12 * SEC, vec![gp(1, SEC)]);
        let n = nvml_process(&d, &d.processes[0]);
        assert_eq!(n.sm_util_pct, Some(50.0));
        assert_eq!(n.mem_util_pct, Some(12.5));
        assert_eq!(n.busy.observed_us, 2 * SEC);
        let unsupported = DeviceReading {
            use_unavailable: Some("not supported".into()),
            processes: vec![GpuProcess {
                busy: None,
                ..gp(1, 0)
            }],
            ..DeviceReading::default()
        };
        let n = nvml_process(&unsupported, &unsupported.processes[0]);
        assert_eq!((n.sm_util_pct, n.mem_util_pct), (None, None));
        assert_eq!(n.busy, Busy::default());
        assert_eq!(n.use_unavailable.as_deref(), Some("not supported"));
    }

    #[test]
    fn busy_time_accumulates_per_process_and_windows_difference_it() {
        let d1 = reading(0, SEC, vec![gp(1, SEC), gp(2, SEC / 10)]);
        let s1 = snap(vec![
            (1, vec![nvml_process(&d1, &d1.processes[0])]),
            (2, vec![nvml_process(&d1, &d1.processes[1])]),
        ]);
        // Process 2 released its context: it keeps its busy time and is observed on.
        let d2 = reading(SEC, 2 * SEC, vec![gp(1, SEC / 2)]);
        let mut s2 = snap(vec![
            (1, vec![nvml_process(&d2, &d2.processes[0])]),
            (2, vec![]),
        ]);
        accumulate(Some(&s1), &mut s2);
        let busy = |s: &Snapshot, pid: u32| {
            s.processes.iter().find(|p| p.key.pid == pid).unwrap().nvml[0].busy
        };
        assert_eq!(
            busy(&s2, 1),
            Busy {
                sm_us: SEC + SEC / 2,
                mem_us: SEC / 4 + SEC / 8,
                observed_us: 2 * SEC
            }
        );
        assert_eq!(busy(&s2, 2).sm_us, SEC / 10);
        assert_eq!(busy(&s2, 2).observed_us, 2 * SEC);
        // The window s1..s2: process 1 at 50%, both together (a container) 50%.
        let keys = |pids: &[u32]| -> Vec<ProcessKey> {
            pids.iter()
                .map(|&pid| ProcessKey {
                    pid,
                    start_ticks: 7,
                })
                .collect()
        };
        let w = window_use(&s1, &s2, &keys(&[1]));
        assert_eq!(w[0].sm_util_pct, Some(50.0));
        assert_eq!(w[0].observed_seconds, 1.0);
        let both = window_use(&s1, &s2, &keys(&[1, 2]));
        assert_eq!(both[0].sm_util_pct, Some(50.0));
        // An exited process's last figures carried again are not counted twice.
        let mut s3 = s2.clone();
        s3.processes[0].nvml[0].busy = nvml_process(&d2, &d2.processes[0]).busy;
        accumulate(Some(&s2), &mut s3);
        assert_eq!(busy(&s3, 1), busy(&s2, 1));
        // A reused pid (another start time) starts from zero.
        let mut s3 = snap(vec![(1, vec![nvml_process(&d2, &d2.processes[0])])]);
        s3.processes[0].key.start_ticks = 8;
        accumulate(Some(&s2), &mut s3);
        assert_eq!(s3.processes[0].nvml[0].busy.sm_us, SEC / 2);
        // The latest window per container.
        let m = s2.gpu_use_of(&keys(&[1, 2]));
        assert_eq!(m.devices[0].sm_util_pct, 50.0);
        assert_eq!(m.devices[0].processes, 1);
    }

    /// With `--nvml-interval` the snapshots between two readings carry the same reading: its
    /// busy time counts once, and the next reading's adds to it.
    #[test]
    fn a_reading_carried_to_later_snapshots_counts_once() {
        let d1 = reading(0, SEC, vec![gp(1, SEC / 2)]);
        let s1 = snap(vec![(1, vec![nvml_process(&d1, &d1.processes[0])])]);
        let mut s2 = snap(vec![(1, vec![nvml_process(&d1, &d1.processes[0])])]);
        accumulate(Some(&s1), &mut s2);
        let mut s3 = snap(vec![(1, vec![nvml_process(&d1, &d1.processes[0])])]);
        accumulate(Some(&s2), &mut s3);
        let busy = |s: &Snapshot| s.processes[0].nvml[0].busy;
        assert_eq!(busy(&s3), busy(&s1));
        // The next reading, 5 s later: 3 s busy.
        let d2 = reading(SEC, 6 * SEC, vec![gp(1, 3 * SEC)]);
        let mut s4 = snap(vec![(1, vec![nvml_process(&d2, &d2.processes[0])])]);
        accumulate(Some(&s3), &mut s4);
        assert_eq!(
            (busy(&s4).sm_us, busy(&s4).observed_us),
            (SEC / 2 + 3 * SEC, 6 * SEC)
        );
        let key = [s4.processes[0].key];
        assert_eq!(window_use(&s1, &s4, &key)[0].sm_util_pct, Some(60.0));
    }

    #[test]
    fn a_pid_namespace_of_its_own_is_said() {
        let d = reading(0, SEC, vec![gp(1, SEC)]);
        let mut s = snap(vec![(1, vec![nvml_process(&d, &d.processes[0])])]);
        assert_eq!(pid_namespace_warning(Some(INIT_PID_NS), &s), None);
        assert_eq!(pid_namespace_warning(None, &s), None, "unknown: no claim");
        let w = pid_namespace_warning(Some(4026532000), &s).unwrap();
        assert!(w.contains("hostPID"), "{w}");
        s.processes[0].nvml.clear();
        assert_eq!(pid_namespace_warning(Some(4026532000), &s), None);
    }
}

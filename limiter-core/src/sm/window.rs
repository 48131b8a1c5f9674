//! One launch's way through a device's duty cycle: admitted in the active window, or held until
//! the window's resume time, draining this process's work first when the window's budget is
//! spent. The words are the container's ([`Window`]): every process of the container runs this
//! same function on them, so together they get one budget.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::env::{Env, View, Window};

/// `last` is refreshed at most this often (fewer writes to a shared line from many threads and
/// processes).
pub(crate) const LAST_RESOLUTION_NS: u64 = 1_000_000;
/// A window whose times lie further ahead than this is not believed (a region file from another
/// boot, or corrupt words): it is forgotten and the launch passes. Closes never hold longer.
pub const MAX_HOLD_NS: u64 = 60_000_000_000;

/// When the window that started at `start` and whose work ended at `end` may be followed by the
/// next: after `idle = busy * (1000 - pm) / pm`, so that the window's share of wall time is
/// `pm` per mille (at most [`MAX_HOLD_NS`] later).
pub(crate) fn resume_after(start: u64, end: u64, pm: u64) -> u64 {
    let busy = end.saturating_sub(start);
    let idle = busy.saturating_mul(1000 - pm.min(1000)) / pm.max(1);
    end.saturating_add(idle.min(MAX_HOLD_NS))
}

/// A launch of a QoS-tiered container while the device is not limited (its allocation is the
/// whole device): at most once a millisecond, opens a window at `now`. Its launches stay visible
/// as activity (`last`), and when a limit comes back its first window starts from here: a window
/// opened before the device went unlimited, kept alive since by the launches, would count all
/// that time as its busy time and hold the container for `busy * (1000 - pm) / pm` (on an H200,
/// a guaranteed container stopped for 1.7 s when its neighbour came back from a pause).
pub fn note_unlimited<W: Window>(w: &W, now: u64) {
    if now > w.view().last.saturating_add(LAST_RESOLUTION_NS) {
        w.open(now);
    }
}

/// Whether the view's times lie beyond any hold from `now`.
fn unbelievable(v: &View, now: u64) -> bool {
    let horizon = now.saturating_add(MAX_HOLD_NS);
    v.start > horizon || v.resume > horizon || v.last > horizon || v.closed > horizon
}

/// Lets a launch through at `pm` per mille of `period_ns` on the duty cycle `w`; `mark` is this
/// process's record of the window it last launched in (0: none, or drained since). Returns the
/// time the launch was held back.
///
/// - In the active window (from `max(window_start, resume_at)` for `pm` per mille of the period)
///   the launch passes: a few loads, a store to `last` at most every millisecond.
/// - A launch that finds the budget spent drains this process's work (`cuCtxSynchronize`: queued
///   work runs to its end, so the wait is device time) and closes the window: launches wait until
///   `end + busy * (1000 - pm) / pm`. Every process of the container that finds it spent does the
///   same; the resume only grows, so the latest drain end sets it.
/// - A launch that finds the window closed waits for its resume, but if this process launched in
///   the window just closed, it drains first and closes again with its own end: work it queued
///   late still counts as the window's busy time.
/// - A gap in launches longer than the period starts a new window (an idle device is not held).
pub(crate) fn admit<E: Env>(
    env: &E,
    w: &E::Window,
    mark: &AtomicU64,
    pm: u64,
    period_ns: u64,
) -> u64 {
    let budget = period_ns.saturating_mul(pm) / 1000;
    let entered = env.now_ns();
    let mut now = entered;
    loop {
        let v = w.view();
        if unbelievable(&v, now) {
            w.repair(v);
            // Relaxed (all marks): this process's own bookkeeping; the window words carry nothing
            // else.
            mark.store(0, Relaxed);
            return now - entered;
        }
        if now < v.resume {
            let m = mark.load(Relaxed);
            if m != 0
                && m >= v.closed
                && m < v.resume
                && mark.compare_exchange(m, 0, Relaxed, Relaxed).is_ok()
            {
                env.drain();
                let end = env.now_ns();
                w.close(m, resume_after(m, end, pm));
                now = end;
                continue;
            }
            env.sleep_until(v.resume);
            now = env.now_ns();
            continue;
        }
        let start = v.start.max(v.resume);
        if start == 0 || now.saturating_sub(v.last.max(start)) > period_ns {
            // No window yet, or launches stopped for longer than a period: a new window.
            w.open(now);
            mark.store(now, Relaxed);
            return now - entered;
        }
        if now.saturating_sub(start) < budget {
            if now.saturating_sub(v.last) > LAST_RESOLUTION_NS {
                w.touch(now);
            }
            if mark.load(Relaxed) != start {
                mark.store(start, Relaxed);
            }
            return now - entered;
        }
        // The window has used its budget: drain this process's work and close it.
        mark.store(0, Relaxed);
        env.drain();
        let end = env.now_ns();
        w.close(start, resume_after(start, end, pm));
        now = end;
    }
}

//! SIGINT/SIGTERM as a flag that long-running commands poll.

use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

fn on_signal() {
    // Relaxed: the flag carries no data; loops only need to see it eventually.
    STOP.store(true, Ordering::Relaxed);
}

/// Makes SIGINT and SIGTERM set the stop flag instead of killing the process.
pub fn install() {
    crate::sys::process::on_stop_signals(on_signal);
}

pub fn stop_requested() -> bool {
    STOP.load(Ordering::Relaxed)
}

/// Sleeps up to `d`, waking early when a stop is requested.
pub fn sleep(d: std::time::Duration) {
    let end = std::time::Instant::now() + d;
    while !stop_requested() {
        let left = end.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            break;
        }
        std::thread::sleep(left.min(std::time::Duration::from_millis(50)));
    }
}

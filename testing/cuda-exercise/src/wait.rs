//! Processes meeting on a file: one writes it, the others wait for it to appear.

use std::path::Path;
use std::time::{Duration, Instant};

/// Waits until `p` exists (another process made it), at most `limit`.
pub(crate) fn wait_for_file(p: &Path, limit: Duration) -> Result<(), String> {
    let start = Instant::now();
    while !p.exists() {
        if start.elapsed() > limit {
            return Err(format!("{} did not appear within {limit:?}", p.display()));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

//! What the benchmarks on the simulated driver share: their release builds, and the cleaning up
//! of the region each run leaves.

use anyhow::Result;

/// The release builds of the simulated driver, `cuda-exercise` and the limiter, and a copy of the
/// simulated driver named `libcuda.so.1` in a fresh temporary directory (`TAG-PID`).
pub struct SimFixtures {
    /// `target/release`.
    pub bin: std::path::PathBuf,
    pub tmp: std::path::PathBuf,
    pub libcuda: std::path::PathBuf,
}

/// Builds and places the [`SimFixtures`] of a benchmark.
pub fn sim_fixtures(tag: &str) -> Result<SimFixtures> {
    crate::util::step("building release cuda-exercise, sim-cuda and the limiter");
    crate::util::run(&mut crate::util::cmd(
        "cargo",
        [
            "build",
            "--release",
            "-p",
            "cuda-exercise",
            "-p",
            "sim-cuda",
            "-p",
            "limiter",
        ],
    ))?;
    let bin = crate::repo_root().join("target/release");
    let tmp = std::env::temp_dir().join(format!("{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let libcuda = tmp.join("libcuda.so.1");
    std::fs::copy(bin.join("libsimcuda.so"), &libcuda)?;
    Ok(SimFixtures { bin, tmp, libcuda })
}

/// Removes a benchmark's region file and the control block the limiter creates beside it
/// (`<region>.ctl`), so that runs leave nothing behind in `/dev/shm`.
pub fn remove_region(region: &std::path::Path) {
    let mut ctl = region.as_os_str().to_owned();
    ctl.push(".ctl");
    let _ = std::fs::remove_file(region);
    let _ = std::fs::remove_file(ctl);
}

//! Test helpers: build the simulated driver once, install it as `libcuda.so.1` in a private
//! directory, and run cuda-exercise against it.
//!
//! How the library is found: `cargo test -p cuda-exercise` builds the `cuda-exercise` binary into
//! `<target>/<profile>/`; the helper runs `cargo build -p sim-cuda` for the same profile and target
//! directory (`CARGO` is set by cargo for tests), which leaves `libsimcuda.so` next to the binary,
//! and copies it to `<tmp>/simcuda-test-<pid>/libcuda.so.1`. Set `SIMCUDA_LIB` to a prebuilt
//! `libsimcuda.so` to skip the build.
#![allow(dead_code)]

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

pub const EXE: &str = env!("CARGO_BIN_EXE_cuda-exercise");

/// The built `libsimcuda.so`.
pub fn sim_build() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        if let Some(p) = std::env::var_os("SIMCUDA_LIB") {
            return PathBuf::from(p);
        }
        let profile_dir = Path::new(EXE)
            .parent()
            .expect("binary has a directory")
            .to_path_buf();
        let target_dir = profile_dir
            .parent()
            .expect("profile directory has a parent");
        let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") => "dev",
            Some(p) => p,
            None => panic!("unexpected binary path {EXE}"),
        };
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let st = Command::new(cargo)
            .args([
                "build",
                "--quiet",
                "-p",
                "sim-cuda",
                "--profile",
                profile,
                "--target-dir",
            ])
            .arg(target_dir)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("running cargo build -p sim-cuda");
        assert!(st.success(), "cargo build -p sim-cuda failed");
        let lib = profile_dir.join("libsimcuda.so");
        assert!(
            lib.exists(),
            "{} was not built (a --target build? set SIMCUDA_LIB)",
            lib.display()
        );
        lib
    })
}

/// The sim installed as `libcuda.so.1` in a private directory.
pub fn sim_lib() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("simcuda-test-{}", std::process::id()));
        // Fresh: a directory left by an earlier run whose process had the same pid (pids wrap at
        // 32768 on the test VM) holds its files, such as a test's wait file, which then does not
        // gate anything.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating the test directory");
        let dst = dir.join("libcuda.so.1");
        std::fs::copy(sim_build(), &dst).expect("copying libsimcuda.so");
        dst
    })
}

/// A private directory for one test's files.
pub fn test_dir(name: &str) -> PathBuf {
    let d = sim_lib().parent().unwrap().join(name);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs cuda-exercise against the sim with `env` set (and every other SIMCUDA_ variable unset).
pub fn run_sim(args: &[&str], env: &[(&str, &str)]) -> Output {
    run_lib(sim_lib(), args, env)
}

pub fn run_lib(lib: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(EXE);
    c.arg("--lib").arg(lib).args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("SIMCUDA_") {
            c.env_remove(k);
        }
    }
    c.envs(env.iter().copied());
    c.output().expect("running cuda-exercise")
}

/// The JSON that a successful run printed on its last line.
pub fn json(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "cuda-exercise failed: {:?}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().expect("cuda-exercise printed nothing");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("bad JSON {line:?}: {e}"))
}

/// `calls[name][field]` of a report.
pub fn stat(v: &Value, name: &str, field: &str) -> u64 {
    v["calls"][name][field]
        .as_u64()
        .unwrap_or_else(|| panic!("no calls.{name}.{field} in {v}"))
}

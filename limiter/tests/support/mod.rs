//! Shared by the integration tests: where the built limiter and the simulated driver are, and how
//! to run a program under the limiter.
//!
//! - The limiter: `cargo test` builds the cdylib into `target/<profile>/deps/` beside the test
//!   binaries (the crate's `rlib` type makes cargo build the library for tests); override with
//!   `VGPU_TEST_LIMITER=/path/libvgpu_limiter.so`.
//! - The driver: `testing/sim-cuda` (soname `libcuda.so.1`), built once per test binary with
//!   `cargo build -p sim-cuda` into `target/tmp/sim-target` (a separate target directory: the outer
//!   `cargo test` may hold the lock of the main one); override with `VGPU_TEST_SIM_LIBCUDA=/path`.
//!   A private directory gets `libcuda.so.1` and `libcuda.so` links to it, for `LD_LIBRARY_PATH`
//!   and for `cc -lcuda`.

#![allow(
    dead_code,
    reason = "each test binary uses a different part of the support module"
)]

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::OnceLock,
};

pub struct Paths {
    pub limiter: PathBuf,
    pub libdir: PathBuf,
    pub tmp: PathBuf,
}

pub fn paths() -> &'static Paths {
    static PATHS: OnceLock<Paths> = OnceLock::new();
    PATHS.get_or_init(|| {
        let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("limiter-tests");
        std::fs::create_dir_all(&tmp).unwrap();
        let limiter = std::env::var_os("VGPU_TEST_LIMITER")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                let exe = std::env::current_exe().unwrap();
                exe.parent().unwrap().join("libvgpu_limiter.so")
            });
        assert!(
            limiter.exists(),
            "limiter not built at {}",
            limiter.display()
        );
        let sim = std::env::var_os("VGPU_TEST_SIM_LIBCUDA")
            .map(PathBuf::from)
            .unwrap_or_else(|| build_sim(&tmp));
        let libdir = tmp.join(format!("lib-{}", std::process::id()));
        std::fs::create_dir_all(&libdir).unwrap();
        for name in ["libcuda.so.1", "libcuda.so"] {
            let link = libdir.join(name);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&sim, &link).unwrap();
        }
        Paths {
            limiter,
            libdir,
            tmp,
        }
    })
}

fn build_sim(tmp: &Path) -> PathBuf {
    let target = tmp.join("sim-target");
    let out = Command::new(env!("CARGO"))
        .args(["build", "--quiet", "-p", "sim-cuda", "--target-dir"])
        .arg(&target)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .expect("run cargo");
    assert!(
        out.status.success(),
        "building sim-cuda failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let so = target.join("debug/libsimcuda.so");
    assert!(so.exists(), "{} missing", so.display());
    so
}

/// Compiles `callers/<src>` with `cc` into the test directory.
pub fn cc(src: &str, out: &str, extra: &[&str]) -> PathBuf {
    let p = paths();
    let exe = p.tmp.join(out);
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/callers")
        .join(src);
    let o = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(extra)
        .output()
        .expect("run cc");
    assert!(
        o.status.success(),
        "cc {} failed:\n{}",
        src.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    exe
}

/// A fresh region path in the test directory (no file yet).
pub fn fresh_region(tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = paths().tmp.join(format!("regions-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(format!(
        "{tag}-{}.region",
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_file(&p);
    p
}

/// A command with the limiter preloaded, the simulated driver on the library path and a clean
/// configuration (no inherited limiter or simulator variables), a private region
/// (`CUDA_DEVICE_MEMORY_SHARED_CACHE`, so tests never share HAMi's default path) and no context
/// charge (`VGPU_CONTEXT_BYTES=0`: the sim's contexts hold no memory). Tests override either.
pub fn preloaded(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let p = paths();
    let mut c = Command::new(program);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("CUDA_")
            || k.starts_with("VGPU_")
            || k.starts_with("SIMCUDA_")
            || k == "LIBCUDA_LOG_LEVEL"
        {
            c.env_remove(&*k);
        }
    }
    c.env("LD_PRELOAD", &p.limiter)
        .env("LD_LIBRARY_PATH", &p.libdir)
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", fresh_region("cmd"))
        .env("VGPU_CONTEXT_BYTES", "0");
    c
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Asserts success and that no line of stdout says FAIL; returns (stdout, stderr).
pub fn expect_ok(out: Output) -> (String, String) {
    let (so, se) = (text(&out.stdout), text(&out.stderr));
    assert!(
        out.status.success() && !so.contains("FAIL"),
        "status {:?}\nstdout:\n{so}\nstderr:\n{se}",
        out.status
    );
    (so, se)
}

/// The stand-in NVML (`callers/fake_nvml.c`), built once per test binary and installed as
/// `libnvidia-ml.so.1` in its own directory (point `VGPU_REAL_LIBNVML` at it).
pub fn fake_nvml() -> &'static Path {
    static SO: OnceLock<PathBuf> = OnceLock::new();
    SO.get_or_init(|| {
        let dir = paths()
            .tmp
            .join(format!("fake-nvml-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let so = dir.join("libnvidia-ml.so.1");
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/callers/fake_nvml.c");
        let o = Command::new("cc")
            .args(["-O1", "-Wall", "-Werror", "-shared", "-fPIC", "-o"])
            .arg(&so)
            .arg(src)
            .arg("-ldl")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o.stderr));
        so
    })
}

/// The saturating launch workload of the SM tests (`callers/sm_caller.c`), built once per test
/// binary.
pub fn sm_caller() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let libdir = format!("-L{}", paths().libdir.display());
        let out = format!("sm_caller-{}", std::process::id());
        cc(
            "sm_caller.c",
            &out,
            &[&libdir, "-lcuda", "-lpthread", "-rdynamic"],
        )
    })
}

/// One device's SM duty-cycle words in a region (`region::SmShare`), read from the file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SmWords {
    pub window_start: u64,
    pub last_launch: u64,
    pub resume_at: u64,
    pub closes: u64,
    /// The NVML correction, `(target percent, per mille)`; `None` while uncorrected.
    pub duty: Option<(u8, u16)>,
    /// The container's QoS tier and allocation; `None` without a tier.
    pub qos: Option<region::sm_share::QosState>,
}

/// Reads device `device`'s [`SmWords`] from the region file at `region`.
pub fn sm_words(region: &Path, device: usize) -> SmWords {
    use std::os::unix::fs::FileExt;
    let at = std::mem::offset_of!(region::layout::RegionHeader, sm)
        + device * std::mem::size_of::<region::SmShare>();
    let mut b = [0u8; 64];
    std::fs::File::open(region)
        .unwrap()
        .read_exact_at(&mut b, at as u64)
        .unwrap();
    let word = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
    SmWords {
        window_start: word(0),
        last_launch: word(1),
        resume_at: word(2),
        closes: word(4),
        duty: region::sm_share::decode_duty(word(5)),
        qos: region::sm_share::decode_qos(word(7)),
    }
}

//! Support for the agent's integration tests: the binaries under test, the simulated driver, and
//! running `vgpu-agent stat` beside a workload.
#![allow(dead_code)] // Each test binary uses part of this module.

pub mod attribute;
pub mod daemon;
pub mod dashboards;
pub mod flood;
pub mod hostile;
pub mod podman;
pub mod prometheus;

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Mutex, MutexGuard, Once, mpsc},
    time::{Duration, Instant},
};

use serde_json::Value;

/// Privileged tests share the kernel and the two CPUs: run them one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether this test can load eBPF (root, BTF). Under `cargo xtask test` as root
/// (`VGPU_REQUIRE_PRIVILEGED=1`) a missing privilege is a failure, not a skip.
pub fn privileged() -> bool {
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let btf = Path::new("/sys/kernel/btf/vmlinux").exists();
    if root && btf {
        return true;
    }
    let why = if root {
        "the kernel has no BTF"
    } else {
        "not root"
    };
    if std::env::var_os("VGPU_REQUIRE_PRIVILEGED").is_some_and(|v| v == "1") {
        panic!("privileged test cannot run: {why}");
    }
    eprintln!("skipping privileged test: {why} (run `sudo cargo xtask test`)");
    false
}

pub fn agent_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_vgpu-agent"))
}

/// The target directory of this test build (`target/debug` or similar).
fn profile_dir() -> PathBuf {
    agent_bin()
        .parent()
        .expect("binary in a target dir")
        .to_path_buf()
}

static BUILD_FIXTURES: Once = Once::new();

/// Builds cuda-exercise and the simulated driver into this test's target directory, once.
fn build_fixtures() {
    BUILD_FIXTURES.call_once(|| {
        let dir = profile_dir();
        let target_dir = dir.parent().expect("target dir");
        let profile = dir.file_name().unwrap().to_str().unwrap();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut c = Command::new(cargo);
        c.args([
            "build",
            "-p",
            "sim-cuda",
            "-p",
            "cuda-exercise",
            "-p",
            "limiter",
            "--target-dir",
        ])
        .arg(target_dir);
        if profile == "release" {
            c.arg("--release");
        } else if profile != "debug" {
            c.args(["--profile", profile]);
        }
        let status = c.status().expect("cargo runs");
        assert!(status.success(), "building the test fixtures failed");
    });
}

pub fn exercise_bin() -> PathBuf {
    build_fixtures();
    profile_dir().join("cuda-exercise")
}

/// The limiter library (`libvgpu_limiter.so`) of this build.
pub fn limiter_lib() -> PathBuf {
    build_fixtures();
    profile_dir().join("libvgpu_limiter.so")
}

/// A fresh copy of the simulated driver, named `libcuda.so.1`, in its own directory (its own
/// inode: each test probes its own file).
pub fn sim_lib(dir: &Path) -> PathBuf {
    build_fixtures();
    std::fs::create_dir_all(dir).unwrap();
    let dst = dir.join("libcuda.so.1");
    // Copied beside it and renamed over it: a process may already run with `dst` mapped (a test
    // that starts several workloads from one directory), and rewriting that file in place would
    // end it with SIGBUS; the rename leaves it its own copy.
    let tmp = dir.join(format!(
        ".libcuda.so.1.{}.{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::copy(profile_dir().join("libsimcuda.so"), &tmp).expect("copy libsimcuda.so");
    std::fs::rename(&tmp, &dst).expect("rename the copy of libsimcuda.so");
    dst
}

/// The agent's log line for attaching to a library at (or under) `path`: other GPU processes on
/// the machine have libraries of their own, so tests wait for theirs.
pub fn attached(path: &Path) -> String {
    format!("as {}", path.display())
}

/// The real driver library unpacked by `cargo xtask setup`, if present.
pub fn real_libcuda() -> Option<PathBuf> {
    let p = PathBuf::from(std::env::var_os("VGPU_TEST_LIBCUDA")?);
    p.exists().then_some(p)
}

pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("vgpu-agent-test-")
        .tempdir()
        .unwrap()
}

/// A workload started with `--ready-file`/`--wait-file`: loaded, waiting for the go signal.
pub struct Workload {
    pub child: Child,
    go: PathBuf,
}

impl Workload {
    /// Starts `cmd` (a cuda-exercise command line) and waits until it has loaded its library.
    pub fn start(mut cmd: Command, dir: &Path) -> Workload {
        let ready = dir.join("ready");
        let go = dir.join("go");
        cmd.arg("--ready-file")
            .arg(&ready)
            .arg("--wait-file")
            .arg(&go);
        Workload::start_with_files(cmd, &ready, &go)
    }

    /// As `start`, with the ready/go file options already on the command line.
    pub fn start_with_files(mut cmd: Command, ready: &Path, go: &Path) -> Workload {
        let child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("workload starts");
        wait_until(
            Duration::from_secs(30),
            || ready.exists(),
            "the workload to load its library",
        );
        Workload {
            child,
            go: go.to_owned(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn go(&self) {
        std::fs::write(&self.go, b"").unwrap();
    }

    /// Waits for the workload to exit and returns its JSON output (last line).
    pub fn finish(self) -> Value {
        let out = self.child.wait_with_output().unwrap();
        assert!(out.status.success(), "workload failed: {:?}", out.status);
        let text = String::from_utf8(out.stdout).unwrap();
        serde_json::from_str(text.lines().last().expect("workload printed JSON")).unwrap()
    }
}

pub fn exercise(lib: &Path) -> Command {
    let mut c = Command::new(exercise_bin());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("SIMCUDA_") {
            c.env_remove(&k);
        }
    }
    c.arg("--lib").arg(lib);
    c
}

pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool, what: &str) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A running `vgpu-agent stat --json`, with its stderr lines collected as they come.
pub struct Stat {
    child: Child,
    lines: mpsc::Receiver<String>,
    pub stderr: Vec<String>,
}

impl Stat {
    /// Starts `vgpu-agent stat --json --duration 120s ARGS` (ended with SIGINT by `finish`).
    pub fn start(args: &[&str]) -> Stat {
        let mut cmd = Command::new(agent_bin());
        cmd.args([
            "stat",
            "--json",
            "--duration",
            "120s",
            "--poll-interval",
            "200ms",
        ])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        Stat::from_command(cmd)
    }

    /// Starts any agent command that prints JSON at the end and stops on SIGINT.
    pub fn from_command(mut cmd: Command) -> Stat {
        let mut child = cmd.spawn().expect("vgpu-agent starts");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[agent] {line}");
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Stat {
            child,
            lines: rx,
            stderr: Vec::new(),
        }
    }

    /// Waits for a stderr line containing `needle`; returns it.
    pub fn wait_for(&mut self, needle: &str, timeout: Duration) -> String {
        if let Some(l) = self.stderr.iter().find(|l| l.contains(needle)) {
            return l.clone();
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.stderr.push(l.clone());
                    if l.contains(needle) {
                        return l;
                    }
                }
                Err(_) => panic!(
                    "no agent line containing {needle:?} within {timeout:?}; got {:?}",
                    self.stderr
                ),
            }
        }
    }

    /// Ends tracing (SIGINT) and returns the JSON report.
    pub fn finish(mut self) -> Value {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let out = self.child.wait_with_output().unwrap();
        while let Ok(l) = self.lines.try_recv() {
            self.stderr.push(l);
        }
        assert!(
            out.status.success(),
            "vgpu-agent stat failed: {:?}; stderr {:?}",
            out.status,
            self.stderr
        );
        serde_json::from_slice(&out.stdout).expect("stat --json prints JSON")
    }
}

/// The report's row for a process.
pub fn process(report: &Value, pid: u32) -> &Value {
    report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("pid {pid} not in the report: {report:#}"))
}

/// The (calls, errors, bytes) of one API in a row's `apis`, zeros if absent.
pub fn api(row: &Value, name: &str) -> (u64, u64, u64) {
    api_where(row, name, |_| true)
}

/// [`api`] of the row from one source (`probes` or `limiter`).
pub fn api_from(row: &Value, name: &str, source: &str) -> (u64, u64, u64) {
    api_where(row, name, |a| a["source"] == source)
}

fn api_where(row: &Value, name: &str, keep: impl Fn(&Value) -> bool) -> (u64, u64, u64) {
    row["apis"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["api"] == name && keep(a))
        .map(|a| {
            (
                a["calls"].as_u64().unwrap(),
                a["errors"].as_u64().unwrap(),
                a["bytes"].as_u64().unwrap(),
            )
        })
        .unwrap_or((0, 0, 0))
}

/// The cgroup2 mount (pure v2, or the unified hierarchy of a hybrid host).
pub fn cgroup2_root() -> PathBuf {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    mountinfo
        .lines()
        .find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            right
                .starts_with("cgroup2 ")
                .then(|| PathBuf::from(left.split(' ').nth(4).unwrap()))
        })
        .expect("a cgroup2 mount")
}

/// A cgroup made for a test (with its parents) and removed after it.
pub struct TestCgroup(pub PathBuf);

impl TestCgroup {
    pub fn new(relative: &str) -> TestCgroup {
        let p = cgroup2_root().join(relative);
        std::fs::create_dir_all(&p).unwrap();
        TestCgroup(p)
    }

    /// Moves a process into the cgroup.
    pub fn add(&self, pid: u32) {
        std::fs::write(self.0.join("cgroup.procs"), pid.to_string()).unwrap();
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // Remove the leaf and the empty parents the test created. A cgroup whose last process
        // was just killed stays busy for a moment after its `cgroup.procs` reads empty (the
        // task is still exiting): the leaf is retried for up to 2 s, or it is left behind.
        let root = cgroup2_root();
        let deadline = Instant::now() + Duration::from_secs(2);
        while std::fs::remove_dir(&self.0).is_err() && self.0.exists() {
            if Instant::now() >= deadline {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut p = self.0.clone();
        p.pop();
        while p != root && std::fs::remove_dir(&p).is_ok() {
            p.pop();
        }
    }
}

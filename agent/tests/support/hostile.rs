//! Playing a hostile tenant: a shell script in its own mount namespace (a private tmpfs that the
//! host cannot see) and its own cgroup (named like a Docker container, so `--container` finds
//! it), and running the agent against it with a bound on wall time and peak memory.

use std::{
    io::Read,
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use serde_json::Value;

use super::{TestCgroup, agent_bin, exercise_bin, limiter_lib, sim_lib, tempdir, wait_until};

/// Peak memory any agent command may reach here. Measured with these tests (debug build, each
/// prints its figure): `stat` and `run` with probes peak near 22 MiB, `limit` near 16 MiB. The
/// attacks this guards against took 1.5 GB in 2 s, until the OOM killer ended them.
pub const MAX_RSS_KIB: i64 = 256 * 1024;
/// Wall time a `limit` command may take (it takes milliseconds; an open that blocks, forever).
pub const LIMIT_WALL: Duration = Duration::from_secs(30);

/// What every attack starts from: a temporary directory, the host file the attack aims at, and a
/// copy of the simulated driver.
pub struct Attack {
    pub dir: tempfile::TempDir,
    pub secret: HostFile,
    pub lib: PathBuf,
}

impl Attack {
    pub fn set_up() -> Attack {
        let dir = tempdir();
        let secret = HostFile::new(&dir.path().join("host"));
        let lib = sim_lib(&dir.path().join("lib"));
        Attack { dir, secret, lib }
    }

    /// A tenant playing `script` (see [`Tenant`]) against this attack's host file and driver.
    pub fn tenant(&self, script: &str) -> Tenant {
        Tenant::start(self.dir.path(), &self.secret.path, &self.lib, script)
    }
}

/// A file of the host that an attack aims at: root-only, as large as a control block (so that a
/// writer that followed a link to it would find it the right size), with its bytes remembered.
pub struct HostFile {
    pub path: PathBuf,
    bytes: Vec<u8>,
    mtime: (i64, i64),
}

impl HostFile {
    pub fn new(dir: &Path) -> HostFile {
        std::fs::create_dir_all(dir).unwrap();
        let path = dir.join("host-secret");
        let bytes: Vec<u8> = (0..region::control::CONTROL_SIZE)
            .map(|i| (i * 7 + 3) as u8)
            .collect();
        std::fs::write(&path, &bytes).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let m = std::fs::metadata(&path).unwrap();
        HostFile {
            path,
            bytes,
            mtime: (m.mtime(), m.mtime_nsec()),
        }
    }

    /// Its bytes, size and modification time are what they were.
    pub fn assert_unchanged(&self, after: &str) {
        let now = std::fs::read(&self.path).unwrap();
        assert_eq!(now, self.bytes, "host file changed after {after}");
        let m = std::fs::metadata(&self.path).unwrap();
        assert_eq!(
            (m.mtime(), m.mtime_nsec()),
            self.mtime,
            "host file modified after {after}"
        );
    }
}

static TENANTS: AtomicU32 = AtomicU32::new(0);

/// A tenant running `script` (sh) in its own mount namespace and cgroup.
///
/// The script sees: `T_HOME` (a directory it mounts a private tmpfs on first), `T_READY` and
/// `T_GO` (host paths: it creates `T_READY.N` when step N is in place, and waits for `T_GO.N`),
/// `EXE` (cuda-exercise), `LIMITER` (the limiter library), `LIB` (the simulated libcuda),
/// `SECRET` (the host file's path) and `T_CGROUP` (its cgroup's directory).
pub struct Tenant {
    child: Child,
    cg: TestCgroup,
    /// The container id its cgroup names.
    pub id: String,
    pub home: PathBuf,
    ready: PathBuf,
    go: PathBuf,
}

/// The shell functions every tenant script starts with.
const PRELUDE: &str = r#"
set -e
echo $$ > "$T_CGROUP/cgroup.procs"
mount -t tmpfs tenant "$T_HOME"
step() { : > "$T_READY.$1"; while [ ! -e "$T_GO.$1" ]; do sleep 0.02; done; }
ready() { : > "$T_READY.$1"; }
# A workload under the limiter (region $T_HOME/r.region) that holds 1 MiB until killed.
limited() {
    sleep 600 | LD_PRELOAD="$LIMITER" VGPU_REAL_LIBCUDA="$LIB" \
        CUDA_DEVICE_MEMORY_SHARED_CACHE="$T_HOME/r.region" VGPU_CONTEXT_BYTES=0 \
        "$EXE" --lib "$LIB" hold --bytes 1m > "$T_HOME/out" &
    while [ ! -e "$T_HOME/r.region.ctl" ] || [ ! -s "$T_HOME/out" ]; do sleep 0.02; done
}
"#;

impl Tenant {
    pub fn start(dir: &Path, secret: &Path, lib: &Path, script: &str) -> Tenant {
        let n = TENANTS.fetch_add(1, Ordering::Relaxed);
        let seed = u64::from(std::process::id()) << 20 | u64::from(n);
        let id = format!(
            "{:016x}",
            seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1 << 63
        )
        .repeat(4);
        let cg = TestCgroup::new(&format!(
            "vgpu-hostile-{}-{n}/docker/{id}",
            std::process::id()
        ));
        let home = dir.join(format!("tenant-{n}"));
        std::fs::create_dir_all(&home).unwrap();
        let ready = dir.join(format!("ready-{n}"));
        let go = dir.join(format!("go-{n}"));
        let child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(format!("{PRELUDE}\n{script}\nsleep 600 &\nwait"))
            .env("T_HOME", &home)
            .env("T_READY", &ready)
            .env("T_GO", &go)
            .env("T_CGROUP", &cg.0)
            .env("EXE", exercise_bin())
            .env("LIMITER", limiter_lib())
            .env("LIB", lib)
            .env("SECRET", secret)
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("unshare runs");
        Tenant {
            child,
            cg,
            id,
            home,
            ready,
            go,
        }
    }

    /// Waits until the script reached `ready N` or `step N`.
    pub fn wait_ready(&mut self, n: u32) {
        let marker = PathBuf::from(format!("{}.{n}", self.ready.display()));
        let deadline = Instant::now() + Duration::from_secs(60);
        while !marker.exists() {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("the tenant's script ended ({status}) before step {n}");
            }
            assert!(
                Instant::now() < deadline,
                "the tenant never reached step {n}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Lets the script go on past `step N`.
    pub fn go(&self, n: u32) {
        std::fs::write(format!("{}.{n}", self.go.display()), b"").unwrap();
    }

    /// The shell's pid: it lives in the tenant's mount namespace for the tenant's life.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A path of the tenant's as the host reaches it: `/proc/<pid>/root/<path>`.
    pub fn reach(&self, inside: &Path) -> PathBuf {
        Path::new("/proc")
            .join(self.pid().to_string())
            .join("root")
            .join(inside.strip_prefix("/").unwrap_or(inside))
    }

    /// The container id prefix an operator would type.
    pub fn short_id(&self) -> &str {
        &self.id[..12]
    }
}

impl Drop for Tenant {
    fn drop(&mut self) {
        let _ = std::fs::write(self.cg.0.join("cgroup.kill"), "1");
        let _ = self.child.kill();
        let _ = self.child.wait();
        wait_until(
            Duration::from_secs(10),
            || {
                std::fs::read_to_string(self.cg.0.join("cgroup.procs"))
                    .map_or(true, |p| p.trim().is_empty())
            },
            "the tenant's processes to end",
        );
    }
}

/// How an agent command ended.
#[derive(Debug)]
pub struct Ran {
    /// Exit code (`None`: ended by a signal).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub wall: Duration,
    /// Peak resident memory (`ru_maxrss`, KiB).
    pub max_rss_kib: i64,
}

impl Ran {
    /// Within the memory bound, else a failure naming the command.
    pub fn assert_bounded(&self, what: &str) {
        eprintln!("{what}: peak {} KiB, {:?}", self.max_rss_kib, self.wall);
        assert!(
            self.max_rss_kib < MAX_RSS_KIB,
            "{what}: peak memory {} KiB over {MAX_RSS_KIB} KiB",
            self.max_rss_kib
        );
    }
}

/// Waits for `child` at most `limit` (then kills it and fails: it hung), collecting its output
/// and its own peak memory (`wait4`).
pub fn finish_bounded(mut child: Child, limit: Duration, what: &str) -> Ran {
    let t0 = Instant::now();
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(o) = out.as_mut() {
            let _ = o.read_to_string(&mut s);
        }
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(e) = err.as_mut() {
            let _ = e.read_to_string(&mut s);
        }
        s
    });
    let pid = child.id() as i32;
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid for wait4 to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: wait4 on our own child with valid out-pointers.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if r == pid {
            break;
        }
        assert!(r == 0, "wait4: {}", std::io::Error::last_os_error());
        if t0.elapsed() > limit {
            let _ = child.kill();
            // SAFETY: as above, blocking this time (it was killed).
            unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
            panic!(
                "{what} did not end within {limit:?} (killed); stderr: {}",
                err_reader.join().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let wall = t0.elapsed();
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    Ran {
        code,
        stdout: out_reader.join().unwrap(),
        stderr: err_reader.join().unwrap(),
        wall,
        max_rss_kib: usage.ru_maxrss,
    }
}

/// Runs `vgpu-agent ARGS` within `limit`.
pub fn agent(args: &[&str], limit: Duration) -> Ran {
    let child = Command::new(agent_bin())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("vgpu-agent starts");
    finish_bounded(child, limit, &format!("vgpu-agent {}", args.join(" ")))
}

/// Runs `vgpu-agent limit ARGS`, which must refuse: exit code 1, within [`LIMIT_WALL`], its
/// message naming `target` and containing `reason`.
pub fn limit_refused(args: &[&str], target: &str, reason: &str) -> Ran {
    let mut all = vec!["limit"];
    all.extend_from_slice(args);
    let ran = agent(&all, LIMIT_WALL);
    assert_eq!(ran.code, Some(1), "{all:?} should fail: {ran:?}");
    assert!(
        ran.stderr.contains(target) && ran.stderr.contains(reason),
        "{all:?}: the message should name {target:?} and say {reason:?}: {}",
        ran.stderr
    );
    ran.assert_bounded(&all.join(" "));
    ran
}

/// Runs `vgpu-agent limit ARGS`, which must succeed (exit code 0) and print `says`.
pub fn limit_accepted(args: &[&str], says: &str) -> Ran {
    let mut all = vec!["limit"];
    all.extend_from_slice(args);
    let ran = agent(&all, LIMIT_WALL);
    assert_eq!(ran.code, Some(0), "{ran:?}");
    assert!(ran.stdout.contains(says), "{ran:?}");
    ran
}

/// Starts the `run` daemon (200 ms interval, no calibration, no NVML) serving `socket`, reading
/// the regions under `region_dir` if given.
pub fn start_run_daemon(socket: &Path, region_dir: Option<&Path>) -> Child {
    let mut cmd = Command::new(agent_bin());
    cmd.args(["run", "--interval", "200ms", "--no-calibrate", "--no-nvml"]);
    if let Some(dir) = region_dir {
        cmd.arg("--region-dir").arg(dir);
    }
    cmd.arg("--socket")
        .arg(socket)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The daemon's snapshot once `want` holds (within 60 s).
fn wait_snapshot(socket: &Path, want: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(mut s) = std::os::unix::net::UnixStream::connect(socket) {
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut body = String::new();
            if s.read_to_string(&mut body).is_ok()
                && let Ok(v) = serde_json::from_str::<Value>(&body)
                && want(&v)
            {
                return v;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no snapshot as wanted from the daemon within 60 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The daemon keeps taking snapshots: after its first, one taken at least 400 ms later for which
/// `want` also holds.
pub fn wait_later_snapshot(socket: &Path, want: impl Fn(&Value) -> bool) -> Value {
    let first = wait_snapshot(socket, |_| true);
    wait_snapshot(socket, |s| {
        s["taken_at_unix_ms"].as_u64() >= first["taken_at_unix_ms"].as_u64().map(|t| t + 400)
            && want(s)
    })
}

/// SIGTERM, then the daemon must end cleanly within 20 s with bounded peak memory.
pub fn stop_daemon(daemon: Child, what: &str) {
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    let ran = finish_bounded(daemon, Duration::from_secs(20), what);
    assert_eq!(ran.code, Some(0), "{what}: {}", ran.stderr);
    ran.assert_bounded(what);
}

//! A tenant's flood against the running daemon, and what the tests measure of the daemon under
//! it. The flood maker is a test binary's `#[ignore]`d entry point (`flood_maker` in
//! tests/flood.rs) that [`run_maker`] plays as told by its environment:
//!
//! - `FLOOD_MAKER=non-elf`: maps `FLOOD_COUNT` small files that are not ELF, named
//!   `libcuda.so.<i>`, and every `FLOOD_EVERY_MS` replaces them with a new batch (new files, new
//!   identities).
//! - `FLOOD_MAKER=elf-copies`: maps `FLOOD_COUNT` copies of the ELF libraries `FLOOD_ELF` names
//!   (`:`-separated, taken in turn), named `libcuda.so.<i>`.
//! - `FLOOD_MAKER=many-maps`: makes `FLOOD_COUNT` mappings of one file with a long name,
//!   alternately readable and not, so the kernel cannot merge them and `/proc/PID/maps` has a
//!   long line for each.
//!
//! Each works in `FLOOD_DIR`, creates `FLOOD_READY` once its mappings are in place, and lives
//! until killed.

use std::{
    io::{BufRead, BufReader, Read},
    os::{fd::AsRawFd, unix::net::UnixStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU32, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use serde::Deserialize;
use serde_json::Value;

use super::{TestCgroup, exercise, sim_lib, wait_until};

const PAGE: usize = 4096;

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"))
}

/// Plays the flood maker its environment names (`FLOOD_MAKER`); returns at once without one.
pub fn run_maker() {
    let Ok(kind) = std::env::var("FLOOD_MAKER") else {
        return;
    };
    let dir = PathBuf::from(env("FLOOD_DIR"));
    let count: usize = env("FLOOD_COUNT").parse().unwrap();
    let ready = PathBuf::from(env("FLOOD_READY"));
    std::fs::create_dir_all(&dir).unwrap();
    match kind.as_str() {
        "non-elf" => {
            let every = Duration::from_millis(env("FLOOD_EVERY_MS").parse().unwrap());
            non_elf_batches(&dir, count, every, &ready)
        }
        "elf-copies" => {
            let elfs: Vec<PathBuf> = env("FLOOD_ELF").split(':').map(PathBuf::from).collect();
            elf_copies(&dir, count, &elfs, &ready)
        }
        "many-maps" => many_mappings(&dir, count, &ready),
        other => panic!("no flood maker {other:?}"),
    }
}

/// Maps `len` bytes of `path` privately with `prot`; the mapping's address.
fn map_file(path: &Path, len: usize, prot: i32) -> usize {
    let f = std::fs::File::open(path).unwrap();
    // SAFETY: a fresh private mapping of an open file; the maker keeps it until it unmaps it
    // with the same length, or until it is killed.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            prot,
            libc::MAP_PRIVATE,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(
        p,
        libc::MAP_FAILED,
        "mmap {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    p as usize
}

fn non_elf_batches(dir: &Path, count: usize, every: Duration, ready: &Path) -> ! {
    let body: Vec<u8> = b"not an ELF file\n".repeat(PAGE / 16);
    let mut previous: Option<(PathBuf, Vec<usize>)> = None;
    let mut batch = 0;
    loop {
        let bdir = dir.join(format!("batch{batch}"));
        std::fs::create_dir_all(&bdir).unwrap();
        let maps: Vec<usize> = (0..count)
            .map(|i| {
                let path = bdir.join(format!("libcuda.so.{}", batch * count + i));
                std::fs::write(&path, &body).unwrap();
                map_file(&path, PAGE, libc::PROT_READ)
            })
            .collect();
        if let Some((old_dir, old)) = previous.take() {
            for p in old {
                // SAFETY: a mapping of PAGE bytes this maker made and no longer uses.
                unsafe { libc::munmap(p as *mut libc::c_void, PAGE) };
            }
            std::fs::remove_dir_all(old_dir).unwrap();
        }
        previous = Some((bdir, maps));
        if batch == 0 {
            std::fs::write(ready, b"").unwrap();
        }
        std::thread::sleep(every);
        batch += 1;
    }
}

fn elf_copies(dir: &Path, count: usize, elfs: &[PathBuf], ready: &Path) -> ! {
    let maps: Vec<usize> = (0..count)
        .map(|i| {
            let elf = &elfs[i % elfs.len()];
            let len = std::fs::metadata(elf)
                .unwrap_or_else(|e| panic!("{}: {e}", elf.display()))
                .len() as usize;
            let path = dir.join(format!("libcuda.so.{i}"));
            std::fs::copy(elf, &path).unwrap();
            map_file(&path, len, libc::PROT_READ | libc::PROT_EXEC)
        })
        .collect();
    std::fs::write(ready, b"").unwrap();
    loop {
        std::thread::sleep(Duration::from_secs(60));
        std::hint::black_box(&maps);
    }
}

fn many_mappings(dir: &Path, count: usize, ready: &Path) -> ! {
    // About 200 bytes of path on every maps line.
    let path = dir.join(format!("{}.data", "many-mappings-".repeat(13)));
    let f = std::fs::File::create(&path).unwrap();
    // Sparse: no page is ever touched.
    f.set_len((count * PAGE) as u64).unwrap();
    drop(f);
    let base = map_file(&path, count * PAGE, libc::PROT_READ);
    for i in (1..count).step_by(2) {
        // SAFETY: a page inside the mapping made above, which nothing reads.
        let r = unsafe {
            libc::mprotect(
                (base + i * PAGE) as *mut libc::c_void,
                PAGE,
                libc::PROT_NONE,
            )
        };
        assert_eq!(r, 0, "mprotect: {}", std::io::Error::last_os_error());
    }
    std::fs::write(ready, b"").unwrap();
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

/// The attack's library: a small ELF exporting eight `cu*` names, compiled here.
pub fn fake_driver(dir: &Path) -> PathBuf {
    let names = [
        "cuInit",
        "cuMemAlloc_v2",
        "cuMemFree_v2",
        "cuLaunchKernel",
        "cuCtxCreate_v2",
        "cuCtxSynchronize",
        "cuStreamSynchronize",
        "cuMemcpyHtoD_v2",
    ];
    compile_library(dir, "fake-driver", &names)
}

/// A library that looks like the driver by its symbols (every traced CUDA call and the entry
/// points every libcuda exports, each an empty function): what any tenant can build in a second.
pub fn lookalike_driver(dir: &Path) -> PathBuf {
    let mut names: Vec<&str> = agent_common::api::APIS
        .iter()
        .map(|a| a.name)
        .filter(|n| n.starts_with("cu"))
        .collect();
    names.extend(["cuDriverGetVersion", "cuDeviceGet", "cuGetProcAddress"]);
    names.sort_unstable();
    names.dedup();
    compile_library(dir, "lookalike-driver", &names)
}

/// `cc -shared` of one empty function per name.
fn compile_library(dir: &Path, name: &str, names: &[&str]) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    let text: String = names
        .iter()
        .map(|n| format!("int {n}(void) {{ return 0; }}\n"))
        .collect();
    std::fs::write(&src, text).unwrap();
    let out = dir.join(format!("{name}.so"));
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .expect("cc runs");
    assert!(status.success(), "cc failed");
    out
}

/// What the tests read of a snapshot (the rest, however large, is skipped without being kept).
#[derive(Deserialize)]
pub struct Snap {
    pub taken_at_unix_ms: u64,
    pub agent: AgentPart,
    pub processes: Vec<ProcessPart>,
}

#[derive(Deserialize)]
pub struct AgentPart {
    pub libraries: Vec<LibraryPart>,
    #[serde(default)]
    pub warnings: Vec<serde::de::IgnoredAny>,
    #[serde(default)]
    pub collect_seconds: f64,
}

#[derive(Deserialize)]
pub struct LibraryPart {
    pub path: String,
    pub symbols_attached: u64,
}

#[derive(Deserialize)]
pub struct ProcessPart {
    pub key: KeyPart,
    pub apis: Vec<ApiPart>,
}

#[derive(Deserialize)]
pub struct KeyPart {
    pub pid: u32,
}

#[derive(Deserialize)]
pub struct ApiPart {
    pub api: String,
    pub source: String,
    pub calls: u64,
    pub errors: u64,
}

/// The snapshot the daemon serves on `socket` (its size in bytes beside it), or why not.
pub fn read_snapshot(socket: &Path) -> Result<(Snap, usize), String> {
    let mut s = UnixStream::connect(socket).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    let mut body = Vec::new();
    s.read_to_end(&mut body).map_err(|e| format!("read: {e}"))?;
    let snap = serde_json::from_slice(&body).map_err(|e| format!("parse: {e}"))?;
    Ok((snap, body.len()))
}

/// `taken_at_unix_ms` of the snapshot served now, from the first bytes of the socket's answer
/// only (a flooded daemon's snapshot may be very large; the field comes third).
pub fn snapshot_taken_at(socket: &Path) -> Option<u64> {
    let mut s = UnixStream::connect(socket).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut head = vec![0u8; 4096];
    let mut got = 0;
    while got < head.len() {
        match s.read(&mut head[got..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    let text = String::from_utf8_lossy(&head[..got]);
    let at = text.find("\"taken_at_unix_ms\":")? + "\"taken_at_unix_ms\":".len();
    let digits: String = text[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

pub fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// One reading of the daemon's own resources.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub at: Instant,
    pub rss_kib: u64,
    pub hwm_kib: u64,
    pub fds: usize,
}

/// The daemon's resident and peak memory (`VmRSS`, `VmHWM`, KiB) and open descriptors now.
pub fn sample(pid: u32) -> Option<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |name: &str| {
        status.lines().find_map(|l| {
            l.strip_prefix(name)?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()
        })
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count();
    Some(Sample {
        at: Instant::now(),
        rss_kib: kib("VmRSS:")?,
        hwm_kib: kib("VmHWM:")?,
        fds,
    })
}

/// What a [`Watch`] saw: its samples, and each new snapshot seen (when it was first seen and its
/// `taken_at_unix_ms`).
pub type Watched = (Vec<Sample>, Vec<(Instant, u64)>);

/// Watches a daemon on a thread of its own until stopped: its memory and descriptors every
/// 200 ms, and the `taken_at_unix_ms` of what its socket serves every 100 ms.
pub struct Watch {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Watched>>,
}

impl Watch {
    pub fn start(pid: u32, socket: PathBuf) -> Watch {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let (mut samples, mut taken) = (Vec::new(), Vec::<(Instant, u64)>::new());
            let mut tick = 0u64;
            // Relaxed: a flag read in a loop; nothing else is published through it.
            while !flag.load(Ordering::Relaxed) {
                if tick.is_multiple_of(2)
                    && let Some(s) = sample(pid)
                {
                    samples.push(s);
                }
                if let Some(t) = snapshot_taken_at(&socket)
                    && taken.last().is_none_or(|&(_, last)| last != t)
                {
                    taken.push((Instant::now(), t));
                }
                tick += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            (samples, taken)
        });
        Watch {
            stop,
            thread: Some(thread),
        }
    }

    pub fn finish(mut self) -> Watched {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The gaps (ms) between consecutive snapshots taken between `from` and `to` (unix ms), and the
/// gap from the last of them to `to` (a collector that stopped shows there).
pub fn snapshot_gaps(taken: &[(Instant, u64)], from: u64, to: u64) -> Vec<u64> {
    let inside: Vec<u64> = taken
        .iter()
        .map(|&(_, t)| t)
        .filter(|&t| t >= from && t <= to)
        .collect();
    let mut gaps: Vec<u64> = inside.windows(2).map(|w| w[1] - w[0]).collect();
    gaps.push(to - inside.last().copied().unwrap_or(from));
    gaps
}

/// The `q` quantile of `values` (nearest rank).
pub fn quantile(values: &[u64], q: f64) -> u64 {
    let mut v = values.to_vec();
    v.sort_unstable();
    if v.is_empty() {
        return 0;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// An honest tenant: cuda-exercise under its own copy of the simulated driver (a library the
/// daemon has to find and attach to), in a cgroup of its own named like a Docker container,
/// loaded and waiting to make a known number of calls.
pub struct Honest {
    pub name: &'static str,
    child: Child,
    go: PathBuf,
    pub lib: PathBuf,
    _cg: TestCgroup,
    pub started: Instant,
}

/// Calls the honest tenant makes of each API it makes (probed APIs: their counts are exact).
pub const HONEST_CALLS: u64 = 40;
pub const HONEST_APIS: [&str; 2] = ["cuMemAlloc_v2", "cuMemFree_v2"];

static HONEST: AtomicU32 = AtomicU32::new(0);

impl Honest {
    pub fn start(dir: &Path, name: &'static str) -> Honest {
        let home = dir.join(format!("honest-{name}"));
        let lib = sim_lib(&home.join("lib"));
        let n = HONEST.fetch_add(1, Ordering::Relaxed);
        let id = format!(
            "{:016x}",
            u64::from(std::process::id()) << 16 | 0xf100_0000_0000 | u64::from(n)
        )
        .repeat(4);
        let cg = TestCgroup::new(&format!(
            "vgpu-flood-{}-{name}/docker/{id}",
            std::process::id()
        ));
        let ready = home.join("ready");
        let go = home.join("go");
        let mut cmd = exercise(&lib);
        cmd.args([
            "--ready-file",
            ready.to_str().unwrap(),
            "--wait-file",
            go.to_str().unwrap(),
            "--linger-ms",
            "300000",
            "counts",
            "--init",
            "--per-api",
            &HONEST_CALLS.to_string(),
            "--apis",
            &HONEST_APIS.join(","),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
        let started = Instant::now();
        let child = cmd.spawn().expect("cuda-exercise starts");
        cg.add(child.id());
        wait_until(
            Duration::from_secs(30),
            || ready.exists(),
            "the honest tenant to load its library",
        );
        Honest {
            name,
            child,
            go,
            lib,
            _cg: cg,
            started,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether a snapshot shows its library attached.
    pub fn attached(&self, snap: &Snap) -> bool {
        let path = self.lib.display().to_string();
        snap.agent
            .libraries
            .iter()
            .any(|l| l.path == path && l.symbols_attached > 0)
    }

    /// Lets it make its calls; returns what it says it made, per API: (calls, errors).
    pub fn make_calls(&mut self) -> Vec<(String, u64, u64)> {
        std::fs::write(&self.go, b"").unwrap();
        let mut line = String::new();
        BufReader::new(self.child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        let made: Value = serde_json::from_str(&line).expect("the workload's JSON");
        HONEST_APIS
            .iter()
            .map(|&api| {
                let c = &made["calls"][api];
                (
                    api.to_owned(),
                    c["calls"].as_u64().unwrap(),
                    c["errors"].as_u64().unwrap(),
                )
            })
            .collect()
    }

    /// What a snapshot counted of its calls by the probes, per API of [`HONEST_APIS`].
    pub fn counted(&self, snap: &Snap) -> Vec<(String, u64, u64)> {
        let row = snap.processes.iter().find(|p| p.key.pid == self.pid());
        HONEST_APIS
            .iter()
            .map(|&api| {
                let a =
                    row.and_then(|r| r.apis.iter().find(|a| a.api == api && a.source == "probes"));
                (
                    api.to_owned(),
                    a.map_or(0, |a| a.calls),
                    a.map_or(0, |a| a.errors),
                )
            })
            .collect()
    }
}

impl Drop for Honest {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

//! Hostile tenants against the running agent (docs/security.md): a region whose records
//! stay odd, clients that hold `/metrics` connections open, a process whose name carries
//! terminal escape sequences or bytes that are not UTF-8, and a victim's cgroup path made
//! inside an attacker's container. Each asserts the safe outcome: the snapshot interval held and the
//! region flagged, a concurrent scrape answered, no escape byte in the operator's terminal.
//!
//! Latency bounds here are far from what is measured (a scrape under attack answers in
//! milliseconds; the bound is 1 s), so a busy machine does not fail them.

mod support;

use std::{
    io::{Read, Write},
    net::TcpStream,
    os::unix::fs::FileExt,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use support::{daemon::Daemon, *};

/// The value of the exposition line `name` (no labels: `name{} value` or `name value`).
fn gauge(body: &str, name: &str) -> Option<f64> {
    body.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?;
        let rest = rest.strip_prefix("{}").unwrap_or(rest);
        rest.strip_prefix(' ')?.parse().ok()
    })
}

/// A tenant process: creates the region at `$HOSTILE_REGION` with 1,024 slots it owns, every
/// shard of every slot used and the sequence of 8 records per shard odd (a writer stuck inside
/// them, for the reader: a valid layout it cannot read consistently), writes `$HOSTILE_READY`,
/// and lives until killed. Run by the test below in its own mount namespace and cgroup.
#[test]
#[ignore = "the tenant of a_region_of_1024_stuck_slots_keeps_the_interval_and_is_flagged"]
fn tenant_holds_a_stuck_region() {
    use region::layout::{
        API_RECORD_SIZE, HEADER_SIZE, SHARD_SIZE, SHARDS_PER_SLOT, SLOT_SIZE, SlotHeader,
        SlotRecord,
    };
    let (Some(path), Some(ready)) = (
        std::env::var_os("HOSTILE_REGION"),
        std::env::var_os("HOSTILE_READY"),
    ) else {
        return;
    };
    let mut config = region::RegionConfig::unlimited(1);
    config.slots = 1024;
    let (region, _) = region::Region::open_or_create(Path::new(&path), &config).unwrap();
    let slots: Vec<_> = (0..1024).map(|_| region.claim_slot().unwrap()).collect();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    for index in 0..1024usize {
        let slot_at = HEADER_SIZE + index * SLOT_SIZE;
        let used = slot_at + std::mem::offset_of!(SlotHeader, used_shards);
        file.write_all_at(&((1u64 << SHARDS_PER_SLOT) - 1).to_le_bytes(), used as u64)
            .unwrap();
        for shard in 0..SHARDS_PER_SLOT {
            let shard_at = slot_at + std::mem::offset_of!(SlotRecord, shards) + shard * SHARD_SIZE;
            for record in 0..8 {
                let at = shard_at + record * API_RECORD_SIZE;
                file.write_all_at(&1u64.to_le_bytes(), at as u64).unwrap();
            }
        }
    }
    std::fs::write(ready, b"").unwrap();
    loop {
        std::thread::sleep(Duration::from_secs(60));
        std::hint::black_box(&slots);
    }
}

/// Kills a child on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Row 5: a tenant's region of 1,024 slots whose records stay odd. The daemon reads it within
/// its budget and flags it (model, /metrics) while every snapshot still comes at its interval
/// and a healthy region beside it is read whole.
#[test]
fn a_region_of_1024_stuck_slots_keeps_the_interval_and_is_flagged() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let regions = dir.path().join("regions");
    let (hostile_dir, healthy_dir) = (regions.join("pod1_hostile"), regions.join("pod2_healthy"));
    std::fs::create_dir_all(&hostile_dir).unwrap();
    std::fs::create_dir_all(&healthy_dir).unwrap();
    let hostile = hostile_dir.join("hostile.cache");
    let ready = dir.path().join("tenant-ready");
    let cgroup = TestCgroup::new(&format!("vgpu-test-{}/hostile-region", std::process::id()));
    let tenant = Killed(
        Command::new("unshare")
            .args(["--mount", "--propagation", "private"])
            .arg(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "tenant_holds_a_stuck_region",
                "--ignored",
                "--nocapture",
            ])
            .env("HOSTILE_REGION", &hostile)
            .env("HOSTILE_READY", &ready)
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    cgroup.add(tenant.0.id());
    wait_until(
        Duration::from_secs(120),
        || ready.exists(),
        "the tenant's region",
    );
    // A healthy region: one live slot (this process) that recorded calls.
    let healthy = healthy_dir.join("healthy.cache");
    let (region, _) =
        region::Region::open_or_create(&healthy, &region::RegionConfig::unlimited(1)).unwrap();
    let slot = region.claim_slot().unwrap();
    let launch = agent_common::api::ApiId::from_name("cuLaunchKernel").unwrap();
    region.shard_writer(&slot).record_call(launch, 1_000, true);

    let daemon = Daemon::start(
        dir.path(),
        "1s",
        &["--region-dir", regions.to_str().unwrap()],
    );
    let hostile_shown = hostile.display().to_string();
    let flagged = |s: &Value| {
        s["agent"]["regions_unread"]
            .as_array()
            .is_some_and(|u| u.iter().any(|r| r["path"] == hostile_shown.as_str()))
    };
    wait_until(
        Duration::from_secs(30),
        || flagged(&daemon.snapshot()),
        "the hostile region flagged unread",
    );
    // Five snapshots in a row: each flags the region, took less than its interval, and came
    // one interval after the one before (not stale).
    let mut last_taken = 0;
    let mut fresh = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while fresh < 5 {
        assert!(Instant::now() < deadline, "no five fresh snapshots in 60 s");
        let s = daemon.snapshot();
        let taken = s["taken_at_unix_ms"].as_u64().unwrap();
        if taken == last_taken {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        assert!(flagged(&s), "{:#}", s["agent"]);
        let collect = s["agent"]["collect_seconds"].as_f64().unwrap();
        eprintln!("snapshot with the hostile region took {collect:.3}s");
        assert!(
            collect < 1.0,
            "the snapshot took {collect}s, its interval is 1s"
        );
        assert_eq!(s["agent"]["stale"], false);
        if last_taken > 0 {
            let gap = taken - last_taken;
            assert!(
                gap < 2_000,
                "{gap} ms between two snapshots of a 1 s interval"
            );
        }
        let containers = s["containers"].as_array().unwrap();
        let regions: Vec<&Value> = containers
            .iter()
            .flat_map(|c| c["regions"].as_array().unwrap())
            .collect();
        let hostile_info = regions
            .iter()
            .find(|r| r["path"] == hostile_shown.as_str())
            .unwrap();
        assert!(
            hostile_info["problems"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p.as_str().unwrap().contains("read budget exhausted")),
            "{hostile_info:#}"
        );
        let healthy_info = regions
            .iter()
            .find(|r| r["path"] == healthy.display().to_string().as_str())
            .expect("the healthy region is read");
        assert_eq!(healthy_info["problems"], serde_json::json!([]));
        last_taken = taken;
        fresh += 1;
    }
    let (body, _) = daemon.scrape();
    let unread: f64 = ["time", "retries"]
        .iter()
        .filter_map(|r| {
            body.lines()
                .find(|l| l.starts_with(&format!("vgpu_agent_regions_unread{{reason=\"{r}\"}}")))
                .and_then(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        })
        .sum();
    assert_eq!(unread, 1.0, "{body}");
    assert_eq!(gauge(&body, "vgpu_agent_snapshot_stale"), Some(0.0));
    drop(tenant);
}

/// Row 7: a process whose name is a terminal escape sequence. `stat`'s table shows it escaped:
/// not one ESC byte reaches the operator's terminal.
#[test]
fn a_process_named_with_escape_sequences_is_shown_inert() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    // The name the kernel keeps (comm: 15 bytes) starts with the escapes.
    let evil = dir.path().join("\x1b[2J\x1b]0;pwned\x07x");
    std::fs::copy(exercise_bin(), &evil).unwrap();
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private"])
        .arg(&evil)
        .arg("--lib")
        .arg(&lib)
        .args([
            "latency",
            "--api",
            "cuStreamSynchronize",
            "--calls",
            "50",
            "--init",
        ]);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("SIMCUDA_") {
            cmd.env_remove(&k);
        }
    }
    let cgroup = TestCgroup::new(&format!("vgpu-test-{}/escape-name", std::process::id()));
    let workload = Workload::start(cmd, dir.path());
    cgroup.add(workload.pid());
    let comm = std::fs::read_to_string(format!("/proc/{}/comm", workload.pid())).unwrap();
    assert!(
        comm.contains('\x1b'),
        "the tenant's name holds ESC: {comm:?}"
    );

    let mut stat = TextStat::start(&[
        "stat",
        "--no-daemon",
        "--no-calibrate",
        "--no-nvml",
        "--duration",
        "120s",
        "--poll-interval",
        "200ms",
    ]);
    stat.wait_for(&attached(&lib));
    stat.wait_for("tracing for");
    let pid = workload.pid();
    workload.go();
    workload.finish();
    let (out, log) = stat.finish();
    assert!(
        out.contains(&format!("PROCESS {pid} ")),
        "the process is reported: {out}"
    );
    assert!(
        !out.as_bytes().contains(&0x1b),
        "an ESC byte reached the terminal: {out:?}"
    );
    assert!(
        !out.as_bytes().contains(&0x07),
        "a BEL byte reached the terminal: {out:?}"
    );
    assert!(out.contains("\\x1b[2J"), "the name is shown escaped: {out}");
    assert!(
        !log.contains('\x1b'),
        "an ESC byte reached the log: {log:?}"
    );
}

/// `vgpu-agent stat` in text form: its stdout kept whole, its stderr read as it comes.
struct TextStat {
    child: Killed,
    log: std::sync::mpsc::Receiver<String>,
    seen: String,
}

impl TextStat {
    fn start(args: &[&str]) -> TextStat {
        let mut child = Command::new(agent_bin())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, log) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                eprintln!("[agent] {line}");
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        TextStat {
            child: Killed(child),
            log,
            seen: String::new(),
        }
    }

    fn wait_for(&mut self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.seen.contains(needle) {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .log
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no {needle:?} in the log: {}", self.seen));
            self.seen.push_str(&line);
            self.seen.push('\n');
        }
    }

    /// Ends it (SIGINT): its stdout and its whole log.
    fn finish(mut self) -> (String, String) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.0.id() as i32, libc::SIGINT) };
        let mut out = String::new();
        self.child
            .0
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        assert!(
            self.child.0.wait().unwrap().success(),
            "stat failed: {}",
            self.seen
        );
        while let Ok(l) = self.log.recv_timeout(Duration::from_secs(1)) {
            self.seen.push_str(&l);
            self.seen.push('\n');
        }
        (out, std::mem::take(&mut self.seen))
    }
}

/// Row 6 (slow client): one client sends its request a byte every 4 s; scrapes beside it are
/// answered at once, and the server closes the slow connection at its header deadline.
#[test]
fn a_slow_client_does_not_delay_a_scrape() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let daemon = Daemon::start(dir.path(), "1s", &[]);
    daemon.scrape();
    let port = daemon.port;
    let slow = std::thread::spawn(move || {
        let started = Instant::now();
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
        for &b in request {
            if s.write_all(&[b]).is_err() {
                return (started.elapsed(), true);
            }
            // Waits 4 s between bytes, watching for the server closing the connection.
            let until = Instant::now() + Duration::from_secs(4);
            while Instant::now() < until {
                let mut buf = [0u8; 256];
                match s.read(&mut buf) {
                    Ok(0) => return (started.elapsed(), true),
                    Ok(_) => return (started.elapsed(), false),
                    Err(e)
                        if e.kind() == std::io::ErrorKind::WouldBlock
                            || e.kind() == std::io::ErrorKind::TimedOut => {}
                    Err(_) => return (started.elapsed(), true),
                }
            }
        }
        (started.elapsed(), false)
    });
    std::thread::sleep(Duration::from_millis(500));
    let mut worst = Duration::ZERO;
    for _ in 0..5 {
        let (body, took) = daemon.scrape();
        assert!(body.contains("vgpu_agent_snapshot_timestamp_seconds"));
        worst = worst.max(took);
        std::thread::sleep(Duration::from_millis(300));
    }
    eprintln!("scrape beside a slow client: worst of 5 {worst:?}");
    assert!(worst < Duration::from_secs(1), "a scrape took {worst:?}");
    let (held, closed) = slow.join().unwrap();
    eprintln!("the slow client was cut after {held:?}");
    assert!(closed, "the server never closed the slow client");
    assert!(
        held < Duration::from_secs(30),
        "the slow client held its connection {held:?}"
    );
}

/// Row 6 (idle connections): 200 connections that never send a byte; a scrape beside them is
/// answered at once.
#[test]
fn two_hundred_idle_connections_do_not_delay_a_scrape() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let daemon = Daemon::start(dir.path(), "1s", &[]);
    daemon.scrape();
    let idle: Vec<TcpStream> = (0..200)
        .map(|_| TcpStream::connect(("127.0.0.1", daemon.port)).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut worst = Duration::ZERO;
    for _ in 0..5 {
        let (_, took) = daemon.scrape();
        worst = worst.max(took);
    }
    eprintln!("scrape beside 200 idle connections: worst of 5 {worst:?}");
    assert!(worst < Duration::from_secs(1), "a scrape took {worst:?}");
    drop(idle);
}

/// The process with `pid` in a snapshot.
fn process_in(snap: &Value, pid: u32) -> Option<&Value> {
    snap["processes"]
        .as_array()?
        .iter()
        .find(|p| p["key"]["pid"] == pid)
}

/// A tenant creates the victim's pod and container cgroups (`kubepods/besteffort/pod<uid>/<id>`)
/// below its own container's and runs its GPU process there, beside the victim's process in the
/// real ones: the tenant's process is counted as the tenant's container, the victim's container
/// holds only the victim's process, and the claim is listed in `agent.claims_refused`.
#[test]
fn a_victims_cgroup_nested_in_an_attackers_container_is_the_attackers() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    let victim_id = "605439acbd4fb18c145069289094b17f17e0cfa938f78012d4960bc797305f22";
    let attacker_id = "7951fb549ab99e0722a949b6c121634e1f3a36b5bacbe5392991e3b12251e6b8";
    let pod_uid = "ac04f3f2-1f2c-11e9-b015-1ebee232acfa";
    let tag = std::process::id();
    let victim_path = format!("kubepods/besteffort/pod{pod_uid}/{victim_id}");
    let cg_victim = TestCgroup::new(&format!("vgpu-test-{tag}/{victim_path}"));
    let cg_attacker = TestCgroup::new(&format!(
        "vgpu-test-{tag}/docker/{attacker_id}/{victim_path}"
    ));
    let daemon = Daemon::start(dir.path(), "200ms", &[]);
    let mut workloads = Vec::new();
    for (i, cg) in [&cg_victim, &cg_attacker].into_iter().enumerate() {
        let wdir = dir.path().join(format!("w{i}"));
        std::fs::create_dir_all(&wdir).unwrap();
        let mut cmd = exercise(&lib);
        cmd.args(["hold", "--bytes", &(64u64 << 20).to_string()])
            .stdin(Stdio::piped());
        let w = Workload::start(cmd, &wdir);
        cg.add(w.pid());
        workloads.push(w);
    }
    for w in &workloads {
        w.go();
    }
    let (victim, attacker) = (workloads[0].pid(), workloads[1].pid());
    wait_until(
        Duration::from_secs(30),
        || {
            let s = daemon.snapshot();
            [victim, attacker]
                .iter()
                .all(|p| process_in(&s, *p).is_some_and(|p| p["alive"] == true))
        },
        "both processes in the model",
    );
    let snap = daemon.snapshot();
    assert_eq!(process_in(&snap, victim).unwrap()["container"], victim_id);
    assert_eq!(
        process_in(&snap, attacker).unwrap()["container"],
        attacker_id,
        "the outer container's"
    );
    let containers = snap["containers"].as_array().unwrap();
    let pids_of = |id: &str| -> Vec<u64> {
        containers
            .iter()
            .find(|c| c["container_id"] == id)
            .map(|c| {
                c["processes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|k| k["pid"].as_u64().unwrap())
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(pids_of(victim_id), [u64::from(victim)]);
    assert_eq!(pids_of(attacker_id), [u64::from(attacker)]);
    let attacker_container = containers
        .iter()
        .find(|c| c["container_id"] == attacker_id)
        .unwrap();
    assert_eq!(attacker_container["runtime"], "docker");
    assert_eq!(attacker_container["pod_uid"], Value::Null);
    let claims = snap["agent"]["claims_refused"].as_array().unwrap();
    assert!(
        claims.iter().any(|c| {
            let c = c.as_str().unwrap();
            c.starts_with(&format!("process {attacker} ")) && c.contains(&format!("pod{pod_uid}"))
        }),
        "{claims:?}"
    );
    for mut w in workloads {
        // The end of its input ends a `hold`.
        drop(w.child.stdin.take());
        let _ = w.child.wait();
    }
    daemon.stop();
}

/// A tenant names its GPU process with bytes that are not UTF-8: the daemon shows it running,
/// its name escaped.
#[test]
fn a_process_named_with_bytes_that_are_not_utf8_is_shown_alive() {
    use std::os::unix::ffi::OsStrExt;
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    // The comm is the file name's first 15 bytes.
    let odd = dir
        .path()
        .join(std::ffi::OsStr::from_bytes(b"gpu\xff\xfe-job"));
    std::fs::copy(exercise_bin(), &odd).unwrap();
    let daemon = Daemon::start(dir.path(), "200ms", &[]);
    let mut cmd = Command::new(&odd);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("SIMCUDA_") {
            cmd.env_remove(&k);
        }
    }
    cmd.arg("--lib")
        .arg(&lib)
        .args(["hold", "--bytes", &(16u64 << 20).to_string()])
        .stdin(Stdio::piped());
    let cgroup = TestCgroup::new(&format!("vgpu-test-{}/odd-name", std::process::id()));
    let w = Workload::start(cmd, dir.path());
    cgroup.add(w.pid());
    w.go();
    let pid = w.pid();
    wait_until(
        Duration::from_secs(30),
        || process_in(&daemon.snapshot(), pid).is_some(),
        "the process in the model",
    );
    let snap = daemon.snapshot();
    let p = process_in(&snap, pid).unwrap();
    assert_eq!(p["alive"], true, "{p:#}");
    assert_eq!(p["comm"], "gpu\\xff\\xfe-job", "{p:#}");
    let mut w = w;
    drop(w.child.stdin.take());
    let _ = w.child.wait();
    daemon.stop();
}

/// Start time (clock ticks after boot) of process `pid`.
fn start_ticks(pid: u32) -> u64 {
    let mut buf = [0u8; tenant_fs::MAX_STAT_BYTES];
    let path = format!("/proc/{pid}/stat");
    tenant_fs::read_stat(Path::new(&path), &mut buf)
        .unwrap()
        .start_ticks
}

/// A tenant rewrites a slot of its own region to name another container's process: that
/// process's host pid and start time, and the host's pid namespace, with 60 GiB held. The
/// victim's figures and regions stay its own, the attacker's region stays the attacker's, and
/// the forged slot is flagged in the region's problems and counted.
#[test]
fn a_forged_slot_naming_a_victims_host_pid_is_not_counted() {
    use region::layout::{HEADER_SIZE, SLOT_SIZE, SlotHeader};
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    let regions = dir.path().join("regions");
    let victim_id = "605439acbd4fb18c145069289094b17f17e0cfa938f78012d4960bc797305f22";
    let attacker_id = "7951fb549ab99e0722a949b6c121634e1f3a36b5bacbe5392991e3b12251e6b8";
    let tag = std::process::id();
    let mut workloads = Vec::new();
    let mut cgroups = Vec::new();
    for (name, id) in [("victim", victim_id), ("attacker", attacker_id)] {
        let wdir = dir.path().join(name);
        let region_dir = regions.join(format!("pod_{name}"));
        std::fs::create_dir_all(&wdir).unwrap();
        std::fs::create_dir_all(&region_dir).unwrap();
        let cg = TestCgroup::new(&format!("vgpu-test-{tag}/docker/{id}"));
        let mut cmd = exercise(&lib);
        cmd.args(["hold", "--bytes", &(64u64 << 20).to_string()])
            .stdin(Stdio::piped())
            .env("LD_PRELOAD", limiter_lib())
            .env("VGPU_REAL_LIBCUDA", &lib)
            .env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
            .env(
                "CUDA_DEVICE_MEMORY_SHARED_CACHE",
                region_dir.join(format!("{name}.cache")),
            );
        let w = Workload::start(cmd, &wdir);
        cg.add(w.pid());
        w.go();
        workloads.push(w);
        cgroups.push(cg);
    }
    let (victim, attacker) = (workloads[0].pid(), workloads[1].pid());
    let victim_region = regions.join("pod_victim/victim.cache");
    let attacker_region = regions.join("pod_attacker/attacker.cache");
    let daemon = Daemon::start(
        dir.path(),
        "200ms",
        &["--region-dir", regions.to_str().unwrap()],
    );
    let held = |s: &Value, pid: u32| -> Option<(String, u64)> {
        let l = &process_in(s, pid)?["limiter"];
        Some((l["region"].as_str()?.to_owned(), l["held"][0].as_u64()?))
    };
    let mut before = None;
    wait_until(
        Duration::from_secs(30),
        || {
            let s = daemon.snapshot();
            before = held(&s, victim);
            before.is_some() && held(&s, attacker).is_some()
        },
        "both processes' slots in the model",
    );
    let before = before.unwrap();
    assert_eq!(before.0, victim_region.display().to_string());

    // The attacker's forgery: the slot after its own made a copy of its own, then named the
    // victim (its pid in the state word, its start time, the host's pid namespace), 60 GiB held
    // on device 0.
    let own = {
        let f = tenant_fs::open_no_links(&attacker_region, tenant_fs::Access::Read).unwrap();
        let snap = region::reader::RegionReader::from_file(f)
            .unwrap()
            .snapshot()
            .unwrap();
        assert_eq!(snap.slots.len(), 1, "the attacker's own slot");
        (
            snap.slots[0].index as usize,
            snap.geometry.slot_count as usize,
        )
    };
    let (own, forged_index) = (own.0, (own.0 + 1) % own.1);
    let slot_at = |i: usize| (HEADER_SIZE + i * SLOT_SIZE) as u64;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&attacker_region)
        .unwrap();
    let mut header = vec![0u8; std::mem::size_of::<SlotHeader>()];
    file.read_exact_at(&mut header, slot_at(own)).unwrap();
    let state = std::mem::offset_of!(SlotHeader, state);
    header[state..state + 4].copy_from_slice(&victim.to_le_bytes());
    let at = |field: usize, value: u64, header: &mut Vec<u8>| {
        header[field..field + 8].copy_from_slice(&value.to_le_bytes())
    };
    at(
        std::mem::offset_of!(SlotHeader, start_time),
        start_ticks(victim),
        &mut header,
    );
    at(
        std::mem::offset_of!(SlotHeader, pid_ns),
        tenant_fs::own_pid_namespace().unwrap(),
        &mut header,
    );
    at(
        std::mem::offset_of!(SlotHeader, held),
        60 << 30,
        &mut header,
    );
    file.write_all_at(&header, slot_at(forged_index)).unwrap();

    let attacker_shown = attacker_region.display().to_string();
    let forged =
        format!("slot {forged_index}: claims pid {victim}, which does not map this region");
    let region_of = |s: &Value, id: &str, path: &str| -> Option<Value> {
        s["containers"]
            .as_array()?
            .iter()
            .find(|c| c["container_id"] == id)?["regions"]
            .as_array()?
            .iter()
            .find(|r| r["path"] == path)
            .cloned()
    };
    let mut flagged = Value::Null;
    wait_until(
        Duration::from_secs(30),
        || {
            flagged = daemon.snapshot();
            region_of(&flagged, attacker_id, &attacker_shown).is_some_and(|r| {
                r["problems"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|p| p.as_str().unwrap().starts_with(&forged))
            })
        },
        "the forged slot flagged in the attacker's region",
    );
    // Two snapshots after the forgery: the victim's figures are its own.
    for s in [flagged, daemon.snapshot()] {
        assert_eq!(held(&s, victim), Some(before.clone()), "{:#}", s["agent"]);
        let victim_regions: Vec<&str> = s["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["container_id"] == victim_id)
            .unwrap()["regions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["path"].as_str().unwrap())
            .collect();
        assert_eq!(
            victim_regions,
            [victim_region.display().to_string().as_str()]
        );
        assert!(region_of(&s, attacker_id, &attacker_shown).is_some());
        assert!(s["agent"]["slots_refused"].as_u64().unwrap() >= 1);
    }
    for mut w in workloads {
        drop(w.child.stdin.take());
        let _ = w.child.wait();
    }
    daemon.stop();
}

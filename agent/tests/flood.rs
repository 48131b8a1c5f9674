//! A tenant's flood against the running daemon (docs/security.md, attacks 8-10): the daemon with
//! real eBPF, honest tenants under the simulated driver, and a hostile tenant in its own mount
//! namespace and cgroup that maps, all at once,
//!
//! - (N1) [`NON_ELF_BATCH`] small files that are not ELF, named `libcuda.so.<i>`, replaced by a
//!   new batch every [`NON_ELF_EVERY_MS`] ms (new identities, so each batch is new to the agent);
//! - (N2) [`ELF_COPIES`] copies of ELF libraries compiled here with `cc`, taken in turn: the
//!   attack's 15 KB one exporting eight `cu*` names, and one exporting every traced CUDA call
//!   (empty functions: a library that looks like the driver by its symbols, which any tenant can
//!   build), each a library the agent could attach to;
//! - (N3) [`MANY_MAPS_PROCESSES`] processes of [`MANY_MAPS`] mappings each (one file, alternate
//!   pages readable and not, a 200-byte path on each maps line: about 16 MB of maps a process).
//!
//! The bounds asserted are the ones docs/security.md states for a flood: the daemon's peak
//! memory (`VmHWM`) under 128 MiB and its open descriptors under 1,024 throughout; snapshots at a
//! 1 s interval at most 1.5 s apart (p99 of the gaps during the flood, and the gap to the flood's
//! end, so a collector that stopped fails); an honest tenant started before, during and after
//! the flood attached, and its calls counted exactly (the workload's own count is the referee);
//! `/metrics` answering each scrape within 2 s; SIGTERM ending the daemon within 2 s. Every
//! figure is printed (`--nocapture` shows them) and every bound is checked before the test fails,
//! so one run gives all the figures.
//!
//! Scale: the attack ran 2,500 library copies and 31 processes of 65,000 mappings for minutes;
//! here the flood lasts [`FLOOD`] and is scaled to keep the test near 50 s (the podman case near
//! 15 s) on a 2-core CI host while still far past each bound for an agent without them: 300
//! copies at about ten uprobe links each are three times the descriptor bound; 4,000 refused
//! files every 4 s accumulate warnings without bound; four processes of 60,000 mappings are 64 MB
//! of maps a poll. Measured against an agent without the bounds: 3,071 descriptors, snapshots
//! 10-16.6 s apart, the tenant started during the flood never probed, and SIGTERM not obeyed
//! within 10 s (the kernel then took two minutes to release the links, about 40 ms each). More
//! would only lengthen that release, which an agent without the bounds makes the test wait for.
//! The podman case plays N2 alone from a real container (runc) and checks that what the daemon
//! held for it is released once the container is removed.

mod support;

use std::{
    fs::File,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use support::{
    daemon::Daemon,
    flood::*,
    hostile::Attack,
    podman::{self, copy_with_libraries},
    prometheus::http_get,
    *,
};

/// N1: refused files mapped at once, and how often they are replaced by new ones.
const NON_ELF_BATCH: usize = 4_000;
const NON_ELF_EVERY_MS: u64 = 4_000;
/// N2: copies of the small ELF library.
const ELF_COPIES: usize = 300;
/// N2 from a podman container: half as many (its descriptors are three times past the bound
/// already, and an agent without the bound takes about 40 ms a link to release them at exit).
const PODMAN_ELF_COPIES: usize = 150;
/// N3: processes, and mappings each (the kernel's default `vm.max_map_count` is 65,530).
const MANY_MAPS_PROCESSES: usize = 4;
const MANY_MAPS: usize = 60_000;
/// How long the flood lasts once in place.
const FLOOD: Duration = Duration::from_secs(40);

/// The bounds (docs/security.md, "Bounds").
const MAX_HWM_KIB: u64 = 128 * 1024;
const MAX_FDS: usize = 1_024;
const MAX_SNAPSHOT_GAP_P99_MS: u64 = 1_500;
const MAX_SCRAPE: Duration = Duration::from_secs(2);
const MAX_SIGTERM: Duration = Duration::from_secs(2);
/// How long an honest tenant's library may take to be attached, and its counts to show.
const ATTACH_WITHIN: Duration = Duration::from_secs(20);
const COUNTED_WITHIN: Duration = Duration::from_secs(20);

/// The hostile tenant's flood maker (see `support::flood`); run by the tests below.
#[test]
#[ignore = "the flood maker of the flood tests, run by them with FLOOD_MAKER set"]
fn flood_maker() {
    run_maker();
}

/// Figures and failed bounds, gathered as the test goes so that one run reports them all.
#[derive(Default)]
struct Report {
    figures: Vec<String>,
    failures: Vec<String>,
}

impl Report {
    fn figure(&mut self, text: String) {
        eprintln!("flood figure: {text}");
        self.figures.push(text);
    }

    fn check(&mut self, ok: bool, text: String) {
        if !ok {
            eprintln!("flood bound failed: {text}");
            self.failures.push(text);
        }
    }

    fn finish(self) {
        eprintln!("flood figures:\n  {}", self.figures.join("\n  "));
        assert!(
            self.failures.is_empty(),
            "bounds failed under the flood:\n  {}",
            self.failures.join("\n  ")
        );
    }
}

/// Waits (at most [`ATTACH_WITHIN`]) for the daemon to attach to `honest`'s library; how long
/// that took from the tenant's start.
fn wait_attached(daemon: &Daemon, honest: &Honest) -> Option<Duration> {
    let deadline = Instant::now() + ATTACH_WITHIN;
    while Instant::now() < deadline {
        if let Ok((snap, _)) = read_snapshot(&daemon.socket)
            && honest.attached(&snap)
        {
            return Some(honest.started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    None
}

/// The honest tenant's life: attached, its calls made and counted exactly by the probes (in a
/// snapshot taken after its last call). Figures and failures go to `report`.
fn probe_honest(daemon: &Daemon, honest: &mut Honest, report: &mut Report) {
    let name = honest.name;
    let attached = wait_attached(daemon, honest);
    report.figure(format!(
        "honest tenant {name}: library attached after {}",
        attached.map_or("never (within 20 s)".into(), |d| format!("{d:.2?}"))
    ));
    report.check(
        attached.is_some(),
        format!("honest tenant {name}: its library was not attached within {ATTACH_WITHIN:?}"),
    );
    let made = honest.make_calls();
    let after = now_unix_ms();
    let deadline = Instant::now() + COUNTED_WITHIN;
    let counted = loop {
        if let Ok((snap, _)) = read_snapshot(&daemon.socket)
            && snap.taken_at_unix_ms > after
        {
            break Some(honest.counted(&snap));
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    report.figure(format!(
        "honest tenant {name}: made {made:?}, counted {counted:?}"
    ));
    report.check(
        counted.as_ref() == Some(&made),
        format!(
            "honest tenant {name}: made (api, calls, errors) {made:?}, the probes counted {counted:?}"
        ),
    );
}

/// One scrape of `/metrics`, timed, checked against [`MAX_SCRAPE`].
fn scrape(daemon: &Daemon, when: &str, report: &mut Report) {
    let started = Instant::now();
    let got = http_get(daemon.port, "/metrics");
    let took = started.elapsed();
    let ok =
        matches!(&got, Ok((200, body)) if body.contains("vgpu_agent_snapshot_timestamp_seconds"));
    report.figure(format!(
        "/metrics {when}: {} in {took:.2?}",
        match &got {
            Ok((code, body)) => format!("{code}, {} bytes", body.len()),
            Err(e) => format!("error {e}"),
        }
    ));
    report.check(
        ok && took < MAX_SCRAPE,
        format!(
            "/metrics {when}: {got:?} after {took:?}",
            got = got.map(|(c, _)| c)
        ),
    );
}

/// The tenant's script: the three floods, each a flood maker in the background.
fn flood_script(elfs: &[PathBuf]) -> String {
    let exe = std::env::current_exe().unwrap();
    let run = format!(
        "'{}' --exact flood_maker --ignored --nocapture --test-threads 1 > /dev/null",
        exe.display()
    );
    let makers = 2 + MANY_MAPS_PROCESSES;
    format!(
        r#"
FLOOD_MAKER=non-elf FLOOD_DIR="$T_HOME/n1" FLOOD_COUNT={NON_ELF_BATCH} FLOOD_EVERY_MS={NON_ELF_EVERY_MS} FLOOD_READY="$T_HOME/ready-n1" {run} &
FLOOD_MAKER=elf-copies FLOOD_DIR="$T_HOME/n2" FLOOD_COUNT={ELF_COPIES} FLOOD_ELF='{elf}' FLOOD_READY="$T_HOME/ready-n2" {run} &
i=0
while [ $i -lt {MANY_MAPS_PROCESSES} ]; do
    FLOOD_MAKER=many-maps FLOOD_DIR="$T_HOME/n3-$i" FLOOD_COUNT={MANY_MAPS} FLOOD_READY="$T_HOME/ready-n3-$i" {run} &
    i=$((i + 1))
done
while [ "$(ls "$T_HOME" | grep -c '^ready-')" -lt {makers} ]; do sleep 0.05; done
ready 1
"#,
        elf = elfs
            .iter()
            .map(|e| e.display().to_string())
            .collect::<Vec<_>>()
            .join(":")
    )
}

/// Peak figures of the samples taken in `[from, to)`.
fn peaks(samples: &[Sample], from: Instant, to: Instant) -> (u64, u64, usize) {
    samples
        .iter()
        .filter(|s| s.at >= from && s.at < to)
        .fold((0, 0, 0), |(r, h, f), s| {
            (r.max(s.rss_kib), h.max(s.hwm_kib), f.max(s.fds))
        })
}

/// Attacks 8-10 together (N1 + N2 + N3) against the daemon, with honest tenants started before,
/// during and after the flood.
#[test]
fn a_flood_of_fake_drivers_and_mappings_keeps_the_daemon_bounded_and_every_tenant_probed() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let mut report = Report::default();
    let dir = tempdir();
    let elfs = [fake_driver(dir.path()), lookalike_driver(dir.path())];
    report.figure(format!(
        "scale: N1 {NON_ELF_BATCH} non-ELF files every {NON_ELF_EVERY_MS} ms, N2 {ELF_COPIES} \
         copies of ELFs of {:?} B, N3 {MANY_MAPS_PROCESSES} processes x {MANY_MAPS} mappings, \
         flood {FLOOD:?}",
        elfs.iter()
            .map(|e| std::fs::metadata(e).unwrap().len())
            .collect::<Vec<_>>()
    ));
    let log_path = dir.path().join("daemon.log");
    let daemon = Daemon::start_with_log(
        dir.path(),
        "1s",
        &[],
        Stdio::from(File::create(&log_path).unwrap()),
    );
    let started = Instant::now();
    let watch = Watch::start(daemon.pid(), daemon.socket.clone());

    let mut before = Honest::start(dir.path(), "before");
    let before_attached = wait_attached(&daemon, &before);
    let idle = sample(daemon.pid()).unwrap();
    report.figure(format!(
        "before the flood: RSS {} KiB, HWM {} KiB, {} fds",
        idle.rss_kib, idle.hwm_kib, idle.fds
    ));

    let attack = Attack::set_up();
    let mut tenant = attack.tenant(&flood_script(&elfs));
    tenant.wait_ready(1);
    let flood_from = now_unix_ms();
    let flood_started = Instant::now();
    report.figure(format!(
        "the flood in place {:.1?} after the daemon started",
        flood_started - started
    ));
    report.check(
        before_attached.is_some(),
        "honest tenant before: not attached before the flood".into(),
    );

    std::thread::sleep(Duration::from_secs(3));
    scrape(&daemon, "3 s into the flood", &mut report);
    probe_honest(&daemon, &mut before, &mut report);
    let mut during = Honest::start(dir.path(), "during");
    probe_honest(&daemon, &mut during, &mut report);
    scrape(&daemon, "after the honest tenants", &mut report);
    if let Ok((snap, bytes)) = read_snapshot(&daemon.socket) {
        report.figure(format!(
            "snapshot during the flood: {bytes} bytes, {} warnings, {} libraries, collected in {:.2} s",
            snap.agent.warnings.len(),
            snap.agent.libraries.len(),
            snap.agent.collect_seconds
        ));
    }
    std::thread::sleep(FLOOD.saturating_sub(flood_started.elapsed()));
    scrape(&daemon, "at the flood's end", &mut report);
    let flood_to = now_unix_ms();
    let flood_ended = Instant::now();
    drop(tenant);
    drop(before);
    drop(during);

    let mut after = Honest::start(dir.path(), "after");
    probe_honest(&daemon, &mut after, &mut report);
    scrape(&daemon, "after the flood", &mut report);
    if let Ok((snap, bytes)) = read_snapshot(&daemon.socket) {
        report.figure(format!(
            "snapshot after the flood: {bytes} bytes, {} warnings, {} libraries",
            snap.agent.warnings.len(),
            snap.agent.libraries.len()
        ));
    }
    let last = sample(daemon.pid());
    let (samples, taken) = watch.finish();
    let (status, took) = daemon.stop_within(Duration::from_secs(10));
    drop(after);

    let (rss, hwm, fds) = peaks(&samples, started, Instant::now());
    let (_, _, flood_fds) = peaks(&samples, flood_started, flood_ended);
    let hwm = last.map_or(hwm, |l| hwm.max(l.hwm_kib));
    report.figure(format!(
        "daemon peak: RSS {rss} KiB, HWM {hwm} KiB, {fds} fds ({flood_fds} during the flood); \
         at the end: {last:?}"
    ));
    report.check(
        hwm < MAX_HWM_KIB,
        format!("peak memory {hwm} KiB, bound {MAX_HWM_KIB} KiB"),
    );
    report.check(
        fds < MAX_FDS,
        format!("peak open descriptors {fds}, bound {MAX_FDS}"),
    );
    let gaps = snapshot_gaps(&taken, flood_from, flood_to);
    let p99 = quantile(&gaps, 0.99);
    report.figure(format!(
        "snapshot gaps during the flood (ms, {} gaps): p50 {}, p99 {p99}, max {}",
        gaps.len(),
        quantile(&gaps, 0.5),
        gaps.iter().max().unwrap_or(&0)
    ));
    let mut late: Vec<(u64, u64)> = taken
        .windows(2)
        .filter(|w| w[1].1 >= flood_from && w[1].1 <= flood_to)
        .map(|w| (w[1].1 - w[0].1, w[0].1.saturating_sub(flood_from)))
        .filter(|&(gap, _)| gap > MAX_SNAPSHOT_GAP_P99_MS)
        .collect();
    late.sort_unstable_by(|a, b| b.cmp(a));
    report.figure(format!(
        "snapshot gaps over {MAX_SNAPSHOT_GAP_P99_MS} ms (gap ms, from ms into the flood): {late:?}"
    ));
    report.check(
        p99 <= MAX_SNAPSHOT_GAP_P99_MS && gaps.len() >= 10,
        format!(
            "snapshot gaps p99 {p99} ms over {} gaps, bound {MAX_SNAPSHOT_GAP_P99_MS} ms",
            gaps.len()
        ),
    );
    report.figure(format!("SIGTERM: {status:?} after {took:.2?}"));
    report.check(
        status.is_some_and(|s| s.success()) && took < MAX_SIGTERM,
        format!("SIGTERM ended the daemon with {status:?} after {took:?}, bound {MAX_SIGTERM:?}"),
    );
    let log = std::fs::metadata(&log_path).map_or(0, |m| m.len());
    report.figure(format!("daemon log: {log} bytes"));
    report.finish();
}

/// Attack 9 (N2) from a real podman container (runc): the daemon's descriptors stay bounded while
/// the container maps the copies, an honest process started during it is probed and counted, and
/// what the daemon held for the container is released once it is removed (and the honest
/// process's library once it exits).
#[test]
fn a_podman_container_mapping_fake_drivers_is_bounded_and_released() {
    let _serial = serial();
    if !privileged() || !podman::available() {
        return;
    }
    let mut report = Report::default();
    let dir = tempdir();
    let elf = fake_driver(dir.path());
    let rootfs = dir.path().join("rootfs");
    let opt = Path::new("/opt/t");
    copy_with_libraries(
        &std::env::current_exe().unwrap(),
        &rootfs,
        &opt.join("flood"),
    );
    copy_with_libraries(&elf, &rootfs, &opt.join("fake-driver.so"));
    std::fs::create_dir_all(rootfs.join("tmp")).unwrap();

    let log_path = dir.path().join("daemon.log");
    let daemon = Daemon::start_with_log(
        dir.path(),
        "1s",
        &[],
        Stdio::from(File::create(&log_path).unwrap()),
    );
    let watch = Watch::start(daemon.pid(), daemon.socket.clone());
    let mut first = Honest::start(dir.path(), "before");
    let first_attached = wait_attached(&daemon, &first);
    report.check(
        first_attached.is_some(),
        "honest tenant before: not attached before the container".into(),
    );
    let baseline = sample(daemon.pid()).unwrap();
    report.figure(format!("before the container: {} fds", baseline.fds));

    let name = format!("vgpu-flood-{}", std::process::id());
    let container = podman::Container::run(
        &name,
        &[
            "--env".into(),
            "FLOOD_MAKER=elf-copies".into(),
            "--env".into(),
            "FLOOD_DIR=/tmp/n2".into(),
            "--env".into(),
            format!("FLOOD_COUNT={PODMAN_ELF_COPIES}"),
            "--env".into(),
            "FLOOD_ELF=/opt/t/fake-driver.so".into(),
            "--env".into(),
            "FLOOD_READY=/tmp/ready".into(),
            "--rootfs".into(),
            rootfs.display().to_string(),
            "/opt/t/flood".into(),
            "--exact".into(),
            "flood_maker".into(),
            "--ignored".into(),
            "--nocapture".into(),
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while !rootfs.join("tmp/ready").exists() {
        assert!(
            Instant::now() < deadline,
            "the container's flood was not in place within 60 s; its output: {}",
            container.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let flooded = Instant::now();
    probe_honest(&daemon, &mut first, &mut report);
    let mut during = Honest::start(dir.path(), "during");
    probe_honest(&daemon, &mut during, &mut report);
    std::thread::sleep(Duration::from_secs(5).saturating_sub(flooded.elapsed()));
    let held = sample(daemon.pid()).unwrap();
    report.figure(format!("with the container: {} fds", held.fds));
    // Its library is unused once it exits, as the container's will be.
    drop(during);

    let removed = Instant::now();
    drop(container);
    report.figure(format!("podman rm took {:.2?}", removed.elapsed()));
    // Released once the container (and the honest process started during it) is gone: back to
    // what the daemon held before it, within the few descriptors a socket client holds for a
    // moment.
    let released_deadline = Instant::now() + Duration::from_secs(15);
    let released = loop {
        let now = sample(daemon.pid()).unwrap();
        if now.fds <= baseline.fds + 8 {
            break Some((removed.elapsed(), now.fds));
        }
        if Instant::now() > released_deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    report.figure(format!(
        "after the container was removed: {}",
        released.map_or_else(
            || format!("{} fds after 15 s", sample(daemon.pid()).unwrap().fds),
            |(t, fds)| format!("{fds} fds, {t:.2?} after removal")
        )
    ));
    report.check(
        released.is_some(),
        format!(
            "the daemon's descriptors did not come back to {} + 8 within 15 s of the container's removal",
            baseline.fds
        ),
    );
    let (samples, _) = watch.finish();
    let (status, took) = daemon.stop_within(Duration::from_secs(10));
    drop(first);
    let (_, hwm, fds) = peaks(&samples, samples[0].at, Instant::now());
    report.figure(format!(
        "daemon peak: {fds} fds, HWM {hwm} KiB; SIGTERM: {status:?} after {took:.2?}"
    ));
    report.check(
        fds < MAX_FDS,
        format!("peak open descriptors {fds}, bound {MAX_FDS}"),
    );
    report.check(
        status.is_some_and(|s| s.success()) && took < MAX_SIGTERM,
        format!("SIGTERM ended the daemon with {status:?} after {took:?}, bound {MAX_SIGTERM:?}"),
    );
    report.finish();
}

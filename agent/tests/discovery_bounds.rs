//! What a tenant can make discovery hold, with real eBPF (docs/security.md, attacks 8 and 9): a
//! process mapping many copies of a driver gets a bounded number attached, the rest counted, and
//! they are detached once it exits; a process mapping thousands of files named `libcuda.so.<i>`
//! that are not drivers leaves a bounded snapshot and bounded warnings.

mod support;

use std::{path::Path, time::Duration, time::Instant};

use serde_json::Value;
use support::{hostile::*, *};

/// Open descriptors of a process.
fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// The daemon's current snapshot.
fn snapshot(socket: &Path) -> Value {
    use std::io::Read;
    let mut s = std::os::unix::net::UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    serde_json::from_str(&body).unwrap()
}

fn tenant_libraries(s: &Value, home: &str) -> usize {
    s["agent"]["libraries"].as_array().map_or(0, |l| {
        l.iter()
            .filter(|lib| lib["path"].as_str().is_some_and(|p| p.starts_with(home)))
            .count()
    })
}

/// Files of the tenant (by its container id) skipped for `reason` (other tests on the machine
/// may have tenants of their own).
fn skipped(s: &Value, tenant: &str, reason: &str) -> u64 {
    s["agent"]["libraries_skipped"].as_object().map_or(0, |m| {
        m.iter()
            .filter(|(k, _)| k.starts_with(tenant))
            .filter_map(|(_, r)| r[reason].as_u64())
            .sum()
    })
}

/// Attack 9: one process maps 40 copies of the driver (each a real ELF with every entry point).
/// Eight are considered (the bound per process), four of them attached (the tenant's bound), the
/// other four counted as `tenant_cap` and the 32 past the process's bound as `mappings`; the daemon's
/// descriptors stay bounded; once the process exits the four are detached and its descriptors
/// go back; SIGTERM ends the daemon within 2 s.
#[test]
fn attack9_many_driver_copies_are_bounded_per_tenant_and_released_on_exit() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let attack = Attack::set_up();
    let mut t = attack.tenant(
        r#"
for i in $(seq 1 40); do mkdir -p "$T_HOME/c$i"; cp "$LIB" "$T_HOME/c$i/libcuda.so.1"; done
python3 -c 'import mmap, sys, time, glob
maps = []
for p in sorted(glob.glob(sys.argv[1] + "/c*/libcuda.so.1")):
    f = open(p, "rb")
    maps.append(mmap.mmap(f.fileno(), 4096, prot=mmap.PROT_READ))
open(sys.argv[2], "w").close()
time.sleep(600)' "$T_HOME" "$T_HOME/mapped" &
echo $! > "$T_HOME/mapper"
while [ ! -e "$T_HOME/mapped" ]; do sleep 0.02; done
step 1
kill $(cat "$T_HOME/mapper")
ready 2
"#,
    );
    t.wait_ready(1);
    let home = t.home.display().to_string();
    let id = t.short_id().to_owned();
    let id = id.as_str();
    let socket = attack.dir.path().join("agent.sock");
    let daemon = start_run_daemon(&socket, None);
    let pid = daemon.id();
    let before = fds(pid);
    let s = wait_later_snapshot(&socket, |s| {
        skipped(s, id, "tenant_cap") >= 4 && skipped(s, id, "mappings") >= 32
    });
    let during = fds(pid);
    eprintln!(
        "attached from the tenant: {}, skipped: {}, daemon descriptors {before} -> {during}",
        tenant_libraries(&s, &home),
        skipped(&s, id, "tenant_cap")
    );
    assert_eq!(
        tenant_libraries(&s, &home),
        4,
        "{:#}",
        s["agent"]["libraries"]
    );
    assert_eq!(skipped(&s, id, "tenant_cap"), 4);
    assert_eq!(
        skipped(&s, id, "mappings"),
        32,
        "{:#}",
        s["agent"]["libraries_skipped"]
    );
    assert!(during < 400, "daemon descriptors: {during}");
    t.go(1);
    t.wait_ready(2);
    let s = wait_later_snapshot(&socket, |s| tenant_libraries(s, &home) == 0);
    assert_eq!(
        skipped(&s, id, "tenant_cap") + skipped(&s, id, "mappings"),
        0,
        "{:#}",
        s["agent"]["libraries_skipped"]
    );
    let after = fds(pid);
    eprintln!("after the tenant's process exited: daemon descriptors {after}");
    assert!(after < during, "descriptors released: {during} -> {after}");
    let t0 = Instant::now();
    stop_daemon(daemon, "the daemon after attack 9");
    eprintln!("SIGTERM to exit: {:?}", t0.elapsed());
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
}

/// Attack 8: one process maps 3,000 small files named `libcuda.so.<i>` that are not ELF. None is
/// attached; at most 8 per process are even considered (the rest counted as `mappings`); the
/// warnings and the snapshot stay small.
#[test]
fn attack8_thousands_of_non_elf_libcuda_files_leave_bounded_warnings() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let attack = Attack::set_up();
    let mut t = attack.tenant(
        r#"
mkdir "$T_HOME/n"
python3 -c 'import mmap, sys, time, os
maps = []
for i in range(3000):
    p = "%s/n/libcuda.so.%d" % (sys.argv[1], i)
    with open(p, "wb") as f:
        f.write(b"not ELF" * 100)
    f = open(p, "rb")
    maps.append(mmap.mmap(f.fileno(), 700, prot=mmap.PROT_READ))
    f.close()
open(sys.argv[2], "w").close()
time.sleep(600)' "$T_HOME" "$T_HOME/mapped" &
while [ ! -e "$T_HOME/mapped" ]; do sleep 0.02; done
ready 1
"#,
    );
    t.wait_ready(1);
    let home = t.home.display().to_string();
    let id = t.short_id().to_owned();
    let id = id.as_str();
    let socket = attack.dir.path().join("agent.sock");
    let daemon = start_run_daemon(&socket, None);
    let s = wait_later_snapshot(&socket, |s| {
        skipped(s, id, "not_a_driver") >= 8 && skipped(s, id, "mappings") >= 2992
    });
    // A few more snapshots: nothing grows.
    std::thread::sleep(Duration::from_secs(2));
    let later = snapshot(&socket);
    let size = serde_json::to_string(&later).unwrap().len();
    let warnings = later["agent"]["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w.as_str().is_some_and(|w| w.contains(&home)))
        .count();
    eprintln!(
        "snapshot {size} bytes, {warnings} warnings, skipped {:#}",
        later["agent"]["libraries_skipped"]
    );
    assert_eq!(tenant_libraries(&s, &home), 0);
    assert!(warnings <= 16, "{:#}", later["agent"]["warnings"]);
    assert!(size < 256 << 10, "snapshot of {size} bytes");
    assert_eq!(skipped(&later, id, "mappings"), 2992);
    assert_eq!(skipped(&later, id, "not_a_driver"), 8);
    stop_daemon(daemon, "the daemon after attack 8");
}

/// Attack 9 at the total bound: 16 tenants, each mapping 4 copies of the driver, fill the 64
/// libraries the agent attaches at most (about 900 uprobe links). The kernel releases a link
/// after a grace period (about 40 ms here, one after another on one thread): SIGTERM still ends
/// the daemon within 2 s, because the links are released all at once.
#[test]
fn at_the_total_bound_of_attached_libraries_sigterm_ends_the_daemon_within_2s() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let attack = Attack::set_up();
    let tenants: Vec<_> = (0..16)
        .map(|_| {
            let mut t = attack.tenant(
                r#"
for i in 1 2 3 4; do mkdir -p "$T_HOME/c$i"; cp "$LIB" "$T_HOME/c$i/libcuda.so.1"; done
python3 -c 'import mmap, sys, time, glob
maps = []
for p in sorted(glob.glob(sys.argv[1] + "/c*/libcuda.so.1")):
    f = open(p, "rb")
    maps.append(mmap.mmap(f.fileno(), 4096, prot=mmap.PROT_READ))
open(sys.argv[2], "w").close()
time.sleep(600)' "$T_HOME" "$T_HOME/mapped" &
while [ ! -e "$T_HOME/mapped" ]; do sleep 0.02; done
step 1
"#,
            );
            t.wait_ready(1);
            t
        })
        .collect();
    let homes: Vec<String> = tenants
        .iter()
        .map(|t| format!("{}/", t.home.display()))
        .collect();
    let socket = attack.dir.path().join("agent.sock");
    let daemon = start_run_daemon(&socket, None);
    let pid = daemon.id();
    let attached = |s: &Value| homes.iter().map(|h| tenant_libraries(s, h)).sum::<usize>();
    let s = wait_later_snapshot(&socket, |s| {
        s["agent"]["libraries"].as_array().map_or(0, Vec::len) >= 64
    });
    let links = fds(pid);
    eprintln!(
        "libraries attached from the tenants: {}, in all: {}, daemon descriptors {links}",
        attached(&s),
        s["agent"]["libraries"].as_array().map_or(0, Vec::len)
    );
    // 64 in all; a process of another test on the machine may hold a few of them.
    assert!(attached(&s) >= 60, "{:#}", s["agent"]["libraries"]);
    let t0 = Instant::now();
    stop_daemon(daemon, "the daemon at the bound of attached libraries");
    eprintln!("SIGTERM to exit: {:?}", t0.elapsed());
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    for t in tenants {
        t.go(1);
    }
}

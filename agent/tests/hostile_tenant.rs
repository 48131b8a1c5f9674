//! Hostile tenants against the agent running as root (docs/security.md, attacks 1-4). Each attack
//! is played by a tenant in its own mount namespace and cgroup (`support::hostile::Tenant`); the
//! control-block attack is played again from a real podman container. Each test asserts the safe
//! outcome: the host file the attack aims at keeps its bytes and modification time; `limit`
//! refuses with exit code 1 and a message naming the container (or region) and the reason, within
//! a bound; `stat` and the `run` daemon end within a bound (the daemon on SIGTERM, its collector
//! still taking snapshots) with bounded peak memory.

mod support;

use std::{path::Path, process::Command, time::Duration};

use serde_json::Value;
use support::{
    hostile::*,
    podman::{self, copy_with_libraries, host_tool},
    *,
};

/// Attack 1: the tenant replaces its control block with an absolute symlink to a host file (a
/// 0600 root file it cannot even read, of exactly a block's size); the operator then changes or
/// shows the container's limits, by container and by region path.
#[test]
fn attack1_a_control_block_linked_to_a_host_file_is_refused_and_the_file_kept() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let attack = Attack::set_up();
    let mut t = attack.tenant(
        r#"
limited
step 1
rm "$T_HOME/r.region.ctl"
ln -s "$SECRET" "$T_HOME/r.region.ctl"
ready 2
"#,
    );
    t.wait_ready(1);
    // Before the attack the block is written: the refusals below are the attack's doing.
    limit_accepted(
        &["set", "--container", t.short_id(), "--sm", "40"],
        "sm 40%",
    );
    t.go(1);
    t.wait_ready(2);
    let container = format!("container {}", t.short_id());
    let region = t.reach(&t.home.join("r.region"));
    let region_arg = region.to_str().unwrap();
    for args in [
        vec!["set", "--container", t.short_id(), "--sm", "20"],
        vec!["set", "--container", t.short_id(), "--memory", "1g"],
        vec!["show", "--container", t.short_id()],
    ] {
        limit_refused(&args, &container, "symbolic link");
        attack.secret.assert_unchanged(&args.join(" "));
    }
    let target = format!("region {region_arg}");
    for args in [
        vec!["set", "--region", region_arg, "--sm", "20"],
        vec!["show", "--region", region_arg],
    ] {
        limit_refused(&args, &target, "symbolic link");
        attack.secret.assert_unchanged(&args.join(" "));
    }
}

/// Attack 1, other shapes of the control block: a FIFO (an open that would block), a 16 GB
/// sparse file (a writer that resized would truncate it), a hard link to another file, and no
/// block at all (a writer that created one would write where the tenant chose). Refused, and the
/// file is left as the tenant made it.
#[test]
fn attack1_a_control_block_that_is_not_a_plain_block_is_refused_and_left_as_is() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let attack = Attack::set_up();
    let mut t = attack.tenant(
        r#"
limited
ctl="$T_HOME/r.region.ctl"
rm "$ctl"; mkfifo "$ctl"
step 1
rm "$ctl"; truncate -s 16G "$ctl"
step 2
rm "$ctl"; head -c 384 /dev/zero > "$T_HOME/other"; ln "$T_HOME/other" "$ctl"
step 3
rm "$ctl"
ready 4
"#,
    );
    let short = t.short_id().to_string();
    let container = format!("container {short}");
    let set = ["set", "--container", &short, "--sm", "20"];
    let show = ["show", "--container", &short];
    let ctl = t.reach(&t.home.join("r.region.ctl"));

    t.wait_ready(1);
    limit_refused(&set, &container, "FIFO");
    limit_refused(&show, &container, "FIFO");
    t.go(1);

    t.wait_ready(2);
    limit_refused(&set, &container, "not 384");
    assert_eq!(
        std::fs::metadata(&ctl).unwrap().len(),
        16 << 30,
        "not resized"
    );
    let shown = agent(&["limit", "show", "--container", &short], LIMIT_WALL);
    assert_eq!(
        shown.code,
        Some(0),
        "show reads the first block only: {shown:?}"
    );
    shown.assert_bounded("limit show of a 16 GB block");
    t.go(2);

    t.wait_ready(3);
    limit_refused(&set, &container, "hard links");
    let other = t.reach(&t.home.join("other"));
    assert_eq!(std::fs::read(&other).unwrap(), [0u8; 384], "untouched");
    t.go(3);

    t.wait_ready(4);
    limit_refused(&set, &container, "does not exist");
    assert!(!ctl.exists(), "the agent never creates a control block");
    let shown = agent(&["limit", "show", "--container", &short], LIMIT_WALL);
    assert!(
        shown.code == Some(0) && shown.stdout.contains("no control block yet"),
        "{shown:?}"
    );
    attack.secret.assert_unchanged("attack 1 variants");
}

/// Attacks 2 and 3: each process maps its libcuda from a directory whose name ends in a newline,
/// which `/proc/PID/maps` prints as `\012`; the literal `...\012/libcuda.so.1` is a FIFO, a link
/// to `/dev/zero`, or a 16 GB sparse file. A fourth process maps a 16 GB sparse file named
/// `libcuda.so.1`. `stat` and the `run` daemon attach to the three real libraries (through the
/// mappings, never by those names), refuse the sparse one within their read budget, and end in
/// bounded time and memory; the daemon answers SIGTERM and keeps taking snapshots meanwhile.
#[test]
fn attacks2_3_library_paths_that_maps_prints_escaped_are_never_opened_by_name() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let attack = Attack::set_up();
    let mut t = attack.tenant(
        r#"
for i in 1 2 3; do
    d="$T_HOME/lib$i
"
    mkdir "$d" "$T_HOME/lib$i\012"
    cp "$LIB" "$d/libcuda.so.1"
done
mkfifo "$T_HOME/lib1\012/libcuda.so.1"
ln -s /dev/zero "$T_HOME/lib2\012/libcuda.so.1"
truncate -s 16G "$T_HOME/lib3\012/libcuda.so.1"
for i in 1 2 3; do
    sleep 600 | "$EXE" --lib "$T_HOME/lib$i
/libcuda.so.1" hold --bytes 1m > "$T_HOME/out$i" &
done
mkdir "$T_HOME/big"
truncate -s 16G "$T_HOME/big/libcuda.so.1"
python3 -c 'import mmap, sys, time
f = open(sys.argv[1], "rb")
m = mmap.mmap(f.fileno(), 4096, prot=mmap.PROT_READ)
open(sys.argv[2], "w").close()
time.sleep(600)' "$T_HOME/big/libcuda.so.1" "$T_HOME/mapped" &
while [ ! -s "$T_HOME/out1" ] || [ ! -s "$T_HOME/out2" ] || [ ! -s "$T_HOME/out3" ] \
    || [ ! -e "$T_HOME/mapped" ]; do sleep 0.02; done
ready 1
"#,
    );
    t.wait_ready(1);
    let home = t.home.display().to_string();
    let attached_all = |libraries: &Value| {
        (1..=3).all(|i| {
            libraries.as_array().is_some_and(|l| {
                l.iter().any(|lib| {
                    let p = lib["path"].as_str().unwrap_or("");
                    p.starts_with(&format!("{home}/lib{i}"))
                        && p.ends_with("/libcuda.so.1")
                        && !p.contains("\\012")
                        && lib["symbols_attached"].as_u64() > Some(0)
                })
            })
        })
    };

    let stat = agent(
        &[
            "stat",
            "--json",
            "--duration",
            "2s",
            "--poll-interval",
            "200ms",
            "--no-calibrate",
        ],
        Duration::from_secs(120),
    );
    assert_eq!(stat.code, Some(0), "{stat:?}");
    stat.assert_bounded("stat");
    let report: Value = serde_json::from_str(&stat.stdout).expect("stat --json prints JSON");
    assert!(
        attached_all(&report["probes"]["libraries"]),
        "the three real libraries are attached: {:#}",
        report["probes"]["libraries"]
    );
    let warnings = report["warnings"].to_string();
    assert!(
        warnings.contains("big/libcuda.so.1"),
        "the sparse file is reported, not attached: {warnings}"
    );

    let socket = attack.dir.path().join("agent.sock");
    let daemon = start_run_daemon(&socket, None);
    let later = wait_later_snapshot(&socket, |s| attached_all(&s["agent"]["libraries"]));
    assert!(attached_all(&later["agent"]["libraries"]));
    stop_daemon(daemon, "the run daemon beside attacks 2 and 3");
    attack.secret.assert_unchanged("attacks 2 and 3");
}

/// Attack 4: the tenant's region is a FIFO; the operator changes or shows its limits by path.
/// And region directories that tenants write into hold a FIFO, a link to a host file, a link to
/// the host's root and a 16 GB sparse file: the daemon reading them keeps its snapshots coming
/// and answers SIGTERM.
#[test]
fn attack4_a_region_that_is_a_fifo_is_refused_without_blocking() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let attack = Attack::set_up();
    let shared = attack.dir.path().join("regions");
    std::fs::create_dir_all(shared.join("pod_ctr")).unwrap();
    let mut t = attack.tenant(&format!(
        r#"
mkfifo "$T_HOME/r.region"
s="{shared}/pod_ctr"
mkfifo "$s/fifo.region"
ln -s "$SECRET" "$s/link.region"
ln -s / "$s/root"
truncate -s 16G "$s/sparse.region"
ready 1
"#,
        shared = shared.display()
    ));
    t.wait_ready(1);
    let region = t.reach(&t.home.join("r.region"));
    let region_arg = region.to_str().unwrap();
    limit_refused(
        &["set", "--region", region_arg, "--sm", "40"],
        region_arg,
        "FIFO",
    );
    limit_refused(&["show", "--region", region_arg], region_arg, "FIFO");

    let socket = attack.dir.path().join("agent.sock");
    let daemon = start_run_daemon(&socket, Some(&shared));
    wait_later_snapshot(&socket, |_| true);
    stop_daemon(daemon, "the run daemon over a hostile region directory");
    attack.secret.assert_unchanged("attack 4");
}

/// Region permissions: the limiter creates its region `0600`; a region whose mode lets others
/// write it (here the tenant made it `0666`) is flagged in `stat --json`.
#[test]
fn a_region_other_uids_could_write_is_flagged() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let attack = Attack::set_up();
    let mut t = attack.tenant(
        r#"
limited
step 1
chmod 0666 "$T_HOME/r.region"
ready 2
"#,
    );
    let region_of = |report: &Value| -> Value {
        report["containers"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|c| c["regions"].as_array().unwrap())
            .find(|r| r["path"].as_str().unwrap().ends_with("/r.region"))
            .cloned()
            .unwrap_or_else(|| panic!("the tenant's region is in the report: {report:#}"))
    };
    let stat = || {
        let ran = agent(
            &[
                "stat",
                "--json",
                "--duration",
                "1s",
                "--no-calibrate",
                "--no-nvml",
            ],
            Duration::from_secs(120),
        );
        assert_eq!(ran.code, Some(0), "{ran:?}");
        serde_json::from_str::<Value>(&ran.stdout).unwrap()
    };
    t.wait_ready(1);
    let mode = std::fs::metadata(t.reach(&t.home.join("r.region"))).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o600
    );
    let region = region_of(&stat());
    assert!(region.get("writable_by_others").is_none(), "{region:#}");
    t.go(1);
    t.wait_ready(2);
    let region = region_of(&stat());
    let why = region["writable_by_others"].as_str().unwrap_or_default();
    assert!(why.contains("0666"), "{region:#}");
}

/// Attack 1 from a real container (podman with runc, a root filesystem built here): the
/// container's process runs under the limiter, then replaces its control block with an absolute
/// symlink to a host file's path. `limit set --container <podman id>` writes the block before the
/// attack and refuses after it; the host file is unchanged.
#[test]
fn attack1_from_a_podman_container() {
    let _serial = serial();
    if !privileged() || !podman::available() {
        return;
    }
    let attack = Attack::set_up();
    let rootfs = attack.dir.path().join("rootfs");
    let opt = Path::new("/opt/t");
    copy_with_libraries(&exercise_bin(), &rootfs, &opt.join("cuda-exercise"));
    copy_with_libraries(&limiter_lib(), &rootfs, &opt.join("libvgpu_limiter.so"));
    copy_with_libraries(&attack.lib, &rootfs, &opt.join("libcuda.so.1"));
    for tool in ["sh", "sleep", "rm", "ln", "touch"] {
        let host = host_tool(tool);
        copy_with_libraries(&host, &rootfs, &Path::new("/bin").join(tool));
    }
    std::fs::create_dir_all(rootfs.join("tmp")).unwrap();
    let script = r#"
sleep 600 | LD_PRELOAD=/opt/t/libvgpu_limiter.so VGPU_REAL_LIBCUDA=/opt/t/libcuda.so.1 \
    CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/r.region VGPU_CONTEXT_BYTES=0 \
    /opt/t/cuda-exercise --lib /opt/t/libcuda.so.1 hold --bytes 1m > /tmp/out &
while [ ! -e /tmp/r.region.ctl ] || [ ! -s /tmp/out ]; do sleep 0.05; done
touch /tmp/ready.1
while [ ! -e /tmp/go.1 ]; do sleep 0.05; done
rm /tmp/r.region.ctl
ln -s "$SECRET" /tmp/r.region.ctl
touch /tmp/ready.2
wait
"#;
    let run = Command::new("podman")
        .args([
            "run",
            "-d",
            "--runtime",
            "runc",
            // This machine's hard limits are below podman's defaults.
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1024:1024",
            "-e",
        ])
        .arg(format!("SECRET={}", attack.secret.path.display()))
        .arg("--rootfs")
        .arg(&rootfs)
        .args(["/bin/sh", "-c", script])
        .output()
        .unwrap();
    assert!(run.status.success(), "podman run: {run:?}");
    let id = String::from_utf8(run.stdout).unwrap().trim().to_string();
    assert_eq!(id.len(), 64, "podman printed a container id: {id:?}");
    let _container = podman::Container { name: id.clone() };
    wait_until(
        Duration::from_secs(60),
        || rootfs.join("tmp/ready.1").exists(),
        "the container's workload",
    );
    let short = &id[..12];
    limit_accepted(&["set", "--container", short, "--sm", "40"], "sm 40%");
    std::fs::write(rootfs.join("tmp/go.1"), b"").unwrap();
    wait_until(
        Duration::from_secs(30),
        || rootfs.join("tmp/ready.2").exists(),
        "the container's attack",
    );
    let container = format!("container {short}");
    limit_refused(
        &["set", "--container", short, "--sm", "20"],
        &container,
        "symbolic link",
    );
    limit_refused(&["show", "--container", short], &container, "symbolic link");
    attack
        .secret
        .assert_unchanged("the podman container's attack");
}

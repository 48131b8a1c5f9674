//! `vgpu-agent top` end to end (root): the real binary in a detached tmux session of fixed size
//! beside simulated-driver workloads in two cgroups shaped like a docker container and a
//! Kubernetes pod, driven with keys; the captured screen is checked after each. The demo's own
//! workloads (`cargo xtask demo`, shared through `demo_workloads`) are checked the same way.
//!
//! `top` shows every GPU process of the host, so each test's containers have ids of their own run
//! (its pid in the first 8 hex digits), and the tests look only at their own rows: a second set
//! of the demo's workloads, with the demo's ids, runs beside each test, as a `cargo xtask demo`
//! started on the same machine would.

mod support;
// The demo's workloads and top command line, so that this test checks what the demo shows.
#[path = "../../xtask/src/demo_workloads.rs"]
mod demo_workloads;

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use support::*;

/// A tmux server of its own (`-L`), killed when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn cmd(&self) -> Command {
        let mut c = Command::new("tmux");
        c.args(["-L", &self.socket]);
        c
    }

    fn start(socket: String, command: &str) -> Tmux {
        let t = Tmux { socket };
        let st = t
            .cmd()
            .args([
                "-f",
                "/dev/null",
                "new-session",
                "-d",
                "-s",
                "top",
                "-x",
                "160",
                "-y",
                "48",
            ])
            .arg(command)
            .env("TERM", "xterm-256color")
            .status()
            .expect("tmux runs");
        assert!(st.success(), "tmux new-session failed");
        t
    }

    fn keys(&self, keys: &[&str]) {
        let st = self
            .cmd()
            .args(["send-keys", "-t", "top"])
            .args(keys)
            .status()
            .unwrap();
        assert!(st.success());
    }

    fn literal(&self, text: &str) {
        let st = self
            .cmd()
            .args(["send-keys", "-t", "top", "-l", text])
            .status()
            .unwrap();
        assert!(st.success());
    }

    fn screen(&self) -> String {
        let out = self
            .cmd()
            .args(["capture-pane", "-p", "-t", "top"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Escape out of a view that shows `open`, then waits for `cond` on a screen without it. The
    /// wait must not pass while the view is still drawn: a key sent right after Escape can reach
    /// top in the same read and be taken as Alt-key (the filter then never opens).
    fn escape_from(&self, open: &str, what: &str, cond: impl Fn(&str) -> bool) -> String {
        self.keys(&["Escape"]);
        self.wait(what, |s| !s.contains(open) && cond(s))
    }

    /// Waits until the screen satisfies `cond`; returns it.
    fn wait(&self, what: &str, cond: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let s = self.screen();
            if cond(&s) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; screen:\n{s}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd().arg("kill-server").stderr(Stdio::null()).status();
    }
}

fn line_of(screen: &str, needle: &str) -> Option<usize> {
    screen.lines().position(|l| l.contains(needle))
}

fn tmux_present() -> bool {
    let ok = Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var_os("VGPU_REQUIRE_PRIVILEGED").is_none_or(|v| v != "1"),
            "tmux is missing: run `cargo xtask setup`"
        );
        eprintln!("skipping: tmux is missing (cargo xtask setup installs it)");
    }
    ok
}

#[test]
fn top_in_tmux_expand_sort_filter_detail_quit() {
    let _serial = serial();
    if !privileged() || !tmux_present() {
        return;
    }
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    let regions = dir.path().join("regions");
    std::fs::create_dir_all(&regions).unwrap();

    let tag = std::process::id();
    // This run's containers: their ids start with the run's tag (both found by a filter on it,
    // nobody else's), and differ in their 12-character short forms.
    let run_tag = format!("{tag:08x}");
    let docker_id = format!("{run_tag}9ab99e0722a949b6c121634e1f3a36b5bacbe5392991e3b12251e6b8");
    let k8s_id = format!("{run_tag}bd4fb18c145069289094b17f17e0cfa938f78012d4960bc797305f22");
    let pod_uid = format!("ac04f3f2-1f2c-11e9-b015-{tag:012x}");
    let _other_demo = DemoRun::start(
        dir.path(),
        "vgpu-top-other-demo",
        demo_workloads::Ids::demo(),
    );
    let cg_docker = TestCgroup::new(&format!("vgpu-top-{tag}/docker/{docker_id}"));
    let cg_k8s = TestCgroup::new(&format!(
        "vgpu-top-{tag}/kubepods/besteffort/pod{pod_uid}/{k8s_id}"
    ));
    let mut holders = Vec::new();
    for (i, (cg, bytes)) in [(&cg_docker, 64u64 << 20), (&cg_k8s, 96 << 20)]
        .into_iter()
        .enumerate()
    {
        let wdir = dir.path().join(format!("w{i}"));
        std::fs::create_dir_all(&wdir).unwrap();
        let mut cmd = exercise(&lib);
        cmd.args(["hold", "--bytes", &bytes.to_string()])
            .stdin(Stdio::piped());
        let w = Workload::start(cmd, &wdir);
        cg.add(w.pid());
        holders.push(w);
    }
    let (docker_short, k8s_short) = (&docker_id[..12], &k8s_id[..12]);

    let command = format!(
        "{} top --no-calibrate --no-nvml --no-daemon --interval 300ms --region-dir {} 2>{}; echo TOP-EXITED $?; sleep 60",
        agent_bin().display(),
        regions.display(),
        dir.path().join("top.stderr").display(),
    );
    let tmux = Tmux::start(format!("vgpu-top-test-{tag}"), &command);
    tmux.wait("both containers", |s| {
        s.contains(docker_short) && s.contains(k8s_short)
    });
    for w in &holders {
        w.go();
    }
    // The probes see the allocations: 96M in the pod, 64M in the docker container; largest first.
    let row_has = |s: &str, short: &str, what: &str| {
        s.lines()
            .find(|l| l.contains(short))
            .is_some_and(|l| l.contains(what))
    };
    let s = tmux.wait("the held memory", |s| {
        row_has(s, k8s_short, "96M") && row_has(s, docker_short, "64M")
    });
    assert!(s.contains("vgpu-agent top"), "{s}");
    assert!(s.contains("NVML disabled"), "no NVML, said so: {s}");
    assert!(
        line_of(&s, k8s_short) < line_of(&s, docker_short),
        "sorted by memory, largest first:\n{s}"
    );

    // r reverses the order; s moves the sort to the next column.
    tmux.keys(&["r"]);
    tmux.wait("the order reversed", |s| {
        line_of(s, docker_short) < line_of(s, k8s_short) && s.contains("GPU MEM / LIMIT▲")
    });
    tmux.keys(&["s"]);
    tmux.wait("sorting by GPU use", |s| s.contains("GPU%▲"));
    tmux.keys(&["s"]);
    tmux.wait("sorting by allocations", |s| s.contains("ALLOC/s▲"));
    tmux.keys(&["r", "s", "s", "s", "s", "s", "s", "s", "s", "s"]);
    tmux.wait("back to memory", |s| s.contains("GPU MEM / LIMIT▼"));

    // Other processes of the host (the other demo's) are listed too: a filter on the run's tag
    // leaves this run's two containers (expanded while it applies), the pod first.
    let k8s_pid = holders[1].pid().to_string();
    let k8s_process_row = format!("└ {k8s_pid} ");
    let other_demo = demo_workloads::Ids::demo();
    tmux.wait("the other demo's containers", |s| {
        s.contains(other_demo.short(demo_workloads::Group::Limited))
    });
    tmux.keys(&["/"]);
    tmux.literal(&run_tag);
    tmux.keys(&["Enter"]);
    tmux.wait("only this run's containers", |s| {
        s.contains(docker_short)
            && s.contains(k8s_short)
            && s.contains(&k8s_process_row)
            && !s.contains(other_demo.short(demo_workloads::Group::Limited))
            && !s.contains(other_demo.short(demo_workloads::Group::Plain))
    });
    // g selects the pod; Escape clears the filter and the selection stays on the pod, collapsed.
    tmux.keys(&["g"]);
    tmux.keys(&["Escape"]);
    tmux.wait("the filter cleared, the pod collapsed", |s| {
        s.contains(other_demo.short(demo_workloads::Group::Limited))
            && !s.contains(&k8s_process_row)
    });
    // Enter expands the selected container: the pod's process appears under it.
    tmux.keys(&["Enter"]);
    let s = tmux.wait("the pod expanded", |s| s.contains(&k8s_process_row));
    assert!(s.contains("▾"), "{s}");

    // / filters: only the docker container is left.
    tmux.keys(&["/"]);
    tmux.literal(docker_short);
    tmux.keys(&["Enter"]);
    tmux.wait("the filter applied", |s| {
        s.contains(docker_short) && !s.contains(k8s_short) && s.contains("filter")
    });
    tmux.keys(&["Escape"]);
    tmux.wait("the filter cleared", |s| {
        s.contains(docker_short) && s.contains(k8s_short)
    });

    // Enter on the process opens its detail: the API table with a latency histogram. The run's
    // rows alone (filtered on its tag): the pod, its process, the docker container, its process.
    tmux.keys(&["/"]);
    tmux.literal(&run_tag);
    tmux.keys(&["Enter"]);
    tmux.wait("only this run's containers", |s| {
        s.contains(&k8s_process_row)
            && !s.contains(other_demo.short(demo_workloads::Group::Limited))
    });
    tmux.keys(&["g", "j", "Enter"]);
    let s = tmux.wait("the process detail", |s| {
        s.contains(&format!("process {k8s_pid}")) && s.contains("HISTOGRAM")
    });
    assert!(s.contains("cuMemAlloc_v2"), "{s}");
    assert!(s.contains("probes"), "{s}");
    tmux.escape_from("HISTOGRAM", "the table again", |s| {
        s.contains("CONTAINER / PROCESS")
    });

    // q quits: the alternate screen is gone and top exited 0.
    tmux.keys(&["q"]);
    let s = tmux.wait("top to exit", |s| s.contains("TOP-EXITED"));
    assert!(s.contains("TOP-EXITED 0"), "{s}");
    assert!(
        !s.contains("CONTAINER / PROCESS"),
        "the alternate screen is left:\n{s}"
    );
    drop(tmux);

    for w in holders {
        let mut child = w.child;
        drop(child.stdin.take());
        let _ = child.wait();
    }
}

/// The demo's cgroups and workloads, ended and removed when dropped.
struct DemoRun {
    top: std::path::PathBuf,
    ids: demo_workloads::Ids,
    children: Vec<std::process::Child>,
}

impl DemoRun {
    /// Starts the demo's workloads as `ids` in cgroups below `<cgroup root>/<name>-<pid>`, their
    /// files in `dir/<name>`; returns them and where their files are.
    fn start(
        dir: &std::path::Path,
        name: &str,
        ids: demo_workloads::Ids,
    ) -> (DemoRun, demo_workloads::Paths) {
        use demo_workloads as demo;
        let files = dir.join(name);
        let paths = demo::Paths {
            exercise: exercise_bin(),
            lib: sim_lib(&files.join("lib")),
            limiter: limiter_lib(),
            regions: files.join("regions"),
            ids,
        };
        demo::prepare(&paths).unwrap();
        let mut run = DemoRun {
            top: cgroup2_root().join(format!("{name}-{}", std::process::id())),
            ids: paths.ids.clone(),
            children: Vec::new(),
        };
        for g in [demo::Group::Plain, demo::Group::Limited] {
            std::fs::create_dir_all(demo::cgroup(&run.top, &run.ids, g)).unwrap();
        }
        for w in demo::workloads(&paths) {
            run.children
                .push(demo::start(&paths, &run.top, &w).expect("a demo workload starts"));
        }
        (run, paths)
    }
}

impl Drop for DemoRun {
    fn drop(&mut self) {
        use demo_workloads::{Group, cgroup};
        for g in [Group::Plain, Group::Limited] {
            let _ = std::fs::write(cgroup(&self.top, &self.ids, g).join("cgroup.kill"), "1");
        }
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for g in [Group::Plain, Group::Limited] {
            let mut p = cgroup(&self.top, &self.ids, g);
            for _ in 0..50 {
                if std::fs::remove_dir(&p).is_ok() || !p.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            while p.pop() && p.starts_with(&self.top) && std::fs::remove_dir(&p).is_ok() {}
        }
    }
}

/// `512M`, `1.3G` (as `top` writes sizes) in bytes.
fn parse_short(s: &str) -> Option<u64> {
    let (num, unit) = s.split_at(s.find(|c: char| c.is_ascii_alphabetic())?);
    let shift = match unit {
        "B" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        _ => return None,
    };
    Some((num.parse::<f64>().ok()? * (1u64 << shift) as f64) as u64)
}

/// The pod's row (the pod with the short id `pod`): (memory used, limit, DENIED), from
/// `... ██░░ 1.3G/2.0G  SM% ... DENIED`.
fn pod_row(screen: &str, pod: &str) -> Option<(u64, u64, u64)> {
    let line = screen.lines().find(|l| l.contains(pod))?;
    let tokens: Vec<&str> = line.split_whitespace().collect();
    let at = tokens
        .iter()
        .position(|t| t.contains('/') && t.ends_with('G'))?;
    let (used, limit) = tokens[at].split_once('/')?;
    // GPU%, ALLOC/s, LAUNCH/s, API P99, SYNC, NCCL/s, THROTL, DENIED.
    let denied = tokens.get(at + 8)?.parse().ok()?;
    Some((parse_short(used)?, parse_short(limit)?, denied))
}

/// What `cargo xtask demo` shows: the limited pod works near its limit (memory above zero and
/// under the limit, the bar drawn, denials as it crosses), no warning about the limit, `e`
/// explains the header's lost and errors and lists them, and `u` shows the pod's GPU time as the
/// limiter timed its launches and says the docker container's has no limiter to time it.
#[test]
fn top_in_tmux_shows_the_demo_truthfully() {
    use demo_workloads as demo;
    let _serial = serial();
    if !privileged() || !tmux_present() {
        return;
    }
    let dir = tempdir();
    // This run's demo, and beside it the demo's own ids, as `cargo xtask demo` would run them on
    // the same machine: only this run's rows are looked at.
    let ids = demo::Ids::tagged(std::process::id());
    let (pod, plain) = (
        ids.short(demo::Group::Limited).to_string(),
        ids.short(demo::Group::Plain).to_string(),
    );
    let (run, paths) = DemoRun::start(dir.path(), "vgpu-top-demo", ids);
    let (other, _) = DemoRun::start(dir.path(), "vgpu-top-other-demo", demo::Ids::demo());
    let mut args = demo::top_args(&paths);
    args.extend(["--no-calibrate".into(), "--interval".into(), "300ms".into()]);
    let command = format!(
        "{} {} 2>{}; echo TOP-EXITED $?; sleep 60",
        agent_bin().display(),
        args.join(" "),
        dir.path().join("top.stderr").display(),
    );
    let tmux = Tmux::start(format!("vgpu-top-demo-{}", std::process::id()), &command);

    // The pod holds memory under its limit, with the bar drawn, and its allocations are denied
    // as it crosses the limit.
    let s = tmux.wait("the pod near its limit, with denials", |s| {
        pod_row(s, &pod).is_some_and(|(used, _, denied)| used > 0 && denied > 0)
    });
    let (used, limit, _) = pod_row(&s, &pod).unwrap();
    assert_eq!(limit, demo::LIMIT_BYTES, "{s}");
    assert!(
        used > demo::CONTEXT_CHARGE_BYTES && used < limit,
        "the context and some allocations, under the limit: {used}\n{s}"
    );
    let line = s.lines().find(|l| l.contains(&pod)).unwrap();
    assert!(line.contains('█'), "the bar: {line}");
    assert!(!line.contains('⚠'), "no limit below a context charge: {s}");
    assert!(s.contains("GPU%"), "{s}");
    // The docker container's memory is seen too (the probes see its allocations).
    tmux.wait("the docker container's memory", |s| {
        s.lines()
            .find(|l| l.contains(&plain))
            .and_then(|l| l.split_whitespace().find_map(parse_short))
            .is_some_and(|b| b > 0)
    });

    // e: what lost and errors count, and each of them; the numbers match the header's.
    tmux.keys(&["e"]);
    let s = tmux.wait("the counters explained", |s| {
        s.contains("the header's counters")
    });
    // The first `word N` in `s` (the dialog's title says "lost and errors").
    let number_after = |s: &str, word: &str| -> Option<u64> {
        s.match_indices(word)
            .find_map(|(i, _)| s[i + word.len()..].split_whitespace().next()?.parse().ok())
    };
    let header = s.lines().nth(2).unwrap_or_default();
    let lost = number_after(header, "lost ");
    let errors = number_after(header, "errors ");
    let dialog: String = s.lines().skip(3).collect::<Vec<_>>().join("\n");
    assert_eq!(number_after(&dialog, "lost "), lost, "{s}");
    assert_eq!(number_after(&dialog, "errors "), errors, "{s}");
    assert!(dialog.contains("probe events lost or unmatched"), "{s}");
    if lost.unwrap_or(0) > 0 {
        assert!(
            dialog.contains("free_unknown") || dialog.contains("return_without_entry"),
            "each cause is listed: {s}"
        );
    }
    tmux.escape_from("the header's counters", "the table again", |s| {
        s.contains("CONTAINER / PROCESS")
    });

    // u on the pod (filtered to it, selected first): its launching process is timed by the
    // limiter, its GPU share is the limiter's beside NVML's (none here), its kernels listed.
    let open_gpu_time = |short: &str| {
        tmux.keys(&["/"]);
        tmux.literal(short);
        tmux.keys(&["Enter", "g", "u"]);
    };
    open_gpu_time(&pod);
    let s = tmux.wait("the pod's GPU time, timed by the limiter", |s| {
        s.contains("GPU time  container") && s.contains("timed by the limiter:")
    });
    assert!(s.contains(&pod), "the pod's view: {s}");
    assert!(s.contains("limiter "), "{s}");
    tmux.wait("the pod's kernels", |s| s.contains("KERNEL"));
    // One Escape at a time: two at once read as one Alt-Escape.
    tmux.escape_from("GPU time  container", "the table again", |s| {
        s.contains("CONTAINER / PROCESS")
    });
    tmux.keys(&["Escape"]);
    tmux.wait("the table again, unfiltered", |s| {
        s.contains("CONTAINER / PROCESS") && s.contains(&plain) && s.contains(&pod)
    });
    // The docker container has no limiter: its figure is NVML's, and kernels need the limiter.
    open_gpu_time(&plain);
    let s = tmux.wait("the docker container's GPU time", |s| {
        s.contains("GPU time  container")
            && s.contains("not under the limiter: the figure is NVML-sampled")
    });
    assert!(!s.contains("KERNEL"), "no kernels without the limiter: {s}");
    tmux.keys(&["u"]);
    tmux.wait("u closes it", |s| {
        s.contains("CONTAINER / PROCESS") && !s.contains("GPU time  container")
    });
    tmux.keys(&["Escape"]);
    tmux.wait("the table again, unfiltered", |s| {
        s.contains(&pod) && s.contains(&plain)
    });

    tmux.keys(&["q"]);
    let s = tmux.wait("top to exit", |s| s.contains("TOP-EXITED"));
    assert!(s.contains("TOP-EXITED 0"), "{s}");
    drop(tmux);
    drop(other);
    drop(run);
}

#[test]
fn top_without_root_or_daemon_names_sudo() {
    // As root this is covered by the interactive test; without root, top must refuse clearly.
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return;
    }
    let out = Command::new(agent_bin())
        .args(["top", "--socket", "/nonexistent/agent.sock"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("sudo"), "{err}");
}

/// The starter of [`demo_workloads_end_with_the_process_that_started_them`]: starts the demo's
/// workloads (ids tagged `$DEMO_STARTER_TAG`) in `$DEMO_STARTER_TOP`'s cgroups, writes their pids
/// to `$DEMO_STARTER_PIDS`, and waits to be killed.
#[test]
#[ignore = "the starter of demo_workloads_end_with_the_process_that_started_them"]
fn demo_workload_starter() {
    use demo_workloads as demo;
    let (Some(top), Some(pids), Some(dir), Some(tag)) = (
        std::env::var_os("DEMO_STARTER_TOP"),
        std::env::var_os("DEMO_STARTER_PIDS"),
        std::env::var_os("DEMO_STARTER_DIR"),
        std::env::var("DEMO_STARTER_TAG").ok(),
    ) else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    let paths = demo::Paths {
        exercise: exercise_bin(),
        lib: sim_lib(&dir.join("lib")),
        limiter: limiter_lib(),
        regions: dir.join("regions"),
        ids: demo::Ids::tagged(tag.parse().unwrap()),
    };
    demo::prepare(&paths).unwrap();
    let started: Vec<std::process::Child> = demo::workloads(&paths)
        .iter()
        .map(|w| demo::start(&paths, std::path::Path::new(&top), w).unwrap())
        .collect();
    let ids: Vec<String> = started.iter().map(|c| c.id().to_string()).collect();
    std::fs::write(&pids, ids.join(" ")).unwrap();
    // Killed here by the test; the workloads end with this process, not waited for.
    for mut child in started {
        let _ = child.wait();
    }
}

/// However `cargo xtask demo` ends (its terminal closed, SIGTERM, or killed outright before it
/// could clean up), its workloads end with it: each runs in a process group of its own, out of
/// reach of the terminal's signals, so it is tied to the life of the process that started it.
/// Here that process is killed with SIGKILL: every workload is gone within 2 s.
#[test]
fn demo_workloads_end_with_the_process_that_started_them() {
    use demo_workloads as demo;
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let run = DemoRun {
        top: cgroup2_root().join(format!("vgpu-demo-starter-{}", std::process::id())),
        ids: demo::Ids::tagged(std::process::id()),
        children: Vec::new(),
    };
    for g in [demo::Group::Plain, demo::Group::Limited] {
        std::fs::create_dir_all(demo::cgroup(&run.top, &run.ids, g)).unwrap();
    }
    let pids_file = dir.path().join("pids");
    let mut starter = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "demo_workload_starter",
            "--nocapture",
        ])
        .env("DEMO_STARTER_TOP", &run.top)
        .env("DEMO_STARTER_PIDS", &pids_file)
        .env("DEMO_STARTER_DIR", dir.path())
        .env("DEMO_STARTER_TAG", std::process::id().to_string())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let pids = loop {
        if let Ok(s) = std::fs::read_to_string(&pids_file)
            && !s.is_empty()
        {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the starter never started the workloads"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let pids: Vec<u32> = pids
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert!(!pids.is_empty());
    let alive = |pid: &u32| {
        let mut buf = [0u8; tenant_fs::MAX_STAT_BYTES];
        let path = format!("/proc/{pid}/stat");
        tenant_fs::read_stat(std::path::Path::new(&path), &mut buf).is_ok_and(|s| s.state != b'Z')
    };
    assert!(
        pids.iter().all(alive),
        "the workloads run before the starter is killed"
    );
    starter.kill().unwrap();
    starter.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(2);
    while pids.iter().any(alive) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left: Vec<&u32> = pids.iter().filter(|p| alive(p)).collect();
    assert!(left.is_empty(), "workloads left running: {left:?}");
}

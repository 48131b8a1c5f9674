//! `vgpu-agent freeze|thaw` against the simulated driver's checkpoint API: a process under the
//! limiter, sharing one simulated GPU, gives all of its device memory back while frozen, stays
//! alive, its next CUDA call waits for the thaw and reads its memory back word for word; with
//! `vgpu-agent run` on the host, that next call (of any kind) is what thaws it.

mod support;

use std::{
    io::{BufRead, BufReader, Lines, Write},
    path::Path,
    process::{Child, ChildStdout, Command, Output, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use serde_json::Value;
use support::{
    TestCgroup, agent_bin, daemon::Daemon, exercise, limiter_lib, privileged, serial, sim_lib,
    tempdir,
};

const MIB: u64 = 1 << 20;

/// Bytes every process holds on device 0 of the shared device (word 256 of its file).
fn charged(gpu: &Path) -> u64 {
    let b = std::fs::read(gpu).unwrap();
    u64::from_le_bytes(b[256 * 8..257 * 8].try_into().unwrap())
}

struct Pattern {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Pattern {
    fn line(&mut self) -> Value {
        serde_json::from_str(&self.lines.next().unwrap().unwrap()).unwrap()
    }

    fn check(&mut self) {
        writeln!(self.child.stdin.as_mut().unwrap(), "check").unwrap();
        assert_eq!(self.line()["checking"], true);
    }
}

/// `cuda-exercise pattern` of 8 MiB under the limiter, on the shared device `gpu`.
fn pattern(dir: &Path, lib: &Path, gpu: &Path) -> Pattern {
    let mut c = exercise(lib);
    c.args(["pattern", "--bytes", "8m"])
        .env("LD_PRELOAD", limiter_lib())
        .env("VGPU_REAL_LIBCUDA", lib)
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", dir.join("c.region"))
        .env("CUDA_DEVICE_MEMORY_LIMIT", "32m")
        .env("VGPU_CONTEXT_BYTES", "0")
        .env("SIMCUDA_SHARED_DEVICE", gpu)
        .env("SIMCUDA_CAPACITY", "64m")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut p = Pattern { child, lines };
    assert_eq!(p.line()["result"], 0);
    p
}

fn agent(args: &[&str], lib: &Path, gpu: &Path) -> Output {
    Command::new(agent_bin())
        .args(args)
        .arg("--libcuda")
        .arg(lib)
        .env("SIMCUDA_SHARED_DEVICE", gpu)
        .env("SIMCUDA_CAPACITY", "64m")
        .output()
        .unwrap()
}

fn stdout_ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{:?}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_frozen_process_gives_its_memory_back_and_its_next_call_thaws_word_for_word() {
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    let gpu = dir.path().join("gpu");
    let mut p = pattern(dir.path(), &lib, &gpu);
    let pid = p.child.id().to_string();
    p.check();
    assert_eq!(p.line()["corrupted"], 0);
    assert_eq!(charged(&gpu), 8 * MIB);

    let out = stdout_ok(&agent(&["freeze", "--pid", &pid], &lib, &gpu));
    assert_eq!(
        out.trim(),
        format!("pid {pid}: frozen (device memory in host memory, CUDA calls wait for the thaw)")
    );
    assert_eq!(charged(&gpu), 0, "all of its device memory back to the GPU");
    assert!(p.child.try_wait().unwrap().is_none(), "still alive");

    // Its next call (a copy back) waits; the thaw lets it proceed on the memory as it was.
    p.check();
    let out = stdout_ok(&agent(&["thaw", "--pid", &pid], &lib, &gpu));
    assert_eq!(out.trim(), format!("pid {pid}: thawed"));
    let v = p.line();
    assert_eq!(
        (v["result"].as_i64(), v["corrupted"].as_u64()),
        (Some(0), Some(0)),
        "{v}"
    );
    assert_eq!(charged(&gpu), 8 * MIB);

    let out = stdout_ok(&agent(&["thaw", "--pid", &pid], &lib, &gpu));
    assert_eq!(out.trim(), format!("pid {pid}: already running"));

    drop(p.child.stdin.take());
    assert_eq!(p.line()["freed"], 0);
    assert!(p.child.wait().unwrap().success());
}

#[test]
fn processes_that_cannot_be_frozen_are_named_and_the_others_still_are() {
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    let gpu = dir.path().join("gpu");
    let mut p = pattern(dir.path(), &lib, &gpu);
    let pid = p.child.id().to_string();
    // pid 1 is no CUDA process of this device.
    let out = agent(&["freeze", "--pid", "1", "--pid", &pid], &lib, &gpu);
    assert!(!out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains(&format!("pid {pid}: frozen")), "{stdout}");
    assert!(
        stderr.contains("pid 1: cuCheckpointProcessLock on pid 1 failed with CUDA error 1"),
        "{stderr}"
    );
    assert_eq!(charged(&gpu), 0);
    stdout_ok(&agent(&["thaw", "--pid", &pid], &lib, &gpu));
    assert_eq!(charged(&gpu), 8 * MIB);
    // A container with no GPU process.
    let out = agent(&["freeze", "--container", "no-such-container"], &lib, &gpu);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no GPU process of container"),
        "{out:?}"
    );
    p.check();
    assert_eq!(p.line()["corrupted"], 0);
    drop(p.child.stdin.take());
    assert_eq!(p.line()["freed"], 0);
    p.child.wait().unwrap();
}

/// A process under the limiter holding half of its device memory from `cuMemCreate` (16 MiB of
/// its 32 MiB; JAX's default allocator holds all of it so) is not frozen, by pid or (as root)
/// by container: the driver's restore of it would fail. The refusal says why and what to do,
/// the memory stays on the GPU and nothing is marked.
#[test]
fn a_process_holding_half_its_memory_from_cu_mem_create_is_not_frozen() {
    let _serial = serial();
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    let gpu = dir.path().join("gpu");
    let cgroup = privileged().then(|| container("dd"));
    let mut c = exercise(&lib);
    c.args([
        "--linger-ms",
        "120000",
        "counts",
        "--init",
        "--per-api",
        "2",
    ])
    .args(["--apis", "cuMemCreate,cuMemAlloc_v2", "--size", "8m"])
    .env("LD_PRELOAD", limiter_lib())
    .env("VGPU_REAL_LIBCUDA", &lib)
    .env(
        "CUDA_DEVICE_MEMORY_SHARED_CACHE",
        dir.path().join("c.region"),
    )
    .env("CUDA_DEVICE_MEMORY_LIMIT", "64m")
    .env("VGPU_CONTEXT_BYTES", "0")
    .env("SIMCUDA_SHARED_DEVICE", &gpu)
    .env("SIMCUDA_CAPACITY", "64m")
    .stdout(Stdio::piped());
    /// Kills the process however the test ends.
    struct Kill(Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut p = Kill(c.spawn().unwrap());
    if let Some((cg, _)) = &cgroup {
        cg.add(p.0.id());
    }
    let line = BufReader::new(p.0.stdout.take().unwrap())
        .lines()
        .next()
        .unwrap()
        .unwrap();
    let v: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["calls"]["cuMemCreate"]["errors"], 0, "{v}");
    assert_eq!(v["calls"]["cuMemAlloc_v2"]["errors"], 0, "{v}");
    assert_eq!(charged(&gpu), 32 * MIB);
    let pid = p.0.id().to_string();
    let said = format!(
        "pid {pid} holds 16.00 MiB of its 32.00 MiB of device memory from cuMemCreate (JAX's \
         default allocator, PyTorch's expandable segments); the driver's restore of such a \
         process fails (CUDA error 304 on driver 580: the process stays frozen until it is \
         killed), so it is not frozen: run it under the limiter with VGPU_FREEZE_IN_PROCESS=1 \
         (its memory then moves in-process), or for JAX set XLA_PYTHON_CLIENT_ALLOCATOR=platform \
         in its environment"
    );

    let out = agent(&["freeze", "--pid", &pid], &lib, &gpu);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{out:?}");
    assert!(stderr.contains(&said), "{stderr}");
    assert_eq!(charged(&gpu), 32 * MIB, "its memory stays on the GPU");

    if let Some((_, id)) = &cgroup {
        let out = agent(&["freeze", "--container", id], &lib, &gpu);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{out:?}");
        assert!(
            stderr.contains(&format!("container {id}: not frozen: {said}")),
            "{stderr}"
        );
        assert_eq!(charged(&gpu), 32 * MIB, "its memory stays on the GPU");
        let show = stdout_ok(&agent_plain(&["limit", "show", "--container", id]));
        assert!(
            show.contains("no run-time changes"),
            "nothing marked: {show}"
        );
    }
    assert!(p.0.try_wait().unwrap().is_none(), "still running");
}

/// A `pattern` process whose stdout and stderr lines arrive on channels, so that a call that
/// never returns fails the test at a deadline instead of hanging it.
struct Tenant {
    child: Child,
    out: mpsc::Receiver<String>,
    err: mpsc::Receiver<String>,
}

impl Tenant {
    fn start(dir: &Path, lib: &Path, gpu: &Path, cgroup: &TestCgroup) -> Tenant {
        Tenant::start_with(dir, lib, gpu, cgroup, "c.region", &[])
    }

    /// A tenant with its region at `dir/region` and `env` added to its environment (over the
    /// defaults: `SIMCUDA_CAPACITY` may be changed).
    fn start_with(
        dir: &Path,
        lib: &Path,
        gpu: &Path,
        cgroup: &TestCgroup,
        region: &str,
        env: &[(&str, &str)],
    ) -> Tenant {
        let mut t = Tenant::spawn_with(dir, lib, gpu, cgroup, region, env);
        assert_eq!(t.line()["result"], 0);
        t
    }

    /// [`Tenant::start_with`] without waiting for its allocation's result (its first line).
    fn spawn_with(
        dir: &Path,
        lib: &Path,
        gpu: &Path,
        cgroup: &TestCgroup,
        region: &str,
        env: &[(&str, &str)],
    ) -> Tenant {
        Tenant::spawn_cmd(
            dir,
            lib,
            gpu,
            cgroup,
            region,
            env,
            &["pattern", "--bytes", "8m"],
        )
    }

    /// [`Tenant::spawn_with`] of the `cuda-exercise` command `cmd`.
    fn spawn_cmd(
        dir: &Path,
        lib: &Path,
        gpu: &Path,
        cgroup: &TestCgroup,
        region: &str,
        env: &[(&str, &str)],
        cmd: &[&str],
    ) -> Tenant {
        let mut c = exercise(lib);
        c.args(cmd)
            .env("LD_PRELOAD", limiter_lib())
            .env("VGPU_REAL_LIBCUDA", lib)
            .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", dir.join(region))
            .env("CUDA_DEVICE_MEMORY_LIMIT", "32m")
            .env("VGPU_CONTEXT_BYTES", "0")
            .env("LIBCUDA_LOG_LEVEL", "3")
            .env("SIMCUDA_SHARED_DEVICE", gpu)
            .env("SIMCUDA_CAPACITY", "64m")
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        cgroup.add(child.id());
        let lines = |r: Box<dyn std::io::Read + Send>| {
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                for l in BufReader::new(r).lines().map_while(Result::ok) {
                    let _ = tx.send(l);
                }
            });
            rx
        };
        let out = lines(Box::new(child.stdout.take().unwrap()));
        let err = lines(Box::new(child.stderr.take().unwrap()));
        Tenant { child, out, err }
    }

    fn line(&mut self) -> Value {
        let Ok(l) = self.out.recv_timeout(Duration::from_secs(60)) else {
            let log: Vec<String> = self.err.try_iter().collect();
            panic!(
                "the tenant did not answer within 60 s; its log:\n{}",
                log.join("\n")
            );
        };
        serde_json::from_str(&l).unwrap()
    }

    fn send(&mut self, request: &str) {
        writeln!(self.child.stdin.as_mut().unwrap(), "{request}").unwrap();
    }

    /// Asks the tenant to check its pattern (its next CUDA calls, which thaw it if frozen):
    /// every call succeeded and no word is corrupted.
    fn check_intact(&mut self, what: &str) {
        self.send("check");
        assert_eq!(self.line()["checking"], true, "{what}");
        let v = self.line();
        assert_eq!(
            (v["result"].as_i64(), v["corrupted"].as_u64()),
            (Some(0), Some(0)),
            "{what}: {v}"
        );
    }

    /// Waits for a line of the limiter's log that contains `text`.
    fn wait_log(&mut self, text: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(l) = self.err.recv_timeout(left) else {
                panic!("no log line with {text:?} in time; the lines seen: {seen:#?}");
            };
            if l.contains(text) {
                return;
            }
            seen.push(l);
        }
    }

    fn finish(mut self) {
        drop(self.child.stdin.take());
        assert_eq!(self.line()["freed"], 0);
        assert!(self.child.wait().unwrap().success());
    }
}

impl Drop for Tenant {
    /// A failed assertion must not leave the tenant running (frozen, it would wait forever).
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A docker-like container cgroup of this test.
fn container(name: &str) -> (TestCgroup, String) {
    let id = format!("{:0>64}", format!("{name}{}", std::process::id()));
    let cg = TestCgroup::new(&format!("vgpu-test-{}/docker/{id}", std::process::id()));
    (cg, id)
}

/// Word `i` of a file.
fn word(path: &Path, i: usize) -> u64 {
    let b = std::fs::read(path).unwrap();
    u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap())
}

/// `RegionHeader::thaw_request`.
const THAW_REQUEST_WORD: usize = 16;
const _: () = assert!(
    std::mem::offset_of!(region::layout::RegionHeader, thaw_request) == THAW_REQUEST_WORD * 8
);

#[test]
fn a_frozen_containers_next_call_of_every_kind_is_thawed_by_the_running_agent() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    let gpu = dir.path().join("gpu");
    let (cg, id) = container("a");
    let mut t = Tenant::start(dir.path(), &lib, &gpu, &cg);
    let daemon = Daemon::start_with_env(
        dir.path(),
        "200ms",
        &["--checkpoint-libcuda", lib.to_str().unwrap()],
        Stdio::inherit(),
        &[
            ("SIMCUDA_SHARED_DEVICE", gpu.as_os_str()),
            ("SIMCUDA_CAPACITY", "64m".as_ref()),
        ],
    );
    let control = dir.path().join("c.region.ctl");
    let requests = [
        "check",
        "call cuLaunchKernel",
        "call cuMemcpyDtoH_v2",
        "call cuMemAlloc_v2",
        "call cuGraphLaunch",
        "call cuCtxSynchronize",
        "call cuMemsetD8_v2",
        "call cuMemsetD32Async",
        "call cuMemcpy2D_v2",
        "call cuMemcpy2DAsync_v2",
        "call cuStreamWriteValue32_v2",
        "call cuStreamSynchronize",
    ];
    for request in requests {
        let out = stdout_ok(&agent(&["freeze", "--container", &id], &lib, &gpu));
        assert!(
            out.contains("frozen (device memory in host memory"),
            "{out}"
        );
        assert!(
            out.contains(&format!(
                "container {id}: marked frozen: the next CUDA call asks a running `vgpu-agent run` for the thaw"
            )),
            "{out}"
        );
        assert_eq!(charged(&gpu), 0, "{request}: all of its memory given back");
        let frozen_at = word(&control, 0);

        t.send(request);
        let first = t.line();
        assert!(
            first["checking"] == true || first["calling"].is_string(),
            "{first}"
        );
        // The call returns: the limiter asked (the request names the marking generation), and
        // the daemon thawed the container (nobody else would: without it the call would wait).
        let answer = t.line();
        assert_eq!(
            word(&dir.path().join("c.region"), THAW_REQUEST_WORD),
            frozen_at,
            "{request}: the thaw request names the generation that froze the container"
        );
        if request == "check" {
            assert_eq!(
                (answer["result"].as_i64(), answer["corrupted"].as_u64()),
                (Some(0), Some(0)),
                "{answer}"
            );
        } else {
            assert_eq!(answer["called"], request.strip_prefix("call ").unwrap());
        }
        assert_eq!(charged(&gpu), 8 * MIB, "{request}: the memory is back");
        let show = stdout_ok(&agent_plain(&["limit", "show", "--container", &id]));
        assert!(
            show.contains("no overrides"),
            "{request}: mark cleared: {show}"
        );
    }
    t.send("check");
    assert_eq!(t.line()["checking"], true);
    assert_eq!(t.line()["corrupted"], 0);
    t.finish();
    assert!(daemon.stop().success());
}

#[test]
fn without_an_agent_the_call_waits_a_bounded_time_then_in_the_driver_until_a_thaw_by_hand() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    let gpu = dir.path().join("gpu");
    let (cg, id) = container("b");
    let mut t = Tenant::start(dir.path(), &lib, &gpu, &cg);
    stdout_ok(&agent(&["freeze", "--container", &id], &lib, &gpu));
    assert_eq!(charged(&gpu), 0);
    let frozen_at = word(&dir.path().join("c.region.ctl"), 0);
    t.send("check");
    assert_eq!(t.line()["checking"], true);
    // The limiter asks, nobody answers; past its bound the call goes on into the driver.
    t.wait_log("no agent thawed it within 10 s; the call goes on into the driver");
    assert_eq!(
        word(&dir.path().join("c.region"), THAW_REQUEST_WORD),
        frozen_at
    );
    assert_eq!(charged(&gpu), 0, "still frozen");
    let out = stdout_ok(&agent(&["thaw", "--container", &id], &lib, &gpu));
    assert!(
        out.contains("thawed") && out.contains("the freeze mark is cleared"),
        "{out}"
    );
    let v = t.line();
    assert_eq!(
        (v["result"].as_i64(), v["corrupted"].as_u64()),
        (Some(0), Some(0)),
        "{v}"
    );
    let show = stdout_ok(&agent_plain(&["limit", "show", "--container", &id]));
    assert!(show.contains("no overrides"), "{show}");
    t.finish();
}

/// `stat --no-daemon` (its own collector, no daemon on the host) on the container `id`: its
/// JSON row and the table's text.
fn stat_alone(id: &str, lib: &Path, gpu: &Path) -> (Value, String) {
    let run = |json: bool| {
        let mut args = vec![
            "stat",
            "--no-daemon",
            "--no-calibrate",
            "--no-nvml",
            "--duration",
            "1s",
            "--poll-interval",
            "200ms",
        ];
        if json {
            args.push("--json");
        }
        stdout_ok(&agent(&args, lib, gpu))
    };
    let report: Value = serde_json::from_str(&run(true)).unwrap();
    let row = report["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["key"] == id)
        .unwrap_or_else(|| panic!("container {id} in {report}"))
        .clone();
    (row, run(false))
}

/// Without `vgpu-agent run`, `stat` collecting for itself sees the container that `freeze
/// --container` marked in its control block: `FROZEN` with the bytes held in host memory, in
/// the table and the JSON; after `thaw --container`, neither.
#[test]
fn stat_without_a_daemon_shows_a_container_frozen_in_its_control_block() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    let gpu = dir.path().join("gpu");
    let (cg, id) = container("d");
    let mut t = Tenant::start(dir.path(), &lib, &gpu, &cg);
    let (row, _) = stat_alone(&id, &lib, &gpu);
    assert!(row.get("frozen").is_none(), "running: {row}");

    stdout_ok(&agent(&["freeze", "--container", &id], &lib, &gpu));
    assert_eq!(charged(&gpu), 0);
    let (row, table) = stat_alone(&id, &lib, &gpu);
    assert_eq!(row["frozen"]["host_bytes"], 8 * MIB, "{row}");
    assert!(
        table.contains(
            "FROZEN: 8.00 MiB of GPU memory held in host memory until its next CUDA call thaws it"
        ),
        "{table}"
    );

    stdout_ok(&agent(&["thaw", "--container", &id], &lib, &gpu));
    let (row, table) = stat_alone(&id, &lib, &gpu);
    assert!(row.get("frozen").is_none(), "thawed: {row}");
    assert!(!table.contains("FROZEN"), "{table}");
    t.check_intact("after the thaw");
    t.finish();
}

/// The host bytes the daemon's idle freeze holds reserved, from its model.
fn reserved_bytes(snap: &Value) -> Option<u64> {
    snap["agent"]["idle_freeze"]["host_reserved_bytes"].as_u64()
}

/// The bytes the model says the container `id` holds in host memory while frozen; `None`
/// while it is not frozen.
fn frozen_bytes(snap: &Value, id: &str) -> Option<u64> {
    snap["containers"]
        .as_array()?
        .iter()
        .find(|c| c["container_id"] == id)?["frozen"]["host_bytes"]
        .as_u64()
}

fn agent_plain(args: &[&str]) -> Output {
    Command::new(agent_bin()).args(args).output().unwrap()
}

#[test]
fn an_idle_container_is_frozen_after_freeze_after_and_its_next_call_thaws_it() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    let gpu = dir.path().join("gpu");
    let (cg, id) = container("c");
    let mut t = Tenant::start(dir.path(), &lib, &gpu, &cg);
    let daemon = Daemon::start_with_env(
        dir.path(),
        "200ms",
        &[
            "--checkpoint-libcuda",
            lib.to_str().unwrap(),
            "--freeze-after",
            "1s",
            "--freeze-host-budget",
            "64m",
        ],
        Stdio::inherit(),
        &[
            ("SIMCUDA_SHARED_DEVICE", gpu.as_os_str()),
            ("SIMCUDA_CAPACITY", "64m".as_ref()),
        ],
    );
    for round in 0..2 {
        // Idle (it waits on its stdin): frozen by the daemon, all of its memory given back.
        support::wait_until(
            Duration::from_secs(60),
            || charged(&gpu) == 0,
            "the idle freeze",
        );
        let show = stdout_ok(&agent_plain(&["limit", "show", "--container", &id]));
        assert!(show.contains(": frozen"), "round {round}: {show}");
        // The model and /metrics say so, with the bytes held in host memory.
        support::wait_until(
            Duration::from_secs(30),
            || frozen_bytes(&daemon.snapshot(), &id) == Some(8 * MIB),
            "the model's frozen container",
        );
        let body = daemon.scrape().0;
        let metric = |name: &str| {
            body.lines()
                .filter(|l| l.starts_with(&format!("{name}{{")))
                .map(|l| l.rsplit(' ').next().unwrap().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(metric("vgpu_container_frozen"), ["1"], "round {round}");
        assert_eq!(
            metric("vgpu_container_frozen_host_memory_bytes"),
            [(8 * MIB).to_string()],
            "round {round}"
        );
        // The host budget and what of it the frozen container holds reserved.
        support::wait_until(
            Duration::from_secs(30),
            || reserved_bytes(&daemon.snapshot()) == Some(8 * MIB),
            "the budget reserved by the frozen container",
        );
        let body = daemon.scrape().0;
        let node = |name: &str| {
            body.lines()
                .find_map(|l| l.strip_prefix(&format!("{name}{{}} ")))
                .and_then(|v| v.parse::<f64>().ok())
        };
        assert_eq!(
            node("vgpu_freeze_host_budget_bytes"),
            Some((64 * MIB) as f64),
            "round {round}"
        );
        assert_eq!(
            node("vgpu_freeze_host_reserved_bytes"),
            Some((8 * MIB) as f64),
            "round {round}"
        );
        assert_eq!(node("vgpu_freeze_after_seconds"), Some(1.0));
        // Its next call thaws it, on the memory as it was.
        t.check_intact(&format!("round {round}"));
        assert_eq!(charged(&gpu), 8 * MIB, "round {round}");
        if round == 0 {
            support::wait_until(
                Duration::from_secs(30),
                || frozen_bytes(&daemon.snapshot(), &id).is_none(),
                "the model's thawed container",
            );
            // A completed thaw returns its reservation.
            support::wait_until(
                Duration::from_secs(30),
                || reserved_bytes(&daemon.snapshot()) == Some(0),
                "the budget returned after the thaw",
            );
        }
    }
    t.finish();
    assert!(daemon.stop().success());
}

#[test]
fn a_container_that_asks_is_frozen_after_its_own_time_the_others_are_left_alone() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    let gpu = dir.path().join("gpu");
    // Container ids are hexadecimal, as docker's.
    let (cg_asks, asks) = container("a5");
    let (cg_silent, silent) = container("b0");
    let mut a = Tenant::start_with(
        dir.path(),
        &lib,
        &gpu,
        &cg_asks,
        "asks.region",
        &[("VGPU_FREEZE_AFTER", "1s")],
    );
    let b = Tenant::start_with(dir.path(), &lib, &gpu, &cg_silent, "silent.region", &[]);
    // No operator TTL: only the container that asks is frozen.
    let daemon = Daemon::start_with_env(
        dir.path(),
        "200ms",
        &[
            "--checkpoint-libcuda",
            lib.to_str().unwrap(),
            "--freeze-host-budget",
            "64m",
        ],
        Stdio::inherit(),
        &[
            ("SIMCUDA_SHARED_DEVICE", gpu.as_os_str()),
            ("SIMCUDA_CAPACITY", "64m".as_ref()),
        ],
    );
    support::wait_until(
        Duration::from_secs(60),
        || frozen_bytes(&daemon.snapshot(), &asks) == Some(8 * MIB),
        "the freeze of the container that asks",
    );
    let snap = daemon.snapshot();
    let ttl = snap["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["container_id"] == asks.as_str())
        .map(|c| c["regions"][0]["freeze_after_seconds"].clone());
    assert_eq!(ttl, Some(serde_json::json!(1.0)), "its region's TTL");
    assert!(snap["agent"]["idle_freeze"]["after_seconds"].is_null());
    // The other one, idle as long and longer, keeps its memory on the GPU.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(frozen_bytes(&daemon.snapshot(), &silent), None);
    assert_eq!(charged(&gpu), 8 * MIB, "the silent container's memory only");
    // The frozen one's next call thaws it, word for word.
    a.check_intact("the container that asked");
    assert_eq!(charged(&gpu), 16 * MIB);
    a.finish();
    b.finish();
    assert!(daemon.stop().success());
}

/// One simulated GPU of 12 MiB: container A holds a pattern of 8 MiB and stays idle; B (its own
/// container) asks for 8 MiB under `VGPU_OOM_WAIT`, more than the 4 MiB free. Returns the
/// daemon (run with `extra` arguments), A, A's container cgroup and its id.
fn a_full_gpu(
    dir: &Path,
    lib: &Path,
    gpu: &Path,
    extra: &[&str],
) -> (Daemon, Tenant, TestCgroup, String) {
    let (cg_a, a_id) = container("a1");
    let a = Tenant::start_with(
        dir,
        lib,
        gpu,
        &cg_a,
        "a.region",
        &[("SIMCUDA_CAPACITY", "12m")],
    );
    let mut args = vec![
        "--checkpoint-libcuda",
        lib.to_str().unwrap(),
        "--freeze-host-budget",
        "64m",
    ];
    args.extend_from_slice(extra);
    let daemon = Daemon::start_with_env(
        dir,
        "200ms",
        &args,
        Stdio::inherit(),
        &[
            ("SIMCUDA_SHARED_DEVICE", gpu.as_os_str()),
            ("SIMCUDA_CAPACITY", "12m".as_ref()),
        ],
    );
    assert_eq!(charged(gpu), 8 * MIB);
    // A is idle for longer than the 1 s the daemon may be asked to wait for.
    std::thread::sleep(Duration::from_millis(1500));
    (daemon, a, cg_a, a_id)
}

#[test]
fn a_waiting_allocation_gets_an_idle_container_frozen_on_demand() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    let gpu = dir.path().join("gpu");
    let (daemon, mut a, _cg_a, a_id) =
        a_full_gpu(dir.path(), &lib, &gpu, &["--freeze-on-demand", "1s"]);
    let (cg_b, _) = container("b2");
    let t0 = Instant::now();
    let mut b = Tenant::spawn_with(
        dir.path(),
        &lib,
        &gpu,
        &cg_b,
        "b.region",
        &[("SIMCUDA_CAPACITY", "12m"), ("VGPU_OOM_WAIT", "30s")],
    );
    assert_eq!(b.line()["result"], 0, "B's allocation got the room");
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
    // A was frozen for it: its memory is in host memory, B's on the GPU.
    let show = stdout_ok(&agent_plain(&["limit", "show", "--container", &a_id]));
    assert!(show.contains(": frozen"), "{show}");
    assert_eq!(charged(&gpu), 8 * MIB, "B's memory only");
    support::wait_until(
        Duration::from_secs(30),
        || frozen_bytes(&daemon.snapshot(), &a_id) == Some(8 * MIB),
        "the model's frozen container",
    );
    let snap = daemon.snapshot();
    assert_eq!(snap["agent"]["idle_freeze"]["on_demand_seconds"], 1.0);
    let body = daemon.scrape().0;
    assert!(
        body.contains("vgpu_freeze_on_demand_seconds{} 1.0\n"),
        "{body}"
    );
    // B frees its memory; A's next call thaws it, word for word.
    b.finish();
    assert_eq!(charged(&gpu), 0);
    a.check_intact("A after the freeze on demand");
    assert_eq!(charged(&gpu), 8 * MIB);
    a.finish();
    assert!(daemon.stop().success());
}

#[test]
fn without_freeze_on_demand_a_waiting_allocation_times_out_and_no_one_is_frozen() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    let gpu = dir.path().join("gpu");
    let (daemon, mut a, _cg_a, a_id) = a_full_gpu(dir.path(), &lib, &gpu, &[]);
    let (cg_b, _) = container("b3");
    let t0 = Instant::now();
    let mut b = Tenant::spawn_with(
        dir.path(),
        &lib,
        &gpu,
        &cg_b,
        "b.region",
        &[("SIMCUDA_CAPACITY", "12m"), ("VGPU_OOM_WAIT", "2s")],
    );
    assert_eq!(
        b.line()["result"],
        2,
        "CUDA_ERROR_OUT_OF_MEMORY at the timeout"
    );
    assert!(t0.elapsed() >= Duration::from_secs(2), "{:?}", t0.elapsed());
    assert!(!b.child.wait().unwrap().success());
    assert_eq!(charged(&gpu), 8 * MIB, "A keeps its memory on the GPU");
    assert_eq!(frozen_bytes(&daemon.snapshot(), &a_id), None);
    assert!(daemon.snapshot()["agent"]["idle_freeze"]["on_demand_seconds"].is_null());
    a.check_intact("A, never frozen");
    a.finish();
    assert!(daemon.stop().success());
}

/// The tenant `pid`'s in-process freeze as its slot says, from the region at `region`.
fn own_answer(region: &Path, pid: u32) -> Option<region::reader::OwnFreezeSlot> {
    let snap = region::reader::RegionReader::open(region)
        .unwrap()
        .snapshot()
        .unwrap();
    snap.slots
        .iter()
        .find(|s| s.pid == pid)
        .and_then(|s| s.own_freeze)
}

/// Writes `mark` in the control block of the region at `region` (as the agent does); returns
/// the generation.
fn write_mark(region: &Path, mark: region::FreezeMark) -> u64 {
    let ctl = region::control_path(region);
    let _created = region::ControlReader::open_or_create(&ctl).unwrap();
    let file = tenant_fs::open_no_links(&ctl, tenant_fs::Access::ReadWrite).unwrap();
    region::ControlWriter::new(&file)
        .unwrap()
        .update(|s| s.freeze = mark)
        .unwrap()
}

/// Waits (at most 30 s) until the tenant `pid` answers `state` for `generation`; returns the
/// bytes it says.
fn wait_answer(region: &Path, pid: u32, state: region::OwnFreezeState, generation: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let a = own_answer(region, pid);
        if let Some(a) = a
            && a.state.state == state
            && a.state.answers(generation)
        {
            return a.bytes;
        }
        assert!(
            Instant::now() < deadline,
            "no answer {state:?} for generation {generation}: {a:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A `pattern` tenant with the in-process path on (`VGPU_FREEZE_IN_PROCESS=1`, and `env`), in a
/// container cgroup of its own on a simulated GPU.
struct OwnTenant {
    tenant: Tenant,
    region: std::path::PathBuf,
    gpu: std::path::PathBuf,
    pid: u32,
    _cgroup: TestCgroup,
    _dir: tempfile::TempDir,
}

impl OwnTenant {
    fn start(name: &str, env: &[(&str, &str)]) -> OwnTenant {
        let mut o = OwnTenant::spawn(name, env, &["pattern", "--bytes", "8m"], true);
        assert_eq!(o.tenant.line()["result"], 0);
        o
    }

    /// A tenant running the `cuda-exercise` command `cmd`, with the in-process path on or off
    /// (`on`), without waiting for its first line.
    fn spawn(name: &str, env: &[(&str, &str)], cmd: &[&str], on: bool) -> OwnTenant {
        let dir = tempdir();
        let lib = sim_lib(&dir.path().join("lib"));
        let gpu = dir.path().join("gpu");
        let (cg, _id) = container(name);
        let mut all = if on {
            vec![("VGPU_FREEZE_IN_PROCESS", "1")]
        } else {
            Vec::new()
        };
        all.extend_from_slice(env);
        let tenant = Tenant::spawn_cmd(dir.path(), &lib, &gpu, &cg, "c.region", &all, cmd);
        let pid = tenant.child.id();
        OwnTenant {
            tenant,
            region: dir.path().join("c.region"),
            gpu,
            pid,
            _cgroup: cg,
            _dir: dir,
        }
    }
}

/// The first handle the limiter hands out for memory the application creates with the path on
/// (`limiter/src/runtime/own_freeze/created.rs`).
const APP_HANDLE_BASE: u64 = 0xC0DE_0000_0000_0000;

/// The handles a `vmm-pattern` tenant says it was given (its first line).
fn handles_of(first: &Value) -> Vec<u64> {
    first["handles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h.as_u64().unwrap())
        .collect()
}

/// Memory the application maps itself as XLA's allocator does (`vmm-pattern`: a reserved range,
/// two `cuMemCreate` chunks of 4 MiB mapped into it, access set, a handle retained from an
/// address and released), with the in-process path on: the application sees the limiter's
/// handles, the slot says all 8 MiB can move; at the mark the process gives its physical memory
/// back to the simulated GPU, its next call maps it back word for word at the same addresses,
/// and the application's handles still unmap and release its memory after the thaw; frozen
/// again with one chunk, and freed at the end.
#[test]
fn in_process_memory_the_application_maps_itself_moves_and_its_handles_stay_valid() {
    use region::{FreezeMark, OwnFreezeState};
    let _serial = serial();
    if !privileged() {
        return;
    }
    let mut o = OwnTenant::spawn("ownvmm", &[], &["vmm-pattern", "--bytes", "8m"], true);
    let first = o.tenant.line();
    assert_eq!(first["result"], 0, "{first}");
    let handles = handles_of(&first);
    assert!(
        handles.iter().all(|&h| h > APP_HANDLE_BASE),
        "the limiter's handles: {first}"
    );
    assert_eq!(
        first["retained"], handles[1],
        "retained by address: {first}"
    );
    assert_eq!(first["released"], 0);
    let (mut t, pid) = (o.tenant, o.pid);
    let (region, gpu) = (o.region.as_path(), o.gpu.as_path());
    assert_eq!(
        wait_answer(region, pid, OwnFreezeState::Running, 0),
        8 * MIB,
        "all of it can move"
    );
    assert_eq!(charged(gpu), 8 * MIB);

    let g = write_mark(region, FreezeMark::InProcess);
    assert_eq!(wait_answer(region, pid, OwnFreezeState::Frozen, g), 8 * MIB);
    assert_eq!(charged(gpu), 0, "its physical memory is given back");
    t.check_intact("thawed by its next call");
    assert_eq!(charged(gpu), 8 * MIB, "created and mapped again");
    wait_answer(region, pid, OwnFreezeState::Running, g);

    // The application's handle of the second chunk unmaps and releases it after the thaw.
    t.send("release-one");
    let v = t.line();
    assert_eq!(
        (v["unmapped"].as_i64(), v["released"].as_i64()),
        (Some(0), Some(0)),
        "{v}"
    );
    assert_eq!(charged(gpu), 4 * MIB, "the chunk is gone");

    // Frozen again with the one chunk left, thawed by the agent's mark.
    let g = write_mark(region, FreezeMark::InProcess);
    assert_eq!(wait_answer(region, pid, OwnFreezeState::Frozen, g), 4 * MIB);
    assert_eq!(charged(gpu), 0);
    let g = write_mark(region, FreezeMark::Running);
    wait_answer(region, pid, OwnFreezeState::Running, g);
    assert_eq!(charged(gpu), 4 * MIB);
    t.check_intact("thawed by the Running mark");
    t.finish();
    assert_eq!(charged(gpu), 0, "unmapped and released by its handles");
}

/// Created memory exported as a shareable handle (another process may map it) is not moved: the
/// slot counts only the other chunk, the process refuses the in-process freeze (less than 90%
/// can move) and its memory stays on the GPU, untouched.
#[test]
fn in_process_an_exported_allocation_is_not_covered_and_the_process_refuses() {
    use region::{FreezeMark, OwnFreezeState};
    let _serial = serial();
    if !privileged() {
        return;
    }
    let mut o = OwnTenant::spawn(
        "ownexp",
        &[],
        &["vmm-pattern", "--bytes", "8m", "--shareable"],
        true,
    );
    assert_eq!(o.tenant.line()["result"], 0);
    let (mut t, pid) = (o.tenant, o.pid);
    let (region, gpu) = (o.region.as_path(), o.gpu.as_path());
    wait_answer(region, pid, OwnFreezeState::Running, 0);
    t.send("export");
    assert_eq!(t.line()["exported"], 0);
    assert_eq!(
        own_answer(region, pid).unwrap().bytes,
        4 * MIB,
        "one chunk can move"
    );
    let g = write_mark(region, FreezeMark::InProcess);
    wait_answer(region, pid, OwnFreezeState::Failed, g);
    t.wait_log("in-process freeze refused: the limiter backs 4194304 of the 8388608 bytes");
    assert_eq!(charged(gpu), 8 * MIB, "the memory stayed on the GPU");
    t.check_intact("after the refusal");
    t.finish();
}

/// With the path off, the application's `cuMemCreate` handles are the driver's own (no
/// translation): the simulated driver's, which retain, unmap and release as before.
#[test]
fn without_the_path_the_application_sees_the_drivers_own_handles() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let mut o = OwnTenant::spawn("vmmoff", &[], &["vmm-pattern", "--bytes", "8m"], false);
    let first = o.tenant.line();
    assert_eq!(first["result"], 0, "{first}");
    let handles = handles_of(&first);
    // The simulated driver's handles are small counters from 0x5a00_0000.
    assert!(
        handles
            .iter()
            .all(|&h| h > 0x5a00_0000 && h < 0x1_0000_0000),
        "{first}"
    );
    assert_eq!(first["retained"], handles[1]);
    let mut t = o.tenant;
    assert!(own_answer(&o.region, o.pid).is_none(), "no in-process word");
    assert_eq!(charged(&o.gpu), 8 * MIB);
    t.send("release-one");
    let v = t.line();
    assert_eq!(
        (v["unmapped"].as_i64(), v["released"].as_i64()),
        (Some(0), Some(0)),
        "{v}"
    );
    assert_eq!(charged(&o.gpu), 4 * MIB);
    t.check_intact("the chunk left");
    t.finish();
    assert_eq!(charged(&o.gpu), 0);
}

/// The limiter's in-process path (`VGPU_FREEZE_IN_PROCESS=1`), driven by the control block's
/// marks as the agent writes them: the process backs its 8 MiB, gives them back to the
/// simulated GPU at the `InProcess` mark and answers in its slot; its next CUDA call thaws it
/// on its own (no checkpoint API, no agent) and asks for the container's thaw; at a `Running`
/// mark it thaws too. Every word survives each round.
#[test]
fn in_process_the_process_moves_its_own_memory_and_its_next_call_maps_it_back() {
    use region::{FreezeMark, OwnFreezeState};
    let _serial = serial();
    if !privileged() {
        return;
    }
    let o = OwnTenant::start("own", &[]);
    let (mut t, pid) = (o.tenant, o.pid);
    let (region, gpu) = (o.region.as_path(), o.gpu.as_path());
    // The path is announced at the first call, with the bytes backed.
    assert_eq!(
        wait_answer(region, pid, OwnFreezeState::Running, 0),
        8 * MIB
    );
    assert_eq!(charged(gpu), 8 * MIB);

    // Frozen at the mark; thawed by the next call of the process itself.
    let g = write_mark(region, FreezeMark::InProcess);
    assert_eq!(wait_answer(region, pid, OwnFreezeState::Frozen, g), 8 * MIB);
    assert_eq!(charged(gpu), 0, "its memory is given back");
    t.check_intact("thawed by its next call");
    assert_eq!(charged(gpu), 8 * MIB, "mapped again");
    assert_eq!(
        wait_answer(region, pid, OwnFreezeState::Running, g),
        8 * MIB
    );
    assert_eq!(
        word(region, THAW_REQUEST_WORD),
        g,
        "the call asked for the container's thaw, naming the mark"
    );

    // A call of each kind of hook thaws it (launches, memsets and stream writes, allocations,
    // synchronisations each pass the gate on their own path).
    for request in [
        "call cuLaunchKernel",
        "call cuMemsetD8_v2",
        "call cuStreamWriteValue32_v2",
        "call cuMemAlloc_v2",
        "call cuCtxSynchronize",
    ] {
        let g = write_mark(region, FreezeMark::InProcess);
        wait_answer(region, pid, OwnFreezeState::Frozen, g);
        assert_eq!(charged(gpu), 0, "{request}: frozen");
        t.send(request);
        assert!(t.line()["calling"].is_string());
        assert_eq!(t.line()["called"], request.strip_prefix("call ").unwrap());
        assert_eq!(charged(gpu), 8 * MIB, "{request}: thawed before the call");
        wait_answer(region, pid, OwnFreezeState::Running, g);
    }

    // Frozen again, thawed by the agent's mark this time.
    let g = write_mark(region, FreezeMark::InProcess);
    wait_answer(region, pid, OwnFreezeState::Frozen, g);
    assert_eq!(charged(gpu), 0);
    let g = write_mark(region, FreezeMark::Running);
    wait_answer(region, pid, OwnFreezeState::Running, g);
    assert_eq!(charged(gpu), 8 * MIB);
    t.check_intact("thawed by the Running mark");
    t.finish();
}

/// The in-process path gives up without losing anything: when host memory cannot be had (the
/// simulated driver refuses every `cuMemHostRegister_v2`), and when a call stays in the driver
/// longer than the freeze waits for calls in flight (5 s). Each time the process answers
/// `Failed`, keeps its memory on the GPU and its pattern, and goes on.
#[test]
fn in_process_a_freeze_that_cannot_complete_answers_failed_and_keeps_the_memory() {
    use region::{FreezeMark, OwnFreezeState};
    let _serial = serial();
    if !privileged() {
        return;
    }
    let o = OwnTenant::start(
        "ownfail",
        &[
            ("SIMCUDA_FAIL", "cuMemHostRegister_v2:1"),
            ("SIMCUDA_DELAY_US", "cuStreamSynchronize=7000000"),
        ],
    );
    let (mut t, pid) = (o.tenant, o.pid);
    let (region, gpu) = (o.region.as_path(), o.gpu.as_path());
    wait_answer(region, pid, OwnFreezeState::Running, 0);

    // No host memory: refused, nothing moved.
    let g = write_mark(region, FreezeMark::InProcess);
    assert_eq!(wait_answer(region, pid, OwnFreezeState::Failed, g), 8 * MIB);
    t.wait_log("in-process freeze failed: cuMemHostRegister");
    assert_eq!(charged(gpu), 8 * MIB, "the memory stayed on the GPU");
    t.check_intact("after a freeze without host memory");

    // A call in flight for 7 s: the freeze gives up after 5 s, the call completes.
    t.send("call cuStreamSynchronize");
    assert!(t.line()["calling"].is_string());
    std::thread::sleep(Duration::from_millis(300));
    let asked = Instant::now();
    let g = write_mark(region, FreezeMark::InProcess);
    wait_answer(region, pid, OwnFreezeState::Failed, g);
    let waited = asked.elapsed();
    assert!(
        waited >= Duration::from_secs(4) && waited < Duration::from_secs(7),
        "gave up after the drain's bound, before the call ended: {waited:?}"
    );
    t.wait_log("in-process freeze refused: CUDA calls stayed in flight for 5 s");
    assert_eq!(t.line()["called"], "cuStreamSynchronize");
    assert_eq!(charged(gpu), 8 * MIB);
    t.check_intact("after a freeze that found a call in flight");
    t.finish();
}

/// With the daemon's freeze pool (`run --freeze-pool 1g`), a tenant freezing in-process asks it
/// for host memory over the pool's socket before it holds its calls. Here the daemon runs
/// without NVML, so it cannot measure the asking process and lends nothing (the loan itself is
/// shown by the agent's `freeze_pool::tests` over a real socket, the limiter's
/// `tests/freeze_pool.rs` against a stand-in pool, and on a GPU by
/// `scripts/gpu/validate-freeze-in-process.sh`): the tenant freezes with its own host memory and
/// says why, every word survives, and the daemon counts the refusal and keeps its chunk ready.
#[test]
fn in_process_a_tenant_asks_the_daemons_pool_and_unmeasured_freezes_with_its_own_memory() {
    use region::{FreezeMark, OwnFreezeState};
    let _serial = serial();
    if !privileged() {
        return;
    }
    let pool_dir = tempdir();
    let socket = pool_dir.path().join("pool").join("freeze-pool.sock");
    let daemon = Daemon::start_with_env(
        pool_dir.path(),
        "200ms",
        &[
            "--freeze-pool",
            "1g",
            "--freeze-host-budget",
            "1g",
            "--freeze-pool-socket",
            socket.to_str().unwrap(),
        ],
        Stdio::inherit(),
        &[],
    );
    let pool = |d: &Daemon| d.snapshot()["agent"]["freeze_pool"].clone();
    let deadline = Instant::now() + Duration::from_secs(60);
    while pool(&daemon)["ready_bytes"] != 1u64 << 30 {
        assert!(Instant::now() < deadline, "populated: {}", pool(&daemon));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(pool(&daemon)["size_bytes"], 1u64 << 30);

    // A container id is hexadecimal: the name is its first digits.
    let o = OwnTenant::start(
        "b001",
        &[("VGPU_FREEZE_POOL_SOCKET", socket.to_str().unwrap())],
    );
    let (mut t, pid) = (o.tenant, o.pid);
    let (region, gpu) = (o.region.as_path(), o.gpu.as_path());
    wait_answer(region, pid, OwnFreezeState::Running, 0);
    let g = write_mark(region, FreezeMark::InProcess);
    assert_eq!(wait_answer(region, pid, OwnFreezeState::Frozen, g), 8 * MIB);
    t.wait_log("the agent lent nothing: the agent could not identify or measure the process");
    t.wait_log("(own host memory)");
    assert_eq!(charged(gpu), 0, "its memory is given back");
    // The next snapshot counts the refusal.
    let deadline = Instant::now() + Duration::from_secs(10);
    while pool(&daemon)["refusals"]["unknown"].is_null() {
        assert!(Instant::now() < deadline, "counted: {}", pool(&daemon));
        std::thread::sleep(Duration::from_millis(100));
    }
    let p = pool(&daemon);
    assert_eq!(p["refusals"]["unknown"], 1, "{p}");
    assert_eq!(
        (p["loans_total"].as_u64(), p["lent_bytes"].as_u64()),
        (Some(0), Some(0)),
        "{p}"
    );
    assert_eq!(p["ready_bytes"], 1u64 << 30, "{p}");
    t.check_intact("thawed after a freeze the pool did not serve");
    assert_eq!(charged(gpu), 8 * MIB);
    t.finish();
    assert!(daemon.stop().success());
}

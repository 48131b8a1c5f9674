//! Real containers for tests: Debian's podman with runc (`cargo xtask setup` installs both;
//! podman's default crun refuses this project's hybrid-cgroup CI hosts), workload root
//! filesystems built from this build's binaries, the agent's image from `cargo xtask image`, the
//! DaemonSet's pod spec as podman flags, and the CDI spec from `vgpu-agent cdi`.

use std::{
    collections::BTreeMap,
    fs,
    net::TcpStream,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use serde_json::Value;

use super::{agent_bin, exercise_bin, limiter_lib, profile_dir};

pub const PODMAN: &str = "/usr/bin/podman";

/// Whether podman can run here; under `cargo xtask test` as root it must.
pub fn available() -> bool {
    if Path::new(PODMAN).exists() && Path::new("/usr/sbin/runc").exists() {
        return true;
    }
    if std::env::var_os("VGPU_REQUIRE_PRIVILEGED").is_some_and(|v| v == "1") {
        panic!("podman or runc is missing: run `cargo xtask setup`");
    }
    eprintln!("skipping: podman or runc is missing (cargo xtask setup installs them)");
    false
}

/// `podman --runtime runc ARGS`; panics with its stderr when it fails.
pub fn podman(args: &[&str]) -> String {
    let out = podman_output(args);
    assert!(
        out.status.success(),
        "podman {args:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

pub fn podman_output(args: &[&str]) -> Output {
    Command::new(PODMAN)
        .args(["--runtime", "runc"])
        .args(args)
        .output()
        .expect("podman runs")
}

/// Open-file and process limits for `podman run`. podman's defaults for root (a million open
/// files, four million processes) exceed what runc may set on some hosts: runc cannot raise a
/// hard limit above its own, and podman 4.3 runs it with this process's open-file limit (20,000
/// on this project's CI hosts) and 32,768 processes. Kubernetes runtimes use the node's limits.
pub fn ulimit_flags() -> Vec<String> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    let nofile = lim.rlim_cur.min(65_536);
    vec![
        "--ulimit".into(),
        format!("nofile={nofile}:{nofile}"),
        "--ulimit".into(),
        "nproc=4096:4096".into(),
    ]
}

/// A container, removed (with whatever runs in it) when dropped.
pub struct Container {
    pub name: String,
}

impl Container {
    /// `podman run -d --name NAME FLAGS...`; `flags` ends with the image or rootfs and command.
    pub fn run(name: &str, flags: &[String]) -> Container {
        let _ = podman_output(&["rm", "-f", "-t", "0", name]);
        let mut args: Vec<String> = vec!["run".into(), "-d".into(), "--name".into(), name.into()];
        args.extend(ulimit_flags());
        args.extend(flags.iter().cloned());
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        // Owned before it runs: a container that podman created but could not start is removed
        // too when this panics.
        let container = Container {
            name: name.to_owned(),
        };
        podman(&refs);
        container
    }

    /// The host pid of the container's first process.
    pub fn pid(&self) -> u32 {
        let pid = podman(&["inspect", "-f", "{{.State.Pid}}", &self.name]);
        pid.trim().parse().expect("a pid")
    }

    pub fn id(&self) -> String {
        podman(&["inspect", "-f", "{{.Id}}", &self.name])
            .trim()
            .to_owned()
    }

    /// The container's output so far (stdout and stderr).
    pub fn logs(&self) -> String {
        let out = podman_output(&["logs", &self.name]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// `podman exec NAME ARGS` (stdin closed); its output.
    pub fn exec(&self, args: &[&str]) -> Output {
        let mut all = vec!["exec", self.name.as_str()];
        all.extend_from_slice(args);
        podman_output(&all)
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman_output(&["rm", "-f", "-t", "0", &self.name]);
    }
}

/// The libraries and loader `ldd` lists for a file (not the vDSO).
fn needed_libraries(file: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd")
        .arg(file)
        .env("LC_ALL", "C")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let target = l.split_once("=>").map_or(l, |(_, t)| t).trim();
            let path = target.split(" (").next()?.trim();
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

fn copy_into(root: &Path, from: &Path, to: &str) {
    let dst = root.join(to.trim_start_matches('/'));
    fs::create_dir_all(dst.parent().unwrap()).unwrap();
    fs::copy(from, &dst).unwrap_or_else(|e| panic!("copying {}: {e}", from.display()));
}

/// Copies `file` into the root filesystem `root` at `at`, and the libraries and loader it needs
/// at their own paths.
pub fn copy_with_libraries(file: &Path, root: &Path, at: &Path) {
    copy_into(root, file, at.to_str().unwrap());
    for lib in needed_libraries(file) {
        copy_into(root, &lib, lib.to_str().unwrap());
    }
}

/// The host's own `tool` (as the shell finds it), its links resolved.
pub fn host_tool(tool: &str) -> PathBuf {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .unwrap();
    let p = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    assert!(p.is_absolute(), "{tool} not found");
    fs::canonicalize(p).unwrap()
}

/// A root filesystem for workload containers: `cuda-exercise` at `/usr/bin`, the simulated
/// driver as the system's `libcuda.so.1`, and the glibc that they and the limiter need.
pub fn workload_rootfs(dir: &Path) -> PathBuf {
    let root = dir.join("workload-rootfs");
    let exercise = exercise_bin();
    copy_into(&root, &exercise, "/usr/bin/cuda-exercise");
    let sim = profile_dir().join("libsimcuda.so");
    copy_into(&root, &sim, "/usr/lib/x86_64-linux-gnu/libcuda.so.1");
    for file in [exercise, sim, limiter_lib()] {
        for lib in needed_libraries(&file) {
            copy_into(&root, &lib, lib.to_str().unwrap());
        }
    }
    fs::create_dir_all(root.join("tmp")).unwrap();
    root
}

/// The agent's image, built by `cargo xtask image` from this build's binaries and loaded into
/// podman under `tag`; removed when dropped.
pub struct AgentImage {
    pub tag: String,
}

impl AgentImage {
    pub fn build_and_load(dir: &Path, tag: &str) -> AgentImage {
        let archive = dir.join("vgpu-agent.oci.tar");
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        // The limiter is part of the image.
        let _ = limiter_lib();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["xtask", "image", "--bin-dir"])
            .arg(agent_bin().parent().unwrap())
            .arg("--out")
            .arg(&archive)
            .args(["--tag", tag])
            .current_dir(workspace)
            .status()
            .expect("cargo xtask image runs");
        assert!(status.success(), "cargo xtask image failed");
        let _ = podman_output(&["rmi", "-f", tag]);
        let loaded = podman(&["load", "-i", archive.to_str().unwrap()]);
        assert!(
            loaded.contains(tag),
            "podman load named the image otherwise: {loaded}"
        );
        AgentImage {
            tag: tag.to_owned(),
        }
    }
}

impl Drop for AgentImage {
    fn drop(&mut self) {
        let _ = podman_output(&["rmi", "-f", &self.tag]);
    }
}

/// A CDI spec in `/etc/cdi` (where podman looks), with a kind of its own; removed when dropped.
pub struct CdiSpec {
    pub path: PathBuf,
    pub kind: String,
}

impl CdiSpec {
    /// `vgpu-agent cdi install` into `dir/lib`, then `vgpu-agent cdi generate` with `devices`.
    pub fn install_and_generate(dir: &Path, devices: &[&str]) -> CdiSpec {
        let lib_dir = dir.join("lib");
        let kind = format!("vgpu-agent.test/limit-{}", std::process::id());
        let path = PathBuf::from(format!(
            "/etc/cdi/vgpu-agent-test-{}.json",
            std::process::id()
        ));
        let run = |args: Vec<String>| {
            let out = Command::new(agent_bin()).args(&args).output().unwrap();
            assert!(
                out.status.success(),
                "vgpu-agent {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        run(vec![
            "cdi".into(),
            "install".into(),
            "--lib-dir".into(),
            lib_dir.display().to_string(),
            "--limiter".into(),
            limiter_lib().display().to_string(),
        ]);
        let mut args = vec![
            "cdi".into(),
            "generate".into(),
            "--kind".into(),
            kind.clone(),
            "--lib-dir".into(),
            lib_dir.display().to_string(),
            "--output".into(),
            path.display().to_string(),
        ];
        for d in devices {
            args.push("--device".into());
            args.push((*d).into());
        }
        run(args);
        CdiSpec { path, kind }
    }

    /// `--device KIND=NAME`.
    pub fn device(&self, name: &str) -> String {
        format!("--device={}={name}", self.kind)
    }
}

impl Drop for CdiSpec {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// The DaemonSet (deploy/base/daemonset.yaml) as JSON, through python3-yaml (installed by setup).
pub fn daemonset() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/base/daemonset.yaml");
    let out = Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))",
        ])
        .arg(&path)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A `resource.Quantity` of bytes (`256Mi`, `16Mi`, `1Gi`) for podman (`256m`).
fn quantity(q: &str) -> String {
    for (k8s, podman) in [("Ki", "k"), ("Mi", "m"), ("Gi", "g")] {
        if let Some(n) = q.strip_suffix(k8s) {
            return format!("{n}{podman}");
        }
    }
    assert!(
        q.bytes().all(|b| b.is_ascii_digit()),
        "quantity {q:?}: teach the podman test its unit"
    );
    q.to_owned()
}

/// What the DaemonSet's pod and agent container ask of a runtime, as `podman run` flags, and
/// the container's arguments. Fields that change what the runtime does and are not understood
/// here fail the test, so the test cannot drift from the manifest silently.
/// `host_dirs` replaces the host path of a hostPath volume by name (a test's own socket
/// directory, so that a daemon on this host is not disturbed).
pub fn flags_from_daemonset(
    ds: &Value,
    host_dirs: &BTreeMap<&str, PathBuf>,
) -> (Vec<String>, Vec<String>) {
    let pod = &ds["spec"]["template"]["spec"];
    let known_pod = [
        "serviceAccountName",
        "automountServiceAccountToken",
        "hostPID",
        "hostNetwork",
        "hostIPC",
        "priorityClassName",
        "nodeSelector",
        "tolerations",
        "containers",
        "volumes",
    ];
    for k in pod.as_object().unwrap().keys() {
        assert!(
            known_pod.contains(&k.as_str()),
            "the DaemonSet's pod sets {k:?}: teach tests/support/podman.rs what it means for a runtime"
        );
    }
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1, "one agent container");
    let c = &containers[0];
    let known_container = [
        "name",
        "image",
        "imagePullPolicy",
        "args",
        "env",
        "ports",
        "readinessProbe",
        "resources",
        "securityContext",
        "volumeMounts",
    ];
    for k in c.as_object().unwrap().keys() {
        assert!(
            known_container.contains(&k.as_str()),
            "the agent container sets {k:?}: teach tests/support/podman.rs what it means"
        );
    }
    let mut f: Vec<String> = Vec::new();
    let mut flag = |a: &str, b: Option<String>| {
        f.push(a.to_owned());
        if let Some(b) = b {
            f.push(b);
        }
    };
    if pod["hostPID"] == true {
        flag("--pid", Some("host".into()));
    }
    if pod["hostIPC"] == true {
        flag("--ipc", Some("host".into()));
    }
    // Not hostNetwork: a network namespace of its own, as a pod's (no CNI needed for `none`;
    // the test reaches /metrics inside it).
    let network = if pod["hostNetwork"] == true {
        "host"
    } else {
        "none"
    };
    flag("--network", Some(network.into()));

    let sc = &c["securityContext"];
    for (k, v) in sc.as_object().unwrap() {
        match k.as_str() {
            "privileged" => {
                if v == true {
                    flag("--privileged", None);
                }
            }
            "allowPrivilegeEscalation" => {
                if v == false {
                    flag("--security-opt", Some("no-new-privileges".into()));
                }
            }
            "readOnlyRootFilesystem" => {
                if v == true {
                    // Kubernetes adds no tmpfs of its own; podman would on /tmp, /run, /var/tmp.
                    flag("--read-only", None);
                    flag("--read-only-tmpfs=false", None);
                }
            }
            "runAsUser" => {
                let group = sc["runAsGroup"].as_u64().map(|g| format!(":{g}"));
                flag(
                    "--user",
                    Some(format!(
                        "{}{}",
                        v.as_u64().unwrap(),
                        group.unwrap_or_default()
                    )),
                );
            }
            "runAsGroup" => {}
            "capabilities" => {
                for d in v["drop"].as_array().into_iter().flatten() {
                    flag("--cap-drop", Some(d.as_str().unwrap().into()));
                }
                for a in v["add"].as_array().into_iter().flatten() {
                    flag("--cap-add", Some(a.as_str().unwrap().into()));
                }
            }
            "seccompProfile" => match v["type"].as_str().unwrap() {
                "Unconfined" => flag("--security-opt", Some("seccomp=unconfined".into())),
                "RuntimeDefault" => {}
                other => panic!("seccompProfile {other}: teach tests/support/podman.rs"),
            },
            other => panic!("securityContext.{other}: teach tests/support/podman.rs"),
        }
    }
    for (k, v) in c["resources"]["limits"].as_object().into_iter().flatten() {
        match k.as_str() {
            "memory" => flag("--memory", Some(quantity(v.as_str().unwrap()))),
            "cpu" => flag("--cpus", Some(v.as_str().unwrap().into())),
            other => panic!("resources.limits.{other}: teach tests/support/podman.rs"),
        }
    }
    for e in c["env"].as_array().into_iter().flatten() {
        flag(
            "--env",
            Some(format!(
                "{}={}",
                e["name"].as_str().unwrap(),
                e["value"].as_str().unwrap()
            )),
        );
    }
    let volumes: BTreeMap<&str, &Value> = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["name"].as_str().unwrap(), v))
        .collect();
    for m in c["volumeMounts"].as_array().unwrap() {
        let name = m["name"].as_str().unwrap();
        let target = m["mountPath"].as_str().unwrap();
        let volume = volumes[name];
        if let Some(host) = volume.get("hostPath") {
            let path = host_dirs
                .get(name)
                .cloned()
                .unwrap_or_else(|| PathBuf::from(host["path"].as_str().unwrap()));
            match host["type"].as_str() {
                Some("DirectoryOrCreate") => fs::create_dir_all(&path).unwrap(),
                Some("Directory") => assert!(path.is_dir(), "{} is missing", path.display()),
                other => panic!("hostPath type {other:?}: teach tests/support/podman.rs"),
            }
            let mut options = vec![if m["readOnly"] == true { "ro" } else { "rw" }];
            match m["mountPropagation"].as_str() {
                None | Some("None") => {}
                Some("HostToContainer") => options.push("rslave"),
                Some("Bidirectional") => options.push("rshared"),
                Some(other) => panic!("mountPropagation {other}"),
            }
            flag(
                "--volume",
                Some(format!("{}:{target}:{}", path.display(), options.join(","))),
            );
        } else if let Some(empty) = volume.get("emptyDir") {
            let mut options = vec!["rw".to_owned(), "nosuid".into(), "nodev".into()];
            if let Some(size) = empty["sizeLimit"].as_str() {
                options.push(format!("size={}", quantity(size)));
            }
            flag("--tmpfs", Some(format!("{target}:{}", options.join(","))));
        } else {
            panic!("volume {name}: teach tests/support/podman.rs its kind");
        }
    }
    let args = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    (f, args)
}

/// An HTTP GET to `127.0.0.1:port` inside the network namespace of process `pid` (a pod's
/// network without CNI): from a thread that joins that namespace and ends with the request.
pub fn http_get_in_netns(pid: u32, port: u16, target: &str) -> std::io::Result<(u16, String)> {
    let ns = fs::File::open(format!("/proc/{pid}/ns/net"))?;
    let target = target.to_owned();
    std::thread::spawn(move || {
        // SAFETY: setns with a namespace file descriptor we own; it changes this thread only,
        // which ends after the request.
        if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        super::prometheus::get_on(TcpStream::connect(("127.0.0.1", port))?, &target)
    })
    .join()
    .expect("the request thread")
}

/// The values of the series of `name` whose labels include `labels`, from exposition text.
pub fn series(text: &str, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (metric, rest) = series.split_once('{').unwrap_or((series, "}"));
            if metric != name {
                return None;
            }
            let rest = format!(",{rest}");
            let all = labels
                .iter()
                .all(|(k, v)| rest.contains(&format!(",{k}=\"{v}\"")));
            all.then(|| value.parse().ok()).flatten()
        })
        .collect()
}

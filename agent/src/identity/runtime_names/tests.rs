use std::{
    io::{BufRead, BufReader, Write},
    os::unix::net::UnixListener,
    thread,
};

use super::*;

const POD_UID: &str = "3d274242-8ee0-11e9-a8a6-1e68d864ef1a";
const CONTAINER: &str = "3e74d3fd9db4c9dd921ae05c2502fb984d0cde1b36e581b13f79c639da4518a1";

fn sources(root: &Path) -> NameSources {
    NameSources::from_host(&HostPaths::system().with_root(root.to_owned()))
}

fn kubepods_identity() -> ContainerIdentity {
    ContainerIdentity::from_path(&format!("/kubepods/besteffort/pod{POD_UID}/{CONTAINER}"))
}

fn docker_identity() -> ContainerIdentity {
    ContainerIdentity::from_path(&format!("/system.slice/docker-{CONTAINER}.scope"))
}

fn make_pod_logs(root: &Path, containers: &[&str]) {
    let pod_dir = root.join(format!("var/log/pods/ml_resnet-0_{POD_UID}"));
    for c in containers {
        fs::create_dir_all(pod_dir.join(c)).unwrap();
        fs::write(pod_dir.join(c).join("0.log"), "").unwrap();
    }
    // Not pods: a stray file and a directory whose uid is not a uid.
    fs::write(root.join("var/log/pods/README"), "").unwrap();
    fs::create_dir_all(root.join("var/log/pods/ns_name_notauid/c")).unwrap();
}

/// A fake Docker daemon that answers `connections` requests with `body`, then stops listening.
fn fake_docker(sock: &Path, body: &'static str, connections: usize) -> thread::JoinHandle<()> {
    let listener = UnixListener::bind(sock).unwrap();
    thread::spawn(move || {
        for _ in 0..connections {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream);
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap() > 2 {
                line.clear();
            }
            let response = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            reader.get_mut().write_all(response.as_bytes()).unwrap();
        }
    })
}

#[test]
fn pod_names_from_var_log_pods() {
    let tmp = tempfile::tempdir().unwrap();
    make_pod_logs(tmp.path(), &["trainer"]);
    let pods = read_pod_logs_dir(&tmp.path().join("var/log/pods")).unwrap();
    assert_eq!(pods.len(), 1);
    let mut names = RuntimeNames::new(sources(tmp.path()), NameLookupConfig::default());
    let found = names.lookup(&kubepods_identity(), Instant::now()).unwrap();
    assert_eq!(
        found,
        ContainerNames {
            container_name: Some("trainer".into()),
            pod: Some(PodNames {
                namespace: "ml".into(),
                name: "resnet-0".into()
            }),
        }
    );
    assert_eq!(
        kubepods_identity().display_name(Some(&found)),
        "ml/resnet-0/trainer"
    );
}

#[test]
fn a_pod_with_several_containers_names_the_pod_only() {
    let tmp = tempfile::tempdir().unwrap();
    make_pod_logs(tmp.path(), &["trainer", "sidecar"]);
    let mut names = RuntimeNames::new(sources(tmp.path()), NameLookupConfig::default());
    let found = names.lookup(&kubepods_identity(), Instant::now()).unwrap();
    assert_eq!(found.container_name, None);
    assert_eq!(found.pod.map(|p| p.name), Some("resnet-0".into()));
}

#[test]
fn containerd_bundle_annotations_name_the_container() {
    let tmp = tempfile::tempdir().unwrap();
    make_pod_logs(tmp.path(), &["trainer", "sidecar"]);
    let bundle = tmp
        .path()
        .join("run/containerd/io.containerd.runtime.v2.task/k8s.io")
        .join(CONTAINER);
    fs::create_dir_all(&bundle).unwrap();
    fs::write(
        bundle.join("config.json"),
        r#"{"ociVersion":"1.1.0","annotations":{
            "io.kubernetes.cri.container-type":"container",
            "io.kubernetes.cri.container-name":"sidecar",
            "io.kubernetes.cri.sandbox-name":"resnet-0",
            "io.kubernetes.cri.sandbox-namespace":"ml",
            "io.kubernetes.cri.sandbox-uid":"3d274242-8ee0-11e9-a8a6-1e68d864ef1a"}}"#,
    )
    .unwrap();
    let mut names = RuntimeNames::new(sources(tmp.path()), NameLookupConfig::default());
    let found = names.lookup(&kubepods_identity(), Instant::now()).unwrap();
    assert_eq!(found.container_name.as_deref(), Some("sidecar"));
    assert_eq!(found.pod.map(|p| p.namespace), Some("ml".into()));
}

#[test]
fn crio_bundle_annotations_name_the_container() {
    let tmp = tempfile::tempdir().unwrap();
    let userdata = tmp
        .path()
        .join("run/containers/storage/overlay-containers")
        .join(CONTAINER)
        .join("userdata");
    fs::create_dir_all(&userdata).unwrap();
    fs::write(
        userdata.join("config.json"),
        r#"{"annotations":{"io.kubernetes.container.name":"trainer",
            "io.kubernetes.pod.name":"resnet-0","io.kubernetes.pod.namespace":"ml"}}"#,
    )
    .unwrap();
    let identity = ContainerIdentity::from_path(&format!(
        "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/crio-{CONTAINER}.scope",
        POD_UID.replace('-', "_")
    ));
    let mut names = RuntimeNames::new(sources(tmp.path()), NameLookupConfig::default());
    let found = names.lookup(&identity, Instant::now()).unwrap();
    assert_eq!(identity.display_name(Some(&found)), "ml/resnet-0/trainer");
}

#[test]
fn docker_names_are_cached_for_the_ttl() {
    let tmp = tempfile::tempdir().unwrap();
    let sock = tmp.path().join("var/run/docker.sock");
    fs::create_dir_all(sock.parent().unwrap()).unwrap();
    // One connection only: a second request would find no listener.
    let server = fake_docker(&sock, r#"{"Name":"/jupyter","Config":{"Labels":null}}"#, 1);
    let config = NameLookupConfig {
        ttl: Duration::from_secs(60),
        ..NameLookupConfig::default()
    };
    let mut names = RuntimeNames::new(sources(tmp.path()), config);
    let t0 = Instant::now();
    let first = names.lookup(&docker_identity(), t0).unwrap();
    server.join().unwrap();
    assert_eq!(first.container_name.as_deref(), Some("jupyter"));
    assert_eq!(docker_identity().display_name(Some(&first)), "jupyter");
    // Within the TTL: from the cache, although the daemon is gone.
    let cached = names.lookup(&docker_identity(), t0 + Duration::from_secs(59));
    assert_eq!(cached, Some(first));
    // After it: asked again, and the miss is what is remembered.
    fs::remove_file(&sock).unwrap();
    assert_eq!(
        names.lookup(&docker_identity(), t0 + Duration::from_secs(61)),
        None
    );
}

#[test]
fn a_hung_docker_socket_costs_one_timeout_then_falls_back() {
    let tmp = tempfile::tempdir().unwrap();
    make_pod_logs(tmp.path(), &["trainer"]);
    let sock = tmp.path().join("var/run/docker.sock");
    fs::create_dir_all(sock.parent().unwrap()).unwrap();
    let listener = UnixListener::bind(&sock).unwrap();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let server = thread::spawn(move || {
        let (_stream, _) = listener.accept().unwrap();
        let _ = done_rx.recv();
    });
    let mut names = RuntimeNames::new(sources(tmp.path()), NameLookupConfig::default());
    let started = Instant::now();
    let found = names.lookup(&kubepods_identity(), Instant::now());
    let waited = started.elapsed();
    done_tx.send(()).unwrap();
    server.join().unwrap();
    assert!(waited < Duration::from_secs(1), "{waited:?}");
    assert_eq!(found.and_then(|n| n.container_name), Some("trainer".into()));
}

#[test]
fn the_cache_is_bounded() {
    let tmp = tempfile::tempdir().unwrap();
    let config = NameLookupConfig {
        max_entries: 2,
        ..NameLookupConfig::default()
    };
    let mut names = RuntimeNames::new(sources(tmp.path()), config);
    let now = Instant::now();
    for (i, c) in ['a', 'b', 'c', 'd'].into_iter().enumerate() {
        let identity = ContainerIdentity::from_path(&format!(
            "/system.slice/docker-{}.scope",
            c.to_string().repeat(64)
        ));
        assert_eq!(
            names.lookup(&identity, now + Duration::from_secs(i as u64)),
            None
        );
        assert!(names.by_key.len() <= 2);
    }
    // Host processes have nothing to look up and are not cached.
    assert_eq!(
        names.lookup(
            &ContainerIdentity::from_path("/system.slice/ssh.service"),
            now
        ),
        None
    );
    assert!(names.by_key.len() <= 2);
}

#[test]
fn labels_and_missing_sources() {
    let labels: HashMap<&str, &str> = [
        ("io.kubernetes.pod.name", "p"),
        ("io.kubernetes.pod.namespace", "n"),
    ]
    .into();
    let names = names_from_labels(|k| labels.get(k).copied());
    assert_eq!(names.container_name, None);
    assert_eq!(
        names.pod,
        Some(PodNames {
            namespace: "n".into(),
            name: "p".into()
        })
    );
    let tmp = tempfile::tempdir().unwrap();
    assert!(matches!(
        read_pod_logs_dir(&tmp.path().join("absent")),
        Err(NameLookupError::Read { .. })
    ));
    let bad = tmp.path().join("config.json");
    fs::write(&bad, "{not json").unwrap();
    assert!(matches!(
        names_from_bundle(&bad),
        Err(NameLookupError::Json { .. })
    ));
}

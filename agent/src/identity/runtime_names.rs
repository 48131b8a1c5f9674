//! Human names for containers and pods, from whatever the host offers, each source optional:
//!
//! 1. the Docker Engine API on its Unix socket (`.Name` and the `io.kubernetes.*` labels that
//!    dockershim and cri-dockerd put on pod containers);
//! 2. the OCI bundle the CRI runtime wrote for the container: containerd's
//!    `/run/containerd/io.containerd.runtime.v2.task/k8s.io/<id>/config.json` and CRI-O's
//!    `/run/containers/storage/overlay-containers/<id>/userdata/config.json` carry the pod
//!    name, namespace and container name as annotations (no gRPC client needed);
//! 3. podman's and CRI-O's `containers/storage` list,
//!    `/var/lib/containers/storage/overlay-containers/containers.json`: the name given with
//!    `podman run --name` (or CRI-O's `k8s_<container>_<pod>_<namespace>_...`), see [`storage`];
//! 4. the kubelet's `/var/log/pods/<namespace>_<pod>_<uid>/<container>/` directories, on every
//!    kubelet host and for every runtime: they map a pod UID to its namespace and name, and give
//!    the container name when the pod has one container.
//!
//! containerd's bundles are looked for in every namespace (`k8s.io` first): containerd's CRI
//! plugin annotates pod containers, and nerdctl writes its `--name` as the `nerdctl/name`
//! annotation. Containers made with `ctr` carry no name but their id.
//!
//! Lookups are cached (bounded, with a TTL, misses included) and the socket has a deadline, so a
//! missing or hung runtime costs at most one short wait per container per TTL. When nothing
//! answers, callers show ids.

use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

pub use super::names::{ContainerNames, NameLookupError, PodNames};
use super::{
    container::{ContainerId, ContainerIdentity, PodUid, Runtime},
    docker_api,
    names::names_from_labels,
};
use crate::host::HostPaths;

pub mod storage;

/// What `/var/log/pods` says about one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodLogEntry {
    pub names: PodNames,
    /// The container directories, sorted.
    pub containers: Vec<String>,
}

/// Reads `/var/log/pods`: `<namespace>_<pod>_<uid>/<container>/`. Namespaces and pod names are
/// DNS labels and subdomains, which cannot contain `_`, so the split is unambiguous.
pub fn read_pod_logs_dir(dir: &Path) -> Result<HashMap<PodUid, PodLogEntry>, NameLookupError> {
    let read_err = |source| NameLookupError::Read {
        path: dir.to_owned(),
        source,
    };
    let mut pods = HashMap::new();
    for entry in fs::read_dir(dir).map_err(read_err)?.flatten() {
        let file_name = entry.file_name();
        let Some(name) = file_name.to_str() else {
            continue;
        };
        let mut parts = name.splitn(3, '_');
        let (Some(namespace), Some(pod), Some(uid)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let Some(uid) = PodUid::parse(uid) else {
            continue;
        };
        let mut containers: Vec<String> = fs::read_dir(entry.path())
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        containers.sort();
        pods.insert(
            uid,
            PodLogEntry {
                names: PodNames {
                    namespace: namespace.to_owned(),
                    name: pod.to_owned(),
                },
                containers,
            },
        );
    }
    Ok(pods)
}

/// The annotations of an OCI bundle's `config.json`, as names.
pub fn names_from_bundle(config_json: &Path) -> Result<ContainerNames, NameLookupError> {
    const MAX_CONFIG_BYTES: u64 = 4 << 20;
    let read_err = |source| NameLookupError::Read {
        path: config_json.to_owned(),
        source,
    };
    let meta = fs::metadata(config_json).map_err(read_err)?;
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(read_err(std::io::Error::other("larger than 4 MiB")));
    }
    let text = fs::read(config_json).map_err(read_err)?;
    let doc: serde_json::Value =
        serde_json::from_slice(&text).map_err(|source| NameLookupError::Json {
            what: config_json.display().to_string(),
            source,
        })?;
    let annotations = doc
        .get("annotations")
        .and_then(serde_json::Value::as_object);
    let Some(annotations) = annotations else {
        return Ok(ContainerNames::default());
    };
    let get = |k: &str| annotations.get(k).and_then(serde_json::Value::as_str);
    let mut names = names_from_labels(get);
    if names.container_name.is_none() {
        names.container_name = get(NERDCTL_NAME)
            .filter(|n| !n.is_empty())
            .map(str::to_owned);
    }
    Ok(names)
}

/// The annotation nerdctl puts its `--name` in (its labels are copied to the OCI bundle).
const NERDCTL_NAME: &str = "nerdctl/name";

/// containerd namespaces searched for a bundle at most (`k8s.io` is always tried first).
const MAX_CONTAINERD_NAMESPACES: usize = 64;

/// How lookups behave.
#[derive(Clone, Debug)]
pub struct NameLookupConfig {
    /// How long a cached answer (or a miss) is kept.
    pub ttl: Duration,
    /// How many containers are remembered.
    pub max_entries: usize,
    /// The deadline for one runtime socket request, connect included.
    pub socket_timeout: Duration,
}

impl Default for NameLookupConfig {
    fn default() -> NameLookupConfig {
        NameLookupConfig {
            ttl: Duration::from_secs(60),
            max_entries: 4096,
            socket_timeout: Duration::from_millis(200),
        }
    }
}

/// Where names come from on this host.
#[derive(Clone, Debug)]
pub struct NameSources {
    pub docker_socket: PathBuf,
    pub pod_logs_dir: PathBuf,
    pub containerd_tasks_dir: PathBuf,
    pub crio_containers_dir: PathBuf,
    /// The `containers/storage` graph root of podman and CRI-O.
    pub container_storage: PathBuf,
}

impl NameSources {
    pub fn from_host(paths: &HostPaths) -> NameSources {
        NameSources {
            docker_socket: paths.docker_socket.clone(),
            pod_logs_dir: paths.pod_logs_dir.clone(),
            containerd_tasks_dir: paths.containerd_tasks_dir.clone(),
            crio_containers_dir: paths.crio_containers_dir.clone(),
            container_storage: paths.container_storage.clone(),
        }
    }
}

/// Looks up and caches names for container identities.
pub struct RuntimeNames {
    sources: NameSources,
    config: NameLookupConfig,
    by_key: HashMap<CacheKey, (Instant, Option<ContainerNames>)>,
    pod_logs: HashMap<PodUid, PodLogEntry>,
    pod_logs_read_at: Option<Instant>,
    storage: storage::StorageNames,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum CacheKey {
    Container(ContainerId),
    Pod(PodUid),
}

impl RuntimeNames {
    pub fn new(sources: NameSources, config: NameLookupConfig) -> RuntimeNames {
        RuntimeNames {
            storage: storage::StorageNames::new(&sources.container_storage),
            sources,
            config,
            by_key: HashMap::new(),
            pod_logs: HashMap::new(),
            pod_logs_read_at: None,
        }
    }

    /// Names for `identity`, from the cache or the sources; `None` when no source knows it.
    pub fn lookup(&mut self, identity: &ContainerIdentity, now: Instant) -> Option<ContainerNames> {
        let key = match (&identity.container_id, &identity.pod) {
            (Some(id), _) => CacheKey::Container(id.clone()),
            (None, Some(pod)) => CacheKey::Pod(pod.uid.clone()),
            (None, None) => return None,
        };
        if let Some((at, names)) = self.by_key.get(&key)
            && now.saturating_duration_since(*at) < self.config.ttl
        {
            return names.clone();
        }
        let names = self.resolve(identity, now);
        self.insert(key, now, names.clone());
        names
    }

    fn insert(&mut self, key: CacheKey, now: Instant, names: Option<ContainerNames>) {
        // Containers that are gone are forgotten once their entry expires (an entry is
        // inserted only when the one before it expired, so this runs at most once a TTL per
        // container), not only when the cache is full.
        let ttl = self.config.ttl;
        self.by_key
            .retain(|_, (at, _)| now.saturating_duration_since(*at) < ttl);
        if self.by_key.len() >= self.config.max_entries && !self.by_key.contains_key(&key) {
            let oldest = self
                .by_key
                .iter()
                .min_by_key(|(_, (at, _))| *at)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                self.by_key.remove(&oldest);
            }
        }
        self.by_key.insert(key, (now, names));
    }

    fn resolve(&mut self, identity: &ContainerIdentity, now: Instant) -> Option<ContainerNames> {
        let mut found = ContainerNames::default();
        if let Some(id) = &identity.container_id {
            let from_bundle = self.read_bundle(identity.runtime, id);
            let from_storage = self.read_storage(identity.runtime, id);
            for names in [
                from_bundle,
                from_storage,
                self.ask_docker(identity.runtime, id),
            ]
            .into_iter()
            .flatten()
            {
                merge(&mut found, names);
                if found.container_name.is_some() && (found.pod.is_some() || identity.pod.is_none())
                {
                    return Some(found);
                }
            }
        }
        if let Some(pod) = &identity.pod
            && let Some(entry) = self.pod_log_entry(&pod.uid, now)
        {
            let container_name = match entry.containers.as_slice() {
                [only] => Some(only.clone()),
                _ => None,
            };
            merge(
                &mut found,
                ContainerNames {
                    container_name,
                    pod: Some(entry.names),
                },
            );
        }
        (found != ContainerNames::default()).then_some(found)
    }

    fn ask_docker(&self, runtime: Option<Runtime>, id: &ContainerId) -> Option<ContainerNames> {
        // Docker's own containers, and pod containers that may be dockershim's or cri-dockerd's.
        if !matches!(
            runtime,
            Some(Runtime::Docker | Runtime::Containerd | Runtime::Unknown)
        ) || !self.sources.docker_socket.exists()
        {
            return None;
        }
        docker_api::inspect_container(&self.sources.docker_socket, id, self.config.socket_timeout)
            .inspect_err(|e| log::debug!("names of container {}: {e}", id.short()))
            .ok()
    }

    /// podman's and CRI-O's storage names; the list is re-read only when it changed.
    fn read_storage(
        &mut self,
        runtime: Option<Runtime>,
        id: &ContainerId,
    ) -> Option<ContainerNames> {
        if !matches!(
            runtime,
            Some(Runtime::Podman | Runtime::CriO | Runtime::Unknown)
        ) {
            return None;
        }
        self.storage.lookup(id)
    }

    /// containerd's bundle directories of `id`: `k8s.io` first, then every other namespace.
    fn containerd_bundles(&self, id: &ContainerId) -> Vec<PathBuf> {
        let tasks = &self.sources.containerd_tasks_dir;
        let mut namespaces: Vec<String> = fs::read_dir(tasks)
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                    .filter(|n| n != "k8s.io")
                    .take(MAX_CONTAINERD_NAMESPACES)
                    .collect()
            })
            .unwrap_or_default();
        namespaces.sort();
        std::iter::once("k8s.io".to_owned())
            .chain(namespaces)
            .map(|ns| tasks.join(ns).join(id.as_str()).join("config.json"))
            .collect()
    }

    fn read_bundle(&self, runtime: Option<Runtime>, id: &ContainerId) -> Option<ContainerNames> {
        let candidates = match runtime {
            Some(Runtime::Containerd) => self.containerd_bundles(id),
            Some(Runtime::CriO) => vec![
                self.sources
                    .crio_containers_dir
                    .join(id.as_str())
                    .join("userdata/config.json"),
            ],
            _ => return None,
        };
        candidates
            .iter()
            .filter(|p| p.exists())
            .find_map(|p| {
                names_from_bundle(p)
                    .inspect_err(|e| log::debug!("names of container {}: {e}", id.short()))
                    .ok()
            })
            .filter(|n| *n != ContainerNames::default())
    }

    /// The pod's entry in `/var/log/pods`, re-reading the directory on a miss at most once a
    /// TTL (pods come and go; the directory is cheap to list).
    fn pod_log_entry(&mut self, uid: &PodUid, now: Instant) -> Option<PodLogEntry> {
        if let Some(entry) = self.pod_logs.get(uid) {
            return Some(entry.clone());
        }
        let stale = self
            .pod_logs_read_at
            .is_none_or(|at| now.saturating_duration_since(at) >= self.config.ttl);
        if !stale {
            return None;
        }
        self.pod_logs_read_at = Some(now);
        match read_pod_logs_dir(&self.sources.pod_logs_dir) {
            Ok(pods) => self.pod_logs = pods,
            Err(e) => log::debug!("pod names: {e}"),
        }
        self.pod_logs.get(uid).cloned()
    }
}

/// Fills what `into` lacks from `from`.
fn merge(into: &mut ContainerNames, from: ContainerNames) {
    if into.container_name.is_none() {
        into.container_name = from.container_name;
    }
    if into.pod.is_none() {
        into.pod = from.pod;
    }
}

#[cfg(test)]
mod tests {
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

    /// A container that is gone is forgotten once its entry expires, though the cache is far from
    /// full.
    #[test]
    fn names_of_containers_that_are_gone_expire() {
        let tmp = tempfile::tempdir().unwrap();
        let mut names = RuntimeNames::new(sources(tmp.path()), NameLookupConfig::default());
        let now = Instant::now();
        let id = |c: char| {
            ContainerIdentity::from_path(&format!(
                "/system.slice/docker-{}.scope",
                c.to_string().repeat(64)
            ))
        };
        names.lookup(&id('a'), now);
        names.lookup(&id('b'), now);
        assert_eq!(names.by_key.len(), 2);
        // A minute on, only `c` is looked up (`a` and `b` are gone).
        names.lookup(&id('c'), now + NameLookupConfig::default().ttl);
        assert_eq!(names.by_key.len(), 1);
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

    fn podman_identity() -> ContainerIdentity {
        // podman's cgroupfs manager (hosts without systemd as pid 1).
        ContainerIdentity::from_path(&format!("/libpod_parent/libpod-{CONTAINER}"))
    }

    /// Writes `containers.json` the way containers/storage does: a new file renamed over the old.
    fn write_storage(root: &Path, json: &str) -> PathBuf {
        let dir = root.join("var/lib/containers/storage/overlay-containers");
        fs::create_dir_all(&dir).unwrap();
        let tmp = dir.join(".containers.json.tmp");
        fs::write(&tmp, json).unwrap();
        let file = dir.join("containers.json");
        fs::rename(&tmp, &file).unwrap();
        file
    }

    fn storage_entry(id: &str, name: &str) -> String {
        format!(
            r#"{{"id":"{id}","names":["{name}"],"image":"","layer":"7e42d4f0d85a","metadata":"{{\"name\":\"{name}\"}}","created":"2026-11-25T13:29:56Z","flags":{{"MountLabel":"","ProcessLabel":""}}}}"#
        )
    }

    #[test]
    fn podman_names_come_from_containers_storage() {
        let tmp = tempfile::tempdir().unwrap();
        let other = "ab".repeat(32);
        write_storage(
            tmp.path(),
            &format!(
                "[{},{}]",
                storage_entry(&other, "someone-else"),
                storage_entry(CONTAINER, "trainer-1")
            ),
        );
        let config = NameLookupConfig {
            ttl: Duration::ZERO,
            ..NameLookupConfig::default()
        };
        let mut names = RuntimeNames::new(sources(tmp.path()), config);
        let now = Instant::now();
        let found = names.lookup(&podman_identity(), now).unwrap();
        assert_eq!(podman_identity().display_name(Some(&found)), "trainer-1");
        // `podman rename` rewrites the file: the new name is read at the next lookup.
        write_storage(
            tmp.path(),
            &format!("[{}]", storage_entry(CONTAINER, "trainer-renamed")),
        );
        let found = names.lookup(&podman_identity(), now).unwrap();
        assert_eq!(found.container_name.as_deref(), Some("trainer-renamed"));
        // Removed from the store: no name.
        write_storage(tmp.path(), "[]");
        assert_eq!(names.lookup(&podman_identity(), now), None);
    }

    #[test]
    fn crio_storage_names_give_the_pod_when_the_bundle_is_gone() {
        let tmp = tempfile::tempdir().unwrap();
        write_storage(
            tmp.path(),
            &format!(
                "[{}]",
                storage_entry(CONTAINER, &format!("k8s_trainer_resnet-0_ml_{POD_UID}_2"))
            ),
        );
        let identity = ContainerIdentity::from_path(&format!(
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/crio-{CONTAINER}.scope",
            POD_UID.replace('-', "_")
        ));
        let mut names = RuntimeNames::new(sources(tmp.path()), NameLookupConfig::default());
        let found = names.lookup(&identity, Instant::now()).unwrap();
        assert_eq!(identity.display_name(Some(&found)), "ml/resnet-0/trainer");
        // Not CRI-O's shape: the whole name is the container's.
        for name in ["k8s_only_three", "k8s_a_b_c_d_notanumber", "plain_name"] {
            assert_eq!(
                storage::names_from_storage_name(name),
                ContainerNames {
                    container_name: Some(name.into()),
                    pod: None
                }
            );
        }
    }

    #[test]
    fn a_hostile_or_broken_storage_list_is_an_error_not_a_hang() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("overlay-containers");
        fs::create_dir_all(&dir).unwrap();
        let file = dir.join("containers.json");
        // A FIFO: opened without blocking, refused as not a regular file.
        let c = std::ffi::CString::new(file.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let err = storage::read_containers_json(&file).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
        fs::remove_file(&file).unwrap();
        // A symlink at the last component is not followed.
        let target = tmp.path().join("elsewhere.json");
        fs::write(&target, format!("[{}]", storage_entry(CONTAINER, "x"))).unwrap();
        std::os::unix::fs::symlink(&target, &file).unwrap();
        assert!(storage::read_containers_json(&file).is_err());
        fs::remove_file(&file).unwrap();
        // Too large: refused after reading at most the bound.
        let big = vec![b' '; storage::MAX_BYTES as usize + 1];
        fs::write(&file, big).unwrap();
        let err = storage::read_containers_json(&file).unwrap_err();
        assert!(err.to_string().contains("larger than 8 MiB"), "{err}");
        // Not the expected JSON; entries without a valid id or name are skipped.
        fs::write(&file, r#"{"id":1}"#).unwrap();
        assert!(matches!(
            storage::read_containers_json(&file),
            Err(NameLookupError::Json { .. })
        ));
        fs::write(
        &file,
        format!(
            r#"[{{"id":"short","names":["a"]}},{{"id":"{CONTAINER}","names":[]}},{{"id":"{}","names":["","{}","ok"]}}]"#,
            "cd".repeat(32),
            "n".repeat(300)
        ),
    )
    .unwrap();
        let listed = storage::read_containers_json(&file).unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[&ContainerId::parse(&"cd".repeat(32)).unwrap()], "ok");
    }

    #[test]
    fn nerdctl_names_from_a_bundle_in_any_containerd_namespace() {
        let tmp = tempfile::tempdir().unwrap();
        let tasks = tmp
            .path()
            .join("run/containerd/io.containerd.runtime.v2.task");
        fs::create_dir_all(tasks.join("k8s.io")).unwrap();
        let bundle = tasks.join("default").join(CONTAINER);
        fs::create_dir_all(&bundle).unwrap();
        fs::write(
            bundle.join("config.json"),
            r#"{"annotations":{"nerdctl/name":"jupyter","nerdctl/namespace":"default"}}"#,
        )
        .unwrap();
        let identity = ContainerIdentity::from_path(&format!("/default/{CONTAINER}"));
        assert_eq!(identity.runtime, Some(Runtime::Containerd));
        let mut names = RuntimeNames::new(sources(tmp.path()), NameLookupConfig::default());
        let found = names.lookup(&identity, Instant::now()).unwrap();
        assert_eq!(identity.display_name(Some(&found)), "jupyter");
    }
}

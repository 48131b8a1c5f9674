//! Names found for a container and why a source gave none: what the runtime lookups, the
//! container identities and the runtime clients share.

use std::{path::PathBuf, time::Duration};

use serde::Serialize;

/// Names found for a container.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ContainerNames {
    /// The container's name: the Kubernetes container name, or the runtime's (docker's `--name`).
    pub container_name: Option<String>,
    pub pod: Option<PodNames>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PodNames {
    pub namespace: String,
    pub name: String,
}

/// Why one source gave no names. Lookups log these at debug level and fall through.
#[derive(Debug, thiserror::Error)]
pub enum NameLookupError {
    /// The runtime's socket could not be reached or failed mid-request.
    #[error("runtime socket `{}`: {source}", socket.display())]
    Socket {
        socket: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The runtime did not answer within the deadline.
    #[error("runtime socket `{}` did not answer within {timeout:?}", socket.display())]
    Timeout { socket: PathBuf, timeout: Duration },
    /// The answer was not a usable HTTP response.
    #[error("runtime API: {reason}")]
    Http { reason: String },
    /// The answer's body was not the JSON expected.
    #[error("could not parse {what}: {source}")]
    Json {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    /// A file or directory could not be read.
    #[error("could not read `{}`: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Pod and container names from CRI labels or annotations, looked up with `get`. Both the
/// dockershim/cri-dockerd labels (`io.kubernetes.pod.name`, ...) and containerd's CRI
/// annotations (`io.kubernetes.cri.sandbox-name`, ...) are understood.
pub fn names_from_labels<'a>(get: impl Fn(&str) -> Option<&'a str>) -> ContainerNames {
    let first = |keys: &[&str]| {
        keys.iter()
            .find_map(|k| get(k))
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    };
    let pod_name = first(&["io.kubernetes.pod.name", "io.kubernetes.cri.sandbox-name"]);
    let namespace = first(&[
        "io.kubernetes.pod.namespace",
        "io.kubernetes.cri.sandbox-namespace",
    ]);
    ContainerNames {
        container_name: first(&[
            "io.kubernetes.container.name",
            "io.kubernetes.cri.container-name",
        ]),
        pod: pod_name
            .zip(namespace)
            .map(|(name, namespace)| PodNames { namespace, name }),
    }
}

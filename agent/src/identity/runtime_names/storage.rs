//! Container names from `containers/storage`, the store that podman, CRI-O and buildah share.
//!
//! Each storage driver keeps its containers in `<graphroot>/<driver>-containers/containers.json`
//! (`/var/lib/containers/storage/overlay-containers/containers.json` on a default install): a
//! JSON array of `{"id": "<64 hex>", "names": ["..."], ...}`. Podman names a container's storage
//! after the container (`podman run --name`, kept in step by `podman rename`); CRI-O names it
//! `k8s_<container>_<pod>_<namespace>_<pod uid>_<attempt>`.
//!
//! Podman 4.3 (Debian 12) keeps its own state in a BoltDB file (`<graphroot>/libpod/
//! bolt_state.db`); the container names there are the same as in `containers.json`, which is
//! plain JSON, written by replacing the file, and shared with CRI-O, so this file is what is
//! read. It is host state (written by root, not mounted into containers), but it is still read
//! bounded: regular files only, no symlinks followed at the last component, no blocking open,
//! at most [`MAX_BYTES`].

use std::{
    collections::HashMap,
    fs,
    io::Read,
    os::unix::fs::{MetadataExt, OpenOptionsExt},
    path::{Path, PathBuf},
};

use serde::Deserialize;

use crate::identity::container::ContainerId;
use crate::identity::names::{ContainerNames, NameLookupError, PodNames};

/// The largest `containers.json` read: about 20,000 containers' entries.
pub const MAX_BYTES: u64 = 8 << 20;

/// Longer names are left out (podman allows any length; a label this long helps nobody).
const MAX_NAME_LEN: usize = 253;

/// The storage drivers whose container lists are read, in this order.
const DRIVERS: [&str; 2] = ["overlay", "vfs"];

#[derive(Deserialize)]
struct Entry {
    id: String,
    #[serde(default)]
    names: Vec<String>,
}

/// What one `containers.json` said, and which version of the file it was.
struct Listing {
    /// (device, inode, size, mtime in ns): the file is replaced on every change.
    version: (u64, u64, u64, i128),
    names: HashMap<ContainerId, String>,
}

/// The container lists of one storage root, re-read when a file changes.
pub struct StorageNames {
    files: Vec<PathBuf>,
    listings: Vec<Option<Listing>>,
}

impl StorageNames {
    /// The lists under `graphroot` (e.g. `/var/lib/containers/storage`).
    pub fn new(graphroot: &Path) -> StorageNames {
        let files: Vec<PathBuf> = DRIVERS
            .iter()
            .map(|d| graphroot.join(format!("{d}-containers/containers.json")))
            .collect();
        let listings = files.iter().map(|_| None).collect();
        StorageNames { files, listings }
    }

    /// The names of `id`, re-reading each list whose file changed since it was last read.
    pub fn lookup(&mut self, id: &ContainerId) -> Option<ContainerNames> {
        for (file, listing) in self.files.iter().zip(self.listings.iter_mut()) {
            let Ok(meta) = fs::symlink_metadata(file) else {
                *listing = None;
                continue;
            };
            let version = (
                meta.dev(),
                meta.ino(),
                meta.len(),
                i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
            );
            if listing.as_ref().is_none_or(|l| l.version != version) {
                *listing = match read_containers_json(file) {
                    Ok(names) => Some(Listing { version, names }),
                    Err(e) => {
                        log::debug!("container names: {e}");
                        None
                    }
                };
            }
            if let Some(name) = listing.as_ref().and_then(|l| l.names.get(id)) {
                return Some(names_from_storage_name(name));
            }
        }
        None
    }
}

/// Reads one `containers.json`: each container's first name, by id. Entries whose id is not a
/// container id, or that have no name, are left out.
pub fn read_containers_json(path: &Path) -> Result<HashMap<ContainerId, String>, NameLookupError> {
    let read_err = |source| NameLookupError::Read {
        path: path.to_owned(),
        source,
    };
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(read_err)?;
    let meta = file.metadata().map_err(read_err)?;
    if !meta.is_file() {
        return Err(read_err(std::io::Error::other("not a regular file")));
    }
    let mut text = Vec::new();
    file.take(MAX_BYTES + 1)
        .read_to_end(&mut text)
        .map_err(read_err)?;
    if text.len() as u64 > MAX_BYTES {
        return Err(read_err(std::io::Error::other(format!(
            "larger than {} MiB",
            MAX_BYTES >> 20
        ))));
    }
    let entries: Vec<Entry> =
        serde_json::from_slice(&text).map_err(|source| NameLookupError::Json {
            what: path.display().to_string(),
            source,
        })?;
    Ok(entries
        .into_iter()
        .filter_map(|e| {
            let id = ContainerId::parse(&e.id)?;
            let name = e
                .names
                .into_iter()
                .find(|n| !n.is_empty() && n.len() <= MAX_NAME_LEN)?;
            Some((id, name))
        })
        .collect())
}

/// A storage name as names: CRI-O's `k8s_<container>_<pod>_<namespace>_<uid>_<attempt>` gives
/// the pod too (none of those parts can contain `_`); any other name is the container's.
pub fn names_from_storage_name(name: &str) -> ContainerNames {
    let parts: Vec<&str> = name.split('_').collect();
    if let ["k8s", container, pod, namespace, _uid, attempt] = parts.as_slice()
        && ![container, pod, namespace].iter().any(|p| p.is_empty())
        && attempt.bytes().all(|b| b.is_ascii_digit())
    {
        return ContainerNames {
            container_name: Some((*container).to_owned()),
            pod: Some(PodNames {
                namespace: (*namespace).to_owned(),
                name: (*pod).to_owned(),
            }),
        };
    }
    ContainerNames {
        container_name: Some(name.to_owned()),
        pod: None,
    }
}

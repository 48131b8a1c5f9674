//! A one-layer OCI image written as an OCI archive (a tar of an OCI image layout:
//! `oci-layout`, `index.json`, `blobs/sha256/...`), reproducibly: the same files give the same
//! bytes, whatever their mtimes, owners and modes on disk and whatever order they are given in.
//!
//! - every tar entry (the layer's and the archive's) is sorted by path, owned by 0:0 with no
//!   user or group names, and stamped with one fixed time (`SOURCE_DATE_EPOCH`);
//! - modes come from the caller (0755 or 0644), not from the disk;
//! - the layer is gzip-compressed with a zero gzip mtime;
//! - JSON documents are serialised with sorted keys (`oci-spec` keeps labels and annotations in
//!   `HashMap`s, whose order differs from run to run).

use std::{collections::BTreeMap, io::Write};

use anyhow::{Context, Result};
use flate2::{Compression, GzBuilder};
use oci_spec::image::{
    ANNOTATION_REF_NAME, Arch, ConfigBuilder, Descriptor, DescriptorBuilder, Digest,
    HistoryBuilder, ImageConfigurationBuilder, ImageIndexBuilder, ImageManifestBuilder, MediaType,
    Os, RootFsBuilder,
};
use sha2::{Digest as _, Sha256};

/// One file of the image's only layer.
#[derive(Clone, Debug)]
pub struct LayerFile {
    /// Path inside the image, without a leading `/` (`usr/bin/vgpu-agent`).
    pub path: String,
    pub mode: u32,
    pub contents: Vec<u8>,
}

/// What the image runs and how it is named.
#[derive(Clone, Debug)]
pub struct ImageSpec {
    /// The reference `podman load` names the image by (`localhost/vgpu-agent:0.1.0`).
    pub reference: String,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub env: Vec<String>,
    pub labels: BTreeMap<String, String>,
    /// Directories to create besides the files' parents, with their modes (`tmp` 1777).
    pub dirs: Vec<(String, u32)>,
    /// The time stamped on every entry and in the configuration (seconds since 1970).
    pub epoch: u64,
}

/// The archive and the digests a user sees.
pub struct Built {
    pub archive: Vec<u8>,
    /// The manifest's digest (what a registry reports after `podman push`).
    pub manifest_digest: String,
    /// The configuration's digest (podman's image id).
    pub config_digest: String,
}

fn sha256_hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn digest_of(data: &[u8]) -> Result<Digest> {
    format!("sha256:{}", sha256_hex(data))
        .parse()
        .context("a sha256 digest")
}

/// JSON with every object's keys sorted, so that the bytes (and so the digests) are stable.
fn canonical_json<T: serde::Serialize>(value: &T) -> Result<Vec<u8>> {
    fn sort(v: serde_json::Value) -> serde_json::Value {
        match v {
            serde_json::Value::Object(map) => {
                let sorted: BTreeMap<String, serde_json::Value> =
                    map.into_iter().map(|(k, v)| (k, sort(v))).collect();
                serde_json::Value::Object(sorted.into_iter().collect())
            }
            serde_json::Value::Array(items) => {
                serde_json::Value::Array(items.into_iter().map(sort).collect())
            }
            other => other,
        }
    }
    Ok(serde_json::to_vec(&sort(serde_json::to_value(value)?))?)
}

/// An RFC 3339 UTC time for `epoch` seconds.
fn rfc3339(epoch: u64) -> String {
    let days = (epoch / 86_400) as i64;
    let secs = epoch % 86_400;
    // Howard Hinnant's days-to-civil algorithm.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

enum Entry<'a> {
    Dir(u32),
    File(u32, &'a [u8]),
}

/// A tar of `entries` (sorted by path here) with fixed owners and times.
fn tar_of(entries: &BTreeMap<String, Entry<'_>>, epoch: u64) -> Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, entry) in entries {
        let mut header = tar::Header::new_ustar();
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(epoch);
        let (name, data): (String, &[u8]) = match entry {
            Entry::Dir(mode) => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_mode(*mode);
                (format!("{path}/"), &[])
            }
            Entry::File(mode, data) => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_mode(*mode);
                (path.clone(), data)
            }
        };
        header.set_size(data.len() as u64);
        builder
            .append_data(&mut header, &name, data)
            .with_context(|| format!("adding {name} to a tar"))?;
    }
    Ok(builder.into_inner()?)
}

/// Every parent directory of `path` (`a/b/c` -> `a`, `a/b`).
fn parents(path: &str) -> impl Iterator<Item = &str> {
    path.match_indices('/').map(move |(i, _)| &path[..i])
}

/// The layer: the files, their parent directories (0755) and the extra directories.
fn layer_tar(files: &[LayerFile], spec: &ImageSpec) -> Result<Vec<u8>> {
    let mut entries: BTreeMap<String, Entry<'_>> = BTreeMap::new();
    for f in files {
        anyhow::ensure!(
            !f.path.starts_with('/') && !f.path.split('/').any(|s| s.is_empty() || s == ".."),
            "image path {:?} must be relative and plain",
            f.path
        );
        for dir in parents(&f.path) {
            entries.entry(dir.to_owned()).or_insert(Entry::Dir(0o755));
        }
        anyhow::ensure!(
            entries
                .insert(f.path.clone(), Entry::File(f.mode, &f.contents))
                .is_none(),
            "{} is in the image twice",
            f.path
        );
    }
    for (dir, mode) in &spec.dirs {
        for parent in parents(dir) {
            entries
                .entry(parent.to_owned())
                .or_insert(Entry::Dir(0o755));
        }
        entries.insert(dir.clone(), Entry::Dir(*mode));
    }
    tar_of(&entries, spec.epoch)
}

fn descriptor(media_type: MediaType, blob: &[u8]) -> Result<Descriptor> {
    Ok(DescriptorBuilder::default()
        .media_type(media_type)
        .digest(digest_of(blob)?)
        .size(blob.len() as u64)
        .build()?)
}

/// The OCI archive of a one-layer image holding `files`.
pub fn build(files: &[LayerFile], spec: &ImageSpec) -> Result<Built> {
    let layer = layer_tar(files, spec)?;
    let mut gz = GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), Compression::default());
    gz.write_all(&layer)?;
    let layer_gz = gz.finish()?;
    let created = rfc3339(spec.epoch);
    let arch = match std::env::consts::ARCH {
        "x86_64" => Arch::Amd64,
        "aarch64" => Arch::ARM64,
        other => anyhow::bail!("no OCI architecture name for {other}"),
    };
    let config = ImageConfigurationBuilder::default()
        .created(created.clone())
        .architecture(arch)
        .os(Os::Linux)
        .config(
            ConfigBuilder::default()
                .entrypoint(spec.entrypoint.clone())
                .cmd(spec.cmd.clone())
                .env(spec.env.clone())
                .labels(
                    spec.labels
                        .clone()
                        .into_iter()
                        .collect::<std::collections::HashMap<_, _>>(),
                )
                .build()?,
        )
        .rootfs(
            RootFsBuilder::default()
                .typ("layers")
                .diff_ids(vec![format!("sha256:{}", sha256_hex(&layer))])
                .build()?,
        )
        .history(vec![
            HistoryBuilder::default()
                .created(created)
                .created_by("cargo xtask image")
                .build()?,
        ])
        .build()?;
    let config_json = canonical_json(&config)?;
    let manifest = ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .config(descriptor(MediaType::ImageConfig, &config_json)?)
        .layers(vec![descriptor(MediaType::ImageLayerGzip, &layer_gz)?])
        .build()?;
    let manifest_json = canonical_json(&manifest)?;
    let mut manifest_desc = descriptor(MediaType::ImageManifest, &manifest_json)?;
    manifest_desc.set_annotations(Some(
        [(ANNOTATION_REF_NAME.to_owned(), spec.reference.clone())].into(),
    ));
    let index = ImageIndexBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageIndex)
        .manifests(vec![manifest_desc])
        .build()?;
    let index_json = canonical_json(&index)?;

    let mut entries: BTreeMap<String, Entry<'_>> = BTreeMap::new();
    entries.insert("blobs".into(), Entry::Dir(0o755));
    entries.insert("blobs/sha256".into(), Entry::Dir(0o755));
    let layout = br#"{"imageLayoutVersion":"1.0.0"}"#;
    entries.insert("oci-layout".into(), Entry::File(0o644, layout));
    entries.insert("index.json".into(), Entry::File(0o644, &index_json));
    for blob in [&config_json, &layer_gz, &manifest_json] {
        entries.insert(
            format!("blobs/sha256/{}", sha256_hex(blob)),
            Entry::File(0o644, blob),
        );
    }
    Ok(Built {
        archive: tar_of(&entries, spec.epoch)?,
        manifest_digest: format!("sha256:{}", sha256_hex(&manifest_json)),
        config_digest: format!("sha256:{}", sha256_hex(&config_json)),
    })
}

#[cfg(test)]
mod tests {
    use std::{collections::HashMap, io::Read};

    use super::*;

    const EPOCH: u64 = 1_795_613_396;

    fn spec(epoch: u64) -> ImageSpec {
        ImageSpec {
            reference: "localhost/vgpu-agent:0.1.0".into(),
            entrypoint: vec!["/usr/bin/vgpu-agent".into()],
            cmd: vec!["run".into()],
            env: vec!["PATH=/usr/bin".into()],
            labels: [
                ("org.opencontainers.image.title", "vgpu-agent"),
                ("org.opencontainers.image.version", "0.1.0"),
                ("org.opencontainers.image.licenses", "Apache-2.0"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
            dirs: vec![("tmp".into(), 0o1777)],
            epoch,
        }
    }

    fn files() -> Vec<LayerFile> {
        vec![
            LayerFile {
                path: "usr/bin/vgpu-agent".into(),
                mode: 0o755,
                contents: b"\x7fELF agent".to_vec(),
            },
            LayerFile {
                path: "lib/x86_64-linux-gnu/libc.so.6".into(),
                mode: 0o755,
                contents: b"\x7fELF libc".to_vec(),
            },
            LayerFile {
                path: "usr/lib/vgpu-agent/libvgpu_limiter.so".into(),
                mode: 0o755,
                contents: b"\x7fELF limiter".to_vec(),
            },
        ]
    }

    /// Every entry of a tar: path -> (header, contents), in archive order.
    fn entries(tar_bytes: &[u8]) -> Vec<(String, tar::Header, Vec<u8>)> {
        let mut archive = tar::Archive::new(tar_bytes);
        archive
            .entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let path = e.path().unwrap().to_string_lossy().into_owned();
                let header = e.header().clone();
                let mut data = Vec::new();
                e.read_to_end(&mut data).unwrap();
                (path, header, data)
            })
            .collect()
    }

    #[test]
    fn the_same_files_give_the_same_archive_in_any_order() {
        let a = build(&files(), &spec(EPOCH)).unwrap();
        let mut reversed = files();
        reversed.reverse();
        let b = build(&reversed, &spec(EPOCH)).unwrap();
        assert_eq!(a.manifest_digest, b.manifest_digest);
        assert_eq!(a.config_digest, b.config_digest);
        assert!(a.archive == b.archive, "the archives differ");
        // Labels live in a HashMap inside oci-spec: many builds, one digest.
        for _ in 0..8 {
            assert_eq!(
                build(&files(), &spec(EPOCH)).unwrap().config_digest,
                a.config_digest
            );
        }
        // A byte of content, or the time, changes the image.
        let mut changed = files();
        changed[0].contents.push(b'!');
        assert_ne!(
            build(&changed, &spec(EPOCH)).unwrap().manifest_digest,
            a.manifest_digest
        );
        assert_ne!(
            build(&files(), &spec(EPOCH + 1)).unwrap().manifest_digest,
            a.manifest_digest
        );
        // A path given twice is an error, not a silent overwrite.
        let mut twice = files();
        twice.push(twice[0].clone());
        assert!(build(&twice, &spec(EPOCH)).is_err());
    }

    #[test]
    fn the_archive_is_an_oci_layout_whose_digests_check() {
        let built = build(&files(), &spec(EPOCH)).unwrap();
        let outer = entries(&built.archive);
        let names: Vec<&str> = outer.iter().map(|(p, _, _)| p.as_str()).collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted, "entries are sorted");
        let by_name: HashMap<&str, &Vec<u8>> =
            outer.iter().map(|(p, _, d)| (p.as_str(), d)).collect();
        for (path, header, data) in &outer {
            assert_eq!(header.mtime().unwrap(), EPOCH, "{path}");
            assert_eq!((header.uid().unwrap(), header.gid().unwrap()), (0, 0));
            assert_eq!(header.username().unwrap(), Some(""), "{path}");
            if let Some(hex) = path.strip_prefix("blobs/sha256/")
                && !hex.is_empty()
            {
                assert_eq!(sha256_hex(data), hex, "a blob is named by its digest");
            }
        }
        assert_eq!(
            by_name["oci-layout"].as_slice(),
            br#"{"imageLayoutVersion":"1.0.0"}"#
        );
        let blob = |digest: &str| by_name[format!("blobs/sha256/{}", &digest[7..]).as_str()];
        let index: serde_json::Value = serde_json::from_slice(by_name["index.json"]).unwrap();
        let m = &index["manifests"][0];
        assert_eq!(m["digest"], built.manifest_digest.as_str());
        assert_eq!(
            m["annotations"]["org.opencontainers.image.ref.name"],
            "localhost/vgpu-agent:0.1.0"
        );
        let manifest: serde_json::Value =
            serde_json::from_slice(blob(&built.manifest_digest)).unwrap();
        assert_eq!(manifest["config"]["digest"], built.config_digest.as_str());
        let config: serde_json::Value = serde_json::from_slice(blob(&built.config_digest)).unwrap();
        assert_eq!(config["created"], "2026-11-25T13:29:56Z");
        assert_eq!(config["config"]["Entrypoint"][0], "/usr/bin/vgpu-agent");
        assert_eq!(config["config"]["Cmd"][0], "run");
        let layer_gz = blob(manifest["layers"][0]["digest"].as_str().unwrap());
        assert_eq!(
            manifest["layers"][0]["mediaType"],
            "application/vnd.oci.image.layer.v1.tar+gzip"
        );
        let mut layer = Vec::new();
        flate2::read::GzDecoder::new(layer_gz.as_slice())
            .read_to_end(&mut layer)
            .unwrap();
        assert_eq!(
            config["rootfs"]["diff_ids"][0],
            format!("sha256:{}", sha256_hex(&layer))
        );
        let inner = entries(&layer);
        let listing: Vec<(String, u32)> = inner
            .iter()
            .map(|(p, h, _)| (p.clone(), h.mode().unwrap()))
            .collect();
        let want: Vec<(String, u32)> = [
            ("lib/", 0o755),
            ("lib/x86_64-linux-gnu/", 0o755),
            ("lib/x86_64-linux-gnu/libc.so.6", 0o755),
            ("tmp/", 0o1777),
            ("usr/", 0o755),
            ("usr/bin/", 0o755),
            ("usr/bin/vgpu-agent", 0o755),
            ("usr/lib/", 0o755),
            ("usr/lib/vgpu-agent/", 0o755),
            ("usr/lib/vgpu-agent/libvgpu_limiter.so", 0o755),
        ]
        .into_iter()
        .map(|(p, m)| (p.to_owned(), m))
        .collect();
        assert_eq!(listing, want);
        assert!(inner.iter().all(|(_, h, _)| h.mtime().unwrap() == EPOCH));
    }

    #[test]
    fn times_are_rfc3339_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(EPOCH), "2026-11-25T13:29:56Z");
        assert_eq!(rfc3339(4_102_444_799), "2099-12-31T23:59:59Z");
    }
}

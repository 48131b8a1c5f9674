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
    let by_name: HashMap<&str, &Vec<u8>> = outer.iter().map(|(p, _, d)| (p.as_str(), d)).collect();
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
    let manifest: serde_json::Value = serde_json::from_slice(blob(&built.manifest_digest)).unwrap();
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

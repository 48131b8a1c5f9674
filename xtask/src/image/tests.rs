use std::os::unix::fs::PermissionsExt;

use super::*;

#[test]
fn ldd_output_gives_the_libraries_and_the_loader() {
    let text = "\
\tlinux-vdso.so.1 (0x00007ffd1b5f2000)
\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f0e0c5c1000)
\tlibm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 (0x00007f0e0c4e2000)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f0e0c301000)
\t/lib64/ld-linux-x86-64.so.2 (0x00007f0e0d4d5000)
";
    let libs = parse_ldd(text).unwrap();
    let want: Vec<PathBuf> = [
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/lib/x86_64-linux-gnu/libgcc_s.so.1",
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/lib64/ld-linux-x86-64.so.2",
    ]
    .into_iter()
    .map(PathBuf::from)
    .collect();
    assert_eq!(libs, want);
    let err = parse_ldd("\tlibnvidia-ml.so.1 => not found\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("libnvidia-ml.so.1 is not found"), "{err}");
    assert!(parse_ldd("\tstatically linked\n").is_err());
}

/// Two copies of the same binaries with different times and modes on disk give one image.
#[test]
fn building_twice_from_copies_gives_the_same_digest() {
    let base = std::env::temp_dir().join(format!("vgpu-image-test-{}", std::process::id()));
    let mut digests = Vec::new();
    for (i, mode) in [(0, 0o700), (1, 0o755)] {
        let dir = base.join(i.to_string());
        fs::create_dir_all(&dir).unwrap();
        // Any dynamically linked program and library stand in for the agent and the limiter.
        for (src, dst) in [
            ("/usr/bin/true", "vgpu-agent"),
            ("/lib/x86_64-linux-gnu/libgcc_s.so.1", "libvgpu_limiter.so"),
        ] {
            let p = dir.join(dst);
            fs::copy(src, &p).unwrap();
            fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
        }
        if i == 1 {
            // A later mtime on the second copy.
            std::thread::sleep(std::time::Duration::from_millis(20));
            fs::write(dir.join("vgpu-agent.touch"), b"").unwrap();
            let f = fs::File::options()
                .append(true)
                .open(dir.join("vgpu-agent"))
                .unwrap();
            f.set_modified(std::time::SystemTime::now()).unwrap();
        }
        let files = collect(&dir).unwrap();
        assert!(
            files
                .iter()
                .any(|f| f.path == "lib/x86_64-linux-gnu/libc.so.6"),
            "glibc is in the image: {:?}",
            files.iter().map(|f| &f.path).collect::<Vec<_>>()
        );
        let spec = oci::ImageSpec {
            reference: "localhost/vgpu-agent:test".into(),
            entrypoint: vec!["/usr/bin/vgpu-agent".into()],
            cmd: vec![],
            env: vec![],
            labels: BTreeMap::new(),
            dirs: vec![],
            epoch: 1,
        };
        let built = oci::build(&files, &spec).unwrap();
        digests.push((built.manifest_digest, built.archive));
    }
    let _ = fs::remove_dir_all(&base);
    assert_eq!(digests[0].0, digests[1].0);
    assert!(digests[0].1 == digests[1].1, "the archives differ");
}

#[test]
fn the_manifests_name_the_image_this_builds() {
    let version = version().unwrap();
    let daemonset = fs::read_to_string(repo_root().join("deploy/base/daemonset.yaml")).unwrap();
    assert!(
        daemonset.contains(&format!("image: {IMAGE_NAME}:{version}\n")),
        "deploy/base/daemonset.yaml must run {IMAGE_NAME}:{version}"
    );
    let kustomization =
        fs::read_to_string(repo_root().join("deploy/base/kustomization.yaml")).unwrap();
    assert!(
        kustomization.contains(&format!("- name: {IMAGE_NAME}\n"))
            && kustomization.contains(&format!("newTag: \"{version}\"\n")),
        "deploy/base/kustomization.yaml must map {IMAGE_NAME} with newTag \"{version}\":\n{kustomization}"
    );
}

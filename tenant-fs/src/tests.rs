//! Each way a tenant can lay out its files, against the opener: refused or kept inside, never
//! blocking, never reading without bound.

use std::os::unix::fs::symlink;
use std::time::{Duration, Instant};

use super::*;

fn root_is_euid0() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A tenant root with a file of its own and, outside it, a "host" file.
struct Fixture {
    tenant: tempfile::TempDir,
    host: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        let f = Fixture {
            tenant: tempfile::tempdir().unwrap(),
            host: tempfile::tempdir().unwrap(),
        };
        std::fs::write(f.host_file(), b"host secret").unwrap();
        std::fs::write(f.tenant.path().join("own"), b"tenant data").unwrap();
        f
    }

    fn host_file(&self) -> PathBuf {
        self.host.path().join("secret")
    }

    fn root(&self) -> Root {
        Root::dir(self.tenant.path()).unwrap()
    }
}

#[test]
fn a_regular_file_inside_the_root_opens_and_reads() {
    let f = Fixture::new();
    let file = f.root().open(Path::new("/own"), Access::Read).unwrap();
    assert_eq!(file.read_bounded(100).unwrap(), b"tenant data");
    assert_eq!(file.len(), 11);
    assert!(file.path().ends_with("own"));
}

#[test]
fn a_symlink_as_the_last_component_is_refused() {
    let f = Fixture::new();
    symlink(f.host_file(), f.tenant.path().join("ctl")).unwrap();
    symlink("own", f.tenant.path().join("relative")).unwrap();
    for name in ["/ctl", "relative"] {
        let err = f
            .root()
            .open(Path::new(name), Access::ReadWrite)
            .unwrap_err();
        assert!(matches!(err, TenantFsError::Link { .. }), "{name}: {err}");
    }
}

#[test]
fn absolute_links_and_dotdot_in_directories_stay_inside_the_root() {
    let f = Fixture::new();
    // `dir` points at the host directory by its absolute path; `up` climbs out with `..`.
    symlink(f.host.path(), f.tenant.path().join("dir")).unwrap();
    let depth = f.tenant.path().components().count();
    symlink("../".repeat(depth + 2), f.tenant.path().join("up")).unwrap();
    let inside_host_path = f.host_file();
    let via_up = Path::new("up").join(inside_host_path.strip_prefix("/").unwrap());
    for path in [Path::new("dir/secret"), &via_up] {
        match f.root().open(path, Access::Read) {
            Err(TenantFsError::NotFound { .. }) => {}
            Ok(file) => panic!(
                "{} reached {:?}",
                path.display(),
                String::from_utf8_lossy(&file.read_bounded(100).unwrap())
            ),
            Err(e) => panic!("{}: {e}", path.display()),
        }
    }
    // The same names, made inside the root, are what they resolve to.
    let mirrored = f
        .tenant
        .path()
        .join(inside_host_path.strip_prefix("/").unwrap());
    std::fs::create_dir_all(mirrored.parent().unwrap()).unwrap();
    std::fs::write(&mirrored, b"inside").unwrap();
    let file = f.root().open(&via_up, Access::Read).unwrap();
    assert_eq!(file.read_bounded(100).unwrap(), b"inside");
}

#[test]
fn magic_links_are_refused() {
    let f = Fixture::new();
    symlink("/proc/self/root", f.tenant.path().join("self")).unwrap();
    // `/proc/self/root` inside the root is the root's own `proc` (absent here) ...
    let err = f
        .root()
        .open(Path::new("self/etc/hostname"), Access::Read)
        .unwrap_err();
    assert!(matches!(err, TenantFsError::NotFound { .. }), "{err}");
    // ... and through a procfs (as a tenant could mount one) it is a magic link.
    let root = Root::dir(Path::new("/")).unwrap();
    let err = root
        .open(Path::new("/proc/self/root/etc/hostname"), Access::Read)
        .unwrap_err();
    assert!(matches!(err, TenantFsError::Link { .. }), "{err}");
}

#[test]
fn a_fifo_is_refused_without_blocking() {
    let f = Fixture::new();
    let fifo = f.tenant.path().join("fifo");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        Mode::from_raw_mode(0o666),
        0,
    )
    .unwrap();
    let t0 = Instant::now();
    for access in [Access::Read, Access::ReadWrite] {
        let err = f.root().open(Path::new("fifo"), access).unwrap_err();
        assert!(
            matches!(err, TenantFsError::NotRegular { kind: "FIFO", .. }),
            "{err}"
        );
    }
    assert!(t0.elapsed() < Duration::from_secs(5));
    let err = open_no_links(&fifo, Access::Read).unwrap_err();
    assert!(matches!(err, TenantFsError::NotRegular { .. }), "{err}");
}

#[test]
fn a_device_node_is_refused_unopened() {
    if !root_is_euid0() {
        eprintln!("skipping: mknod of a character device needs root");
        return;
    }
    let f = Fixture::new();
    let zero = f.tenant.path().join("zero");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &zero,
        rustix::fs::FileType::CharacterDevice,
        Mode::from_raw_mode(0o666),
        rustix::fs::makedev(1, 5),
    )
    .unwrap();
    let err = f.root().open(Path::new("zero"), Access::Read).unwrap_err();
    assert!(
        matches!(
            err,
            TenantFsError::NotRegular {
                kind: "character device",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn a_large_sparse_file_is_refused_before_reading() {
    let f = Fixture::new();
    let sparse = f.tenant.path().join("sparse");
    std::fs::File::create(&sparse)
        .unwrap()
        .set_len(16 << 30)
        .unwrap();
    let file = f.root().open(Path::new("sparse"), Access::Read).unwrap();
    let t0 = Instant::now();
    let err = file.read_bounded(64 << 20).unwrap_err();
    assert!(
        matches!(err, TenantFsError::TooLarge { len, max, .. } if len == 16 << 30 && max == 64 << 20),
        "{err}"
    );
    assert!(t0.elapsed() < Duration::from_secs(1), "read it?");
}

#[test]
fn a_file_growing_while_read_is_cut_at_the_bound() {
    let f = Fixture::new();
    let path = f.tenant.path().join("grows");
    std::fs::write(&path, [1u8; 10]).unwrap();
    let file = f.root().open(Path::new("grows"), Access::Read).unwrap();
    // Grows after the open, before the read: over the bound is refused, under it is read.
    std::fs::write(&path, [2u8; 100]).unwrap();
    assert!(matches!(
        file.read_bounded(50),
        Err(TenantFsError::TooLarge { .. })
    ));
    assert_eq!(file.read_bounded(100).unwrap().len(), 100);
}

#[test]
fn a_write_lease_makes_the_open_fail_fast_instead_of_waiting() {
    let f = Fixture::new();
    let path = f.tenant.path().join("leased");
    std::fs::write(&path, b"x").unwrap();
    let holder = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    // The kernel tells the holder (this process) to give the lease up with SIGIO, whose default
    // action ends the process: ignore it, as a tenant holding a lease on purpose would.
    // SAFETY: SIG_IGN for SIGIO; nothing in the tests relies on SIGIO.
    unsafe { libc::signal(libc::SIGIO, libc::SIG_IGN) };
    // SAFETY: fcntl on a valid fd; F_SETLEASE takes an int.
    let rc = unsafe { libc::fcntl(holder.as_raw_fd(), libc::F_SETLEASE, libc::F_WRLCK) };
    if rc != 0 {
        eprintln!(
            "skipping: F_SETLEASE failed here: {}",
            io::Error::last_os_error()
        );
        return;
    }
    let t0 = Instant::now();
    let err = f
        .root()
        .open(Path::new("leased"), Access::Read)
        .unwrap_err();
    assert!(matches!(err, TenantFsError::Leased { .. }), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(5));
}

#[test]
fn a_mapped_file_opens_through_map_files_only_as_the_file_maps_names() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mapped");
    std::fs::write(&path, [7u8; 4096]).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let meta = file.metadata().unwrap();
    let key = FileKey {
        dev: meta.dev(),
        ino: meta.ino(),
    };
    // SAFETY: a fresh shared read-only mapping of a valid fd, unmapped below.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    assert_ne!(ptr, libc::MAP_FAILED);
    let range = (ptr as u64, ptr as u64 + 4096);
    let proc = Path::new("/proc");
    let me = std::process::id();
    let opened = open_mapped(proc, me, range, &path, key, Access::Read).unwrap();
    assert_eq!(opened.key(), key);
    assert_eq!(opened.read_bounded(4096).unwrap(), vec![7u8; 4096]);
    let wrong = FileKey {
        dev: key.dev,
        ino: key.ino + 1,
    };
    let err = open_mapped(proc, me, range, &path, wrong, Access::Read).unwrap_err();
    assert!(matches!(err, TenantFsError::Replaced { .. }), "{err}");
    // SAFETY: the mapping made above, not used after this.
    unsafe { libc::munmap(ptr, 4096) };
}

#[test]
fn operator_paths_through_a_process_root_resolve_inside_it() {
    let proc = Path::new("/proc");
    assert_eq!(
        split_process_root(proc, Path::new("/proc/123/root/tmp/r.region")),
        Some((123, Path::new("tmp/r.region")))
    );
    assert_eq!(split_process_root(proc, Path::new("/proc/123/cwd/x")), None);
    assert_eq!(split_process_root(proc, Path::new("/tmp/x")), None);
    assert_eq!(
        split_process_root(proc, Path::new("/proc/self/root/x")),
        None
    );
    // Our own root, through the operator path: a regular file opens.
    let f = Fixture::new();
    let own = f.tenant.path().join("own");
    let through = Path::new("/proc")
        .join(std::process::id().to_string())
        .join("root")
        .join(own.strip_prefix("/").unwrap());
    let file = open_operator_path(proc, &through, Access::Read).unwrap();
    assert_eq!(file.read_bounded(100).unwrap(), b"tenant data");
}

#[test]
fn operator_paths_with_a_symlinked_directory_are_refused() {
    let f = Fixture::new();
    symlink(f.host.path(), f.tenant.path().join("d")).unwrap();
    let err = open_no_links(&f.tenant.path().join("d/secret"), Access::Read).unwrap_err();
    assert!(matches!(err, TenantFsError::Link { .. }), "{err}");
}

#[test]
fn proc_lines_are_bounded_in_bytes_and_per_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("maps");
    let mut text = String::new();
    text += "short one\n";
    text += &"x".repeat(100);
    text += "\nlast without newline";
    std::fs::write(&path, &text).unwrap();
    let mut lines = Vec::new();
    let r = read_proc_lines(&path, 1 << 20, 50, |l| lines.push(l.to_vec())).unwrap();
    assert_eq!(
        lines,
        vec![b"short one".to_vec(), b"last without newline".to_vec()]
    );
    assert_eq!(r.long_lines, 1);
    assert!(!r.truncated);
    let mut n = 0;
    let r = read_proc_lines(&path, 20, 1000, |_| n += 1).unwrap();
    assert!(r.truncated);
    assert_eq!(n, 1, "only the lines inside the bound");
    let (bytes, more) = read_proc(&path, 5).unwrap();
    assert_eq!((bytes.as_slice(), more), (&b"short"[..], true));
}

#[test]
fn directory_entries_are_listed_inside_the_root_bounded_and_not_followed() {
    let f = Fixture::new();
    std::fs::create_dir(f.tenant.path().join("sub")).unwrap();
    symlink(f.host.path(), f.tenant.path().join("hostdir")).unwrap();
    let (mut entries, more) = f.root().entries(Path::new(""), 100).unwrap();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let names: Vec<(String, EntryKind)> = entries
        .into_iter()
        .map(|(n, k)| (n.to_string_lossy().into_owned(), k))
        .collect();
    assert_eq!(
        names,
        vec![
            ("hostdir".into(), EntryKind::Other),
            ("own".into(), EntryKind::File),
            ("sub".into(), EntryKind::Dir)
        ]
    );
    assert!(!more);
    let (few, more) = f.root().entries(Path::new("/"), 2).unwrap();
    assert_eq!((few.len(), more), (2, true));
    // Listing through the link is listing inside the root (where that path does not exist).
    let err = f.root().entries(Path::new("hostdir"), 10).unwrap_err();
    assert!(
        matches!(
            err,
            TenantFsError::Link { .. } | TenantFsError::NotFound { .. }
        ),
        "{err}"
    );
}

/// Runs `f` on a thread of its own mount namespace (private: nothing it mounts reaches the host),
/// so a test can mount without touching the machine's mounts. `None` when that is not allowed.
fn in_private_mount_namespace<T: Send>(f: impl FnOnce() -> T + Send) -> Option<T> {
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: unshare with a constant flag; it changes only this thread's mount namespace
            // (and its fs attributes, which no other code on this thread uses).
            if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
                return None;
            }
            // SAFETY: NUL-terminated literals; makes every mount of the new namespace private.
            let private = unsafe {
                libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                )
            };
            (private == 0).then(f)
        })
        .join()
        .unwrap()
    })
}

/// Bind-mounts `from` over `to` (in the caller's mount namespace).
fn bind_mount(from: &Path, to: &Path) -> bool {
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let (from, to) = (c(from), c(to));
    // SAFETY: NUL-terminated paths that outlive the call.
    unsafe {
        libc::mount(
            from.as_ptr(),
            to.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        ) == 0
    }
}

/// A tenant that bind-mounts a file it can reach (a host file, here) over the control block the
/// agent writes: opening it for writing is refused (no mount point is crossed for writing), so
/// nothing is written through the mount; reading it is still possible, and the file beside it
/// on the directory's own filesystem opens for writing.
#[test]
fn a_file_mounted_over_is_refused_for_writing() {
    if !root_is_euid0() {
        assert!(
            std::env::var_os("VGPU_REQUIRE_PRIVILEGED").is_none_or(|v| v != "1"),
            "a bind mount needs root"
        );
        eprintln!("skipping: a bind mount needs root");
        return;
    }
    let f = Fixture::new();
    let ctl = f.tenant.path().join("region.ctl");
    std::fs::write(&ctl, b"control").unwrap();
    let host = f.host_file();
    let outcome = in_private_mount_namespace(|| {
        assert!(bind_mount(&host, &ctl), "mount --bind");
        let root = f.root();
        let write = root.open(Path::new("region.ctl"), Access::ReadWrite);
        let read = root
            .open(Path::new("region.ctl"), Access::Read)
            .map(|file| file.read_bounded(100).unwrap());
        let beside = root.open(Path::new("own"), Access::ReadWrite).map(|_| ());
        (write.map(|_| ()), read, beside)
    })
    .expect("a private mount namespace (root may unshare)");
    let (write, read, beside) = outcome;
    match write {
        Err(e @ TenantFsError::MountCrossed { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("region.ctl") && msg.contains("mount point"),
                "{msg}"
            );
        }
        other => panic!("opened for writing through a mount: {other:?}"),
    }
    assert_eq!(read.unwrap(), b"host secret", "the mount was in place");
    beside.unwrap();
    // The host's file was never written, and the mount stayed in its namespace.
    assert_eq!(std::fs::read(&host).unwrap(), b"host secret");
    assert_eq!(std::fs::read(&ctl).unwrap(), b"control");
}

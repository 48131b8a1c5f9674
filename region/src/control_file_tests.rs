//! The control block's reader and the agent's writer, against real files.

mod reader_and_writer {
    use super::super::*;
    use crate::control::control_path;
    use tenant_fs::{Access, open_no_links};

    /// The agent's writer of the block at `path`, which must exist.
    fn writer(path: &Path) -> Result<ControlWriter, ControlError> {
        let file = open_no_links(path, Access::ReadWrite).unwrap();
        ControlWriter::new(&file)
    }

    fn zero_block(path: &Path) {
        std::fs::write(path, [0u8; CONTROL_SIZE]).unwrap();
    }

    #[test]
    fn reader_creates_a_zero_block_and_sees_writes() {
        let dir = tempfile::tempdir().unwrap();
        let path = control_path(&dir.path().join("r.region"));
        assert!(path.to_str().unwrap().ends_with("r.region.ctl"));
        let r = ControlReader::open_or_create(&path).unwrap();
        assert_eq!(r.snapshot(), Ok(None));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), CONTROL_SIZE as u64);
        let w = writer(&path).unwrap();
        let g = w.update(|s| s.sm_percent[0] = Some(40)).unwrap();
        assert_eq!(g, 2);
        assert_eq!(r.generation_word().load(Ordering::Relaxed), 2);
        let g = w.update(|s| s.memory_limit[3] = Some(1 << 30)).unwrap();
        assert_eq!(g, 4);
        let snap = r.snapshot().unwrap().unwrap();
        assert_eq!(snap.settings.sm_percent[0], Some(40));
        assert_eq!(snap.settings.memory_limit[3], Some(1 << 30));
        assert_eq!(snap.writer_pid, u64::from(std::process::id()));
        // An invalid request changes nothing but the generation.
        assert!(matches!(
            w.update(|s| s.sm_percent[1] = Some(101)),
            Err(ControlError::SmPercent { device: 1, .. })
        ));
        let again = r.snapshot().unwrap().unwrap();
        assert_eq!(again.settings, snap.settings);
    }

    #[test]
    fn a_dead_writer_is_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.ctl");
        zero_block(&path);
        let w = writer(&path).unwrap();
        w.update(|s| s.sm_percent[0] = Some(10)).unwrap();
        // A writer that died inside its section.
        block(&w.map).generation.store(3, Ordering::Relaxed);
        let r = ControlReader::open_or_create(&path).unwrap();
        assert_eq!(r.snapshot(), Err(ControlError::Busy { generation: 3 }));
        let g = w.update(|s| s.sm_percent[0] = Some(20)).unwrap();
        assert_eq!(g, 6);
        assert_eq!(
            r.snapshot().unwrap().unwrap().settings.sm_percent[0],
            Some(20)
        );
    }

    /// A reader that opens a block another process has created but not sized yet waits for the
    /// size (briefly) instead of failing or mapping past the end.
    #[test]
    fn a_reader_waits_for_a_block_being_created() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new.ctl");
        let f = std::fs::File::create(&path).unwrap();
        let sizer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            f.set_len(CONTROL_SIZE as u64).unwrap();
        });
        let r = ControlReader::open_or_create(&path).unwrap();
        sizer.join().unwrap();
        assert_eq!(r.snapshot().unwrap(), None, "zero-filled: never written");
    }

    #[test]
    fn short_files_are_not_mapped_by_readers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("short.ctl");
        std::fs::write(&path, [0u8; 10]).unwrap();
        assert!(matches!(
            ControlReader::open_or_create(&path),
            Err(ControlError::TooShort { len: 10 })
        ));
    }
}

mod writer {
    use std::os::unix::fs::symlink;

    use super::super::*;
    use tenant_fs::{Access, TenantFsError, open_no_links};

    fn writer(path: &Path) -> Result<ControlWriter, ControlError> {
        ControlWriter::new(&open_no_links(path, Access::ReadWrite).unwrap())
    }

    #[test]
    fn only_a_block_of_exactly_the_size_is_written_and_never_resized() {
        let dir = tempfile::tempdir().unwrap();
        for len in [0usize, 10, CONTROL_SIZE - 8, CONTROL_SIZE + 1, 4096] {
            let path = dir.path().join(format!("b{len}.ctl"));
            std::fs::write(&path, vec![0xa5u8; len]).unwrap();
            assert_eq!(
                writer(&path).err(),
                Some(ControlError::WrongSize { len: len as u64 })
            );
            assert_eq!(
                std::fs::read(&path).unwrap(),
                vec![0xa5u8; len],
                "untouched"
            );
        }
    }

    #[test]
    fn a_hard_linked_block_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let other = dir.path().join("other");
        std::fs::write(&other, [1u8; CONTROL_SIZE]).unwrap();
        let path = dir.path().join("r.ctl");
        std::fs::hard_link(&other, &path).unwrap();
        assert_eq!(
            writer(&path).err(),
            Some(ControlError::HardLinked { links: 2 })
        );
        assert_eq!(std::fs::read(&other).unwrap(), [1u8; CONTROL_SIZE]);
    }

    #[test]
    fn a_symlinked_block_is_not_opened() {
        let dir = tempfile::tempdir().unwrap();
        let host = dir.path().join("host-file");
        std::fs::write(&host, [2u8; CONTROL_SIZE]).unwrap();
        let path = dir.path().join("r.ctl");
        symlink(&host, &path).unwrap();
        let err = open_no_links(&path, Access::ReadWrite).unwrap_err();
        assert!(matches!(err, TenantFsError::Link { .. }), "{err}");
        assert_eq!(std::fs::read(&host).unwrap(), [2u8; CONTROL_SIZE]);
    }

    /// The file's owner truncates it between the checks and the write: the write faults, lands
    /// nowhere, and is reported; the process lives on and the next write works.
    #[test]
    fn a_block_truncated_under_the_writer_is_an_error_not_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.ctl");
        std::fs::write(&path, [0u8; CONTROL_SIZE]).unwrap();
        let w = writer(&path).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(0)
            .unwrap();
        assert_eq!(
            w.update(|s| s.sm_percent[0] = Some(30)),
            Err(ControlError::ChangedWhileWriting)
        );
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0, "not extended");
        let again = dir.path().join("u.ctl");
        std::fs::write(&again, [0u8; CONTROL_SIZE]).unwrap();
        assert_eq!(
            writer(&again)
                .unwrap()
                .update(|s| s.sm_percent[0] = Some(30)),
            Ok(2)
        );
    }

    #[test]
    fn show_reads_without_writing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.ctl");
        std::fs::write(&path, [0u8; CONTROL_SIZE]).unwrap();
        let ro = open_no_links(&path, Access::Read).unwrap();
        assert_eq!(read_control(&ro), Ok(None));
        writer(&path)
            .unwrap()
            .update(|s| s.memory_limit[2] = Some(1 << 30))
            .unwrap();
        let before = std::fs::read(&path).unwrap();
        let snap = read_control(&ro).unwrap().unwrap();
        assert_eq!(snap.settings.memory_limit[2], Some(1 << 30));
        assert_eq!(std::fs::read(&path).unwrap(), before);
        let short = dir.path().join("short.ctl");
        std::fs::write(&short, [0u8; 8]).unwrap();
        let ro = open_no_links(&short, Access::Read).unwrap();
        assert_eq!(read_control(&ro), Err(ControlError::TooShort { len: 8 }));
    }

    /// A tenant that keeps changing the generation word cannot keep the writer spinning.
    #[test]
    fn a_writer_gives_up_on_a_block_whose_generation_never_settles() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spin.ctl");
        std::fs::write(&path, [0u8; CONTROL_SIZE]).unwrap();
        let w = writer(&path).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flipper = {
            let stop = stop.clone();
            let path = path.clone();
            std::thread::spawn(move || {
                let f = std::fs::File::options()
                    .read(true)
                    .write(true)
                    .open(&path)
                    .unwrap();
                let map = Mapping::new(&f, CONTROL_SIZE, true).unwrap();
                let b: &ControlBlock = map.get(0).unwrap();
                // Odd values only, a new one every store: a write "in progress" that never ends
                // and never looks stale for long.
                let mut g = 1u64;
                while !stop.load(Ordering::Relaxed) {
                    b.generation.store(g, Ordering::Relaxed);
                    g = g.wrapping_add(2);
                }
            })
        };
        // Wait until the tenant's stores have begun.
        while !matches!(w.snapshot(), Err(ControlError::Busy { .. })) {
            std::thread::yield_now();
        }
        let t0 = Instant::now();
        let r = w.update(|s| s.sm_percent[0] = Some(10));
        stop.store(true, Ordering::Relaxed);
        flipper.join().unwrap();
        // Winning a CAS between two of the tenant's stores is possible; waiting without end is not.
        assert!(matches!(r, Err(ControlError::Busy { .. }) | Ok(_)), "{r:?}");
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    }
}

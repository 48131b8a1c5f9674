//! A restore is tried only when the GPU has room for it.
//!
//! The driver's `cuCheckpointProcessRestore` needs the process's device memory back on the GPU.
//! When it fails for lack of room (`CUDA_ERROR_OUT_OF_MEMORY`), the process can never be restored
//! again: every later restore fails with `CUDA_ERROR_OPERATING_SYSTEM` (304) and the process stays
//! frozen until it is killed (measured on two H200s, driver 580.159.04, 2026-11-28,
//! `scripts/gpu/run-checks.sh thaw-no-room`; reported on 580.95.05 as NVIDIA/cuda-checkpoint#44).
//! So [`RoomChecked`] wraps the checkpoint API: at the checkpoint it records what the process holds
//! on each GPU (NVML's per-process memory, while the process is locked and its memory still on
//! the GPU), and a restore is called only when every one of those GPUs has that much free plus
//! [`MARGIN`]; otherwise the thaw fails with [`CheckpointError::NoRoom`] without touching the
//! process, which stays frozen with its memory safe in host memory, and a later thaw (the
//! daemon's, every second while the thaw is asked for) tries again.
//!
//! The record is the agent's own file, `<dir>/<pid>` under a root-only directory (default
//! [`DEFAULT_DIR`]), so that `freeze` and a later `thaw` run by hand, or by the daemon, find it;
//! it names the process's start time, so a record of a pid reused by another process is ignored.
//! Without a record (a process frozen by another tool) or without NVML the restore is tried as
//! before, and the outcome says that the room could not be checked.
//!
//! Memory that another process takes between the check and the restore can still make the
//! restore fail; the margin makes that rarer, it cannot exclude it.

use std::{
    io::Write as _,
    os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
    time::Duration,
};

use serde::{Deserialize, Serialize};

use super::{CheckpointApi, CheckpointError, DriverCheckpoint, ProcessState};
use crate::nvml::{
    NvmlBackend,
    library::{DEFAULT_LIBRARY, NvmlLibrary},
};

/// Where the records are kept: the agent's run directory, root's.
pub const DEFAULT_DIR: &str = "/run/vgpu-agent/frozen";
/// Free memory asked for beyond what the process held before its freeze: the restore's own
/// transient needs, and some slack for other processes' allocations while it runs.
pub const MARGIN: u64 = 512 << 20;
/// The largest record read (a few hundred bytes per GPU).
const MAX_RECORD_BYTES: u64 = 64 << 10;
/// Bytes of `/proc/<pid>/stat` read.
const MAX_STAT_BYTES: usize = 4 << 10;
/// Records looked at by one [`RoomChecked::prune`] (one per frozen process).
const MAX_RECORDS: usize = 4096;

/// The host's checkpoint API with the room check.
pub type Checked = RoomChecked<DriverCheckpoint, NvmlMemory<NvmlLibrary>>;

/// The driver at `libcuda`, its restores checked against NVML (the loader's
/// `libnvidia-ml.so.1`; without it, unchecked) for the processes under `proc`.
pub fn open(libcuda: &Path, proc: &Path) -> Result<Checked, CheckpointError> {
    let api = DriverCheckpoint::open(libcuda)?;
    let memory = NvmlLibrary::open(Path::new(DEFAULT_LIBRARY))
        .ok()
        .map(NvmlMemory);
    let checked = RoomChecked::new(api, memory, Path::new(DEFAULT_DIR), proc);
    checked.prune();
    Ok(checked)
}

/// What a process held on one GPU before its freeze.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    pub uuid: String,
    pub bytes: u64,
}

/// The record of one frozen process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    pid: u32,
    /// `/proc/<pid>/stat` field 22: tells this process from a later one with the same pid.
    start_time: u64,
    held: Vec<Held>,
}

/// The GPUs' memory, as the room check reads it.
pub trait DeviceMemory {
    /// What `pid` holds on each GPU (those where it holds nothing are left out).
    fn held_by(&self, pid: u32) -> Result<Vec<Held>, String>;
    /// The free bytes of the GPU `uuid`.
    fn free(&self, uuid: &str) -> Result<u64, String>;
}

/// [`DeviceMemory`] from NVML.
pub struct NvmlMemory<B>(pub B);

impl<B: NvmlBackend> NvmlMemory<B> {
    fn each_device(&self) -> Result<Vec<(u32, String)>, String> {
        let n = self.0.device_count().map_err(|e| e.to_string())?;
        (0..n)
            .map(|i| Ok((i, self.0.uuid(i).map_err(|e| e.to_string())?)))
            .collect()
    }
}

impl<B: NvmlBackend> DeviceMemory for NvmlMemory<B> {
    fn held_by(&self, pid: u32) -> Result<Vec<Held>, String> {
        let mut out = Vec::new();
        for (index, uuid) in self.each_device()? {
            let bytes: u64 = self
                .0
                .compute_processes(index)
                .map_err(|e| e.to_string())?
                .into_iter()
                .filter(|p| p.pid == pid)
                .filter_map(|p| p.used)
                .sum();
            if bytes > 0 {
                out.push(Held { uuid, bytes });
            }
        }
        Ok(out)
    }

    fn free(&self, uuid: &str) -> Result<u64, String> {
        for (index, u) in self.each_device()? {
            if u == uuid {
                let (used, total) = self.0.memory_used_total(index).map_err(|e| e.to_string())?;
                return Ok(total.saturating_sub(used));
            }
        }
        Err(format!("no GPU {uuid}"))
    }
}

/// The checkpoint API `A`, whose restores are tried only with room (see the module).
pub struct RoomChecked<A, M> {
    api: A,
    /// `None`: no NVML, restores are tried unchecked.
    memory: Option<M>,
    dir: PathBuf,
    proc: PathBuf,
}

impl<A: CheckpointApi, M: DeviceMemory> RoomChecked<A, M> {
    /// `api` with records under `dir` and processes under `proc` (`/proc`).
    pub fn new(api: A, memory: Option<M>, dir: &Path, proc: &Path) -> Self {
        RoomChecked {
            api,
            memory,
            dir: dir.to_path_buf(),
            proc: proc.to_path_buf(),
        }
    }

    fn record_path(&self, pid: u32) -> PathBuf {
        self.dir.join(pid.to_string())
    }

    /// `pid`'s start time, from its `stat` (the fields after the command, which may hold any
    /// byte, start after its last `)`).
    fn start_time(&self, pid: u32) -> Option<u64> {
        let path = self.proc.join(pid.to_string()).join("stat");
        let (bytes, _) = tenant_fs::read_proc(&path, MAX_STAT_BYTES).ok()?;
        let text = String::from_utf8_lossy(&bytes);
        let rest = &text[text.rfind(')')? + 1..];
        // Field 22 overall; the fields after the command start at field 3.
        rest.split_whitespace().nth(22 - 3)?.parse().ok()
    }

    /// Records what `pid` holds now (before its checkpoint). A record that cannot be written
    /// only means the later restore is unchecked.
    fn remember(&self, pid: u32) {
        let (Some(memory), Some(start_time)) = (&self.memory, self.start_time(pid)) else {
            return;
        };
        let Ok(held) = memory.held_by(pid) else {
            return;
        };
        let record = Record {
            pid,
            start_time,
            held,
        };
        let _ = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir);
        let path = self.record_path(pid);
        let _ = std::fs::remove_file(&path);
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            && let Ok(text) = serde_json::to_vec(&record)
        {
            let _ = f.write_all(&text);
        }
    }

    fn forget(&self, pid: u32) {
        let _ = std::fs::remove_file(self.record_path(pid));
    }

    /// Removes the records of processes that are gone (killed while frozen: nothing of them is
    /// left behind) or whose pid now names another process; at most [`MAX_RECORDS`] looked at.
    pub fn prune(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten().take(MAX_RECORDS) {
            let name = entry.file_name();
            let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if self.recorded(pid).is_none() {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }

    /// `pid`'s record, if there is one for this very process.
    fn recorded(&self, pid: u32) -> Option<Record> {
        use std::io::Read as _;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(self.record_path(pid))
            .ok()?;
        let mut text = Vec::new();
        f.take(MAX_RECORD_BYTES).read_to_end(&mut text).ok()?;
        let record: Record = serde_json::from_slice(&text).ok()?;
        (record.pid == pid && Some(record.start_time) == self.start_time(pid)).then_some(record)
    }

    /// Whether `pid` may be restored now: `Err(NoRoom)` names the first GPU without room.
    fn check_room(&self, pid: u32) -> Result<(), CheckpointError> {
        let (Some(memory), Some(record)) = (&self.memory, self.recorded(pid)) else {
            return Ok(());
        };
        for held in &record.held {
            // A GPU NVML cannot read now: its room is unknown, the restore decides.
            let Ok(free) = memory.free(&held.uuid) else {
                continue;
            };
            if free < held.bytes.saturating_add(MARGIN) {
                return Err(CheckpointError::NoRoom {
                    pid,
                    gpu: held.uuid.clone(),
                    need: held.bytes,
                    free,
                });
            }
        }
        Ok(())
    }
}

impl<A: CheckpointApi, M: DeviceMemory> CheckpointApi for RoomChecked<A, M> {
    fn lock(&self, pid: u32, timeout: Duration) -> Result<(), CheckpointError> {
        self.api.lock(pid, timeout)
    }

    fn checkpoint(&self, pid: u32) -> Result<(), CheckpointError> {
        self.remember(pid);
        let r = self.api.checkpoint(pid);
        if r.is_err() {
            self.forget(pid);
        }
        r
    }

    fn restore(&self, pid: u32) -> Result<(), CheckpointError> {
        self.check_room(pid)?;
        self.api.restore(pid)?;
        self.forget(pid);
        Ok(())
    }

    fn unlock(&self, pid: u32) -> Result<(), CheckpointError> {
        self.api.unlock(pid)
    }

    fn state(&self, pid: u32) -> Result<ProcessState, CheckpointError> {
        let s = self.api.state(pid);
        if s == Ok(ProcessState::Running) {
            // Thawed by someone else: the record is stale.
            self.forget(pid);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use std::{cell::RefCell, collections::HashMap};

    use super::*;

    /// A driver whose restore fails forever once it failed for lack of room, as driver 580's does.
    #[derive(Default)]
    struct Driver {
        state: RefCell<HashMap<u32, ProcessState>>,
        restores: RefCell<u32>,
        room: RefCell<bool>,
        poisoned: RefCell<bool>,
    }

    impl CheckpointApi for Driver {
        fn lock(&self, pid: u32, _: Duration) -> Result<(), CheckpointError> {
            self.state.borrow_mut().insert(pid, ProcessState::Locked);
            Ok(())
        }
        fn checkpoint(&self, pid: u32) -> Result<(), CheckpointError> {
            self.state
                .borrow_mut()
                .insert(pid, ProcessState::Checkpointed);
            Ok(())
        }
        fn restore(&self, pid: u32) -> Result<(), CheckpointError> {
            *self.restores.borrow_mut() += 1;
            let code = if *self.poisoned.borrow() {
                304
            } else if !*self.room.borrow() {
                *self.poisoned.borrow_mut() = true;
                2
            } else {
                self.state.borrow_mut().insert(pid, ProcessState::Locked);
                return Ok(());
            };
            Err(CheckpointError::Call {
                call: "cuCheckpointProcessRestore",
                pid,
                code,
            })
        }
        fn unlock(&self, pid: u32) -> Result<(), CheckpointError> {
            self.state.borrow_mut().insert(pid, ProcessState::Running);
            Ok(())
        }
        fn state(&self, pid: u32) -> Result<ProcessState, CheckpointError> {
            Ok(self.state.borrow()[&pid])
        }
    }

    /// One GPU, its free bytes settable, and what each pid holds.
    struct Gpu {
        free: RefCell<u64>,
        held: u64,
    }

    impl DeviceMemory for &Gpu {
        fn held_by(&self, _: u32) -> Result<Vec<Held>, String> {
            Ok(vec![Held {
                uuid: "GPU-0".into(),
                bytes: self.held,
            }])
        }
        fn free(&self, uuid: &str) -> Result<u64, String> {
            if uuid == "GPU-0" {
                Ok(*self.free.borrow())
            } else {
                Err(format!("no GPU {uuid}"))
            }
        }
    }

    /// A `/proc` with `pid`'s stat, whose start time is `start` (the command holds a `)`).
    fn proc_with(dir: &Path, pid: u32, start: u64) {
        let d = dir.join(pid.to_string());
        std::fs::create_dir_all(&d).unwrap();
        let fields: Vec<String> = (3..=21).map(|i| i.to_string()).collect();
        std::fs::write(
            d.join("stat"),
            format!("{pid} (a) b) S {} {start} 0 0\n", fields[1..].join(" ")),
        )
        .unwrap();
    }

    #[test]
    fn a_thaw_without_room_never_calls_the_restore_and_the_process_thaws_once_there_is_room() {
        let tmp = tempfile::tempdir().unwrap();
        let proc = tmp.path().join("proc");
        proc_with(&proc, 7, 4242);
        let gpu = Gpu {
            free: RefCell::new(0),
            held: 4 << 30,
        };
        let api = RoomChecked::new(
            Driver::default(),
            Some(&gpu),
            &tmp.path().join("frozen"),
            &proc,
        );
        super::super::freeze(&api, 7, Duration::from_secs(1)).unwrap();
        assert!(tmp.path().join("frozen/7").exists());
        // 4 GiB held, 4 GiB + 511 MiB free: short of the margin, no restore is tried.
        *gpu.free.borrow_mut() = (4 << 30) + MARGIN - (1 << 20);
        let e = super::super::thaw(&api, 7).unwrap_err();
        assert!(
            matches!(e, CheckpointError::NoRoom { pid: 7, need, .. } if need == 4 << 30),
            "{e}"
        );
        assert!(e.to_string().contains("cuda-checkpoint#44"), "{e}");
        assert_eq!(*api.api.restores.borrow(), 0);
        assert_eq!(api.state(7), Ok(ProcessState::Checkpointed));
        // With room, the same thaw goes through and the record goes.
        *gpu.free.borrow_mut() = (4 << 30) + MARGIN;
        *api.api.room.borrow_mut() = true;
        assert_eq!(super::super::thaw(&api, 7), Ok(ProcessState::Running));
        assert_eq!(*api.api.restores.borrow(), 1);
        assert!(!tmp.path().join("frozen/7").exists());
    }

    #[test]
    fn without_the_check_the_driver_would_have_lost_the_process() {
        // What the check prevents: a restore without room, then one with room, on the fake
        // driver that behaves as driver 580 does.
        let d = Driver::default();
        d.lock(7, Duration::ZERO).unwrap();
        d.checkpoint(7).unwrap();
        assert!(super::super::thaw(&d, 7).is_err());
        *d.room.borrow_mut() = true;
        let e = super::super::thaw(&d, 7).unwrap_err();
        assert!(e.to_string().contains("304"), "{e}");
    }

    #[test]
    fn a_record_of_another_process_with_the_same_pid_or_a_hostile_record_is_not_used() {
        let tmp = tempfile::tempdir().unwrap();
        let proc = tmp.path().join("proc");
        proc_with(&proc, 7, 4242);
        let gpu = Gpu {
            free: RefCell::new(0),
            held: 4 << 30,
        };
        let dir = tmp.path().join("frozen");
        let api = RoomChecked::new(Driver::default(), Some(&gpu), &dir, &proc);
        super::super::freeze(&api, 7, Duration::from_secs(1)).unwrap();
        // The pid now names a process that started later: its record is not this one's.
        proc_with(&proc, 7, 5000);
        assert!(api.recorded(7).is_none());
        assert!(api.check_room(7).is_ok());
        // Garbage, an oversized record and a symlink are no records.
        proc_with(&proc, 7, 4242);
        std::fs::write(dir.join("7"), b"\xff{not json").unwrap();
        assert!(api.recorded(7).is_none());
        std::fs::write(dir.join("7"), vec![b' '; 2 * MAX_RECORD_BYTES as usize]).unwrap();
        assert!(api.recorded(7).is_none());
        std::fs::remove_file(dir.join("7")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.join("7")).unwrap();
        assert!(api.recorded(7).is_none());
        // A new freeze replaces the link with a record of its own, never writing through it.
        api.remember(7);
        assert!(
            !std::fs::symlink_metadata(dir.join("7"))
                .unwrap()
                .is_symlink()
        );
        assert_eq!(api.recorded(7).unwrap().held[0].bytes, 4 << 30);
    }

    #[test]
    fn the_records_of_processes_gone_are_pruned_and_the_others_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let proc = tmp.path().join("proc");
        proc_with(&proc, 7, 4242);
        proc_with(&proc, 8, 100);
        proc_with(&proc, 9, 100);
        let gpu = Gpu {
            free: RefCell::new(0),
            held: 1 << 30,
        };
        let dir = tmp.path().join("frozen");
        let api = RoomChecked::new(Driver::default(), Some(&gpu), &dir, &proc);
        for pid in [7, 8, 9] {
            api.remember(pid);
        }
        std::fs::write(dir.join("not-a-pid"), b"x").unwrap();
        // 8 was killed while frozen; 9's pid now names a later process.
        std::fs::remove_dir_all(proc.join("8")).unwrap();
        proc_with(&proc, 9, 200);
        api.prune();
        let left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        assert_eq!(left, ["7", "not-a-pid"]);
    }

    #[test]
    fn without_nvml_the_restore_is_tried_as_before() {
        let tmp = tempfile::tempdir().unwrap();
        let api: RoomChecked<Driver, &Gpu> =
            RoomChecked::new(Driver::default(), None, tmp.path(), tmp.path());
        *api.api.room.borrow_mut() = true;
        super::super::freeze(&api, 7, Duration::from_secs(1)).unwrap();
        assert_eq!(super::super::thaw(&api, 7), Ok(ProcessState::Running));
        assert_eq!(*api.api.restores.borrow(), 1);
    }
}

//! Who asks for a loan, as the agent measures it: the process the socket names (its start time
//! and container from `/proc`), its in-process freeze (the `InProcess` mark in the control block
//! beside a region it maps, and its own slot there: found and read as `limit` and the freeze
//! find and read them, through `tenant_fs`, within the region reader's budget) and what NVML
//! says it holds on the GPUs. Everything here reads what a tenant controls: it runs on a thread
//! of its own, which the connection waits for a bounded time ([`super::server`]).

use std::{
    path::{Path, PathBuf},
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

use region::{
    FreezeMark,
    freeze_pool::Status,
    read_control,
    reader::{ReadBudget, RegionReader, SlotPhase},
};
use tenant_fs::{Access, TenantFile};

use super::{
    decide::{Freezing, Gpu, gpu_of},
    loans::{Look, Process, Watch},
};
use crate::{
    checkpoint::measure::Measure, collector::processes::ProcessTable,
    identity::container::ContainerIdentity, limit,
};

/// Bytes of `/proc/<pid>/cgroup` read (a few hundred in practice).
const MAX_CGROUP_BYTES: usize = 64 << 10;
/// How often loading NVML is tried again after it failed.
const NVML_RETRY: Duration = Duration::from_secs(30);
/// What a loan's watch may spend reading its region each time (the slot it wants is read within
/// it, or the loan waits for the next look).
const WATCH_BUDGET: ReadBudget = ReadBudget {
    time: Duration::from_millis(25),
    retries: 4096,
};

/// What the agent found of a process asking for a loan.
pub(super) struct Asked {
    /// Its start time (clock ticks after boot).
    pub start: u64,
    pub container: Option<String>,
    /// Its in-process freeze, and how to watch its slot (`None`: not freezing in-process).
    pub freezing: Option<(Freezing, Box<dyn Watch>)>,
    pub gpu: Gpu,
}

/// How the server learns about the processes that ask.
pub(super) trait Inspect: Send + Sync {
    /// The tenant `pid` is of, for the connection caps: its container id, or `host`. Cheap
    /// (`/proc/<pid>/cgroup`, which the kernel writes).
    fn tenant(&self, pid: u32) -> String;
    /// What the agent measures of `pid` (`Err`: the process could not be read).
    fn inspect(&self, pid: u32) -> Result<Asked, Status>;
}

/// NVML once loaded, and when it was last tried.
type Loaded = (Option<Box<dyn Measure>>, Option<Instant>);

/// NVML as the pool reads it: loaded at the start, and again at most every [`NVML_RETRY`]
/// while it cannot be.
pub(super) struct Nvml {
    load: fn() -> Option<Box<dyn Measure>>,
    state: Mutex<Loaded>,
}

impl Nvml {
    pub fn new(load: fn() -> Option<Box<dyn Measure>>) -> Nvml {
        let nvml = Nvml {
            load,
            state: Mutex::new((None, None)),
        };
        let mut state = nvml.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.0 = (nvml.load)();
        state.1 = Some(Instant::now());
        drop(state);
        nvml
    }

    pub fn loaded(&self) -> bool {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .0
            .is_some()
    }

    /// What NVML says `pid` holds now.
    fn gpu(&self, pid: u32) -> Gpu {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.0.is_none() && state.1.is_none_or(|t| t.elapsed() >= NVML_RETRY) {
            state.1 = Some(Instant::now());
            state.0 = (self.load)();
        }
        let gpus = state.0.as_ref().and_then(|m| m.read());
        gpu_of(gpus.as_deref(), pid)
    }
}

/// The host's processes under `proc` (`/proc`), measured by `nvml`.
pub(super) struct Host {
    pub proc: PathBuf,
    pub nvml: Nvml,
}

impl Inspect for Host {
    fn tenant(&self, pid: u32) -> String {
        let path = self.proc.join(pid.to_string()).join("cgroup");
        tenant_fs::read_proc(&path, MAX_CGROUP_BYTES)
            .ok()
            .and_then(|(cg, _)| {
                ContainerIdentity::from_proc_cgroup(&String::from_utf8_lossy(&cg))?.container_id
            })
            .map_or_else(|| "host".to_owned(), |c| c.as_str().to_owned())
    }

    fn inspect(&self, pid: u32) -> Result<Asked, Status> {
        let mut table = ProcessTable::new(&self.proc);
        let info = table.get(pid).ok_or(Status::Unknown)?.clone();
        let start = info.facts.start_ticks;
        let container = info
            .identity
            .container_id
            .as_ref()
            .map(|c| c.as_str().to_owned());
        // Only a process of a container is frozen by its mark (`freeze --container`).
        let freezing = match (&container, info.namespace_pid) {
            (Some(_), Some((ns, ns_pid))) => limit::process_regions(&self.proc, pid)
                .into_iter()
                .find_map(|r| {
                    let control = r.open_control(Access::Read).ok()?;
                    let reader = RegionReader::from_file(r.open_region().ok()?).ok()?;
                    let own = Owner {
                        proc: self.proc.clone(),
                        pid,
                        slot: (ns, ns_pid, start),
                    };
                    freezing_in(&control, reader, own)
                }),
            _ => None,
        };
        let gpu = self.nvml.gpu(pid);
        Ok(Asked {
            start,
            container,
            freezing,
            gpu,
        })
    }
}

/// A process, and its identity in a region's slot.
pub(super) struct Owner {
    /// Where its `/proc` directory is (`<proc>/<pid>`).
    pub proc: PathBuf,
    pub pid: u32,
    /// Its pid namespace's inode, its pid there, its start time.
    pub slot: (u64, u32, u64),
}

/// The in-process freeze of `owner` that the control block `control` marks, with its slot in
/// the region `reader` reads: the mark must be `InProcess`, and the process must hold a live
/// slot there with the path on. `None` otherwise.
pub(super) fn freezing_in(
    control: &TenantFile,
    reader: RegionReader,
    owner: Owner,
) -> Option<(Freezing, Box<dyn Watch>)> {
    let block = read_control(control).ok()??;
    if block.settings.freeze != FreezeMark::InProcess {
        return None;
    }
    let snap = reader.snapshot_within(&ReadBudget::DEFAULT).ok()?;
    let slot = snap
        .slots
        .iter()
        .find(|s| s.phase == SlotPhase::Live && (s.pid_ns, s.pid, s.start_time) == owner.slot)?;
    let own = slot.own_freeze?;
    let freezing = Freezing {
        generation: block.generation,
        answer: Some(own.state),
    };
    let watch = SlotWatch {
        stat: owner.proc.join(owner.pid.to_string()).join("stat"),
        reader,
        index: slot.index,
        owner: owner.slot,
    };
    Some((freezing, Box::new(watch)))
}

/// A borrower's process (`/proc/<pid>/stat`) and its slot.
struct SlotWatch {
    stat: PathBuf,
    reader: RegionReader,
    index: u32,
    owner: (u64, u32, u64),
}

impl Watch for SlotWatch {
    fn look(&mut self) -> Look {
        Look {
            process: process_at(&self.stat),
            answer: self
                .reader
                .snapshot_within(&WATCH_BUDGET)
                .ok()
                .and_then(|snap| {
                    let s = snap.slots.iter().find(|s| s.index == self.index)?;
                    let own =
                        s.phase == SlotPhase::Live && (s.pid_ns, s.pid, s.start_time) == self.owner;
                    own.then_some(s.own_freeze?.state)
                }),
        }
    }
}

/// The process whose `stat` is at `path`: gone (unreadable, a zombie or dead), or its start.
pub(super) fn process_at(path: &Path) -> Process {
    let mut buf = [0u8; tenant_fs::MAX_STAT_BYTES];
    match tenant_fs::read_stat(path, &mut buf) {
        Ok(s) if !matches!(s.state, b'Z' | b'X') => Process::Started(s.start_ticks),
        _ => Process::Gone,
    }
}

/// Processes as the tests play them.
#[cfg(test)]
pub(super) mod testing {
    use std::{
        collections::VecDeque,
        sync::{Arc, Mutex},
        time::Duration,
    };

    use super::*;

    /// A borrower whose looks a test sets.
    pub struct FakeWatch(pub Arc<Mutex<Look>>);

    impl Watch for FakeWatch {
        fn look(&mut self) -> Look {
            *self.0.lock().unwrap()
        }
    }

    /// What the agent measures of every process that asks, as a test sets it.
    pub struct FakeAsker {
        pub start: u64,
        pub freezing: Option<Freezing>,
        pub gpu: Gpu,
        /// What the loan's watch sees.
        pub look: Arc<Mutex<Look>>,
    }

    impl FakeAsker {
        /// A process started at tick 100, freezing for the mark of generation 8 (its slot
        /// answering generation 6), holding `held` bytes on the GPU.
        pub fn freezing(held: u64) -> FakeAsker {
            FakeAsker {
                start: 100,
                freezing: Some(Freezing {
                    generation: 8,
                    answer: Some(region::OwnFreeze {
                        state: region::OwnFreezeState::Running,
                        generation: 6,
                    }),
                }),
                gpu: Gpu::Bytes(held),
                look: Arc::new(Mutex::new(Look {
                    process: Process::Started(100),
                    answer: None,
                })),
            }
        }
    }

    pub struct FakeInspect {
        /// The tenant of each connection.
        pub tenant: Box<dyn Fn(u32) -> String + Send + Sync>,
        pub asker: Arc<Mutex<FakeAsker>>,
        /// How long each inspection takes, in order (none: at once).
        pub delays: Arc<Mutex<VecDeque<Duration>>>,
    }

    impl FakeInspect {
        /// Every connection of tenant `t`, every process as `asker` says.
        pub fn new(asker: FakeAsker) -> FakeInspect {
            FakeInspect {
                tenant: Box::new(|_| "t".to_owned()),
                asker: Arc::new(Mutex::new(asker)),
                delays: Arc::default(),
            }
        }
    }

    impl Inspect for FakeInspect {
        fn tenant(&self, pid: u32) -> String {
            (self.tenant)(pid)
        }

        fn inspect(&self, _pid: u32) -> Result<Asked, Status> {
            let delay = self.delays.lock().unwrap().pop_front();
            if let Some(d) = delay {
                std::thread::sleep(d);
            }
            let a = self.asker.lock().unwrap();
            Ok(Asked {
                start: a.start,
                container: Some("c".into()),
                freezing: a.freezing.map(|f| {
                    (
                        f,
                        Box::new(FakeWatch(Arc::clone(&a.look))) as Box<dyn Watch>,
                    )
                }),
                gpu: a.gpu,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use region::{ControlWriter, OwnFreeze, OwnFreezeState, Region, RegionConfig};

    use super::*;

    /// A region in a temporary directory whose one slot is this process's, with its control
    /// block.
    struct Fixture {
        _dir: tempfile::TempDir,
        path: PathBuf,
        region: Region,
        slot: region::Slot,
    }

    impl Fixture {
        fn new() -> Fixture {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("c.region");
            let (region, _) = Region::open_or_create(&path, &RegionConfig::unlimited(1)).unwrap();
            drop(region::ControlReader::open_or_create(&region::control_path(&path)).unwrap());
            let slot = region.claim_slot().unwrap();
            Fixture {
                _dir: dir,
                path,
                region,
                slot,
            }
        }

        fn control(&self, access: Access) -> TenantFile {
            tenant_fs::open_no_links(&region::control_path(&self.path), access).unwrap()
        }

        fn mark(&self, mark: FreezeMark) -> u64 {
            let file = self.control(Access::ReadWrite);
            ControlWriter::new(&file)
                .unwrap()
                .update(|s| s.freeze = mark)
                .unwrap()
        }

        fn answer(&self, state: OwnFreezeState, generation: u64) {
            self.region
                .publish_own_freeze(&self.slot, OwnFreeze { state, generation }, 1 << 30);
        }

        /// This process, as its slot names it (`start` changed by `later` ticks).
        fn me(&self, later: u64) -> Owner {
            let pid = std::process::id();
            let mut table = ProcessTable::new(Path::new("/proc"));
            let info = table.get(pid).unwrap().clone();
            let (ns, ns_pid) = info.namespace_pid.unwrap();
            Owner {
                proc: PathBuf::from("/proc"),
                pid,
                slot: (ns, ns_pid, info.facts.start_ticks + later),
            }
        }

        fn freezing(&self, owner: Owner) -> Option<(Freezing, Box<dyn Watch>)> {
            let reader = RegionReader::open(&self.path).unwrap();
            freezing_in(&self.control(Access::Read), reader, owner)
        }
    }

    /// A freeze is found only where the control block marks `InProcess` and the process holds a
    /// live slot with the path on; its watch then sees the process and what its slot answers.
    #[test]
    fn a_freeze_is_found_where_the_block_marks_it_and_the_slot_is_the_processs() {
        let f = Fixture::new();
        f.answer(OwnFreezeState::Running, 0);
        assert!(f.freezing(f.me(0)).is_none(), "never marked");
        let generation = f.mark(FreezeMark::InProcess);
        let (found, mut watch) = f.freezing(f.me(0)).expect("marked, its own slot");
        assert_eq!(found.generation, generation);
        assert_eq!(
            found.answer,
            Some(OwnFreeze {
                state: OwnFreezeState::Running,
                generation: 0
            })
        );
        assert!(
            f.freezing(f.me(1)).is_none(),
            "a slot of another start time is not this process's"
        );
        let start = f.me(0).slot.2;
        assert_eq!(
            watch.look(),
            Look {
                process: Process::Started(start),
                answer: found.answer
            }
        );
        f.answer(OwnFreezeState::Frozen, generation);
        assert_eq!(
            watch.look().answer,
            Some(OwnFreeze {
                state: OwnFreezeState::Frozen,
                generation
            })
        );
        for mark in [
            FreezeMark::Frozen,
            FreezeMark::Freezing,
            FreezeMark::Running,
        ] {
            f.mark(mark);
            assert!(f.freezing(f.me(0)).is_none(), "{mark:?}");
        }
    }

    #[test]
    fn a_process_gone_or_a_zombie_is_gone() {
        let me = std::process::id();
        assert!(matches!(
            process_at(&Path::new("/proc").join(me.to_string()).join("stat")),
            Process::Started(_)
        ));
        assert_eq!(
            process_at(Path::new("/proc/0/stat")),
            Process::Gone,
            "no such process"
        );
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let stat = Path::new("/proc").join(child.id().to_string()).join("stat");
        let deadline = Instant::now() + Duration::from_secs(5);
        while process_at(&stat) != Process::Gone && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(process_at(&stat), Process::Gone, "exited, not reaped yet");
        child.wait().unwrap();
    }
}

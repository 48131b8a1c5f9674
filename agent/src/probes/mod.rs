//! Loading the eBPF programs and attaching them to driver libraries.
//!
//! Each [`ApiKind`] has one entry and one return program; every attached symbol carries a
//! [`ProbeCookie`]. Where the kernel supports uprobe_multi links, one link covers all symbols of a
//! kind in a library (fast to attach and detach); elsewhere each symbol gets its own perf link.
//! All calls into aya go through this module.

pub mod calibrate;
mod error;
pub mod monotonic;
pub mod privileges;
mod probe_time;
mod release;
pub mod sampling;
pub mod session;
pub mod symbols;
pub mod warnings;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::Path,
};

use crate::{
    discovery::{FileId, LibraryFile, LibraryKind},
    model::probing::AttachMode,
    probe_options::{MapQuotas, SpanSampling},
};
use agent_common::{
    ApiId, ApiKind, ProbeCookie,
    maps::{
        AllocKey, AllocSizeKey, AllocSizeVal, AllocVal, ApiStats, Health, LiveMem, NcclCommInfo,
        NcclCommKey, NcclStatsKey, ProbeLoss, StatsKey,
    },
};
use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap as BpfHashMap, MapError, PerCpuArray},
    programs::{
        UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLink, UProbeLinkId, UProbeScope},
    },
    sys::{UProbeMultiFeature, is_uprobe_multi_supported},
};
pub use error::ProbeError;
pub use symbols::SymbolTable;

/// The compiled eBPF object (empty when the agent was built without the eBPF toolchain).
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/vgpu-probes"));

fn program_name(kind: ApiKind, entry: bool, mode: AttachMode) -> String {
    let base = match kind {
        ApiKind::Info => "calib",
        k => k.name(),
    };
    let suffix = if entry { "entry" } else { "return" };
    match mode {
        AttachMode::Multi => format!("{base}_{suffix}_multi"),
        AttachMode::PerSymbol => format!("{base}_{suffix}"),
    }
}

/// The kinds of a CUDA driver library that can be attached for some processes only: what the
/// limiter records itself, exactly (counts, latencies, bytes), so that the processes under it
/// take no probe trap for them.
pub const PER_PROCESS_KINDS: [ApiKind; 3] = ApiKind::HIGH_RATE;

/// Which processes a library's [`PER_PROCESS_KINDS`] are attached for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProcessScope {
    /// Every process that maps the library: one link pair per kind.
    All,
    /// These processes only: a link pair per kind and process (uprobe links scoped to a
    /// process: the kernel writes no breakpoint into the others).
    Only(BTreeSet<u32>),
}

/// Links of one attachment: (program name, link), entry and return.
type Links = Vec<(String, UProbeLinkId)>;

/// One library's attachment.
#[derive(Debug)]
pub struct AttachedLibrary {
    pub file: LibraryFile,
    pub symbols: SymbolTable,
    /// Links per kind attached for every process.
    links: BTreeMap<ApiKind, Links>,
    /// Links per kind and process, where the scope is [`ProcessScope::Only`].
    process_links: BTreeMap<(ApiKind, u32), Links>,
    scope: ProcessScope,
}

impl AttachedLibrary {
    /// Kinds attached (a per-process kind is attached while it is on, for whichever processes
    /// are in scope, none included).
    pub fn attached_kinds(&self) -> impl Iterator<Item = ApiKind> + '_ {
        let per_process: BTreeSet<ApiKind> = self.process_links.keys().map(|(k, _)| *k).collect();
        let mut kinds: BTreeSet<ApiKind> = self.links.keys().copied().collect();
        kinds.extend(per_process);
        kinds.into_iter()
    }

    pub fn scope(&self) -> &ProcessScope {
        &self.scope
    }

    /// Whether `kind` is attached per process in this library.
    fn scoped(&self, kind: ApiKind) -> bool {
        self.file.kind == LibraryKind::Cuda
            && PER_PROCESS_KINDS.contains(&kind)
            && matches!(self.scope, ProcessScope::Only(_))
    }
}

/// The loaded programs and everything attached.
pub struct Probes {
    ebpf: Ebpf,
    mode: AttachMode,
    /// How the calibration programs attach (see `load`).
    calib_mode: AttachMode,
    libraries: BTreeMap<FileId, AttachedLibrary>,
    /// Kinds left detached (launches until turned on; sampled kinds between their windows).
    off: BTreeSet<ApiKind>,
    /// Links of forgotten libraries being released, and the release of all at drop.
    releaser: release::Releaser,
    /// Whether uprobe links can be scoped to one process (uprobe_multi with a working pid
    /// filter); without it every library stays [`ProcessScope::All`].
    can_scope: bool,
}

impl Probes {
    /// Checks privileges, then loads every program of the attach mode the kernel supports.
    pub fn load(spans: Option<SpanSampling>, quotas: MapQuotas) -> Result<Probes, ProbeError> {
        privileges::check_current_process().map_err(ProbeError::NotPrivileged)?;
        if EBPF_OBJECT.is_empty() {
            return Err(ProbeError::BuiltWithoutProbes);
        }
        let mode = match is_uprobe_multi_supported(UProbeMultiFeature::LinkCreation) {
            Ok(true) => AttachMode::Multi,
            _ => AttachMode::PerSymbol,
        };
        let s = spans.unwrap_or(SpanSampling {
            slow_ns: 0,
            sample_every: 0,
        });
        let on = u64::from(spans.is_some());
        let mut ebpf = EbpfLoader::new()
            .override_global("TRACE_ON", &on, true)
            .override_global("TRACE_SLOW_NS", &s.slow_ns, true)
            .override_global("TRACE_SAMPLE_EVERY", &s.sample_every, true)
            .override_global("ALLOC_QUOTA", &quotas.allocs_per_process, true)
            .override_global("ROW_QUOTA", &quotas.rows_per_cgroup, true)
            .load(EBPF_OBJECT)
            .map_err(|e| ProbeError::Load(Box::new(e)))?;
        // Calibration measures the cost of the links the probes really use: uprobe_multi links
        // when they can be scoped to this process, else per-symbol perf links.
        let calib_mode = match (
            mode,
            is_uprobe_multi_supported(UProbeMultiFeature::ProcessScopedPidFilter),
        ) {
            (AttachMode::Multi, Ok(true)) => AttachMode::Multi,
            _ => AttachMode::PerSymbol,
        };
        // Per-process links only as uprobe_multi links: one per kind and process (per-symbol
        // perf links would take one descriptor per symbol, kind and process).
        let can_scope = mode == AttachMode::Multi && calib_mode == AttachMode::Multi;
        let mut kinds: Vec<ApiKind> = ApiKind::PROBED.to_vec();
        kinds.extend(ApiKind::NCCL_PROBED);
        kinds.push(ApiKind::Info);
        for kind in kinds {
            for entry in [true, false] {
                let m = if kind == ApiKind::Info {
                    calib_mode
                } else {
                    mode
                };
                let name = program_name(kind, entry, m);
                let prog: &mut UProbe = program(&mut ebpf, &name)?;
                prog.load().map_err(|e| ProbeError::Program {
                    name: name.clone(),
                    source: Box::new(e),
                })?;
            }
        }
        Ok(Probes {
            ebpf,
            mode,
            calib_mode,
            libraries: BTreeMap::new(),
            off: [ApiKind::Launch].into(),
            releaser: release::Releaser::default(),
            can_scope,
        })
    }

    /// The span ring buffer, once (`None` if already taken).
    pub fn take_span_ring(&mut self) -> Option<aya::maps::RingBuf<aya::maps::MapData>> {
        let map = self.ebpf.take_map("SPANS")?;
        aya::maps::RingBuf::try_from(map)
            .map_err(|e| log::warn!("the SPANS map is not a ring buffer: {e}"))
            .ok()
    }

    pub fn mode(&self) -> AttachMode {
        self.mode
    }

    pub fn libraries(&self) -> impl Iterator<Item = &AttachedLibrary> {
        self.libraries.values()
    }

    pub fn library(&self, id: FileId) -> Option<&AttachedLibrary> {
        self.libraries.get(&id)
    }

    pub fn is_attached(&self, id: FileId) -> bool {
        self.libraries.contains_key(&id)
    }

    /// Attaches every probed kind of the library's kind (except those turned off): the CUDA kinds
    /// to libcuda, the NCCL kind to libnccl.
    pub fn attach_library(&mut self, file: LibraryFile) -> Result<&AttachedLibrary, ProbeError> {
        let kinds = probed_kinds(file.kind);
        let nccl = file.kind == LibraryKind::Nccl;
        let apis = ApiId::all().filter(|a| {
            a.spec()
                .is_some_and(|s| kinds.iter().any(|k| in_link_set(s, nccl, *k)))
        });
        let symbols = symbols::resolve_driver(&file, apis)?;
        let mut lib = AttachedLibrary {
            file,
            symbols,
            links: BTreeMap::new(),
            process_links: BTreeMap::new(),
            scope: ProcessScope::All,
        };
        for &kind in kinds {
            if self.off.contains(&kind) {
                continue;
            }
            if let Err(e) = self.attach_kind(&mut lib, kind) {
                // Leave nothing of a library that failed half-way attached.
                let links = Self::take_links(&mut self.ebpf, &mut lib);
                self.releaser.release_now(links);
                return Err(e);
            }
        }
        let id = lib.file.id;
        Ok(self.libraries.entry(id).or_insert(lib))
    }

    /// Attaches `kind` to `lib` under the library's scope: for every process, or for each
    /// process in it (one that cannot be attached for, because it exited meanwhile, is left out
    /// of the scope, so that the next [`Probes::set_scope`] tries it again).
    fn attach_kind(&mut self, lib: &mut AttachedLibrary, kind: ApiKind) -> Result<(), ProbeError> {
        if !lib.scoped(kind) {
            if let Some(links) = self.attach_points(lib, kind, UProbeScope::AllProcesses)? {
                lib.links.insert(kind, links);
            }
            return Ok(());
        }
        let ProcessScope::Only(pids) = lib.scope.clone() else {
            unreachable!("scoped() checked the scope")
        };
        for pid in pids {
            self.attach_for_process(lib, kind, pid);
        }
        Ok(())
    }

    /// Attaches `kind` to `lib` for process `pid` only; a failure (the process exited) takes
    /// it out of the scope.
    fn attach_for_process(&mut self, lib: &mut AttachedLibrary, kind: ApiKind, pid: u32) {
        let Some(nz) = std::num::NonZeroU32::new(pid) else {
            return;
        };
        match self.attach_points(lib, kind, UProbeScope::OneProcess(nz)) {
            Ok(Some(links)) => {
                lib.process_links.insert((kind, pid), links);
            }
            Ok(None) => {}
            Err(e) => {
                log::debug!(
                    "attaching {} of {} for pid {pid}: {e}",
                    kind.name(),
                    lib.file.attach_path.display()
                );
                if let ProcessScope::Only(pids) = &mut lib.scope {
                    pids.remove(&pid);
                }
            }
        }
    }

    /// Attaches the entry and return programs of `kind` to the library's symbols of that kind
    /// (`None`: it has none). Leaves nothing half-attached on failure.
    fn attach_points(
        &mut self,
        lib: &AttachedLibrary,
        kind: ApiKind,
        scope: UProbeScope,
    ) -> Result<Option<Links>, ProbeError> {
        let nccl = lib.file.kind == LibraryKind::Nccl;
        let points: Vec<UProbeAttachPoint<'static>> = lib
            .symbols
            .found
            .iter()
            .filter(|s| {
                s.api
                    .spec()
                    .is_some_and(|spec| in_link_set(spec, nccl, kind))
            })
            .filter_map(|s| {
                Some(UProbeAttachPoint {
                    location: UProbeAttachLocation::AbsoluteOffset(s.file_offset),
                    cookie: Some(ProbeCookie::for_api(s.api)?.0),
                })
            })
            .collect();
        if points.is_empty() {
            return Ok(None);
        }
        // An NCCL library's two link sets both run the NCCL programs.
        let programs = if nccl { ApiKind::Nccl } else { kind };
        let mut links = Vec::with_capacity(2);
        for entry in [true, false] {
            let name = program_name(programs, entry, self.mode);
            let prog = program(&mut self.ebpf, &name)?;
            match prog.attach(points.iter(), &lib.file.attach_path, scope) {
                Ok(id) => links.push((name, id)),
                Err(source) => {
                    // Leave nothing half-attached: an entry probe without its return probe
                    // would only fill the in-flight table.
                    for (n, id) in links {
                        if let Ok(p) = program(&mut self.ebpf, &n) {
                            let _ = p.detach(id);
                        }
                    }
                    return Err(ProbeError::Attach {
                        program: name,
                        path: lib.file.attach_path.clone(),
                        source: Box::new(source),
                    });
                }
            }
        }
        Ok(Some(links))
    }

    /// Detaches a kind from a library now (a sampling window's edge: the probes must be off
    /// when this returns), every process's links at once.
    fn detach_kind(&mut self, id: FileId, kind: ApiKind) {
        let Some(lib) = self.libraries.get_mut(&id) else {
            return;
        };
        let mut taken: Vec<Links> = lib.links.remove(&kind).into_iter().collect();
        let keys: Vec<(ApiKind, u32)> = lib
            .process_links
            .keys()
            .filter(|(k, _)| *k == kind)
            .copied()
            .collect();
        for key in keys {
            taken.extend(lib.process_links.remove(&key));
        }
        let path = lib.file.attach_path.clone();
        let links = Self::take_named(&mut self.ebpf, taken, &path);
        self.releaser.release_now(links);
    }

    /// Whether libraries can be attached for some processes only (see [`ProcessScope`]).
    pub fn can_scope(&self) -> bool {
        self.can_scope
    }

    /// Sets which processes a CUDA library's [`PER_PROCESS_KINDS`] are attached for. Processes
    /// that leave the scope lose their links in the background; a change between
    /// [`ProcessScope::All`] and [`ProcessScope::Only`] detaches the kinds first and attaches
    /// them again after (a call in between is missed, none is counted twice).
    pub fn set_scope(
        &mut self,
        id: FileId,
        scope: ProcessScope,
    ) -> Result<(), Vec<(FileId, ProbeError)>> {
        let mut failed = Vec::new();
        if !self.can_scope {
            return Ok(());
        }
        let Some(mut lib) = self.libraries.remove(&id) else {
            return Ok(());
        };
        if lib.file.kind != LibraryKind::Cuda || lib.scope == scope {
            self.libraries.insert(id, lib);
            return Ok(());
        }
        let on: Vec<ApiKind> = PER_PROCESS_KINDS
            .into_iter()
            .filter(|k| !self.off.contains(k))
            .collect();
        match (&lib.scope, &scope) {
            (ProcessScope::Only(old), ProcessScope::Only(new)) => {
                let (old, new) = (old.clone(), new.clone());
                let mut gone = Vec::new();
                for pid in old.difference(&new) {
                    for kind in PER_PROCESS_KINDS {
                        gone.extend(lib.process_links.remove(&(kind, *pid)));
                    }
                }
                let links = Self::take_named(&mut self.ebpf, gone, &lib.file.attach_path);
                self.releaser.release_in_background(links);
                lib.scope = ProcessScope::Only(new.clone());
                for pid in new.difference(&old) {
                    for &kind in &on {
                        self.attach_for_process(&mut lib, kind, *pid);
                    }
                }
            }
            _ => {
                let mut taken: Vec<Links> = Vec::new();
                for kind in PER_PROCESS_KINDS {
                    taken.extend(lib.links.remove(&kind));
                }
                taken.extend(std::mem::take(&mut lib.process_links).into_values());
                let links = Self::take_named(&mut self.ebpf, taken, &lib.file.attach_path);
                self.releaser.release_now(links);
                lib.scope = scope;
                for &kind in &on {
                    if let Err(e) = self.attach_kind(&mut lib, kind) {
                        failed.push((id, e));
                    }
                }
                // Said once the probes are as it says.
                match &lib.scope {
                    ProcessScope::All => log::info!(
                        "{}: launches, synchronisations and copies probed in every process",
                        lib.file.path.display()
                    ),
                    ProcessScope::Only(pids) => log::info!(
                        "{}: launches, synchronisations and copies probed for {} process(es) only \
                         (the limiter records those of its other users)",
                        lib.file.path.display(),
                        pids.len()
                    ),
                }
            }
        }
        self.libraries.insert(id, lib);
        if failed.is_empty() {
            Ok(())
        } else {
            Err(failed)
        }
    }

    /// Takes these links out of their programs, to be released by the caller.
    fn take_named(ebpf: &mut Ebpf, taken: Vec<Links>, path: &Path) -> Vec<UProbeLink> {
        let mut out = Vec::new();
        for (name, link) in taken.into_iter().flatten() {
            match program(ebpf, &name).map(|p| p.take_link(link)) {
                Ok(Ok(l)) => out.push(l),
                Ok(Err(e)) => log::warn!("taking {name}'s link on {}: {e}", path.display()),
                Err(e) => log::warn!("{e}"),
            }
        }
        out
    }

    /// Takes the links of `lib` out of their programs, to be released by the caller.
    fn take_links(ebpf: &mut Ebpf, lib: &mut AttachedLibrary) -> Vec<UProbeLink> {
        let mut taken: Vec<Links> = std::mem::take(&mut lib.links).into_values().collect();
        taken.extend(std::mem::take(&mut lib.process_links).into_values());
        Self::take_named(ebpf, taken, &lib.file.attach_path)
    }

    /// Turns the launch-family probes on or off in every attached library.
    pub fn set_launch_probes(&mut self, on: bool) -> Result<(), Vec<(FileId, ProbeError)>> {
        self.set_kind(ApiKind::Launch, on)
    }

    /// Turns one kind's probes on or off in every attached library (and in libraries attached
    /// later). A library that cannot be attached does not keep the others from it: every library
    /// is tried, and the failures are returned (the library and its error).
    pub fn set_kind(&mut self, kind: ApiKind, on: bool) -> Result<(), Vec<(FileId, ProbeError)>> {
        if on != self.off.contains(&kind) {
            return Ok(());
        }
        if on {
            self.off.remove(&kind);
        } else {
            self.off.insert(kind);
        }
        let mut failed = Vec::new();
        let ids: Vec<FileId> = self.libraries.keys().copied().collect();
        for id in ids {
            if on {
                let mut lib = self.libraries.remove(&id).expect("listed above");
                let result = if probed_kinds(lib.file.kind).contains(&kind) {
                    self.attach_kind(&mut lib, kind)
                } else {
                    Ok(())
                };
                self.libraries.insert(id, lib);
                if let Err(e) = result {
                    failed.push((id, e));
                }
            } else {
                self.detach_kind(id, kind);
            }
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(failed)
        }
    }

    /// Detaches everything from a library and forgets it (its path is gone: the processes that
    /// mapped it through that path exited). Its links are released in the background (see
    /// `release`): the library's calls are no longer counted from the moment they go, which
    /// is the same to every view as when this returned.
    pub fn remove_library(&mut self, id: FileId) -> Option<AttachedLibrary> {
        let mut lib = self.libraries.remove(&id)?;
        let links = Self::take_links(&mut self.ebpf, &mut lib);
        self.releaser.release_in_background(links);
        Some(lib)
    }

    pub fn launches_on(&self) -> bool {
        !self.off.contains(&ApiKind::Launch)
    }

    /// Every row of a hash map (plain or LRU). A row evicted during the iteration shows up as an
    /// error for that key and is skipped.
    fn read_hash<K: aya::Pod, V: aya::Pod>(
        &self,
        name: &'static str,
    ) -> Result<Vec<(K, V)>, ProbeError> {
        let map: BpfHashMap<_, K, V> =
            BpfHashMap::try_from(self.map(name)?).map_err(|e| ProbeError::Map {
                name,
                source: Box::new(e),
            })?;
        Ok(map.iter().filter_map(Result::ok).collect())
    }

    /// One aggregation row (the calibration re-reads its own between batches: a lookup, not a
    /// walk of the whole map).
    pub fn stats_row(&self, key: &StatsKey) -> Result<Option<ApiStats>, ProbeError> {
        let map: BpfHashMap<_, StatsKey, ApiStats> = BpfHashMap::try_from(self.map("STATS")?)
            .map_err(|e| ProbeError::Map {
                name: "STATS",
                source: Box::new(e),
            })?;
        Ok(map.get(key, 0).ok())
    }

    /// Every aggregation row.
    pub fn read_stats(&self) -> Result<Vec<(StatsKey, ApiStats)>, ProbeError> {
        self.read_hash("STATS")
    }

    /// NCCL aggregation rows.
    pub fn read_nccl_stats(&self) -> Result<Vec<(NcclStatsKey, ApiStats)>, ProbeError> {
        self.read_hash("NCCL_STATS")
    }

    /// NCCL communicators seen created.
    pub fn read_nccl_comms(&self) -> Result<Vec<(NcclCommKey, NcclCommInfo)>, ProbeError> {
        self.read_hash("NCCL_COMMS")
    }

    /// Successful allocations by process, API and log2 size class.
    pub fn read_alloc_sizes(&self) -> Result<Vec<(AllocSizeKey, AllocSizeVal)>, ProbeError> {
        self.read_hash("ALLOC_SIZES")
    }

    /// Live device memory per process.
    pub fn read_live(&self) -> Result<Vec<(u32, LiveMem)>, ProbeError> {
        self.read_hash("LIVE")
    }

    /// What each process lost (only processes that lost something).
    pub fn read_losses(&self) -> Result<Vec<(u32, ProbeLoss)>, ProbeError> {
        self.read_hash("LOSSES")
    }

    /// Health counters summed over CPUs, indexed by [`Health`].
    pub fn read_health(&self) -> Result<[u64; Health::COUNT as usize], ProbeError> {
        let map: PerCpuArray<_, u64> =
            PerCpuArray::try_from(self.map("HEALTH")?).map_err(|e| ProbeError::Map {
                name: "HEALTH",
                source: Box::new(e),
            })?;
        let mut out = [0u64; Health::COUNT as usize];
        for h in Health::ALL {
            if let Ok(v) = map.get(&(h as u32), 0) {
                out[h as usize] = v.iter().sum();
            }
        }
        Ok(out)
    }

    fn map(&self, name: &'static str) -> Result<&aya::maps::Map, ProbeError> {
        self.ebpf.map(name).ok_or(ProbeError::Map {
            name,
            source: Box::new(MapError::InvalidName { name: name.into() }),
        })
    }

    /// Attaches the calibration programs to functions of `path` (at these file offsets), scoped
    /// to this process, for the life of the probes.
    pub(crate) fn attach_calibration(
        &mut self,
        path: &Path,
        file_offsets: &[u64],
    ) -> Result<(), ProbeError> {
        let points: Vec<UProbeAttachPoint<'static>> = file_offsets
            .iter()
            .map(|&offset| UProbeAttachPoint {
                location: UProbeAttachLocation::AbsoluteOffset(offset),
                cookie: Some(ProbeCookie::CALIBRATION_API as u64),
            })
            .collect();
        for entry in [true, false] {
            let name = program_name(ApiKind::Info, entry, self.calib_mode);
            let prog = program(&mut self.ebpf, &name)?;
            prog.attach(points.iter(), path, UProbeScope::CallingProcess)
                .map_err(|source| ProbeError::Attach {
                    program: name.clone(),
                    path: path.to_owned(),
                    source: Box::new(source),
                })?;
        }
        Ok(())
    }

    /// Removes every row of these processes from the aggregation, live-memory and allocation
    /// maps (they exited). Returns after a best effort: a row that vanished meanwhile is fine.
    /// Returns the allocation entries left.
    pub fn forget_processes(&mut self, tgids: &[u32]) -> Result<usize, ProbeError> {
        let gone = |t: u32| tgids.contains(&t);
        self.remove_where::<StatsKey, ApiStats>("STATS", |k| gone(k.tgid))?;
        self.remove_where::<NcclStatsKey, ApiStats>("NCCL_STATS", |k| gone(k.tgid))?;
        self.remove_where::<NcclCommKey, NcclCommInfo>("NCCL_COMMS", |k| gone(k.tgid))?;
        self.remove_where::<AllocSizeKey, AllocSizeVal>("ALLOC_SIZES", |k| gone(k.tgid))?;
        self.remove_where::<u32, LiveMem>("LIVE", |t| gone(*t))?;
        self.remove_where::<u32, ProbeLoss>("LOSSES", |t| gone(*t))?;
        self.recount_cgroup_rows()?;
        self.remove_where::<AllocKey, AllocVal>("ALLOCS", |k| gone(k.tgid))
    }

    /// Sets each cgroup's row count (`CGROUP_ROWS`, what the row quota is checked against) to the
    /// rows it has in the quota'd maps, and removes cgroups that have none: the probes only add
    /// to it. A row a probe creates between the count and the write is missed until the next
    /// recount (the quota lets that many more rows in, never more).
    fn recount_cgroup_rows(&mut self) -> Result<(), ProbeError> {
        let mut rows: HashMap<u64, u64> = HashMap::new();
        for k in self.keys::<StatsKey, ApiStats>("STATS")? {
            *rows.entry(k.cgroup_id).or_default() += 1;
        }
        for k in self.keys::<NcclStatsKey, ApiStats>("NCCL_STATS")? {
            *rows.entry(k.cgroup_id).or_default() += 1;
        }
        for k in self.keys::<AllocSizeKey, AllocSizeVal>("ALLOC_SIZES")? {
            *rows.entry(k.cgroup_id).or_default() += 1;
        }
        let mut m: BpfHashMap<_, u64, u64> = BpfHashMap::try_from(self.map_mut("CGROUP_ROWS")?)
            .map_err(|e| ProbeError::Map {
                name: "CGROUP_ROWS",
                source: Box::new(e),
            })?;
        let counted: Vec<u64> = m.keys().filter_map(Result::ok).collect();
        for cgroup in counted {
            match rows.remove(&cgroup) {
                Some(n) => {
                    let _ = m.insert(&cgroup, &n, 0);
                }
                None => {
                    let _ = m.remove(&cgroup);
                }
            }
        }
        for (cgroup, n) in rows {
            let _ = m.insert(&cgroup, &n, 0);
        }
        Ok(())
    }

    /// Every key of hash map `name`.
    fn keys<K: aya::Pod, V: aya::Pod>(&self, name: &'static str) -> Result<Vec<K>, ProbeError> {
        let map: BpfHashMap<_, K, V> =
            BpfHashMap::try_from(self.map(name)?).map_err(|e| ProbeError::Map {
                name,
                source: Box::new(e),
            })?;
        Ok(map.keys().filter_map(Result::ok).collect())
    }

    /// Removes the rows of hash map `name` whose key matches; returns the rows left.
    fn remove_where<K: aya::Pod, V: aya::Pod>(
        &mut self,
        name: &'static str,
        matches: impl Fn(&K) -> bool,
    ) -> Result<usize, ProbeError> {
        let mut m: BpfHashMap<_, K, V> =
            BpfHashMap::try_from(self.map_mut(name)?).map_err(|e| ProbeError::Map {
                name,
                source: Box::new(e),
            })?;
        let all: Vec<K> = m.keys().filter_map(Result::ok).collect();
        let mut left = all.len();
        for k in all.iter().filter(|k| matches(k)) {
            if m.remove(k).is_ok() {
                left -= 1;
            }
        }
        Ok(left)
    }

    fn map_mut(&mut self, name: &'static str) -> Result<&mut aya::maps::Map, ProbeError> {
        self.ebpf.map_mut(name).ok_or(ProbeError::Map {
            name,
            source: Box::new(MapError::InvalidName { name: name.into() }),
        })
    }

    /// Removes the aggregation rows of one process and API (used to drop calibration rows).
    pub(crate) fn remove_stats_rows(&mut self, tgid: u32, api: u16) -> Result<(), ProbeError> {
        self.remove_where::<StatsKey, ApiStats>("STATS", |k| k.tgid == tgid && k.api == api)?;
        self.recount_cgroup_rows()
    }
}

impl Drop for Probes {
    /// Releases every link at once (see `release`): one by one, the links of a few dozen
    /// libraries took the agent's exit tens of seconds.
    fn drop(&mut self) {
        let mut links = Vec::new();
        let mut libraries = std::mem::take(&mut self.libraries);
        for lib in libraries.values_mut() {
            links.extend(Self::take_links(&mut self.ebpf, lib));
        }
        let n = links.len();
        let took = self.releaser.release_all(links);
        log::info!(
            "detached {n} probe links in {:.0} ms",
            took.as_secs_f64() * 1e3
        );
    }
}

/// The link sets of a kind of library, by the kind that names each: a CUDA driver library's
/// probed kinds; an NCCL library's communicator lifecycle (created, destroyed: never sampled,
/// named [`ApiKind::Lifecycle`]) and its collective, point-to-point and group calls (the
/// high-rate ones a budget samples, named [`ApiKind::Nccl`]).
fn probed_kinds(kind: LibraryKind) -> &'static [ApiKind] {
    match kind {
        LibraryKind::Cuda => &ApiKind::PROBED,
        LibraryKind::Nccl => &[ApiKind::Lifecycle, ApiKind::Nccl],
    }
}

/// Whether `spec` is in the link set named `kind` (see [`probed_kinds`]) of a library.
fn in_link_set(spec: &agent_common::ApiSpec, nccl_library: bool, kind: ApiKind) -> bool {
    if !nccl_library {
        return spec.kind == kind;
    }
    spec.kind == ApiKind::Nccl
        && match kind {
            ApiKind::Lifecycle => !spec.is_nccl_call(),
            ApiKind::Nccl => spec.is_nccl_call(),
            _ => false,
        }
}

fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut UProbe, ProbeError> {
    let prog = ebpf
        .program_mut(name)
        .ok_or_else(|| ProbeError::MissingProgram(name.to_owned()))?;
    prog.try_into().map_err(|e| ProbeError::Program {
        name: name.to_owned(),
        source: Box::new(e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_names_match_the_ebpf_object() {
        assert_eq!(
            program_name(ApiKind::Alloc, true, AttachMode::Multi),
            "alloc_entry_multi"
        );
        assert_eq!(
            program_name(ApiKind::Launch, false, AttachMode::PerSymbol),
            "launch_return"
        );
        assert_eq!(
            program_name(ApiKind::Info, true, AttachMode::PerSymbol),
            "calib_entry"
        );
        assert_eq!(
            program_name(ApiKind::Nccl, false, AttachMode::Multi),
            "nccl_return_multi"
        );
    }

    #[test]
    fn each_library_gets_only_its_own_kinds() {
        let cuda = probed_kinds(LibraryKind::Cuda);
        assert!(!cuda.iter().any(|k| k.is_nccl()));
        assert!(cuda.contains(&ApiKind::Alloc));
        assert_eq!(
            probed_kinds(LibraryKind::Nccl),
            &[ApiKind::Lifecycle, ApiKind::Nccl]
        );
    }

    /// An NCCL library's communicator lifecycle and its calls are two link sets (the second is
    /// the one a budget samples), together every NCCL entry point once; a CUDA library's sets are
    /// its kinds.
    #[test]
    fn an_nccl_librarys_link_sets_split_its_calls_from_its_communicators() {
        let nccl: Vec<&agent_common::ApiSpec> = agent_common::api::APIS
            .iter()
            .filter(|s| s.kind == ApiKind::Nccl)
            .collect();
        for s in &nccl {
            let sets: Vec<ApiKind> = probed_kinds(LibraryKind::Nccl)
                .iter()
                .copied()
                .filter(|k| in_link_set(s, true, *k))
                .collect();
            assert_eq!(sets.len(), 1, "{}: {sets:?}", s.name);
            let lifecycle = s.name.starts_with("ncclCommInit")
                || s.name == "ncclCommDestroy"
                || s.name == "ncclCommAbort";
            assert_eq!(sets[0] == ApiKind::Lifecycle, lifecycle, "{}", s.name);
        }
        let alloc = agent_common::ApiId::from_name("cuMemAlloc_v2")
            .and_then(|a| a.spec())
            .unwrap();
        assert!(in_link_set(alloc, false, ApiKind::Alloc));
        assert!(!in_link_set(alloc, false, ApiKind::Lifecycle));
    }
}

//! Thawing a frozen container at its next CUDA call: the daemon's side
//! (docs/oversubscription.md).
//!
//! `vgpu-agent freeze --container` marks the container frozen in its control blocks. The
//! container's limiter, at its next CUDA call and before the driver holds that call, stores the
//! marking generation as its region's thaw request and waits. This thread finds the frozen
//! containers (every [`SCAN_PERIOD`], a walk of `/proc` as `limit` does), looks at each frozen
//! one's control block and region every [`POLL`] (two `pread`s), and on a request that names the
//! block's current generation thaws the container's processes through the driver's checkpoint
//! API and clears the mark, which lets the waiting call go on.
//!
//! Everything read here is the tenant's: the request is acted on only when it equals the
//! generation the agent's own mark has now, so a forged request thaws only the tenant's own
//! container, which its next CUDA call would do anyway. A thaw that fails (the GPU has no room
//! for the memory yet) is tried again at most every [`RETRY_PERIOD`].

use std::{
    collections::HashMap,
    path::PathBuf,
    time::{Duration, Instant},
};

use region::{FreezeMark, read_control, reader::RegionReader};
use tenant_fs::{Access, TenantFile};

use crate::{checkpoint::DriverCheckpoint, freeze, limit};

/// How often the frozen containers are looked for.
const SCAN_PERIOD: Duration = Duration::from_secs(1);
/// How often a frozen container's thaw request is looked at.
const POLL: Duration = Duration::from_millis(5);
/// How long after a failed thaw the same request is tried again.
const RETRY_PERIOD: Duration = Duration::from_secs(1);

/// A region of a frozen container.
struct Watched {
    container: String,
    control: TenantFile,
    reader: RegionReader,
}

/// The watcher's state between ticks.
pub struct ThawWatch {
    proc: PathBuf,
    libcuda: PathBuf,
    api: Option<DriverCheckpoint>,
    frozen: Vec<Watched>,
    next_scan: Instant,
    /// The last failed thaw of a container: the generation requested and when.
    failed: HashMap<String, (u64, Instant)>,
}

impl ThawWatch {
    /// A watcher of the processes under `proc`, thawing through the driver library `libcuda`
    /// (loaded at the first thaw).
    pub fn new(proc: PathBuf, libcuda: PathBuf) -> ThawWatch {
        ThawWatch {
            proc,
            libcuda,
            api: None,
            frozen: Vec::new(),
            next_scan: Instant::now(),
            failed: HashMap::new(),
        }
    }

    /// Runs until the daemon stops.
    pub fn run(mut self) {
        while !crate::signals::stop_requested() {
            self.tick();
            crate::signals::sleep(POLL);
        }
    }

    /// One look: a scan if one is due, then every frozen container's request.
    fn tick(&mut self) {
        if Instant::now() >= self.next_scan {
            self.scan();
            self.next_scan = Instant::now() + SCAN_PERIOD;
        }
        let mut thawed = Vec::new();
        for i in 0..self.frozen.len() {
            let w = &self.frozen[i];
            let Some(generation) = requested(w) else {
                continue;
            };
            if thawed.contains(&w.container) {
                continue;
            }
            if let Some((g, at)) = self.failed.get(&w.container)
                && *g == generation
                && at.elapsed() < RETRY_PERIOD
            {
                continue;
            }
            let container = w.container.clone();
            match self.thaw(&container) {
                Ok(lines) => {
                    log::info!(
                        "container {container}: thawed at its next CUDA call ({})",
                        lines.join("; ")
                    );
                    self.failed.remove(&container);
                    thawed.push(container);
                }
                Err(e) => {
                    log::warn!("container {container}: thaw at its next CUDA call failed: {e}");
                    self.failed.insert(container, (generation, Instant::now()));
                }
            }
        }
        if !thawed.is_empty() {
            self.frozen.retain(|w| !thawed.contains(&w.container));
        }
    }

    /// Finds the regions whose control block marks their container frozen.
    fn scan(&mut self) {
        self.frozen = limit::container_regions(&self.proc, |_| true)
            .into_iter()
            .filter_map(|(container, region)| {
                let control = region.open_control(Access::Read).ok()?;
                let snap = read_control(&control).ok()??;
                if snap.settings.freeze != FreezeMark::Frozen {
                    return None;
                }
                let reader = RegionReader::from_file(region.open_region().ok()?).ok()?;
                Some(Watched {
                    container,
                    control,
                    reader,
                })
            })
            .collect();
        let frozen: Vec<&String> = self.frozen.iter().map(|w| &w.container).collect();
        self.failed.retain(|c, _| frozen.contains(&c));
    }

    /// Thaws the container's processes and clears its mark.
    fn thaw(&mut self, container: &str) -> Result<Vec<String>, freeze::FreezeError> {
        let api = match &self.api {
            Some(api) => api,
            None => self.api.insert(DriverCheckpoint::open(&self.libcuda)?),
        };
        let pids = freeze::pids(&freeze::Target::Container(container.to_owned()), &self.proc)?;
        freeze::thaw_container(api, container, &pids)
    }
}

/// The generation the region's thaw request names, if it is the one marking the container
/// frozen now.
fn requested(w: &Watched) -> Option<u64> {
    let snap = read_control(&w.control).ok()??;
    if snap.settings.freeze != FreezeMark::Frozen {
        return None;
    }
    let request = w.reader.thaw_request().ok()?;
    (request == snap.generation).then_some(snap.generation)
}

#[cfg(test)]
mod tests {
    use super::*;
    use region::{ControlReader, ControlWriter, Region, RegionConfig, control_path};

    /// What the tenant can write (its region's request word, its control block's mark) thaws
    /// nothing unless the request names the generation of the agent's own frozen mark.
    #[test]
    fn only_a_request_naming_the_frozen_generation_asks_for_a_thaw() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.region");
        let (region, _) = Region::open_or_create(&path, &RegionConfig::unlimited(1)).unwrap();
        let ctl = control_path(&path);
        let _reader = ControlReader::open_or_create(&ctl).unwrap();
        let writer =
            ControlWriter::new(&tenant_fs::open_no_links(&ctl, Access::ReadWrite).unwrap())
                .unwrap();
        let watched = || Watched {
            container: "c".into(),
            control: tenant_fs::open_no_links(&ctl, Access::Read).unwrap(),
            reader: RegionReader::open(&path).unwrap(),
        };
        let frozen = writer.update(|s| s.freeze = FreezeMark::Frozen).unwrap();
        assert_eq!(requested(&watched()), None, "no request yet");
        region.request_thaw(frozen - 2);
        assert_eq!(requested(&watched()), None, "an older generation");
        region.request_thaw(frozen + 2);
        assert_eq!(requested(&watched()), None, "a generation not written");
        region.request_thaw(frozen);
        assert_eq!(requested(&watched()), Some(frozen));
        // The same request after the mark changed (freezing, then cleared) asks for nothing.
        let freezing = writer.update(|s| s.freeze = FreezeMark::Freezing).unwrap();
        region.request_thaw(freezing);
        assert_eq!(requested(&watched()), None, "a freeze still starting");
        let running = writer.update(|s| s.freeze = FreezeMark::Running).unwrap();
        region.request_thaw(running);
        assert_eq!(requested(&watched()), None, "not frozen");
        // A mark the tenant corrupted does not decode: nothing to thaw.
        let words = std::fs::read(&ctl).unwrap();
        let mut bad = words.clone();
        bad[320..328].copy_from_slice(&7u64.to_le_bytes());
        std::fs::write(&ctl, &bad).unwrap();
        assert_eq!(requested(&watched()), None, "a corrupt mark");
    }
}

//! In-process stand-ins for the driver, for the unit tests of the hooks and the runtime: a driver
//! table ([`driver`]) filled with functions that answer from a fake device kept per test thread
//! ([`device`]), and a state and process built around it ([`Cx`]), so that the limiter's logic
//! runs in the test process exactly as it runs over the real driver, without a library to
//! preload. The multi-process tests over the simulated driver (`tests/`) complement these.

use std::{
    cell::RefCell,
    collections::HashMap,
    ffi::{c_int, c_uint, c_void},
    path::PathBuf,
    sync::{
        OnceLock,
        atomic::{AtomicU64, Ordering},
    },
};

use agent_common::api::ApiId;
use limiter_core::config::{Config, Level};
use region::reader::{RegionReader, RegionSnapshot};

use crate::{
    hooks::gate::Hooked,
    platform::{
        clock::LazyClock,
        cuda::*,
        driver::{Driver, Sym, Symbol},
        guard::Panics,
        thread_words::Tls,
    },
    runtime::{
        process::Process,
        state::{Services, State},
    },
};

/// The pool `cuDeviceGetMemPool` answers.
pub(crate) const DEVICE_POOL: u64 = 0x5000;
/// Where the fake device's addresses start.
pub(crate) const BASE: u64 = 0x7f00_0000_0000;
const GRANULE: u64 = 2 << 20;

/// What the fake driver holds and has been asked, for one test thread.
#[derive(Debug)]
pub(crate) struct FakeDevice {
    /// Driver calls made, by name, in order.
    pub(crate) calls: Vec<&'static str>,
    /// Functions that fail (with `CUDA_ERROR_OUT_OF_MEMORY` for allocations, else
    /// `CUDA_ERROR_INVALID_VALUE`).
    pub(crate) failing: Vec<&'static str>,
    /// How many more calls of the `failing` functions fail before they succeed again (`None`:
    /// they fail for good): memory that frees while an allocation waits.
    pub(crate) failures_left: Option<u32>,
    /// Live allocations: address (or handle) to (pool, bytes).
    pub(crate) live: HashMap<u64, (u64, u64)>,
    /// What each pool holds (its reserved size).
    pub(crate) pools: HashMap<u64, u64>,
    /// Devices `cuDeviceGetCount` reports.
    pub(crate) devices: c_int,
    /// The row alignment `cuMemAllocPitch_v2` chooses.
    pub(crate) pitch_align: usize,
    next: u64,
}

impl Default for FakeDevice {
    fn default() -> FakeDevice {
        FakeDevice {
            calls: Vec::new(),
            failing: Vec::new(),
            failures_left: None,
            live: HashMap::new(),
            pools: HashMap::new(),
            devices: 1,
            pitch_align: 512,
            next: 0,
        }
    }
}

thread_local! {
    static DEVICE: RefCell<FakeDevice> = RefCell::new(FakeDevice::default());
}

/// Runs `f` on this thread's fake device.
pub(crate) fn device<T>(f: impl FnOnce(&mut FakeDevice) -> T) -> T {
    DEVICE.with(|d| f(&mut d.borrow_mut()))
}

/// Counts a call of `name`; `Err(code)` if it is to fail.
fn called(name: &'static str, code: CUresult) -> Result<(), CUresult> {
    device(|d| {
        d.calls.push(name);
        if !d.failing.contains(&name) {
            return Ok(());
        }
        match &mut d.failures_left {
            None => Err(code),
            Some(0) => Ok(()),
            Some(n) => {
                *n -= 1;
                Err(code)
            }
        }
    })
}

/// A new allocation of `bytes` (from `pool`, 0: none).
fn hand_out(pool: u64, bytes: u64) -> u64 {
    device(|d| {
        d.next += 1;
        let addr = BASE + d.next * GRANULE.max(bytes.next_multiple_of(GRANULE));
        d.live.insert(addr, (pool, bytes));
        if pool != 0 {
            let in_pool: u64 = d.live.values().filter(|l| l.0 == pool).map(|l| l.1).sum();
            let held = d.pools.entry(pool).or_default();
            *held = (*held).max(in_pool.next_multiple_of(GRANULE));
        }
        addr
    })
}

/// Takes `addr` out of the live allocations; `CUDA_ERROR_INVALID_VALUE` if it is not live.
fn take_back(addr: u64) -> CUresult {
    match device(|d| d.live.remove(&addr)) {
        Some(_) => CUDA_SUCCESS,
        None => CUDA_ERROR_INVALID_VALUE,
    }
}

const CUDA_ERROR_INVALID_VALUE: CUresult = 1;

unsafe extern "C" fn mem_alloc(dptr: *mut CUdeviceptr, bytes: usize) -> CUresult {
    if let Err(e) = called("cuMemAlloc_v2", CUDA_ERROR_OUT_OF_MEMORY) {
        return e;
    }
    // SAFETY: the hook passes the caller's out-pointer, valid in these tests.
    unsafe { dptr.write(hand_out(0, bytes as u64)) };
    CUDA_SUCCESS
}

unsafe extern "C" fn mem_alloc_pitch(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    _element: c_uint,
) -> CUresult {
    if let Err(e) = called("cuMemAllocPitch_v2", CUDA_ERROR_OUT_OF_MEMORY) {
        return e;
    }
    let p = width.next_multiple_of(device(|d| d.pitch_align));
    // SAFETY: as in `mem_alloc`.
    unsafe {
        pitch.write(p);
        dptr.write(hand_out(0, (p * height) as u64));
    }
    CUDA_SUCCESS
}

unsafe extern "C" fn mem_alloc_async(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    _stream: CUstream,
) -> CUresult {
    if let Err(e) = called("cuMemAllocAsync", CUDA_ERROR_OUT_OF_MEMORY) {
        return e;
    }
    // SAFETY: as in `mem_alloc`.
    unsafe { dptr.write(hand_out(DEVICE_POOL, bytes as u64)) };
    CUDA_SUCCESS
}

unsafe extern "C" fn mem_free(addr: CUdeviceptr) -> CUresult {
    if let Err(e) = called("cuMemFree_v2", CUDA_ERROR_INVALID_VALUE) {
        return e;
    }
    take_back(addr)
}

unsafe extern "C" fn mem_free_async(addr: CUdeviceptr, _stream: CUstream) -> CUresult {
    if let Err(e) = called("cuMemFreeAsync", CUDA_ERROR_INVALID_VALUE) {
        return e;
    }
    // The memory stays in its pool until the pool is trimmed.
    take_back(addr)
}

unsafe extern "C" fn mem_create(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    _prop: *const CUmemAllocationProp,
    _flags: u64,
) -> CUresult {
    if let Err(e) = called("cuMemCreate", CUDA_ERROR_OUT_OF_MEMORY) {
        return e;
    }
    // SAFETY: as in `mem_alloc`.
    unsafe { handle.write(hand_out(0, size as u64)) };
    CUDA_SUCCESS
}

unsafe extern "C" fn mem_release(handle: CUmemGenericAllocationHandle) -> CUresult {
    if let Err(e) = called("cuMemRelease", CUDA_ERROR_INVALID_VALUE) {
        return e;
    }
    take_back(handle)
}

unsafe extern "C" fn pool_trim_to(pool: CUmemoryPool, keep: usize) -> CUresult {
    if let Err(e) = called("cuMemPoolTrimTo", CUDA_ERROR_INVALID_VALUE) {
        return e;
    }
    device(|d| {
        let in_pool: u64 = d
            .live
            .values()
            .filter(|l| l.0 == pool as u64)
            .map(|l| l.1)
            .sum();
        let held = d.pools.entry(pool as u64).or_default();
        *held = (*held).min(in_pool.next_multiple_of(GRANULE).max(keep as u64));
    });
    CUDA_SUCCESS
}

unsafe extern "C" fn pool_destroy(pool: CUmemoryPool) -> CUresult {
    if let Err(e) = called("cuMemPoolDestroy", CUDA_ERROR_INVALID_VALUE) {
        return e;
    }
    device(|d| d.pools.remove(&(pool as u64)));
    CUDA_SUCCESS
}

unsafe extern "C" fn pool_get_attribute(
    pool: CUmemoryPool,
    attr: c_int,
    value: *mut c_void,
) -> CUresult {
    if attr != 5 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let held = device(|d| d.pools.get(&(pool as u64)).copied().unwrap_or(0));
    // SAFETY: the limiter passes a `cuuint64_t` for this attribute.
    unsafe { value.cast::<u64>().write(held) };
    CUDA_SUCCESS
}

unsafe extern "C" fn device_get_mem_pool(pool: *mut CUmemoryPool, _dev: CUdevice) -> CUresult {
    // SAFETY: the limiter passes a valid out-pointer.
    unsafe { pool.write(DEVICE_POOL as CUmemoryPool) };
    CUDA_SUCCESS
}

unsafe extern "C" fn device_get_count(n: *mut c_int) -> CUresult {
    // SAFETY: the limiter passes a valid out-pointer.
    unsafe { n.write(device(|d| d.devices)) };
    CUDA_SUCCESS
}

unsafe extern "C" fn ctx_get_device(dev: *mut CUdevice) -> CUresult {
    // SAFETY: the limiter passes a valid out-pointer.
    unsafe { dev.write(0) };
    CUDA_SUCCESS
}

unsafe extern "C" fn mem_get_info(free: *mut usize, total: *mut usize) -> CUresult {
    called("cuMemGetInfo_v2", CUDA_ERROR_INVALID_VALUE).map_or_else(
        |e| e,
        |()| {
            // SAFETY: the limiter passes the caller's out-pointers, valid in these tests.
            unsafe {
                free.write(70 << 30);
                total.write(80 << 30);
            }
            CUDA_SUCCESS
        },
    )
}

/// The driver table of the fake device (one for the test process; the device is per thread).
pub(crate) fn driver() -> &'static Driver {
    static DRIVER: OnceLock<Driver> = OnceLock::new();
    DRIVER.get_or_init(|| {
        Driver::from_fn(|sym| match sym {
            Sym::MemAllocV2 => mem_alloc as *const () as usize,
            Sym::MemAllocPitchV2 => mem_alloc_pitch as *const () as usize,
            Sym::MemAllocAsync => mem_alloc_async as *const () as usize,
            Sym::MemFreeV2 => mem_free as *const () as usize,
            Sym::MemFreeAsync => mem_free_async as *const () as usize,
            Sym::MemCreate => mem_create as *const () as usize,
            Sym::MemRelease => mem_release as *const () as usize,
            Sym::MemPoolTrimTo => pool_trim_to as *const () as usize,
            Sym::MemPoolDestroy => pool_destroy as *const () as usize,
            Sym::MemPoolGetAttribute => pool_get_attribute as *const () as usize,
            Sym::DeviceGetMemPool => device_get_mem_pool as *const () as usize,
            Sym::DeviceGetCount => device_get_count as *const () as usize,
            Sym::CtxGetDevice => ctx_get_device as *const () as usize,
            Sym::MemGetInfoV2 => mem_get_info as *const () as usize,
            _ => 0,
        })
    })
}

/// A state and a process over the fake driver, leaked as the real ones are.
pub(crate) struct Cx {
    pub(crate) state: &'static State,
    pub(crate) process: &'static Process,
    /// The region file (removed on drop, with its control block).
    pub(crate) region: Option<PathBuf>,
}

/// A configuration with device 0 limited to `limit` bytes, no context charge, quiet.
pub(crate) fn config(limit: u64) -> Config {
    let mut c = Config {
        context_bytes: 0,
        log_level: Level::Silent,
        ..Config::default()
    };
    c.memory_limit[0] = Some(limit);
    c
}

/// A fresh region path of this test process.
pub(crate) fn region_path(tag: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    std::env::temp_dir().join(format!(
        "vgpu-unit-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Builds the state of `config` over the fake driver (the real services would be the runtime's).
pub(crate) fn state(config: Config) -> &'static State {
    let services = Services {
        driver: driver(),
        panics: Box::leak(Box::new(Panics::new())),
        tls: Box::leak(Box::new(Tls::new())),
    };
    let state: &'static State =
        Box::leak(Box::new(State::new(config, LazyClock::start(), services)));
    state.start();
    state
}

impl Cx {
    /// A state of `config` with its accounting in a fresh region (`tag` names the file), and its
    /// process's accounting (which claims a slot there).
    pub(crate) fn new(mut config: Config, tag: &str) -> Cx {
        let region = region_path(tag);
        config.shared_cache = Some(region.clone());
        let state = state(config);
        Cx {
            state,
            process: Box::leak(Box::new(Process::new(state))),
            region: Some(region),
        }
    }

    /// A hooked call of `S` over the fake driver, entered now.
    pub(crate) fn hooked<S: Symbol>(&self) -> Hooked<S::Fn> {
        let real = self
            .state
            .driver
            .get::<S>()
            .expect("the fake driver has it");
        Hooked::new(real, self.state, self.process)
    }

    /// The region as the agent reads it.
    pub(crate) fn snapshot(&self) -> RegionSnapshot {
        let path = self.region.as_ref().expect("a region");
        RegionReader::open(path)
            .expect("open region")
            .snapshot()
            .expect("snapshot")
    }

    /// What this process's slot recorded for `name`: calls, errors, bytes allocated and freed,
    /// denials.
    pub(crate) fn recorded(&self, name: &str) -> [u64; 5] {
        let (_, slot) = self.process.region_slot().expect("a region");
        let id = ApiId::from_name(name).unwrap();
        let snap = self.snapshot();
        let mine = snap
            .slots
            .iter()
            .find(|s| s.index == slot.index())
            .expect("our slot");
        mine.apis.iter().find(|a| a.api == id).map_or([0; 5], |a| {
            [
                a.calls,
                a.errors,
                a.bytes_allocated,
                a.bytes_freed,
                a.denied,
            ]
        })
    }
}

impl Drop for Cx {
    fn drop(&mut self) {
        if let Some(p) = &self.region {
            let _ = std::fs::remove_file(p);
            let _ = std::fs::remove_file(region::control_path(p));
        }
    }
}

//! The simulated device state: allocations, handles, pools, contexts and other objects.
//! One `Mutex` guards it all (this is a test fixture; correctness beats speed here).

use crate::config::config;
use crate::types::*;
use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::ffi::c_int;
use std::sync::{LazyLock, Mutex, MutexGuard};

/// First fake device address; addresses grow from here and are never handed out twice.
const ADDR_BASE: u64 = 0x7f00_0000_0000;
/// Upper end of the fake address space.
const ADDR_END: u64 = 0xffff_0000_0000_0000;
/// Bytes of one page of device content (see [`State::content`]).
const PAGE: u64 = 4096;
/// First fake object handle (contexts, streams, pools, generic allocation handles, ...).
const HANDLE_BASE: u64 = 0x5a00_0000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocKind {
    Device,
    Managed,
    /// From the pool with this handle (`cuMemAllocAsync`, `cuMemAllocFromPoolAsync`).
    Pool(u64),
}

#[derive(Clone, Copy, Debug)]
pub struct Alloc {
    pub size: u64,
    pub device: i32,
    pub kind: AllocKind,
    pub buffer_id: u64,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Pool {
    pub device: i32,
    pub used: u64,
    pub reserved: u64,
    pub used_high: u64,
    pub reserved_high: u64,
    pub release_threshold: u64,
    /// The three boolean reuse attributes (1..=3).
    pub reuse: [u64; 3],
    pub is_default: bool,
}

#[derive(Clone, Copy, Debug)]
pub struct Physical {
    pub size: u64,
    pub device: i32,
    pub mappings: u32,
    /// Released by every reference (`refs` is 0): the memory goes with its last mapping.
    pub released: bool,
    /// References: `cuMemCreate`'s and one per `cuMemRetainAllocationHandle`, less each
    /// `cuMemRelease`.
    pub refs: u32,
    /// The shareable handle types asked for at its creation (`requestedHandleTypes`).
    pub handle_types: c_int,
}

#[derive(Clone, Copy, Debug)]
pub struct Mapping {
    pub size: u64,
    pub handle: u64,
    pub access: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Obj {
    Context {
        device: i32,
        primary: bool,
    },
    Stream,
    /// An event and the device time of its last record.
    Event {
        at_ns: u64,
    },
    Module,
    Function,
    Library,
    Kernel,
    Graph,
    GraphExec,
}

/// Device memory content: page address to the page's bytes.
type Content = BTreeMap<u64, Box<[u8]>>;

pub struct State {
    next_addr: u64,
    next_handle: u64,
    next_buffer_id: u64,
    /// Bytes charged against each device's capacity.
    pub used: Vec<u64>,
    pub allocs: BTreeMap<u64, Alloc>,
    pub physical: HashMap<u64, Physical>,
    /// Reserved VA ranges: start -> size.
    pub reservations: BTreeMap<u64, u64>,
    pub mappings: BTreeMap<u64, Mapping>,
    pub pools: HashMap<u64, Pool>,
    pub default_pools: Vec<u64>,
    pub current_pools: Vec<u64>,
    /// Primary context per device: handle and retain count.
    pub primary: Vec<(u64, u32)>,
    pub objects: HashMap<u64, Obj>,
    /// Names of functions and kernels (what `cuFuncGetName`/`cuKernelGetName` answer), NUL
    /// terminated.
    pub names: HashMap<u64, std::ffi::CString>,
    /// Device memory content: the pages copies have written (page address -> bytes); a page
    /// never written reads as zeros. Kept only for what is written, so an 80 GiB device costs
    /// nothing until a test fills some of it.
    content: Content,
    /// While checkpointed: the bytes given back to each device and the content saved to host
    /// memory (`checkpoint.rs`).
    checkpointed: Option<(Vec<u64>, Content)>,
}

static STATE: LazyLock<Mutex<State>> = LazyLock::new(|| Mutex::new(State::new(config().devices)));

thread_local! {
    static CURRENT: Cell<u64> = const { Cell::new(0) };
}

/// Locks the state (a panic elsewhere does not make it unusable).
pub fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn current_ctx() -> u64 {
    CURRENT.with(|c| c.get())
}

pub fn set_current_ctx(ctx: u64) {
    CURRENT.with(|c| c.set(ctx))
}

pub fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

impl State {
    fn new(devices: i32) -> State {
        let n = devices.max(0) as usize;
        let mut s = State {
            next_addr: ADDR_BASE,
            next_handle: HANDLE_BASE,
            next_buffer_id: 1,
            used: vec![0; n],
            allocs: BTreeMap::new(),
            physical: HashMap::new(),
            reservations: BTreeMap::new(),
            mappings: BTreeMap::new(),
            pools: HashMap::new(),
            default_pools: Vec::new(),
            current_pools: Vec::new(),
            primary: Vec::new(),
            objects: HashMap::new(),
            names: HashMap::new(),
            content: BTreeMap::new(),
            checkpointed: None,
        };
        for d in 0..devices.max(0) {
            let p = s.handle();
            s.pools.insert(
                p,
                Pool {
                    device: d,
                    is_default: true,
                    ..Pool::default()
                },
            );
            s.default_pools.push(p);
            s.current_pools.push(p);
            let c = s.handle();
            s.objects.insert(
                c,
                Obj::Context {
                    device: d,
                    primary: true,
                },
            );
            s.primary.push((c, 0));
        }
        s
    }

    pub fn devices(&self) -> i32 {
        self.used.len() as i32
    }

    pub fn valid_device(&self, d: CUdevice) -> bool {
        d >= 0 && d < self.devices()
    }

    /// A new object handle (never 0, never reused).
    pub fn handle(&mut self) -> u64 {
        self.next_handle += 0x10;
        self.next_handle
    }

    pub fn new_object(&mut self, o: Obj) -> u64 {
        let h = self.handle();
        self.objects.insert(h, o);
        h
    }

    pub fn is(&self, h: u64, f: impl Fn(&Obj) -> bool) -> bool {
        self.objects.get(&h).is_some_and(f)
    }

    /// The device that calls of this thread work on: its current context's, else device 0.
    pub fn current_device(&self) -> Result<i32, CUresult> {
        let d = match self.objects.get(&current_ctx()) {
            Some(Obj::Context { device, .. }) => *device,
            _ => 0,
        };
        if self.valid_device(d) {
            Ok(d)
        } else {
            Err(CUDA_ERROR_NO_DEVICE)
        }
    }

    /// Whether `s` names a stream: NULL, the legacy or per-thread stream, or a created one.
    pub fn valid_stream(&self, s: u64) -> bool {
        s == 0
            || s == CU_STREAM_LEGACY
            || s == CU_STREAM_PER_THREAD
            || self.is(s, |o| *o == Obj::Stream)
    }

    /// Hands out `size` bytes of fresh address space aligned to `align`.
    fn address(&mut self, size: u64, align: u64) -> Result<u64, CUresult> {
        let addr = align_up(self.next_addr, align);
        let end = addr
            .checked_add(align_up(size, ALLOC_ALIGN))
            .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        if end > ADDR_END {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        self.next_addr = end;
        Ok(addr)
    }

    /// Charges `size` bytes to `device`, or fails with out-of-memory: against this process's
    /// charge, and with `SIMCUDA_SHARED_DEVICE` against every process's.
    fn charge(&mut self, device: i32, size: u64) -> Result<(), CUresult> {
        let capacity = config().capacity;
        let used = &mut self.used[device as usize];
        let n = used
            .checked_add(size)
            .filter(|n| *n <= capacity)
            .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        if let Some(shared) = crate::shared::device()
            && !shared.try_charge(device as usize, size, capacity)
        {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        *used = n;
        Ok(())
    }

    fn uncharge(&mut self, device: i32, size: u64) {
        let used = &mut self.used[device as usize];
        let returned = size.min(*used);
        *used -= returned;
        if let Some(shared) = crate::shared::device() {
            shared.uncharge(device as usize, returned);
        }
    }

    /// Bytes charged to `device`: by every process with `SIMCUDA_SHARED_DEVICE`, else by this
    /// one.
    pub fn device_used(&self, device: i32) -> u64 {
        match crate::shared::device() {
            Some(shared) => shared.charged(device as usize),
            None => self.used[device as usize],
        }
    }

    /// `cuMemAlloc`-style allocation on `device`.
    pub fn alloc(&mut self, device: i32, size: u64, kind: AllocKind) -> Result<u64, CUresult> {
        if size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        match kind {
            AllocKind::Pool(p) => {
                let pool = self
                    .pools
                    .get(&p)
                    .copied()
                    .ok_or(CUDA_ERROR_INVALID_VALUE)?;
                let used = pool.used + size;
                let grow = used.saturating_sub(pool.reserved);
                self.charge(pool.device, grow)?;
                let pool = self.pools.get_mut(&p).expect("checked above");
                pool.used = used;
                pool.reserved += grow;
                pool.used_high = pool.used_high.max(pool.used);
                pool.reserved_high = pool.reserved_high.max(pool.reserved);
            }
            AllocKind::Device | AllocKind::Managed => self.charge(device, size)?,
        }
        let addr = match self.address(size, ALLOC_ALIGN) {
            Ok(a) => a,
            Err(e) => {
                self.undo_charge(device, size, kind);
                return Err(e);
            }
        };
        let buffer_id = self.next_buffer_id;
        self.next_buffer_id += 1;
        self.allocs.insert(
            addr,
            Alloc {
                size,
                device,
                kind,
                buffer_id,
            },
        );
        Ok(addr)
    }

    fn undo_charge(&mut self, device: i32, size: u64, kind: AllocKind) {
        match kind {
            AllocKind::Pool(p) => {
                if let Some(pool) = self.pools.get_mut(&p) {
                    pool.used = pool.used.saturating_sub(size);
                }
            }
            _ => self.uncharge(device, size),
        }
    }

    /// Frees the allocation that starts at `ptr`.
    pub fn free(&mut self, ptr: u64) -> Result<Alloc, CUresult> {
        let a = self.allocs.remove(&ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        self.undo_charge(a.device, a.size, a.kind);
        self.drop_content(ptr, a.size);
        Ok(a)
    }

    /// Writes `bytes` at device address `dst` (a range the caller checked).
    pub fn write_content(&mut self, dst: u64, bytes: &[u8]) {
        let mut done = 0;
        while done < bytes.len() {
            let at = dst + done as u64;
            let (page, offset) = (at - at % PAGE, (at % PAGE) as usize);
            let n = (PAGE as usize - offset).min(bytes.len() - done);
            let part = &bytes[done..done + n];
            done += n;
            // A page never written reads as zeros: zeros written to it need no page (a GiB copied
            // back to a device holds only what was written to it).
            if !self.content.contains_key(&page) && part.iter().all(|&b| b == 0) {
                continue;
            }
            let p = self
                .content
                .entry(page)
                .or_insert_with(|| vec![0; PAGE as usize].into_boxed_slice());
            p[offset..offset + n].copy_from_slice(part);
        }
    }

    /// Reads device memory at `src` into `out` (a range the caller checked).
    pub fn read_content(&self, src: u64, out: &mut [u8]) {
        let mut done = 0;
        while done < out.len() {
            let at = src + done as u64;
            let (page, offset) = (at - at % PAGE, (at % PAGE) as usize);
            let n = (PAGE as usize - offset).min(out.len() - done);
            match self.content.get(&page) {
                Some(p) => out[done..done + n].copy_from_slice(&p[offset..offset + n]),
                None => out[done..done + n].fill(0),
            }
            done += n;
        }
    }

    /// Forgets the content of `[start, start + len)` (freed or unmapped memory).
    fn drop_content(&mut self, start: u64, len: u64) {
        let first = start - start % PAGE;
        let pages: Vec<u64> = self
            .content
            .range(first..start.saturating_add(len))
            .map(|(p, _)| *p)
            .collect();
        for p in pages {
            self.content.remove(&p);
        }
    }

    /// Checkpoints the process: its content moves to host memory and the bytes it holds on each
    /// device are given back to the shared device (the process keeps its own accounting, which
    /// it finds again at the restore). Returns the bytes given back.
    pub fn checkpoint(&mut self) -> u64 {
        let shared = crate::shared::device();
        let given: Vec<u64> = self.used.clone();
        for (d, bytes) in given.iter().enumerate() {
            if let Some(shared) = shared {
                shared.uncharge(d, *bytes);
            }
        }
        let saved = std::mem::take(&mut self.content);
        let total = given.iter().sum();
        self.checkpointed = Some((given, saved));
        total
    }

    /// Restores a checkpointed process: charges its bytes on every device again (all or none:
    /// out of memory if the shared device has no room) and moves its content back.
    pub fn restore(&mut self) -> Result<(), CUresult> {
        let Some((given, _)) = &self.checkpointed else {
            return Err(CUDA_ERROR_INVALID_VALUE);
        };
        if let Some(shared) = crate::shared::device() {
            let capacity = config().capacity;
            for (d, bytes) in given.iter().enumerate() {
                if !shared.try_charge(d, *bytes, capacity) {
                    for (back, b) in given.iter().enumerate().take(d) {
                        shared.uncharge(back, *b);
                    }
                    return Err(CUDA_ERROR_OUT_OF_MEMORY);
                }
            }
        }
        let (_, saved) = self.checkpointed.take().expect("checked above");
        self.content = saved;
        Ok(())
    }

    /// Releases cached pool memory above `keep` bytes (never below what is in use).
    pub fn trim_pool(&mut self, p: u64, keep: u64) {
        let Some(pool) = self.pools.get_mut(&p) else {
            return;
        };
        let target = pool.used.max(keep.min(pool.reserved));
        let release = pool.reserved - target;
        pool.reserved = target;
        let device = pool.device;
        self.uncharge(device, release);
    }

    /// At a synchronisation point pools give back what they cache above their release threshold.
    pub fn release_pools_at_sync(&mut self) {
        let pools: Vec<(u64, u64)> = self
            .pools
            .iter()
            .map(|(h, p)| (*h, p.release_threshold))
            .collect();
        for (h, t) in pools {
            self.trim_pool(h, t);
        }
    }

    /// `cuMemCreate`.
    pub fn create_physical(
        &mut self,
        prop: CUmemAllocationProp,
        size: u64,
    ) -> Result<u64, CUresult> {
        let device = prop.location.id;
        if size == 0 || !size.is_multiple_of(GRANULARITY) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        self.charge(device, size)?;
        let h = self.handle();
        self.physical.insert(
            h,
            Physical {
                size,
                device,
                mappings: 0,
                released: false,
                refs: 1,
                handle_types: prop.requested_handle_types,
            },
        );
        Ok(h)
    }

    /// `cuMemRelease`: one reference; the memory goes once none is left and it is also unmapped
    /// everywhere.
    pub fn release_physical(&mut self, h: u64) -> Result<(), CUresult> {
        let p = self
            .physical
            .get_mut(&h)
            .filter(|p| !p.released)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        p.refs -= 1;
        p.released = p.refs == 0;
        self.drop_physical_if_unused(h);
        Ok(())
    }

    fn drop_physical_if_unused(&mut self, h: u64) {
        if let Some(p) = self.physical.get(&h).copied()
            && p.released
            && p.mappings == 0
        {
            self.physical.remove(&h);
            self.uncharge(p.device, p.size);
        }
    }

    /// `cuMemRetainAllocationHandle`: the handle mapped at `ptr`, with one more reference.
    pub fn retain_physical(&mut self, ptr: u64) -> Result<u64, CUresult> {
        let (_, m) = self.mapped_at(ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let p = self
            .physical
            .get_mut(&m.handle)
            .filter(|p| !p.released)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        p.refs += 1;
        Ok(m.handle)
    }

    /// A live (not released) handle's allocation.
    pub fn live_physical(&self, h: u64) -> Result<Physical, CUresult> {
        self.physical
            .get(&h)
            .filter(|p| !p.released)
            .copied()
            .ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    /// `cuMemAddressReserve`.
    pub fn reserve(&mut self, size: u64, align: u64) -> Result<u64, CUresult> {
        let align = if align == 0 { GRANULARITY } else { align };
        if size == 0 || !size.is_multiple_of(GRANULARITY) || !align.is_power_of_two() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let addr = self.address(size, align.max(GRANULARITY))?;
        self.reservations.insert(addr, size);
        Ok(addr)
    }

    /// `cuMemAddressFree`: the exact range of a reservation without live mappings.
    pub fn unreserve(&mut self, ptr: u64, size: u64) -> Result<(), CUresult> {
        if self.reservations.get(&ptr) != Some(&size)
            || self.mappings.range(ptr..ptr + size).next().is_some()
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        self.reservations.remove(&ptr);
        Ok(())
    }

    /// `cuMemMap`.
    pub fn map(&mut self, ptr: u64, size: u64, offset: u64, h: u64) -> Result<(), CUresult> {
        let phys = self
            .physical
            .get(&h)
            .filter(|p| !p.released)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let in_reservation = self
            .reservations
            .range(..=ptr)
            .next_back()
            .is_some_and(|(s, n)| ptr.checked_add(size).is_some_and(|e| e <= s + n));
        if size == 0
            || !size.is_multiple_of(GRANULARITY)
            || !offset.is_multiple_of(GRANULARITY)
            || offset.checked_add(size).is_none_or(|e| e > phys.size)
            || !in_reservation
            || self.mapped_at(ptr).is_some()
            || self.mappings.range(ptr..ptr + size).next().is_some()
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        self.mappings.insert(
            ptr,
            Mapping {
                size,
                handle: h,
                access: false,
            },
        );
        self.physical.get_mut(&h).expect("checked above").mappings += 1;
        Ok(())
    }

    /// `cuMemUnmap`: the exact range of one mapping.
    pub fn unmap(&mut self, ptr: u64, size: u64) -> Result<(), CUresult> {
        match self.mappings.get(&ptr) {
            Some(m) if m.size == size => {}
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        let m = self.mappings.remove(&ptr).expect("checked above");
        self.drop_content(ptr, m.size);
        if let Some(p) = self.physical.get_mut(&m.handle) {
            p.mappings -= 1;
        }
        self.drop_physical_if_unused(m.handle);
        Ok(())
    }

    /// The mapping that contains `ptr`.
    pub fn mapped_at(&self, ptr: u64) -> Option<(u64, Mapping)> {
        self.mappings
            .range(..=ptr)
            .next_back()
            .filter(|(s, m)| ptr < *s + m.size)
            .map(|(s, m)| (*s, *m))
    }

    /// The allocation that contains `ptr`.
    pub fn alloc_at(&self, ptr: u64) -> Option<(u64, Alloc)> {
        self.allocs
            .range(..=ptr)
            .next_back()
            .filter(|(s, a)| ptr < *s + a.size)
            .map(|(s, a)| (*s, *a))
    }

    /// Whether `[ptr, ptr+n)` is device memory this process can access.
    pub fn valid_range(&self, ptr: u64, n: u64) -> bool {
        if n == 0 {
            return true;
        }
        let Some(last) = ptr.checked_add(n - 1) else {
            return false;
        };
        if let Some((s, a)) = self.alloc_at(ptr) {
            return last < s + a.size;
        }
        if let Some((s, m)) = self.mapped_at(ptr) {
            return m.access && last < s + m.size;
        }
        false
    }

    pub fn destroy_pool(&mut self, p: u64) -> Result<(), CUresult> {
        match self.pools.get(&p) {
            Some(pool) if !pool.is_default => {}
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        // Like the real driver, destroying a pool with live allocations defers its release; the
        // sim frees those allocations now so the pool's memory goes back.
        let live: Vec<u64> = self
            .allocs
            .iter()
            .filter(|(_, a)| a.kind == AllocKind::Pool(p))
            .map(|(k, _)| *k)
            .collect();
        for a in live {
            let _ = self.free(a);
        }
        self.trim_pool(p, 0);
        self.pools.remove(&p);
        for c in self.current_pools.iter_mut().enumerate() {
            if *c.1 == p {
                *c.1 = self.default_pools[c.0];
            }
        }
        Ok(())
    }
}

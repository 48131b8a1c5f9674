//! The memory the application creates itself with the virtual memory API (`cuMemCreate`,
//! `cuMemMap`, `cuMemSetAccess`: JAX's default allocator, PyTorch's expandable segments), made
//! movable by the in-process freeze.
//!
//! **Handles.** With the path on, `cuMemCreate` of device memory hands the application a handle
//! of the limiter's own ([`APP_HANDLE_BASE`] and up: a non-canonical address, which no driver
//! handle is, being a pointer or a small counter) and keeps the driver's handle behind it; every
//! hooked call that takes a handle translates it (`cuMemMap`, `cuMemRelease`,
//! `cuMemGetAllocationPropertiesFromHandle`, `cuMemExportToShareableHandle`), and
//! `cuMemRetainAllocationHandle` of an address mapped from one answers the application's handle.
//! A freeze releases the driver's handle and a thaw creates a new one with the same properties:
//! the application's handle stays valid across both. A handle the table does not know (host
//! memory, memory imported from another process, memory created with the path off) passes
//! through untouched.
//!
//! **What is recorded.** Per handle: its properties, size, context, the application's references
//! (its `cuMemCreate` and each retain, less its releases: the driver holds one reference of its
//! own while the application holds any), and whether it was exported. Per mapping (its address):
//! size, offset, handle, and the access descriptors set on it.
//!
//! **What moves.** A handle whose whole range one mapping covers with its device's read access
//! (the freeze copies it through that mapping), not exported, made in a context of its device,
//! and whose access was set on whole mappings. Anything else (an exported handle, a handle never
//! mapped whole, access set on part of a mapping) stays on the GPU and counts as not backed, so
//! a process that relies on it refuses the in-process freeze rather than risk its memory.
//!
//! **Not followed.** Sparse arrays: `cuMemMapArrayAsync` gets the driver's handles behind the
//! table's, and a handle mapped into an array stays on the GPU from then on (unclear).
//! `cuMemImportFromShareableHandle` answers the driver's own handles, which the table does not
//! know and passes through.

use std::{
    collections::BTreeMap,
    ffi::c_void,
    sync::{Mutex, MutexGuard, PoisonError},
};

use super::backing::Saved;
use crate::platform::{
    cuda::{
        CU_MEM_ACCESS_FLAGS_PROT_READ, CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        CU_MEM_LOCATION_TYPE_DEVICE, CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS, CUcontext,
        CUdeviceptr, CUmemAccessDesc, CUmemAllocationPropFull, CUmemGenericAllocationHandle,
        CUresult,
    },
    driver::Driver,
    vmm::Code,
};

/// The first handle the limiter hands out: bit 63 and 62 set, a non-canonical address (no
/// user-space pointer), far above any counter a driver uses.
pub(crate) const APP_HANDLE_BASE: u64 = 0xC0DE_0000_0000_0000;

/// One allocation the application created.
#[derive(Debug)]
pub(crate) struct Created {
    pub(crate) prop: CUmemAllocationPropFull,
    pub(crate) size: u64,
    /// The context current at its `cuMemCreate` (the freeze's copies run there).
    pub(crate) context: usize,
    /// The driver's handle; 0 while frozen.
    pub(crate) real: u64,
    /// The application's references (its create and retains, less its releases).
    pub(crate) refs: u32,
    /// Exported as a shareable handle: another process may map it; never moved.
    pub(crate) shared: bool,
    /// Something about it the limiter cannot replay (access set on part of a mapping): never
    /// moved.
    pub(crate) unclear: bool,
    /// Where a freeze saved it; `None` while on the GPU.
    pub(crate) saved: Option<Saved>,
}

/// One mapping of a created allocation.
#[derive(Debug, Clone)]
pub(crate) struct Mapped {
    pub(crate) size: u64,
    pub(crate) offset: u64,
    /// The application's handle.
    pub(crate) handle: u64,
    /// The access set on it, one descriptor per location (the last set for that location).
    pub(crate) access: Vec<CUmemAccessDesc>,
}

/// The handles and the mappings.
#[derive(Debug, Default)]
pub(crate) struct Table {
    pub(crate) handles: BTreeMap<u64, Created>,
    pub(crate) mappings: BTreeMap<CUdeviceptr, Mapped>,
    next: u64,
}

impl Table {
    /// The address through which a freeze copies `handle` (a mapping of its whole range with
    /// its device's read access), if it can move at all (see the module documentation).
    pub(crate) fn copy_address(&self, handle: u64, c: &Created) -> Option<CUdeviceptr> {
        if c.shared || c.unclear || c.prop.location.kind != CU_MEM_LOCATION_TYPE_DEVICE {
            return None;
        }
        let device = c.prop.location.id;
        let readable = |m: &Mapped| {
            m.access.iter().any(|d| {
                d.location.kind == CU_MEM_LOCATION_TYPE_DEVICE
                    && d.location.id == device
                    && (d.flags == CU_MEM_ACCESS_FLAGS_PROT_READ
                        || d.flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            })
        };
        self.mappings
            .iter()
            .find(|(_, m)| m.handle == handle && m.offset == 0 && m.size == c.size && readable(m))
            .map(|(&va, _)| va)
    }

    /// The mappings of `handle`.
    pub(crate) fn mappings_of(&self, handle: u64) -> Vec<(CUdeviceptr, Mapped)> {
        self.mappings
            .iter()
            .filter(|(_, m)| m.handle == handle)
            .map(|(&va, m)| (va, m.clone()))
            .collect()
    }

    /// Bytes that can move (see [`Table::copy_address`]).
    pub(crate) fn movable_bytes(&self) -> u64 {
        self.handles
            .iter()
            .filter(|(h, c)| self.copy_address(**h, c).is_some())
            .map(|(_, c)| c.size)
            .sum()
    }

    /// Drops `handle` once the application holds no reference and nothing maps it.
    fn drop_if_unused(&mut self, handle: u64) {
        let unused = self
            .handles
            .get(&handle)
            .is_some_and(|c| c.refs == 0 && c.saved.is_none());
        if unused && !self.mappings.values().any(|m| m.handle == handle) {
            self.handles.remove(&handle);
        }
    }
}

/// See the module documentation.
#[derive(Debug, Default)]
pub(crate) struct CreatedTable {
    table: Mutex<Table>,
}

/// Whether `prop` names device memory (what the table translates and may move).
///
/// # Safety
/// `prop` is null or points to a whole `CUmemAllocationProp` (the caller's contract).
pub(crate) unsafe fn on_device(prop: *const CUmemAllocationPropFull) -> bool {
    // SAFETY: see the function's contract.
    !prop.is_null() && unsafe { (*prop).location.kind } == CU_MEM_LOCATION_TYPE_DEVICE
}

impl CreatedTable {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Table> {
        // Each entry is written whole under the lock: a panic while it was held left it
        // consistent.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Bytes that can move.
    pub(crate) fn movable_bytes(&self) -> u64 {
        self.lock().movable_bytes()
    }

    /// Forgets everything without a driver call (a forked child: they are its parent's).
    pub(crate) fn forget_all(&self) {
        if let Ok(mut t) = self.table.try_lock() {
            *t = Table::default();
        }
    }

    /// `cuMemCreate` of device memory: `create` makes the driver's handle (into its argument);
    /// on success the application gets a handle of the table's in `handle`.
    ///
    /// # Safety
    /// `handle` is the caller's out-pointer and `prop` a whole `CUmemAllocationProp` on a device
    /// (see [`on_device`]).
    pub(crate) unsafe fn create(
        &self,
        driver: &Driver,
        handle: *mut CUmemGenericAllocationHandle,
        size: usize,
        prop: *const CUmemAllocationPropFull,
        create: impl FnOnce(*mut CUmemGenericAllocationHandle) -> CUresult,
    ) -> CUresult {
        if handle.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let mut real: CUmemGenericAllocationHandle = 0;
        let r = create(&mut real);
        if r != CUDA_SUCCESS {
            return r;
        }
        // SAFETY: the caller's whole property struct (see the function's contract), copied.
        let prop = unsafe { prop.read() };
        let context = driver.current_context() as usize;
        // The copies run in that context: one of another device cannot make it movable.
        let unclear = driver
            .context_device()
            .is_none_or(|d| i64::try_from(d).ok() != Some(i64::from(prop.location.id)));
        let mut t = self.lock();
        t.next += 1;
        let app = APP_HANDLE_BASE + t.next;
        t.handles.insert(
            app,
            Created {
                prop,
                size: size as u64,
                context,
                real,
                refs: 1,
                shared: false,
                unclear,
                saved: None,
            },
        );
        drop(t);
        // SAFETY: checked non-null; the caller's out-pointer.
        unsafe { handle.write(app) };
        CUDA_SUCCESS
    }

    /// `cuMemRelease` of `handle`: `None` if the table does not know it (the caller passes it
    /// through). The driver's handle is released with the application's last reference; the
    /// mappings keep the memory, as the driver's do.
    pub(crate) fn release(
        &self,
        handle: u64,
        release: impl FnOnce(u64) -> CUresult,
    ) -> Option<CUresult> {
        let mut t = self.lock();
        let c = t.handles.get_mut(&handle)?;
        if c.refs == 0 {
            return Some(CUDA_ERROR_INVALID_VALUE);
        }
        if c.refs == 1 && c.real != 0 {
            let r = release(c.real);
            if r != CUDA_SUCCESS {
                return Some(r);
            }
        }
        c.refs -= 1;
        t.drop_if_unused(handle);
        Some(CUDA_SUCCESS)
    }

    /// The application's references to `handle` (0: not the table's).
    pub(crate) fn references(&self, handle: u64) -> u32 {
        self.lock().handles.get(&handle).map_or(0, |c| c.refs)
    }

    /// `cuMemMap` of `handle`: `None` if the table does not know it.
    pub(crate) fn map(
        &self,
        ptr: CUdeviceptr,
        size: usize,
        offset: usize,
        handle: u64,
        map: impl FnOnce(u64) -> CUresult,
    ) -> Option<CUresult> {
        let mut t = self.lock();
        let real = t.handles.get(&handle).filter(|c| c.refs > 0)?.real;
        let r = map(real);
        if r == CUDA_SUCCESS {
            t.mappings.insert(
                ptr,
                Mapped {
                    size: size as u64,
                    offset: offset as u64,
                    handle,
                    access: Vec::new(),
                },
            );
        }
        Some(r)
    }

    /// After a successful `cuMemUnmap` of `[ptr, ptr + size)`: the mappings in it are gone (a
    /// handle the application released goes with its last one).
    pub(crate) fn unmapped(&self, ptr: CUdeviceptr, size: usize) {
        let end = ptr.saturating_add(size as u64);
        let mut t = self.lock();
        let gone: Vec<CUdeviceptr> = t
            .mappings
            .iter()
            .filter(|&(&va, m)| va < end && ptr < va.saturating_add(m.size))
            .map(|(&va, _)| va)
            .collect();
        for va in gone {
            if let Some(m) = t.mappings.remove(&va) {
                t.drop_if_unused(m.handle);
            }
        }
    }

    /// After a successful `cuMemSetAccess` of `[ptr, ptr + size)` with `descs`: recorded on each
    /// mapping in the range; a mapping the range covers only in part makes its allocation
    /// unclear.
    pub(crate) fn access_set(&self, ptr: CUdeviceptr, size: usize, descs: &[CUmemAccessDesc]) {
        let end = ptr.saturating_add(size as u64);
        let mut t = self.lock();
        let mut unclear = Vec::new();
        for (&va, m) in t.mappings.iter_mut() {
            let m_end = va.saturating_add(m.size);
            if va >= end || m_end <= ptr {
                continue;
            }
            if va < ptr || m_end > end {
                unclear.push(m.handle);
                continue;
            }
            for d in descs {
                match m.access.iter_mut().find(|a| a.location == d.location) {
                    Some(a) => *a = *d,
                    None => m.access.push(*d),
                }
            }
        }
        for h in unclear {
            if let Some(c) = t.handles.get_mut(&h) {
                c.unclear = true;
            }
        }
    }

    /// `cuMemRetainAllocationHandle` of an address: the application's handle of the mapping
    /// there (one more reference), `None` if no mapping of the table's is there.
    pub(crate) fn retain(&self, ptr: CUdeviceptr) -> Option<u64> {
        let mut t = self.lock();
        let handle = t
            .mappings
            .range(..=ptr)
            .next_back()
            .filter(|(va, m)| ptr < va.saturating_add(m.size))
            .map(|(_, m)| m.handle)?;
        let c = t.handles.get_mut(&handle)?;
        if c.refs == 0 {
            // Released by the application: the driver's handle may be gone; it answers.
            return None;
        }
        c.refs += 1;
        Some(handle)
    }

    /// The driver's handle behind `handle` for a sparse array's tile (`cuMemMapArrayAsync`):
    /// the limiter does not follow arrays, so the allocation stays on the GPU from then on
    /// (unclear: not movable).
    pub(crate) fn real_for_array(&self, handle: u64) -> Option<u64> {
        let mut t = self.lock();
        let c = t.handles.get_mut(&handle).filter(|c| c.refs > 0)?;
        c.unclear = true;
        Some(c.real)
    }

    /// The driver's handle behind `handle`, for a call that takes one
    /// (`cuMemGetAllocationPropertiesFromHandle`); an export marks it shared first (`export`).
    pub(crate) fn real(&self, handle: u64, export: bool) -> Option<u64> {
        let mut t = self.lock();
        let c = t.handles.get_mut(&handle).filter(|c| c.refs > 0)?;
        if export {
            c.shared = true;
        }
        Some(c.real)
    }
}

/// Unmaps every mapping of a created allocation and releases the driver's reference to it (the
/// freeze's step once its copy is saved); on a failure maps back what it unmapped (the driver's
/// handle is still live then) and returns the code.
pub(crate) fn release_created(
    d: &Driver,
    c: &Created,
    mappings: &[(CUdeviceptr, Mapped)],
) -> Result<(), (&'static str, Code)> {
    for (i, (va, m)) in mappings.iter().enumerate() {
        if let Err(code) = d.vmm_unmap(*va, m.size) {
            for (va, m) in &mappings[..i] {
                let _ = d
                    .vmm_map_range(*va, m.size, m.offset, c.real)
                    .and_then(|()| d.vmm_set_access(*va, m.size, &m.access));
            }
            return Err(("cuMemUnmap", code));
        }
    }
    if c.refs > 0 {
        d.vmm_release(c.real)
            .map_err(|code| ("cuMemRelease", code))?;
    }
    Ok(())
}

/// Creates a frozen allocation again with its properties, maps it at each of its addresses and
/// sets their access (in `c.context`); returns the driver's new handle. On a failure nothing of
/// it is left.
pub(crate) fn recreate(
    d: &Driver,
    c: &Created,
    mappings: &[(CUdeviceptr, Mapped)],
) -> Result<u64, Code> {
    d.with_context(c.context as CUcontext, || {
        let h = d.vmm_create_as(&c.prop, c.size)?;
        for (i, (va, m)) in mappings.iter().enumerate() {
            let r = d
                .vmm_map_range(*va, m.size, m.offset, h)
                .and_then(|()| d.vmm_set_access(*va, m.size, &m.access));
            if let Err(e) = r {
                for (va, m) in &mappings[..=i] {
                    let _ = d.vmm_unmap(*va, m.size);
                }
                let _ = d.vmm_release(h);
                return Err(e);
            }
        }
        Ok(h)
    })
}

/// The application's references are gone: the thaw's new handle is released at once (its
/// mappings keep the memory, as before the freeze).
pub(crate) fn drop_creation_reference(d: &Driver, c: &Created, h: u64) {
    if c.refs == 0 {
        let _ = d.vmm_release(h);
    }
}

/// Casts a `CUmemAllocationProp` pointer of the hooks' declaration to the whole structure.
pub(crate) fn whole_prop(p: *const c_void) -> *const CUmemAllocationPropFull {
    p.cast()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::cuda::CUmemLocation;

    const MIB: u64 = 1 << 20;

    fn created(size: u64) -> Created {
        Created {
            prop: CUmemAllocationPropFull {
                kind: 1,
                location: CUmemLocation {
                    kind: CU_MEM_LOCATION_TYPE_DEVICE,
                    id: 0,
                },
                ..CUmemAllocationPropFull::default()
            },
            size,
            context: 1,
            real: 0x5a00_0010,
            refs: 1,
            shared: false,
            unclear: false,
            saved: None,
        }
    }

    fn rw(id: i32) -> CUmemAccessDesc {
        CUmemAccessDesc {
            location: CUmemLocation {
                kind: CU_MEM_LOCATION_TYPE_DEVICE,
                id,
            },
            flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        }
    }

    /// A table with two 4 MiB allocations of the application's, mapped back to back at
    /// `0x1000_0000` as XLA maps its chunks.
    fn two_chunks() -> (CreatedTable, [u64; 2]) {
        let t = CreatedTable::default();
        let handles = [APP_HANDLE_BASE + 1, APP_HANDLE_BASE + 2];
        {
            let mut g = t.lock();
            for &h in &handles {
                g.handles.insert(h, created(4 * MIB));
            }
        }
        for (i, &h) in handles.iter().enumerate() {
            let r = t.map(0x1000_0000 + i as u64 * 4 * MIB, 4 << 20, 0, h, |_| {
                CUDA_SUCCESS
            });
            assert_eq!(r, Some(CUDA_SUCCESS));
        }
        (t, handles)
    }

    /// A handle mapped into a sparse array's tile is translated for the driver and moves no more.
    #[test]
    fn a_handle_mapped_into_an_array_is_translated_and_stays() {
        let (t, [a, _]) = two_chunks();
        t.access_set(0x1000_0000, 8 << 20, &[rw(0)]);
        assert_eq!(t.movable_bytes(), 8 * MIB);
        let real = t.lock().handles[&a].real;
        assert_eq!(t.real_for_array(a), Some(real));
        assert_eq!(t.movable_bytes(), 4 * MIB, "the array's memory stays");
        assert_eq!(
            t.real_for_array(APP_HANDLE_BASE + 9),
            None,
            "not the table's"
        );
    }

    /// Memory moves once one mapping covers it whole with its device's access; an access set on
    /// part of a mapping, an export, or another device's access only does not.
    #[test]
    fn created_memory_moves_once_mapped_whole_with_its_devices_access() {
        let (t, [a, b]) = two_chunks();
        assert_eq!(t.movable_bytes(), 0, "no access yet");
        t.access_set(0x1000_0000, 8 << 20, &[rw(1)]);
        assert_eq!(t.movable_bytes(), 0, "another device's access only");
        t.access_set(0x1000_0000, 8 << 20, &[rw(0)]);
        assert_eq!(t.movable_bytes(), 8 * MIB);
        assert_eq!(t.real(a, true), Some(0x5a00_0010), "exported");
        assert_eq!(t.movable_bytes(), 4 * MIB, "an exported one stays");
        t.access_set(0x1000_0000 + 4 * MIB, 2 << 20, &[rw(0)]);
        assert_eq!(t.movable_bytes(), 0, "access on part of a mapping: unclear");
        assert_eq!(t.references(b), 1);
        assert_eq!(t.references(APP_HANDLE_BASE + 9), 0, "not the table's");
    }

    /// A retain by address answers the application's handle and adds a reference; the driver's
    /// handle is released with the application's last reference, and the entry goes with its
    /// last mapping.
    #[test]
    fn retained_handles_are_counted_and_the_last_release_reaches_the_driver() {
        let (t, [_, b]) = two_chunks();
        assert_eq!(t.retain(0x1000_0000 + 4 * MIB + 4096), Some(b));
        assert_eq!(t.retain(0x2000_0000), None, "not mapped by the table");
        assert_eq!(t.references(b), 2);
        let released = std::cell::RefCell::new(Vec::new());
        let release = |h| {
            released.borrow_mut().push(h);
            CUDA_SUCCESS
        };
        assert_eq!(t.release(b, release), Some(CUDA_SUCCESS));
        assert!(released.borrow().is_empty(), "a reference is left");
        assert_eq!(t.release(b, release), Some(CUDA_SUCCESS));
        assert_eq!(*released.borrow(), [0x5a00_0010], "the last one");
        assert_eq!(t.release(b, release), Some(CUDA_ERROR_INVALID_VALUE));
        assert!(t.lock().handles.contains_key(&b), "mapped still");
        t.unmapped(0x1000_0000 + 4 * MIB, 4 << 20);
        assert!(!t.lock().handles.contains_key(&b), "gone with its mapping");
        assert_eq!(
            t.release(b, |_| CUDA_SUCCESS),
            None,
            "unknown: passed through"
        );
    }
}

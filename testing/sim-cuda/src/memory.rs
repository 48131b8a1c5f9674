//! Memory entry points: allocation (device, managed, pitched, stream-ordered, virtual), release,
//! memory pools, pointer attributes, and host memory registration (bookkeeping only).

use crate::runtime::Sym;
use crate::state::{self, AllocKind, state};
use crate::types::*;
use crate::{get, put};
use std::ffi::{c_int, c_uint, c_void};

fn result(r: Result<(), CUresult>) -> CUresult {
    r.err().unwrap_or(CUDA_SUCCESS)
}

fn alloc_into(
    dptr: *mut CUdeviceptr,
    size: usize,
    kind: impl FnOnce(&state::State) -> Result<(i32, AllocKind), CUresult>,
) -> CUresult {
    if dptr.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let mut s = state();
    let r = kind(&s).and_then(|(d, k)| s.alloc(d, size as u64, k));
    drop(s);
    match r {
        Ok(a) => {
            out!(dptr, a);
            CUDA_SUCCESS
        }
        Err(e) => e,
    }
}

fn alloc_device(dptr: *mut CUdeviceptr, size: usize, kind: AllocKind) -> CUresult {
    alloc_into(dptr, size, |s| Ok((s.current_device()?, kind)))
}

fn alloc_pool(
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: Option<u64>,
    stream: CUstream,
) -> CUresult {
    alloc_into(dptr, size, |s| {
        if !s.valid_stream(stream as u64) {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        let d = s.current_device()?;
        let p = match pool {
            Some(p) => p,
            None => s.current_pools[d as usize],
        };
        let dev = s.pools.get(&p).ok_or(CUDA_ERROR_INVALID_VALUE)?.device;
        Ok((dev, AllocKind::Pool(p)))
    })
}

fn free_async(ptr: CUdeviceptr, stream: CUstream) -> CUresult {
    let mut s = state();
    if !s.valid_stream(stream as u64) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    result(s.free(ptr).map(|_| ()))
}

/// Host memory registered (`cuMemHostRegister_v2`): start and length. Kept so that an
/// unregister of something never registered fails, and a copy that spans two registrations
/// fails ([`host_range_ok`]), as on the real driver.
static REGISTERED: std::sync::Mutex<Vec<(usize, usize)>> = std::sync::Mutex::new(Vec::new());

/// Whether a copy may use the `n` host bytes at `p`: a host range that overlaps a registration
/// lies within it. The real driver refuses a copy that spans two adjacent registrations with
/// `CUDA_ERROR_INVALID_VALUE` (the in-process freeze splits its copies at the freeze pool's
/// chunks for this). Memory never registered is not checked.
pub(crate) fn host_range_ok(p: *const c_void, n: usize) -> bool {
    if n == 0 {
        return true;
    }
    let (lo, hi) = (p as usize, (p as usize).saturating_add(n));
    let r = REGISTERED.lock().unwrap_or_else(|e| e.into_inner());
    r.iter()
        .filter(|&&(a, len)| lo < a + len && a < hi)
        .all(|&(a, len)| a <= lo && hi <= a + len)
}

/// Whether the calling thread has a current context (the real driver's registration needs one:
/// `CUDA_ERROR_INVALID_CONTEXT` without).
fn has_context() -> bool {
    state::current_ctx() != 0
}

fn host_register(p: *mut c_void, size: usize) -> CUresult {
    if !has_context() {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    if p.is_null() || size == 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let mut r = REGISTERED.lock().unwrap_or_else(|e| e.into_inner());
    let (lo, hi) = (p as usize, p as usize + size);
    if r.iter().any(|&(a, n)| lo < a + n && a < hi) {
        return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    }
    r.push((lo, size));
    CUDA_SUCCESS
}

fn host_unregister(p: *mut c_void) -> CUresult {
    if !has_context() {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    let mut r = REGISTERED.lock().unwrap_or_else(|e| e.into_inner());
    match r.iter().position(|&(a, _)| a == p as usize) {
        Some(i) => {
            r.swap_remove(i);
            CUDA_SUCCESS
        }
        None => CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
    }
}

fn pool_handle(p: CUmemoryPool) -> Result<u64, CUresult> {
    let p = p as u64;
    if state().pools.contains_key(&p) {
        Ok(p)
    } else {
        Err(CUDA_ERROR_INVALID_VALUE)
    }
}

exports! {
    // ---- Registered host memory.
    fn cuMemHostRegister_v2(p: *mut c_void, bytesize: usize, flags: c_uint) {
        host_register(p, bytesize)
    }
    fn cuMemHostUnregister(p: *mut c_void) {
        host_unregister(p)
    }

    // ---- Allocation.
    fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) {
        alloc_device(dptr, bytesize, AllocKind::Device)
    }
    fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, element_size: c_uint) {
        if !matches!(element_size, 4 | 8 | 16) || width == 0 || height == 0 || pitch.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let p = state::align_up(width as u64, ALLOC_ALIGN);
        let Some(size) = p.checked_mul(height as u64) else { return CUDA_ERROR_OUT_OF_MEMORY };
        let r = alloc_device(dptr, size as usize, AllocKind::Device);
        if r == CUDA_SUCCESS {
            out!(pitch, p as usize);
        }
        r
    }
    fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint) {
        if flags != 1 && flags != 2 {
            return CUDA_ERROR_INVALID_VALUE; // CU_MEM_ATTACH_GLOBAL or CU_MEM_ATTACH_HOST
        }
        alloc_device(dptr, bytesize, AllocKind::Managed)
    }
    fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) {
        alloc_pool(dptr, bytesize, None, stream)
    }
    fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) {
        alloc_pool(dptr, bytesize, None, stream)
    }
    fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream) {
        match pool_handle(pool) {
            Ok(p) => alloc_pool(dptr, bytesize, Some(p), stream),
            Err(e) => e,
        }
    }
    fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream) {
        match pool_handle(pool) {
            Ok(p) => alloc_pool(dptr, bytesize, Some(p), stream),
            Err(e) => e,
        }
    }
    fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: u64) {
        let prop = input!(prop);
        if handle.is_null()
            || flags != 0
            || prop.type_ != CU_MEM_ALLOCATION_TYPE_PINNED
            || prop.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE
        {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let mut s = state();
        if !s.valid_device(prop.location.id) {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        let r = s.create_physical(prop, size as u64);
        drop(s);
        match r {
            Ok(h) => {
                out!(handle, h);
                CUDA_SUCCESS
            }
            Err(e) => e,
        }
    }
    fn cuMemAddressReserve(ptr: *mut CUdeviceptr, size: usize, alignment: usize, addr: CUdeviceptr, flags: u64) {
        if ptr.is_null() || flags != 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let r = state().reserve(size as u64, alignment as u64);
        match r {
            Ok(p) => {
                out!(ptr, p);
                CUDA_SUCCESS
            }
            Err(e) => e,
        }
    }
    fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64) {
        if flags != 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        result(state().map(ptr, size as u64, offset as u64, handle))
    }
    fn cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize) {
        if count == 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let d = input!(desc);
        let mut s = state();
        if d.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE || !s.valid_device(d.location.id) {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        let end = ptr.saturating_add(size as u64);
        let starts: Vec<u64> = s.mappings.range(ptr..end).map(|(k, _)| *k).collect();
        if size == 0 || starts.first() != Some(&ptr) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        for k in starts {
            if let Some(m) = s.mappings.get_mut(&k) {
                m.access = d.flags != 0;
            }
        }
        CUDA_SUCCESS
    }
    fn cuMemGetAllocationGranularity(granularity: *mut usize, prop: *const CUmemAllocationProp, option: c_int) {
        let prop = input!(prop);
        if prop.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE || !state().valid_device(prop.location.id) {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        out!(granularity, GRANULARITY as usize);
        CUDA_SUCCESS
    }
    fn cuMemRetainAllocationHandle(handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void) {
        if handle.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        match state().retain_physical(addr as u64) {
            Ok(h) => {
                out!(handle, h);
                CUDA_SUCCESS
            }
            Err(e) => e,
        }
    }
    fn cuMemGetAllocationPropertiesFromHandle(prop: *mut CUmemAllocationProp, handle: CUmemGenericAllocationHandle) {
        if prop.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        match state().live_physical(handle) {
            Ok(p) => {
                let whole = CUmemAllocationProp {
                    type_: CU_MEM_ALLOCATION_TYPE_PINNED,
                    requested_handle_types: p.handle_types,
                    location: CUmemLocation { type_: CU_MEM_LOCATION_TYPE_DEVICE, id: p.device },
                    win32_handle_meta_data: std::ptr::null_mut(),
                    compression_type: 0,
                    gpu_direct_rdma_capable: 0,
                    usage: 0,
                    reserved: [0; 4],
                };
                out!(prop, whole);
                CUDA_SUCCESS
            }
            Err(e) => e,
        }
    }
    fn cuMemExportToShareableHandle(shareable: *mut c_void, handle: CUmemGenericAllocationHandle, handle_type: c_int, flags: u64) {
        // Only a POSIX file descriptor (1), asked for at creation, as the driver allows.
        let asked = match state().live_physical(handle) {
            Ok(p) => p.handle_types,
            Err(e) => return e,
        };
        if shareable.is_null() || flags != 0 || handle_type != 1 || asked & 1 == 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // A descriptor of the process's own (of /dev/null: nothing maps it in the sim).
        // SAFETY: a valid NUL-terminated path.
        let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        out!(shareable.cast::<c_int>(), fd);
        CUDA_SUCCESS
    }
    fn cuMemMapArrayAsync(map_info: *mut c_void, count: c_uint, stream: CUstream) {
        CUDA_ERROR_NOT_SUPPORTED
    }

    // ---- Release.
    fn cuMemFree_v2(dptr: CUdeviceptr) {
        result(state().free(dptr).map(|_| ()))
    }
    fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) {
        free_async(dptr, stream)
    }
    fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) {
        free_async(dptr, stream)
    }
    fn cuMemRelease(handle: CUmemGenericAllocationHandle) {
        result(state().release_physical(handle))
    }
    fn cuMemUnmap(ptr: CUdeviceptr, size: usize) {
        result(state().unmap(ptr, size as u64))
    }
    fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) {
        result(state().unreserve(ptr, size as u64))
    }

    // ---- Pools.
    fn cuDeviceGetDefaultMemPool(pool: *mut CUmemoryPool, dev: CUdevice) {
        let s = state();
        if !s.valid_device(dev) {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        let p = s.default_pools[dev as usize];
        drop(s);
        out!(pool, p as CUmemoryPool);
        CUDA_SUCCESS
    }
    fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice) {
        let s = state();
        if !s.valid_device(dev) {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        let p = s.current_pools[dev as usize];
        drop(s);
        out!(pool, p as CUmemoryPool);
        CUDA_SUCCESS
    }
    fn cuDeviceSetMemPool(dev: CUdevice, pool: CUmemoryPool) {
        let mut s = state();
        if !s.valid_device(dev) {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        match s.pools.get(&(pool as u64)) {
            Some(p) if p.device == dev => {}
            _ => return CUDA_ERROR_INVALID_VALUE,
        }
        s.current_pools[dev as usize] = pool as u64;
        CUDA_SUCCESS
    }
    fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const CUmemPoolProps) {
        let props = input!(props);
        if pool.is_null() || props.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let mut s = state();
        if !s.valid_device(props.location.id) {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        let h = s.handle();
        s.pools.insert(h, state::Pool { device: props.location.id, ..Default::default() });
        drop(s);
        out!(pool, h as CUmemoryPool);
        CUDA_SUCCESS
    }
    fn cuMemPoolDestroy(pool: CUmemoryPool) {
        result(state().destroy_pool(pool as u64))
    }
    fn cuMemPoolTrimTo(pool: CUmemoryPool, min_bytes_to_keep: usize) {
        let p = match pool_handle(pool) {
            Ok(p) => p,
            Err(e) => return e,
        };
        state().trim_pool(p, min_bytes_to_keep as u64);
        CUDA_SUCCESS
    }
    fn cuMemPoolSetAttribute(pool: CUmemoryPool, attr: c_int, value: *mut c_void) {
        let p = match pool_handle(pool) {
            Ok(p) => p,
            Err(e) => return e,
        };
        let mut s = state();
        let pool = s.pools.get_mut(&p).expect("checked by pool_handle");
        match attr {
            CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES..=CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                pool.reuse[(attr - 1) as usize] = input!(value.cast::<c_int>()) as u64;
            }
            CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => pool.release_threshold = input!(value.cast::<u64>()),
            CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH | CU_MEMPOOL_ATTR_USED_MEM_HIGH => {
                // Only 0 is allowed: it resets the high watermark to the current value.
                if input!(value.cast::<u64>()) != 0 {
                    return CUDA_ERROR_INVALID_VALUE;
                }
                if attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH {
                    pool.reserved_high = pool.reserved;
                } else {
                    pool.used_high = pool.used;
                }
            }
            _ => return CUDA_ERROR_INVALID_VALUE,
        }
        CUDA_SUCCESS
    }
    fn cuMemPoolGetAttribute(pool: CUmemoryPool, attr: c_int, value: *mut c_void) {
        let p = match pool_handle(pool) {
            Ok(p) => p,
            Err(e) => return e,
        };
        let pool = state().pools[&p];
        let v = match attr {
            CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES..=CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                out!(value.cast::<c_int>(), pool.reuse[(attr - 1) as usize] as c_int);
                return CUDA_SUCCESS;
            }
            CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => pool.release_threshold,
            CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT => pool.reserved,
            CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH => pool.reserved_high,
            CU_MEMPOOL_ATTR_USED_MEM_CURRENT => pool.used,
            CU_MEMPOOL_ATTR_USED_MEM_HIGH => pool.used_high,
            _ => return CUDA_ERROR_INVALID_VALUE,
        };
        out!(value.cast::<u64>(), v);
        CUDA_SUCCESS
    }
    fn cuPointerGetAttribute(data: *mut c_void, attribute: c_int, ptr: CUdeviceptr) {
        let s = state();
        let (start, size, device, managed, buffer_id, pool) = if let Some((st, a)) = s.alloc_at(ptr) {
            let pool = match a.kind {
                AllocKind::Pool(p) => p,
                _ => 0,
            };
            (st, a.size, a.device, a.kind == AllocKind::Managed, a.buffer_id, pool)
        } else if let Some((st, m)) = s.mapped_at(ptr) {
            let dev = s.physical.get(&m.handle).map_or(0, |p| p.device);
            (st, m.size, dev, false, m.handle, 0)
        } else {
            return CUDA_ERROR_INVALID_VALUE;
        };
        let ctx = s.primary[device as usize].0;
        drop(s);
        match attribute {
            CU_POINTER_ATTRIBUTE_CONTEXT => out!(data.cast::<CUcontext>(), ctx as CUcontext),
            CU_POINTER_ATTRIBUTE_MEMORY_TYPE => out!(data.cast::<c_uint>(), CU_MEMORYTYPE_DEVICE),
            CU_POINTER_ATTRIBUTE_DEVICE_POINTER => out!(data.cast::<u64>(), ptr),
            CU_POINTER_ATTRIBUTE_BUFFER_ID => out!(data.cast::<u64>(), buffer_id),
            CU_POINTER_ATTRIBUTE_IS_MANAGED => out!(data.cast::<c_uint>(), managed as c_uint),
            CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL => out!(data.cast::<c_int>(), device),
            CU_POINTER_ATTRIBUTE_RANGE_START_ADDR => out!(data.cast::<u64>(), start),
            CU_POINTER_ATTRIBUTE_RANGE_SIZE => out!(data.cast::<usize>(), size as usize),
            CU_POINTER_ATTRIBUTE_MAPPED => out!(data.cast::<c_uint>(), 1),
            CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE => out!(data.cast::<CUmemoryPool>(), pool as CUmemoryPool),
            _ => return CUDA_ERROR_INVALID_VALUE,
        }
        CUDA_SUCCESS
    }
}

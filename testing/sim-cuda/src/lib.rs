//! A simulated CUDA driver (`libsimcuda.so`, soname `libcuda.so.1`) for machines without a GPU.
//!
//! Every entry point has the real driver's name and C ABI (CUDA 12 `cuda.h`), so programs, the
//! eBPF probes (which read arguments by ABI position) and the preloaded limiter see a driver.
//! Memory is fake: addresses name nothing, copies move no data, launches run nothing; what is
//! simulated is the accounting (capacity, live bytes, pools), timing (per-call delays, launch time
//! that later synchronisation waits for) and failures. See `testing/README.md` for the knobs.
//!
//! Each exported symbol is its own function with its own address. On x86-64 it is a naked
//! four-instruction trampoline, `push %rbp; mov %rsp,%rbp; pop %rbp; jmp <impl>`, so that:
//! - no two symbols are folded to one address (by LLVM's function merging or a linker's ICF),
//! - every symbol starts with `push %rbp`, which uprobes emulate instead of single-stepping
//!   (like the 580 drivers; the 535 driver starts with a RIP-relative `cmpl`),
//! - the stack and argument registers are untouched when `<impl>` runs, so stack-passed
//!   arguments (`cuLaunchKernel` has 11) and return probes work as for a plain function.

mod config;
mod procaddr;
mod runtime;
mod state;
mod types;

use runtime::{Sym, busy_until, config, launch_work, set_initialized, sync_device, wait_until_ns};
use state::{AllocKind, Obj, current_ctx, set_current_ctx, state};
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use types::*;

/// Writes `v` through the out-pointer `p`; false if `p` is NULL.
///
/// # Safety
/// `p` is NULL or valid for a write of `T` (the caller's side of the API contract).
unsafe fn put<T>(p: *mut T, v: T) -> bool {
    if p.is_null() {
        return false;
    }
    // SAFETY: non-null and valid for writes per this function's contract; unaligned writes are
    // allowed because C callers may pass packed storage.
    unsafe { p.write_unaligned(v) };
    true
}

/// Reads a `T` from the in-pointer `p`; `None` if `p` is NULL.
///
/// # Safety
/// `p` is NULL or valid for a read of `T`.
unsafe fn get<T>(p: *const T) -> Option<T> {
    // SAFETY: non-null and valid for reads per this function's contract.
    (!p.is_null()).then(|| unsafe { p.read_unaligned() })
}

/// Writes an out-pointer argument or returns `CUDA_ERROR_INVALID_VALUE` from the entry point.
macro_rules! out {
    ($p:expr, $v:expr) => {{
        // SAFETY: the CUDA API contract makes this argument NULL or a valid out-pointer of its
        // type; NULL is checked by `put`.
        if !unsafe { put($p, $v) } {
            return CUDA_ERROR_INVALID_VALUE;
        }
    }};
}

/// Reads an in-pointer argument or returns `CUDA_ERROR_INVALID_VALUE` from the entry point.
macro_rules! input {
    ($p:expr) => {{
        // SAFETY: the CUDA API contract makes this argument NULL or a valid pointer to its type;
        // NULL is checked by `get`.
        match unsafe { get($p) } {
            Some(v) => v,
            None => return CUDA_ERROR_INVALID_VALUE,
        }
    }};
}

/// Declares the exported entry points: for each, an implementation in `imp` (wrapped in the
/// common prologue of [`Sym::call`]) and the exported symbol.
macro_rules! exports {
    ($( fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) $body:block )*) => {
        mod imp {
            #![allow(non_snake_case, unused_variables, clippy::missing_safety_doc)]
            use super::*;
            $(
                #[inline(never)]
                pub(super) unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
                    static SYM: Sym = Sym::new(stringify!($name));
                    SYM.call(|| $body)
                }
            )*
        }
        $(
            #[cfg(target_arch = "x86_64")]
            #[unsafe(naked)]
            #[unsafe(no_mangle)]
            #[allow(non_snake_case, clippy::missing_safety_doc)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
                core::arch::naked_asm!(
                    "push rbp",
                    "mov rbp, rsp",
                    "pop rbp",
                    "jmp {imp}",
                    imp = sym imp::$name,
                )
            }
            #[cfg(not(target_arch = "x86_64"))]
            #[unsafe(no_mangle)]
            #[inline(never)]
            #[allow(non_snake_case, clippy::missing_safety_doc)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
                // SAFETY: the same signature; the arguments are passed on unchanged.
                unsafe { imp::$name($($arg),*) }
            }
        )*

        /// Every exported entry point.
        pub const EXPORTED: &[&str] = &[$(stringify!($name)),*];

        /// The address of the exported entry point `name`.
        fn export_address(name: &str) -> Option<*mut c_void> {
            match name {
                $(stringify!($name) => Some($name as *mut c_void),)*
                _ => None,
            }
        }
    };
}

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

fn stream_sync(stream: CUstream) -> CUresult {
    if !state().valid_stream(stream as u64) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    sync_device();
    state().release_pools_at_sync();
    CUDA_SUCCESS
}

fn stream_wait_event(stream: CUstream, event: CUevent) -> CUresult {
    let s = state();
    if !s.valid_stream(stream as u64) || !s.is(event as u64, |o| matches!(o, Obj::Event { .. })) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    CUDA_SUCCESS
}

/// Where a copy's pointers point.
#[derive(Clone, Copy)]
enum Mem {
    Device(u64),
    Host(*const c_void),
    /// Unified addressing: device memory if it is a device address, else host memory.
    Any(u64),
}

fn copy(dst: Mem, src: Mem, n: usize, stream: Option<CUstream>) -> CUresult {
    let s = state();
    let ok = |m: Mem| match m {
        Mem::Device(p) => s.valid_range(p, n as u64),
        Mem::Host(p) => n == 0 || !p.is_null(),
        Mem::Any(p) => n == 0 || p != 0,
    };
    if !ok(dst) || !ok(src) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if let Some(st) = stream
        && !s.valid_stream(st as u64)
    {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    drop(s);
    if stream.is_none() {
        // A synchronous copy waits for the work launched before it.
        sync_device();
    }
    CUDA_SUCCESS
}

fn copy_peer(
    dst: u64,
    dst_ctx: CUcontext,
    src: u64,
    src_ctx: CUcontext,
    n: usize,
    stream: Option<CUstream>,
) -> CUresult {
    {
        let s = state();
        let is_ctx = |c: CUcontext| s.is(c as u64, |o| matches!(o, Obj::Context { .. }));
        if !is_ctx(dst_ctx) || !is_ctx(src_ctx) {
            return CUDA_ERROR_INVALID_CONTEXT;
        }
    }
    copy(Mem::Device(dst), Mem::Device(src), n, stream)
}

/// `cuMemcpyBatchAsync(_v2)`: each copy in turn; the index of a failing one goes to `fail_idx`.
fn batch_copy(
    dsts: *mut CUdeviceptr,
    srcs: *mut CUdeviceptr,
    sizes: *mut usize,
    count: usize,
    fail_idx: *mut usize,
    stream: CUstream,
) -> CUresult {
    if count > 0 && (dsts.is_null() || srcs.is_null() || sizes.is_null()) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    for i in 0..count {
        // SAFETY: the caller passes arrays of `count` elements (checked non-null above).
        let (d, s, n) = unsafe { (*dsts.add(i), *srcs.add(i), *sizes.add(i)) };
        let r = copy(Mem::Any(d), Mem::Any(s), n, Some(stream));
        if r != CUDA_SUCCESS {
            if !fail_idx.is_null() {
                // SAFETY: a non-null out-pointer from the caller.
                unsafe { *fail_idx = i };
            }
            return r;
        }
    }
    CUDA_SUCCESS
}

/// `cuLaunchHostFunc`: the sim runs the callback at once, after the work launched before it.
fn host_func(func: *mut c_void, user_data: *mut c_void) -> CUresult {
    if func.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sync_device();
    // SAFETY: CUhostFn is `void (*)(void *)`; the caller passed a function of that type.
    let f: unsafe extern "C" fn(*mut c_void) = unsafe { std::mem::transmute(func) };
    // SAFETY: the callback receives the caller's own user data.
    unsafe { f(user_data) };
    CUDA_SUCCESS
}

fn launch(f: CUfunction, grid: [c_uint; 3], block: [c_uint; 3], stream: CUstream) -> CUresult {
    let s = state();
    if !s.is(f as u64, |o| matches!(o, Obj::Function | Obj::Kernel)) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    if !s.valid_stream(stream as u64) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    drop(s);
    if grid.contains(&0)
        || block.contains(&0)
        || block.iter().map(|b| *b as u64).product::<u64>() > 1024
    {
        return CUDA_ERROR_INVALID_VALUE;
    }
    launch_work();
    CUDA_SUCCESS
}

fn launch_ex(config: *const CUlaunchConfig, f: CUfunction) -> CUresult {
    let c = input!(config);
    launch(f, c.grid_dim, c.block_dim, c.h_stream)
}

fn graph_launch(exec: CUgraphExec, stream: CUstream) -> CUresult {
    let s = state();
    if !s.is(exec as u64, |o| *o == Obj::GraphExec) || !s.valid_stream(stream as u64) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    drop(s);
    launch_work();
    CUDA_SUCCESS
}

fn ctx_create(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    if pctx.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let mut s = state();
    if !s.valid_device(dev) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    let c = s.new_object(Obj::Context {
        device: dev,
        primary: false,
    });
    drop(s);
    set_current_ctx(c);
    out!(pctx, c as CUcontext);
    CUDA_SUCCESS
}

/// Creates an object of kind `o` and writes its handle (converted by `make`) to `p`.
fn create<T>(p: *mut T, o: Obj, make: impl FnOnce(u64) -> T) -> CUresult {
    if p.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let h = state().new_object(o);
    out!(p, make(h));
    CUDA_SUCCESS
}

fn destroy(h: u64, f: impl Fn(&Obj) -> bool) -> CUresult {
    let mut s = state();
    if !s.is(h, f) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    s.objects.remove(&h);
    CUDA_SUCCESS
}

fn graph_instantiate(exec: *mut CUgraphExec, graph: CUgraph) -> CUresult {
    if !state().is(graph as u64, |o| *o == Obj::Graph) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    create(exec, Obj::GraphExec, |h| h as CUgraphExec)
}

fn primary_retain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    if pctx.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let mut s = state();
    if !s.valid_device(dev) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    let p = &mut s.primary[dev as usize];
    p.1 += 1;
    let c = p.0;
    drop(s);
    out!(pctx, c as CUcontext);
    CUDA_SUCCESS
}

fn uuid(out: *mut CUuuid, dev: CUdevice) -> CUresult {
    if !state().valid_device(dev) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    let mut bytes = *b"simcuda-device\0\0";
    bytes[15] = dev as u8;
    out!(out, CUuuid { bytes });
    CUDA_SUCCESS
}

fn error_text(err: CUresult, pstr: *mut *const c_char, name: bool) -> CUresult {
    match ERRORS.iter().find(|e| e.0 == err) {
        Some((_, n, s)) => {
            out!(pstr, if name { n.as_ptr() } else { s.as_ptr() });
            CUDA_SUCCESS
        }
        None => {
            // SAFETY: NULL or a valid out-pointer per the API; `put` checks NULL.
            unsafe { put(pstr, std::ptr::null()) };
            CUDA_ERROR_INVALID_VALUE
        }
    }
}

fn proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    if symbol.is_null() || pfn.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: `symbol` is a non-null NUL-terminated C string per the API contract.
    let name = unsafe { CStr::from_ptr(symbol) }.to_string_lossy();
    let found = procaddr::resolve(&name, version, flags, |n| EXPORTED.contains(&n))
        .and_then(|n| export_address(&n));
    out!(pfn, found.unwrap_or(std::ptr::null_mut()));
    let (code, st) = match found {
        Some(_) => (CUDA_SUCCESS, CU_GET_PROC_ADDRESS_SUCCESS),
        None => (CUDA_ERROR_NOT_FOUND, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND),
    };
    // SAFETY: `status` is NULL or a valid out-pointer per the API; `put` checks NULL.
    unsafe { put(status, st) };
    code
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
    // ---- Lifecycle and device information.
    fn cuInit(flags: c_uint) {
        if flags != 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        if config().devices == 0 {
            return CUDA_ERROR_NO_DEVICE;
        }
        set_initialized();
        CUDA_SUCCESS
    }
    fn cuDriverGetVersion(version: *mut c_int) {
        out!(version, config().driver_version);
        CUDA_SUCCESS
    }
    fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) {
        if !state().valid_device(ordinal) {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        out!(device, ordinal);
        CUDA_SUCCESS
    }
    fn cuDeviceGetCount(count: *mut c_int) {
        out!(count, state().devices());
        CUDA_SUCCESS
    }
    fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) {
        if !state().valid_device(dev) {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        if name.is_null() || len <= 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let text = format!("NVIDIA H100 (simcuda {dev})");
        let n = text.len().min(len as usize - 1);
        // SAFETY: `name` is non-null and valid for `len` bytes per the API; `n + 1 <= len`.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), name.cast::<u8>(), n);
            *name.add(n) = 0;
        }
        CUDA_SUCCESS
    }
    fn cuDeviceGetUuid(out: *mut CUuuid, dev: CUdevice) {
        uuid(out, dev)
    }
    fn cuDeviceGetUuid_v2(out: *mut CUuuid, dev: CUdevice) {
        uuid(out, dev)
    }
    fn cuDeviceGetAttribute(pi: *mut c_int, attrib: c_int, dev: CUdevice) {
        if !state().valid_device(dev) {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        if attrib <= 0 || attrib >= DEVICE_ATTRIBUTE_MAX {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let mut v = DEVICE_ATTRIBUTES.iter().find(|a| a.0 == attrib).map_or(0, |a| a.1);
        if attrib == 33 {
            v += dev; // PCI bus id: one bus per device
        }
        out!(pi, v);
        CUDA_SUCCESS
    }
    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) {
        if !state().valid_device(dev) {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        out!(bytes, config().capacity as usize);
        CUDA_SUCCESS
    }
    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) {
        let s = state();
        let d = match s.current_device() {
            Ok(d) => d,
            Err(e) => return e,
        };
        let cap = config().capacity;
        let used = s.used[d as usize];
        drop(s);
        out!(free, cap.saturating_sub(used) as usize);
        out!(total, cap as usize);
        CUDA_SUCCESS
    }
    fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) {
        ctx_create(pctx, dev)
    }
    fn cuCtxCreate_v3(pctx: *mut CUcontext, params: *mut c_void, num_params: c_int, flags: c_uint, dev: CUdevice) {
        if num_params < 0 || (num_params > 0 && params.is_null()) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        ctx_create(pctx, dev)
    }
    fn cuCtxCreate_v4(pctx: *mut CUcontext, params: *mut c_void, flags: c_uint, dev: CUdevice) {
        ctx_create(pctx, dev)
    }
    fn cuCtxDestroy_v2(ctx: CUcontext) {
        let c = ctx as u64;
        let r = destroy(c, |o| matches!(o, Obj::Context { primary: false, .. }));
        if r != CUDA_SUCCESS {
            return CUDA_ERROR_INVALID_CONTEXT;
        }
        if current_ctx() == c {
            set_current_ctx(0);
        }
        CUDA_SUCCESS
    }
    fn cuCtxGetCurrent(pctx: *mut CUcontext) {
        out!(pctx, current_ctx() as CUcontext);
        CUDA_SUCCESS
    }
    fn cuCtxSetCurrent(ctx: CUcontext) {
        let c = ctx as u64;
        if c != 0 && !state().is(c, |o| matches!(o, Obj::Context { .. })) {
            return CUDA_ERROR_INVALID_CONTEXT;
        }
        set_current_ctx(c);
        CUDA_SUCCESS
    }
    fn cuCtxGetDevice(dev: *mut CUdevice) {
        let d = match state().objects.get(&current_ctx()) {
            Some(Obj::Context { device, .. }) => *device,
            _ => return CUDA_ERROR_INVALID_CONTEXT,
        };
        out!(dev, d);
        CUDA_SUCCESS
    }
    fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) {
        primary_retain(pctx, dev)
    }
    fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) {
        let mut s = state();
        if !s.valid_device(dev) {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        let p = &mut s.primary[dev as usize];
        if p.1 == 0 {
            return CUDA_ERROR_INVALID_CONTEXT;
        }
        p.1 -= 1;
        CUDA_SUCCESS
    }
    fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) {
        let mut s = state();
        if !s.valid_device(dev) {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        s.primary[dev as usize].1 = 0;
        CUDA_SUCCESS
    }

    // ---- Streams, events, modules, kernels, graphs.
    fn cuStreamCreate(ph: *mut CUstream, flags: c_uint) {
        create(ph, Obj::Stream, |h| h as CUstream)
    }
    fn cuStreamDestroy_v2(stream: CUstream) {
        destroy(stream as u64, |o| *o == Obj::Stream)
    }
    fn cuStreamQuery(stream: CUstream) {
        if !state().valid_stream(stream as u64) {
            return CUDA_ERROR_INVALID_HANDLE;
        }
        if busy_until() > runtime::now_ns() { CUDA_ERROR_NOT_READY } else { CUDA_SUCCESS }
    }
    fn cuEventCreate(ph: *mut CUevent, flags: c_uint) {
        create(ph, Obj::Event { at_ns: 0 }, |h| h as CUevent)
    }
    fn cuEventRecord(event: CUevent, stream: CUstream) {
        let mut s = state();
        if !s.valid_stream(stream as u64) {
            return CUDA_ERROR_INVALID_HANDLE;
        }
        match s.objects.get_mut(&(event as u64)) {
            Some(Obj::Event { at_ns }) => *at_ns = busy_until(),
            _ => return CUDA_ERROR_INVALID_HANDLE,
        }
        CUDA_SUCCESS
    }
    fn cuEventQuery(event: CUevent) {
        match state().objects.get(&(event as u64)) {
            Some(Obj::Event { at_ns }) if *at_ns > runtime::now_ns() => CUDA_ERROR_NOT_READY,
            Some(Obj::Event { .. }) => CUDA_SUCCESS,
            _ => CUDA_ERROR_INVALID_HANDLE,
        }
    }
    fn cuEventDestroy_v2(event: CUevent) {
        destroy(event as u64, |o| matches!(o, Obj::Event { .. }))
    }
    fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) {
        if image.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        create(module, Obj::Module, |h| h as CUmodule)
    }
    fn cuModuleUnload(module: CUmodule) {
        destroy(module as u64, |o| *o == Obj::Module)
    }
    fn cuModuleGetFunction(func: *mut CUfunction, module: CUmodule, name: *const c_char) {
        if name.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        if !state().is(module as u64, |o| *o == Obj::Module) {
            return CUDA_ERROR_INVALID_HANDLE;
        }
        create(func, Obj::Function, |h| h as CUfunction)
    }
    fn cuLibraryLoadData(
        library: *mut CUlibrary,
        code: *const c_void,
        jit_options: *mut c_int,
        jit_values: *mut *mut c_void,
        num_jit: c_uint,
        lib_options: *mut c_int,
        lib_values: *mut *mut c_void,
        num_lib: c_uint,
    ) {
        if code.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        create(library, Obj::Library, |h| h as CUlibrary)
    }
    fn cuLibraryUnload(library: CUlibrary) {
        destroy(library as u64, |o| *o == Obj::Library)
    }
    fn cuLibraryGetKernel(kernel: *mut CUkernel, library: CUlibrary, name: *const c_char) {
        if name.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        if !state().is(library as u64, |o| *o == Obj::Library) {
            return CUDA_ERROR_INVALID_HANDLE;
        }
        create(kernel, Obj::Kernel, |h| h as CUkernel)
    }
    fn cuKernelGetFunction(func: *mut CUfunction, kernel: CUkernel) {
        if !state().is(kernel as u64, |o| *o == Obj::Kernel) {
            return CUDA_ERROR_INVALID_HANDLE;
        }
        create(func, Obj::Function, |h| h as CUfunction)
    }
    fn cuGraphCreate(graph: *mut CUgraph, flags: c_uint) {
        create(graph, Obj::Graph, |h| h as CUgraph)
    }
    fn cuGraphDestroy(graph: CUgraph) {
        destroy(graph as u64, |o| *o == Obj::Graph)
    }
    fn cuGraphInstantiate(exec: *mut CUgraphExec, graph: CUgraph, error_node: *mut CUgraphNode, log: *mut c_char, log_size: usize) {
        graph_instantiate(exec, graph)
    }
    fn cuGraphInstantiate_v2(exec: *mut CUgraphExec, graph: CUgraph, error_node: *mut CUgraphNode, log: *mut c_char, log_size: usize) {
        graph_instantiate(exec, graph)
    }
    fn cuGraphInstantiateWithFlags(exec: *mut CUgraphExec, graph: CUgraph, flags: u64) {
        graph_instantiate(exec, graph)
    }
    fn cuGraphExecDestroy(exec: CUgraphExec) {
        destroy(exec as u64, |o| *o == Obj::GraphExec)
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
        let r = s.create_physical(prop.location.id, size as u64);
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

    // ---- Synchronisation.
    fn cuStreamSynchronize(stream: CUstream) {
        stream_sync(stream)
    }
    fn cuStreamSynchronize_ptsz(stream: CUstream) {
        stream_sync(stream)
    }
    fn cuCtxSynchronize() {
        sync_device();
        state().release_pools_at_sync();
        CUDA_SUCCESS
    }
    fn cuCtxSynchronize_v2(ctx: CUcontext) {
        sync_device();
        state().release_pools_at_sync();
        CUDA_SUCCESS
    }
    fn cuEventSynchronize(event: CUevent) {
        let at = match state().objects.get(&(event as u64)) {
            Some(Obj::Event { at_ns }) => *at_ns,
            _ => return CUDA_ERROR_INVALID_HANDLE,
        };
        wait_until_ns(at);
        state().release_pools_at_sync();
        CUDA_SUCCESS
    }
    fn cuStreamWaitEvent(stream: CUstream, event: CUevent, flags: c_uint) {
        stream_wait_event(stream, event)
    }
    fn cuStreamWaitEvent_ptsz(stream: CUstream, event: CUevent, flags: c_uint) {
        stream_wait_event(stream, event)
    }

    // ---- Copies.
    fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) {
        copy(Mem::Any(dst), Mem::Any(src), n, None)
    }
    fn cuMemcpy_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize) {
        copy(Mem::Any(dst), Mem::Any(src), n, None)
    }
    fn cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream) {
        copy(Mem::Any(dst), Mem::Any(src), n, Some(stream))
    }
    fn cuMemcpyAsync_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream) {
        copy(Mem::Any(dst), Mem::Any(src), n, Some(stream))
    }
    fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, n: usize) {
        copy(Mem::Device(dst), Mem::Host(src), n, None)
    }
    fn cuMemcpyHtoD_v2_ptds(dst: CUdeviceptr, src: *const c_void, n: usize) {
        copy(Mem::Device(dst), Mem::Host(src), n, None)
    }
    fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) {
        copy(Mem::Host(dst), Mem::Device(src), n, None)
    }
    fn cuMemcpyDtoH_v2_ptds(dst: *mut c_void, src: CUdeviceptr, n: usize) {
        copy(Mem::Host(dst), Mem::Device(src), n, None)
    }
    fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) {
        copy(Mem::Device(dst), Mem::Device(src), n, None)
    }
    fn cuMemcpyDtoD_v2_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize) {
        copy(Mem::Device(dst), Mem::Device(src), n, None)
    }
    fn cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, n: usize, stream: CUstream) {
        copy(Mem::Device(dst), Mem::Host(src), n, Some(stream))
    }
    fn cuMemcpyHtoDAsync_v2_ptsz(dst: CUdeviceptr, src: *const c_void, n: usize, stream: CUstream) {
        copy(Mem::Device(dst), Mem::Host(src), n, Some(stream))
    }
    fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, n: usize, stream: CUstream) {
        copy(Mem::Host(dst), Mem::Device(src), n, Some(stream))
    }
    fn cuMemcpyDtoHAsync_v2_ptsz(dst: *mut c_void, src: CUdeviceptr, n: usize, stream: CUstream) {
        copy(Mem::Host(dst), Mem::Device(src), n, Some(stream))
    }
    fn cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream) {
        copy(Mem::Device(dst), Mem::Device(src), n, Some(stream))
    }
    fn cuMemcpyDtoDAsync_v2_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream) {
        copy(Mem::Device(dst), Mem::Device(src), n, Some(stream))
    }
    fn cuMemcpyPeer(dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr, src_ctx: CUcontext, n: usize) {
        copy_peer(dst, dst_ctx, src, src_ctx, n, None)
    }
    fn cuMemcpyPeerAsync(dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr, src_ctx: CUcontext, n: usize, stream: CUstream) {
        copy_peer(dst, dst_ctx, src, src_ctx, n, Some(stream))
    }

    fn cuMemcpyPeer_ptds(dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr, src_ctx: CUcontext, n: usize) {
        copy_peer(dst, dst_ctx, src, src_ctx, n, None)
    }
    fn cuMemcpyPeerAsync_ptsz(dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr, src_ctx: CUcontext, n: usize, stream: CUstream) {
        copy_peer(dst, dst_ctx, src, src_ctx, n, Some(stream))
    }
    fn cuMemcpyBatchAsync(
        dsts: *mut CUdeviceptr, srcs: *mut CUdeviceptr, sizes: *mut usize, count: usize,
        attrs: *mut c_void, attrs_idxs: *mut usize, num_attrs: usize, fail_idx: *mut usize, stream: CUstream,
    ) {
        batch_copy(dsts, srcs, sizes, count, fail_idx, stream)
    }
    fn cuMemcpyBatchAsync_ptsz(
        dsts: *mut CUdeviceptr, srcs: *mut CUdeviceptr, sizes: *mut usize, count: usize,
        attrs: *mut c_void, attrs_idxs: *mut usize, num_attrs: usize, fail_idx: *mut usize, stream: CUstream,
    ) {
        batch_copy(dsts, srcs, sizes, count, fail_idx, stream)
    }
    fn cuMemcpyBatchAsync_v2(
        dsts: *mut CUdeviceptr, srcs: *mut CUdeviceptr, sizes: *mut usize, count: usize,
        attrs: *mut c_void, attrs_idxs: *mut usize, num_attrs: usize, stream: CUstream,
    ) {
        batch_copy(dsts, srcs, sizes, count, std::ptr::null_mut(), stream)
    }
    fn cuMemcpyBatchAsync_v2_ptsz(
        dsts: *mut CUdeviceptr, srcs: *mut CUdeviceptr, sizes: *mut usize, count: usize,
        attrs: *mut c_void, attrs_idxs: *mut usize, num_attrs: usize, stream: CUstream,
    ) {
        batch_copy(dsts, srcs, sizes, count, std::ptr::null_mut(), stream)
    }

    // ---- Launches.
    fn cuLaunchHostFunc(stream: CUstream, func: *mut c_void, user_data: *mut c_void) {
        host_func(func, user_data)
    }
    fn cuLaunchHostFunc_ptsz(stream: CUstream, func: *mut c_void, user_data: *mut c_void) {
        host_func(func, user_data)
    }
    fn cuLaunchKernel(
        f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared_mem: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void,
    ) {
        launch(f, [gx, gy, gz], [bx, by, bz], stream)
    }
    fn cuLaunchKernel_ptsz(
        f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared_mem: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void,
    ) {
        launch(f, [gx, gy, gz], [bx, by, bz], stream)
    }
    fn cuLaunchKernelEx(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) {
        launch_ex(config, f)
    }
    fn cuLaunchKernelEx_ptsz(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) {
        launch_ex(config, f)
    }
    fn cuLaunchCooperativeKernel(
        f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared_mem: c_uint, stream: CUstream, params: *mut *mut c_void,
    ) {
        launch(f, [gx, gy, gz], [bx, by, bz], stream)
    }
    fn cuLaunchCooperativeKernel_ptsz(
        f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared_mem: c_uint, stream: CUstream, params: *mut *mut c_void,
    ) {
        launch(f, [gx, gy, gz], [bx, by, bz], stream)
    }
    fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) {
        graph_launch(exec, stream)
    }
    fn cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream) {
        graph_launch(exec, stream)
    }

    // ---- Errors and symbol lookup.
    fn cuGetErrorString(error: CUresult, pstr: *mut *const c_char) {
        error_text(error, pstr, false)
    }
    fn cuGetErrorName(error: CUresult, pstr: *mut *const c_char) {
        error_text(error, pstr, true)
    }
    fn cuGetExportTable(table: *mut *const c_void, id: *const CUuuid) {
        CUDA_ERROR_NOT_SUPPORTED
    }
    fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: cuuint64_t) {
        proc_address(symbol, pfn, cuda_version, flags, std::ptr::null_mut())
    }
    fn cuGetProcAddress_v2(
        symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: cuuint64_t, status: *mut c_int,
    ) {
        proc_address(symbol, pfn, cuda_version, flags, status)
    }
}

/// Not a driver API: the duration of this thread's last call of a symbol that sweeps
/// (`SIMCUDA_SWEEP`), ns, for benchmarks that subtract the driver's time from a call's.
// SAFETY: an exported name no driver or other library of the process defines (`simcuda_`).
#[unsafe(no_mangle)]
pub extern "C" fn simcuda_last_call_ns() -> u64 {
    runtime::last_call_ns()
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_common::api::APIS;

    #[test]
    fn every_traced_api_is_exported() {
        // NCCL entry points live in libnccl, not in the driver.
        for a in APIS.iter().filter(|a| !a.kind.is_nccl()) {
            assert!(EXPORTED.contains(&a.name), "{} is not exported", a.name);
        }
    }

    #[test]
    fn export_addresses_are_distinct() {
        let mut addrs: Vec<usize> = EXPORTED
            .iter()
            .map(|n| export_address(n).unwrap() as usize)
            .collect();
        addrs.sort();
        addrs.dedup();
        assert_eq!(addrs.len(), EXPORTED.len());
    }
}

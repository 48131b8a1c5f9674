//! Entry points for streams, events, modules, kernels and graphs, for synchronisation and for
//! launches (kernels, host functions, graphs).

use crate::runtime::{
    self, Sym, busy_until, kernel_ns, launch_work, launch_work_ns, sync_device, wait_until_ns,
};
use crate::state::{Obj, state};
use crate::types::*;
use crate::{create, destroy, get, put};
use std::ffi::{c_char, c_int, c_uint, c_void};

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
    let ns = kernel_ns(s.names.get(&(f as u64)).map(|n| n.to_bytes()));
    drop(s);
    if grid.contains(&0)
        || block.contains(&0)
        || block.iter().map(|b| *b as u64).product::<u64>() > 1024
    {
        return CUDA_ERROR_INVALID_VALUE;
    }
    launch_work_ns(ns);
    CUDA_SUCCESS
}

/// `cuFuncGetName` and `cuKernelGetName`: the name the function or kernel was loaded by.
fn get_name(out: *mut *const c_char, h: u64) -> CUresult {
    let s = state();
    let Some(name) = s.names.get(&h) else {
        return CUDA_ERROR_INVALID_HANDLE;
    };
    // The name lives as long as the handle's entry (the driver's names live as long as the
    // module).
    out!(out, name.as_ptr());
    CUDA_SUCCESS
}

/// Records an event: the device reaches it when all work launched before it has finished, or
/// at once when the device is idle.
fn event_record(event: CUevent, stream: CUstream) -> CUresult {
    let mut s = state();
    if !s.valid_stream(stream as u64) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    let at = runtime::event_reached_ns().max(runtime::now_ns()).max(1);
    match s.objects.get_mut(&(event as u64)) {
        Some(Obj::Event { at_ns }) => *at_ns = at,
        _ => return CUDA_ERROR_INVALID_HANDLE,
    }
    CUDA_SUCCESS
}

thread_local! {
    /// The thread's stream-capture mode (`cuThreadExchangeStreamCaptureMode`; 0: global).
    static CAPTURE_MODE: std::cell::Cell<c_int> = const { std::cell::Cell::new(0) };
}

/// Creates a function or kernel named by the caller's NUL-terminated `name`.
fn named<T>(p: *mut T, o: Obj, name: *const c_char, make: impl FnOnce(u64) -> T) -> CUresult {
    if p.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the caller checked `name` for NULL; the API contract makes it NUL-terminated.
    let name = unsafe { std::ffi::CStr::from_ptr(name) }.to_owned();
    let mut s = state();
    let h = s.new_object(o);
    s.names.insert(h, name);
    drop(s);
    out!(p, make(h));
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

fn graph_instantiate(exec: *mut CUgraphExec, graph: CUgraph) -> CUresult {
    if !state().is(graph as u64, |o| *o == Obj::Graph) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    create(exec, Obj::GraphExec, |h| h as CUgraphExec)
}

exports! {
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
        event_record(event, stream)
    }
    fn cuEventRecord_ptsz(event: CUevent, stream: CUstream) {
        event_record(event, stream)
    }
    fn cuEventElapsedTime(ms: *mut f32, start: CUevent, end: CUevent) {
        let s = state();
        let at = |e: CUevent| match s.objects.get(&(e as u64)) {
            Some(Obj::Event { at_ns }) if *at_ns != 0 => Ok(*at_ns),
            _ => Err(CUDA_ERROR_INVALID_HANDLE),
        };
        let (a, b) = match (at(start), at(end)) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => return e,
        };
        drop(s);
        if a.max(b) > runtime::now_ns() {
            return CUDA_ERROR_NOT_READY;
        }
        out!(ms, (b as f64 - a as f64) as f32 / 1e6);
        CUDA_SUCCESS
    }
    fn cuFuncGetName(name: *mut *const c_char, func: CUfunction) {
        get_name(name, func as u64)
    }
    fn cuKernelGetName(name: *mut *const c_char, kernel: CUkernel) {
        get_name(name, kernel as u64)
    }
    fn cuStreamIsCapturing(stream: CUstream, status: *mut c_int) {
        if !state().valid_stream(stream as u64) {
            return CUDA_ERROR_INVALID_HANDLE;
        }
        out!(status, 0);
        CUDA_SUCCESS
    }
    fn cuThreadExchangeStreamCaptureMode(mode: *mut c_int) {
        let wanted = input!(mode.cast_const());
        let previous = CAPTURE_MODE.with(|m| m.replace(wanted));
        out!(mode, previous);
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
        named(func, Obj::Function, name, |h| h as CUfunction)
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
        named(kernel, Obj::Kernel, name, |h| h as CUkernel)
    }
    fn cuKernelGetFunction(func: *mut CUfunction, kernel: CUkernel) {
        let name = match state().names.get(&(kernel as u64)) {
            Some(n) => n.clone(),
            None => return CUDA_ERROR_INVALID_HANDLE,
        };
        named(func, Obj::Function, name.as_ptr(), |h| h as CUfunction)
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
}

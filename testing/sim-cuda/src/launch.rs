//! Entry points for streams, events, modules, kernels and graphs, for synchronisation and for
//! launches (kernels, host functions, graphs).

use crate::runtime::{self, Sym, busy_until, launch_work, sync_device, wait_until_ns};
use crate::state::{Obj, state};
use crate::types::*;
use crate::{create, destroy, get};
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

//! The vgpu-agent limiter: a library preloaded into GPU containers (`LD_PRELOAD` or
//! `/etc/ld.so.preload`) that intercepts the CUDA driver API, enforces per-device memory limits and
//! SM shares, and records per-call accounting. A drop-in replacement for HAMi-core's `libvgpu.so`;
//! see `limiter/README.md` for the configuration.
//!
//! The logic lives in `limiter_core` (its own crate, below all of these): configuration,
//! accounting, the allocation and pool tables, the SM controller, without `unsafe`, statics or
//! system calls.
//!
//! # Layers
//!
//! Lowest first; a module imports modules of its own layer and of the layers below, and no
//! import cycle forms among modules (`cargo xtask layers` checks both).
//!
//! 1. platform: `platform`. The machine, the C library and the driver's and NVML's symbol
//!    tables: thread words, clock, log, guards. No process-wide state.
//! 2. runtime: `runtime`. The process-wide state, in one static reached one way
//!    (`runtime::get`): the state, this process's accounting and its ledger, the control block,
//!    the SM feedback thread, the in-process freeze (its gate and watcher thread).
//! 3. hints: `hints`. The cache hints of the allocation and free paths, in one place.
//! 4. hooks: `hooks`. The exported hooks and the `dlsym` override; each hook's common path reads
//!    as reserve, call, keep or return, record.
//!
//! Nothing runs at load time: no constructor, no thread, no file. The first intercepted CUDA call
//! initialises everything.

#![warn(unreachable_pub)]

#[macro_use]
mod platform;
mod hints;
mod hooks;
mod runtime;
#[cfg(test)]
mod test_support;

//! Types shared by the eBPF programs (`no_std`, `bpfel-unknown-none`), the agent, the region and the
//! limiter. Everything here is plain data with a fixed layout: it crosses the kernel boundary.
//!
//! # Layers
//!
//! Lowest first; a module imports modules of its own layer and of the layers below, and no
//! import cycle forms among modules (`cargo xtask layers` checks both).
//!
//! 1. base: `api`, `hist`. The table of traced entry points (ids, kinds, where their arguments
//!    are, NCCL's communicator ids) and the log2 latency histogram.
//! 2. maps: `maps`. The keys and values of the eBPF maps, shared by the probes and the agent.
#![no_std]

pub mod api;
pub mod hist;
pub mod maps;

/// Devices a container's limits and region hold, indexed as the limiter's CUDA devices (as
/// HAMi-core's `CUDA_DEVICE_MAX_COUNT`, and its per-device variables `_0` ..= `_15`).
pub const MAX_DEVICES: usize = 16;

pub use api::{API_COUNT, ApiId, ApiKind, ApiSpec, MemEffect, ProbeCookie};

//! Types shared by the eBPF programs (`no_std`, `bpfel-unknown-none`), the agent, the region and the
//! limiter. Everything here is plain data with a fixed layout: it crosses the kernel boundary.
#![no_std]

pub mod api;
pub mod hist;
pub mod maps;

/// Devices a container's limits and region hold, indexed as the limiter's CUDA devices (as
/// HAMi-core's `CUDA_DEVICE_MAX_COUNT`, and its per-device variables `_0` ..= `_15`).
pub const MAX_DEVICES: usize = 16;

pub use api::{API_COUNT, ApiId, ApiKind, ApiSpec, MemEffect, ProbeCookie};

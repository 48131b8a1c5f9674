//! Types shared by the eBPF programs (`no_std`, `bpfel-unknown-none`), the agent, the region and the
//! limiter. Everything here is plain data with a fixed layout: it crosses the kernel boundary.
#![no_std]

pub mod api;
pub mod hist;
pub mod maps;

pub use api::{API_COUNT, ApiId, ApiKind, ApiSpec, MemEffect, ProbeCookie};

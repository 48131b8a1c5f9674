//! The limiter's logic, apart from everything that touches the process: no `unsafe`, no statics,
//! no system calls. The preloaded library (`limiter/`) holds the one instance of each piece and
//! feeds it the driver's answers; here each piece is a plain value that tests build, drive and
//! check, also under miri (`cargo +nightly-2026-08-01 miri test -p limiter-core`).
//!
//! - [`config`]: HAMi-core's environment variables, parsed from `(name, value)` pairs.
//! - [`accounting`]: what an accounting backend offers the hooks ([`accounting::Accounting`]), the
//!   in-process backend, and what a call records.
//! - [`charge`]: what an allocation is charged (granularity, pitched allocations) and the
//!   once-per-device context charge.
//! - [`alloc_table`]: the live allocations (address or handle to charge), lock-free on the common
//!   path.
//! - [`pools`]: what each stream-ordered pool is charged, settled against the driver's reserved
//!   size.
//! - [`info`]: memory information as the limit shows it (`cuMemGetInfo`, NVML).
//! - [`freeze`]: which idle containers to freeze and when to thaw them, under a host-memory
//!   budget (docs/oversubscription.md).
//! - [`oom_wait`]: the schedule of an allocation waiting for device memory (`VGPU_OOM_WAIT`).
//! - [`gate`]: the in-process freeze's gate, which counts the calls in flight (model-checked
//!   with loom).
//! - [`gpu_time`]: which launches are timed on the GPU with event pairs, read back without waiting.
//! - [`sm`]: the SM share's duty cycle per device and its correction law from NVML's
//!   measurements ([`sm::feedback`]).
//!
//! # Layers
//!
//! Lowest first; a module imports modules of its own layer and of the layers below, and no
//! import cycle forms among modules (`cargo xtask layers` checks both).
//!
//! 1. inputs: `gpu_time`, `qos`, `config`. The GPU-time sampler, the QoS tiers and their
//!    allocation of a shared device, and the configuration read from the environment.
//! 2. control: `accounting`, `sm`, `oom_wait`, `freeze`, `gate`. Accounting against the limits,
//!    the SM share controller, the wait for device memory, the freeze decisions and the
//!    in-process freeze's gate.
//! 3. charges: `charge`, `info`, `pools`, `alloc_table`. Context charges, memory information under
//!    the limit, pools and the allocation table.

#![forbid(unsafe_code)]

pub mod accounting;
pub mod alloc_table;
pub mod charge;
pub mod config;
pub mod freeze;
pub mod gate;
pub mod gpu_time;
pub mod info;
pub mod oom_wait;
pub mod pools;
pub mod qos;
pub mod sm;

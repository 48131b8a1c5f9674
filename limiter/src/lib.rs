//! The vgpu-agent limiter: a library preloaded into GPU containers (`LD_PRELOAD` or
//! `/etc/ld.so.preload`) that intercepts the CUDA driver API, enforces per-device memory limits and
//! records per-call accounting. A drop-in replacement for HAMi-core's `libvgpu.so`; see
//! `limiter/README.md` for the configuration.
//!
//! Module map:
//! - [`real_driver`]: finds glibc's `dlsym` and the real libcuda; holds the real function pointers.
//! - [`dlsym`]: the `dlsym` override that hands out hooks for lookups through libcuda's handle.
//! - [`hooks`]: the exported hooks (memory, launch, information, `cuGetProcAddress`, `cuInit`);
//!   [`nvml`]: NVML's memory information under the limit.
//! - [`guard`]: re-entrancy and panic guards; [`thread_words`]: the per-thread words hooks read; [`state`]: lazy process-wide state;
//!   [`config`]: environment parsing; [`log`]: stderr diagnostics without allocation; [`cuda`]:
//!   the `cuda.h` subset; [`clock`]: the hooks' clock.
//! - Cold calls: [`hot`] (the line of statics every hook reads first), [`entry_lines`] and
//!   [`wake_lines`] (what an allocation or free prefetches on entry and after its driver call).
//! - [`accounting`]: the accounting boundary and the in-process backend; [`shared`]: the region
//!   backend with per-thread shards; [`process`]: per-process accounting, fork and exit;
//!   [`pools`]: stream-ordered pool charges.
//! - [`sm`]: the SM share controller on the launch path; [`control`]: run-time limit changes from
//!   the control block beside the region.
//!
//! Nothing runs at load time: no constructor, no thread, no file. The first intercepted CUDA call
//! initialises everything.

pub mod accounting;
pub mod alloc_table;
pub mod clock;
pub mod config;
pub mod control;
pub mod cuda;
#[macro_use]
pub mod direct;
pub mod dlsym;
pub mod entry_lines;
pub mod guard;
pub mod hooks;
pub mod hot;
pub mod log;
pub mod nvml;
pub mod pools;
pub mod process;
pub mod real_driver;
pub mod shared;
pub mod sm;
pub mod sm_feedback;
pub mod state;
pub mod thread_words;
pub mod wake_lines;

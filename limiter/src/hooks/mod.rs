//! The hooks layer: one `extern "C"` function per hooked driver symbol and ABI variant, each
//! forwarding to the real function of exactly the same name, and the `dlsym` override.
//!
//! - [`gate`]: how every hook starts (re-entry, failure or the limiter's logic) and records.
//! - [`memory`]: allocations and frees, exact enforcement; [`info`]: memory information under
//!   the limit; [`launch`]: kernel and graph launches, counted, timed and paced; [`init`]:
//!   `cuInit`; [`context`]: context creation, where the context's memory is charged; [`timed`]:
//!   synchronisations, copies and host functions, counted and timed; [`passed`]: memsets and
//!   2D/3D copies, passed on (a frozen container's next one asks for its thaw).
//! - [`nvml`]: NVML's memory information and process list under the limit.
//! - [`lookup`]: the table of our hooks and `cuGetProcAddress`, which hands them out;
//!   [`dlsym`]: the `dlsym` override, which hands them out too.

pub(crate) mod context;
pub(crate) mod dlsym;
pub(crate) mod gate;
pub(crate) mod info;
pub(crate) mod init;
pub(crate) mod launch;
pub(crate) mod lookup;
pub(crate) mod memory;
pub(crate) mod nvml;
pub(crate) mod passed;
pub(crate) mod timed;

//! The platform layer: everything the limiter asks of the machine, the C library and the
//! driver's symbol tables, and nothing of the limiter above it (it imports only
//! `limiter_core`). No process-wide state lives here: what must be kept for the life of the
//! process (the bound driver, glibc's `dlsym`, the thread words' offset) is owned by the runtime,
//! which hands it in.
//!
//! - [`cuda`]: the `cuda.h` subset the hooks need.
//! - [`driver`]: the driver's symbol table ([`driver::Sym`], [`driver::Driver`]), glibc's
//!   `dlsym`, and the driver queries the limiter's logic makes (current device, pools, SM
//!   drain).
//! - [`nvml`]: NVML's symbol table and types, the NVML-to-CUDA device mapping and the
//!   per-process utilisation sampler.
//! - [`thread_words`]: the per-thread words (initial-exec TLS) every hook reads.
//! - [`guard`]: re-entrancy and panic guards.
//! - [`clock`]: the hooks' clock (`rdtsc`, calibrated lazily).
//! - [`log`]: stderr diagnostics without allocation.
//! - [`os`]: process identity and the fork and exit handlers.
//! - [`direct`]: PC-relative addresses of the runtime's static.
//! - [`vmm`]: the driver calls of the in-process freeze (virtual memory, copies, contexts).
//! - [`host_memory`]: the host memory it saves into (huge pages, populated by threads,
//!   registered with the driver).
//! - [`freeze_pool`]: host memory borrowed from the agent's freeze pool instead (its Unix
//!   socket, the chunks mapped and registered).

pub(crate) mod clock;
pub(crate) mod cuda;
#[macro_use]
pub(crate) mod direct;
pub(crate) mod driver;
pub(crate) mod freeze_pool;
pub(crate) mod guard;
pub(crate) mod host_memory;
pub(crate) mod log;
pub(crate) mod nvml;
pub(crate) mod os;
pub(crate) mod thread_words;
pub(crate) mod vmm;

//! Who a process is: its cgroup (from the id eBPF reports, or `/proc/<pid>/cgroup`), the
//! container and pod that cgroup belongs to, the names the runtime gives them, and the facts
//! that tell two processes with the same pid apart (start time).

pub mod cgroup;
pub mod container;
mod docker_api;
mod names;
pub mod process;
pub mod runtime_names;

pub use cgroup::CgroupIndex;
pub use process::ProcessFacts;

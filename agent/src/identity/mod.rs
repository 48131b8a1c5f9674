//! Who a process is: its cgroup (from the id eBPF reports, or `/proc/<pid>/cgroup`) and the facts
//! that tell two processes with the same pid apart (start time).

pub mod cgroup;
pub mod process;

pub use cgroup::CgroupIndex;
pub use process::ProcessFacts;

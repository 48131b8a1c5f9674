//! The agent's raw calls into libc, each behind a typed safe function with its `// SAFETY:`
//! argument here. Nothing else in the agent calls libc functions directly (`cargo xtask layers`
//! checks that; the layer table in src/main.rs puts this module at the bottom). The system calls
//! `rustix` makes safe (the mount API, `fallocate`, `sendmsg` with descriptors) are wrapped here
//! too, so that the agent's system calls stay in one place.

pub mod clock;
pub mod errno;
pub mod fd;
pub mod limits;
pub mod process;
pub mod socket;
pub mod tmpfs;

//! The agent's raw calls into libc, each behind a typed safe function with its `// SAFETY:`
//! argument here. Nothing else in the agent calls libc functions directly (the layer test in
//! `layers_test` (src/main.rs) lists this module at the bottom of the layers).

pub mod clock;
pub mod errno;
pub mod fd;
pub mod limits;
pub mod process;
pub mod socket;

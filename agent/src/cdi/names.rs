//! Names the `cdi` commands share: the files they install on the node, and the device syntax
//! their messages show.

/// The limiter's file name in the host's library directory.
pub const LIMITER_FILE: &str = "libvgpu_limiter.so";
/// The preload list's file name in the host's library directory: one line, the limiter's path
/// inside the container.
pub const PRELOAD_FILE: &str = "ld.so.preload";

/// The device syntax, for messages.
pub const PROFILE_SYNTAX: &str =
    "NAME:mem=SIZE[,sm=PERCENT][,tier=TIER][,guarantee=PERCENT] (e.g. small:mem=4g,sm=25)";

//! `cuInit`: the usual first CUDA call, so the usual place where the limiter initialises and where a
//! configuration error first shows.

use std::ffi::c_uint;

use super::gate::passthrough;
use crate::platform::{
    cuda::CUresult,
    driver::{PfnInit, sym},
};

/// # Safety
/// The caller follows the contract of the driver's `cuInit`.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuInit(flags: c_uint) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the real `cuInit`.
    passthrough::<sym::Init>(|real: PfnInit| unsafe { real(flags) })
}

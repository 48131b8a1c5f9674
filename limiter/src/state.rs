//! The limiter's process-wide state, created by the first intercepted CUDA call and never before.
//!
//! Initialisation reads the configuration, binds the real driver and sets up accounting. If either
//! fails, one message goes to stderr and every intercepted call from then on returns
//! `CUDA_ERROR_NOT_INITIALIZED` without reaching the driver: a malformed limit must not run
//! unlimited. `CUDA_ERROR_NOT_INITIALIZED` was chosen over `CUDA_ERROR_INVALID_VALUE` because it
//! is what the driver itself answers before a successful `cuInit`: runtimes and frameworks report
//! "CUDA unavailable / initialisation error" instead of blaming an argument of some later call.

use std::sync::OnceLock;

use agent_common::api::ApiId;

use crate::{
    accounting::{AllocTable, Backend},
    config::Config,
    cuda::{CUDA_ERROR_NOT_INITIALIZED, CUresult},
    guard::Reentry,
    log,
    real_driver::{self, Driver, Sym},
};

/// An id that no API has: records against it are dropped by the backend's bounds check.
const NO_API: ApiId = ApiId(u16::MAX);

#[derive(Debug)]
pub struct State {
    pub config: Config,
    pub driver: &'static Driver,
    pub ledger: Backend,
    /// Live allocations by device address.
    pub ptrs: AllocTable,
    /// Live `cuMemCreate` allocations by handle.
    pub handles: AllocTable,
    apis: [ApiId; Sym::COUNT],
}

impl State {
    /// The shared API id of a hooked symbol.
    #[inline]
    pub fn api(&self, sym: Sym) -> ApiId {
        self.apis[sym as usize]
    }
}

static STATE: OnceLock<Result<State, CUresult>> = OnceLock::new();

/// The state, initialised by the first caller. The guard proves the caller is inside the limiter,
/// so that a hooked call made by the driver while it loads on this thread does not re-enter here.
#[inline]
pub fn get(guard: &Reentry) -> Result<&'static State, CUresult> {
    match STATE.get() {
        Some(s) => s.as_ref().map_err(|&c| c),
        None => STATE.get_or_init(|| init(guard)).as_ref().map_err(|&c| c),
    }
}

/// The state if initialised successfully, without initialising it.
pub fn ready() -> Option<&'static State> {
    STATE.get().and_then(|s| s.as_ref().ok())
}

fn init(guard: &Reentry) -> Result<State, CUresult> {
    let config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            log::emit(
                log::Level::Error,
                format_args!(
                    "configuration error: {e}; every CUDA call will fail with CUDA_ERROR_NOT_INITIALIZED"
                ),
            );
            return Err(CUDA_ERROR_NOT_INITIALIZED);
        }
    };
    log::set_level(config.log_level);
    let driver = match real_driver::bind(guard) {
        Ok(d) => d,
        Err(e) => {
            log::emit(
                log::Level::Error,
                format_args!("{e}; every CUDA call will fail with CUDA_ERROR_NOT_INITIALIZED"),
            );
            return Err(CUDA_ERROR_NOT_INITIALIZED);
        }
    };
    let apis = std::array::from_fn(|i| {
        let name = Sym::ALL[i].name().to_str().unwrap_or_default();
        ApiId::from_name(name).unwrap_or(NO_API)
    });
    log::debug!("initialised: memory limits {:?}", config.memory_limit);
    Ok(State {
        ledger: Backend::new(&config),
        config,
        driver,
        ptrs: AllocTable::default(),
        handles: AllocTable::default(),
        apis,
    })
}

#[cfg(test)]
mod tests {
    use agent_common::api::ApiId;

    use crate::real_driver::Sym;

    /// Every hooked symbol has an id in the shared API table (append missing ones there).
    #[test]
    fn hooked_symbols_have_api_ids() {
        for &s in Sym::ALL.iter().filter(|s| s.hooked()) {
            let name = s.name().to_str().unwrap();
            assert!(
                ApiId::from_name(name).is_some(),
                "{name} is missing from agent_common::api::APIS"
            );
        }
    }
}

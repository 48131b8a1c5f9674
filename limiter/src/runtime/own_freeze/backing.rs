//! The allocations the limiter backs itself: `cuMemAlloc` of at least [`MIN_BACKED`] bytes,
//! made with the virtual memory API (an address range reserved for the allocation's life, and
//! physical memory mapped into it) so that a freeze can copy the memory out, release the
//! physical memory and, at the thaw, map new physical memory at the same addresses and copy it
//! back: the application's pointers (in its tensors, kernels' arguments, captured graphs) stay
//! valid.
//!
//! Smaller allocations are left to the driver (it packs them into shared pages; backing each
//! with its own granule would multiply their footprint) and stay on the GPU while frozen, as
//! the CUDA context does. Allocations and frees are not the hot path (a caching allocator makes
//! a few per second at most): one mutex guards the table.

use std::{
    collections::BTreeMap,
    sync::{
        Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
};

use crate::platform::{
    cuda::{CUcontext, CUdevice, CUdeviceptr},
    driver::Driver,
    host_memory::HostBuffer,
    vmm::Code,
};

/// The smallest allocation backed: one granule of the virtual memory API on every current GPU.
pub(crate) const MIN_BACKED: u64 = 2 << 20;

/// One backed allocation.
#[derive(Debug)]
pub(crate) struct Backed {
    /// Bytes reserved and mapped (the request rounded up to the granularity).
    pub(crate) size: u64,
    pub(crate) device: CUdevice,
    /// The context it was made in (the freeze's copies run there).
    pub(crate) context: usize,
    /// Its physical memory while on the GPU; 0 while frozen.
    pub(crate) handle: u64,
    /// Where a freeze saved it; `None` while on the GPU.
    pub(crate) saved: Option<Saved>,
}

/// Where a frozen allocation's copy is.
#[derive(Debug)]
pub(crate) enum Saved {
    /// Registered host memory of the process's own.
    Own(HostBuffer),
    /// At this offset of the loan from the agent's freeze pool that the process holds while
    /// frozen (`OwnFreeze`'s; never outside a freeze: a thaw that keeps a copy moves it to host
    /// memory of its own first).
    Pool { offset: u64 },
}

/// Every backed allocation of the process, by address.
#[derive(Debug, Default)]
pub(crate) struct Backing {
    table: Mutex<BTreeMap<CUdeviceptr, Backed>>,
    /// Bytes backed now (the sum of the table's sizes): published in the slot.
    bytes: AtomicU64,
    /// Allocations in the table: a free looks at the table only when some exist.
    count: AtomicU64,
}

impl Backing {
    /// Bytes backed now.
    pub(crate) fn bytes(&self) -> u64 {
        // Relaxed: a figure.
        self.bytes.load(Ordering::Relaxed)
    }

    /// Allocates `size` bytes on the current context's device, backed: returns the address.
    pub(crate) fn allocate(&self, driver: &Driver, size: u64) -> Result<CUdeviceptr, Code> {
        let context = driver.current_context();
        let device = CUdevice::try_from(
            driver
                .context_device()
                .ok_or(crate::platform::cuda::CUDA_ERROR_INVALID_CONTEXT)?,
        )
        .map_err(|_| crate::platform::cuda::CUDA_ERROR_INVALID_CONTEXT)?;
        let granularity = driver.vmm_granularity(device)?.max(1);
        let size = size.div_ceil(granularity).saturating_mul(granularity);
        let ptr = driver.vmm_reserve(size, granularity)?;
        let handle = match driver.vmm_create(device, size) {
            Ok(h) => h,
            Err(e) => {
                let _ = driver.vmm_address_free(ptr, size);
                return Err(e);
            }
        };
        if let Err(e) = driver.vmm_map(ptr, size, handle, device) {
            let _ = driver.vmm_release(handle);
            let _ = driver.vmm_address_free(ptr, size);
            return Err(e);
        }
        let backed = Backed {
            size,
            device,
            context: context as usize,
            handle,
            saved: None,
        };
        self.lock().insert(ptr, backed);
        // Relaxed: figures; the table's mutex orders the allocation's own state.
        self.bytes.fetch_add(size, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        Ok(ptr)
    }

    /// Frees `ptr` if it is backed (`None`: not one of ours, the driver frees it). The work
    /// queued before the free completes first, as `cuMemFree` lets it.
    pub(crate) fn free(&self, driver: &Driver, ptr: CUdeviceptr) -> Option<Result<(), Code>> {
        // Relaxed: a hint; an allocation made by this thread is in the table under its mutex.
        if self.count.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let backed = self.lock().remove(&ptr)?;
        self.bytes.fetch_sub(backed.size, Ordering::Relaxed);
        self.count.fetch_sub(1, Ordering::Relaxed);
        let r = driver.with_context(backed.context as CUcontext, || {
            driver.synchronize_checked()?;
            if backed.handle != 0 {
                driver.vmm_unmap(ptr, backed.size)?;
                driver.vmm_release(backed.handle)?;
            }
            driver.vmm_address_free(ptr, backed.size)
        });
        if let Some(Saved::Own(saved)) = backed.saved {
            saved.release(driver);
        }
        Some(r)
    }

    /// Forgets every allocation without a driver call (a forked child: they are its parent's).
    pub(crate) fn forget_all(&self) {
        self.lock().clear();
        // Relaxed: figures, reset with the table.
        self.bytes.store(0, Ordering::Relaxed);
        self.count.store(0, Ordering::Relaxed);
    }

    /// Runs `f` over the table, locked.
    pub(crate) fn with_table<T>(
        &self,
        f: impl FnOnce(&mut BTreeMap<CUdeviceptr, Backed>) -> T,
    ) -> T {
        f(&mut self.lock())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<CUdeviceptr, Backed>> {
        // A panic while the table was held left it consistent (each entry is written whole).
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

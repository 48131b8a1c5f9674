//! Memory information as the limit shows it: a limited device reports its limit as its total and
//! what is left of the limit as free, so frameworks size their caches to the limit. Free is what
//! can still be allocated: the context charge ([`crate::charge::ContextCharges`]) is held from the
//! moment the context exists, and a charge not yet held (refused: the limit has no room for it)
//! is taken off free too, since the first allocation would have to reserve it.
//!
//! Both figures are also capped by what the driver reports: a limit larger than the device does
//! not make the device look larger, and memory that other processes hold outside the limit is not
//! shown as free. Subtractions saturate at zero (HAMi-core #200 wrapped them).

use crate::accounting::Accounting;

/// `(free, total)` as `cuMemGetInfo` reports them under the limit of `device`, from the driver's
/// `(free, total)`. `used` is the container's reservation (the region's) or this process's
/// (in-process accounting); `context` is this process's context charge on `device` not yet held
/// (0 once held).
pub fn limited_info(
    ledger: &impl Accounting,
    device: usize,
    context: u64,
    free: u64,
    total: u64,
) -> (u64, u64) {
    match ledger.limit(device) {
        Some(limit) => {
            let left = limit
                .saturating_sub(ledger.used(device))
                .saturating_sub(context);
            (left.min(free), limit.min(total))
        }
        None => (free, total),
    }
}

/// `cuDeviceTotalMem`'s answer under `limit`, from the driver's `total`.
pub fn limited_total(limit: Option<u64>, total: u64) -> u64 {
    limit.map_or(total, |l| l.min(total))
}

/// NVML's `(total, free, used)` of a device limited to `limit` (non-zero) of which `used` is
/// reserved (with the caller's context charge not yet held, if any), from the device's `total`:
/// `total = min(limit, device total)`, `free = total - used` (saturating).
pub fn nvml_memory(limit: u64, used: u64, total: u64) -> (u64, u64, u64) {
    let total = limit.min(total);
    (total, total.saturating_sub(used), used)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{accounting::InProcess, config::Config};

    #[test]
    fn a_limited_device_shows_its_limit_capped_by_the_driver() {
        let mut c = Config::default();
        c.memory_limit[0] = Some(4 << 30);
        let l = InProcess::new(&c);
        l.try_reserve(0, 1 << 30).unwrap();
        // A device of 80 GiB with 70 free: 3 of the 4 GiB left.
        assert_eq!(
            limited_info(&l, 0, 0, 70 << 30, 80 << 30),
            (3 << 30, 4 << 30)
        );
        // A context charge not yet held is not free: the first allocation reserves it.
        assert_eq!(
            limited_info(&l, 0, 1 << 29, 70 << 30, 80 << 30),
            (5 << 29, 4 << 30)
        );
        assert_eq!(
            limited_info(&l, 0, 5 << 30, 70 << 30, 80 << 30),
            (0, 4 << 30)
        );
        // Others hold most of the device: what the driver says is free caps it.
        assert_eq!(
            limited_info(&l, 0, 0, 1 << 29, 80 << 30),
            (1 << 29, 4 << 30)
        );
        // A limit above the device's size does not make it larger.
        assert_eq!(limited_info(&l, 0, 0, 1 << 30, 2 << 30), (1 << 30, 2 << 30));
        // Reserved past the limit (lowered at run time): free saturates at 0.
        l.try_reserve(0, 3 << 30).unwrap();
        assert_eq!(limited_info(&l, 0, 0, 70 << 30, 80 << 30), (0, 4 << 30));
        // An unlimited device shows the driver's figures.
        assert_eq!(limited_info(&l, 1, 0, 5, 6), (5, 6));
        assert_eq!(limited_total(Some(4), 6), 4);
        assert_eq!(limited_total(Some(8), 6), 6);
        assert_eq!(limited_total(None, 6), 6);
        assert_eq!(nvml_memory(4, 1, 80), (4, 3, 1));
        assert_eq!(nvml_memory(100, 1, 80), (80, 79, 1));
        assert_eq!(nvml_memory(4, 9, 80), (4, 0, 9));
    }
}

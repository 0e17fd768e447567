//! The system timestamp domain: nanoseconds of a monotonic clock, so the frequency is 1 GHz.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Ticks per second of the system timestamp (`HSA_SYSTEM_INFO_TIMESTAMP_FREQUENCY`).
pub(crate) const TIMESTAMP_FREQUENCY: u64 = 1_000_000_000;

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// The current system timestamp in ticks (never zero, monotonic).
pub(crate) fn now_ticks() -> u64 {
    let nanos = epoch().elapsed().as_nanos();
    u64::try_from(nanos).unwrap_or(u64::MAX - 1) + 1
}

/// The deadline `timeout_ticks` from now, or `None` when the wait is unbounded.
pub(crate) fn deadline_after(timeout_ticks: u64) -> Option<Instant> {
    if timeout_ticks == u64::MAX {
        return None;
    }
    Instant::now().checked_add(Duration::from_nanos(timeout_ticks))
}

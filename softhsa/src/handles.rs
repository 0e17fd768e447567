//! Opaque handles. One process-wide counter serves every kind of object, so a handle is never
//! reused, not even across `hsa_shut_down` / `hsa_init`: a stale handle is reported as invalid
//! instead of naming a newer object.

use std::sync::atomic::{AtomicU64, Ordering};

static NEXT_HANDLE: AtomicU64 = AtomicU64::new(0x10_0000);

/// A fresh non-zero handle value.
pub(crate) fn next_handle() -> u64 {
    NEXT_HANDLE.fetch_add(1, Ordering::Relaxed)
}

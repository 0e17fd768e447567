//! The `extern "C"` entry points and the [`HsaApiTable`] that hands them out.
//!
//! Every entry point runs its body through [`guard`] (or [`guard_or`]), so a panic becomes
//! `HSA_STATUS_ERROR` (or a neutral value) instead of unwinding into C. None is exported under an
//! HSA symbol name: they are reached only through the table.

pub(crate) mod amd;
pub(crate) mod core;
mod image;
mod info;
mod table;

pub(crate) use table::{amd_table_v2, api_table};

use crate::runtime::{self, Runtime};
use hsa_sys::{
    HSA_STATUS_ERROR, HSA_STATUS_ERROR_INVALID_ARGUMENT, HSA_STATUS_SUCCESS, hsa_status_t,
};
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

/// The result of an entry point body: `Err` carries the status to return.
pub(crate) type HsaResult = Result<(), hsa_status_t>;

/// Runs an entry point body; `Ok` becomes `HSA_STATUS_SUCCESS`, a panic `HSA_STATUS_ERROR`.
pub(crate) fn guard(f: impl FnOnce() -> HsaResult) -> hsa_status_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => HSA_STATUS_SUCCESS,
        Ok(Err(status)) => status,
        Err(_) => HSA_STATUS_ERROR,
    }
}

/// Runs an entry point body that returns a value; a panic returns `fallback`.
pub(crate) fn guard_or<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

/// [`guard`] with the live runtime (`HSA_STATUS_ERROR_NOT_INITIALIZED` without one).
pub(crate) fn with_runtime(f: impl FnOnce(&Arc<Runtime>) -> HsaResult) -> hsa_status_t {
    guard(|| f(&runtime::current()?))
}

/// Writes `value` through an out pointer; `HSA_STATUS_ERROR_INVALID_ARGUMENT` if it is null.
///
/// # Safety
/// A non-null `out` must be valid for writing a `T` (no alignment needed).
pub(crate) unsafe fn put<T>(out: *mut T, value: T) -> HsaResult {
    if out.is_null() {
        return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and the caller guarantees it is writable for a T.
    unsafe { out.write_unaligned(value) };
    Ok(())
}

/// Copies an attribute's bytes to the caller's buffer.
///
/// # Safety
/// A non-null `out` must be valid for writing `bytes.len()` bytes (the attribute's size).
pub(crate) unsafe fn put_bytes(out: *mut c_void, bytes: &[u8]) -> HsaResult {
    if out.is_null() {
        return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and the caller guarantees room for the attribute.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.cast::<u8>(), bytes.len()) };
    Ok(())
}

/// Reads `count` elements of an input array; empty when `count` is 0.
///
/// # Safety
/// A non-null `ptr` must point to `count` readable `T`s.
pub(crate) unsafe fn read_array<T: Copy>(
    ptr: *const T,
    count: usize,
) -> Result<Vec<T>, hsa_status_t> {
    if count == 0 {
        return Ok(Vec::new());
    }
    if ptr.is_null() {
        return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
    }
    let mut items = Vec::with_capacity(count);
    for i in 0..count {
        // SAFETY: non-null, and the caller guarantees `count` readable elements.
        items.push(unsafe { ptr.add(i).read_unaligned() });
    }
    Ok(items)
}

/// The status an entry point returns for something softhsa does not provide.
pub(crate) fn unsupported() -> hsa_status_t {
    match runtime::current() {
        Ok(_) => HSA_STATUS_ERROR,
        Err(status) => status,
    }
}

/// Declares entry points that softhsa does not provide; each returns [`unsupported`].
macro_rules! unsupported_entries {
    ($($(#[$doc:meta])* $name:ident($($ty:ty),* $(,)?);)*) => {
        $(
            $(#[$doc])*
            pub(crate) unsafe extern "C" fn $name($(_: $ty),*) -> hsa_sys::hsa_status_t {
                crate::api::guard_or(hsa_sys::HSA_STATUS_ERROR, crate::api::unsupported)
            }
        )*
    };
}
pub(crate) use unsupported_entries;

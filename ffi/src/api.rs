//! The exported `extern "C"` functions of `kreplay.h`.
//!
//! Every function that can fail returns a [`Status`]; none lets a panic cross into C (a panic is
//! caught and reported as [`Status::ERROR`]). Out-pointers are checked for NULL
//! ([`Status::ERROR_INVALID_ARGUMENT`]).

use std::ffi::{c_char, c_int};
use std::mem::size_of;
use std::panic::{AssertUnwindSafe, catch_unwind};

use kreplay_ctxmask::{ContextError, ContextRegistry};

use crate::abi::{
    CallbackKind, ConfigureFn, ContextHandle, Counters, DeclineReason, Status, VERSION_MAJOR,
    VERSION_MINOR, VERSION_PATCH,
};
use crate::{lifecycle, services};

/// Runs `body`, turning a panic into [`Status::ERROR`] (with a line on stderr).
pub(crate) fn guard(body: impl FnOnce() -> Status) -> Status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(status) => status,
        Err(_) => {
            crate::kreplay_error!("internal error caught at the C interface");
            Status::ERROR
        }
    }
}

/// The elements of an array a C caller handed in, read one at a time wherever the array is
/// aligned: a field of a packed struct or a pointer into a byte buffer is as good as an aligned
/// array (Rust's aligned reads would abort the process on it).
pub(crate) struct CArray<T> {
    start: *const T,
    len: usize,
}

impl<T: Copy> CArray<T> {
    /// The array of `len` elements at `start`; `None` when `len` is non-zero and `start` is
    /// NULL, or when no array of `len` `T`s can exist (more than `isize::MAX` bytes: a count
    /// such as `SIZE_MAX`, which a caller cannot mean).
    ///
    /// # Safety
    /// When this returns `Some` and `len` is non-zero, `start` points to `len` readable `T`s (at
    /// any alignment) for as long as the array is read.
    pub(crate) unsafe fn new(start: *const T, len: usize) -> Option<CArray<T>> {
        let fits = len
            .checked_mul(std::mem::size_of::<T>())
            .is_some_and(|bytes| bytes <= isize::MAX as usize);
        if len != 0 && (start.is_null() || !fits) {
            return None;
        }
        Some(CArray { start, len })
    }

    /// The elements in order. No room for all of them is reserved up front: a caller that
    /// lies about the count is read until an element is found wrong, never met with an
    /// allocation the size of the count.
    pub(crate) fn iter(&self) -> impl Iterator<Item = T> + '_ {
        let mut index = 0;
        std::iter::from_fn(move || {
            if index == self.len {
                return None;
            }
            // SAFETY: `index < len`, and `new`'s caller promised `len` readable elements at
            // `start` (alignment not required: the read is unaligned).
            let value = unsafe { self.start.add(index).read_unaligned() };
            index += 1;
            Some(value)
        })
    }
}

/// Writes `value` through a C caller's out-pointer, wherever it is aligned.
///
/// # Safety
/// `out` is non-null and valid for writing a `T` (at any alignment).
pub(crate) unsafe fn write_out<T>(out: *mut T, value: T) {
    // SAFETY: forwarded from the caller; the write is unaligned.
    unsafe { out.write_unaligned(value) }
}

fn context_status(result: Result<(), ContextError>) -> Status {
    match result {
        Ok(()) => Status::SUCCESS,
        Err(ContextError::UnknownContext) => Status::ERROR_CONTEXT_NOT_FOUND,
        Err(_) => Status::ERROR,
    }
}

/// `kreplay_get_status_string`: a short description of `status` (never NULL).
#[unsafe(no_mangle)]
pub extern "C" fn kreplay_get_status_string(status: Status) -> *const c_char {
    status.description().as_ptr()
}

/// `kreplay_get_status_name`: the identifier of `status` (never NULL).
#[unsafe(no_mangle)]
pub extern "C" fn kreplay_get_status_name(status: Status) -> *const c_char {
    status.name().as_ptr()
}

/// `kreplay_get_version`: writes the version numbers (NULL pointers are skipped).
///
/// # Safety
/// Each pointer is NULL or valid for writing a `u32`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kreplay_get_version(
    major: *mut u32,
    minor: *mut u32,
    patch: *mut u32,
) -> Status {
    for (out, value) in [
        (major, VERSION_MAJOR),
        (minor, VERSION_MINOR),
        (patch, VERSION_PATCH),
    ] {
        if !out.is_null() {
            // SAFETY: non-null and, per the contract, valid for writing a u32.
            unsafe { write_out(out, value) };
        }
    }
    Status::SUCCESS
}

/// `kreplay_get_callback_tracing_kind_name`: the name of `kind`, NULL when unknown.
#[unsafe(no_mangle)]
pub extern "C" fn kreplay_get_callback_tracing_kind_name(kind: CallbackKind) -> *const c_char {
    kind.label().map_or(std::ptr::null(), |name| name.as_ptr())
}

/// `kreplay_get_callback_tracing_operation_name`: the name of an operation of `kind`, NULL when
/// unknown.
#[unsafe(no_mangle)]
pub extern "C" fn kreplay_get_callback_tracing_operation_name(
    kind: CallbackKind,
    operation: u32,
) -> *const c_char {
    kind.operation_name(operation)
        .map_or(std::ptr::null(), |name| name.as_ptr())
}

/// `kreplay_get_decline_reason_string`: the short name of `reason` (`"unknown"` when unknown).
#[unsafe(no_mangle)]
pub extern "C" fn kreplay_get_decline_reason_string(reason: DeclineReason) -> *const c_char {
    reason.as_cstr().as_ptr()
}

/// `kreplay_get_counters`: copies the per-process replay counters into `*counters`. The caller
/// sets `counters->size` to the bytes it provides (at least 8); kreplay fills at most that many
/// and sets `size` to the bytes it filled.
///
/// # Safety
/// `counters` is NULL or valid for reading and writing `counters->size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kreplay_get_counters(counters: *mut Counters) -> Status {
    if counters.is_null() {
        return Status::ERROR_INVALID_ARGUMENT;
    }
    guard(|| {
        // SAFETY: non-null; the first field is the caller's size, 8 bytes it must provide.
        let provided = unsafe { counters.cast::<u64>().read_unaligned() };
        if provided < 8 {
            return Status::ERROR_INVALID_ARGUMENT;
        }
        let mut value = crate::counters::snapshot();
        let filled = (provided as usize).min(size_of::<Counters>());
        value.size = filled as u64;
        // SAFETY: the caller provides `provided` >= `filled` writable bytes; the source is a
        // local of at least `filled` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&value as *const Counters).cast::<u8>(),
                counters.cast::<u8>(),
                filled,
            )
        };
        Status::SUCCESS
    })
}

/// `kreplay_create_context`: creates a stopped context without services.
///
/// # Safety
/// `context_id` is NULL or valid for writing a `kreplay_context_id_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kreplay_create_context(context_id: *mut ContextHandle) -> Status {
    if context_id.is_null() {
        return Status::ERROR_INVALID_ARGUMENT;
    }
    guard(|| {
        // Lock-free, so a fork while another thread creates a context leaves nothing half done
        // that the child would wait on (see `kreplay_ctxmask::ContextRegistry`).
        let id = ContextRegistry::global().create();
        lifecycle::note_context_created(id);
        // SAFETY: non-null and, per the contract, valid for writing.
        unsafe { write_out(context_id, ContextHandle::from(id)) };
        Status::SUCCESS
    })
}

/// `kreplay_start_context`: starts a context, unless its tool has been finalized
/// ([`Status::ERROR_FINALIZED`]).
#[unsafe(no_mangle)]
pub extern "C" fn kreplay_start_context(context_id: ContextHandle) -> Status {
    guard(|| lifecycle::start_context(context_id.into()))
}

/// `kreplay_stop_context`: stops a context.
#[unsafe(no_mangle)]
pub extern "C" fn kreplay_stop_context(context_id: ContextHandle) -> Status {
    guard(|| context_status(ContextRegistry::global().stop(context_id.into())))
}

/// `kreplay_context_is_active`: writes 1 if the context is started (global state), else 0.
///
/// # Safety
/// `status` is NULL or valid for writing an `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kreplay_context_is_active(
    context_id: ContextHandle,
    status: *mut c_int,
) -> Status {
    if status.is_null() {
        return Status::ERROR_INVALID_ARGUMENT;
    }
    guard(
        || match ContextRegistry::global().is_started(context_id.into()) {
            Ok(started) => {
                // SAFETY: non-null and, per the contract, valid for writing.
                unsafe { write_out(status, c_int::from(started)) };
                Status::SUCCESS
            }
            Err(ContextError::UnknownContext) => Status::ERROR_CONTEXT_NOT_FOUND,
            Err(_) => Status::ERROR,
        },
    )
}

/// `kreplay_configure_callback_tracing_service`: see [`services::configure_callback_tracing`].
/// `operations_count == 0` means every operation (the pointer is not read);
/// `operations == NULL` with a non-zero count or a NULL callback is
/// [`Status::ERROR_INVALID_ARGUMENT`].
///
/// # Safety
/// When `operations_count` is non-zero, `operations` is NULL or points to that many readable
/// `u32`s. `callback`, if non-NULL, is a function of type `kreplay_callback_tracing_cb_t` that
/// may be called with `callback_data` from any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kreplay_configure_callback_tracing_service(
    context_id: ContextHandle,
    kind: CallbackKind,
    operations: *const u32,
    operations_count: usize,
    callback: Option<crate::abi::CallbackFn>,
    callback_data: *mut std::ffi::c_void,
) -> Status {
    guard(|| {
        let refused = |status: Status, why: &str| {
            // A tool that ignores the status would otherwise never learn why nothing reaches
            // it. Another tool owning kernel replay is an answer tools expect, not a slip.
            let kind_name = kind
                .label()
                .map_or_else(|| kind.0.to_string(), |l| l.to_string_lossy().into_owned());
            crate::kreplay_warn!(
                "kreplay_configure_callback_tracing_service({kind_name}) refused ({}): {why}",
                status.name().to_string_lossy()
            );
            status
        };
        if services::configuration_locked() {
            return refused(
                Status::ERROR_CONFIGURATION_LOCKED,
                "tool initialization has ended; configure services in kreplay_configure or \
                 initialize",
            );
        }
        let Some(callback) = callback else {
            return refused(Status::ERROR_INVALID_ARGUMENT, "the callback is NULL");
        };
        // SAFETY: per the contract, `operations_count` readable u32s when the count is
        // non-zero (at any alignment).
        let Some(list) = (unsafe { CArray::new(operations, operations_count) }) else {
            return refused(
                Status::ERROR_INVALID_ARGUMENT,
                "operations is NULL with a non-zero count, or the count is larger than any \
                 array",
            );
        };
        // Each operation once, read up to the first that is not one of the kind's: the list
        // handed on is never longer than the kind's operations.
        let valid = services::OperationFilter::all_of(kind);
        let mut wanted: Vec<u32> = Vec::new();
        for operation in list.iter() {
            if !valid.contains(operation) {
                wanted.clear();
                wanted.push(operation);
                break;
            }
            if !wanted.contains(&operation) {
                wanted.push(operation);
            }
        }
        let operations = (operations_count != 0).then_some(&wanted[..]);
        match services::configure_callback_tracing(
            context_id.into(),
            kind,
            operations,
            callback,
            callback_data,
        ) {
            Ok(()) => {
                // Legal, but a replay owner that never receives CONFIG ENTER never answers a
                // pass count: nothing is replayed, and nothing else would tell it why.
                if kind == CallbackKind::KERNEL_REPLAY
                    && operations.is_some_and(|list| {
                        !list.contains(&crate::abi::KernelReplayOperation::CONFIG.0)
                    })
                {
                    crate::kreplay_warn!(
                        "kernel replay was configured without its CONFIG operation: the tool is \
                         never asked for a pass count at CONFIG ENTER, so no dispatch is replayed"
                    );
                }
                Status::SUCCESS
            }
            Err(status) if status == Status::ERROR_SERVICE_ALREADY_CONFIGURED => status,
            Err(status) if status == Status::ERROR_INVALID_ARGUMENT => refused(
                status,
                "an unknown kind, or an operation that is not one of the kind's",
            ),
            Err(status) if status == Status::ERROR_CONTEXT_NOT_FOUND => refused(
                status,
                "the context was never returned by kreplay_create_context",
            ),
            Err(status) => refused(status, &status.description().to_string_lossy()),
        }
    })
}

/// `kreplay_force_configure`: registers a configure function of a tool linked into the
/// application.
#[unsafe(no_mangle)]
pub extern "C" fn kreplay_force_configure(configure_func: Option<ConfigureFn>) -> Status {
    let Some(configure) = configure_func else {
        return Status::ERROR_INVALID_ARGUMENT;
    };
    guard(|| match lifecycle::force_configure(configure) {
        Ok(()) => Status::SUCCESS,
        Err(status) => status,
    })
}

/// `kreplay_is_initialized`: writes 1 once tool initialization has begun, else 0.
///
/// # Safety
/// `status` is NULL or valid for writing an `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kreplay_is_initialized(status: *mut c_int) -> Status {
    if status.is_null() {
        return Status::ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: non-null and, per the contract, valid for writing.
    unsafe { write_out(status, c_int::from(lifecycle::is_initialized())) };
    Status::SUCCESS
}

/// `kreplay_is_finalized`: writes 1 once tools were finalized, else 0.
///
/// # Safety
/// `status` is NULL or valid for writing an `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kreplay_is_finalized(status: *mut c_int) -> Status {
    if status.is_null() {
        return Status::ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: non-null and, per the contract, valid for writing.
    unsafe { write_out(status, c_int::from(lifecycle::is_finalized())) };
    Status::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_inside_the_boundary_becomes_error_status() {
        // The default hook prints the panic message; that is expected here.
        let status = guard(|| panic!("deliberate panic to check the C boundary"));
        assert_eq!(status, Status::ERROR);
        assert_eq!(
            guard(|| Status::ERROR_CONTEXT_NOT_FOUND),
            Status::ERROR_CONTEXT_NOT_FOUND
        );
    }
}

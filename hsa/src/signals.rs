//! The application's signals, as kernels may reach them.
//!
//! A signal handle is the address of the signal's `amd_signal_t` (on ROCm, and on softhsa,
//! which keeps the layout), and a kernel given a handle (or the value pointer
//! `hsa_amd_signal_value_pointer` returns) can count the signal down itself: device-side
//! signalling, which host threads waiting on it see at once. That is no memory a snapshot can
//! hold: each pass would signal the host again (a signal counted down from 2 ends at -1 after
//! three passes instead of 1), and a waiter woken by the first pass runs while later passes and
//! restores still change memory under it. So kreplay remembers the signals the application
//! creates (`hsa_signal_create`, `hsa_amd_signal_create`, until `hsa_signal_destroy`) and a
//! dispatch whose arguments hold one is declined (`untracked_memory`) and runs once.

use std::collections::BTreeSet;

use hsa_sys::*;
use parking_lot::Mutex;

use crate::backend::{backend, guarded};
use crate::original::forward;

/// Bytes of an `amd_signal_t` from its handle: a kernel may point anywhere inside it (its value
/// word is at byte 8).
const SIGNAL_BYTES: u64 = 64;

/// The live signals the application created, by handle.
#[derive(Default)]
pub(crate) struct Signals {
    live: Mutex<BTreeSet<u64>>,
}

impl Signals {
    /// The signals' lock, for the fork set (`crate::fork`).
    pub(crate) fn fork_lock(&self) -> crate::fork::Lock<'_> {
        &self.live
    }

    /// The handle of the live signal whose `amd_signal_t` holds `value`, if any.
    pub(crate) fn holding(&self, value: u64) -> Option<u64> {
        let live = self.live.lock();
        live.range(..=value)
            .next_back()
            .copied()
            .filter(|&h| value - h < SIGNAL_BYTES)
    }

    fn created(&self, signal: hsa_signal_t) {
        if signal.handle != 0 {
            self.live.lock().insert(signal.handle);
        }
    }

    fn destroyed(&self, signal: hsa_signal_t) {
        self.live.lock().remove(&signal.handle);
    }
}

/// Wrapper of `hsa_signal_create`: remembers the new signal.
pub(crate) unsafe extern "C" fn signal_create(
    initial_value: hsa_signal_value_t,
    num_consumers: u32,
    consumers: *const hsa_agent_t,
    signal: *mut hsa_signal_t,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let status = forward!(
            b,
            core.hsa_signal_create_fn(initial_value, num_consumers, consumers, signal)
        );
        if status == HSA_STATUS_SUCCESS && !signal.is_null() {
            // SAFETY: the runtime wrote the new signal through the caller's valid out pointer.
            b.signals.created(unsafe { *signal });
        }
        status
    })
}

/// Wrapper of `hsa_amd_signal_create`: remembers the new signal.
pub(crate) unsafe extern "C" fn amd_signal_create(
    initial_value: hsa_signal_value_t,
    num_consumers: u32,
    consumers: *const hsa_agent_t,
    attributes: u64,
    signal: *mut hsa_signal_t,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let status = forward!(
            b,
            amd.hsa_amd_signal_create_fn(
                initial_value,
                num_consumers,
                consumers,
                attributes,
                signal
            )
        );
        if status == HSA_STATUS_SUCCESS && !signal.is_null() {
            // SAFETY: the runtime wrote the new signal through the caller's valid out pointer.
            b.signals.created(unsafe { *signal });
        }
        status
    })
}

/// Wrapper of `hsa_signal_destroy`: forgets the signal, and the copy times kept for it
/// (`crate::copies::CopyTimes`): its memory may hold another later, at the same handle.
pub(crate) unsafe extern "C" fn signal_destroy(signal: hsa_signal_t) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        b.signals.destroyed(signal);
        b.copies.times.forget(signal);
        forward!(b, core.hsa_signal_destroy_fn(signal))
    })
}

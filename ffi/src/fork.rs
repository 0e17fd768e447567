//! kreplay's locks across `fork`.
//!
//! Only the forking thread exists in the child. A lock another thread of the parent held at the
//! fork would stay held there for good, and the child's first kreplay call that needs it (a
//! context started, a context created, a counter configuration) would wait forever. So, around
//! every fork of the process (`pthread_atfork`): before it, the forking thread takes every lock
//! of this crate's C interface, in the one order the code nests them, which leaves no update
//! half done; after it, the parent releases them and the child resets them to unlocked (no
//! other thread exists there to hand them to, or to wake).
//!
//! The order (a lock is only ever taken while holding locks earlier in it): the lifecycle's
//! state, current setup and retired contexts; the services, retired services, published table
//! and running-callback lock; the counting service, configurations and catalogues; the
//! warn-once keys; the run record's file name and record (`kreplay run`, which a
//! child's exit handler writes); the replay records kept for `take_replay_records`. None is held
//! while kreplay calls a tool, logs (a Rust host's logger may fork, running these handlers on
//! the logging thread) or waits on anything but another of them, so taking them all before a
//! fork cannot wait for long. The context registry (`kreplay_ctxmask`) takes no lock:
//! nothing of it needs handling here.

use parking_lot::lock_api::{RawMutex as _, RawRwLock as _};
use parking_lot::{Mutex, RawMutex, RawRwLock, RwLock};

/// Takes `lock` until [`release`] or [`reset`] (the guard is forgotten).
pub(crate) fn hold<T>(lock: &Mutex<T>) {
    std::mem::forget(lock.lock());
}

/// Takes `lock` for writing until [`release_rw`] or [`reset_rw`].
pub(crate) fn hold_rw<T>(lock: &RwLock<T>) {
    std::mem::forget(lock.write());
}

/// Releases a lock [`hold`] took (in the parent, after the fork).
///
/// # Safety
/// This thread took `lock` with [`hold`] and has not released it since.
pub(crate) unsafe fn release<T>(lock: &Mutex<T>) {
    // SAFETY: per the caller, this thread holds it through a forgotten guard.
    unsafe { lock.force_unlock() };
}

/// Releases a lock [`hold_rw`] took (in the parent, after the fork).
///
/// # Safety
/// This thread took `lock` with [`hold_rw`] and has not released it since.
pub(crate) unsafe fn release_rw<T>(lock: &RwLock<T>) {
    // SAFETY: per the caller, this thread holds it for writing through a forgotten guard.
    unsafe { lock.force_unlock_write() };
}

/// Makes a lock [`hold`] took unlocked again in the child of the fork, without waking anyone:
/// threads of the parent parked on it do not exist here, and waking them would go through
/// parking_lot's shared table, which another of the parent's threads may have held at the fork.
///
/// # Safety
/// Only in the child of a fork, on the forking thread, which took `lock` with [`hold`] before
/// the fork; the lock's value is consistent (no update was in progress: it was held).
pub(crate) unsafe fn reset<T>(lock: &Mutex<T>) {
    // SAFETY: the raw lock is a single atomic (interior mutability), written whole with the
    // unlocked state; no other thread exists to race with it (the caller's contract).
    unsafe {
        std::ptr::from_ref(lock.raw())
            .cast_mut()
            .write(RawMutex::INIT)
    };
}

/// [`reset`] for a lock [`hold_rw`] took.
///
/// # Safety
/// As for [`reset`], with [`hold_rw`].
pub(crate) unsafe fn reset_rw<T>(lock: &RwLock<T>) {
    // SAFETY: as in `reset`: a single atomic written whole, no other thread.
    unsafe {
        std::ptr::from_ref(lock.raw())
            .cast_mut()
            .write(RawRwLock::INIT)
    };
}

/// `pthread_atfork` prepare handler: takes every lock, in order.
pub(crate) extern "C" fn prepare() {
    let _ = std::panic::catch_unwind(|| {
        crate::lifecycle::fork_hold();
        crate::services::fork_hold();
        crate::counting::fork_hold();
        crate::logging::fork_hold();
        crate::run_record::fork_hold();
        crate::hsa_tool::fork_hold();
    });
}

/// `pthread_atfork` parent handler: releases them.
pub(crate) extern "C" fn in_parent() {
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: `prepare` took them all on this thread, the one that forked.
        unsafe {
            crate::hsa_tool::fork_release();
            crate::run_record::fork_release();
            crate::logging::fork_release();
            crate::counting::fork_release();
            crate::services::fork_release();
            crate::lifecycle::fork_release();
        }
    });
}

/// The child's part: every lock unlocked again (before `services::in_forked_child` forgets the
/// parent's running callbacks and finalizes).
pub(crate) fn in_child() {
    // SAFETY: in the child, on the forking thread, which `prepare` had take them all.
    unsafe {
        crate::hsa_tool::fork_reset();
        crate::run_record::fork_reset();
        crate::logging::fork_reset();
        crate::counting::fork_reset();
        crate::services::fork_reset();
        crate::lifecycle::fork_reset();
    }
}

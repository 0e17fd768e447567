//! Locks held across `fork`: what a crate's `pthread_atfork` handlers do to each lock of its
//! fork set.
//!
//! Only the forking thread exists in the child of a fork. A lock another thread of the parent
//! held at the fork stays held there for good, and the child's first use of it waits forever.
//! A crate that must stay usable in the child lists its locks in one order (a lock only ever
//! taken while holding locks earlier in it) and, around every fork: before it, the forking
//! thread [`hold`](ForkLock::hold)s each in that order, which leaves no update half done; after
//! it, the parent [`release`](ForkLock::release)s them, last taken first, and the child
//! [`reset`](ForkLock::reset)s them to unlocked without waking anyone (no other thread exists
//! there to hand them to). [`hold_all`], [`release_all`] and [`reset_all`] do that over a
//! list.
//!
//! ```
//! use kreplay_locks::fork::{self, ForkLock};
//! use parking_lot::{Mutex, RwLock};
//!
//! static STATE: Mutex<u32> = Mutex::new(0);
//! static TABLE: RwLock<Vec<u8>> = RwLock::new(Vec::new());
//! let set: [&(dyn ForkLock + Sync); 2] = [&STATE, &TABLE];
//!
//! fork::hold_all(set.iter().copied());
//! assert!(STATE.is_locked() && TABLE.is_locked_exclusive());
//! // SAFETY: this thread took them all just above.
//! unsafe { fork::release_all(set.iter().copied()) };
//! assert!(!STATE.is_locked() && !TABLE.is_locked());
//! ```

use parking_lot::lock_api::{RawMutex as _, RawRwLock as _};
use parking_lot::{Mutex, RawMutex, RawRwLock, RwLock};

/// What is done to a lock of a fork set around a fork.
pub trait ForkLock {
    /// Takes it (exclusively) until [`release`](Self::release) or [`reset`](Self::reset); the
    /// guard is forgotten.
    fn hold(&self);
    /// Releases it in the parent, after the fork.
    ///
    /// # Safety
    /// This thread took it with [`hold`](Self::hold) and has not released it since.
    unsafe fn release(&self);
    /// Makes it unlocked again in the child of the fork, without waking anyone: threads of the
    /// parent parked on it do not exist here, and waking them would go through parking_lot's
    /// shared table, which another of the parent's threads may have held at the fork.
    ///
    /// # Safety
    /// Only in the child of a fork, on the forking thread, which took it with
    /// [`hold`](Self::hold) before the fork; its value is consistent (no update was in
    /// progress: it was held).
    unsafe fn reset(&self);
}

impl<T> ForkLock for Mutex<T> {
    fn hold(&self) {
        std::mem::forget(self.lock());
    }

    unsafe fn release(&self) {
        // SAFETY: per the caller, this thread holds it through a forgotten guard.
        unsafe { self.force_unlock() };
    }

    unsafe fn reset(&self) {
        // SAFETY: the raw lock is a single atomic (interior mutability), written whole with the
        // unlocked state; no other thread exists to race with it (the caller's contract).
        unsafe {
            std::ptr::from_ref(self.raw())
                .cast_mut()
                .write(RawMutex::INIT)
        };
    }
}

impl<T> ForkLock for RwLock<T> {
    fn hold(&self) {
        std::mem::forget(self.write());
    }

    unsafe fn release(&self) {
        // SAFETY: per the caller, this thread holds it for writing through a forgotten guard.
        unsafe { self.force_unlock_write() };
    }

    unsafe fn reset(&self) {
        // SAFETY: as for a mutex: a single atomic written whole, no other thread.
        unsafe {
            std::ptr::from_ref(self.raw())
                .cast_mut()
                .write(RawRwLock::INIT)
        };
    }
}

/// Takes every lock of `set`, in its order (the `pthread_atfork` prepare handler's part).
pub fn hold_all<'a>(set: impl Iterator<Item = &'a (dyn ForkLock + Sync)>) {
    set.for_each(|lock| lock.hold());
}

/// Releases every lock of `set`, last first (the parent's part after the fork).
///
/// # Safety
/// This thread took them all with [`hold_all`] over the same set and released none since.
pub unsafe fn release_all<'a>(set: impl DoubleEndedIterator<Item = &'a (dyn ForkLock + Sync)>) {
    for lock in set.rev() {
        // SAFETY: per the caller, this thread holds each of them.
        unsafe { lock.release() };
    }
}

/// Makes every lock of `set` unlocked again, last first (the child's part after the fork).
///
/// # Safety
/// Only in the child of a fork, on the forking thread, which took them all with [`hold_all`]
/// over the same set before the fork.
pub unsafe fn reset_all<'a>(set: impl DoubleEndedIterator<Item = &'a (dyn ForkLock + Sync)>) {
    for lock in set.rev() {
        // SAFETY: per the caller: the child of a fork, its forking thread, which holds them.
        unsafe { lock.reset() };
    }
}

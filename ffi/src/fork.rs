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
//! state, current setup, retired contexts and finalizes in progress; the services, retired services, published table
//! and running-callback lock; the counting service, configurations and catalogues; the
//! warn-once keys; the run record's file name and record (`kreplay run`, which a
//! child's exit handler writes); the replay records kept for `take_replay_records`. None is held
//! while kreplay calls a tool, logs (a Rust host's logger may fork, running these handlers on
//! the logging thread) or waits on anything but another of them, so taking them all before a
//! fork cannot wait for long. The context registry (`kreplay_ctxmask`) takes no lock:
//! nothing of it needs handling here.

use kreplay_locks::fork::{self, ForkLock};

/// A lock of the fork set, whatever it guards.
pub(crate) type Held = dyn ForkLock + Sync;

/// Every lock of the fork set, module by module in the order they nest (see the module doc).
static SET: [&[&Held]; 6] = [
    &crate::lifecycle::FORK_LOCKS,
    &crate::services::FORK_LOCKS,
    &crate::counting::FORK_LOCKS,
    &crate::logging::FORK_LOCKS,
    &crate::run_record::FORK_LOCKS,
    &crate::hsa_tool::FORK_LOCKS,
];

/// The locks of [`SET`] in the order they are taken.
fn in_order() -> impl DoubleEndedIterator<Item = &'static Held> {
    SET.iter().flat_map(|module| module.iter()).copied()
}

/// `pthread_atfork` prepare handler: takes every lock, in order.
pub(crate) extern "C" fn prepare() {
    let _ = std::panic::catch_unwind(|| fork::hold_all(in_order()));
}

/// `pthread_atfork` parent handler: releases them, last taken first.
pub(crate) extern "C" fn in_parent() {
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: `prepare` took them all on this thread, the one that forked.
        unsafe { fork::release_all(in_order()) };
    });
}

/// The child's part: every lock unlocked again (before `services::in_forked_child` forgets the
/// parent's running callbacks and finalizes).
pub(crate) fn in_child() {
    // SAFETY: in the child, on the forking thread, which `prepare` had take them all.
    unsafe { fork::reset_all(in_order()) };
}

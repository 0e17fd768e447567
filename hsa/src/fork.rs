//! The backend's locks across `fork`.
//!
//! Only the forking thread exists in the child. A lock another thread of the parent held at the
//! fork (inside a signal create, a queue lookup, a walk of a module's symbols) would stay held
//! there for good, and the child's first HSA call that needs it would wait forever: every
//! wrapper passes through in the child (it is finalized, `crate::backend`), but some still
//! update or read kreplay's lists (signals, executables, soft queue rings, the queue registry
//! that profiling switches and queue destroys look through), and a gate the forking thread
//! opens there hands its held completions to a completion thread. So, around every fork
//! of the process (`pthread_atfork`, registered at installation): before it, the forking thread
//! takes every lock of [`in_order`], in that order, which leaves no update half done; after it,
//! the parent releases them, and the child resets them to unlocked (no other thread exists
//! there to hand them to, or to wake) and forgets the parent's completion threads and the
//! jobs queued for them (`crate::watcher`).
//!
//! The order (a lock is only ever taken while holding locks earlier in it): the executables
//! (`crate::reach`; held while the runtime walks a module's symbols); the queue registry's side
//! queues (held while the runtime creates one, which registers it), then its queues by agent;
//! the watcher's signal list (held while the runtime creates and rings its
//! wake-up signal) and the completion runners' queue; the held completions' lock
//! (`crate::dispatch`); images; virtual memory handles, mappings and reservations; SVM ranges;
//! soft queue rings; async copy times; the application's signals (last: a runtime layer below
//! kreplay may create signals through the public API while kreplay holds an earlier one).
//! None of them is held while kreplay calls a tool, logs, or waits for a replay, a drain, a
//! kernel or a copy: only runtime calls that return on their own (creating a queue or a
//! signal, walking symbols) and starting a thread happen under them, so taking them all before
//! a fork waits only for those. A thread that forks while holding one of them would wait for
//! itself; none can (nothing under them calls back into the application or a tool). The C
//! interface's own locks (kreplay's ffi crate) are never held while the backend takes one of
//! these, nor the reverse, so the two sets may be taken in either order.
//!
//! Locks of one queue (its liveness, mailbox and handler count), of an open replay window, the
//! replay groups (`crate::peers`, kreplay-locks' own) and the agents' replay locks are not in
//! the set: some of them are held while a replay waits, so taking them before a fork could make
//! the fork wait for a replay (a drain ringing a queue holds that queue's liveness while it
//! waits for room in its ring). The child needs none of them: its queues are the runtime's
//! own, its agents' reader side is off, a finalized backend links no replay groups, and its
//! destroy of a queue of the parent's takes none of that queue's locks
//! (`queues::destroy_in_forked_child`).
//!
//! One-time initializations are cut by a fork the same way (a `OnceLock` another thread was
//! filling stays "in progress" in the child, and the child's first use waits for good): the
//! system's GPUs, which module unloads and fenced calls need, are looked up at installation
//! (`Backend::gpus`); the CPU agent is looked up on first use by a replay's restore only, and
//! the soft counters table is filled with what was read before its `OnceLock` is entered.

use kreplay_locks::fork::{self, ForkLock};

use crate::backend::Backend;

/// A lock of the fork set, whatever it guards.
pub(crate) type Lock<'a> = &'a (dyn ForkLock + Sync);

/// Every lock of the fork set, in the order they are taken (see the module doc).
fn in_order(b: &'static Backend) -> [Lock<'static>; 14] {
    let [side, by_agent] = b.queues.fork_locks();
    let [watched, runners] = b.watcher.fork_locks();
    let [handles, mappings, reservations] = b.vmem.fork_locks();
    [
        crate::reach::fork_lock(),
        side,
        by_agent,
        watched,
        runners,
        crate::dispatch::fork_lock(),
        b.images.fork_lock(),
        handles,
        mappings,
        reservations,
        b.svm.fork_lock(),
        b.soft_queues.fork_lock(),
        b.copies.times.fork_lock(),
        b.signals.fork_lock(),
    ]
}

/// `pthread_atfork` prepare handler: takes every lock, in order.
pub(crate) extern "C" fn prepare() {
    let _ = std::panic::catch_unwind(|| {
        if let Some(b) = crate::backend::installed() {
            fork::hold_all(in_order(b).into_iter());
        }
    });
}

/// `pthread_atfork` parent handler: releases them, last taken first.
pub(crate) extern "C" fn in_parent() {
    let _ = std::panic::catch_unwind(|| {
        if let Some(b) = crate::backend::installed() {
            // SAFETY: `prepare` took them all on this thread, the one that forked.
            unsafe { fork::release_all(in_order(b).into_iter()) };
        }
    });
}

/// The child's part: every lock unlocked again, then the parent's completion threads forgotten
/// (`crate::watcher`).
pub(crate) fn in_child() {
    if let Some(b) = crate::backend::installed() {
        // SAFETY: in the child, on the forking thread, which `prepare` had take them all.
        unsafe { fork::reset_all(in_order(b).into_iter()) };
        b.watcher.forget_threads_in_child();
    }
}

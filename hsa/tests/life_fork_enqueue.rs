//! A tool that forks from its KERNEL_DISPATCH ENQUEUE EXIT callback (a tool starting a helper
//! program): the forking thread keeps the write's COMPLETE records held (`OnUnload` waits for
//! such held records) until its ENQUEUE callbacks return, in the child as in the parent. The
//! child's own held records must count there: once its callback returned, an unload in the
//! child has nothing to wait for.

#[allow(dead_code)]
#[macro_use]
mod support;

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::Duration;

use kreplay_hsa::InstallOptions;
use support::app::{self, Aql};
use support::counted::{AddOneArgs, add_one};
use support::tool::{Wrap, Wrapped};
use support::wait_child;

/// Set in the child of the fork (its own copy of memory).
static IN_CHILD: AtomicBool = AtomicBool::new(false);
/// The child's pid, in the parent.
static CHILD: AtomicI32 = AtomicI32::new(0);

/// ENQUEUE EXIT forks once (armed).
struct Forking {
    armed: AtomicBool,
}

impl Wrap for Forking {
    fn dispatch_enqueue(&self, submit: &mut dyn FnMut()) {
        submit();
        if self.armed.swap(false, Ordering::SeqCst) {
            // SAFETY: the child only returns from this callback, asks for the held records and
            // leaves with _exit (see the scenario).
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                IN_CHILD.store(true, Ordering::SeqCst);
            } else {
                CHILD.store(pid, Ordering::SeqCst);
            }
        }
    }
}

scenarios! {
    /// The child of a fork made in ENQUEUE EXIT returns from that callback, which opens the
    /// gate its records were held behind: nothing is held in the child any more, and waiting
    /// for held records (as its `OnUnload` does) returns at once, not after its limit.
    fn a_child_forked_in_enqueue_exit_holds_no_completions_once_the_callback_returned() {
        let hooks = Wrapped::new(1, Forking { armed: AtomicBool::new(false) });
        let app = app::install(hooks.clone(), InstallOptions::default());
        let pools = app.pools(app.gpus[0]);
        let kernel = kreplay_softhsa::register_kernel("life_fork_enqueue_add_one", add_one);
        let buf = app.buffer(pools.coarse, &[1u32; 64]);
        let kernarg = app.kernargs(&pools, AddOneArgs { buf: buf.0, len: 64, pad: 0 });
        let queue = app.queue(app.gpus[0]);
        let done = app.signal(1);
        hooks.wrap.armed.store(true, Ordering::SeqCst);
        app.dispatch(queue, Aql::dispatch(kernel, 64, 64, kernarg, done));
        if IN_CHILD.load(Ordering::SeqCst) {
            let code = std::panic::catch_unwind(|| {
                if kreplay_hsa::deliver_held_completions(Duration::from_secs(5)) { 0 } else { 1 }
            })
            .unwrap_or(2);
            // SAFETY: leaves the child without running the parent's exit handlers.
            unsafe { libc::_exit(code) };
        }
        let pid = CHILD.load(Ordering::SeqCst);
        assert!(pid > 0, "the tool's ENQUEUE EXIT did not fork");
        assert_eq!(app.wait_zero(done), 0);
        assert_eq!(
            wait_child(pid, Duration::from_secs(60)),
            Some(0),
            "the child's wait for held completions (1: it ran to its limit, something still \
             counted as held; 2: it panicked; None: it hung)"
        );
        assert!(kreplay_hsa::deliver_held_completions(Duration::from_secs(30)));
    }
}

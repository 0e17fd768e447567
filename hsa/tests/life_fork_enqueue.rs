//! A tool that forks from its KERNEL_DISPATCH ENQUEUE EXIT callback (a tool starting a helper
//! program): the forking thread keeps the write's COMPLETE records held (`OnUnload` waits for
//! such held records) until its ENQUEUE callbacks return, in the child as in the parent. The
//! child's own held records must count there: once its callback returned, an unload in the
//! child has nothing to wait for.

#[allow(dead_code)]
#[macro_use]
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::{Duration, Instant};

use kreplay_ctxmask::ContextRegistry;
use kreplay_hsa::{DispatchRecord, InstallOptions, ToolHooks};
use kreplay_passloop::{DispatchInfo, ReplayRecord, ReplayTool};
use kreplay_softhsa::WorkGroup;
use support::app::{self, Aql};
use support::tool::TestHooks;

/// Set in the child of the fork (its own copy of memory).
static IN_CHILD: AtomicBool = AtomicBool::new(false);
/// The child's pid, in the parent.
static CHILD: AtomicI32 = AtomicI32::new(0);

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Args {
    buf: u64,
    len: u32,
    pad: u32,
}

fn add_one(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries an `Args` block.
    let args: Args = unsafe { group.kernargs() };
    let buf = args.buf as *mut u32;
    for [i, _, _] in group.work_items() {
        if i < args.len {
            // SAFETY: each work-item owns index `i` of a buffer of `len` u32.
            unsafe { *buf.add(i as usize) += 1 };
        }
    }
}

/// [`TestHooks`] whose ENQUEUE EXIT forks once.
struct Forking {
    inner: Arc<TestHooks>,
    armed: AtomicBool,
}

impl ToolHooks for Forking {
    fn replay_configured(&self) -> bool {
        self.inner.replay_configured()
    }
    fn dispatch_tracing_configured(&self) -> bool {
        self.inner.dispatch_tracing_configured()
    }
    fn replay_tool(&self) -> Box<dyn ReplayTool + '_> {
        self.inner.replay_tool()
    }
    fn contexts(&self) -> &ContextRegistry {
        self.inner.contexts()
    }
    fn dispatch_completed(&self, record: &DispatchRecord) {
        self.inner.dispatch_completed(record)
    }
    fn dispatch_enqueue(&self, _: &[DispatchInfo], _: Option<u64>, submit: &mut dyn FnMut()) {
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
    fn replay_finished(&self, record: &ReplayRecord) {
        self.inner.replay_finished(record)
    }
    fn warn(&self, message: &str) {
        self.inner.warn(message)
    }
    fn warn_once(&self, key: &'static str, message: &str) {
        self.inner.warn_once(key, message)
    }
}

/// Waits for child `pid` at most `limit` (killing it then); its exit code, or `None`.
fn wait_child(pid: libc::pid_t, limit: Duration) -> Option<i32> {
    let deadline = Instant::now() + limit;
    loop {
        let mut status = 0;
        // SAFETY: `pid` is a child of this process; `status` is a valid out pointer.
        if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
            return libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
        }
        if Instant::now() >= deadline {
            // SAFETY: ends the child we started; reaped right after.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return None;
        }
        std::thread::park_timeout(Duration::from_millis(20));
    }
}

scenarios! {
    /// The child of a fork made in ENQUEUE EXIT returns from that callback, which opens the
    /// gate its records were held behind: nothing is held in the child any more, and waiting
    /// for held records (as its `OnUnload` does) returns at once, not after its limit.
    fn a_child_forked_in_enqueue_exit_holds_no_completions_once_the_callback_returned() {
        let hooks = Arc::new(Forking { inner: TestHooks::new(1), armed: AtomicBool::new(false) });
        let app = app::install(hooks.clone(), InstallOptions::default());
        let pools = app.pools(app.gpus[0]);
        let kernel = kreplay_softhsa::register_kernel("life_fork_enqueue_add_one", add_one);
        let buf = app.buffer(pools.coarse, &[1u32; 64]);
        let kernarg = app.kernargs(&pools, Args { buf: buf.0, len: 64, pad: 0 });
        let queue = app.queue(app.gpus[0]);
        let done = app.signal(1);
        hooks.armed.store(true, Ordering::SeqCst);
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

//! The application forks while one of its dispatches is being replayed on another thread (a
//! launcher that starts a helper process, `system()`, a data loader's workers). The tool holds
//! the replay at PASS ENTER of pass 1, so the fork happens deterministically inside the replay
//! window: the parent's replay thread holds the agent's writer side, and the child gets a copy
//! of that lock with no thread left to release it. The child must not hang on kreplay's state:
//! it creates a queue of its own and dispatches, and that work runs once and completes. The
//! parent's replay ends as planned.

#[allow(dead_code)]
#[macro_use]
mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kreplay_hsa::InstallOptions;
use support::app::{self, Aql};
use support::counted::{AddOneArgs, add_one};
use support::tool::{Script, TestHooks};
use support::wait_child;

static HELD: AtomicBool = AtomicBool::new(false);
static RELEASE: AtomicBool = AtomicBool::new(false);

const PASSES: u64 = 3;
const LEN: u32 = 1024;

fn values(len: u32) -> Vec<u32> {
    (0..len).map(|i| i * 7 + 2).collect()
}

fn plus_one(v: &[u32]) -> Vec<u32> {
    v.iter().map(|x| x + 1).collect()
}

scenarios! {
    /// The child of a fork made while a replay window is open dispatches on a queue of its
    /// own: its kernel runs once and its completion fires; it does not wait for the parent's
    /// replay, whose thread does not exist in the child.
    fn a_child_forked_during_a_replay_can_dispatch() {
        let hooks = TestHooks::new(0);
        let app = app::install(hooks.clone(), InstallOptions::default());
        hooks.configure_replay(true);
        hooks.set_script(Script::passes(PASSES).on_pass_enter(|_, _, pass, _| {
            if pass == 1 && !HELD.swap(true, Ordering::SeqCst) {
                assert!(support::wait_flag(&RELEASE), "the scenario never released the replay");
            }
        }));
        let pools = app.pools(app.gpus[0]);
        let kernel = kreplay_softhsa::register_kernel("life_fork_add_one", add_one);
        let packet = |buf: app::Ptr, done| {
            let kernarg = app.kernargs(&pools, AddOneArgs { buf: buf.0, len: LEN, pad: 0 });
            Aql::dispatch(kernel, LEN, 64, kernarg, done)
        };
        let init = values(LEN);
        let buf = app.buffer(pools.coarse, &init);
        let queue = app.queue(app.gpus[0]);
        let done = app.signal(1);
        let held = packet(buf, done);
        let submitter = std::thread::spawn(move || app.dispatch(queue, held));
        assert!(support::wait_flag(&HELD), "the replay never reached pass 1");

        // SAFETY: the child only allocates, dispatches and waits, then leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let mine = app.buffer(pools.coarse, &init);
                let queue = app.queue(app.gpus[0]);
                let done = app.signal(1);
                app.dispatch(queue, packet(mine, done));
                if app.wait_zero_within(done, Duration::from_secs(10)) != 0 {
                    return 3;
                }
                if app.read(mine, LEN as usize) != plus_one(&init) {
                    return 4;
                }
                0
            }))
            .unwrap_or(5);
            // SAFETY: leaves the child without running the parent's exit handlers.
            unsafe { libc::_exit(code) };
        }
        let child = wait_child(pid, Duration::from_secs(10));
        RELEASE.store(true, Ordering::SeqCst);
        submitter.join().expect("the submitting thread");
        assert_eq!(app.wait_zero(done), 0);
        assert_eq!(app.read(buf, LEN as usize), plus_one(&init));
        assert_eq!(
            child,
            Some(0),
            "the forked child's dispatch (None: it hung and was killed; 3: its completion \
             never fired; 4: wrong result; 5: it panicked)"
        );
        let id = hooks.configured_dispatches().first().expect("CONFIG ENTER").dispatch_id;
        let outcome = hooks.finished_record(id).outcome;
        assert!(
            matches!(outcome, kreplay_passloop::ReplayOutcome::Replayed { passes: PASSES, .. }),
            "{outcome:?}"
        );
    }

    /// The child of a fork made while a replay window is open (its dispatch's handler call in
    /// progress on another thread of the parent) destroys that queue: the destroy does not wait
    /// for the handler call, whose thread does not exist in the child.
    fn a_child_forked_during_a_replay_can_destroy_the_replayed_queue() {
        let hooks = TestHooks::new(0);
        let app = app::install(hooks.clone(), InstallOptions::default());
        hooks.configure_replay(true);
        hooks.set_script(Script::passes(PASSES).on_pass_enter(|_, _, pass, _| {
            if pass == 1 && !HELD.swap(true, Ordering::SeqCst) {
                assert!(support::wait_flag(&RELEASE), "the scenario never released the replay");
            }
        }));
        let pools = app.pools(app.gpus[0]);
        let kernel = kreplay_softhsa::register_kernel("life_fork_add_one", add_one);
        let init = values(LEN);
        let buf = app.buffer(pools.coarse, &init);
        let kernarg = app.kernargs(&pools, AddOneArgs { buf: buf.0, len: LEN, pad: 0 });
        let queue = app.queue(app.gpus[0]);
        let done = app.signal(1);
        let held = Aql::dispatch(kernel, LEN, 64, kernarg, done);
        let submitter = std::thread::spawn(move || app.dispatch(queue, held));
        assert!(support::wait_flag(&HELD), "the replay never reached pass 1");

        // SAFETY: the child only destroys the queue, then leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            // The runtime may refuse to destroy a queue of the parent's (softhsa cannot stop
            // its packet processor, a thread of the parent's): whatever it answers, the call
            // returns.
            let destroy = app.core().hsa_queue_destroy_fn.expect("hsa_queue_destroy");
            // SAFETY: the queue the parent created; destroyed once in this process.
            let code = std::panic::catch_unwind(|| unsafe { destroy(queue.0) })
                .map_or(5, |_| 0);
            // SAFETY: leaves the child without running the parent's exit handlers.
            unsafe { libc::_exit(code) };
        }
        let child = wait_child(pid, Duration::from_secs(10));
        RELEASE.store(true, Ordering::SeqCst);
        submitter.join().expect("the submitting thread");
        assert_eq!(app.wait_zero(done), 0);
        assert_eq!(app.read(buf, LEN as usize), plus_one(&init));
        assert_eq!(
            child,
            Some(0),
            "the forked child's queue destroy (None: it hung and was killed; 5: it panicked)"
        );
    }
}

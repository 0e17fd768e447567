//! Queues changed by another application thread while a dispatch of theirs is being replayed.
//! Without kreplay the thread that rang the doorbell has long returned; with kreplay it is
//! inside the replay, which must neither hang it nor the thread that changed the queue.

// Each test file uses part of the shared harness.
#[allow(dead_code)]
#[macro_use]
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hsa_sys::*;
use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_softhsa::WorkGroup;
use support::app::{self, App, Aql, Pools, Ptr, WAIT};
use support::tool::{Script, TestHooks};

const WORDS: usize = 64;

/// Set by the gated kernel once it runs; it then waits for [`GO`].
static STARTED: AtomicBool = AtomicBool::new(false);
/// Lets the gated kernel finish.
static GO: AtomicBool = AtomicBool::new(false);

#[repr(C)]
#[derive(Clone, Copy)]
struct GatedArgs {
    buf: u64,
    len: u32,
    pad: u32,
}

/// `buf[i] += 1`, once [`GO`] is set (bounded: it gives up waiting after [`WAIT`]).
fn gated_add(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries a `GatedArgs` block.
    let args: GatedArgs = unsafe { group.kernargs() };
    STARTED.store(true, Ordering::SeqCst);
    let deadline = std::time::Instant::now() + WAIT;
    while !GO.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
        std::thread::yield_now();
    }
    for [i, _, _] in group.work_items() {
        if i < args.len {
            // SAFETY: the buffer holds `len` u32s; each work-item owns index `i`.
            unsafe { *(args.buf as *mut u32).add(i as usize) += 1 };
        }
    }
}

struct Env {
    app: App,
    hooks: Arc<TestHooks>,
    pools: Pools,
}

fn setup() -> Env {
    let hooks = TestHooks::new(0);
    let app = app::install(
        hooks.clone(),
        InstallOptions {
            drain: DrainConfig::new(Duration::from_millis(500)),
            ..Default::default()
        },
    );
    hooks.configure_replay(true);
    hooks.set_script(Script::passes(3));
    let pools = app.pools(app.gpus[0]);
    Env { app, hooks, pools }
}

impl Env {
    fn gated(&self, buf: Ptr, done: hsa_signal_t) -> Aql {
        let kernarg = self.app.kernargs(
            &self.pools,
            GatedArgs {
                buf: buf.0,
                len: WORDS as u32,
                pad: 0,
            },
        );
        let kernel = kreplay_softhsa::register_kernel("race_queues_gated_add", gated_add);
        Aql::dispatch(kernel, WORDS as u32, 64, kernarg, done)
    }
}

scenarios! {
    /// Thread B inactivates the queue (`hsa_queue_inactivate`: the packet processor stops, what
    /// is pending is aborted) while thread A's dispatch on it is being replayed, then destroys
    /// it. Without kreplay A's doorbell returned at once and B's calls return; with kreplay the
    /// replay's next pass never runs on the inactive queue: the replay must end (the tool hears
    /// that it failed) instead of waiting for it for ever, and so must B's destroy, which waits
    /// for A's handler call.
    fn a_queue_inactivated_by_another_thread_during_a_replay_does_not_hang() {
        let env = setup();
        let q = env.app.queue(env.app.gpus[0]);
        let a = env.app.buffer(env.pools.coarse, &[10; WORDS]);
        let done = env.app.signal(1);
        let (app, packet) = (env.app, env.gated(a, done));
        let inactivate = app.core().hsa_queue_inactivate_fn.expect("hsa_queue_inactivate");
        let results = support::bounded(WAIT * 3, vec![
            Box::new(move || {
                app.dispatch(q, packet);
                HSA_STATUS_SUCCESS
            }),
            Box::new(move || {
                let q = q; // the whole handle, which is Send
                assert!(support::wait_flag(&STARTED), "the first pass's kernel runs");
                // SAFETY: a live queue of this application.
                let status = unsafe { inactivate(q.0) };
                GO.store(true, Ordering::SeqCst);
                status
            }),
        ]);
        assert_eq!(results[1], HSA_STATUS_SUCCESS, "the queue was inactivated");
        let app = env.app;
        support::bounded(WAIT * 2, vec![Box::new(move || app.destroy_queue(q))]);

        let infos = env.hooks.configured_dispatches();
        assert_eq!(infos.len(), 1);
        let outcome = env.hooks.finished_record(infos[0].dispatch_id).outcome;
        assert!(outcome.is_failure(), "the tool hears that the replay failed: {outcome:?}");
        assert!(format!("{outcome:?}").contains("inactivated"), "and why: {outcome:?}");
    }

    /// Thread B inactivates the queue once the replay's last pass has run (between its PASS
    /// EXIT and the application's completion): the dispatch ran, as it would have without
    /// kreplay by then, so its completion fires and memory holds one run's result.
    fn a_queue_inactivated_after_the_last_pass_still_completes_the_dispatch() {
        let env = setup();
        GO.store(true, Ordering::SeqCst);
        let q = env.app.queue(env.app.gpus[0]);
        let a = env.app.buffer(env.pools.coarse, &[10; WORDS]);
        let done = env.app.signal(1);
        let last_pass_ran = Arc::new(AtomicBool::new(false));
        let inactivated = Arc::new(AtomicBool::new(false));
        let (ran, settled) = (last_pass_ran.clone(), inactivated.clone());
        env.hooks.set_script(Script::passes(3).on_pass_exit(move |_, _, pass, total| {
            if pass + 1 == total {
                ran.store(true, Ordering::SeqCst);
                assert!(support::wait_flag(&settled), "thread B inactivated the queue");
            }
            kreplay_passloop::ContinueChange::Keep
        }));
        let (app, packet) = (env.app, env.gated(a, done));
        let inactivate = app.core().hsa_queue_inactivate_fn.expect("hsa_queue_inactivate");
        let results = support::bounded(WAIT * 3, vec![
            Box::new(move || {
                app.dispatch(q, packet);
                HSA_STATUS_SUCCESS
            }),
            Box::new(move || {
                let q = q; // the whole handle, which is Send
                assert!(support::wait_flag(&last_pass_ran), "the last pass runs");
                // SAFETY: a live queue of this application.
                let status = unsafe { inactivate(q.0) };
                inactivated.store(true, Ordering::SeqCst);
                status
            }),
        ]);
        assert_eq!(results[1], HSA_STATUS_SUCCESS, "the queue was inactivated");

        assert_eq!(env.app.wait_zero(done), 0, "the dispatch's completion fired");
        assert_eq!(env.app.read(a, WORDS), vec![11; WORDS], "one run's result");
        let infos = env.hooks.configured_dispatches();
        let outcome = env.hooks.finished_record(infos[0].dispatch_id).outcome;
        assert!(!outcome.is_failure(), "every pass ran: {outcome:?}");
        let app = env.app;
        support::bounded(WAIT * 2, vec![Box::new(move || app.destroy_queue(q))]);
    }
}

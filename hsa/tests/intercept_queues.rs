//! Queues the application creates with `hsa_amd_queue_intercept_create` (its own packet
//! handlers on top, or another tools library loaded after kreplay that makes the application's
//! queues that way): kreplay must see them like any other queue. A replay on their agent
//! drains them and holds them off, so their kernels' writes are never undone by its restores.

#[allow(dead_code)]
#[macro_use]
mod support;

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hsa_sys::{HSA_QUEUE_TYPE_MULTI, HSA_STATUS_SUCCESS, hsa_queue_t};
use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{Phase, ToolAnswer};
use kreplay_softhsa::WorkGroup;
use support::app::{self, App, Aql, Queue, WAIT};
use support::counted::{AddOneArgs, add_one};
use support::tool::{Script, TestHooks};

/// Opened once the application's kernel may run.
static GATE: AtomicBool = AtomicBool::new(false);
/// Set by the gated kernel when its work-group started, and when it finished.
static GATED_STARTED: AtomicBool = AtomicBool::new(false);
static GATED_DONE: AtomicBool = AtomicBool::new(false);

/// `add_one` (one work-group) that waits, bounded, until `GATE` opens.
fn gated_add(group: &WorkGroup) {
    GATED_STARTED.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + WAIT;
    while !GATE.load(Ordering::SeqCst) && Instant::now() < deadline {
        std::thread::yield_now();
    }
    add_one(group);
    GATED_DONE.store(true, Ordering::SeqCst);
}

/// Creates a queue on `agent` with `hsa_amd_queue_intercept_create`, as a layer on top of the
/// runtime would, with a pass-through handler of the application's.
fn intercept_queue(app: &App, agent: hsa_sys::hsa_agent_t) -> Queue {
    let create = app
        .amd()
        .hsa_amd_queue_intercept_create_fn
        .expect("hsa_amd_queue_intercept_create");
    let mut queue: *mut hsa_queue_t = std::ptr::null_mut();
    // SAFETY: valid agent and out pointer; no error callback.
    let status = unsafe {
        create(
            agent,
            64,
            HSA_QUEUE_TYPE_MULTI,
            None,
            std::ptr::null_mut::<c_void>(),
            0,
            0,
            &raw mut queue,
        )
    };
    assert_eq!(status, HSA_STATUS_SUCCESS);
    let queue = Queue(queue);
    app.observe_forwarded(queue);
    queue
}

scenarios! {
    /// A kernel on the application's intercept queue still runs when a replay on another
    /// queue of its agent begins, and writes memory that replay snapshots: the replay waits
    /// for it (here past the drain budget: declined `agent_drain_stuck`, the dispatch run once)
    /// instead of snapshotting under it and undoing its write at the next restore.
    fn a_kernel_on_an_application_intercept_queue_is_drained_before_a_replay() {
        let hooks = TestHooks::new(0);
        let app = app::install(
            hooks.clone(),
            InstallOptions {
                drain: DrainConfig::new(Duration::from_millis(500)),
                ..Default::default()
            },
        );
        hooks.configure_replay(true);
        let gpu = app.gpus[0];
        let pools = app.pools(gpu);
        let add = kreplay_softhsa::register_kernel("intercept_add_one", add_one);
        let gated = kreplay_softhsa::register_kernel("intercept_gated_add", gated_add);
        hooks.set_script(
            Script::new(move |_, info| {
                if info.kernel_id == gated { ToolAnswer::OPT_OUT } else { ToolAnswer::passes(3) }
            })
            // Had the snapshot been taken, the application's kernel runs now and is done before
            // the first restore.
            .on_snapshot(|_, _, phase| {
                if phase == Phase::Exit {
                    GATE.store(true, Ordering::SeqCst);
                    assert!(support::wait_flag(&GATED_DONE));
                }
            }),
        );
        let theirs = app.buffer(pools.coarse, &[10; 256]);
        let ours = app.buffer(pools.coarse, &[20; 256]);
        let iq = intercept_queue(&app, gpu);
        let q = app.queue(gpu);

        let gated_done = app.signal(1);
        let kernarg = app.kernargs(&pools, AddOneArgs { buf: theirs.0, len: 256, pad: 0 });
        app.dispatch(iq, Aql::dispatch(gated, 256, 256, kernarg, gated_done));
        assert!(support::wait_flag(&GATED_STARTED), "the application's kernel started");

        let done = app.signal(1);
        let kernarg = app.kernargs(&pools, AddOneArgs { buf: ours.0, len: 256, pad: 0 });
        app.dispatch(q, Aql::dispatch(add, 256, 64, kernarg, done));
        GATE.store(true, Ordering::SeqCst);
        assert_eq!((app.wait_zero(done), app.wait_zero(gated_done)), (0, 0));

        assert_eq!(app.read(ours, 256), vec![21; 256], "the replayed dispatch ran once");
        assert_eq!(app.read(theirs, 256), vec![11; 256], "the application's kernel's write was undone");
    }
}

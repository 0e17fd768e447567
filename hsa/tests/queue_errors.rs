//! A replayed dispatch whose kernel faults (softhsa puts its queue into the error state, as a
//! GPU memory fault would). Without kreplay the faulting queue stops, the application's queue
//! error callback runs, the doorbell store returns and every other queue of the agent keeps
//! working. Under replay the same must hold: the tool learns that the pass failed, and nothing
//! hangs (the replay used to wait for the pass for ever, holding the agent).

#[allow(dead_code)]
#[macro_use]
mod support;

use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use hsa_sys::*;
use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{DeclineReason, ReplayOutcome, ToolAnswer};
use kreplay_softhsa::WorkGroup;
use support::app::{self, App, Aql, Pools, Ptr, Queue};
use support::bounded;
use support::tool::{Script, TestHooks};

static ERRORS: AtomicU32 = AtomicU32::new(0);

unsafe extern "C" fn on_queue_error(_: hsa_status_t, _: *mut hsa_queue_t, _: *mut c_void) {
    ERRORS.fetch_add(1, Ordering::SeqCst);
}

#[repr(C)]
#[derive(Clone, Copy)]
struct AddArgs {
    buf: u64,
    len: u32,
    fault: u32,
}

fn add_or_fault(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries an `AddArgs` block.
    let args: AddArgs = unsafe { group.kernargs() };
    if args.fault != 0 {
        panic!("simulated GPU memory fault");
    }
    for [i, _, _] in group.work_items() {
        if i < args.len {
            // SAFETY: the buffer holds `len` u32s.
            unsafe { *(args.buf as *mut u32).add(i as usize) += 1 };
        }
    }
}

fn queue_with_callback(app: &App, agent: hsa_agent_t) -> Queue {
    let mut queue: *mut hsa_queue_t = std::ptr::null_mut();
    let create = app.core().hsa_queue_create_fn.unwrap();
    // SAFETY: valid agent, out pointer and callback.
    let status = unsafe {
        create(
            agent,
            64,
            HSA_QUEUE_TYPE_MULTI,
            Some(on_queue_error),
            std::ptr::null_mut(),
            0,
            0,
            &raw mut queue,
        )
    };
    assert_eq!(status, HSA_STATUS_SUCCESS);
    Queue(queue)
}

fn add(app: &App, pools: &Pools, buf: Ptr, len: u32, fault: bool, done: hsa_signal_t) -> Aql {
    let kernel = kreplay_softhsa::register_kernel("add_or_fault", add_or_fault);
    let kernarg = app.kernargs(
        pools,
        AddArgs {
            buf: buf.0,
            len,
            fault: u32::from(fault),
        },
    );
    Aql::dispatch(kernel, len, 64, kernarg, done)
}

fn run(passes: u64) {
    let hooks = TestHooks::new(0);
    let app = app::install(
        hooks.clone(),
        InstallOptions {
            drain: DrainConfig::new(Duration::from_millis(500)),
            ..Default::default()
        },
    );
    hooks.configure_replay(true);
    hooks.set_script(Script::passes(passes));
    let pools = app.pools(app.gpus[0]);
    let bad_q = queue_with_callback(&app, app.gpus[0]);
    let good_q = app.queue(app.gpus[0]);
    let buf = app.buffer(pools.coarse, &[7; 64]);
    let other = app.buffer(pools.coarse, &[100; 64]);

    // The faulting dispatch, on a thread of its own.
    let bad_done = app.signal(1);
    let bad = add(&app, &pools, buf, 64, true, bad_done);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        app.dispatch(bad_q, bad);
        let _ = tx.send(());
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while ERRORS.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < deadline {
        std::thread::yield_now();
    }
    assert!(
        ERRORS.load(Ordering::SeqCst) >= 1,
        "the application's queue error callback ran"
    );
    // The application goes on submitting to the failed queue (nothing more runs there).
    let more_done = app.signal(1);
    let more = add(&app, &pools, buf, 64, false, more_done);
    let submitted = bounded(
        Duration::from_secs(5),
        vec![Box::new(move || {
            app.dispatch(bad_q, more);
            0
        })],
    );
    assert_eq!(
        submitted,
        vec![0],
        "a submission to the failed queue returns"
    );
    // Another queue of the same agent keeps working.
    let good_done = app.signal(1);
    let good = add(&app, &pools, other, 64, false, good_done);
    let waited = bounded(
        Duration::from_secs(5),
        vec![Box::new(move || {
            app.dispatch(good_q, good);
            app.wait_zero(good_done)
        })],
    );
    assert_eq!(
        waited,
        vec![0],
        "a dispatch on a healthy queue of the agent completes"
    );
    assert_eq!(app.read(other, 64), vec![101; 64]);
    if passes > 1 {
        // A dispatch on a healthy queue of the agent is replayed as ever.
        let bad_queue = hooks.configured_dispatches()[0].queue_id;
        let second = hooks
            .configured_dispatches()
            .iter()
            .find(|d| d.queue_id != bad_queue)
            .expect("the healthy queue's dispatch")
            .dispatch_id;
        assert_eq!(
            hooks.finished_record(second).outcome,
            ReplayOutcome::Replayed {
                passes,
                end: kreplay_passloop::LoopEnd::LastPass
            }
        );
    }
    assert!(
        rx.recv_timeout(Duration::from_secs(5)).is_ok(),
        "the doorbell store of the faulting dispatch returned"
    );
    // The tool learned how the faulting dispatch's replay ended.
    let first = hooks.configured_dispatches()[0].dispatch_id;
    let record = hooks.finished_record(first);
    if passes > 1 {
        match &record.outcome {
            ReplayOutcome::PassFailed { pass: 0, decline } => {
                assert_eq!(decline.reason, DeclineReason::PassDrainStuck);
                assert!(decline.detail.contains("error state"), "{}", decline.detail);
            }
            other => panic!("a pass whose kernel faulted is reported as {other:?}"),
        }
    }
    // The faulting dispatch never completes, with kreplay or without: the application heard of
    // it through its queue error callback.
    assert_eq!(app.load(bad_done), 1);
}

scenarios! {
    /// Control: the same faulting dispatch with replay configured but answered with 1 pass
    /// (the ordinary path): nothing hangs.
    fn an_unreplayed_kernel_that_faults_does_not_block_the_agent() {
        run(1);
    }

    /// A 3-pass replay of a kernel that faults on its first pass.
    fn a_replayed_kernel_that_faults_neither_hangs_nor_blocks_the_agent() {
        run(3);
    }
}

/// A queue fails on an ordinary (not replayed) dispatch; the application goes on submitting to
/// it; then a dispatch on a healthy queue of the same agent is replayed. The failed queue runs
/// nothing more, so it is no queue for the replay's drain to wait for.
fn failed_queue_then_replay_on_its_agent() {
    let hooks = TestHooks::new(0);
    let app = app::install(
        hooks.clone(),
        InstallOptions {
            drain: DrainConfig::new(Duration::from_millis(500)),
            ..Default::default()
        },
    );
    hooks.configure_replay(true);
    // 32 work-items: run once; 64: replayed in 3 passes.
    hooks.set_script(Script::new(|_, info| {
        ToolAnswer::passes(if info.grid_size[0] == 32 { 1 } else { 3 })
    }));
    let pools = app.pools(app.gpus[0]);
    let bad_q = queue_with_callback(&app, app.gpus[0]);
    let good_q = app.queue(app.gpus[0]);
    let buf = app.buffer(pools.coarse, &[7; 64]);
    let other = app.buffer(pools.coarse, &[100; 64]);
    let bad_done = app.signal(1);
    let bad = add(&app, &pools, buf, 32, true, bad_done);
    let finished = bounded(
        Duration::from_secs(5),
        vec![Box::new(move || {
            app.dispatch(bad_q, bad);
            0
        })],
    );
    assert_eq!(finished, vec![0]);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while ERRORS.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < deadline {
        std::thread::yield_now();
    }
    assert!(ERRORS.load(Ordering::SeqCst) >= 1, "the queue failed");
    let more_done = app.signal(1);
    let more = add(&app, &pools, buf, 32, false, more_done);
    let good_done = app.signal(1);
    let good = add(&app, &pools, other, 64, false, good_done);
    let started = std::time::Instant::now();
    let waited = bounded(
        Duration::from_secs(5),
        vec![Box::new(move || {
            app.dispatch(bad_q, more);
            app.dispatch(good_q, good);
            app.wait_zero(good_done)
        })],
    );
    assert_eq!(waited, vec![0]);
    let second = hooks
        .configured_dispatches()
        .iter()
        .find(|d| d.grid_size[0] == 64)
        .expect("the healthy queue's dispatch")
        .dispatch_id;
    assert_eq!(
        hooks.finished_record(second).outcome,
        ReplayOutcome::Replayed {
            passes: 3,
            end: kreplay_passloop::LoopEnd::LastPass
        },
        "after {:?}",
        started.elapsed()
    );
    assert_eq!(app.read(other, 64), vec![101; 64]);
}

scenarios! {
    fn a_failed_queue_is_not_waited_for_by_a_later_replay_of_its_agent() {
        failed_queue_then_replay_on_its_agent();
    }
}

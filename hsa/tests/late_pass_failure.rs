//! A replay whose second pass fails (its kernel faults, as a GPU memory fault would, only when
//! it runs again): what the tool got from the first pass stays delivered, and the tool learns
//! which pass failed.

#[allow(dead_code)]
#[macro_use]
mod support;

use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use hsa_sys::*;
use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{DeclineReason, ReplayOutcome};
use kreplay_softhsa::WorkGroup;
use support::app::{self, Aql, Queue};
use support::tool::{Event, Script, TestHooks};

static RUNS: AtomicU32 = AtomicU32::new(0);
static ERRORS: AtomicU32 = AtomicU32::new(0);

unsafe extern "C" fn on_queue_error(_: hsa_status_t, _: *mut hsa_queue_t, _: *mut c_void) {
    ERRORS.fetch_add(1, Ordering::SeqCst);
}

/// `buf[0] += 1`, faulting from its second run on.
fn add_then_fault(group: &WorkGroup) {
    if RUNS.fetch_add(1, Ordering::SeqCst) >= 1 {
        panic!("simulated GPU memory fault");
    }
    // SAFETY: every dispatch of this kernel carries the buffer's address.
    let buf: u64 = unsafe { group.kernargs() };
    // SAFETY: the buffer holds at least one u32; one work-item.
    unsafe { *(buf as *mut u32) += 1 };
}

scenarios! {
    fn what_the_tool_got_from_pass_0_stays_when_pass_1_fails() {
        let hooks = TestHooks::new(1);
        let app = app::install(
            hooks.clone(),
            InstallOptions {
                drain: DrainConfig::new(Duration::from_millis(500)),
                ..Default::default()
            },
        );
        hooks.configure_replay(true);
        hooks.set_script(Script::passes(3));
        let gpu = app.gpus[0];
        let pools = app.pools(gpu);
        let mut queue: *mut hsa_queue_t = std::ptr::null_mut();
        let create = app.core().hsa_queue_create_fn.unwrap();
        // SAFETY: a valid agent, out pointer and callback.
        let status = unsafe {
            create(gpu, 64, HSA_QUEUE_TYPE_MULTI, Some(on_queue_error), std::ptr::null_mut(),
                0, 0, &raw mut queue)
        };
        assert_eq!(status, HSA_STATUS_SUCCESS);
        let queue = Queue(queue);
        let buf = app.buffer(pools.coarse, &[7; 4]);
        let kernel = kreplay_softhsa::register_kernel("add_then_fault", add_then_fault);
        let kernarg = app.kernargs(&pools, buf.0);
        let done = app.signal(1);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            app.dispatch(queue, Aql::dispatch(kernel, 1, 1, kernarg, done));
            let _ = tx.send(());
        });
        assert!(rx.recv_timeout(Duration::from_secs(10)).is_ok(), "the doorbell store returned");
        let dispatch = hooks.configured_dispatches()[0].dispatch_id;
        let record = hooks.finished_record(dispatch);
        match &record.outcome {
            ReplayOutcome::PassFailed { pass: 1, decline } => {
                assert_eq!(decline.reason, DeclineReason::PassDrainStuck);
            }
            other => panic!("the failed pass is reported as {other:?}"),
        }
        assert_eq!(record.cost.passes_run, 2);
        // Pass 0's dispatch record was delivered, and only pass 0's: pass 1 never completed.
        let passes: Vec<Option<u64>> = hooks
            .records()
            .iter()
            .filter(|(_, r)| r.info.dispatch_id == dispatch)
            .map(|(_, r)| r.pass)
            .collect();
        assert_eq!(passes, vec![Some(0)], "the tool's records of the dispatch");
        // Both passes were entered and exited (the tool hears the end of the failed one).
        let exits: Vec<u64> = hooks
            .events_of(dispatch)
            .iter()
            .filter_map(|e| match e {
                Event::PassExit { pass, .. } => Some(*pass),
                _ => None,
            })
            .collect();
        assert_eq!(exits, vec![0, 1]);
        // The application heard of the fault as it would of one in its own run.
        assert!(ERRORS.load(Ordering::SeqCst) >= 1);
        assert_eq!(app.load(done), 1, "a dispatch whose queue failed never completes");
    }
}

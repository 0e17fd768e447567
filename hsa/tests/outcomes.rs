//! What happens when the runtime refuses a resource a replay needs: everything the passes need
//! is acquired before the snapshot, so a refusal there is a decline and the dispatch runs once.
//!
//! The fault is injected without touching softhsa: the scenario replaces `hsa_signal_create` in
//! its copy of the API table (before kreplay wraps it) with a function that fails once when the
//! scenario arms it, and otherwise calls softhsa's.

// The shared scenario support; this file uses only part of it.
#[macro_use]
#[allow(dead_code)]
mod support;

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use hsa_sys::*;
use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{DeclineReason, RanOnceReason, ReplayOutcome, ToolAnswer};
use kreplay_softhsa::{OwnedApiTable, WorkGroup};
use support::app::{self, Aql, WAIT};
use support::tool::{Script, TestHooks};

/// Arguments of `add_one`.
#[repr(C)]
#[derive(Clone, Copy)]
struct AddArgs {
    buf: u64,
    len: u32,
    pad: u32,
}

static RUNS: AtomicU32 = AtomicU32::new(0);

/// `x[i] += 1`; work-group 0 counts the run.
fn add_one(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries an `AddArgs` block.
    let args: AddArgs = unsafe { group.kernargs() };
    if group.group_id() == [0, 0, 0] {
        RUNS.fetch_add(1, Ordering::SeqCst);
    }
    for [i, _, _] in group.work_items() {
        if i < args.len {
            // SAFETY: the buffer holds `len` u32; each work-item owns index `i`.
            unsafe { *(args.buf as *mut u32).add(i as usize) += 1 };
        }
    }
}

type SignalCreate =
    unsafe extern "C" fn(i64, u32, *const hsa_agent_t, *mut hsa_signal_t) -> hsa_status_t;

/// softhsa's `hsa_signal_create`.
static REAL_SIGNAL_CREATE: OnceLock<SignalCreate> = OnceLock::new();
/// Signal creations still to refuse.
static REFUSE_SIGNALS: AtomicU32 = AtomicU32::new(0);
/// Signal creations refused.
static REFUSED: AtomicU32 = AtomicU32::new(0);

/// `hsa_signal_create` that refuses while armed, else softhsa's.
unsafe extern "C" fn flaky_signal_create(
    initial: i64,
    consumers: u32,
    consumer_list: *const hsa_agent_t,
    signal: *mut hsa_signal_t,
) -> hsa_status_t {
    if REFUSE_SIGNALS
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
    {
        REFUSED.fetch_add(1, Ordering::SeqCst);
        return HSA_STATUS_ERROR_OUT_OF_RESOURCES;
    }
    let real = REAL_SIGNAL_CREATE.get().expect("installed");
    // SAFETY: forwarded unchanged to softhsa's entry with the caller's arguments.
    unsafe { real(initial, consumers, consumer_list, signal) }
}

scenarios! {
    /// The pass signal cannot be created: the replay is declined before any snapshot or pass
    /// (no PASS ENTER/EXIT for a kernel that never ran), the dispatch runs once with its own
    /// completion, and memory is as after one run.
    fn a_pass_signal_that_cannot_be_created_declines_before_the_snapshot_and_runs_once() {
        let table: &'static mut OwnedApiTable = Box::leak(Box::new(OwnedApiTable::softhsa()));
        // SAFETY: the copy's core table is valid and only this scenario uses it so far.
        unsafe {
            let core = (*table.as_mut_ptr()).core_;
            let real = (*core).hsa_signal_create_fn.expect("hsa_signal_create");
            assert!(REAL_SIGNAL_CREATE.set(real).is_ok(), "set once");
            (*core).hsa_signal_create_fn = Some(flaky_signal_create);
        }
        let hooks = TestHooks::new(0);
        let app = app::install_into(
            table,
            hooks.clone(),
            InstallOptions { drain: DrainConfig::new(WAIT), ..Default::default() },
        );
        hooks.configure_replay(true);
        let kernel = kreplay_softhsa::register_kernel("outcomes_add_one", add_one);
        // The refusal is armed when the tool hears of the dispatch: the next signal kreplay asks
        // for is refused, wherever it asks.
        hooks.set_script(Script::new(|_, _| {
            REFUSE_SIGNALS.store(1, Ordering::SeqCst);
            ToolAnswer::passes(3)
        }));
        let pools = app.pools(app.gpus[0]);
        let q = app.queue(app.gpus[0]);
        let init: Vec<u32> = (0..64).map(|i| 5 + 3 * i).collect();
        let buf = app.buffer(pools.coarse, &init);
        let done = app.signal(1);
        let args = app.kernargs(&pools, AddArgs { buf: buf.0, len: 64, pad: 0 });

        app.dispatch(q, Aql::dispatch(kernel, 64, 64, args, done));

        assert_eq!(app.wait_zero(done), 0, "the application's completion fires");
        assert_eq!(REFUSED.load(Ordering::SeqCst), 1, "the fault was injected");
        let ids: Vec<u64> = hooks.configured_dispatches().iter().map(|i| i.dispatch_id).collect();
        assert_eq!(ids.len(), 1);
        match hooks.finished_record(ids[0]).outcome {
            ReplayOutcome::RanOnce { why: RanOnceReason::Declined(d) } => {
                assert_eq!(d.reason, DeclineReason::SnapshotFailed);
                assert!(d.detail.contains("signal"), "{d}");
            }
            other => panic!("expected a decline before the snapshot, got {other:?}"),
        }
        assert_eq!(hooks.labels_of(ids[0]), vec!["config-enter", "config-exit"], "no snapshot, no pass");
        assert_eq!(RUNS.load(Ordering::SeqCst), 1, "the kernel ran exactly once");
        assert_eq!(app.read(buf, 64), init.iter().map(|x| x + 1).collect::<Vec<_>>());
        assert_eq!(app.load(done), 0, "the completion fired exactly once");
    }
}

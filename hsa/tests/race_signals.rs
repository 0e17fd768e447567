//! Signals an application shares with its kernels while replays run: a kernel that counts an
//! HSA signal down itself (device-side signalling, as a kernel does through the signal's value
//! word) must leave the signal where one run leaves it, and the application's waits on it must
//! end as without kreplay.

// Each test file uses part of the shared harness.
#[allow(dead_code)]
#[macro_use]
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use hsa_sys::hsa_signal_t;
use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{DeclineReason, RanOnceReason, ReplayOutcome};
use kreplay_softhsa::WorkGroup;
use support::app::{self, App, Aql, Pools};
use support::tool::{Script, TestHooks};

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
            drain: DrainConfig::new(Duration::from_secs(5)),
            ..Default::default()
        },
    );
    hooks.configure_replay(true);
    hooks.set_script(Script::passes(3));
    let pools = app.pools(app.gpus[0]);
    Env { app, hooks, pools }
}

#[repr(C)]
#[derive(Clone, Copy)]
struct SignalArgs {
    /// An HSA signal handle (the address of the signal's `amd_signal_t`), or the address of
    /// its value.
    signal: u64,
    /// Where the value is from `signal`: [`VALUE_OFFSET`] for a handle, 0 for a value pointer.
    offset: u64,
}

/// Byte offset of the value in an `amd_signal_t` (after the 8-byte kind).
const VALUE_OFFSET: u64 = 8;

/// Work-group 0 counts the signal in its arguments down by one, through its value word.
fn count_down(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries a `SignalArgs` block.
    let args: SignalArgs = unsafe { group.kernargs() };
    if group.group_id() == [0, 0, 0] {
        // SAFETY: the handle is the address of a live signal's `amd_signal_t`, whose value is
        // an aligned 64-bit word the device updates atomically.
        let value = unsafe { &*((args.signal + args.offset) as *const AtomicI64) };
        value.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Env {
    /// Dispatches `count_down` with `argument` (a signal's handle, or its value's address) and
    /// returns how the tool heard the dispatch ended.
    fn count_down(&self, argument: u64, offset: u64) -> ReplayOutcome {
        let q = self.app.queue(self.app.gpus[0]);
        let done = self.app.signal(1);
        let kernarg = self.app.kernargs(
            &self.pools,
            SignalArgs {
                signal: argument,
                offset,
            },
        );
        let kernel = kreplay_softhsa::register_kernel("race_signals_count_down", count_down);
        self.app
            .dispatch(q, Aql::dispatch(kernel, 64, 64, kernarg, done));
        assert_eq!(self.app.wait_zero(done), 0);
        let id = self
            .hooks
            .configured_dispatches()
            .last()
            .expect("a dispatch")
            .dispatch_id;
        self.hooks.finished_record(id).outcome
    }
}

fn declined(outcome: &ReplayOutcome) -> Option<DeclineReason> {
    match outcome {
        ReplayOutcome::RanOnce {
            why: RanOnceReason::Declined(d),
        } => Some(d.reason),
        _ => None,
    }
}

/// `hsa_amd_signal_create` through the (wrapped) table.
fn amd_signal(app: &App, initial: i64) -> hsa_signal_t {
    let create = app
        .amd()
        .hsa_amd_signal_create_fn
        .expect("hsa_amd_signal_create");
    let mut signal = hsa_signal_t { handle: 0 };
    // SAFETY: no consumers, no attributes, a valid out pointer.
    let status = unsafe { create(initial, 0, std::ptr::null(), 0, &raw mut signal) };
    assert_eq!(status, hsa_sys::HSA_STATUS_SUCCESS);
    signal
}

/// `hsa_amd_signal_value_pointer` through the (wrapped) table.
fn value_pointer(app: &App, signal: hsa_signal_t) -> u64 {
    let get = app
        .amd()
        .hsa_amd_signal_value_pointer_fn
        .expect("hsa_amd_signal_value_pointer");
    let mut ptr: *mut hsa_sys::hsa_signal_value_t = std::ptr::null_mut();
    // SAFETY: a live signal and a valid out pointer.
    let status = unsafe { get(signal, &raw mut ptr) };
    assert_eq!(status, hsa_sys::HSA_STATUS_SUCCESS);
    ptr as u64
}

scenarios! {
    /// A kernel counts an application signal down from 2 by itself (the signal's value word is
    /// memory the kernel writes, and host waiters see each write at once): after the dispatch
    /// the signal is at 1, as after one run, not one lower per pass. No snapshot can take such
    /// a write back, so the dispatch runs once, declined.
    fn a_signal_a_replayed_kernel_counts_down_ends_where_one_run_leaves_it() {
        let env = setup();
        let counted = env.app.signal(2);

        let outcome = env.count_down(counted.handle, VALUE_OFFSET);

        assert_eq!(env.app.load(counted), 1, "one run's count ({outcome:?})");
        assert_eq!(declined(&outcome), Some(DeclineReason::UntrackedMemory), "{outcome:?}");
    }

    /// The same with a signal made by `hsa_amd_signal_create`, which the kernel reaches through
    /// the address `hsa_amd_signal_value_pointer` gives.
    fn a_signal_reached_through_its_value_pointer_is_counted_down_once() {
        let env = setup();
        let counted = amd_signal(&env.app, 2);
        let value = value_pointer(&env.app, counted);

        let outcome = env.count_down(value, 0);

        assert_eq!(env.app.load(counted), 1, "one run's count ({outcome:?})");
        assert_eq!(declined(&outcome), Some(DeclineReason::UntrackedMemory), "{outcome:?}");
    }
}

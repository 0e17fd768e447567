//! Time on the HSA backend's own copies: a restore that goes through the runtime's
//! asynchronous copies (the discrete-GPU path, `force_runtime_copies`) whose copies land later
//! than the drain and pass deadlines. kreplay's copies, like a running pass, are in flight and
//! writing memory: they are waited for, never abandoned.

// Each test file uses part of the shared harness.
#[allow(dead_code)]
#[macro_use]
mod support;

use std::time::Duration;

use hsa_sys::*;
use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{LoopEnd, ReplayOutcome};
use kreplay_snapshot::{RestoreStrategy, SnapshotConfig, StoreTier};
use kreplay_softhsa::WorkGroup;
use kreplay_softhsa::faults::{self, Fault, FaultPlan};
use support::app::{self, App, Aql, Pools, Ptr};
use support::tool::{Script, TestHooks};

const WORDS: usize = 1024;

#[repr(C)]
#[derive(Clone, Copy)]
struct AddArgs {
    buf: u64,
    len: u32,
    pad: u32,
}

/// `buf[i] += 1`.
fn add_one(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries an `AddArgs` block.
    let args: AddArgs = unsafe { group.kernargs() };
    for [i, _, _] in group.work_items() {
        if i < args.len {
            // SAFETY: the buffer holds `len` u32s; each work-item owns index `i`.
            unsafe { *(args.buf as *mut u32).add(i as usize) += 1 };
        }
    }
}

fn add_packet(app: &App, pools: &Pools, buf: Ptr, done: hsa_signal_t) -> Aql {
    let kernarg = app.kernargs(
        pools,
        AddArgs {
            buf: buf.0,
            len: WORDS as u32,
            pad: 0,
        },
    );
    let kernel = kreplay_softhsa::register_kernel("time_copies_add_one", add_one);
    Aql::dispatch(kernel, WORDS as u32, 64, kernarg, done)
}

scenarios! {
    /// Restores through the runtime's async copies, each landing well after the drain and
    /// pass deadlines: the replay waits for them (with a warning) and ends normally, every
    /// pass saw the original bytes and memory is as after one run. Before, the restore was
    /// reported failed while its copies were still in flight, writing the snapshot's bytes
    /// into memory after the application had its completion.
    fn a_restore_whose_copies_land_after_the_pass_deadline_is_waited_for() {
        let hooks = TestHooks::new(0);
        let app = app::install(
            hooks.clone(),
            InstallOptions {
                drain: DrainConfig::new(Duration::from_millis(100)),
                force_runtime_copies: true,
                snapshot: SnapshotConfig::default().with_store(StoreTier::Host).with_strategy(RestoreStrategy::Full),
                ..Default::default()
            },
        );
        hooks.configure_replay(true);
        hooks.set_script(Script::passes(3));
        let gpu = app.gpus[0];
        let pools = app.pools(gpu);
        let q = app.queue(gpu);
        let init: Vec<u32> = (0..WORDS as u32).collect();
        let buf = app.buffer(pools.coarse, &init);
        let done = app.signal(1);
        let packet = add_packet(&app, &pools, buf, done);

        faults::install(Some(FaultPlan::new(1).with(Fault::AsyncCopyDelay, 1.0).with_delay(Fault::AsyncCopyDelay, Duration::from_millis(400))));
        app.dispatch(q, packet);
        let completed = app.wait_zero(done);
        faults::install(None);

        assert_eq!(completed, 0, "the dispatch completed");
        assert!(faults::fired(Fault::AsyncCopyDelay) >= 1, "the restore's copies were late");
        let id = hooks.configured_dispatches()[0].dispatch_id;
        assert_eq!(hooks.finished_record(id).outcome, ReplayOutcome::Replayed { passes: 3, end: LoopEnd::LastPass });
        let expected: Vec<u32> = init.iter().map(|v| v + 1).collect();
        assert_eq!(app.read(buf, WORDS), expected, "memory is as after one run");
        assert!(hooks.warnings().iter().any(|w| w.contains("still in flight")), "the slow restore was warned about: {:?}", hooks.warnings());
    }
}

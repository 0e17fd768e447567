//! A runtime copy that fails once, as a transient fault would, while a replay restores memory
//! kept in a device shadow: found by `kreplay stress --seed 206 --threads 8 --seconds 8 --faults
//! copy:0.05` with `KREPLAY_SNAPSHOT_STORE=device KREPLAY_RESTORE=full`, where restores that hit
//! one failed copy gave up and left 23 of 32 buffers unlike a run without kreplay.

// Each test file uses part of the shared harness.
#[allow(dead_code)]
#[macro_use]
mod support;

use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{ContinueChange, LoopEnd, ReplayOutcome};
use kreplay_snapshot::{RestoreStrategy, SnapshotConfig, StoreTier};
use kreplay_softhsa::faults::{self, Fault, FaultPlan};
use support::app::{self, Aql, WAIT};
use support::counted::{AddArgs, add, runs, seen};
use support::tool::{Script, TestHooks};

const WORDS: usize = 16 * 1024;

fn one_failed_copy_before_a_restore(store: StoreTier, fault: Fault) {
    let hooks = TestHooks::new(0);
    let app = app::install(
        hooks.clone(),
        InstallOptions {
            snapshot: SnapshotConfig::default()
                .with_store(store)
                .with_strategy(RestoreStrategy::Full)
                .with_chunk_size(4096),
            drain: DrainConfig::new(WAIT),
            // Without a device shadow, every byte moves through the runtime's copies (a
            // discrete GPU's path).
            force_runtime_copies: store != StoreTier::Device,
            ..Default::default()
        },
    );
    hooks.configure_replay(true);
    let pools = app.pools(app.gpus[0]);
    let q = app.queue(app.gpus[0]);
    let a = app.buffer(pools.coarse, &[10; WORDS]);
    hooks.set_script(Script::passes(3).on_pass_exit(move |_, _, pass, _| {
        if pass == 0 {
            // The restore's next runtime copy fails, once.
            faults::install(Some(FaultPlan::new(1).with(fault, 1.0).at_most(fault, 1)));
        }
        ContinueChange::Keep
    }));
    let kernarg = app.kernargs(
        &pools,
        AddArgs {
            buf: a.0,
            len: WORDS as u32,
            tag: 1,
            amount: 1,
        },
    );
    let kernel = kreplay_softhsa::register_kernel("race_faults_add", add);
    let done = app.signal(1);

    app.dispatch(q, Aql::dispatch(kernel, WORDS as u32, 64, kernarg, done));

    assert_eq!(app.wait_zero(done), 0);
    assert_eq!(faults::fired(fault), 1, "one copy failed");
    faults::install(None);
    let id = hooks.configured_dispatches()[0].dispatch_id;
    let outcome = hooks.finished_record(id).outcome;
    assert_eq!(
        outcome,
        ReplayOutcome::Replayed {
            passes: 3,
            end: LoopEnd::LastPass
        },
        "the failed copy was tried again"
    );
    assert_eq!(
        (runs(1), seen(1)),
        (3, vec![10; 3]),
        "every pass started from the snapshot"
    );
    assert_eq!(app.read(a, WORDS), vec![11; WORDS], "one run's result");
}

scenarios! {
    fn a_restore_copy_that_fails_once_is_tried_again_on_a_device_shadow() {
        one_failed_copy_before_a_restore(StoreTier::Device, Fault::Copy);
    }

    fn an_async_restore_copy_refused_once_is_tried_again_from_a_host_store() {
        one_failed_copy_before_a_restore(StoreTier::Host, Fault::AsyncCopy);
    }
}

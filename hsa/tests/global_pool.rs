//! kreplay's copies, hashes and page scans run on a thread pool of kreplay's own: rayon's
//! global pool belongs to the application, which may size it itself (`build_global`) at any
//! time, also after replays ran. Each scenario replays dispatches whose snapshot is made of one
//! piece (where the copy runs on the calling thread) and of many, with each restore strategy,
//! then builds the global pool as an application would.

// Each test file uses part of the shared harness.
#[allow(dead_code)]
#[macro_use]
mod support;

use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{LoopEnd, ReplayOutcome};
use kreplay_snapshot::{RestoreStrategy, SnapshotConfig, StoreTier};
use support::app::{self, Aql, WAIT};
use support::counted::{AddArgs, add};
use support::tool::{Script, TestHooks};

/// Replays `add` over buffers of `words` u32 words (one 4-byte word per work-item) with
/// `strategy` on `tier`, three passes, and checks the result and the outcome.
fn replay_add(strategy: RestoreStrategy, tier: StoreTier, words: &[usize]) {
    let hooks = TestHooks::new(0);
    let mut snapshot = SnapshotConfig::default();
    snapshot.strategy = strategy;
    snapshot.store = tier;
    let app = app::install(
        hooks.clone(),
        InstallOptions {
            drain: DrainConfig::new(WAIT),
            snapshot,
            ..Default::default()
        },
    );
    hooks.configure_replay(true);
    hooks.set_script(Script::passes(3));
    let pools = app.pools(app.gpus[0]);
    let q = app.queue(app.gpus[0]);
    let kernel = kreplay_softhsa::register_kernel("global_pool_add", add);
    for (tag, &len) in words.iter().enumerate() {
        let buf = app.buffer(pools.coarse, &vec![7; len]);
        let args = app.kernargs(
            &pools,
            AddArgs {
                buf: buf.0,
                len: len as u32,
                tag: tag as u32,
                amount: 2,
            },
        );
        for round in 1..=2u32 {
            let done = app.signal(1);
            app.dispatch(q, Aql::dispatch(kernel, len as u32, 256, args, done));
            assert_eq!(app.wait_zero(done), 0);
            assert_eq!(
                app.read(buf, len),
                vec![7 + 2 * round; len],
                "{strategy:?} {tier:?}"
            );
            let last = hooks
                .configured_dispatches()
                .last()
                .expect("a dispatch")
                .dispatch_id;
            assert_eq!(
                hooks.finished_record(last).outcome,
                ReplayOutcome::Replayed {
                    passes: 3,
                    end: LoopEnd::LastPass
                },
                "{strategy:?} {tier:?}"
            );
        }
    }
}

/// After the replays, the application sizes rayon's global pool: it must still be free.
fn application_builds_the_global_pool() {
    rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build_global()
        .expect("rayon's global pool is the application's to build after replays");
    assert_eq!(rayon::current_num_threads(), 3);
}

/// One replayed footprint of `words` u32 with `strategy` on `tier`, then the application's
/// `build_global`.
fn scenario(strategy: RestoreStrategy, tier: StoreTier, words: usize) {
    replay_add(strategy, tier, &[words]);
    application_builds_the_global_pool();
}

/// Under one 1 MiB piece: copied, hashed and written back on the replaying thread.
const SMALL: usize = 64;
/// Several pieces, copied on kreplay's pool.
const LARGE: usize = 1 << 20;
/// A followed footprint whose page scans run in pieces on several threads (above
/// `kreplay_wtrack::SCAN_PIECE`).
const SCANNED: usize = 40 << 20;

scenarios! {
    fn a_small_full_replay_leaves_rayons_global_pool_to_the_application() {
        scenario(RestoreStrategy::Full, StoreTier::Host, SMALL);
    }
    fn a_small_hash_replay_leaves_rayons_global_pool_to_the_application() {
        scenario(RestoreStrategy::Hash, StoreTier::Host, SMALL);
    }
    fn a_small_writeset_replay_leaves_rayons_global_pool_to_the_application() {
        scenario(RestoreStrategy::Writeset, StoreTier::Host, SMALL);
    }
    fn a_small_tracked_replay_leaves_rayons_global_pool_to_the_application() {
        scenario(RestoreStrategy::Tracked, StoreTier::Host, SMALL);
    }
    fn a_small_device_shadow_replay_leaves_rayons_global_pool_to_the_application() {
        scenario(RestoreStrategy::Full, StoreTier::Device, SMALL);
    }
    fn a_small_spill_file_replay_leaves_rayons_global_pool_to_the_application() {
        scenario(RestoreStrategy::Hash, StoreTier::File, SMALL);
    }
    fn a_large_hash_replay_leaves_rayons_global_pool_to_the_application() {
        scenario(RestoreStrategy::Hash, StoreTier::Host, LARGE);
    }
    fn a_large_followed_replay_leaves_rayons_global_pool_to_the_application() {
        scenario(RestoreStrategy::Tracked, StoreTier::Host, SCANNED);
    }
}

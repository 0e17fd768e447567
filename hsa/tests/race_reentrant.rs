//! A tool's callbacks making HSA calls of their own (copies, fills, frees) while the replay
//! they belong to keeps the application's memory: what the tool writes survives the replay's
//! restores, and memory it frees meanwhile is neither read nor written after the free.

// Each test file uses part of the shared harness.
#[allow(dead_code)]
#[macro_use]
mod support;

use std::sync::Arc;
use std::time::Duration;

use hsa_sys::hsa_signal_t;
use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{ContinueChange, LoopEnd, ReplayOutcome};
use support::app::{self, App, Aql, Pools, Ptr};
use support::counted::{AddArgs, add, runs};
use support::tool::{Script, TestHooks};

const WORDS: usize = 64;
const TAG: u32 = 1;

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
    let pools = app.pools(app.gpus[0]);
    Env { app, hooks, pools }
}

impl Env {
    fn add(&self, buf: Ptr, amount: u32, done: hsa_signal_t) -> Aql {
        let kernarg = self.app.kernargs(
            &self.pools,
            AddArgs {
                buf: buf.0,
                len: WORDS as u32,
                tag: TAG,
                amount,
            },
        );
        let kernel = kreplay_softhsa::register_kernel("race_reentrant_add", add);
        Aql::dispatch(kernel, WORDS as u32, 64, kernarg, done)
    }
}

/// Words of the tool's scratch buffer: large enough that the allocator maps it on its own and
/// unmaps it at the free, so that reading it after the free faults.
const SCRATCH_WORDS: usize = 1 << 20;

scenarios! {
    /// At the first PASS EXIT the tool fills its result buffer and a scratch buffer (both in
    /// the agent's coarse memory, so in the replay's snapshot, the tool having made them
    /// before the dispatch), then frees the scratch buffer. The fills are re-entrant work the
    /// replay keeps through its restores; the freed buffer must simply be left out (reading it
    /// at the next restore reads unmapped memory), and the result buffer's fill must survive.
    fn a_tool_fill_into_memory_it_frees_before_the_next_restore_loses_nothing() {
        let env = setup();
        let q = env.app.queue(env.app.gpus[0]);
        let a = env.app.buffer(env.pools.coarse, &[10; WORDS]);
        let result = env.app.buffer(env.pools.coarse, &[0; WORDS]);
        let scratch = env.app.alloc(env.pools.coarse, SCRATCH_WORDS * 4);
        let app = env.app;
        env.hooks.set_script(Script::passes(3).on_pass_exit(move |_, _, pass, _| {
            if pass == 0 {
                app.fill(result, 7, WORDS);
                app.fill(scratch, 9, SCRATCH_WORDS);
                app.free(scratch);
            }
            ContinueChange::Keep
        }));
        let done = env.app.signal(1);

        env.app.dispatch(q, env.add(a, 1, done));

        assert_eq!(env.app.wait_zero(done), 0);
        let infos = env.hooks.configured_dispatches();
        let outcome = env.hooks.finished_record(infos[0].dispatch_id).outcome;
        assert_eq!(outcome, ReplayOutcome::Replayed { passes: 3, end: LoopEnd::LastPass });
        assert_eq!(runs(TAG), 3);
        assert_eq!(env.app.read(a, WORDS), vec![11; WORDS], "single-run results");
        assert_eq!(env.app.read(result, WORDS), vec![7; WORDS], "the tool's fill survived the restores");
        assert_eq!(env.hooks.warnings(), Vec::<String>::new(), "nothing was lost");
    }
}

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
use kreplay_passloop::{ContinueChange, LoopEnd, ReplayOutcome, ToolAnswer};
use support::app::{self, App, Aql, Pools, Ptr, Queue, WAIT};
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
    setup_with(Duration::from_secs(5))
}

fn setup_with(drain: Duration) -> Env {
    let hooks = TestHooks::new(0);
    let app = app::install(
        hooks.clone(),
        InstallOptions {
            drain: DrainConfig::new(drain),
            ..Default::default()
        },
    );
    hooks.configure_replay(true);
    let pools = app.pools(app.gpus[0]);
    Env { app, hooks, pools }
}

impl Env {
    fn add(&self, buf: Ptr, amount: u32, done: hsa_signal_t) -> Aql {
        self.add_tagged(buf, TAG, amount, done)
    }

    fn add_tagged(&self, buf: Ptr, tag: u32, amount: u32, done: hsa_signal_t) -> Aql {
        let kernarg = self.app.kernargs(
            &self.pools,
            AddArgs {
                buf: buf.0,
                len: WORDS as u32,
                tag,
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

/// The write index of `queue` (every slot reserved so far).
fn write_index(app: &App, queue: Queue) -> u64 {
    let load = app
        .core()
        .hsa_queue_load_write_index_scacquire_fn
        .expect("load_write_index");
    // SAFETY: a live queue of this application.
    unsafe { load(queue.0) }
}

scenarios! {
    /// Thread A's tool writes its own buffer with `hsa_memory_copy` from CONFIG ENTER (say,
    /// zeroing its counters) while thread B's dispatch on another queue of the agent is being
    /// replayed. A's copy waits for B's replay, as every runtime write into the agent does; but
    /// B's drain needs a marker from A's queue, which ran a kernel since the last one, and only a
    /// thread handling A's queue can write it: A, waiting for the lock inside that queue's
    /// handler, must keep writing its queue's mail as every other wait there does, or B's drain
    /// waits out its whole timeout and B's dispatch is declined.
    fn a_tool_copy_from_config_enter_does_not_hold_another_threads_replay_off() {
        let env = setup_with(Duration::from_secs(3));
        let (qa, qb) = (env.app.queue(env.app.gpus[0]), env.app.queue(env.app.gpus[0]));
        // SAFETY: live queues of this scenario.
        let (ida, idb) = unsafe { ((*qa.0).id, (*qb.0).id) };
        let (a, b) = (env.app.buffer(env.pools.coarse, &[10; WORDS]), env.app.buffer(env.pools.coarse, &[20; WORDS]));
        let counters = env.app.buffer(env.pools.coarse, &[5; WORDS]);
        let app = env.app;
        let seen = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let noted = seen.clone();
        env.hooks.set_script(Script::new(move |_, info| {
            if info.queue_id == ida && noted.load(std::sync::atomic::Ordering::SeqCst) != 0 {
                // B's replay is draining once it rang a wake-up into A's queue: A's queue's
                // write index moved past what A reserved.
                let reserved = noted.load(std::sync::atomic::Ordering::SeqCst);
                let deadline = std::time::Instant::now() + WAIT;
                while write_index(&app, qa) <= reserved && std::time::Instant::now() < deadline {
                    std::thread::yield_now();
                }
                app.write(counters, &[0; WORDS]);
                return ToolAnswer::passes(1);
            }
            ToolAnswer::passes(if info.queue_id == idb { 3 } else { 1 })
        }));
        // A's queue runs a kernel (so it has work since its last drain marker).
        let first = env.app.signal(1);
        env.app.dispatch(qa, env.add_tagged(a, 2, 1, first));
        assert_eq!(env.app.wait_zero(first), 0);
        seen.store(write_index(&env.app, qa) + 1, std::sync::atomic::Ordering::SeqCst);
        let (done_a, done_b) = (env.app.signal(1), env.app.signal(1));
        let (pa, pb) = (env.add_tagged(a, 3, 1, done_a), env.add(b, 1, done_b));
        let app = env.app;
        let started = std::time::Instant::now();
        support::bounded(WAIT * 3, vec![
            Box::new(move || app.dispatch(qa, pa)),
            Box::new(move || {
                // B rings once A is inside its CONFIG ENTER, waiting for B's drain.
                let deadline = std::time::Instant::now() + WAIT;
                while write_index(&app, qa) < 2 && std::time::Instant::now() < deadline {
                    std::thread::yield_now();
                }
                app.dispatch(qb, pb)
            }),
        ]);
        let took = started.elapsed();

        assert_eq!([env.app.wait_zero(done_a), env.app.wait_zero(done_b)], [0, 0]);
        let outcomes: Vec<_> = env.hooks.configured_dispatches().iter()
            .filter(|i| i.queue_id == idb)
            .map(|i| env.hooks.finished_record(i.dispatch_id).outcome)
            .collect();
        assert_eq!(outcomes, vec![ReplayOutcome::Replayed { passes: 3, end: LoopEnd::LastPass }], "B's replay was not held off (after {took:?})");
        assert_eq!(env.app.read(b, WORDS), vec![21; WORDS]);
        assert_eq!(env.app.read(a, WORDS), vec![12; WORDS]);
        assert_eq!(env.app.read(counters, WORDS), vec![0; WORDS], "the tool's copy landed");
    }
}

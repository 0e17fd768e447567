//! Work that waits for the replayed dispatch: another queue's barrier packet, or an async copy,
//! whose dependency is the completion signal of the dispatch being replayed (or of a packet
//! queued behind it). Such work cannot start before the dispatch's last pass, so it cannot
//! touch the snapshot's memory while the replay runs: the replay's drain must not wait for it
//! (it never could finish) and the work must run after the dispatch, once, as without kreplay.
//! Work whose dependency something outside kreplay may still release (the host) keeps the
//! replay off, as before.

// Each test file uses part of the shared harness.
#[allow(dead_code)]
#[macro_use]
mod support;

use std::time::Duration;

use hsa_sys::hsa_signal_t;
use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{DeclineReason, LoopEnd, RanOnceReason, ReplayOutcome, ToolAnswer};
use std::sync::Arc;
use support::app::{self, App, Aql, Pools, Ptr, Queue};
use support::counted::{AddArgs, add, runs, seen};
use support::tool::{Script, TestHooks};

/// The replayed dispatch's tag.
const REPLAYED: u32 = 1;
/// The waiting work's tag.
const WAITING: u32 = 2;

struct Env {
    app: App,
    hooks: Arc<TestHooks>,
    pools: Pools,
}

fn setup(drain: Duration) -> Env {
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
    fn add(&self, buf: Ptr, tag: u32, amount: u32, done: hsa_signal_t) -> Aql {
        let kernarg = self.app.kernargs(
            &self.pools,
            AddArgs {
                buf: buf.0,
                len: 64,
                tag,
                amount,
            },
        );
        let kernel = kreplay_softhsa::register_kernel("held_dependencies_add", add);
        Aql::dispatch(kernel, 64, 64, kernarg, done)
    }

    /// Two queues on the GPU; the tool replays the dispatches of the first (3 passes) and
    /// runs those of the second once.
    fn queues(&self) -> (Queue, Queue) {
        let (q1, q2) = (
            self.app.queue(self.app.gpus[0]),
            self.app.queue(self.app.gpus[0]),
        );
        // SAFETY: the queue is live for the scenario.
        let replayed = unsafe { (*q1.0).id };
        self.hooks.set_script(Script::new(move |_, info| {
            ToolAnswer::passes(if info.queue_id == replayed { 3 } else { 1 })
        }));
        (q1, q2)
    }

    /// How the latest dispatch of queue 1 ended, as the tool heard.
    fn outcome(&self, q1: Queue) -> ReplayOutcome {
        // SAFETY: the queue is live for the scenario.
        let replayed = unsafe { (*q1.0).id };
        let ids: Vec<u64> = self
            .hooks
            .configured_dispatches()
            .iter()
            .filter(|i| i.queue_id == replayed)
            .map(|i| i.dispatch_id)
            .collect();
        let last = *ids.last().expect("a dispatch on queue 1");
        self.hooks.finished_record(last).outcome
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

const REPLAYED_3: ReplayOutcome = ReplayOutcome::Replayed {
    passes: 3,
    end: LoopEnd::LastPass,
};

scenarios! {
    /// Queue 2 holds a barrier-AND on the replayed dispatch's completion signal, then a
    /// dispatch that adds 100 to the same buffer. The replay is not held off by queue 2 (its
    /// barrier can only open after the last pass): 3 passes, each from the snapshot, and queue
    /// 2's dispatch runs once, after the replayed one: 10 + 1 + 100.
    fn a_queue_waiting_for_the_replayed_dispatch_does_not_hold_its_replay_off() {
        let env = setup(Duration::from_secs(5));
        let (q1, q2) = env.queues();
        let a = env.app.buffer(env.pools.coarse, &[10; 64]);
        let (done, waited) = (env.app.signal(1), env.app.signal(1));
        env.app.submit(q2, &[Aql::barrier_and(&[done], hsa_signal_t { handle: 0 }).with_barrier(), env.add(a, WAITING, 100, waited)]);

        env.app.dispatch(q1, env.add(a, REPLAYED, 1, done));

        assert_eq!([env.app.wait_zero(done), env.app.wait_zero(waited)], [0, 0]);
        assert_eq!(env.outcome(q1), REPLAYED_3, "the replay ran all its passes");
        assert_eq!((runs(REPLAYED), runs(WAITING)), (3, 1));
        assert_eq!(seen(REPLAYED), vec![10, 10, 10], "every pass started from the snapshot");
        assert_eq!(seen(WAITING), vec![11], "the waiting dispatch ran after the replayed one");
        assert_eq!(env.app.read(a, 64), vec![111; 64], "single-run results, nothing undone");
    }

    /// The dependency is the completion signal of a packet queued behind the replayed dispatch
    /// in the same submission (a marker an event would use): it too completes only after the
    /// replay, so queue 2 does not hold the replay off either.
    fn a_queue_waiting_for_a_packet_behind_the_replayed_dispatch_does_not_hold_its_replay_off() {
        let env = setup(Duration::from_secs(5));
        let (q1, q2) = env.queues();
        let a = env.app.buffer(env.pools.coarse, &[10; 64]);
        let (event, waited, done) = (env.app.signal(1), env.app.signal(1), env.app.signal(1));
        env.app.submit(q2, &[Aql::barrier_and(&[event], hsa_signal_t { handle: 0 }).with_barrier(), env.add(a, WAITING, 100, waited)]);

        env.app.submit(q1, &[env.add(a, REPLAYED, 1, done), Aql::barrier(event).with_barrier()]);

        assert_eq!([env.app.wait_zero(done), env.app.wait_zero(event), env.app.wait_zero(waited)], [0, 0, 0]);
        assert_eq!(env.outcome(q1), REPLAYED_3);
        assert_eq!(seen(REPLAYED), vec![10, 10, 10]);
        assert_eq!(seen(WAITING), vec![11]);
        assert_eq!(env.app.read(a, 64), vec![111; 64]);
    }

    /// A barrier-AND on the replayed dispatch and on a signal the host releases later: it
    /// cannot open before the dispatch's last pass whatever the host does, so the replay runs;
    /// the waiting dispatch runs once both fired.
    fn a_barrier_and_with_one_held_dependency_does_not_hold_the_replay_off() {
        let env = setup(Duration::from_secs(5));
        let (q1, q2) = env.queues();
        let a = env.app.buffer(env.pools.coarse, &[10; 64]);
        let (done, host, waited) = (env.app.signal(1), env.app.signal(1), env.app.signal(1));
        env.app.submit(q2, &[Aql::barrier_and(&[host, done], hsa_signal_t { handle: 0 }), env.add(a, WAITING, 100, waited)]);

        env.app.dispatch(q1, env.add(a, REPLAYED, 1, done));
        assert_eq!(env.app.wait_zero(done), 0);
        assert_eq!(runs(WAITING), 0, "the host has not released its dependency yet");
        env.app.store(host, 0);

        assert_eq!(env.app.wait_zero(waited), 0);
        assert_eq!(env.outcome(q1), REPLAYED_3);
        assert_eq!(seen(REPLAYED), vec![10, 10, 10]);
        assert_eq!(env.app.read(a, 64), vec![111; 64]);
    }

    /// A barrier-OR on the replayed dispatch or a signal the host may release at any time:
    /// the host could open it in the middle of the replay, so queue 2 is not idle and the
    /// drain waits for it as before (here until its timeout: the dispatch runs once, declined
    /// `agent_drain_stuck`); nothing is lost.
    fn a_barrier_or_the_host_may_open_holds_the_replay_off() {
        let env = setup(Duration::from_millis(300));
        let (q1, q2) = env.queues();
        let a = env.app.buffer(env.pools.coarse, &[10; 64]);
        let (done, host, waited) = (env.app.signal(1), env.app.signal(1), env.app.signal(1));
        env.app.submit(q2, &[Aql::barrier_or(&[done, host], hsa_signal_t { handle: 0 }).with_barrier(), env.add(a, WAITING, 100, waited)]);

        env.app.dispatch(q1, env.add(a, REPLAYED, 1, done));

        assert_eq!([env.app.wait_zero(done), env.app.wait_zero(waited)], [0, 0]);
        let outcome = env.outcome(q1);
        assert_eq!(declined(&outcome), Some(DeclineReason::AgentDrainStuck), "{outcome:?}");
        let ReplayOutcome::RanOnce { why: RanOnceReason::Declined(decline) } = &outcome else { unreachable!() };
        assert!(decline.detail.starts_with("sibling queue"), "the detail names the reason once: {:?}", decline.detail);
        assert_eq!((runs(REPLAYED), runs(WAITING)), (1, 1));
        assert_eq!(env.app.read(a, 64), vec![111; 64]);
    }

    /// A barrier-OR whose dependencies are all null never opens (the HSA headers: a null
    /// signal is never satisfied for barrier-OR): queue 2 is parked at it for good, runs
    /// nothing during the replay, and is idle to the drain once what came before it completed;
    /// the replay runs all its passes instead of waiting out the drain timeout and declining.
    fn a_queue_parked_at_a_barrier_or_without_dependencies_does_not_hold_the_replay_off() {
        let env = setup(Duration::from_secs(5));
        let (q1, q2) = env.queues();
        let a = env.app.buffer(env.pools.coarse, &[10; 64]);
        let (done, waited) = (env.app.signal(1), env.app.signal(1));
        env.app.submit(q2, &[Aql::barrier_or(&[], hsa_signal_t { handle: 0 }).with_barrier(), env.add(a, WAITING, 100, waited)]);

        env.app.dispatch(q1, env.add(a, REPLAYED, 1, done));

        assert_eq!(env.app.wait_zero(done), 0);
        assert_eq!(env.outcome(q1), REPLAYED_3, "the replay ran all its passes");
        assert_eq!((runs(REPLAYED), runs(WAITING)), (3, 0), "queue 2 stays parked");
        assert_eq!(env.app.read(a, 64), vec![11; 64], "single-run results");
    }

    /// An async copy whose dependency is the replayed dispatch's completion signal can only
    /// land after the dispatch ran, and copy engines run in order (the replay's own copies
    /// would queue behind it): the replay declines at once, not after the drain timeout (here
    /// longer than the scenario may run), the dispatch runs once and the copy copies its result.
    fn an_async_copy_waiting_for_the_replayed_dispatch_declines_its_replay_at_once() {
        let env = setup(Duration::from_secs(120));
        let (q1, _) = env.queues();
        let gpu = env.app.gpus[0];
        let a = env.app.buffer(env.pools.coarse, &[10; 64]);
        let copy = env.app.buffer(env.pools.coarse, &[0; 64]);
        let (done, copied) = (env.app.signal(1), env.app.signal(1));
        env.app.async_copy_after(copy, gpu, a, gpu, 64 * 4, done, copied);

        env.app.dispatch(q1, env.add(a, REPLAYED, 1, done));

        assert_eq!([env.app.wait_zero(done), env.app.wait_zero(copied)], [0, 0]);
        let outcome = env.outcome(q1);
        assert_eq!(declined(&outcome), Some(DeclineReason::AgentDrainStuck), "{outcome:?}");
        assert!(format!("{outcome:?}").contains("waits for this dispatch's completion"), "{outcome:?}");
        assert_eq!(runs(REPLAYED), 1);
        assert_eq!(env.app.read(copy, 64), vec![11; 64], "the copy saw the single-run result");
        assert_eq!(env.app.read(a, 64), vec![11; 64]);
    }

    /// A copy that waits for a packet queued behind the replayed dispatch declines it at once
    /// too; a copy whose dependency already fired does not stop the replay.
    fn only_a_copy_waiting_for_held_work_declines_the_replay() {
        let env = setup(Duration::from_secs(120));
        let (q1, _) = env.queues();
        let gpu = env.app.gpus[0];
        let a = env.app.buffer(env.pools.coarse, &[10; 64]);
        let (early, late) = (env.app.buffer(env.pools.coarse, &[0; 64]), env.app.buffer(env.pools.coarse, &[0; 64]));
        let (fired, early_copied) = (env.app.signal(0), env.app.signal(1));
        env.app.async_copy_after(early, gpu, a, gpu, 64 * 4, fired, early_copied);
        assert_eq!(env.app.wait_zero(early_copied), 0);
        let (done, event, late_copied) = (env.app.signal(1), env.app.signal(1), env.app.signal(1));
        env.app.dispatch(q1, env.add(a, REPLAYED, 1, done));
        assert_eq!(env.app.wait_zero(done), 0);
        assert_eq!(env.outcome(q1), REPLAYED_3, "the landed copy does not hold the replay off");

        env.app.async_copy_after(late, gpu, a, gpu, 64 * 4, event, late_copied);
        env.app.store(done, 1);
        env.app.submit(q1, &[env.add(a, REPLAYED, 1, done), Aql::barrier(event).with_barrier()]);

        assert_eq!([env.app.wait_zero(done), env.app.wait_zero(event), env.app.wait_zero(late_copied)], [0, 0, 0]);
        let outcome = env.outcome(q1);
        assert_eq!(declined(&outcome), Some(DeclineReason::AgentDrainStuck), "{outcome:?}");
        assert_eq!(runs(REPLAYED), 4, "3 passes, then once");
        assert_eq!(env.app.read(late, 64), vec![12; 64]);
        assert_eq!(env.app.read(early, 64), vec![10; 64]);
    }

    /// Work already in queue 2 before its waiting barrier is still drained: a dispatch that
    /// adds 1000 runs before the barrier, and every pass of the replayed dispatch starts from
    /// its result.
    fn work_before_a_waiting_barrier_is_still_drained() {
        let env = setup(Duration::from_secs(5));
        let (q1, q2) = env.queues();
        let a = env.app.buffer(env.pools.coarse, &[10; 64]);
        let (before, done, waited) = (env.app.signal(1), env.app.signal(1), env.app.signal(1));
        env.app.submit(q2, &[env.add(a, 3, 1000, before), Aql::barrier_and(&[done], hsa_signal_t { handle: 0 }).with_barrier(), env.add(a, WAITING, 100, waited)]);

        env.app.dispatch(q1, env.add(a, REPLAYED, 1, done));

        assert_eq!([env.app.wait_zero(before), env.app.wait_zero(done), env.app.wait_zero(waited)], [0, 0, 0]);
        assert_eq!(env.outcome(q1), REPLAYED_3);
        assert_eq!(seen(REPLAYED), vec![1010, 1010, 1010]);
        assert_eq!(env.app.read(a, 64), vec![1111; 64]);
    }
}

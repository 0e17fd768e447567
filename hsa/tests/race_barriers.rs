//! Barriers and signals shared between application threads while a replay runs: work of one
//! thread that waits for work another thread has published but whose handler has not run yet
//! (its thread was preempted between writing the packet and ringing the doorbell, or its
//! handler waits for the agent's lock). The application must end with the memory and signal
//! values it would see without kreplay, and the tool must hear how each dispatch ended.

// Each test file uses part of the shared harness.
#[allow(dead_code)]
#[macro_use]
mod support;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use hsa_sys::hsa_signal_t;
use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{DeclineReason, RanOnceReason, ReplayOutcome, ToolAnswer};
use support::app::{self, App, Aql, Pools, Ptr, Queue, WAIT};
use support::counted::{AddArgs, add, runs, seen};
use support::tool::{Script, TestHooks};

/// The tag of the dispatch the first thread waits behind.
const WAITING: u32 = 1;
/// The tag of the dispatch the second thread publishes.
const PUBLISHED: u32 = 2;

const WORDS: usize = 64;
const NO_SIGNAL: hsa_signal_t = hsa_signal_t { handle: 0 };

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
    hooks.set_script(Script::passes(3));
    let pools = app.pools(app.gpus[0]);
    Env { app, hooks, pools }
}

impl Env {
    fn add(&self, buf: Ptr, tag: u32, amount: u32, done: hsa_signal_t) -> Aql {
        let kernarg = self.app.kernargs(
            &self.pools,
            AddArgs {
                buf: buf.0,
                len: WORDS as u32,
                tag,
                amount,
            },
        );
        let kernel = kreplay_softhsa::register_kernel("race_barriers_add", add);
        Aql::dispatch(kernel, WORDS as u32, 64, kernarg, done)
    }

    /// How every dispatch the tool configured ended, in CONFIG ENTER order.
    fn outcomes(&self) -> Vec<ReplayOutcome> {
        self.hooks
            .configured_dispatches()
            .iter()
            .map(|info| self.hooks.finished_record(info.dispatch_id).outcome)
            .collect()
    }
}

/// A packet written into `queue`'s ring (body first, header last) without ringing the
/// doorbell: what a producer thread has done when it is preempted before its doorbell store.
/// Returns the packet's index, for [`ring`].
fn publish(app: &App, queue: Queue, packet: Aql) -> u64 {
    // SAFETY: `queue.0` is a live queue this application created.
    let q = unsafe { &*queue.0 };
    let index = {
        let f = app
            .core()
            .hsa_queue_add_write_index_scacq_screl_fn
            .expect("add_write_index");
        // SAFETY: a live queue; one slot is reserved.
        unsafe { f(queue.0, 1) }
    };
    let load_read = app
        .core()
        .hsa_queue_load_read_index_scacquire_fn
        .expect("load_read_index");
    // SAFETY: a live queue.
    let read = unsafe { load_read(queue.0) };
    assert!(index - read < u64::from(q.size), "the ring has room");
    let slot = (q.base_address as usize + (index % u64::from(q.size)) as usize * 64) as *mut u8;
    // SAFETY: a packet is 64 bytes of plain data.
    let bytes: [u8; 64] = unsafe { std::mem::transmute(packet) };
    // SAFETY: as above, bytes 4..64 are the body.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr().add(4), slot.add(4), 60) };
    let header = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    // SAFETY: the slot is 64-byte aligned; the header word is stored atomically with release
    // order, publishing the body.
    unsafe { &*slot.cast::<std::sync::atomic::AtomicU32>() }.store(header, Ordering::Release);
    index
}

/// Rings `queue`'s doorbell for the packets up to `index`.
fn ring(app: &App, queue: Queue, index: u64) {
    // SAFETY: `queue.0` is a live queue this application created.
    let doorbell = unsafe { (*queue.0).doorbell_signal };
    app.store(doorbell, index as i64);
}

scenarios! {
    /// Thread B has written a dispatch into queue 1 and not rung its doorbell yet (preempted
    /// between the two). Thread A queues, on queue 2 of the same GPU, a barrier-AND waiting for
    /// B's dispatch's completion and a dispatch behind it (a stream waiting on another stream's
    /// event). A's dispatch cannot run before B's, and B's forwarding waits for A's replay's
    /// lock: a replay of A's dispatch must not take its own queue, parked at that barrier, for
    /// idle, or its first pass waits behind the barrier for ever while B's handler waits for the
    /// lock. Without kreplay A's doorbell returns at once and both kernels run once B rings: so
    /// must it with kreplay (A's dispatch runs once, declined, or B's first), with single-run
    /// results.
    fn a_dispatch_behind_a_barrier_on_a_published_but_unrung_dispatch_does_not_hang() {
        let env = setup(Duration::from_millis(500));
        let (q1, q2) = (env.app.queue(env.app.gpus[0]), env.app.queue(env.app.gpus[0]));
        let a = env.app.buffer(env.pools.coarse, &[10; WORDS]);
        let (published_done, waiting_done) = (env.app.signal(1), env.app.signal(1));
        let index = publish(&env.app, q1, env.add(a, PUBLISHED, 1, published_done));
        let (app, waiting) = (env.app, env.add(a, WAITING, 100, waiting_done));
        let limit = WAIT * 3;
        support::bounded(limit, vec![Box::new(move || {
            app.submit(q2, &[Aql::barrier_and(&[published_done], NO_SIGNAL), waiting]);
        })]);
        // Thread B's doorbell, once A's submission returned (as without kreplay).
        let app = env.app;
        support::bounded(limit, vec![Box::new(move || ring(&app, q1, index))]);

        assert_eq!([env.app.wait_zero(published_done), env.app.wait_zero(waiting_done)], [0, 0]);
        assert_eq!(seen(PUBLISHED), vec![10; runs(PUBLISHED) as usize], "B's passes each start from the snapshot");
        assert_eq!(runs(WAITING), 1, "A's dispatch cannot be replayed while B's is unrung: it runs once");
        assert_eq!(seen(WAITING), vec![11], "A's dispatch ran after B's");
        assert_eq!(env.app.read(a, WORDS), vec![111; WORDS], "single-run results");
        let outcomes = env.outcomes();
        assert_eq!(outcomes.len(), 2, "the tool heard both dispatches end: {outcomes:?}");
        let ReplayOutcome::RanOnce { why: RanOnceReason::Declined(decline) } = &outcomes[0] else {
            panic!("A's dispatch ran once, declined: {:?}", outcomes[0]);
        };
        assert_eq!(decline.reason, DeclineReason::QueueDrainStuck, "{decline:?}");
        assert!(decline.detail.contains("barrier"), "the detail says why: {decline:?}");
    }
}

scenarios! {
    /// Two threads dispatch on two GPUs with one completion signal of value 2 (an event both
    /// kernels count down), each dispatch replayed at the same time; a third queue, on the
    /// first GPU, waits for the signal with a barrier-AND and adds 100 to both buffers. The
    /// signal fires once both dispatches completed, exactly once each: the waiting kernel runs
    /// once, after both, and every buffer holds one run's result.
    fn one_completion_signal_shared_by_replays_on_two_gpus_fires_once_both_ran() {
        let env = setup(Duration::from_secs(5));
        let (gpu0, gpu1) = (env.app.gpus[0], env.app.gpus[1]);
        let pools1 = env.app.pools(gpu1);
        let (q0, q1, qw) = (env.app.queue(gpu0), env.app.queue(gpu1), env.app.queue(gpu0));
        // The waiting kernel runs once: replaying it would wait out the drain timeout for its own
        // queue, stopped at a barrier whose signal the other kernels fire later (docs/rocm.md).
        // SAFETY: a live queue of this scenario.
        let waiting_queue = unsafe { (*qw.0).id };
        env.hooks.set_script(Script::new(move |_, info| {
            ToolAnswer::passes(if info.queue_id == waiting_queue { 1 } else { 3 })
        }));
        let a = env.app.buffer(env.pools.coarse, &[10; WORDS]);
        let b = env.app.buffer(pools1.coarse, &[20; WORDS]);
        let (shared, waited) = (env.app.signal(2), env.app.signal(1));
        env.app.submit(qw, &[Aql::barrier_and(&[shared], NO_SIGNAL).with_barrier(), env.add(a, 3, 100, waited)]);
        let on_a = env.add(a, WAITING, 1, shared);
        let kernarg = env.app.kernargs(&pools1, AddArgs { buf: b.0, len: WORDS as u32, tag: PUBLISHED, amount: 1 });
        let kernel = kreplay_softhsa::register_kernel("race_barriers_add", add);
        let on_b = Aql::dispatch(kernel, WORDS as u32, 64, kernarg, shared);
        let app = env.app;
        let started = std::time::Instant::now();
        support::bounded(WAIT * 2, vec![
            Box::new(move || app.dispatch(q0, on_a)),
            Box::new(move || app.dispatch(q1, on_b)),
        ]);
        let took = started.elapsed();

        assert_eq!([env.app.wait_zero(shared), env.app.wait_zero(waited)], [0, 0]);
        assert_eq!(env.app.load(shared), 0, "counted down once per dispatch");
        let outcomes = env.outcomes();
        let replayed = outcomes.iter().filter(|o| matches!(o, ReplayOutcome::Replayed { passes: 3, .. })).count();
        assert_eq!(replayed, 2, "both dispatches were replayed: {outcomes:?} (after {took:?})");
        assert_eq!((runs(WAITING), runs(PUBLISHED)), (3, 3));
        assert_eq!(seen(3), vec![11], "the waiting kernel ran once, after both");
        assert_eq!(env.app.read(a, WORDS), vec![111; WORDS]);
        assert_eq!(env.app.read(b, WORDS), vec![21; WORDS]);
    }
}

//! Coalesced submissions: when several packets reach kreplay's queue handler in one call (one
//! doorbell for several packets, or several threads sharing a queue), each kernel dispatch among
//! them is replayed in queue order and the other packets are forwarded in their place.

// Each test file uses part of the shared harness.
#[allow(dead_code)]
#[macro_use]
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use hsa_sys::{HSA_PACKET_TYPE_BARRIER_AND, hsa_signal_t};
use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{DeclineReason, LoopEnd, RanOnceReason, ReplayOutcome, ToolAnswer};
use kreplay_softhsa::WorkGroup;
use parking_lot::Mutex;
use support::app::{self, App, Aql, Pools, Ptr, Queue, WAIT};
use support::tool::{Script, TestHooks};

/// Runs of `add_one` per tag.
static RUNS: [AtomicU32; 64] = [const { AtomicU32::new(0) }; 64];
/// The order in which kernel runs started, as (tag, value of the observed word at start).
static ORDER: Mutex<Vec<(u32, u32)>> = Mutex::new(Vec::new());

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct AddArgs {
    buf: u64,
    len: u32,
    tag: u32,
}

/// `buf[i] += 1` for every work-item; work-group 0 counts the run and logs `buf[0]`.
fn add_one(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries an `AddArgs` block.
    let args: AddArgs = unsafe { group.kernargs() };
    let buf = args.buf as *mut u32;
    if group.group_id() == [0, 0, 0] {
        RUNS[args.tag as usize].fetch_add(1, Ordering::SeqCst);
        // SAFETY: `buf` holds at least `len` (>= 1) u32 the scenario owns.
        let first = unsafe { std::ptr::read_volatile(buf) };
        ORDER.lock().push((args.tag, first));
    }
    for [i, _, _] in group.work_items() {
        if i < args.len {
            // SAFETY: each work-item owns index `i` of a buffer of `len` u32.
            unsafe { *buf.add(i as usize) += 1 };
        }
    }
}

fn runs(tag: u32) -> u32 {
    RUNS[tag as usize].load(Ordering::SeqCst)
}

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
            drain: DrainConfig::new(WAIT),
            ..Default::default()
        },
    );
    hooks.configure_replay(true);
    let pools = app.pools(app.gpus[0]);
    Env { app, hooks, pools }
}

impl Env {
    fn add(&self, buf: Ptr, len: u32, tag: u32, done: hsa_signal_t) -> Aql {
        let kernarg = self.app.kernargs(
            &self.pools,
            AddArgs {
                buf: buf.0,
                len,
                tag,
            },
        );
        let kernel = kreplay_softhsa::register_kernel("coalesced_add_one", add_one);
        Aql::dispatch(kernel, len, 64, kernarg, done)
    }

    fn outcomes(&self) -> Vec<ReplayOutcome> {
        self.hooks
            .configured_dispatches()
            .iter()
            .map(|i| self.hooks.finished_record(i.dispatch_id).outcome)
            .collect()
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

fn queue_id(queue: Queue) -> u64 {
    // SAFETY: the queue is live for the scenario.
    unsafe { (*queue.0).id }
}

scenarios! {
    /// Dispatch, barrier, dispatch written with one doorbell: both dispatches are replayed
    /// (3 passes each, single-run results), in queue order, and the barrier is forwarded between
    /// them and completes once.
    fn each_dispatch_of_a_multi_packet_submission_is_replayed_in_queue_order() {
        let env = setup();
        env.hooks.set_script(Script::passes(3));
        let q = env.app.queue(env.app.gpus[0]);
        let forwarded = env.app.observe_forwarded(q);
        let (a, b) = (env.app.buffer(env.pools.coarse, &[10; 64]), env.app.buffer(env.pools.coarse, &[20; 64]));
        let (da, barrier, db) = (env.app.signal(1), env.app.signal(1), env.app.signal(1));
        let submission = [env.add(a, 64, 1, da), Aql::barrier(barrier).with_barrier(), env.add(b, 64, 2, db)];

        env.app.submit(q, &submission);

        assert_eq!([env.app.wait_zero(da), env.app.wait_zero(barrier), env.app.wait_zero(db)], [0, 0, 0]);
        assert_eq!([env.app.load(da), env.app.load(barrier), env.app.load(db)], [0, 0, 0], "each completion fired once");
        let outcomes = env.outcomes();
        assert_eq!(outcomes.len(), 2, "the tool hears of both dispatches");
        for outcome in &outcomes {
            assert_eq!(*outcome, ReplayOutcome::Replayed { passes: 3, end: LoopEnd::LastPass });
        }
        assert_eq!((runs(1), runs(2)), (3, 3), "every pass ran");
        assert_eq!(env.app.read(a, 64), vec![11; 64], "single-run results");
        assert_eq!(env.app.read(b, 64), vec![21; 64], "single-run results");
        let order: Vec<u32> = ORDER.lock().iter().map(|(tag, _)| *tag).collect();
        assert_eq!(order, vec![1, 1, 1, 2, 2, 2], "the first dispatch's passes all ran before the second's");
        assert!(ORDER.lock().iter().all(|(tag, first)| *first == if *tag == 1 { 10 } else { 20 }), "every pass started from the snapshot");
        let barriers: Vec<Aql> = forwarded.lock().iter().flatten().copied()
            .filter(|p| p.packet_type() == HSA_PACKET_TYPE_BARRIER_AND && *p == submission[1])
            .collect();
        assert_eq!(barriers.len(), 1, "the application's barrier is forwarded once, unchanged");
        assert!(!env.hooks.warned_keys().contains(&"batch_or_graph"), "{:?}", env.hooks.warnings());
    }

    /// Eight threads share one queue and each submits 12 dispatches on its own buffer, waiting
    /// for each: the handler gets packets of several threads at once, and still every dispatch is
    /// replayed (2 passes) with no `batch_or_graph` decline and no lost or doubled increment.
    fn threads_sharing_a_queue_lose_no_replay_coverage() {
        const THREADS: u32 = 8;
        const ROUNDS: u32 = 12;
        let env = setup();
        env.hooks.set_script(Script::new(|_, _| ToolAnswer::passes(2)));
        let q = env.app.queue(env.app.gpus[0]);
        let shared = queue_id(q);
        let bufs: Vec<Ptr> = (0..THREADS).map(|_| env.app.buffer(env.pools.coarse, &[0; 64])).collect();
        let work: Vec<Vec<(Aql, hsa_signal_t)>> = (0..THREADS)
            .map(|t| {
                (0..ROUNDS)
                    .map(|_| {
                        let done = env.app.signal(1);
                        (env.add(bufs[t as usize], 64, 10 + t, done), done)
                    })
                    .collect()
            })
            .collect();
        let app = env.app;
        let start = Arc::new(std::sync::Barrier::new(THREADS as usize));
        let threads: Vec<_> = work
            .into_iter()
            .map(|packets| {
                let start = start.clone();
                std::thread::spawn(move || {
                    start.wait();
                    packets.into_iter().map(|(packet, done)| {
                        app.dispatch(q, packet);
                        app.wait_zero(done)
                    }).collect::<Vec<i64>>()
                })
            })
            .collect();
        for t in threads {
            assert!(t.join().expect("a submitting thread").iter().all(|v| *v == 0), "every completion fired");
        }
        let outcomes = env.outcomes();
        assert_eq!(outcomes.len(), (THREADS * ROUNDS) as usize);
        let declines: Vec<_> = outcomes.iter().filter_map(declined).collect();
        assert!(declines.is_empty(), "no dispatch was declined: {declines:?}");
        for outcome in &outcomes {
            assert_eq!(*outcome, ReplayOutcome::Replayed { passes: 2, end: LoopEnd::LastPass });
        }
        for t in 0..THREADS {
            assert_eq!(runs(10 + t), 2 * ROUNDS, "thread {t}: every pass ran");
            assert_eq!(env.app.read(bufs[t as usize], 64), vec![ROUNDS; 64], "thread {t}: single-run results");
        }
        assert!(env.hooks.configured_dispatches().iter().all(|i| i.queue_id == shared));
    }
}

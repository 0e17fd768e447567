//! Re-entrancy: dispatches a tool issues from inside replay callbacks (onto a sibling queue that
//! another thread is using, onto the replaying queue itself, onto another agent that is
//! replaying too) run exactly once, promptly, and nothing deadlocks. Every scenario runs its
//! replays on threads and fails when they do not finish within a deadline.

// Each test file uses part of the shared harness.
#[allow(dead_code)]
#[macro_use]
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use hsa_sys::hsa_signal_t;
use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{DeclineReason, LoopEnd, RanOnceReason, ReplayOutcome, ToolAnswer};
use kreplay_snapshot::{MIN_CHUNK_SIZE, RestoreStrategy, SnapshotConfig, StoreTier};
use kreplay_softhsa::WorkGroup;
use parking_lot::Mutex;
use support::app::{self, App, Aql, Pools, Ptr, Queue, WAIT};
use support::tool::{Script, TestHooks};
use support::{bounded, wait_flag};

/// Runs of `add_one` per tag.
static RUNS: [AtomicU32; 32] = [const { AtomicU32::new(0) }; 32];

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct AddArgs {
    buf: u64,
    len: u32,
    tag: u32,
}

/// `buf[i] += 1` for every work-item; work-group 0 counts the run.
fn add_one(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries an `AddArgs` block.
    let args: AddArgs = unsafe { group.kernargs() };
    if group.group_id() == [0, 0, 0] {
        RUNS[args.tag as usize].fetch_add(1, Ordering::SeqCst);
    }
    for [i, _, _] in group.work_items() {
        if i < args.len {
            // SAFETY: each work-item owns index `i` of a buffer of `len` u32.
            unsafe { *(args.buf as *mut u32).add(i as usize) += 1 };
        }
    }
}

fn runs(tag: u32) -> u32 {
    RUNS[tag as usize].load(Ordering::SeqCst)
}

/// Dispatches `packet` on `queue` from a thread of its own and waits for `done`, bounded by
/// [`LIMIT`]: the wait's result, as [`bounded`] returns it.
fn dispatch_and_wait(app: App, queue: Queue, packet: Aql, done: hsa_signal_t) -> Vec<i64> {
    bounded(
        LIMIT,
        vec![Box::new(move || {
            app.dispatch(queue, packet);
            app.wait_zero(done)
        })],
    )
}

struct Env {
    app: App,
    hooks: Arc<TestHooks>,
    pools: [Pools; 2],
}

fn setup() -> Env {
    setup_with(SnapshotConfig::default())
}

fn setup_with(snapshot: SnapshotConfig) -> Env {
    let hooks = TestHooks::new(0);
    let app = app::install(
        hooks.clone(),
        InstallOptions {
            drain: DrainConfig::new(WAIT),
            snapshot,
            ..Default::default()
        },
    );
    hooks.configure_replay(true);
    let pools = [app.pools(app.gpus[0]), app.pools(app.gpus[1])];
    Env { app, hooks, pools }
}

impl Env {
    /// An `add_one` dispatch on GPU `agent` with work-group size `workgroup`.
    fn add(&self, agent: usize, buf: Ptr, tag: u32, workgroup: u16, done: hsa_signal_t) -> Aql {
        let kernarg = self.app.kernargs(
            &self.pools[agent],
            AddArgs {
                buf: buf.0,
                len: 64,
                tag,
            },
        );
        let kernel = kreplay_softhsa::register_kernel("reentrancy_add_one", add_one);
        Aql::dispatch(kernel, 64, workgroup, kernarg, done)
    }

    fn outcome_of_tag_queue(&self, queue: Queue, workgroup: u32) -> Vec<ReplayOutcome> {
        self.hooks
            .configured_dispatches()
            .iter()
            .filter(|i| i.queue_id == queue_id(queue) && i.workgroup_size[0] == workgroup)
            .map(|i| self.hooks.finished_record(i.dispatch_id).outcome)
            .collect()
    }
}

fn queue_id(queue: Queue) -> u64 {
    // SAFETY: the queue is live for the scenario.
    unsafe { (*queue.0).id }
}

fn declined(outcome: &ReplayOutcome) -> Option<DeclineReason> {
    match outcome {
        ReplayOutcome::RanOnce {
            why: RanOnceReason::Declined(d),
        } => Some(d.reason),
        _ => None,
    }
}

/// A replay of `add_one` over words 0..64 of a 1024-word coarse buffer on agent 0, in 3 passes,
/// whose tool dispatches (onto a sibling queue) `add_one` over words 64..128 (the chunk the
/// replayed kernel writes) from PASS EXIT of pass 0 and over words 384..448 (a chunk it never
/// writes) from PASS EXIT of pass 1, waiting for each. Both increments must survive the
/// restores byte for byte, and the replayed kernel's own writes must still be undone, under
/// `strategy` and `store`.
fn tool_dispatches_after_passes_survive(
    strategy: RestoreStrategy,
    store: StoreTier,
    tags: [u32; 3],
) {
    let env = setup_with(
        SnapshotConfig::default()
            .with_strategy(strategy)
            .with_store(store)
            .with_chunk_size(MIN_CHUNK_SIZE),
    );
    let (q1, q2) = (
        env.app.queue(env.app.gpus[0]),
        env.app.queue(env.app.gpus[0]),
    );
    let outer_queue = queue_id(q1);
    let buf = env.app.buffer(env.pools[0].coarse, &[9; 1024]);
    let (done, inner_done) = (env.app.signal(1), [env.app.signal(1), env.app.signal(1)]);
    let outer = env.add(0, buf, tags[0], 64, done);
    let inner = [
        env.add(0, Ptr(buf.0 + 64 * 4), tags[1], 32, inner_done[0]),
        env.add(0, Ptr(buf.0 + 384 * 4), tags[2], 32, inner_done[1]),
    ];
    let waits: Arc<Mutex<Vec<i64>>> = Arc::default();
    let (app, w) = (env.app, waits.clone());
    env.hooks
        .set_script(Script::passes(3).on_pass_exit(move |_, info, pass, _| {
            if info.queue_id == outer_queue && pass < 2 {
                app.dispatch(q2, inner[pass as usize]);
                w.lock().push(app.wait_zero(inner_done[pass as usize]));
            }
            kreplay_passloop::ContinueChange::default()
        }));
    let finished = dispatch_and_wait(app, q1, outer, done);

    assert_eq!(finished, vec![0]);
    assert_eq!(
        *waits.lock(),
        vec![0, 0],
        "each tool dispatch completed inside its callback"
    );
    assert_eq!((runs(tags[0]), runs(tags[1]), runs(tags[2])), (3, 1, 1));
    let mut expected = vec![9; 1024];
    for word in (0..128).chain(384..448) {
        expected[word] = 10;
    }
    let memory = env.app.read(buf, 1024);
    let wrong: Vec<usize> = (0..1024).filter(|&i| memory[i] != expected[i]).collect();
    assert!(
        wrong.is_empty(),
        "{} word(s) differ from one run of each dispatch, first at {:?}: {:?}",
        wrong.len(),
        wrong.first(),
        wrong.first().map(|&i| memory[i])
    );
    assert_eq!(
        env.outcome_of_tag_queue(q1, 64),
        vec![ReplayOutcome::Replayed {
            passes: 3,
            end: LoopEnd::LastPass
        }]
    );
}

/// Replays on agents 0 and 1 at once. While replay B (agent 1) sits in PASS EXIT of its pass 0
/// (its kernel ran, its next restore is ahead), replay A's PASS ENTER issues `work` (with A's
/// window open) into B's snapshotted memory `target` (a coarse buffer of agent 1 holding 70s),
/// then lets B go on. What `work` wrote must survive B's later restores.
fn work_into_another_replaying_agent_survives(
    work: impl Fn(&Env, Ptr) + Send + Sync + 'static,
    tags: [u32; 2],
) {
    static B_IN_EXIT: AtomicBool = AtomicBool::new(false);
    static A_DONE: AtomicBool = AtomicBool::new(false);
    let env = setup();
    let outer_q = [
        env.app.queue(env.app.gpus[0]),
        env.app.queue(env.app.gpus[1]),
    ];
    let bufs = [
        env.app.buffer(env.pools[0].coarse, &[1; 64]),
        env.app.buffer(env.pools[1].coarse, &[2; 64]),
    ];
    let target = env.app.buffer(env.pools[1].coarse, &[70; 64]);
    let done = [env.app.signal(1), env.app.signal(1)];
    let outer = [
        env.add(0, bufs[0], tags[0], 64, done[0]),
        env.add(1, bufs[1], tags[1], 64, done[1]),
    ];
    let outer_ids = [queue_id(outer_q[0]), queue_id(outer_q[1])];
    let env = Arc::new(env);
    let e = env.clone();
    let work = Arc::new(work);
    env.hooks.set_script(
        Script::passes(3)
            .on_pass_enter(move |_, info, pass, _| {
                if info.queue_id == outer_ids[0] && pass == 0 {
                    assert!(wait_flag(&B_IN_EXIT), "replay B reached its PASS EXIT");
                    work(&e, target);
                    A_DONE.store(true, Ordering::SeqCst);
                }
            })
            .on_pass_exit(move |_, info, pass, _| {
                if info.queue_id == outer_ids[1] && pass == 0 {
                    B_IN_EXIT.store(true, Ordering::SeqCst);
                    assert!(wait_flag(&A_DONE), "replay A issued its work");
                }
                kreplay_passloop::ContinueChange::default()
            }),
    );
    let app = env.app;
    let jobs: Vec<Box<dyn FnOnce() -> i64 + Send>> = (0..2)
        .map(|k| -> Box<dyn FnOnce() -> i64 + Send> {
            Box::new(move || {
                app.dispatch(outer_q[k], outer[k]);
                app.wait_zero(done[k])
            })
        })
        .collect();

    let finished = bounded(LIMIT, jobs);

    assert_eq!(finished, vec![0, 0]);
    assert_eq!((runs(tags[0]), runs(tags[1])), (3, 3));
    assert_eq!(env.app.read(bufs[0], 64), vec![2; 64]);
    assert_eq!(env.app.read(bufs[1], 64), vec![3; 64]);
    assert_eq!(
        env.app.read(target, 64),
        vec![71; 64],
        "the work into B's memory survived B's restores"
    );
}

/// The longest a scenario's threads may take in all.
const LIMIT: Duration = Duration::from_secs(12);

scenarios! {
    /// The tool dispatches onto a sibling queue from PASS ENTER while another application
    /// thread is inside that queue's submission (its own dispatch waits for the replay to end).
    /// The tool's dispatch runs once, inside the callback; the other thread's dispatch runs once
    /// after the replay; nothing deadlocks.
    fn a_tool_dispatch_onto_a_sibling_queue_in_use_by_another_thread_runs_inside_the_callback() {
        static OTHER_IN_SUBMISSION: AtomicBool = AtomicBool::new(false);
        let env = setup();
        let (q1, q2) = (env.app.queue(env.app.gpus[0]), env.app.queue(env.app.gpus[0]));
        let sibling = queue_id(q2);
        let buf = env.app.buffer(env.pools[0].coarse, &[1; 64]);
        let other_buf = env.app.buffer(env.pools[0].coarse, &[5; 64]);
        // Fine-grained: never snapshotted, so only a second run could change what it shows.
        let inner_buf = env.app.buffer(env.pools[0].fine, &[40; 64]);
        let (done, other_done, inner_done) = (env.app.signal(1), env.app.signal(1), env.app.signal(1));
        let inner = env.add(0, inner_buf, 3, 64, inner_done);
        let other = env.add(0, other_buf, 2, 32, other_done);
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let go_tx = Mutex::new(Some(go_tx));
        let inner_wait: Arc<Mutex<Option<i64>>> = Arc::default();
        let (app, w) = (env.app, inner_wait.clone());
        env.hooks.set_script(
            Script::new(move |_, info| {
                if info.queue_id == sibling && info.workgroup_size[0] == 32 {
                    // The other thread is now inside the sibling queue's submission.
                    OTHER_IN_SUBMISSION.store(true, Ordering::SeqCst);
                    ToolAnswer::OPT_OUT
                } else {
                    ToolAnswer::passes(2)
                }
            })
            .on_pass_enter(move |_, info, pass, _| {
                if info.queue_id != sibling && info.workgroup_size[0] == 64 && pass == 0 && w.lock().is_none() {
                    if let Some(go) = go_tx.lock().take() {
                        let _ = go.send(());
                    }
                    assert!(wait_flag(&OTHER_IN_SUBMISSION), "the other thread reached its submission");
                    app.dispatch(q2, inner);
                    *w.lock() = Some(app.wait_zero(inner_done));
                }
            }),
        );
        let replayer: Box<dyn FnOnce() -> i64 + Send> = Box::new(move || {
            app.dispatch(q1, {
                let kernarg = app.kernargs(&app.pools(app.gpus[0]), AddArgs { buf: buf.0, len: 64, tag: 1 });
                Aql::dispatch(kreplay_softhsa::register_kernel("reentrancy_add_one", add_one), 64, 64, kernarg, done)
            });
            app.wait_zero(done)
        });
        let other_thread: Box<dyn FnOnce() -> i64 + Send> = Box::new(move || {
            go_rx.recv_timeout(WAIT).expect("the replay reached PASS ENTER");
            app.dispatch(q2, other);
            app.wait_zero(other_done)
        });

        let finished = bounded(LIMIT, vec![replayer, other_thread]);

        assert_eq!(finished, vec![0, 0], "both application dispatches completed");
        assert_eq!(*inner_wait.lock(), Some(0), "the tool's dispatch completed inside the callback");
        assert_eq!(env.app.load(inner_done), 0);
        assert_eq!((runs(1), runs(2), runs(3)), (2, 1, 1), "replayed twice, the others once each");
        assert_eq!(env.app.read(buf, 64), vec![2; 64]);
        assert_eq!(env.app.read(other_buf, 64), vec![6; 64]);
        assert_eq!(env.app.read(inner_buf, 64), vec![41; 64]);
        let inner_outcomes = env.outcome_of_tag_queue(q2, 64);
        assert_eq!(inner_outcomes.len(), 1);
        assert_eq!(declined(&inner_outcomes[0]), Some(DeclineReason::ReentrantDispatch));
    }

    /// The tool dispatches onto the very queue being replayed from PASS ENTER and waits for it:
    /// the dispatch runs once, inside the callback (not after the replay, not as a batch).
    fn a_tool_dispatch_onto_the_replaying_queue_runs_inside_the_callback() {
        let env = setup();
        let q = env.app.queue(env.app.gpus[0]);
        let buf = env.app.buffer(env.pools[0].coarse, &[7; 64]);
        let inner_buf = env.app.buffer(env.pools[0].fine, &[40; 64]);
        let (done, inner_done) = (env.app.signal(1), env.app.signal(1));
        let inner = env.add(0, inner_buf, 5, 32, inner_done);
        let outer = env.add(0, buf, 4, 64, done);
        let inner_wait: Arc<Mutex<Option<i64>>> = Arc::default();
        let (app, w) = (env.app, inner_wait.clone());
        env.hooks.set_script(Script::passes(3).on_pass_enter(move |_, info, pass, _| {
            if info.workgroup_size[0] == 64 && pass == 0 {
                app.dispatch(q, inner);
                *w.lock() = Some(app.wait_zero(inner_done));
            }
        }));
        let finished = dispatch_and_wait(app, q, outer, done);

        assert_eq!(finished, vec![0]);
        assert_eq!(*inner_wait.lock(), Some(0), "the tool's dispatch completed inside the callback");
        assert_eq!((runs(4), runs(5)), (3, 1));
        assert_eq!(env.app.read(buf, 64), vec![8; 64]);
        assert_eq!(env.app.read(inner_buf, 64), vec![41; 64], "the tool's dispatch ran exactly once");
        let outer_outcomes = env.outcome_of_tag_queue(q, 64);
        assert_eq!(outer_outcomes, vec![ReplayOutcome::Replayed { passes: 3, end: LoopEnd::LastPass }]);
        let inner_outcomes = env.outcome_of_tag_queue(q, 32);
        assert_eq!(inner_outcomes.len(), 1);
        assert_eq!(declined(&inner_outcomes[0]), Some(DeclineReason::ReentrantDispatch));
        assert!(!env.hooks.warned_keys().contains(&"batch_or_graph"));
    }

    /// Replays on agents 0 and 1 at the same time whose PASS ENTER callbacks each dispatch onto
    /// the other agent and wait for it: both nested dispatches run once (declined as
    /// `reentrant_dispatch`), both replays finish, nothing deadlocks.
    fn replays_on_two_agents_dispatching_onto_each_other_never_deadlock() {
        static IN_PASS: AtomicU32 = AtomicU32::new(0);
        let env = setup();
        let outer_q = [env.app.queue(env.app.gpus[0]), env.app.queue(env.app.gpus[1])];
        let inner_q = [env.app.queue(env.app.gpus[0]), env.app.queue(env.app.gpus[1])];
        let bufs = [env.app.buffer(env.pools[0].coarse, &[1; 64]), env.app.buffer(env.pools[1].coarse, &[2; 64])];
        let inner_bufs = [env.app.buffer(env.pools[0].fine, &[10; 64]), env.app.buffer(env.pools[1].fine, &[20; 64])];
        let done = [env.app.signal(1), env.app.signal(1)];
        let inner_done = [env.app.signal(1), env.app.signal(1)];
        // Inner dispatch k runs on agent k (issued by the replay on the other agent).
        let inner = [env.add(0, inner_bufs[0], 12, 32, inner_done[0]), env.add(1, inner_bufs[1], 13, 32, inner_done[1])];
        let outer = [env.add(0, bufs[0], 10, 64, done[0]), env.add(1, bufs[1], 11, 64, done[1])];
        let outer_ids = [queue_id(outer_q[0]), queue_id(outer_q[1])];
        let waits: Arc<Mutex<Vec<i64>>> = Arc::default();
        let (app, w) = (env.app, waits.clone());
        env.hooks.set_script(Script::passes(2).on_pass_enter(move |_, info, pass, _| {
            let Some(me) = outer_ids.iter().position(|&q| q == info.queue_id) else { return };
            if info.workgroup_size[0] != 64 || pass != 0 {
                return;
            }
            // Both replays hold their agents before either dispatches onto the other.
            IN_PASS.fetch_add(1, Ordering::SeqCst);
            let deadline = Instant::now() + WAIT;
            while IN_PASS.load(Ordering::SeqCst) < 2 && Instant::now() < deadline {
                std::thread::yield_now();
            }
            let other = 1 - me;
            app.dispatch(inner_q[other], inner[other]);
            w.lock().push(app.wait_zero(inner_done[other]));
        }));
        let jobs: Vec<Box<dyn FnOnce() -> i64 + Send>> = (0..2)
            .map(|k| -> Box<dyn FnOnce() -> i64 + Send> {
                Box::new(move || {
                    app.dispatch(outer_q[k], outer[k]);
                    app.wait_zero(done[k])
                })
            })
            .collect();

        let finished = bounded(LIMIT, jobs);

        assert_eq!(finished, vec![0, 0]);
        assert_eq!(*waits.lock(), vec![0, 0], "each nested dispatch completed inside its callback");
        assert_eq!((runs(10), runs(11), runs(12), runs(13)), (2, 2, 1, 1));
        assert_eq!(env.app.read(bufs[0], 64), vec![2; 64]);
        assert_eq!(env.app.read(bufs[1], 64), vec![3; 64]);
        assert_eq!(env.app.read(inner_bufs[0], 64), vec![11; 64]);
        assert_eq!(env.app.read(inner_bufs[1], 64), vec![21; 64]);
        for (k, queue) in inner_q.into_iter().enumerate() {
            let nested = env.outcome_of_tag_queue(queue, 32);
            assert_eq!(nested.len(), 1);
            assert_eq!(declined(&nested[0]), Some(DeclineReason::ReentrantDispatch), "agent {k}: {nested:?}");
        }
    }

    /// The tool dispatches onto a sibling queue from PASS ENTER of pass 0, over a buffer of the
    /// replaying agent that the replay snapshots, and waits for it: its increment survives the
    /// restores between the later passes (it ran once, before the replayed dispatch's passes).
    fn a_tool_dispatch_before_a_pass_survives_the_replays_restores() {
        let env = setup();
        let (q1, q2) = (env.app.queue(env.app.gpus[0]), env.app.queue(env.app.gpus[0]));
        let outer_queue = queue_id(q1);
        let buf = env.app.buffer(env.pools[0].coarse, &[3; 64]);
        // Coarse-grained on the replaying agent: in the replay's snapshot.
        let inner_buf = env.app.buffer(env.pools[0].coarse, &[50; 64]);
        let (done, inner_done) = (env.app.signal(1), env.app.signal(1));
        let inner = env.add(0, inner_buf, 15, 32, inner_done);
        let outer = env.add(0, buf, 14, 64, done);
        let inner_wait: Arc<Mutex<Option<i64>>> = Arc::default();
        let (app, w) = (env.app, inner_wait.clone());
        env.hooks.set_script(Script::passes(3).on_pass_enter(move |_, info, pass, _| {
            if info.queue_id == outer_queue && pass == 0 {
                app.dispatch(q2, inner);
                *w.lock() = Some(app.wait_zero(inner_done));
            }
        }));
        let finished = dispatch_and_wait(app, q1, outer, done);

        assert_eq!(finished, vec![0]);
        assert_eq!(*inner_wait.lock(), Some(0));
        assert_eq!((runs(14), runs(15)), (3, 1));
        assert_eq!(env.app.read(buf, 64), vec![4; 64], "the replayed dispatch's single-run result");
        assert_eq!(env.app.read(inner_buf, 64), vec![51; 64], "the tool's increment survived the restores");
        assert_eq!(env.outcome_of_tag_queue(q1, 64), vec![ReplayOutcome::Replayed { passes: 3, end: LoopEnd::LastPass }]);
    }

    /// The tool copies (`hsa_memory_copy`) and fills (`hsa_amd_memory_fill`) words the replayed
    /// kernel just changed, from PASS EXIT of pass 0, with values some of whose bytes are the
    /// ones the kernel left there (the kernel makes 9 into 10; the copy writes 0x0B0A, whose low
    /// byte is 10, and the fill 0x0000_000A, all of whose bytes are). The passes after start
    /// from what the tool wrote, every byte of it: the words end at the tool's value plus the
    /// one increment of the last pass. A comparison with memory before the call would miss the
    /// bytes written with the value they held and leave the snapshot's 9 under them.
    fn a_tool_copy_or_fill_after_a_pass_is_kept_whole_even_where_bytes_kept_their_value() {
        let env = setup();
        let q1 = env.app.queue(env.app.gpus[0]);
        let outer_queue = queue_id(q1);
        let buf = env.app.buffer(env.pools[0].coarse, &[9; 64]);
        let done = env.app.signal(1);
        let outer = env.add(0, buf, 30, 64, done);
        let app = env.app;
        env.hooks.set_script(Script::passes(3).on_pass_exit(move |_, info, pass, _| {
            if info.queue_id == outer_queue && pass == 0 {
                app.write(buf, &[0x0B0A; 16]);
                app.fill(Ptr(buf.0 + 16 * 4), 0x0A, 16);
            }
            kreplay_passloop::ContinueChange::default()
        }));
        let finished = dispatch_and_wait(app, q1, outer, done);

        assert_eq!(finished, vec![0]);
        assert_eq!(runs(30), 3);
        let mut expected = vec![10; 64];
        expected[..16].fill(0x0B0B);
        expected[16..32].fill(0x0B);
        assert_eq!(env.app.read(buf, 64), expected);
    }

    /// The tool dispatches onto a sibling queue from PASS EXIT of pass 0 (after the replayed
    /// kernel ran, before the next restore), over a buffer of the replaying agent that the
    /// replay snapshots, and waits for it: its increment survives the restores of the later
    /// passes, and the replayed dispatch's own writes are still undone (it ran once in effect).
    fn a_tool_dispatch_after_a_passs_kernel_survives_the_next_restores() {
        let env = setup();
        let (q1, q2) = (env.app.queue(env.app.gpus[0]), env.app.queue(env.app.gpus[0]));
        let outer_queue = queue_id(q1);
        let buf = env.app.buffer(env.pools[0].coarse, &[3; 64]);
        let inner_buf = env.app.buffer(env.pools[0].coarse, &[50; 64]);
        let (done, inner_done) = (env.app.signal(1), env.app.signal(1));
        let inner = env.add(0, inner_buf, 17, 32, inner_done);
        let outer = env.add(0, buf, 16, 64, done);
        let inner_wait: Arc<Mutex<Option<i64>>> = Arc::default();
        let (app, w) = (env.app, inner_wait.clone());
        env.hooks.set_script(Script::passes(3).on_pass_exit(move |_, info, pass, _| {
            if info.queue_id == outer_queue && pass == 0 {
                app.dispatch(q2, inner);
                *w.lock() = Some(app.wait_zero(inner_done));
            }
            kreplay_passloop::ContinueChange::default()
        }));
        let finished = dispatch_and_wait(app, q1, outer, done);

        assert_eq!(finished, vec![0]);
        assert_eq!(*inner_wait.lock(), Some(0));
        assert_eq!((runs(16), runs(17)), (3, 1));
        assert_eq!(env.app.read(buf, 64), vec![4; 64], "the replayed dispatch's single-run result");
        assert_eq!(env.app.read(inner_buf, 64), vec![51; 64], "the tool's increment survived the restores");
        assert_eq!(env.outcome_of_tag_queue(q1, 64), vec![ReplayOutcome::Replayed { passes: 3, end: LoopEnd::LastPass }]);
    }

    /// Agents 0 and 1 granted each other access to a buffer (one replay group): two threads,
    /// one per agent, each dispatch x += 1 fifteen times onto their own agent's buffer and
    /// fifteen times onto the peer's, every dispatch replayed three times. The replays take
    /// both agents' writer sides in the same order and drain both: none deadlocks, and every
    /// buffer ends at its count of runs, none undone by the other agent's restores.
    fn replays_on_two_peer_agents_from_two_threads_neither_deadlock_nor_undo_each_other() {
        let env = setup();
        let allow = env.app.amd().hsa_amd_agents_allow_access_fn.expect("hsa_amd_agents_allow_access");
        let own = [env.app.buffer(env.pools[0].coarse, &[0; 64]), env.app.buffer(env.pools[1].coarse, &[0; 64])];
        let peer = [env.app.buffer(env.pools[0].coarse, &[0; 64]), env.app.buffer(env.pools[1].coarse, &[0; 64])];
        for (k, buf) in peer.iter().enumerate() {
            let other = env.app.gpus[1 - k];
            // SAFETY: one agent handle, alive for the call; `buf` is a live allocation.
            assert_eq!(unsafe { allow(1, &other, std::ptr::null(), buf.raw()) }, 0);
        }
        let (g0, g1) = (env.app.gpus[0].handle, env.app.gpus[1].handle);
        assert_eq!(kreplay_hsa::replay_group(g0), kreplay_hsa::replay_group(g1));
        env.hooks.set_script(Script::passes(3));
        let queues = [env.app.queue(env.app.gpus[0]), env.app.queue(env.app.gpus[1])];
        let rounds = 15;
        let mut packets = Vec::new();
        for k in 0..2 {
            let mut mine = Vec::new();
            for _ in 0..rounds {
                for buf in [own[k], peer[1 - k]] {
                    let done = env.app.signal(1);
                    mine.push((env.add(k, buf, 30 + k as u32, 64, done), done));
                }
            }
            packets.push(mine);
        }
        let app = env.app;
        let jobs: Vec<Box<dyn FnOnce() -> i64 + Send>> = packets
            .into_iter()
            .enumerate()
            .map(|(k, mine)| -> Box<dyn FnOnce() -> i64 + Send> {
                let q = queues[k];
                Box::new(move || mine.into_iter().map(|(p, done)| {
                    app.dispatch(q, p);
                    app.wait_zero(done)
                }).sum())
            })
            .collect();

        let finished = bounded(LIMIT, jobs);

        assert_eq!(finished, vec![0, 0]);
        let replayed = env
            .hooks
            .configured_dispatches()
            .iter()
            .filter(|d| matches!(env.hooks.finished_record(d.dispatch_id).outcome, ReplayOutcome::Replayed { passes: 3, .. }))
            .count();
        assert_eq!(replayed, 4 * rounds, "every dispatch replayed");
        for k in 0..2 {
            assert_eq!(env.app.read(own[k], 64), vec![rounds as u32; 64], "agent {k}'s own buffer");
            assert_eq!(env.app.read(peer[k], 64), vec![rounds as u32; 64], "agent {k}'s buffer the peer writes");
        }
    }

    /// Replays on agents 0 and 1 at the same time whose PASS ENTER callbacks each copy
    /// (`hsa_memory_copy`) into memory of the other agent: both copies land inside their
    /// callbacks, both replays finish, nothing deadlocks.
    fn replays_on_two_agents_copying_into_each_other_never_deadlock() {
        static IN_PASS: AtomicU32 = AtomicU32::new(0);
        let env = setup();
        let outer_q = [env.app.queue(env.app.gpus[0]), env.app.queue(env.app.gpus[1])];
        let bufs = [env.app.buffer(env.pools[0].coarse, &[1; 64]), env.app.buffer(env.pools[1].coarse, &[2; 64])];
        let targets = [env.app.buffer(env.pools[0].fine, &[0; 64]), env.app.buffer(env.pools[1].fine, &[0; 64])];
        let done = [env.app.signal(1), env.app.signal(1)];
        let outer = [env.add(0, bufs[0], 18, 64, done[0]), env.add(1, bufs[1], 19, 64, done[1])];
        let outer_ids = [queue_id(outer_q[0]), queue_id(outer_q[1])];
        let copied = Arc::new(AtomicU32::new(0));
        let (app, c) = (env.app, copied.clone());
        env.hooks.set_script(Script::passes(2).on_pass_enter(move |_, info, pass, _| {
            let Some(me) = outer_ids.iter().position(|&q| q == info.queue_id) else { return };
            if pass != 0 {
                return;
            }
            // Both replays hold their agents before either copies into the other's memory.
            IN_PASS.fetch_add(1, Ordering::SeqCst);
            let deadline = Instant::now() + WAIT;
            while IN_PASS.load(Ordering::SeqCst) < 2 && Instant::now() < deadline {
                std::thread::yield_now();
            }
            let other = 1 - me;
            app.write(targets[other], &[100 + me as u32; 64]);
            c.fetch_add(1, Ordering::SeqCst);
        }));
        let jobs: Vec<Box<dyn FnOnce() -> i64 + Send>> = (0..2)
            .map(|k| -> Box<dyn FnOnce() -> i64 + Send> {
                Box::new(move || {
                    app.dispatch(outer_q[k], outer[k]);
                    app.wait_zero(done[k])
                })
            })
            .collect();

        let finished = bounded(LIMIT, jobs);

        assert_eq!(finished, vec![0, 0]);
        assert_eq!(copied.load(Ordering::SeqCst), 2, "each copy returned inside its callback");
        assert_eq!((runs(18), runs(19)), (2, 2));
        assert_eq!(env.app.read(bufs[0], 64), vec![2; 64]);
        assert_eq!(env.app.read(bufs[1], 64), vec![3; 64]);
        assert_eq!(env.app.read(targets[0], 64), vec![101; 64], "agent 1's copy landed");
        assert_eq!(env.app.read(targets[1], 64), vec![100; 64], "agent 0's copy landed");
    }

    /// A tool dispatch from another agent's replay window into memory this replay snapshotted,
    /// issued after this replay's pass 0 kernel: folded into this replay's snapshot, it
    /// survives its later restores.
    fn a_tool_dispatch_from_another_agents_replay_survives_this_replays_restores() {
        work_into_another_replaying_agent_survives(
            |env, target| {
                let (queue, signal) = (env.app.queue(env.app.gpus[1]), env.app.signal(1));
                env.app.dispatch(queue, env.add(1, target, 22, 32, signal));
                assert_eq!(env.app.wait_zero(signal), 0);
            },
            [20, 21],
        );
        assert_eq!(runs(22), 1);
    }

    /// The same with `hsa_amd_memory_async_copy` from the other replay's window (waited for).
    fn an_async_copy_from_another_agents_replay_survives_this_replays_restores() {
        work_into_another_replaying_agent_survives(
            |env, target| {
                let (src, signal) = (env.app.buffer(env.pools[0].fine, &[71; 64]), env.app.signal(1));
                env.app.async_copy(target, env.app.gpus[1], src, env.app.gpus[0], 256, signal);
                assert_eq!(env.app.wait_zero(signal), 0);
            },
            [28, 29],
        );
    }

    /// The same with `hsa_memory_copy` from the other replay's window.
    fn a_copy_from_another_agents_replay_survives_this_replays_restores() {
        work_into_another_replaying_agent_survives(|env, target| env.app.write(target, &[71; 64]), [23, 24]);
    }

    fn a_tool_dispatch_after_a_pass_survives_byte_for_byte_under_full_restores_host_store() {
        tool_dispatches_after_passes_survive(RestoreStrategy::Full, StoreTier::Host, [25, 26, 27]);
    }

    fn a_tool_dispatch_after_a_pass_survives_byte_for_byte_under_hash_restores_device_store() {
        tool_dispatches_after_passes_survive(RestoreStrategy::Hash, StoreTier::Device, [25, 26, 27]);
    }

    fn a_tool_dispatch_after_a_pass_survives_byte_for_byte_under_writeset_restores_file_store() {
        tool_dispatches_after_passes_survive(RestoreStrategy::Writeset, StoreTier::File, [25, 26, 27]);
    }

    fn a_tool_dispatch_after_a_pass_survives_byte_for_byte_under_unverified_writeset_restores_host_store() {
        tool_dispatches_after_passes_survive(RestoreStrategy::WritesetUnverified, StoreTier::Host, [25, 26, 27]);
    }

    fn a_tool_dispatch_after_a_pass_survives_byte_for_byte_under_unverified_writeset_restores_device_store() {
        tool_dispatches_after_passes_survive(RestoreStrategy::WritesetUnverified, StoreTier::Device, [25, 26, 27]);
    }

    fn a_tool_dispatch_after_a_pass_survives_byte_for_byte_under_auto_restores_auto_store() {
        tool_dispatches_after_passes_survive(RestoreStrategy::Auto, StoreTier::Auto, [25, 26, 27]);
    }

    fn a_tool_dispatch_after_a_pass_survives_byte_for_byte_under_full_restores_device_store() {
        tool_dispatches_after_passes_survive(RestoreStrategy::Full, StoreTier::Device, [25, 26, 27]);
    }

    fn a_tool_dispatch_after_a_pass_survives_byte_for_byte_under_hash_restores_file_store() {
        tool_dispatches_after_passes_survive(RestoreStrategy::Hash, StoreTier::File, [25, 26, 27]);
    }
}

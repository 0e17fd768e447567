//! Replay on top of softhsa's fault injection: each fault a real runtime can throw at kreplay
//! gives the outcome docs/abi.md requires. A decline leaves memory untouched and runs the dispatch once;
//! a failed restore is reported with the bytes lost; in every case the application keeps running
//! and its completion fires exactly once.
//!
//! Faults are switched on around the dispatch under test only (the application's own setup and
//! read-back use the same runtime calls). Every scenario runs in a process of its own.

#[allow(dead_code)]
#[macro_use]
mod support;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{DeclineReason, LoopEnd, RanOnceReason, ReplayOutcome};
use kreplay_snapshot::{RestoreStrategy, SnapshotConfig, StoreTier};
use kreplay_softhsa::WorkGroup;
use kreplay_softhsa::faults::{self, Fault, FaultPlan};
use support::app::{self, App, Aql, Pools, Ptr, WAIT};
use support::tool::{Script, TestHooks};

/// Runs of `add_one` per tag.
static RUNS: [AtomicU32; 8] = [const { AtomicU32::new(0) }; 8];

#[repr(C)]
#[derive(Clone, Copy)]
struct AddArgs {
    buf: u64,
    len: u32,
    tag: u32,
}

/// `buf[i] += 1`; work-group 0 counts the run.
fn add_one(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries an `AddArgs` block.
    let args: AddArgs = unsafe { group.kernargs() };
    if group.group_id() == [0, 0, 0] {
        RUNS[args.tag as usize].fetch_add(1, Ordering::SeqCst);
    }
    for [i, _, _] in group.work_items() {
        if i < args.len {
            // SAFETY: the buffer holds `len` u32s; each work-item owns index `i`.
            unsafe { *(args.buf as *mut u32).add(i as usize) += 1 };
        }
    }
}

static GATE: AtomicBool = AtomicBool::new(true);
static GATED_STARTED: AtomicBool = AtomicBool::new(false);

/// `add_one` that first waits (bounded) until `GATE` is open.
fn gated_add(group: &WorkGroup) {
    GATED_STARTED.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + WAIT;
    while !GATE.load(Ordering::SeqCst) && Instant::now() < deadline {
        std::thread::yield_now();
    }
    add_one(group);
}

fn runs(tag: u32) -> u32 {
    RUNS[tag as usize].load(Ordering::SeqCst)
}

struct Env {
    app: App,
    hooks: std::sync::Arc<TestHooks>,
    pools: Pools,
}

fn setup(options: InstallOptions) -> Env {
    let hooks = TestHooks::new(0);
    let app = app::install(hooks.clone(), options);
    hooks.configure_replay(true);
    let pools = app.pools(app.gpus[0]);
    Env { app, hooks, pools }
}

/// The discrete-GPU copy path (every snapshot and restore byte moves through the runtime's copy
/// entry points, where the faults are) with a host store.
fn runtime_copy_options(strategy: RestoreStrategy) -> InstallOptions {
    InstallOptions {
        snapshot: SnapshotConfig::default()
            .with_store(StoreTier::Host)
            .with_strategy(strategy)
            .with_chunk_size(4096),
        drain: DrainConfig::new(WAIT),
        force_runtime_copies: true,
        ..Default::default()
    }
}

impl Env {
    fn add(&self, buf: Ptr, len: u32, tag: u32, done: hsa_sys::hsa_signal_t) -> Aql {
        let kernarg = self.app.kernargs(
            &self.pools,
            AddArgs {
                buf: buf.0,
                len,
                tag,
            },
        );
        let kernel = kreplay_softhsa::register_kernel("faults_add_one", add_one);
        Aql::dispatch(kernel, len, 64, kernarg, done)
    }

    fn last_outcome(&self) -> (u64, ReplayOutcome) {
        let id = self
            .hooks
            .configured_dispatches()
            .last()
            .expect("a dispatch reached CONFIG ENTER")
            .dispatch_id;
        (id, self.hooks.finished_record(id).outcome)
    }

    /// Dispatches `add_one` over `buf` with the fault plan on, waits for the application's
    /// completion, switches the faults off and checks it fired exactly once.
    fn dispatch_with(&self, plan: FaultPlan, buf: Ptr, len: u32, tag: u32) -> (u64, ReplayOutcome) {
        let queue = self.app.queue(self.app.gpus[0]);
        let done = self.app.signal(1);
        let packet = self.add(buf, len, tag, done);
        faults::install(Some(plan));
        self.app.dispatch(queue, packet);
        let value = self.app.wait_zero(done);
        faults::install(None);
        assert_eq!(value, 0, "the application's completion fired");
        let outcome = self.last_outcome();
        assert_eq!(self.app.load(done), 0, "the completion fired exactly once");
        outcome
    }

    /// The application keeps running: another replayed dispatch, without faults, is replayed
    /// and adds exactly one.
    fn still_replays(&self, buf: Ptr, len: u32, tag: u32) {
        let before = self.app.read(buf, len as usize);
        let (_, outcome) = self.dispatch_with(FaultPlan::new(0), buf, len, tag);
        assert!(
            matches!(outcome, ReplayOutcome::Replayed { .. }),
            "after the fault, replay works again: {outcome:?}"
        );
        let after = self.app.read(buf, len as usize);
        let expected: Vec<u32> = before.iter().map(|x| x + 1).collect();
        assert_eq!(after, expected, "the later dispatch added exactly one");
    }
}

fn values(start: u32, len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| start + 7 * i).collect()
}

fn plus(v: &[u32], n: u32) -> Vec<u32> {
    v.iter().map(|x| x + n).collect()
}

fn declined(outcome: &ReplayOutcome) -> Option<DeclineReason> {
    match outcome {
        ReplayOutcome::RanOnce {
            why: RanOnceReason::Declined(d),
        } => Some(d.reason),
        _ => None,
    }
}

scenarios! {
    /// Every `hsa_memory_copy` fails while the snapshot is taken: the replay is declined as
    /// `snapshot_failed` before any pass, the dispatch runs once, memory is as after one run.
    fn a_snapshot_copy_that_fails_declines_the_replay_and_runs_the_dispatch_once() {
        let env = setup(runtime_copy_options(RestoreStrategy::Full));
        env.hooks.set_script(Script::passes(3));
        let init = values(5, 4096);
        let buf = env.app.buffer(env.pools.coarse, &init);

        let (_, outcome) = env.dispatch_with(FaultPlan::new(1).with(Fault::Copy, 1.0), buf, 4096, 1);

        assert_eq!(declined(&outcome), Some(DeclineReason::SnapshotFailed), "{outcome:?}");
        assert!(faults::fired(Fault::Copy) > 0, "the fault struck");
        assert_eq!(runs(1), 1, "the declined dispatch ran once");
        assert_eq!(env.app.read(buf, 4096), plus(&init, 1), "memory as after one run");
        env.still_replays(buf, 4096, 2);
    }

    /// Every asynchronous copy fails when a restore writes back (the snapshot, read with
    /// `hsa_memory_copy`, succeeded): the restore failure is reported with the bytes lost, the
    /// loop stops, the application's completion fires exactly once and the next dispatch is
    /// replayed normally.
    fn a_restore_copy_that_fails_is_reported_with_the_bytes_lost() {
        let env = setup(runtime_copy_options(RestoreStrategy::Full));
        env.hooks.set_script(Script::passes(3));
        let init = values(9, 4096);
        let buf = env.app.buffer(env.pools.coarse, &init);

        let (_, outcome) = env.dispatch_with(FaultPlan::new(1).with(Fault::AsyncCopy, 1.0), buf, 4096, 1);

        match &outcome {
            ReplayOutcome::RestoreFailed { after_pass, failure } => {
                assert_eq!(*after_pass, 0, "the first restore failed");
                assert!(failure.bytes_unrestored > 0, "the loss is counted: {failure:?}");
            }
            other => panic!("expected a reported restore failure, got {other:?}"),
        }
        assert!(faults::fired(Fault::AsyncCopy) > 0);
        assert_eq!(runs(1), 1, "no pass ran on unrestored memory");
        assert_eq!(env.app.read(buf, 4096), plus(&init, 1), "what the one pass left");
        env.still_replays(buf, 4096, 2);
    }

    /// A forced device store whose shadow cannot be allocated: the replay is declined before
    /// any pass (or the store falls back to another tier); either way memory is as after one
    /// run and nothing is reported as replayed that was not.
    fn a_device_store_that_cannot_be_allocated_never_loses_the_dispatch() {
        let mut options = runtime_copy_options(RestoreStrategy::Full);
        options.snapshot.store = StoreTier::Device;
        options.force_runtime_copies = false;
        let env = setup(options);
        env.hooks.set_script(Script::passes(3));
        let init = values(3, 4096);
        let buf = env.app.buffer(env.pools.coarse, &init);

        let (_, outcome) = env.dispatch_with(FaultPlan::new(1).with(Fault::PoolAllocate, 1.0), buf, 4096, 1);

        assert!(faults::fired(Fault::PoolAllocate) > 0, "the store allocation was refused");
        match &outcome {
            ReplayOutcome::Replayed { passes: 3, end: LoopEnd::LastPass } => assert_eq!(runs(1), 3),
            other => {
                assert!(declined(other).is_some(), "a decline, not a failure: {other:?}");
                assert_eq!(runs(1), 1, "the declined dispatch ran once");
            }
        }
        assert_eq!(env.app.read(buf, 4096), plus(&init, 1), "memory as after one run");
        env.still_replays(buf, 4096, 2);
    }

    /// The file tier in a process whose file size limit (`RLIMIT_FSIZE`) is below the snapshot
    /// and which left SIGXFSZ at its default action (ending the process): the replay is
    /// declined as `snapshot_failed`, the dispatch runs once, nothing is left in the spill
    /// folder, and once the limit is raised the next dispatch is replayed from a spill file.
    fn a_spill_file_over_the_file_size_limit_declines_the_replay_and_runs_the_dispatch_once() {
        let spill = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("faults-fsize-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&spill);
        std::fs::create_dir_all(&spill).unwrap();
        let mut options = runtime_copy_options(RestoreStrategy::Full);
        options.snapshot = options.snapshot.with_store(StoreTier::File).with_spill_dir(Some(spill.clone()));
        let env = setup(options);
        env.hooks.set_script(Script::passes(3));
        let init = values(4, 4096);
        let buf = env.app.buffer(env.pools.coarse, &init);
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: `limit` is a valid out-parameter.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_FSIZE, &mut limit) }, 0);
        let unlimited = limit.rlim_cur;
        limit.rlim_cur = 8 << 10;
        // SAFETY: a valid rlimit; this scenario's process only.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &limit) }, 0);

        let (_, outcome) = env.dispatch_with(FaultPlan::new(0), buf, 4096, 1);

        assert_eq!(declined(&outcome), Some(DeclineReason::SnapshotFailed), "{outcome:?}");
        assert_eq!(runs(1), 1, "the declined dispatch ran once");
        assert_eq!(env.app.read(buf, 4096), plus(&init, 1), "memory as after one run");
        assert_eq!(std::fs::read_dir(&spill).unwrap().count(), 0, "no spill file left");
        limit.rlim_cur = unlimited;
        // SAFETY: as above.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &limit) }, 0);
        env.still_replays(buf, 4096, 2);
        let _ = std::fs::remove_dir_all(&spill);
    }

    /// No signal can be created: everything a replay needs is acquired before the snapshot, so
    /// the replay is declined, the dispatch runs once and memory is as after one run.
    fn a_signal_that_cannot_be_created_declines_the_replay_before_the_snapshot() {
        let env = setup(InstallOptions {
            drain: DrainConfig::new(WAIT),
            ..Default::default()
        });
        env.hooks.set_script(Script::passes(3));
        let init = values(6, 4096);
        let buf = env.app.buffer(env.pools.coarse, &init);

        let (_, outcome) = env.dispatch_with(
            FaultPlan::new(1).with(Fault::SignalCreate, 1.0),
            buf,
            4096,
            1,
        );

        assert!(faults::fired(Fault::SignalCreate) > 0, "the fault struck");
        assert!(declined(&outcome).is_some(), "a decline: {outcome:?}");
        assert_eq!(runs(1), 1, "the declined dispatch ran once");
        assert_eq!(
            env.app.read(buf, 4096),
            plus(&init, 1),
            "memory as after one run"
        );
        env.still_replays(buf, 4096, 2);
    }

    /// A sibling queue that stalls longer than the drain budget: the replay is declined as
    /// `agent_drain_stuck` before any snapshot, the dispatch runs once, and the stalled work
    /// lands whole.
    fn a_stalled_sibling_queue_declines_the_replay_as_agent_drain_stuck() {
        let env = setup(InstallOptions { drain: DrainConfig::new(Duration::from_millis(150)), ..Default::default() });
        let tool_kernel = kreplay_softhsa::register_kernel("faults_add_one", add_one);
        let _ = tool_kernel;
        env.hooks.set_script(Script::new(|_, info| {
            if info.grid_size[0] == 64 {
                kreplay_passloop::ToolAnswer::OPT_OUT
            } else {
                kreplay_passloop::ToolAnswer::passes(3)
            }
        }));
        let (q1, q2) = (env.app.queue(env.app.gpus[0]), env.app.queue(env.app.gpus[0]));
        let init = values(1, 4096);
        let (buf, other) = (env.app.buffer(env.pools.coarse, &init), env.app.buffer(env.pools.coarse, &[0; 64]));
        let stalled_done = env.app.signal(1);
        let stalled = env.add(other, 64, 3, stalled_done);
        let done = env.app.signal(1);
        let packet = env.add(buf, 4096, 1, done);

        faults::install(Some(FaultPlan::new(1).with_delay(Fault::QueueStall, Duration::from_millis(1200)).at_most(Fault::QueueStall, 1)));
        env.app.dispatch(q2, stalled);
        // The stall has struck once the sibling's processor took its packet: then the replay
        // of the next dispatch finds the sibling queue busy.
        let deadline = Instant::now() + WAIT;
        while faults::fired(Fault::QueueStall) == 0 && Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert_eq!(faults::fired(Fault::QueueStall), 1, "the sibling queue stalled");
        env.app.dispatch(q1, packet);
        let values_done = (env.app.wait_zero(done), env.app.wait_zero(stalled_done));
        faults::install(None);

        assert_eq!(values_done, (0, 0), "both completions fired");
        let (id, outcome) = env.last_outcome();
        assert_eq!(declined(&outcome), Some(DeclineReason::AgentDrainStuck), "{outcome:?}");
        assert_eq!(env.hooks.labels_of(id), vec!["config-enter", "config-exit"], "declined before any snapshot");
        assert_eq!((runs(1), runs(3)), (1, 1));
        assert_eq!(env.app.read(buf, 4096), plus(&init, 1));
        assert_eq!(env.app.read(other, 64), vec![1; 64], "the stalled work landed");
        assert_eq!((env.app.load(done), env.app.load(stalled_done)), (0, 0), "each fired once");
    }

    /// Slow kernels (well within the pass budget) are waited for on every pass: the replay ends
    /// normally and memory is as after one run.
    fn slow_kernels_are_waited_for_on_every_pass() {
        let env = setup(InstallOptions { drain: DrainConfig::new(WAIT), ..Default::default() });
        env.hooks.set_script(Script::passes(3));
        let init = values(2, 4096);
        let buf = env.app.buffer(env.pools.coarse, &init);

        let plan = FaultPlan::new(1).with_delay(Fault::SlowKernel, Duration::from_millis(150));
        let (_, outcome) = env.dispatch_with(plan, buf, 4096, 1);

        assert_eq!(outcome, ReplayOutcome::Replayed { passes: 3, end: LoopEnd::LastPass });
        assert!(faults::fired(Fault::SlowKernel) >= 3, "every pass was slow");
        assert_eq!(runs(1), 3);
        assert_eq!(env.app.read(buf, 4096), plus(&init, 1));
    }

    /// An application async copy whose completion comes late, still in flight when a replay
    /// on its agent starts: the replay waits for it (or declines), the copied bytes are never
    /// undone and the dispatch's result is as after one run.
    fn a_late_async_copy_is_never_undone_by_a_replay() {
        let env = setup(InstallOptions { drain: DrainConfig::new(WAIT), ..Default::default() });
        env.hooks.set_script(Script::passes(3));
        let init = values(4, 4096);
        let buf = env.app.buffer(env.pools.coarse, &init);
        let source = env.app.buffer(env.pools.coarse, &values(1000, 1024));
        let target = env.app.buffer(env.pools.coarse, &[0; 1024]);
        let copied = env.app.signal(1);
        let queue = env.app.queue(env.app.gpus[0]);
        let done = env.app.signal(1);
        let packet = env.add(buf, 4096, 1, done);

        faults::install(Some(FaultPlan::new(1).with_delay(Fault::AsyncCopyDelay, Duration::from_millis(400))));
        env.app.async_copy(target, env.app.gpus[0], source, env.app.gpus[0], 4096, copied);
        env.app.dispatch(queue, packet);
        let waited = (env.app.wait_zero(done), env.app.wait_zero(copied));
        faults::install(None);

        assert_eq!(waited, (0, 0));
        assert!(faults::fired(Fault::AsyncCopyDelay) >= 1, "the copy was late");
        let (_, outcome) = env.last_outcome();
        assert!(
            matches!(outcome, ReplayOutcome::Replayed { passes: 3, .. }) || declined(&outcome).is_some(),
            "{outcome:?}"
        );
        assert_eq!(env.app.read(target, 1024), values(1000, 1024), "the late copy is not undone");
        assert_eq!(env.app.read(buf, 4096), plus(&init, 1));
    }
}

/// A sibling queue destroyed while a replay on its agent is draining it (its last in-flight
/// marker not processed yet): the replay goes on promptly, it does not wait out the drain
/// budget on a queue that no longer exists.
fn destroyed_sibling_scenario() {
    const STALL: Duration = Duration::from_secs(5);
    let env = setup(InstallOptions {
        drain: DrainConfig::new(Duration::from_secs(10)),
        ..Default::default()
    });
    let gated = kreplay_softhsa::register_kernel("faults_gated_add", gated_add);
    env.hooks.set_script(Script::new(move |_, info| {
        if info.kernel_id == gated {
            kreplay_passloop::ToolAnswer::OPT_OUT
        } else {
            kreplay_passloop::ToolAnswer::passes(2)
        }
    }));
    let (q1, q2) = (
        env.app.queue(env.app.gpus[0]),
        env.app.queue(env.app.gpus[0]),
    );
    let init = values(1, 4096);
    let (buf, other) = (
        env.app.buffer(env.pools.coarse, &init),
        env.app.buffer(env.pools.coarse, &[0; 64]),
    );
    GATE.store(false, Ordering::SeqCst);
    let sibling_done = env.app.signal(1);
    let mut sibling = env.add(other, 64, 3, sibling_done);
    sibling.set_kernel(gated);
    env.app.dispatch(q2, sibling);
    let deadline = Instant::now() + WAIT;
    while !GATED_STARTED.load(Ordering::SeqCst) && Instant::now() < deadline {
        std::thread::yield_now();
    }
    // The first packet any hardware queue takes from now on stalls. The replay's own queue gets
    // nothing before its drain is over, and its drain asks the sibling for a marker (the
    // sibling forwarded the gated kernel): so the packet that stalls is that marker, whenever
    // the replay reaches its drain.
    faults::install(Some(
        FaultPlan::new(1)
            .with_delay(Fault::QueueStall, STALL)
            .at_most(Fault::QueueStall, 1),
    ));
    let done = env.app.signal(1);
    let packet = env.add(buf, 4096, 1, done);
    let app = env.app;
    let replay = std::thread::spawn(move || {
        app.dispatch(q1, packet);
        app.wait_zero(done)
    });
    GATE.store(true, Ordering::SeqCst);
    assert_eq!(env.app.wait_zero(sibling_done), 0);
    // Destroy the sibling only once its marker is stalled: the drain is then waiting on a
    // queue that is about to disappear.
    let deadline = Instant::now() + WAIT;
    while faults::fired(Fault::QueueStall) == 0 && Instant::now() < deadline {
        std::thread::yield_now();
    }
    assert_eq!(
        faults::fired(Fault::QueueStall),
        1,
        "the sibling's marker never reached its processor"
    );
    let destroyed = Instant::now();
    env.app.destroy_queue(q2);
    assert_eq!(replay.join().unwrap(), 0);
    let took = destroyed.elapsed();
    faults::install(None);
    let (_, outcome) = env.last_outcome();
    // Without the destroy the marker would complete only after the stall; with it, the replay
    // goes on at once (its passes and restores are a few milliseconds of work).
    assert!(
        took < STALL / 2,
        "the replay went on {took:?} after the destroy: {outcome:?}"
    );
    assert_eq!(declined(&outcome), None, "{outcome:?}");
}

/// Runs [`destroyed_sibling_scenario`] in a process of its own, as `scenarios!` does, with
/// `--include-ignored` so that the child runs it too.
#[test]
fn a_sibling_queue_destroyed_during_a_drain_does_not_stall_the_replay() {
    const NAME: &str = "a_sibling_queue_destroyed_during_a_drain_does_not_stall_the_replay";
    const CHILD: &str = "KREPLAY_HSA_FAULTS_CHILD";
    if std::env::var_os(CHILD).is_some() {
        destroyed_sibling_scenario();
        return;
    }
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            NAME,
            "--nocapture",
            "--test-threads=1",
            "--include-ignored",
        ])
        .env(CHILD, "1")
        .output()
        .expect("the scenario's process runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{text}");
    assert!(text.contains("1 passed"), "{text}");
}

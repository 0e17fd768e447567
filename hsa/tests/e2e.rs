//! End-to-end tests of the HSA backend on softhsa.
//!
//! Each scenario acts as an HSA application would under a tools library: it copies softhsa's
//! API table, installs kreplay into the copy with a test tool, and then only talks to the copy
//! (agents, pools, allocations, intercept queues, AQL packets, doorbells, signals). Kernels are
//! softhsa host kernels. The backend is process-global, so every scenario runs in a process of
//! its own (see `support::isolated`).

#[allow(dead_code)]
#[macro_use]
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use hsa_sys::hsa_signal_t;
use kreplay_ctxmask::{ToggleError, replay_start_context, replay_stop_context};
use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{
    ContinueChange, DeclineReason, LoopEnd, Phase, RanOnceReason, ReplayOutcome, RestoreStrategy,
    StoreTier, ToolAnswer,
};
use kreplay_snapshot::{MemoryKind, SnapshotConfig};
use kreplay_softhsa::WorkGroup;
use parking_lot::Mutex;
use support::app::{self, App, Aql, Pools, Ptr, Queue, WAIT};
use support::tool::{Event, Script, TestHooks};

// ---------------------------------------------------------------------------------------------
// Kernels

/// Runs of the `add_one` kernel per tag (one count per dispatch run, not per work-group). Every
/// scenario runs in a process of its own, so tags only need to be distinct within one scenario.
static RUNS: [AtomicU32; 32] = [const { AtomicU32::new(0) }; 32];
/// What `add_one` read at its `observe` address, per run: (tag, value).
static SEEN: Mutex<Vec<(u32, u32)>> = Mutex::new(Vec::new());

/// Arguments of `add_one`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct AddArgs {
    /// Buffers of `u32` to increment (the first `nbufs`).
    bufs: [u64; 4],
    nbufs: u32,
    /// Elements incremented in each buffer.
    len: u32,
    /// Index into `RUNS`.
    tag: u32,
    pad: u32,
    /// If non-zero, a `u32` the kernel reads and logs into `SEEN` before incrementing.
    observe: u64,
}

/// `x[i] += 1` over every buffer, once per work-item; work-group 0 counts the run.
fn add_one(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries an `AddArgs` block.
    let args: AddArgs = unsafe { group.kernargs() };
    if group.group_id() == [0, 0, 0] {
        RUNS[args.tag as usize].fetch_add(1, Ordering::SeqCst);
        if args.observe != 0 {
            // SAFETY: `observe` is a live u32 in an allocation the scenario owns.
            let value = unsafe { std::ptr::read_volatile(args.observe as *const u32) };
            SEEN.lock().push((args.tag, value));
        }
    }
    for [i, _, _] in group.work_items() {
        if i < args.len {
            for &buf in &args.bufs[..args.nbufs as usize] {
                // SAFETY: each buffer holds at least `len` u32; each work-item owns index `i`.
                unsafe { *(buf as *mut u32).add(i as usize) += 1 };
            }
        }
    }
}

fn add_kernel() -> u64 {
    kreplay_softhsa::register_kernel("add_one", add_one)
}

fn runs(tag: u32) -> u32 {
    RUNS[tag as usize].load(Ordering::SeqCst)
}

fn seen(tag: u32) -> Vec<u32> {
    SEEN.lock()
        .iter()
        .filter(|(t, _)| *t == tag)
        .map(|(_, v)| *v)
        .collect()
}

/// While false, `gated_add` waits (bounded) before doing its work.
static GATE_OPEN: AtomicBool = AtomicBool::new(true);

/// `add_one` behind a gate: the run waits until `GATE_OPEN` (at most [`WAIT`]) first.
fn gated_add(group: &WorkGroup) {
    let deadline = Instant::now() + WAIT;
    while !GATE_OPEN.load(Ordering::SeqCst) && Instant::now() < deadline {
        std::thread::yield_now();
    }
    add_one(group);
}

/// Set once the replayed dispatch of the sibling scenario reached CONFIG ENTER.
static SIBLING_MAY_FINISH: AtomicBool = AtomicBool::new(false);
/// Set at SNAPSHOT ENTER of the sibling scenario's replay.
static SNAPSHOT_STARTED: AtomicBool = AtomicBool::new(false);
/// Set if the sibling kernel saw the snapshot start while it was still running.
static SIBLING_RUNNING_AT_SNAPSHOT: AtomicBool = AtomicBool::new(false);
/// What the sibling kernel writes when it is done.
const MARK: u32 = 0x600d_600d;
/// What it writes if it was never released.
const NEVER_RELEASED: u32 = 0xdead_dead;

/// Arguments of `slow_marker`.
#[repr(C)]
#[derive(Clone, Copy)]
struct MarkerArgs {
    marker: u64,
    run_ms: u64,
}

/// A long-running kernel: once the replayed dispatch has started (CONFIG ENTER), it keeps
/// running for `run_ms` (its own run time, which is what makes it long-running), then writes
/// `MARK` to `marker`.
fn slow_marker(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries a `MarkerArgs` block.
    let args: MarkerArgs = unsafe { group.kernargs() };
    let released = Instant::now() + WAIT;
    while !SIBLING_MAY_FINISH.load(Ordering::SeqCst) {
        if Instant::now() >= released {
            // SAFETY: `marker` is a live u32 the scenario allocated.
            unsafe { *(args.marker as *mut u32) = NEVER_RELEASED };
            return;
        }
        std::thread::yield_now();
    }
    let done = Instant::now() + Duration::from_millis(args.run_ms);
    while Instant::now() < done {
        if SNAPSHOT_STARTED.load(Ordering::SeqCst) {
            SIBLING_RUNNING_AT_SNAPSHOT.store(true, Ordering::SeqCst);
        }
        std::thread::yield_now();
    }
    // SAFETY: as above.
    unsafe { *(args.marker as *mut u32) = MARK };
}

// ---------------------------------------------------------------------------------------------
// Scenario environment

struct Env {
    app: App,
    hooks: Arc<TestHooks>,
    pools: [Pools; 2],
}

fn options() -> InstallOptions {
    InstallOptions {
        drain: DrainConfig::new(WAIT),
        ..Default::default()
    }
}

/// Installs kreplay with a tool that has `tracing` dispatch-tracing contexts, then configures
/// the replay service (after installation, as a tool initializing later would).
fn setup_with(tracing: usize, options: InstallOptions) -> Env {
    let hooks = TestHooks::new(tracing);
    let app = app::install(hooks.clone(), options);
    hooks.configure_replay(true);
    let pools = [app.pools(app.gpus[0]), app.pools(app.gpus[1])];
    Env { app, hooks, pools }
}

fn setup(tracing: usize) -> Env {
    setup_with(tracing, options())
}

/// `len` values starting at `start`, stepping by 3 (distinct per buffer).
fn values(start: u32, len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| start + 3 * i).collect()
}

/// A snapshot configuration with a host store, `strategy` and 4 KiB chunks.
fn host_store(strategy: kreplay_snapshot::RestoreStrategy) -> SnapshotConfig {
    SnapshotConfig::default()
        .with_store(kreplay_snapshot::StoreTier::Host)
        .with_strategy(strategy)
        .with_chunk_size(4096)
}

/// Three buffers' initial values, 1.3 MiB in all: above auto's full-restore threshold.
fn three_buffers() -> Vec<Vec<u32>> {
    vec![values(1, 1024), values(5, 262_144), values(9, 65_536)]
}

/// One coarse-grained buffer of the first pool per entry of `initial`, holding its values.
fn coarse_buffers(env: &Env, initial: &[Vec<u32>]) -> Vec<Ptr> {
    initial
        .iter()
        .map(|v| env.app.buffer(env.pools[0].coarse, v))
        .collect()
}

fn plus_one(v: &[u32]) -> Vec<u32> {
    v.iter().map(|x| x + 1).collect()
}

impl Env {
    /// Replays `add_one` over the first 1000 values of each of `bufs` (on GPU 0, through `q`)
    /// with `passes` passes asked of the tool, waits for it, checks it was replayed to its last
    /// pass, and returns its dispatch id.
    fn replay_plus_one_on_first_values(&self, q: Queue, bufs: &[Ptr], passes: u64) -> u64 {
        self.hooks.set_script(Script::passes(passes));
        let done = self.app.signal(1);
        self.app
            .dispatch(q, self.add(0, bufs, 1000, 4, None, 256, done));
        assert_eq!(self.app.wait_zero(done), 0);
        let id = *self.dispatch_ids().last().unwrap();
        assert_eq!(self.outcome(id), replayed(passes, LoopEnd::LastPass));
        id
    }

    /// An `add_one` dispatch on GPU `agent` over `bufs` (`len` elements each), counting its
    /// runs under `tag` and logging the `u32` at `observe` on each run.
    #[allow(clippy::too_many_arguments)] // one argument per field of the kernel's launch
    fn add(
        &self,
        agent: usize,
        bufs: &[Ptr],
        len: u32,
        tag: u32,
        observe: Option<Ptr>,
        workgroup: u16,
        done: hsa_signal_t,
    ) -> Aql {
        let mut args = AddArgs {
            nbufs: bufs.len() as u32,
            len,
            tag,
            observe: observe.map_or(0, |p| p.0),
            ..Default::default()
        };
        for (slot, buf) in args.bufs.iter_mut().zip(bufs) {
            *slot = buf.0;
        }
        let kernarg = self.app.kernargs(&self.pools[agent], args);
        Aql::dispatch(add_kernel(), len, workgroup, kernarg, done)
    }

    /// The dispatch ids the tool saw at CONFIG ENTER, in order.
    fn dispatch_ids(&self) -> Vec<u64> {
        self.hooks
            .configured_dispatches()
            .iter()
            .map(|i| i.dispatch_id)
            .collect()
    }

    /// The single dispatch the tool saw.
    fn only_dispatch(&self) -> u64 {
        let ids = self.dispatch_ids();
        assert_eq!(
            ids.len(),
            1,
            "expected one dispatch at CONFIG ENTER, saw {ids:?}"
        );
        ids[0]
    }

    fn outcome(&self, dispatch: u64) -> ReplayOutcome {
        self.hooks.finished_record(dispatch).outcome
    }
}

fn queue_id(queue: Queue) -> u64 {
    // SAFETY: the queue is live for the scenario.
    unsafe { (*queue.0).id }
}

fn replayed(passes: u64, end: LoopEnd) -> ReplayOutcome {
    ReplayOutcome::Replayed { passes, end }
}

fn declined(outcome: &ReplayOutcome) -> Option<DeclineReason> {
    match outcome {
        ReplayOutcome::RanOnce {
            why: RanOnceReason::Declined(d),
        } => Some(d.reason),
        _ => None,
    }
}

fn snapshot_exit(events: &[Event]) -> kreplay_passloop::MemoryOpReport {
    events
        .iter()
        .find_map(|e| match e {
            Event::Snapshot {
                phase: Phase::Exit,
                report,
                ..
            } => Some(*report),
            _ => None,
        })
        .expect("a SNAPSHOT EXIT")
}

fn restore_exits(events: &[Event]) -> Vec<(u64, kreplay_passloop::MemoryOpReport)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Restore {
                phase: Phase::Exit,
                request,
                report,
                ..
            } => Some((request.next_pass, *report)),
            _ => None,
        })
        .collect()
}

/// The callback sequence of an N-pass replay without a continue callback.
fn plain_replay_labels(passes: u64) -> Vec<String> {
    let mut labels = vec![
        "config-enter".to_string(),
        "snapshot-enter".into(),
        "snapshot-exit".into(),
    ];
    for pass in 0..passes {
        if pass > 0 {
            labels.push(format!("restore-enter-{pass}"));
            labels.push(format!("restore-exit-{pass}"));
        }
        labels.push(format!("pass-enter-{pass}"));
        labels.push(format!("pass-exit-{pass}"));
    }
    labels.push("config-exit".into());
    labels
}

// ---------------------------------------------------------------------------------------------
// Scenarios

scenarios! {
    /// A 4-pass replay of `x[i] += 1` over several buffers: the kernel really runs 4 times, the
    /// application sees one completion (1 -> 0, never below) and single-run results.
    fn replay_only_completes_once_with_single_run_results() {
        let env = setup(0);
        env.hooks.set_script(Script::passes(4));
        let q = env.app.queue(env.app.gpus[0]);
        let forwarded = env.app.observe_forwarded(q);
        let initial: Vec<Vec<u32>> = (0..3).map(|k| values(10 * k, 300)).collect();
        let bufs = coarse_buffers(&env, &initial);
        let done = env.app.signal(1);

        env.app.dispatch(q, env.add(0, &bufs, 300, 1, None, 64, done));

        assert_eq!(env.app.wait_zero(done), 0, "the application's completion fired");
        let id = env.only_dispatch();
        assert_eq!(env.outcome(id), replayed(4, LoopEnd::LastPass));
        assert_eq!(env.app.load(done), 0, "the completion fired exactly once");
        assert_eq!(runs(1), 4, "the kernel ran once per pass");
        for (buf, init) in bufs.iter().zip(&initial) {
            assert_eq!(env.app.read(*buf, 300), plus_one(init), "memory is as after one run");
        }
        assert_eq!(env.hooks.labels_of(id), plain_replay_labels(4));
        let snapshot = snapshot_exit(&env.hooks.events_of(id));
        let footprint: u64 = bufs.iter().map(|b| env.app.allocation_size(*b)).sum();
        assert_eq!((snapshot.regions, snapshot.bytes_planned, snapshot.bytes_moved), (3, footprint, footprint));
        let record = env.hooks.finished_record(id);
        assert_eq!((record.total_passes, record.cost.passes_run), (4, 4));
        assert_eq!(record.cost.bytes_snapshotted, footprint);
        // What reached the hardware queue: one dispatch per pass, completing kreplay's own
        // signal (the application's is withheld and fired once at the end).
        let calls = forwarded.lock().clone();
        assert_eq!(calls.len(), 4, "one submission per pass: {calls:?}");
        let packets: Vec<_> = calls.iter().map(|c| {
            assert_eq!(c.len(), 1);
            c[0].as_dispatch().expect("a dispatch packet")
        }).collect();
        let pass_signal = packets[0].completion_signal;
        for p in &packets {
            assert_eq!(p.kernel_object, add_kernel());
            assert_eq!(p.completion_signal.handle, pass_signal.handle);
            assert_ne!(p.completion_signal.handle, done.handle, "the application's signal is not used by passes");
        }
    }

    /// Five passes of an accumulating kernel over several buffers (default store and restore):
    /// without restores it would show +5; with them the result is exactly +1.
    fn restore_prevents_accumulation_across_five_passes() {
        let env = setup(0);
        env.hooks.set_script(Script::passes(5));
        let q = env.app.queue(env.app.gpus[0]);
        let initial: Vec<Vec<u32>> = vec![values(1, 4096), values(7, 1000), values(100, 70_000)];
        let bufs = coarse_buffers(&env, &initial);
        let done = env.app.signal(1);

        env.app.dispatch(q, env.add(0, &bufs, 1000, 2, None, 128, done));

        assert_eq!(env.app.wait_zero(done), 0);
        assert_eq!(env.outcome(env.only_dispatch()), replayed(5, LoopEnd::LastPass));
        assert_eq!(
            snapshot_exit(&env.hooks.events_of(env.only_dispatch())).tier,
            StoreTier::Host,
            "on a runtime whose device memory is host memory, the automatic store is the host tier"
        );
        assert_eq!(runs(2), 5, "the accumulating kernel ran five times");
        for (buf, init) in bufs.iter().zip(&initial) {
            let mut expected = init.clone();
            expected[..1000].iter_mut().for_each(|x| *x += 1);
            assert_eq!(env.app.read(*buf, init.len()), expected, "exactly +1, not +5");
        }
    }

    /// A forced device tier: the snapshot lives in a shadow allocated from the agent's own
    /// coarse-grained pool (never tracked), restores copy device to device, results are +1.
    fn a_forced_device_store_keeps_the_snapshot_in_a_device_shadow() {
        let snapshot = SnapshotConfig::default()
            .with_store(kreplay_snapshot::StoreTier::Device)
            .with_strategy(kreplay_snapshot::RestoreStrategy::Full);
        let env = setup_with(0, InstallOptions { snapshot, ..options() });
        env.hooks.set_script(Script::passes(3));
        let q = env.app.queue(env.app.gpus[0]);
        let initial: Vec<Vec<u32>> = vec![values(3, 2048), values(11, 50_000)];
        let bufs = coarse_buffers(&env, &initial);
        let done = env.app.signal(1);
        let packet = env.add(0, &bufs, 2048, 4, None, 64, done);
        let tracked_before = kreplay_hsa::tracked_allocations();

        env.app.dispatch(q, packet);

        assert_eq!(env.app.wait_zero(done), 0);
        let id = env.only_dispatch();
        assert_eq!(env.outcome(id), replayed(3, LoopEnd::LastPass));
        for (buf, init) in bufs.iter().zip(&initial) {
            let mut expected = init.clone();
            expected[..2048].iter_mut().for_each(|x| *x += 1);
            assert_eq!(env.app.read(*buf, init.len()), expected, "exactly +1, not +3");
        }
        let events = env.hooks.events_of(id);
        assert_eq!(snapshot_exit(&events).tier, StoreTier::Device);
        assert!(restore_exits(&events).iter().all(|(_, r)| r.tier == StoreTier::Device && r.bytes_moved > 0));
        assert_eq!(kreplay_hsa::tracked_allocations(), tracked_before, "shadows are not tracked");
    }

    /// The copy path of a discrete GPU, forced on softhsa: no direct host access, so the snapshot
    /// reads through `hsa_memory_copy` and restores write the changed chunks back as one batch
    /// of `hsa_amd_memory_async_copy` from a locked host store. Results are still exactly +1.
    fn runtime_copies_alone_restore_the_changed_chunks_in_one_batch() {
        let snapshot = host_store(kreplay_snapshot::RestoreStrategy::Hash);
        let env = setup_with(0, InstallOptions { snapshot, force_runtime_copies: true, ..options() });
        env.hooks.set_script(Script::passes(4));
        let q = env.app.queue(env.app.gpus[0]);
        let initial: Vec<Vec<u32>> = vec![values(2, 65_536), values(6, 16_384)];
        let bufs = coarse_buffers(&env, &initial);
        let done = env.app.signal(1);

        // The kernel changes the first 1000 elements of each buffer: one 4 KiB chunk apiece.
        env.app.dispatch(q, env.add(0, &bufs, 1000, 5, None, 64, done));

        assert_eq!(env.app.wait_zero(done), 0);
        let id = env.only_dispatch();
        assert_eq!(env.outcome(id), replayed(4, LoopEnd::LastPass));
        assert_eq!(runs(5), 4);
        for (buf, init) in bufs.iter().zip(&initial) {
            let mut expected = init.clone();
            expected[..1000].iter_mut().for_each(|x| *x += 1);
            assert_eq!(env.app.read(*buf, init.len()), expected, "exactly +1, not +4");
        }
        let events = env.hooks.events_of(id);
        let footprint: u64 = bufs.iter().map(|b| env.app.allocation_size(*b)).sum();
        let restores = restore_exits(&events);
        assert_eq!(restores.len(), 3);
        for (next, report) in restores {
            assert_eq!(report.strategy, RestoreStrategy::Hash);
            assert!(
                report.bytes_moved > 0 && report.bytes_moved < footprint / 8,
                "restore before pass {next} wrote back only the changed chunks: {report:?}"
            );
        }
    }

    /// The same with a host store and write-set restores: still exactly +1, and each restore
    /// writes back only the chunks the kernel changed, not the footprint.
    fn write_set_restores_from_a_host_store_prevent_accumulation() {
        let snapshot = host_store(kreplay_snapshot::RestoreStrategy::Writeset);
        let env = setup_with(0, InstallOptions { snapshot, ..options() });
        env.hooks.set_script(Script::passes(5));
        let q = env.app.queue(env.app.gpus[0]);
        let initial = three_buffers();
        let bufs = coarse_buffers(&env, &initial);
        let done = env.app.signal(1);

        env.app.dispatch(q, env.add(0, &bufs, 1000, 3, None, 256, done));

        assert_eq!(env.app.wait_zero(done), 0);
        let id = env.only_dispatch();
        assert_eq!(env.outcome(id), replayed(5, LoopEnd::LastPass));
        assert_eq!(runs(3), 5);
        for (buf, init) in bufs.iter().zip(&initial) {
            let mut expected = init.clone();
            expected[..1000].iter_mut().for_each(|x| *x += 1);
            assert_eq!(env.app.read(*buf, init.len()), expected, "exactly +1, not +5");
        }
        let events = env.hooks.events_of(id);
        let snapshot = snapshot_exit(&events);
        assert_eq!(snapshot.tier, StoreTier::Host);
        assert_eq!(snapshot.strategy, RestoreStrategy::Writeset);
        let restores = restore_exits(&events);
        assert_eq!(restores.iter().map(|(next, _)| *next).collect::<Vec<_>>(), vec![1, 2, 3, 4]);
        for (next, report) in restores {
            assert_eq!(report.strategy, RestoreStrategy::Writeset);
            assert!(report.bytes_moved > 0, "restore before pass {next} wrote the changed chunks back");
            assert!(
                report.bytes_moved * 10 <= snapshot.bytes_moved,
                "restore before pass {next} moved {} of {} bytes",
                report.bytes_moved,
                snapshot.bytes_moved
            );
        }
    }

    /// Under `auto`, the snapshot is told the restores its replay plans: a 38-pass replay of a
    /// kernel takes the snapshot's hashes (37 restores repay them), and the next dispatch of the
    /// same kernel, replayed in 2 passes, snapshots without hashes (1 restore cannot repay them,
    /// whatever the kernel's earlier dispatch restored) and restores in full. Both leave memory
    /// exactly as one ordinary run each would.
    fn auto_takes_the_snapshots_hashes_only_when_the_replays_planned_restores_repay_them() {
        // 1.3 MiB: above auto's full-restore threshold, below the size whose timings teach
        // rates, so the default rates decide on every machine.
        let snapshot = host_store(kreplay_snapshot::RestoreStrategy::Auto)
            // Hashing decisions are what this checks: writes are not followed.
            .with_track_writes(false);
        let env = setup_with(0, InstallOptions { snapshot, ..options() });
        let q = env.app.queue(env.app.gpus[0]);
        let initial = three_buffers();
        let bufs = coarse_buffers(&env, &initial);
        let mut expected = initial.clone();
        for (runs_before, passes, strategy) in
            [(0, 38, RestoreStrategy::Writeset), (38, 2, RestoreStrategy::Full)]
        {
            let id = env.replay_plus_one_on_first_values(q, &bufs, passes);
            assert_eq!(runs(4), runs_before + passes as u32);
            for v in &mut expected {
                v[..1000].iter_mut().for_each(|x| *x += 1);
            }
            for (buf, want) in bufs.iter().zip(&expected) {
                assert_eq!(&env.app.read(*buf, want.len()), want, "{passes} passes: exactly +1");
            }
            let events = env.hooks.events_of(id);
            assert_eq!(
                snapshot_exit(&events).strategy,
                strategy,
                "{passes} passes: the snapshot's hashes taken only when they pay"
            );
            let restores = restore_exits(&events);
            assert_eq!(restores.len() as u64, passes - 1);
            if strategy == RestoreStrategy::Full {
                assert!(restores.iter().all(|(_, r)| r.strategy == RestoreStrategy::Full));
            }
        }
    }

    /// `tracked` on the software runtime: the snapshot follows the kernel's writes from before
    /// its copy, and every restore writes back only the chunks of the pages the pass wrote (the
    /// first 1000 values of each of 3 buffers: one 4 KiB page each), hashing nothing; memory is
    /// exactly +1 after a 6-pass replay. Where writes cannot be followed, it restores as hash.
    fn tracked_restores_write_back_only_the_pages_each_pass_wrote() {
        let snapshot = host_store(kreplay_snapshot::RestoreStrategy::Tracked);
        let env = setup_with(0, InstallOptions { snapshot, ..options() });
        let q = env.app.queue(env.app.gpus[0]);
        let initial = three_buffers();
        let bufs = coarse_buffers(&env, &initial);
        let passes = 6;
        let id = env.replay_plus_one_on_first_values(q, &bufs, passes);
        for (buf, mut want) in bufs.iter().zip(initial) {
            want[..1000].iter_mut().for_each(|x| *x += 1);
            assert_eq!(env.app.read(*buf, want.len()), want, "exactly +1");
        }
        let events = env.hooks.events_of(id);
        let restores = restore_exits(&events);
        assert_eq!(restores.len() as u64, passes - 1);
        let tracked = kreplay_wtrack::available().is_ok();
        let want = if tracked { RestoreStrategy::Tracked } else { RestoreStrategy::Hash };
        assert_eq!(snapshot_exit(&events).strategy, want);
        for (_, r) in &restores {
            assert_eq!(r.strategy, want, "{r:?}");
            assert!(!r.unverified && !r.failed, "{r:?}");
            if tracked {
                assert_eq!(r.bytes_moved, 3 * 4096, "one page of each buffer: {r:?}");
            }
        }
    }

    /// Three contexts trace dispatches; on pass i only context i is enabled (the others are
    /// stopped at PASS ENTER). Records come only from the unmasked context of each pass; global
    /// context state is unchanged afterwards and an ordinary dispatch reaches all three.
    fn per_pass_masking_records_only_the_unmasked_context() {
        let env = setup(3);
        let toggles: Arc<Mutex<Vec<Result<(), ToggleError>>>> = Arc::default();
        let late_toggles: Arc<Mutex<Vec<Result<(), ToggleError>>>> = Arc::default();
        let (t, lt) = (toggles.clone(), late_toggles.clone());
        env.hooks.set_script(
            Script::new(|_, info| if info.workgroup_size[0] == 32 { ToolAnswer::passes(3) } else { ToolAnswer::OPT_OUT })
                .on_pass_enter(move |hooks, _, pass, _| {
                    for (i, &ctx) in hooks.tracing.iter().enumerate() {
                        let result = if i as u64 == pass { replay_start_context(ctx) } else { replay_stop_context(ctx) };
                        t.lock().push(result);
                    }
                })
                .on_pass_exit(move |hooks, _, _, _| {
                    lt.lock().push(replay_start_context(hooks.tracing[0]));
                    ContinueChange::Keep
                }),
        );
        let q = env.app.queue(env.app.gpus[0]);
        let init = values(3, 64);
        let buf = env.app.buffer(env.pools[0].coarse, &init);
        let done = env.app.signal(1);

        env.app.dispatch(q, env.add(0, &[buf], 64, 4, None, 32, done));

        assert_eq!(env.app.wait_zero(done), 0);
        let id = env.only_dispatch();
        assert_eq!(env.outcome(id), replayed(3, LoopEnd::LastPass));
        assert!(toggles.lock().iter().all(Result::is_ok), "toggles are legal at PASS ENTER: {:?}", toggles.lock());
        assert!(
            late_toggles.lock().iter().all(|r| *r == Err(ToggleError::NotArmed)),
            "toggles are refused at PASS EXIT: {:?}",
            late_toggles.lock()
        );
        let ctx = env.hooks.tracing.clone();
        let mut pass_records: Vec<_> = env
            .hooks
            .records()
            .into_iter()
            .filter(|(_, r)| r.info.dispatch_id == id)
            .map(|(c, r)| (c, r.pass))
            .collect();
        pass_records.sort();
        assert_eq!(pass_records, vec![(ctx[0], Some(0)), (ctx[1], Some(1)), (ctx[2], Some(2))]);
        for &c in &ctx {
            assert_eq!(env.hooks.registry().is_started(c), Ok(true), "global state unchanged");
            assert!(env.hooks.registry().is_active(c), "no mask outlives the replay");
        }
        assert_eq!(env.app.read(buf, 64), plus_one(&init));

        // An ordinary (opted-out) dispatch afterwards reaches every context once, under the id
        // the tool saw at CONFIG ENTER.
        let done = env.app.signal(1);
        env.app.dispatch(q, env.add(0, &[buf], 64, 5, None, 64, done));
        assert_eq!(env.app.wait_zero(done), 0);
        let ids = env.dispatch_ids();
        assert_eq!(ids.len(), 2);
        assert_eq!(env.outcome(ids[1]), ReplayOutcome::RanOnce { why: RanOnceReason::OptedOut });
        let mut ordinary: Vec<_> =
            env.hooks.records().into_iter().filter(|(_, r)| r.pass.is_none()).map(|(c, r)| (c, r.info.dispatch_id)).collect();
        ordinary.sort();
        assert_eq!(ordinary, ctx.iter().map(|&c| (c, ids[1])).collect::<Vec<_>>());
    }

    /// Without a replay service, ordinary dispatches with dispatch tracing produce exactly one
    /// record each (pass None) with their geometry and timestamps; the tool sees no replay
    /// callback.
    fn ordinary_dispatches_with_tracing_produce_one_record_each() {
        let env = setup(1);
        env.hooks.configure_replay(false);
        let queues = [env.app.queue(env.app.gpus[0]), env.app.queue(env.app.gpus[0]), env.app.queue(env.app.gpus[1])];
        let mut expected = Vec::new();
        for (k, q) in queues.iter().enumerate() {
            let agent = usize::from(k == 2);
            let init = values(k as u32, 100);
            let buf = env.app.buffer(env.pools[agent].coarse, &init);
            let done = env.app.signal(1);
            env.app.dispatch(*q, env.add(agent, &[buf], 100, 6, None, 32 + k as u16, done));
            assert_eq!(env.app.wait_zero(done), 0);
            assert_eq!(env.app.load(done), 0);
            assert_eq!(env.app.read(buf, 100), plus_one(&init));
            expected.push((queue_id(*q), env.app.gpus[agent].handle, 32 + k as u32));
        }
        let records = env.hooks.records();
        assert_eq!(records.len(), 3, "one record per dispatch: {records:?}");
        let mut ids: Vec<u64> = records.iter().map(|(_, r)| r.info.dispatch_id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 3, "distinct dispatch ids");
        for ((ctx, record), (queue, agent, workgroup)) in records.iter().zip(expected) {
            assert_eq!(*ctx, env.hooks.tracing[0]);
            assert_eq!(record.pass, None);
            assert_eq!(record.info.kernel_id, add_kernel());
            assert_eq!((record.info.queue_id, record.info.agent_id), (queue, agent));
            assert_eq!(record.info.workgroup_size, [workgroup, 1, 1]);
            assert_eq!(record.info.grid_size, [100, 1, 1]);
            assert!(record.start_ns > 0 && record.start_ns <= record.end_ns, "{record:?}");
        }
        assert_eq!(runs(6), 3);
        assert!(env.hooks.events().is_empty(), "no replay callbacks without a replay service");
    }

    /// A per-dispatch predicate: only kernels with work-group size 67 are replayed; the others
    /// opt out and run once.
    fn opt_out_by_predicate_replays_only_workgroup_size_67() {
        let env = setup(0);
        env.hooks.set_script(Script::new(|_, info| {
            if info.workgroup_size == [67, 1, 1] { ToolAnswer::passes(3) } else { ToolAnswer::OPT_OUT }
        }));
        let q = env.app.queue(env.app.gpus[0]);
        let (ia, ib) = (values(0, 200), values(50, 200));
        let (a, b) = (env.app.buffer(env.pools[0].coarse, &ia), env.app.buffer(env.pools[0].coarse, &ib));
        let (da, db) = (env.app.signal(1), env.app.signal(1));

        env.app.dispatch(q, env.add(0, &[a], 200, 7, None, 64, da));
        env.app.dispatch(q, env.add(0, &[b], 200, 8, None, 67, db));

        assert_eq!((env.app.wait_zero(da), env.app.wait_zero(db)), (0, 0));
        let ids = env.dispatch_ids();
        assert_eq!(ids.len(), 2);
        assert_eq!(env.outcome(ids[0]), ReplayOutcome::RanOnce { why: RanOnceReason::OptedOut });
        assert_eq!(env.outcome(ids[1]), replayed(3, LoopEnd::LastPass));
        assert_eq!((runs(7), runs(8)), (1, 3));
        assert_eq!(env.hooks.labels_of(ids[0]), vec!["config-enter", "config-exit"], "no snapshot for an opt-out");
        assert_eq!(env.app.read(a, 200), plus_one(&ia));
        assert_eq!(env.app.read(b, 200), plus_one(&ib));
    }

    /// N = 5 with a continue callback that says stop after pass 1: two passes, memory as one
    /// run, `total_passes` reported as 5.
    fn continue_callback_stops_the_loop_early() {
        let env = setup(0);
        env.hooks.set_script(
            Script::new(|_, _| ToolAnswer::passes_with_continue(5)).on_continue(|_, _, pass, _| pass < 1),
        );
        let q = env.app.queue(env.app.gpus[0]);
        let init = values(2, 128);
        let buf = env.app.buffer(env.pools[0].coarse, &init);
        let done = env.app.signal(1);

        env.app.dispatch(q, env.add(0, &[buf], 128, 9, None, 64, done));

        assert_eq!(env.app.wait_zero(done), 0);
        let id = env.only_dispatch();
        assert_eq!(env.outcome(id), replayed(2, LoopEnd::ContinueStopped));
        assert_eq!(runs(9), 2);
        assert_eq!(env.app.read(buf, 128), plus_one(&init));
        assert_eq!(
            env.hooks.labels_of(id),
            vec![
                "config-enter", "snapshot-enter", "snapshot-exit", "pass-enter-0", "pass-exit-0", "continue-0-true",
                "restore-enter-1", "restore-exit-1", "pass-enter-1", "pass-exit-1", "continue-1-false", "config-exit",
            ]
        );
        for event in env.hooks.events_of(id) {
            if let Event::PassEnter { total, .. } | Event::PassExit { total, .. } = event {
                assert_eq!(total, 5);
            }
        }
    }

    /// 0 passes with a continue callback is indefinite: passes run until the callback stops
    /// the loop at pass 3 (four passes), with `total_passes` reported as 0.
    fn indefinite_passes_run_until_continue_stops_at_pass_3() {
        let env = setup(0);
        env.hooks.set_script(
            Script::new(|_, _| ToolAnswer::passes_with_continue(0)).on_continue(|_, _, pass, _| pass < 3),
        );
        let q = env.app.queue(env.app.gpus[0]);
        let init = values(4, 96);
        let buf = env.app.buffer(env.pools[0].coarse, &init);
        let done = env.app.signal(1);

        env.app.dispatch(q, env.add(0, &[buf], 96, 10, None, 32, done));

        assert_eq!(env.app.wait_zero(done), 0);
        let id = env.only_dispatch();
        assert_eq!(env.outcome(id), replayed(4, LoopEnd::ContinueStopped));
        assert_eq!(runs(10), 4);
        assert_eq!(env.app.read(buf, 96), plus_one(&init));
        let passes: Vec<(u64, u64)> = env
            .hooks
            .events_of(id)
            .into_iter()
            .filter_map(|e| match e {
                Event::PassEnter { pass, total, .. } => Some((pass, total)),
                _ => None,
            })
            .collect();
        assert_eq!(passes, vec![(0, 0), (1, 0), (2, 0), (3, 0)]);
    }

    /// 0 passes without a continue callback is invalid: a diagnostic, the dispatch runs once,
    /// nothing is lost.
    fn zero_passes_without_continue_runs_once_as_invalid_pass_count() {
        let env = setup(0);
        env.hooks.set_script(Script::passes(0));
        let q = env.app.queue(env.app.gpus[0]);
        let init = values(8, 64);
        let buf = env.app.buffer(env.pools[0].coarse, &init);
        let done = env.app.signal(1);

        env.app.dispatch(q, env.add(0, &[buf], 64, 11, None, 64, done));

        assert_eq!(env.app.wait_zero(done), 0);
        let id = env.only_dispatch();
        assert_eq!(declined(&env.outcome(id)), Some(DeclineReason::InvalidPassCount));
        assert_eq!(env.app.load(done), 0);
        assert_eq!(runs(11), 1);
        assert_eq!(env.app.read(buf, 64), plus_one(&init));
        assert_eq!(env.hooks.labels_of(id), vec!["config-enter", "config-exit"]);
        assert!(
            env.hooks.warnings().iter().any(|w| w.contains("invalid_pass_count")),
            "a diagnostic names the reason: {:?}",
            env.hooks.warnings()
        );
    }

    /// The tool state handed out at CONFIG ENTER reaches every later callback of the same
    /// dispatch (pass, continue, snapshot, restore, config exit); each dispatch has its own.
    fn every_callback_of_a_dispatch_sees_its_own_tool_state() {
        let env = setup(0);
        env.hooks.set_script(Script::new(|_, _| ToolAnswer::passes_with_continue(3)).on_continue(|_, _, _, _| true));
        let q = env.app.queue(env.app.gpus[0]);
        let init = values(6, 64);
        let buf = env.app.buffer(env.pools[0].coarse, &init);
        for _ in 0..2 {
            let done = env.app.signal(1);
            env.app.dispatch(q, env.add(0, &[buf], 64, 12, None, 64, done));
            assert_eq!(env.app.wait_zero(done), 0);
        }
        let ids = env.dispatch_ids();
        assert_eq!(ids.len(), 2);
        let mut tokens = Vec::new();
        for &id in &ids {
            assert_eq!(env.outcome(id), replayed(3, LoopEnd::LastPass));
            let events = env.hooks.events_of(id);
            assert!(events.iter().any(|e| matches!(e, Event::Continue { .. })), "the continue callback was consulted");
            let token = events[0].token();
            assert!(events.iter().all(|e| e.token() == token), "one tool state per dispatch: {events:?}");
            tokens.push(token);
        }
        assert_ne!(tokens[0], tokens[1], "each dispatch gets its own tool state");
        assert_eq!(env.app.read(buf, 64), init.iter().map(|x| x + 2).collect::<Vec<_>>());
    }

    /// Kernarg, fine-grained and host (CPU agent) allocations are tracked with their kinds but
    /// not snapshotted when no kernel argument points into them; neither is an allocation owned
    /// by another GPU agent (tests/reach.rs covers the ones an argument reaches).
    fn kernarg_fine_host_and_other_agent_allocations_are_not_snapshotted() {
        let env = setup(0);
        env.hooks.set_script(Script::passes(2));
        let (p0, p1) = (env.pools[0], env.pools[1]);
        let coarse0 = env.app.buffer(p0.coarse, &values(1, 1024));
        let fine0 = env.app.buffer(p0.fine, &values(2, 1024));
        let kernarg0 = env.app.alloc(p0.kernarg, 4096);
        let host = env.app.buffer(env.app.host_pool(), &values(3, 1024));
        let coarse1 = env.app.buffer(p1.coarse, &values(4, 2048));
        let kind = |p: Ptr| kreplay_hsa::tracked_kind(p.0);
        assert_eq!(kind(coarse0), Some(MemoryKind::CoarseDevice));
        assert_eq!(kind(fine0), Some(MemoryKind::FineDevice));
        assert_eq!(kind(kernarg0), Some(MemoryKind::Kernarg));
        assert_eq!(kind(host), Some(MemoryKind::Host));
        assert_eq!(kind(coarse1), Some(MemoryKind::CoarseDevice));
        assert_eq!(kind(Ptr(coarse0.0 + 100)), Some(MemoryKind::CoarseDevice), "interior addresses resolve");

        for (agent, buf, tag) in [(0usize, coarse0, 13u32), (1, coarse1, 14)] {
            let q = env.app.queue(env.app.gpus[agent]);
            let done = env.app.signal(1);
            env.app.dispatch(q, env.add(agent, &[buf], 1024, tag, None, 64, done));
            assert_eq!(env.app.wait_zero(done), 0);
        }
        let ids = env.dispatch_ids();
        assert_eq!(ids.len(), 2);
        for (id, buf) in ids.iter().zip([coarse0, coarse1]) {
            assert_eq!(env.outcome(*id), replayed(2, LoopEnd::LastPass));
            let size = env.app.allocation_size(buf);
            let events = env.hooks.events_of(*id);
            let enter = events
                .iter()
                .find_map(|e| match e {
                    Event::Snapshot { phase: Phase::Enter, report, .. } => Some(*report),
                    _ => None,
                })
                .expect("SNAPSHOT ENTER");
            assert_eq!((enter.regions, enter.bytes_planned), (1, size), "planned: only the agent's coarse buffer");
            let exit = snapshot_exit(&events);
            assert_eq!((exit.regions, exit.bytes_moved), (1, size), "taken: only the agent's coarse buffer");
        }
        assert_eq!(env.app.read(coarse0, 1024), plus_one(&values(1, 1024)));
        assert_eq!(env.app.read(coarse1, 1024), plus_one(&values(4, 1024)));
    }

    /// The tool frees a snapshotted buffer at PASS ENTER of pass 1 and allocates another one
    /// (which may reuse the address): later restores skip the freed region and never write into
    /// the new allocation.
    fn a_buffer_freed_by_the_tool_during_a_pass_is_skipped_on_restore() {
        let env = setup(0);
        let pools = env.pools[0];
        let init = values(5, 1024);
        let a = env.app.buffer(pools.coarse, &init);
        let victim = env.app.buffer(pools.coarse, &[7; 1024]);
        let replacement: Arc<Mutex<Option<Ptr>>> = Arc::default();
        let (app, r) = (env.app, replacement.clone());
        env.hooks.set_script(Script::passes(3).on_pass_enter(move |_, _, pass, _| {
            if pass == 1 {
                app.free(victim);
                *r.lock() = Some(app.buffer(pools.coarse, &[0x5a5a_5a5a; 1024]));
            }
        }));
        let q = env.app.queue(env.app.gpus[0]);
        let done = env.app.signal(1);

        env.app.dispatch(q, env.add(0, &[a], 1024, 15, None, 64, done));

        assert_eq!(env.app.wait_zero(done), 0);
        let id = env.only_dispatch();
        assert_eq!(env.outcome(id), replayed(3, LoopEnd::LastPass));
        assert_eq!(env.app.read(a, 1024), plus_one(&init));
        let fresh = replacement.lock().expect("the tool allocated a replacement");
        assert_eq!(env.app.read(fresh, 1024), vec![0x5a5a_5a5a; 1024], "the new allocation was not overwritten");
        let events = env.hooks.events_of(id);
        assert_eq!(snapshot_exit(&events).regions, 2);
        let regions: Vec<(u64, u64)> = restore_exits(&events).into_iter().map(|(next, r)| (next, r.regions)).collect();
        assert_eq!(regions, vec![(1, 2), (2, 1)], "the freed region is skipped from the restore after the free");
    }

    /// A long-running kernel on a sibling queue of the same agent finishes before the snapshot:
    /// every pass of the replayed kernel reads the marker it wrote.
    fn a_long_running_kernel_on_a_sibling_queue_finishes_before_the_snapshot() {
        let env = setup(0);
        let slow = kreplay_softhsa::register_kernel("slow_marker", slow_marker);
        env.hooks.set_script(
            Script::new(move |_, info| {
                if info.kernel_id == slow {
                    ToolAnswer::OPT_OUT
                } else {
                    SIBLING_MAY_FINISH.store(true, Ordering::SeqCst);
                    ToolAnswer::passes(3)
                }
            })
            .on_snapshot(|_, _, phase| {
                if phase == Phase::Enter {
                    SNAPSHOT_STARTED.store(true, Ordering::SeqCst);
                }
            }),
        );
        let (q1, q2) = (env.app.queue(env.app.gpus[0]), env.app.queue(env.app.gpus[0]));
        let marker = env.app.buffer(env.pools[0].coarse, &[0; 16]);
        let init = values(9, 64);
        let buf = env.app.buffer(env.pools[0].coarse, &init);
        let (slow_done, done) = (env.app.signal(1), env.app.signal(1));
        let kernarg = env.app.kernargs(&env.pools[0], MarkerArgs { marker: marker.0, run_ms: 50 });

        env.app.dispatch(q2, Aql::dispatch(slow, 1, 1, kernarg, slow_done));
        env.app.dispatch(q1, env.add(0, &[buf], 64, 16, Some(marker), 64, done));

        assert_eq!((env.app.wait_zero(slow_done), env.app.wait_zero(done)), (0, 0));
        let ids = env.dispatch_ids();
        assert_eq!(env.outcome(ids[1]), replayed(3, LoopEnd::LastPass));
        assert!(!SIBLING_RUNNING_AT_SNAPSHOT.load(Ordering::SeqCst), "the snapshot started while the sibling kernel ran");
        assert_eq!(seen(16), vec![MARK; 3], "every pass saw the sibling's marker");
        assert_eq!(env.app.read(marker, 1), vec![MARK]);
        assert_eq!(env.app.read(buf, 64), plus_one(&init));
    }

    /// While a replay on agent 0 waits inside its PASS ENTER callback, a kernel dispatched on
    /// agent 1 by another thread (itself replayed) completes: agent 1 is never blocked.
    fn a_replay_on_agent_0_does_not_block_dispatches_on_agent_1() {
        let env = setup(0);
        let (gpu0, gpu1) = (env.app.gpus[0].handle, env.app.gpus[1].handle);
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let (done_tx, done_rx) = mpsc::channel::<i64>();
        let done_rx = Mutex::new(done_rx);
        let overlap: Arc<Mutex<Option<Result<i64, mpsc::RecvTimeoutError>>>> = Arc::default();
        let o = overlap.clone();
        env.hooks.set_script(
            Script::new(move |_, info| ToolAnswer::passes(if info.agent_id == gpu0 { 3 } else { 2 })).on_pass_enter(
                move |_, info, pass, _| {
                    if info.agent_id == gpu0 && pass == 0 {
                        let _ = go_tx.send(());
                        *o.lock() = Some(done_rx.lock().recv_timeout(WAIT));
                    }
                },
            ),
        );
        let (q0, q1) = (env.app.queue(env.app.gpus[0]), env.app.queue(env.app.gpus[1]));
        let (i0, i1) = (values(1, 256), values(2, 256));
        let (b0, b1) = (env.app.buffer(env.pools[0].coarse, &i0), env.app.buffer(env.pools[1].coarse, &i1));
        let (d0, d1) = (env.app.signal(1), env.app.signal(1));
        let agent1_packet = env.add(1, &[b1], 256, 18, None, 64, d1);
        let app = env.app;
        let helper = std::thread::spawn(move || {
            if go_rx.recv_timeout(WAIT).is_ok() {
                app.dispatch(q1, agent1_packet);
                let _ = done_tx.send(app.wait_zero(d1));
            }
        });

        env.app.dispatch(q0, env.add(0, &[b0], 256, 17, None, 64, d0));

        assert_eq!(env.app.wait_zero(d0), 0);
        helper.join().expect("the agent-1 thread ends");
        assert_eq!(*overlap.lock(), Some(Ok(0)), "the agent-1 kernel completed while agent 0's replay waited in PASS ENTER");
        let infos = env.hooks.configured_dispatches();
        assert_eq!(infos.len(), 2);
        for info in infos {
            let passes = if info.agent_id == gpu1 { 2 } else { 3 };
            assert_eq!(env.outcome(info.dispatch_id), replayed(passes, LoopEnd::LastPass));
        }
        assert_eq!((runs(17), runs(18)), (3, 2));
        assert_eq!(env.app.read(b0, 256), plus_one(&i0));
        assert_eq!(env.app.read(b1, 256), plus_one(&i1));
    }

    /// An async copy into a snapshotted buffer, issued by another thread at PASS ENTER of pass
    /// 1, lands after the last pass: no pass sees it, and memory ends as after the copy.
    fn an_async_copy_racing_a_replay_lands_after_the_last_pass() {
        let env = setup(0);
        let target = env.app.buffer(env.pools[0].coarse, &[1; 64]);
        let source = env.app.buffer(env.app.host_pool(), &[9; 64]);
        let init = values(3, 64);
        let buf = env.app.buffer(env.pools[0].coarse, &init);
        let copied = env.app.signal(1);
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let (calling_tx, calling_rx) = mpsc::channel::<()>();
        let calling_rx = Mutex::new(calling_rx);
        let triggered: Arc<Mutex<Option<bool>>> = Arc::default();
        let t = triggered.clone();
        env.hooks.set_script(Script::passes(3).on_pass_enter(move |_, _, pass, _| {
            if pass == 1 {
                let _ = go_tx.send(());
                *t.lock() = Some(calling_rx.lock().recv_timeout(WAIT).is_ok());
            }
        }));
        let app = env.app;
        let copier = std::thread::spawn(move || {
            if go_rx.recv_timeout(WAIT).is_ok() {
                let _ = calling_tx.send(());
                app.async_copy(target, app.gpus[0], source, app.cpu, 64 * 4, copied);
            }
        });
        let q = env.app.queue(env.app.gpus[0]);
        let done = env.app.signal(1);

        env.app.dispatch(q, env.add(0, &[buf], 64, 19, Some(target), 64, done));

        assert_eq!(env.app.wait_zero(done), 0);
        assert_eq!(env.app.wait_zero(copied), 0, "the copy completed");
        copier.join().expect("the copying thread ends");
        assert_eq!(*triggered.lock(), Some(true), "the copy was issued during pass 1");
        assert_eq!(env.outcome(env.only_dispatch()), replayed(3, LoopEnd::LastPass));
        assert_eq!(seen(19), vec![1, 1, 1], "no pass saw the copy");
        assert_eq!(env.app.read(target, 64), vec![9; 64], "the copy's bytes are what memory ends with");
        assert_eq!(env.app.read(buf, 64), plus_one(&init));
    }

    /// An async copy already submitted when a replay starts, but still waiting on a
    /// long-running kernel of another agent, lands before the snapshot: the drain waits for the
    /// copy's completion, not its submission, so every pass sees the copied bytes and they are
    /// what memory ends with.
    fn an_async_copy_in_flight_when_a_replay_starts_lands_before_the_snapshot() {
        let env = setup(0);
        let slow = kreplay_softhsa::register_kernel("slow_marker", slow_marker);
        env.hooks.set_script(
            Script::new(move |_, info| {
                if info.kernel_id == slow {
                    ToolAnswer::OPT_OUT
                } else {
                    SIBLING_MAY_FINISH.store(true, Ordering::SeqCst);
                    ToolAnswer::passes(3)
                }
            })
            .on_snapshot(|_, _, phase| {
                if phase == Phase::Enter {
                    SNAPSHOT_STARTED.store(true, Ordering::SeqCst);
                }
            }),
        );
        let (q0, q1) = (env.app.queue(env.app.gpus[0]), env.app.queue(env.app.gpus[1]));
        let source = env.app.buffer(env.pools[1].coarse, &[0; 16]);
        let target = env.app.buffer(env.pools[0].coarse, &[0; 16]);
        let init = values(11, 64);
        let buf = env.app.buffer(env.pools[0].coarse, &init);
        let (slow_done, copied, done) = (env.app.signal(1), env.app.signal(1), env.app.signal(1));
        let kernarg = env.app.kernargs(&env.pools[1], MarkerArgs { marker: source.0, run_ms: 50 });

        env.app.dispatch(q1, Aql::dispatch(slow, 1, 1, kernarg, slow_done));
        env.app.async_copy_after(target, env.app.gpus[0], source, env.app.gpus[1], 16 * 4, slow_done, copied);
        env.app.dispatch(q0, env.add(0, &[buf], 64, 26, Some(target), 64, done));

        assert_eq!([env.app.wait_zero(done), env.app.wait_zero(slow_done), env.app.wait_zero(copied)], [0, 0, 0]);
        let ids = env.dispatch_ids();
        assert_eq!(env.outcome(ids[1]), replayed(3, LoopEnd::LastPass));
        assert_eq!(seen(26), vec![MARK; 3], "every pass saw the copied bytes");
        assert_eq!(env.app.read(target, 1), vec![MARK], "the copy is not undone by a restore");
        assert_eq!(env.app.read(buf, 64), plus_one(&init));
    }

    /// A sibling queue (and then the dispatch's own queue) that does not drain within the
    /// drain budget: the replay is declined (`agent_drain_stuck`, then `queue_drain_stuck`),
    /// the dispatch runs once and memory is as after one run.
    fn queues_that_do_not_drain_decline_the_replay_and_run_once() {
        let env = setup_with(0, InstallOptions { drain: DrainConfig::new(Duration::from_millis(200)), ..options() });
        let gated = kreplay_softhsa::register_kernel("gated_add", gated_add);
        env.hooks.set_script(Script::new(move |_, info| {
            if info.kernel_id == gated { ToolAnswer::OPT_OUT } else { ToolAnswer::passes(3) }
        }));
        let (q1, q2) = (env.app.queue(env.app.gpus[0]), env.app.queue(env.app.gpus[0]));
        let init = values(1, 64);
        let (stuck, buf) = (env.app.buffer(env.pools[0].coarse, &[0; 64]), env.app.buffer(env.pools[0].coarse, &init));
        for (stuck_queue, tag, expected) in [(q2, 27u32, DeclineReason::AgentDrainStuck), (q1, 28, DeclineReason::QueueDrainStuck)] {
            GATE_OPEN.store(false, Ordering::SeqCst);
            let stuck_done = env.app.signal(1);
            let mut packet = env.add(0, &[stuck], 64, 29, None, 64, stuck_done);
            packet.set_kernel(gated);
            env.app.dispatch(stuck_queue, packet);
            let done = env.app.signal(1);

            env.app.dispatch(q1, env.add(0, &[buf], 64, tag, None, 64, done));

            GATE_OPEN.store(true, Ordering::SeqCst);
            assert_eq!((env.app.wait_zero(done), env.app.wait_zero(stuck_done)), (0, 0));
            let last = *env.dispatch_ids().last().expect("a dispatch");
            assert_eq!(declined(&env.outcome(last)), Some(expected));
            assert_eq!(env.hooks.labels_of(last), vec!["config-enter", "config-exit"], "declined before any snapshot");
            assert_eq!(runs(tag), 1, "the declined dispatch ran once");
        }
        assert_eq!(env.app.read(buf, 64), init.iter().map(|x| x + 2).collect::<Vec<_>>());
        assert_eq!(env.app.read(stuck, 64), vec![2; 64]);
        let warnings = env.hooks.warnings();
        assert!(warnings.iter().any(|w| w.contains("agent_drain_stuck")), "{warnings:?}");
        assert!(warnings.iter().any(|w| w.contains("queue_drain_stuck")), "{warnings:?}");
    }

    /// A pass whose kernel runs longer than the drain timeout is never abandoned: the loop warns
    /// and keeps waiting, the application's completion fires only after the last pass's kernel
    /// finished, and memory ends as after one run.
    fn a_pass_longer_than_the_drain_timeout_is_waited_for_never_abandoned() {
        let env = setup_with(0, InstallOptions { drain: DrainConfig::new(Duration::from_millis(100)), ..options() });
        let gated = kreplay_softhsa::register_kernel("gated_add", gated_add);
        env.hooks.set_script(Script::passes(3).on_pass_enter(|_, _, pass, _| {
            if pass == 1 {
                GATE_OPEN.store(false, Ordering::SeqCst);
            }
        }));
        let q = env.app.queue(env.app.gpus[0]);
        let init = values(4, 64);
        let buf = env.app.buffer(env.pools[0].coarse, &init);
        let done = env.app.signal(1);
        let mut packet = env.add(0, &[buf], 64, 30, None, 64, done);
        packet.set_kernel(gated);

        // The replay runs in the submitting thread; a second thread plays the kernel's release.
        let completion_while_running = std::thread::scope(|scope| {
            let releaser = scope.spawn(|| {
                let deadline = Instant::now() + WAIT;
                // The warning about pass 1, the gated one: on a loaded machine pass 0 can run
                // past the 100 ms drain timeout too and be warned about first.
                while !env.hooks.warnings().iter().any(|w| w.contains("pass 1 of") && w.contains("still running")) {
                    assert!(Instant::now() < deadline, "no warning about the long pass: {:?}", env.hooks.warnings());
                    std::thread::yield_now();
                }
                let (completion, runs_so_far) = (env.app.load(done), runs(30));
                GATE_OPEN.store(true, Ordering::SeqCst);
                (completion, runs_so_far)
            });
            env.app.dispatch(q, packet);
            releaser.join().expect("the releasing thread")
        });

        assert_eq!(completion_while_running, (1, 1), "no completion while pass 1 still runs");
        assert_eq!(env.app.wait_zero(done), 0);
        assert_eq!(env.outcome(env.only_dispatch()), replayed(3, LoopEnd::LastPass));
        assert_eq!(runs(30), 3);
        assert_eq!(env.app.load(done), 0, "the completion fired exactly once");
        assert_eq!(env.app.read(buf, 64), plus_one(&init), "every pass's write was restored but the last");
    }

    /// Two threads on one agent: one issues replayed dispatches, the other ordinary ones on a
    /// sibling queue over another snapshotted buffer. Ordinary dispatches wait for replay
    /// windows and replays drain them first, so no increment is ever lost to a restore.
    fn ordinary_dispatches_racing_replays_on_one_agent_are_never_lost() {
        const ROUNDS: u32 = 20;
        let env = setup(0);
        env.hooks.set_script(Script::new(|_, info| {
            if info.workgroup_size[0] == 64 { ToolAnswer::passes(2) } else { ToolAnswer::OPT_OUT }
        }));
        let (q1, q2) = (env.app.queue(env.app.gpus[0]), env.app.queue(env.app.gpus[0]));
        let (replayed_buf, ordinary_buf) =
            (env.app.buffer(env.pools[0].coarse, &[0; 256]), env.app.buffer(env.pools[0].coarse, &[0; 256]));
        let packets = |buf: Ptr, tag: u32, workgroup: u16| -> Vec<(Aql, hsa_signal_t)> {
            (0..ROUNDS)
                .map(|_| {
                    let done = env.app.signal(1);
                    (env.add(0, &[buf], 256, tag, None, workgroup, done), done)
                })
                .collect()
        };
        let (replays, ordinary) = (packets(replayed_buf, 1, 64), packets(ordinary_buf, 2, 32));
        let app = env.app;
        let run = move |queue: Queue, work: Vec<(Aql, hsa_signal_t)>| {
            move || work.into_iter().map(|(packet, done)| {
                app.dispatch(queue, packet);
                app.wait_zero(done)
            }).collect::<Vec<i64>>()
        };
        let a = std::thread::spawn(run(q1, replays));
        let b = std::thread::spawn(run(q2, ordinary));
        let (a, b) = (a.join().expect("replaying thread"), b.join().expect("ordinary thread"));
        assert!(a.iter().chain(&b).all(|v| *v == 0), "every dispatch completed");
        assert_eq!((runs(1), runs(2)), (2 * ROUNDS, ROUNDS));
        let (r, o) = (env.app.read(replayed_buf, 256), env.app.read(ordinary_buf, 256));
        assert!(r.iter().all(|&x| x == ROUNDS), "replays count once each: {:?}", &r[..4]);
        assert!(o.iter().all(|&x| x == ROUNDS), "no ordinary increment was lost: {:?}", &o[..4]);
        for info in env.hooks.configured_dispatches().into_iter().filter(|i| i.workgroup_size[0] == 64) {
            assert_eq!(env.outcome(info.dispatch_id), replayed(2, LoopEnd::LastPass));
        }
    }

    /// A tool callback that panics (at CONFIG ENTER, at PASS EXIT of pass 0, at PASS ENTER of
    /// pass 1 after a restore) neither loses the dispatch nor leaves the application waiting:
    /// each completes once with single-run results, and the agent replays normally afterwards.
    fn a_panicking_tool_callback_neither_loses_the_dispatch_nor_hangs() {
        let env = setup(0);
        env.hooks.set_script(
            Script::new(|_, info| match info.workgroup_size[0] {
                48 => panic!("tool bug at CONFIG ENTER (expected by this test)"),
                _ => ToolAnswer::passes(3),
            })
            .on_pass_exit(|_, info, pass, _| {
                assert!(!(info.workgroup_size[0] == 40 && pass == 0), "tool bug at PASS EXIT (expected by this test)");
                ContinueChange::Keep
            })
            .on_pass_enter(|_, info, pass, _| {
                assert!(!(info.workgroup_size[0] == 56 && pass == 1), "tool bug at PASS ENTER (expected by this test)");
            }),
        );
        let q = env.app.queue(env.app.gpus[0]);
        // (work-group size, tag, kernel runs: the passes that ran plus any recovery run)
        for (workgroup, tag, runs_expected) in [(48u16, 1u32, 1u32), (40, 2, 1), (56, 3, 2), (64, 4, 3)] {
            let init = values(u32::from(workgroup), 64);
            let buf = env.app.buffer(env.pools[0].coarse, &init);
            let done = env.app.signal(1);
            env.app.dispatch(q, env.add(0, &[buf], 64, tag, None, workgroup, done));
            assert_eq!(env.app.wait_zero(done), 0, "work-group size {workgroup}: the application's completion fired");
            assert_eq!(env.app.load(done), 0, "work-group size {workgroup}: exactly once");
            assert_eq!(runs(tag), runs_expected, "work-group size {workgroup}");
            assert_eq!(env.app.read(buf, 64), plus_one(&init), "work-group size {workgroup}: single-run results");
        }
        let last = *env.dispatch_ids().last().expect("dispatches");
        assert_eq!(env.outcome(last), replayed(3, LoopEnd::LastPass), "the agent was released");
    }

    /// A dispatch issued from a PASS ENTER callback onto another queue of the replaying agent
    /// runs once, unreplayed (`reentrant_dispatch`), without deadlock.
    fn a_dispatch_from_a_replay_callback_runs_once_as_reentrant_dispatch() {
        let env = setup(0);
        let (q1, q2) = (env.app.queue(env.app.gpus[0]), env.app.queue(env.app.gpus[0]));
        let outer_queue = queue_id(q1);
        let init = values(1, 64);
        let buf = env.app.buffer(env.pools[0].coarse, &init);
        // Fine-grained and not an argument of the outer dispatch: not snapshotted, so no restore
        // of the outer replay can hide the run.
        let inner_buf = env.app.buffer(env.pools[0].fine, &[40; 64]);
        let inner_done = env.app.signal(1);
        let inner = env.add(0, &[inner_buf], 64, 21, None, 64, inner_done);
        let inner_wait: Arc<Mutex<Option<i64>>> = Arc::default();
        let (app, w) = (env.app, inner_wait.clone());
        env.hooks.set_script(Script::passes(3).on_pass_enter(move |_, info, pass, _| {
            if info.queue_id == outer_queue && pass == 0 {
                app.dispatch(q2, inner);
                *w.lock() = Some(app.wait_zero(inner_done));
            }
        }));
        let done = env.app.signal(1);

        env.app.dispatch(q1, env.add(0, &[buf], 64, 20, None, 64, done));

        assert_eq!(env.app.wait_zero(done), 0);
        assert_eq!(*inner_wait.lock(), Some(0), "the inner dispatch completed inside the callback");
        let ids = env.dispatch_ids();
        assert_eq!(ids.len(), 2);
        assert_eq!(env.outcome(ids[0]), replayed(3, LoopEnd::LastPass));
        assert_eq!(declined(&env.outcome(ids[1])), Some(DeclineReason::ReentrantDispatch));
        assert_eq!(env.hooks.labels_of(ids[1]), vec!["config-enter", "config-exit"]);
        assert_eq!((runs(20), runs(21)), (3, 1));
        assert_eq!(env.app.read(inner_buf, 64), vec![41; 64], "the inner kernel ran exactly once");
        assert_eq!(env.app.read(buf, 64), plus_one(&init));
    }

    /// After `finalize()` nothing is replayed (old and new queues) and the alloc/free wrappers
    /// pass straight through.
    fn after_finalize_dispatches_are_not_replayed_and_alloc_free_pass_through() {
        let env = setup(0);
        env.hooks.set_script(Script::passes(3));
        let pools = env.pools[0];
        let old_queue = env.app.queue(env.app.gpus[0]);
        let init = values(2, 64);
        let a = env.app.buffer(pools.coarse, &init);
        let doomed = env.app.buffer(pools.coarse, &[1; 64]);
        assert_eq!(kreplay_hsa::tracked_kind(doomed.0), Some(MemoryKind::CoarseDevice));

        kreplay_hsa::finalize();

        let tracked = kreplay_hsa::tracked_allocations();
        let fresh = env.app.buffer(pools.coarse, &init);
        assert_eq!(kreplay_hsa::tracked_kind(fresh.0), None, "allocations are no longer tracked");
        env.app.free(doomed);
        let new_queue = env.app.queue(env.app.gpus[0]);
        for (q, buf, tag) in [(old_queue, a, 22u32), (new_queue, fresh, 23)] {
            let done = env.app.signal(1);
            env.app.dispatch(q, env.add(0, &[buf], 64, tag, None, 64, done));
            assert_eq!(env.app.wait_zero(done), 0);
            assert_eq!(env.app.load(done), 0);
            assert_eq!(env.app.read(buf, 64), plus_one(&init));
        }
        assert_eq!((runs(22), runs(23)), (1, 1), "each kernel ran once");
        assert!(env.hooks.events().is_empty(), "no replay callbacks after finalize");
        assert_eq!(kreplay_hsa::tracked_allocations(), tracked, "alloc and free passed straight through");
        env.app.destroy_queue(old_queue);
        env.app.destroy_queue(new_queue);
    }

    /// A batch of packets (dispatch, barrier, dispatch) submitted with one doorbell: the
    /// barrier is forwarded unchanged in its place, each dispatch is replayed on its own.
    fn a_multi_packet_batch_replays_each_dispatch_and_forwards_the_rest_in_place() {
        let env = setup(0);
        env.hooks.set_script(Script::passes(3));
        let q = env.app.queue(env.app.gpus[0]);
        let forwarded = env.app.observe_forwarded(q);
        let (ia, ib) = (values(1, 64), values(2, 64));
        let (a, b) = (env.app.buffer(env.pools[0].coarse, &ia), env.app.buffer(env.pools[0].coarse, &ib));
        let (da, barrier, db) = (env.app.signal(1), env.app.signal(1), env.app.signal(1));
        let batch = [env.add(0, &[a], 64, 24, None, 64, da), Aql::barrier(barrier), env.add(0, &[b], 64, 25, None, 64, db)];

        env.app.submit(q, &batch);

        assert_eq!([env.app.wait_zero(da), env.app.wait_zero(barrier), env.app.wait_zero(db)], [0, 0, 0]);
        let ids = env.dispatch_ids();
        assert_eq!(ids.len(), 2, "the tool hears of both dispatches");
        for id in &ids {
            assert_eq!(env.outcome(*id), replayed(3, LoopEnd::LastPass));
        }
        assert_eq!((runs(24), runs(25)), (3, 3), "each kernel ran once per pass");
        assert_eq!(env.app.read(a, 64), plus_one(&ia));
        assert_eq!(env.app.read(b, 64), plus_one(&ib));
        assert!(!env.hooks.warned_keys().contains(&"batch_or_graph"));
        let calls = forwarded.lock().clone();
        let barriers = calls.iter().flatten().filter(|p| **p == batch[1]).count();
        assert_eq!(barriers, 1, "the barrier is forwarded once, unchanged: {calls:?}");
    }
}

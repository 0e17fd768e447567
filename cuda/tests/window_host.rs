//! The split replay window (API ENTER / the application's launch / API EXIT) over a host fake:
//! "device memory" is a host buffer and the "kernel" adds 1 to every word, so a forgotten or
//! misplaced restore shows up as a wrong sum.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use kreplay_ctxmask::ContextRegistry;
use kreplay_cuda::capture::{CaptureStream, Captures};
use kreplay_cuda::devruntime::{DeviceRuntime, HeapPolicy};
use kreplay_cuda::globals::{ModuleLookup, ModuleRegistry, Range};
use kreplay_cuda::scope::{argument_values, launch_filter};
use kreplay_cuda::{LaunchOps, Window};
use kreplay_passloop::ReplayRecord;
use kreplay_passloop::{
    ContinueChange, DeclineReason, DispatchInfo, LoopEnd, MemoryOpReport, Phase, ReplayOutcome,
    ReplayTool, RestoreRequest, ToolAnswer,
};
use kreplay_snapshot::{Filter, RestoreStrategy, SnapshotConfig, StoreTier};

const AGENT: u64 = 0;
const WORDS: usize = 4096;

mod fake_device;
use fake_device::{HostMemory, OneDevice};
#[path = "fake_device/cubin.rs"]
mod cubin_image;
use cubin_image::{Cubin, cubin};

/// Launch operations of the fake: `relaunch` runs the kernel, `wait` and `drain` are no-ops.
struct FakeLaunch {
    memory: Arc<HostMemory>,
    events: Arc<Mutex<Vec<String>>>,
    replayable: Result<(), String>,
}

impl FakeLaunch {
    fn kernel(&self) {
        self.memory.add_one();
    }
    /// The application's own launch (what the driver submits between ENTER and EXIT).
    fn app_launch(&self) {
        self.events.lock().unwrap().push("app launch".into());
        self.kernel();
    }
}

impl LaunchOps for FakeLaunch {
    fn replayable(&self) -> Result<(), String> {
        self.replayable.clone()
    }
    fn drain(&self) -> Result<(), String> {
        self.events.lock().unwrap().push("drain".into());
        Ok(())
    }
    fn wait(&self) -> Result<(), String> {
        Ok(())
    }
    fn relaunch(&self) -> Result<(), String> {
        self.events.lock().unwrap().push("relaunch".into());
        self.kernel();
        Ok(())
    }
}

thread_local! {
    /// What each RESTORE EXIT on this thread reported (strategy name, unverified).
    static RESTORES: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// A tool asking for `passes` and logging every callback.
struct LogTool {
    passes: u64,
    events: Arc<Mutex<Vec<String>>>,
    outcome: RefCell<Option<ReplayOutcome>>,
}

impl LogTool {
    fn log(&self, s: String) {
        self.events.lock().unwrap().push(s);
    }
}

impl ReplayTool for LogTool {
    fn config_enter(&mut self, _: &DispatchInfo) -> ToolAnswer {
        self.log("config enter".into());
        ToolAnswer::passes(self.passes)
    }
    fn pass_enter(&mut self, _: &DispatchInfo, pass: u64, _: u64) {
        self.log(format!("pass enter {pass}"));
    }
    fn pass_exit(&mut self, _: &DispatchInfo, _: u64, _: u64) -> ContinueChange {
        ContinueChange::Keep
    }
    fn should_continue(&mut self, _: &DispatchInfo, _: u64, _: u64) -> bool {
        true
    }
    fn snapshot(&mut self, _: &DispatchInfo, phase: Phase, _: &MemoryOpReport) {
        self.log(format!("snapshot {phase:?}"));
    }
    fn restore(&mut self, _: &DispatchInfo, phase: Phase, _: &RestoreRequest, r: &MemoryOpReport) {
        if phase == Phase::Exit {
            self.log("restore".into());
            RESTORES.with(|v| {
                v.borrow_mut().push(format!(
                    "restored by {} unverified={}",
                    r.strategy.as_str(),
                    r.unverified
                ))
            });
        }
    }
    fn config_exit(&mut self, _: &DispatchInfo, outcome: &ReplayOutcome) {
        self.log("config exit".into());
        *self.outcome.borrow_mut() = Some(outcome.clone());
    }
}

struct Rig {
    device: OneDevice,
    registry: ContextRegistry,
    events: Arc<Mutex<Vec<String>>>,
}

fn rig(config: SnapshotConfig) -> Rig {
    Rig {
        device: OneDevice::new(WORDS, AGENT, config),
        registry: ContextRegistry::new(),
        events: Arc::default(),
    }
}

/// ENTER, the application's launch, EXIT; returns the tool's outcome.
fn launch(rig: &Rig, passes: u64, app_ok: bool, replayable: Result<(), String>) -> ReplayOutcome {
    let ops = FakeLaunch {
        memory: rig.device.memory.clone(),
        events: rig.events.clone(),
        replayable,
    };
    launch_with(rig, &ops, passes, || {
        if app_ok {
            ops.app_launch();
            Ok(())
        } else {
            Err("CUDA_ERROR_INVALID_VALUE".to_string())
        }
    })
}

/// ENTER with `ops`, the application's launch (`app`), EXIT; returns the tool's outcome.
fn launch_with(
    rig: &Rig,
    ops: &impl LaunchOps,
    passes: u64,
    app: impl FnOnce() -> Result<(), String>,
) -> ReplayOutcome {
    launch_info(rig, ops, passes, DispatchInfo::default(), app)
}

/// [`launch_with`] for a dispatch described by `info`.
fn launch_info(
    rig: &Rig,
    ops: &impl LaunchOps,
    passes: u64,
    info: DispatchInfo,
    app: impl FnOnce() -> Result<(), String>,
) -> ReplayOutcome {
    let mut tool = LogTool {
        passes,
        events: rig.events.clone(),
        outcome: RefCell::new(None),
    };
    let cx = rig.device.context(&rig.registry);
    let window = Window::enter(cx, &mut tool, info, ops);
    let launched = app();
    let record = window.exit(&mut tool, &rig.registry, ops, launched);
    assert_eq!(tool.outcome.borrow().as_ref(), Some(&record.outcome));
    record.outcome
}

fn words(rig: &Rig) -> Vec<u32> {
    rig.device.memory.0.lock().unwrap().clone()
}

fn expect_one_run(rig: &Rig) {
    let got = words(rig);
    let bad = (0..WORDS).find(|&i| got[i] != i as u32 + 1);
    assert_eq!(bad, None, "word {bad:?} is not what one run leaves");
}

#[test]
fn four_passes_leave_memory_as_one_run_for_every_strategy_and_tier() {
    for (store, strategy) in [
        (StoreTier::Host, RestoreStrategy::Full),
        (StoreTier::Host, RestoreStrategy::Hash),
        (StoreTier::Host, RestoreStrategy::Writeset),
        (StoreTier::File, RestoreStrategy::Full),
    ] {
        // Spill files go to the system temporary directory.
        if store == StoreTier::File && !fake_device::spill_room(&std::env::temp_dir(), 16 << 20) {
            continue;
        }
        let r = rig(SnapshotConfig::default()
            .with_store(store)
            .with_strategy(strategy)
            .with_chunk_size(1024));
        let outcome = launch(&r, 4, true, Ok(()));
        assert_eq!(
            outcome,
            ReplayOutcome::Replayed {
                passes: 4,
                end: LoopEnd::LastPass
            },
            "{store} {strategy}"
        );
        expect_one_run(&r);
        let events = r.events.lock().unwrap();
        assert_eq!(events.iter().filter(|e| *e == "relaunch").count(), 3);
        assert_eq!(events.iter().filter(|e| *e == "restore").count(), 3);
    }
}

/// A write set learned by the restores of one launch is kept for the next launch of the same
/// function over the same memory, as on HSA (keyed by the dispatch's kernel, here the CUDA
/// function), so that launch restores the set from its first restore on instead of learning it
/// again; another function learns its own.
#[test]
fn launches_of_one_function_keep_what_their_restores_learned_for_the_next() {
    let r = rig(SnapshotConfig::default()
        .with_strategy(RestoreStrategy::Writeset)
        .with_chunk_size(1024));
    let run = |function: u64| {
        let ops = fake(&r);
        let info = DispatchInfo {
            kernel_id: function,
            ..Default::default()
        };
        launch_info(&r, &ops, 4, info, || {
            ops.app_launch();
            Ok(())
        })
    };
    let replayed = ReplayOutcome::Replayed {
        passes: 4,
        end: LoopEnd::LastPass,
    };
    assert_eq!(run(0x7000), replayed);
    expect_one_run(&r);
    assert_eq!(r.device.snapshotter.kernels_learned(), 1);
    // The same function again: what it learned is reused, and memory is as after two runs.
    assert_eq!(run(0x7000), replayed);
    assert_eq!(r.device.snapshotter.kernels_learned(), 1);
    let got = words(&r);
    assert!(
        (0..WORDS).all(|i| got[i] == i as u32 + 2),
        "not as after two runs"
    );
    assert_eq!(run(0x7100), replayed);
    assert_eq!(r.device.snapshotter.kernels_learned(), 2);
}

/// Launch operations whose kernel adds 1 to the words `range` and records what their sum was
/// before (what each pass saw), and whose kernel key is `key` ([`LaunchOps::kernel_key`]).
struct KeyedLaunch {
    inner: FakeLaunch,
    range: std::ops::Range<usize>,
    key: u64,
    seen: Mutex<Vec<u64>>,
}

impl KeyedLaunch {
    fn kernel(&self) {
        let mut mem = self.inner.memory.0.lock().unwrap();
        let words = &mut mem[self.range.clone()];
        let sum = words.iter().map(|&w| u64::from(w)).sum();
        self.seen.lock().unwrap().push(sum);
        words.iter_mut().for_each(|w| *w += 1);
    }
}

impl LaunchOps for KeyedLaunch {
    fn replayable(&self) -> Result<(), String> {
        Ok(())
    }
    fn kernel_key(&self, _kernel_id: u64) -> u64 {
        self.key
    }
    fn drain(&self) -> Result<(), String> {
        Ok(())
    }
    fn wait(&self) -> Result<(), String> {
        Ok(())
    }
    fn relaunch(&self) -> Result<(), String> {
        self.kernel();
        Ok(())
    }
}

/// Two functions launched under one function handle (the driver handed the handle out again
/// after a module unload), told apart by their kernel keys: what the first one's restores
/// learned is kept under its key, and the second one learns its own.
#[test]
fn what_restores_learn_is_kept_under_the_kernel_key_the_launch_names() {
    let r = rig(SnapshotConfig::default()
        .with_strategy(RestoreStrategy::Writeset)
        .with_chunk_size(1024));
    let run = |range: std::ops::Range<usize>, key: u64| {
        let ops = KeyedLaunch {
            inner: fake(&r),
            range,
            key,
            seen: Mutex::new(Vec::new()),
        };
        let info = DispatchInfo {
            kernel_id: 0x7000,
            ..Default::default()
        };
        let outcome = launch_info(&r, &ops, 4, info, || {
            ops.kernel();
            Ok(())
        });
        assert!(matches!(outcome, ReplayOutcome::Replayed { passes: 4, .. }));
        let seen = ops.seen.into_inner().unwrap();
        assert!(seen.windows(2).all(|w| w[0] == w[1]), "{seen:?}");
    };
    run(0..1024, 1);
    assert_eq!(r.device.snapshotter.kernels_learned(), 1);
    run(2048..3072, 2);
    assert_eq!(
        r.device.snapshotter.kernels_learned(),
        2,
        "the second function's launch took the first one's learned state"
    );
    run(2048..3072, 2);
    assert_eq!(r.device.snapshotter.kernels_learned(), 2);
}

#[test]
fn an_unverified_write_set_restore_is_named_as_such_in_every_record() {
    let r = rig(SnapshotConfig::default()
        .with_store(StoreTier::Host)
        .with_strategy(RestoreStrategy::WritesetUnverified)
        .with_chunk_size(1024));
    RESTORES.with(|v| v.borrow_mut().clear());
    let outcome = launch(&r, 6, true, Ok(()));
    assert!(matches!(outcome, ReplayOutcome::Replayed { passes: 6, .. }));
    expect_one_run(&r);
    let restores = RESTORES.with(|v| v.borrow().clone());
    assert_eq!(restores.len(), 5, "{restores:?}");
    assert!(
        restores
            .iter()
            .any(|e| *e == "restored by writeset-unverified unverified=true"),
        "the opt-in ran unverified at least once: {restores:?}"
    );
    for e in &restores {
        let unverified = e.ends_with("unverified=true");
        assert_eq!(
            e.starts_with("restored by writeset-unverified "),
            unverified,
            "the name says which ran: {e}"
        );
    }
}

/// A launch naming its snapshot's strategy (as `auto`'s device choice does).
struct ChosenLaunch {
    inner: FakeLaunch,
    strategy: Option<RestoreStrategy>,
}

impl LaunchOps for ChosenLaunch {
    fn replayable(&self) -> Result<(), String> {
        self.inner.replayable()
    }
    fn snapshot_strategy(&self) -> Option<RestoreStrategy> {
        self.strategy
    }
    fn drain(&self) -> Result<(), String> {
        self.inner.drain()
    }
    fn wait(&self) -> Result<(), String> {
        self.inner.wait()
    }
    fn relaunch(&self) -> Result<(), String> {
        self.inner.relaunch()
    }
}

#[test]
fn a_launch_that_names_its_snapshot_strategy_is_restored_by_it_under_auto() {
    // 16 KiB under `auto`: restored in full, unless the launch names the verified write set.
    for (strategy, want) in [
        (None, "restored by full unverified=false"),
        (
            Some(RestoreStrategy::Writeset),
            "restored by writeset unverified=false",
        ),
    ] {
        let r = rig(SnapshotConfig::default()
            .with_store(StoreTier::Host)
            .with_strategy(RestoreStrategy::Auto)
            .with_chunk_size(1024));
        RESTORES.with(|v| v.borrow_mut().clear());
        let ops = ChosenLaunch {
            inner: FakeLaunch {
                memory: r.device.memory.clone(),
                events: r.events.clone(),
                replayable: Ok(()),
            },
            strategy,
        };
        let outcome = launch_with(&r, &ops, 5, || {
            ops.inner.app_launch();
            Ok(())
        });
        assert!(
            matches!(outcome, ReplayOutcome::Replayed { passes: 5, .. }),
            "{outcome:?}"
        );
        expect_one_run(&r);
        let restores = RESTORES.with(|v| v.borrow().clone());
        assert_eq!(restores, vec![want.to_string(); 4], "{strategy:?}");
    }
}

#[test]
fn the_tool_is_asked_the_snapshot_taken_and_pass_0_entered_before_the_applications_launch() {
    let r = rig(SnapshotConfig::default());
    launch(&r, 2, true, Ok(()));
    let events = r.events.lock().unwrap().clone();
    // PASS ENTER 0 before the launch: a tool configures its counters for pass 0 there.
    assert_eq!(
        events,
        [
            "config enter",
            "drain",
            "snapshot Enter",
            "snapshot Exit",
            "pass enter 0",
            "app launch",
            "restore",
            "pass enter 1",
            "relaunch",
            "config exit",
        ]
    );
}

#[test]
fn one_pass_is_the_ordinary_path_with_no_snapshot() {
    let r = rig(SnapshotConfig::default());
    let outcome = launch(&r, 1, true, Ok(()));
    assert!(
        matches!(outcome, ReplayOutcome::RanOnce { .. }),
        "{outcome:?}"
    );
    expect_one_run(&r);
    let events = r.events.lock().unwrap();
    assert!(
        !events
            .iter()
            .any(|e| e.starts_with("snapshot") || e == "relaunch")
    );
}

#[test]
fn a_snapshot_over_budget_declines_and_the_launch_runs_once() {
    let r = rig(SnapshotConfig::default().with_max_bytes(Some(100)));
    let outcome = launch(&r, 4, true, Ok(()));
    assert_eq!(
        outcome.decline().map(|d| d.reason),
        Some(DeclineReason::FootprintBudget)
    );
    expect_one_run(&r);
    assert!(!r.events.lock().unwrap().iter().any(|e| e == "relaunch"));
}

/// A launch whose device state cannot be made (kreplay's memory, streams, events or kernels on
/// the device): it ran once with a warning on standard error only, and the tool, which had
/// asked for passes, got no CONFIG ENTER or EXIT and never learned why. Now it is asked, and a
/// replay it wants is declined as `snapshot_failed` (what the passes need could not be had),
/// the cause in the detail; memory is untouched and the launch runs once, as an ordinary one.
#[test]
fn a_launch_whose_device_state_cannot_be_made_is_declined_with_a_reason() {
    for passes in [4, 1] {
        let r = rig(SnapshotConfig::default());
        let ops = fake(&r);
        let mut tool = LogTool {
            passes,
            events: r.events.clone(),
            outcome: RefCell::new(None),
        };
        let why = "cuStreamCreate: CUDA_ERROR_OUT_OF_MEMORY";
        let window = Window::enter_unprepared(
            &r.device.locks,
            &mut tool,
            DispatchInfo::default(),
            &ops,
            why,
        );
        assert!(!window.is_ready());
        let lock = r.device.locks.agent_lock(AGENT);
        assert!(
            lock.is_locked() && !lock.is_write_locked(),
            "the launch is submitted holding its device's reader side"
        );
        ops.app_launch();
        let record = window.exit(&mut tool, &r.registry, &ops, Ok(()));
        assert_eq!(tool.outcome.borrow().as_ref(), Some(&record.outcome));
        match (passes, record.outcome.decline()) {
            (1, decline) => assert!(decline.is_none(), "one pass asked: nothing declined"),
            (_, Some(d)) => {
                assert_eq!(d.reason, DeclineReason::SnapshotFailed);
                assert!(d.detail.contains(why), "{d}");
            }
            (_, None) => panic!("no reason given: {:?}", record.outcome),
        }
        expect_one_run(&r);
        assert!(!lock.is_locked(), "given back");
        assert_eq!(
            *r.events.lock().unwrap(),
            vec!["config enter", "app launch", "config exit"]
        );
    }
}

#[test]
fn a_captured_launch_is_declined_as_a_graph_and_runs_once() {
    let r = rig(SnapshotConfig::default());
    let outcome = launch(&r, 4, true, Err("being captured".into()));
    assert_eq!(
        outcome.decline().map(|d| d.reason),
        Some(DeclineReason::BatchOrGraph)
    );
    expect_one_run(&r);
    assert!(!r.events.lock().unwrap().iter().any(|e| e == "drain"));
}

#[test]
fn a_failed_application_launch_is_never_replayed() {
    let r = rig(SnapshotConfig::default());
    let outcome = launch(&r, 4, false, Ok(()));
    assert!(
        matches!(outcome, ReplayOutcome::PassFailed { pass: 0, .. }),
        "{outcome:?}"
    );
    assert_eq!(words(&r), (0..WORDS as u32).collect::<Vec<_>>());
    assert!(!r.events.lock().unwrap().iter().any(|e| e == "relaunch"));
}

#[test]
fn the_device_lock_is_released_after_exit_and_reentry_is_declined() {
    let r = rig(SnapshotConfig::default());
    launch(&r, 3, true, Ok(()));
    assert!(
        !r.device.locks.agent_lock(AGENT).is_locked(),
        "released at EXIT"
    );
    // A launch issued while this thread holds the device (from inside a replay window).
    let held = r.device.locks.write(AGENT).unwrap();
    let outcome = launch(&r, 3, true, Ok(()));
    assert_eq!(
        outcome.decline().map(|d| d.reason),
        Some(DeclineReason::ReentrantDispatch)
    );
    drop(held);
    assert_eq!(words(&r)[0], 2, "two launches, each counted once");
}

/// API ENTER, the application's launch and API EXIT on this thread of a launch on device `agent`
/// whose tool asks for `passes`, through `ops` (`app` is the launch the driver submits);
/// `entered` hears when API ENTER returned.
fn launch_telling_enter(
    r: &Rig,
    agent: u64,
    passes: u64,
    ops: &dyn LaunchOps,
    app: &FakeLaunch,
    entered: std::sync::mpsc::Sender<()>,
) -> ReplayOutcome {
    let mut tool = LogTool {
        passes,
        events: r.events.clone(),
        outcome: RefCell::new(None),
    };
    let info = DispatchInfo {
        agent_id: agent,
        ..DispatchInfo::default()
    };
    let w = Window::enter(r.device.context(&r.registry), &mut tool, info, ops);
    entered.send(()).unwrap();
    app.app_launch();
    w.exit(&mut tool, &ContextRegistry::new(), ops, Ok(()))
        .outcome
}

/// Opens a replay window of 4 passes on device `agent` (its peer group `group`), runs `other` on
/// another thread (a launch that says when it got past API ENTER, see [`launch_telling_enter`]),
/// and checks that `other`'s launch gets past API ENTER only once the window closed (`what`
/// names it in the messages).
fn waits_for_a_replay_window(
    r: &Arc<Rig>,
    agent: u64,
    group: &[u64],
    what: &str,
    other: impl FnOnce(&Rig, std::sync::mpsc::Sender<()>) + Send + 'static,
) {
    use std::time::Duration;

    let ops = fake(r);
    let mut tool = LogTool {
        passes: 4,
        events: r.events.clone(),
        outcome: RefCell::new(None),
    };
    let cx = kreplay_cuda::WindowContext {
        group,
        ..r.device.context(&r.registry)
    };
    let info = DispatchInfo {
        agent_id: agent,
        ..DispatchInfo::default()
    };
    let window = Window::enter(cx, &mut tool, info, &ops);
    assert!(window.is_ready());
    let (entered_tx, entered_rx) = std::sync::mpsc::channel();
    let other = {
        let r = r.clone();
        std::thread::spawn(move || other(&r, entered_tx))
    };
    assert!(
        entered_rx.recv_timeout(Duration::from_millis(200)).is_err(),
        "{what} got past API ENTER while a replay window was open"
    );
    ops.app_launch();
    let record = window.exit(&mut tool, &ContextRegistry::new(), &ops, Ok(()));
    assert!(matches!(
        record.outcome,
        ReplayOutcome::Replayed { passes: 4, .. }
    ));
    entered_rx
        .recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|_| panic!("{what} proceeds once the window closes"));
    other.join().unwrap();
}

#[test]
fn an_ordinary_launch_on_another_thread_waits_for_the_replay_window_to_close() {
    let r = Arc::new(rig(SnapshotConfig::default()));
    // Another thread's ordinary (single-pass) launch on the same device.
    waits_for_a_replay_window(&r, AGENT, &[], "the ordinary launch", |r, entered| {
        let ops = fake(r);
        launch_telling_enter(r, AGENT, 1, &ops, &ops, entered);
    });
    let got = words(&r);
    assert!(
        got.iter().enumerate().all(|(i, &x)| x == i as u32 + 2),
        "one replayed launch and one ordinary launch leave +2"
    );
}

/// A launch that is declined before its snapshot (not replayable: captured into a graph; live
/// memory the snapshot cannot cover) still runs once, right after API ENTER: like an ordinary
/// launch it must not be submitted while another thread's replay window holds the device, or
/// it runs between that window's snapshot and restores and the restores undo what it wrote
/// (seen on the H200 as a PyTorch program's index tensor reverted under another thread's
/// replay, tripping an index-bounds assertion).
#[test]
fn a_declined_launch_on_another_thread_waits_for_the_replay_window_to_close() {
    for case in ["not replayable", "uncovered memory"] {
        let r = Arc::new(rig(SnapshotConfig::default()));
        let what = format!("{case}: the declined launch");
        waits_for_a_replay_window(&r, AGENT, &[], &what, move |r, entered| {
            let mut app = fake(r);
            let outcome = if case == "not replayable" {
                app.replayable = Err("captured into a graph".into());
                launch_telling_enter(r, AGENT, 4, &app, &app, entered)
            } else {
                launch_telling_enter(r, AGENT, 4, &Uncovered(fake(r)), &app, entered)
            };
            assert!(outcome.decline().is_some(), "{outcome:?}");
        });
        let got = words(&r);
        assert!(
            got.iter().enumerate().all(|(i, &x)| x == i as u32 + 2),
            "{case}: one replayed launch and one declined launch leave +2"
        );
    }
}

/// The fake's operations with memory the snapshot does not cover (live managed memory).
struct Uncovered(FakeLaunch);

impl LaunchOps for Uncovered {
    fn replayable(&self) -> Result<(), String> {
        self.0.replayable()
    }
    fn covered(&self) -> Result<(), String> {
        Err("1 managed allocation(s) live".into())
    }
    fn drain(&self) -> Result<(), String> {
        self.0.drain()
    }
    fn wait(&self) -> Result<(), String> {
        self.0.wait()
    }
    fn relaunch(&self) -> Result<(), String> {
        self.0.relaunch()
    }
}

#[test]
fn a_launch_while_uncovered_memory_is_live_is_declined_and_runs_once() {
    let r = rig(SnapshotConfig::default());
    let ops = Uncovered(FakeLaunch {
        memory: r.device.memory.clone(),
        events: r.events.clone(),
        replayable: Ok(()),
    });
    let mut tool = LogTool {
        passes: 4,
        events: r.events.clone(),
        outcome: RefCell::new(None),
    };
    let cx = r.device.context(&r.registry);
    let window = Window::enter(cx, &mut tool, DispatchInfo::default(), &ops);
    ops.0.app_launch();
    let record = window.exit(&mut tool, &r.registry, &ops, Ok(()));
    let decline = record.outcome.decline().expect("declined");
    assert_eq!(decline.reason, DeclineReason::UntrackedMemory);
    assert!(decline.detail.contains("managed"), "{decline}");
    expect_one_run(&r);
    let events = r.events.lock().unwrap();
    assert!(
        !events
            .iter()
            .any(|e| e == "drain" || e == "relaunch" || e.starts_with("snapshot")),
        "{events:?}"
    );
}

/// A memset on another thread: every word set to `value`, fenced like a `cuMemsetD32` call.
fn fenced_memset(r: &Rig, value: u32) {
    kreplay_cuda::fence::enter(&r.device.locks, &[AGENT]);
    r.events.lock().unwrap().push(format!("memset {value}"));
    r.device
        .memory
        .0
        .lock()
        .unwrap()
        .iter_mut()
        .for_each(|x| *x = value);
    kreplay_cuda::fence::exit();
}

#[test]
fn a_memset_on_another_thread_waits_for_the_open_replay_window() {
    use std::sync::mpsc;
    use std::time::Duration;

    let r = Arc::new(rig(SnapshotConfig::default()));
    let ops = FakeLaunch {
        memory: r.device.memory.clone(),
        events: r.events.clone(),
        replayable: Ok(()),
    };
    let mut tool = LogTool {
        passes: 4,
        events: r.events.clone(),
        outcome: RefCell::new(None),
    };
    let cx = r.device.context(&r.registry);
    let window = Window::enter(cx, &mut tool, DispatchInfo::default(), &ops);
    assert!(window.is_ready());
    let (done_tx, done_rx) = mpsc::channel();
    let other = {
        let r = r.clone();
        std::thread::spawn(move || {
            fenced_memset(&r, 1000);
            done_tx.send(()).unwrap();
        })
    };
    assert!(
        done_rx.recv_timeout(Duration::from_millis(200)).is_err(),
        "the memset got past API ENTER while a replay window was open"
    );
    ops.app_launch();
    let record = window.exit(&mut tool, &r.registry, &ops, Ok(()));
    assert!(matches!(
        record.outcome,
        ReplayOutcome::Replayed { passes: 4, .. }
    ));
    done_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the memset proceeds once the window closes");
    other.join().unwrap();
    // Had the memset landed inside the window, a restore would have undone it (or the passes
    // would have added to it): only "replay, then memset" leaves 1000 everywhere.
    assert!(words(&r).iter().all(|&x| x == 1000));
    let events = r.events.lock().unwrap();
    let memset = events.iter().position(|e| e == "memset 1000").unwrap();
    let last_relaunch = events.iter().rposition(|e| e == "relaunch").unwrap();
    assert!(memset > last_relaunch, "{events:?}");
}

#[test]
fn a_replay_window_waits_for_a_memset_in_progress_and_snapshots_its_result() {
    use std::sync::mpsc;
    use std::time::Duration;

    let r = Arc::new(rig(SnapshotConfig::default()));
    // A memset whose call is in progress on this thread (between its API ENTER and EXIT).
    kreplay_cuda::fence::enter(&r.device.locks, &[AGENT]);
    let (entered_tx, entered_rx) = mpsc::channel();
    let launcher = {
        let r = r.clone();
        std::thread::spawn(move || {
            let ops = FakeLaunch {
                memory: r.device.memory.clone(),
                events: r.events.clone(),
                replayable: Ok(()),
            };
            let mut tool = LogTool {
                passes: 3,
                events: r.events.clone(),
                outcome: RefCell::new(None),
            };
            let cx = r.device.context(&r.registry);
            let window = Window::enter(cx, &mut tool, DispatchInfo::default(), &ops);
            entered_tx.send(()).unwrap();
            ops.app_launch();
            window.exit(&mut tool, &r.registry, &ops, Ok(())).outcome
        })
    };
    assert!(
        entered_rx.recv_timeout(Duration::from_millis(200)).is_err(),
        "the replay window opened while a memset was in progress"
    );
    r.events.lock().unwrap().push("memset 7".into());
    r.device
        .memory
        .0
        .lock()
        .unwrap()
        .iter_mut()
        .for_each(|x| *x = 7);
    kreplay_cuda::fence::exit();
    entered_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the window opens once the memset's call returned");
    let outcome = launcher.join().unwrap();
    assert!(matches!(outcome, ReplayOutcome::Replayed { passes: 3, .. }));
    assert!(
        words(&r).iter().all(|&x| x == 8),
        "the snapshot holds the memset's bytes and the launch counts once"
    );
}

/// The fake's operations with a drain timeout (`KREPLAY_DRAIN_TIMEOUT_MS`).
struct Bounded {
    inner: FakeLaunch,
    timeout: std::time::Duration,
}

impl LaunchOps for Bounded {
    fn replayable(&self) -> Result<(), String> {
        self.inner.replayable()
    }
    fn drain_timeout(&self) -> Option<std::time::Duration> {
        Some(self.timeout)
    }
    fn drain(&self) -> Result<(), String> {
        self.inner.drain()
    }
    fn wait(&self) -> Result<(), String> {
        self.inner.wait()
    }
    fn relaunch(&self) -> Result<(), String> {
        self.inner.relaunch()
    }
}

/// Another thread is inside a synchronous copy (its fenced call holds the device's reader
/// side) that returns only once the work before it on its stream ends, and that work is a
/// kernel spinning on a flag the launching thread sets after its launch (the pattern of
/// `drain_stuck.cu`, with the wait in a copy instead of a drain). Waiting for the writer side
/// without bound, the launch never returned and the program hung; it must be declined within
/// the drain timeout and run once, as the drain itself is.
#[test]
fn a_launch_is_declined_not_hung_when_a_call_holding_the_device_waits_for_the_launching_thread() {
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    let r = Arc::new(rig(SnapshotConfig::default()));
    let (flag_tx, flag_rx) = mpsc::channel::<()>();
    let (inside_tx, inside_rx) = mpsc::channel();
    let copier = {
        let r = r.clone();
        std::thread::spawn(move || {
            kreplay_cuda::fence::enter(&r.device.locks, &[AGENT]);
            inside_tx.send(()).unwrap();
            // The copy returns once the spinning kernel saw the flag.
            let _ = flag_rx.recv_timeout(Duration::from_secs(30));
            kreplay_cuda::fence::exit();
        })
    };
    inside_rx.recv().unwrap();
    let (done_tx, done_rx) = mpsc::channel();
    let launcher = {
        let r = r.clone();
        std::thread::spawn(move || {
            let ops = Bounded {
                inner: fake(&r),
                timeout: Duration::from_millis(300),
            };
            let start = Instant::now();
            let outcome = launch_with(&r, &ops, 4, || {
                ops.inner.app_launch();
                Ok(())
            });
            done_tx.send((outcome, start.elapsed())).unwrap();
        })
    };
    let done = done_rx.recv_timeout(Duration::from_secs(5));
    // The launching thread went on (or the test gives up): the flag is set, the copy returns.
    flag_tx.send(()).unwrap();
    copier.join().unwrap();
    let (outcome, took) =
        done.expect("the launch waited without bound for a call that waits for its thread");
    launcher.join().unwrap();
    let decline = outcome.decline().expect("declined");
    assert_eq!(decline.reason, DeclineReason::AgentDrainStuck, "{decline}");
    assert!(
        decline.detail.contains("KREPLAY_DRAIN_TIMEOUT_MS"),
        "{decline}"
    );
    assert!(took < Duration::from_secs(3), "declined after {took:?}");
    expect_one_run(&r);
}

/// As above while another thread waits for the same device's writer side too (another launch
/// about to open a window): its wait marks the device while it waits for the readers to leave,
/// which is not a replay window; mistaken for one, it kept the launch waiting without bound.
#[test]
fn a_launch_is_declined_when_another_thread_also_waits_for_a_device_a_stuck_call_holds() {
    use std::sync::atomic::AtomicBool;
    use std::sync::mpsc;
    use std::time::Duration;

    let r = Arc::new(rig(SnapshotConfig::default()));
    let (flag_tx, flag_rx) = mpsc::channel::<()>();
    let (inside_tx, inside_rx) = mpsc::channel();
    let copier = {
        let r = r.clone();
        std::thread::spawn(move || {
            kreplay_cuda::fence::enter(&r.device.locks, &[AGENT]);
            inside_tx.send(()).unwrap();
            let _ = flag_rx.recv_timeout(Duration::from_secs(30));
            kreplay_cuda::fence::exit();
        })
    };
    inside_rx.recv().unwrap();
    // Another thread waiting for the writer side, in slices, as a window about to open does.
    let stop = Arc::new(AtomicBool::new(false));
    let waiter = {
        let (r, stop) = (r.clone(), stop.clone());
        std::thread::spawn(move || {
            let got = r
                .device
                .locks
                .write_until(AGENT, Duration::from_millis(7), || {
                    !stop.load(Ordering::SeqCst)
                })
                .unwrap();
            drop(got);
        })
    };
    let (done_tx, done_rx) = mpsc::channel();
    let launcher = {
        let r = r.clone();
        std::thread::spawn(move || {
            let ops = Bounded {
                inner: fake(&r),
                timeout: Duration::from_millis(300),
            };
            let outcome = launch_with(&r, &ops, 4, || {
                ops.inner.app_launch();
                Ok(())
            });
            done_tx.send(outcome).unwrap();
        })
    };
    let outcome = done_rx.recv_timeout(Duration::from_secs(5));
    stop.store(true, Ordering::SeqCst);
    flag_tx.send(()).unwrap();
    copier.join().unwrap();
    waiter.join().unwrap();
    let outcome = outcome.expect("the launch waited without bound");
    launcher.join().unwrap();
    let decline = outcome.decline().expect("declined");
    assert_eq!(decline.reason, DeclineReason::AgentDrainStuck, "{decline}");
    expect_one_run(&r);
}

/// The fake's operations whose record of a launch run once (`completed(None)`, dispatch
/// tracing: it waits for the kernel to end) waits for `gate`.
struct WaitsForCompletion {
    inner: FakeLaunch,
    gate: Mutex<std::sync::mpsc::Receiver<()>>,
}

impl LaunchOps for WaitsForCompletion {
    fn replayable(&self) -> Result<(), String> {
        self.inner.replayable()
    }
    fn drain(&self) -> Result<(), String> {
        self.inner.drain()
    }
    fn wait(&self) -> Result<(), String> {
        self.inner.wait()
    }
    fn relaunch(&self) -> Result<(), String> {
        self.inner.relaunch()
    }
    fn completed(&self, _info: &DispatchInfo, pass: Option<u64>) {
        if pass.is_none() {
            let _ = self
                .gate
                .lock()
                .unwrap()
                .recv_timeout(std::time::Duration::from_secs(5));
        }
    }
}

/// A launch run once holds its device's reader side while it is submitted, not until its
/// kernel ends: the wait for its completion record (dispatch tracing) comes after the reader
/// side is given back. Held, it kept every other thread's replay window on the device waiting
/// for that kernel, and for ever when the kernel waits for work such a window holds back.
#[test]
fn a_launch_run_once_lets_go_of_its_device_before_waiting_for_its_kernel() {
    use std::sync::mpsc;
    use std::time::Duration;

    for passes in [1, 4] {
        let r = Arc::new(rig(SnapshotConfig::default()));
        let (gate_tx, gate_rx) = mpsc::channel();
        let (exiting_tx, exiting_rx) = mpsc::channel();
        let once = {
            let r = r.clone();
            std::thread::spawn(move || {
                let mut ops = WaitsForCompletion {
                    inner: fake(&r),
                    gate: Mutex::new(gate_rx),
                };
                if passes > 1 {
                    // Declined before its snapshot: it too runs once.
                    ops.inner.replayable = Err("captured into a graph".into());
                }
                let mut tool = LogTool {
                    passes,
                    events: r.events.clone(),
                    outcome: RefCell::new(None),
                };
                let w = Window::enter(
                    r.device.context(&r.registry),
                    &mut tool,
                    DispatchInfo::default(),
                    &ops,
                );
                ops.inner.app_launch();
                exiting_tx.send(()).unwrap();
                w.exit(&mut tool, &r.registry, &ops, Ok(())).outcome
            })
        };
        exiting_rx.recv().unwrap();
        let (opened_tx, opened_rx) = mpsc::channel();
        let replay = {
            let r = r.clone();
            std::thread::spawn(move || {
                let ops = fake(&r);
                launch_telling_enter(&r, AGENT, 4, &ops, &ops, opened_tx)
            })
        };
        let opened = opened_rx.recv_timeout(Duration::from_secs(2)).is_ok();
        // The kernel run once ends (or the test gives up on it).
        gate_tx.send(()).unwrap();
        let outcome = once.join().unwrap();
        let replayed = replay.join().unwrap();
        assert!(
            opened,
            "{passes} pass(es): the window waited for the kernel of a launch run once"
        );
        assert!(outcome.decline().is_some() || passes == 1, "{outcome:?}");
        assert!(
            matches!(replayed, ReplayOutcome::Replayed { passes: 4, .. }),
            "{replayed:?}"
        );
    }
}

/// The fake's operations whose pass 1 does not end until `watchdog` warned about it twice.
struct LongPass {
    inner: FakeLaunch,
    watchdog: kreplay_cuda::watchdog::Watchdog,
    warnings: Arc<Mutex<Vec<String>>>,
    waits: std::sync::atomic::AtomicU32,
}

impl LaunchOps for LongPass {
    fn replayable(&self) -> Result<(), String> {
        self.inner.replayable()
    }
    fn drain(&self) -> Result<(), String> {
        self.inner.drain()
    }
    fn watchdog(&self) -> Option<&kreplay_cuda::watchdog::Watchdog> {
        Some(&self.watchdog)
    }
    fn wait(&self) -> Result<(), String> {
        if self.waits.fetch_add(1, Ordering::SeqCst) == 1 {
            // Pass 1 runs until it has been warned about twice (or the test gives up on it).
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
            while self.warnings.lock().unwrap().len() < 2 && std::time::Instant::now() < deadline {
                std::thread::yield_now();
            }
        }
        Ok(())
    }
    fn relaunch(&self) -> Result<(), String> {
        self.inner.relaunch()
    }
}

/// A pass that does not end is waited for (a running pass is never abandoned), with a warning
/// every interval naming it: on CUDA the wait was one blocking `cuStreamSynchronize`, and a
/// pass whose kernel waits for a launch the window holds back hung the program in silence.
#[test]
fn a_pass_that_does_not_end_is_warned_about_while_it_is_waited_for() {
    let r = rig(SnapshotConfig::default());
    let warnings: Arc<Mutex<Vec<String>>> = Arc::default();
    let said = warnings.clone();
    let ops = LongPass {
        inner: fake(&r),
        watchdog: kreplay_cuda::watchdog::Watchdog::new(
            std::time::Duration::from_millis(20),
            move |what, waited| {
                said.lock()
                    .unwrap()
                    .push(format!("{what} after {waited:?}"))
            },
        ),
        warnings: warnings.clone(),
        waits: Default::default(),
    };
    let info = DispatchInfo {
        dispatch_id: 9,
        ..DispatchInfo::default()
    };
    let outcome = launch_info(&r, &ops, 4, info, || {
        ops.inner.app_launch();
        Ok(())
    });
    assert!(
        matches!(outcome, ReplayOutcome::Replayed { passes: 4, .. }),
        "{outcome:?}"
    );
    expect_one_run(&r);
    let warnings = warnings.lock().unwrap();
    assert!(warnings.len() >= 2, "{warnings:?}");
    assert!(
        warnings
            .iter()
            .all(|w| w.starts_with("pass 1 of dispatch 9 on device 0")),
        "{warnings:?}"
    );
}

/// A call of another thread spanning two devices (a peer copy) holds device 0 while it waits
/// for a replay window on device 1 to close: a launch on device 0 waiting behind it waits for
/// that window like the call does, however long it lasts, and is then replayed; it is not
/// declined as if the call were stuck.
#[test]
fn a_launch_behind_a_call_waiting_for_another_devices_window_is_not_declined() {
    use std::sync::mpsc;
    use std::time::Duration;

    let r = Arc::new(rig(SnapshotConfig::default()));
    // A replay window on device 1.
    let window_1 = r.device.locks.write(1).unwrap();
    let (held_tx, held_rx) = mpsc::channel();
    let copier = {
        let r = r.clone();
        std::thread::spawn(move || {
            // Device 0's reader side at once, device 1's once its window closed.
            let first = r.device.locks.read_owned(0).unwrap();
            held_tx.send(()).unwrap();
            kreplay_cuda::fence::enter(&r.device.locks, &[1]);
            drop(first);
            kreplay_cuda::fence::exit();
        })
    };
    held_rx.recv().unwrap();
    let (done_tx, done_rx) = mpsc::channel();
    let launcher = {
        let r = r.clone();
        std::thread::spawn(move || {
            let ops = Bounded {
                inner: fake(&r),
                timeout: Duration::from_millis(100),
            };
            let outcome = launch_with(&r, &ops, 4, || {
                ops.inner.app_launch();
                Ok(())
            });
            done_tx.send(outcome).unwrap();
        })
    };
    let early = done_rx.recv_timeout(Duration::from_millis(600)).ok();
    drop(window_1);
    let outcome = match early {
        Some(o) => o,
        None => done_rx.recv_timeout(Duration::from_secs(10)).unwrap(),
    };
    copier.join().unwrap();
    launcher.join().unwrap();
    assert!(
        matches!(outcome, ReplayOutcome::Replayed { passes: 4, .. }),
        "{outcome:?}"
    );
}

/// The drain timeout bounds waiting for calls that hold the device, not for another thread's
/// replay window: its passes run to their end, however long, and the launch waiting for it is
/// then replayed.
#[test]
fn a_launch_waits_for_another_threads_replay_window_beyond_the_drain_timeout() {
    use std::sync::mpsc;
    use std::time::Duration;

    let r = Arc::new(rig(SnapshotConfig::default()));
    let ops = fake(&r);
    let mut tool = LogTool {
        passes: 4,
        events: r.events.clone(),
        outcome: RefCell::new(None),
    };
    let window = Window::enter(
        r.device.context(&r.registry),
        &mut tool,
        DispatchInfo::default(),
        &ops,
    );
    assert!(window.is_ready());
    let (done_tx, done_rx) = mpsc::channel();
    let other = {
        let r = r.clone();
        std::thread::spawn(move || {
            let ops = Bounded {
                inner: fake(&r),
                timeout: Duration::from_millis(100),
            };
            let outcome = launch_with(&r, &ops, 3, || {
                ops.inner.app_launch();
                Ok(())
            });
            done_tx.send(outcome).unwrap();
        })
    };
    assert!(
        done_rx.recv_timeout(Duration::from_millis(600)).is_err(),
        "the other launch got past a replay window held six drain timeouts"
    );
    ops.app_launch();
    let record = window.exit(&mut tool, &r.registry, &ops, Ok(()));
    assert!(matches!(
        record.outcome,
        ReplayOutcome::Replayed { passes: 4, .. }
    ));
    let outcome = done_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the other launch goes on once the window closes");
    other.join().unwrap();
    assert!(
        matches!(outcome, ReplayOutcome::Replayed { passes: 3, .. }),
        "{outcome:?}"
    );
    assert!(
        words(&r)
            .iter()
            .enumerate()
            .all(|(i, &x)| x == i as u32 + 2)
    );
}

/// One stream of the fake: work another thread queued on it that waits (a
/// `cuStreamWaitValue32`, a `cuStreamWaitEvent` on an event recorded behind such a wait, a
/// host function that waits for the host), and the flag that ends the wait.
#[derive(Default)]
struct WaitingStream {
    /// (a wait is queued, the flag is set, the test gave up)
    state: Mutex<(bool, bool, bool)>,
    changed: std::sync::Condvar,
}

impl WaitingStream {
    /// Whether the stream reaches its end: no wait queued, or its flag set.
    fn synchronize(&self) -> Result<(), String> {
        let mut s = self.state.lock().unwrap();
        while s.0 && !s.1 && !s.2 {
            s = self.changed.wait(s).unwrap();
        }
        if s.2 && s.0 && !s.1 {
            return Err("the stream never reached its end".into());
        }
        Ok(())
    }
    fn update(&self, f: impl FnOnce(&mut (bool, bool, bool))) {
        f(&mut self.state.lock().unwrap());
        self.changed.notify_all();
    }
}

/// The fake launch on a [`WaitingStream`]: waiting for a pass is synchronizing the stream.
struct OnStream {
    inner: FakeLaunch,
    stream: Arc<WaitingStream>,
}

impl LaunchOps for OnStream {
    fn replayable(&self) -> Result<(), String> {
        self.inner.replayable()
    }
    fn drain(&self) -> Result<(), String> {
        self.inner.drain()
    }
    fn wait(&self) -> Result<(), String> {
        self.stream.synchronize()
    }
    fn relaunch(&self) -> Result<(), String> {
        self.inner.relaunch()
    }
}

/// An application's driver call `id` on another thread, as the injected library handles it:
/// fenced against the device's replay windows when kreplay fences that call.
fn app_call(r: &Rig, id: u32, call: impl FnOnce()) {
    let fenced = kreplay_cuda::fence::device_write(id).is_some();
    if fenced {
        kreplay_cuda::fence::enter(&r.device.locks, &[AGENT]);
    }
    call();
    if fenced {
        kreplay_cuda::fence::exit();
    }
}

/// While a launch's replay window is open, another thread queues on the launch's stream work
/// that waits (ids from CUDA 13.0's `cupti_driver_cbid.h`) for a flag a third thread sets with
/// `cuStreamWriteValue32`, which is fenced and so waits for the window to close. Queued inside
/// the window, the wait stood between the application's launch and the re-launches, and the
/// passes waited for it, the write waited for the passes: the program hung. Such a call waits
/// for the window, as the write does, and its wait comes after the last pass.
#[test]
fn work_another_thread_queues_on_the_replayed_stream_that_waits_does_not_hang_the_window() {
    use std::sync::mpsc;
    use std::time::Duration;

    const WRITE_VALUE_32: u32 = 460;
    for (name, id) in [
        ("cuStreamWaitValue32", 458),
        ("cuStreamWaitValue32_ptsz", 459),
        ("cuStreamWaitValue64", 473),
        ("cuStreamWaitValue32_v2", 659),
        ("cuStreamWaitValue64_v2_ptsz", 662),
        ("cuStreamWaitEvent", 295),
        ("cuStreamWaitEvent_ptsz", 436),
        ("cuLaunchHostFunc", 527),
        ("cuLaunchHostFunc_ptsz", 528),
        ("cuStreamAddCallback", 346),
        ("cuStreamAddCallback_ptsz", 437),
    ] {
        let r = Arc::new(rig(SnapshotConfig::default()));
        let stream = Arc::new(WaitingStream::default());
        let (exit_tx, exit_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel();
        let launcher = {
            let r = r.clone();
            let stream = stream.clone();
            let (entered_tx, entered_rx) = mpsc::channel();
            let t = std::thread::spawn(move || {
                let ops = OnStream {
                    inner: fake(&r),
                    stream,
                };
                let mut tool = LogTool {
                    passes: 4,
                    events: r.events.clone(),
                    outcome: RefCell::new(None),
                };
                let window = Window::enter(
                    r.device.context(&r.registry),
                    &mut tool,
                    DispatchInfo::default(),
                    &ops,
                );
                ops.inner.app_launch();
                entered_tx.send(()).unwrap();
                // API EXIT once the other threads made their calls (or waited in them).
                exit_rx.recv().unwrap();
                let outcome = window.exit(&mut tool, &r.registry, &ops, Ok(())).outcome;
                done_tx.send(()).unwrap();
                outcome
            });
            entered_rx.recv().unwrap();
            t
        };
        let (queued_tx, queued_rx) = mpsc::channel();
        let waiter = {
            let r = r.clone();
            let stream = stream.clone();
            std::thread::spawn(move || {
                app_call(&r, id, || stream.update(|s| s.0 = true));
                queued_tx.send(()).unwrap();
            })
        };
        let _ = queued_rx.recv_timeout(Duration::from_millis(200));
        let writer = {
            let r = r.clone();
            let stream = stream.clone();
            std::thread::spawn(move || {
                app_call(&r, WRITE_VALUE_32, || stream.update(|s| s.1 = true));
            })
        };
        exit_tx.send(()).unwrap();
        // The launch returns, or the test gives up on it (and unblocks the stream).
        let finished = done_rx.recv_timeout(Duration::from_secs(5)).is_ok();
        stream.update(|s| s.2 = true);
        let outcome = launcher.join().unwrap();
        waiter.join().unwrap();
        writer.join().unwrap();
        assert!(finished, "{name}: the replay window hung");
        assert!(
            matches!(outcome, ReplayOutcome::Replayed { passes: 4, .. }),
            "{name}: {outcome:?}"
        );
        expect_one_run(&r);
    }
}

/// The fake's operations on a device whose peer group is read from `groups` (as the injected
/// library reads its `AgentGroups`).
struct Linked {
    inner: FakeLaunch,
    groups: Arc<kreplay_locks::AgentGroups>,
    agent: u64,
}

impl LaunchOps for Linked {
    fn replayable(&self) -> Result<(), String> {
        self.inner.replayable()
    }
    fn linked_devices(&self) -> Option<Vec<u64>> {
        Some(self.groups.group(self.agent))
    }
    fn drain(&self) -> Result<(), String> {
        self.inner.drain()
    }
    fn wait(&self) -> Result<(), String> {
        self.inner.wait()
    }
    fn relaunch(&self) -> Result<(), String> {
        self.inner.relaunch()
    }
}

/// Opens a replay window of 4 passes on device 0 on another thread, its group read from
/// `groups` before it waits for the lock (`held`, another window on device 0, is dropped once
/// `between` ran), and checks that device 1's ordinary launch, made on a third thread after
/// `before_launch` there, waits for that window (`what` names the case).
fn device_1_waits_for_device_0s_window(
    what: &str,
    between: impl FnOnce(&kreplay_locks::AgentGroups),
    before_launch: impl FnOnce(&Rig, &kreplay_locks::AgentGroups) + Send + 'static,
) {
    use std::sync::mpsc;
    use std::time::Duration;

    let r = Arc::new(rig(SnapshotConfig::default()));
    let groups = Arc::new(kreplay_locks::AgentGroups::new());
    let held = r.device.locks.write(0).unwrap();
    let (entered_tx, entered_rx) = mpsc::channel();
    let (exit_tx, exit_rx) = mpsc::channel::<()>();
    let launcher = {
        let (r, groups) = (r.clone(), groups.clone());
        std::thread::spawn(move || {
            let ops = Linked {
                inner: fake(&r),
                groups: groups.clone(),
                agent: 0,
            };
            let group = groups.group(0);
            let cx = kreplay_cuda::WindowContext {
                group: &group,
                ..r.device.context(&r.registry)
            };
            let mut tool = LogTool {
                passes: 4,
                events: r.events.clone(),
                outcome: RefCell::new(None),
            };
            let info = DispatchInfo {
                agent_id: 0,
                ..DispatchInfo::default()
            };
            let w = Window::enter(cx, &mut tool, info, &ops);
            entered_tx.send(w.is_ready()).unwrap();
            ops.inner.app_launch();
            let _ = exit_rx.recv();
            w.exit(&mut tool, &ContextRegistry::new(), &ops, Ok(()))
                .outcome
        })
    };
    assert!(
        entered_rx.recv_timeout(Duration::from_millis(200)).is_err(),
        "{what}: the window opened while another held device 0"
    );
    between(&groups);
    drop(held);
    assert!(
        entered_rx.recv_timeout(Duration::from_secs(10)).unwrap(),
        "{what}: replayed"
    );
    let (other_tx, other_rx) = mpsc::channel();
    let other = {
        let (r, groups) = (r.clone(), groups.clone());
        std::thread::spawn(move || {
            before_launch(&r, &groups);
            let ops = fake(&r);
            launch_telling_enter(&r, 1, 1, &ops, &ops, other_tx);
        })
    };
    let inside = other_rx.recv_timeout(Duration::from_millis(200)).is_ok();
    exit_tx.send(()).unwrap();
    let outcome = launcher.join().unwrap();
    other.join().unwrap();
    assert!(
        !inside,
        "{what}: device 1's launch, which may write device 0's memory, ran inside device 0's window"
    );
    assert!(
        matches!(outcome, ReplayOutcome::Replayed { passes: 4, .. }),
        "{what}: {outcome:?}"
    );
}

/// Peer access enabled (on another thread) after a launch read its device's group, while it
/// waited for its writer side: the group it locks is the one that holds once it got it, or a
/// launch on the new peer, which may write the replayed device's memory, ran between the
/// snapshot and the restores, and the restores undid what it wrote.
#[test]
fn a_peer_link_made_while_a_launch_waits_for_its_device_is_locked_with_it() {
    device_1_waits_for_device_0s_window(
        "linked before the lock",
        |groups| groups.link(&[0, 1]),
        |_, _| {},
    );
}

/// A call that links devices (`cuCtxEnablePeerAccess`, id 313), made on another thread while a
/// replay window is open on one of them, waits for the window to close: linked inside it, a
/// launch on the new peer ran inside the window, which held only its own device.
#[test]
fn a_call_that_links_devices_waits_for_an_open_replay_window() {
    const CU_CTX_ENABLE_PEER_ACCESS: u32 = 313;
    device_1_waits_for_device_0s_window(
        "linked inside the window",
        |_| {},
        |r, groups| {
            // cuCtxEnablePeerAccess, as the injected library handles it (the link is made at
            // its API EXIT); the thread then launches on the new peer.
            let fenced = kreplay_cuda::fence::links_devices(CU_CTX_ENABLE_PEER_ACCESS);
            if fenced {
                kreplay_cuda::fence::enter(&r.device.locks, &[0, 1]);
            }
            groups.link(&[0, 1]);
            if fenced {
                kreplay_cuda::fence::exit();
            }
        },
    );
}

/// A launch whose snapshot filter is made as the injected library makes it ([`LaunchOps::scope`]
/// is `scope`), running `kernel` as its application launch and its re-launches.
struct ScopedLaunch<S, K> {
    inner: FakeLaunch,
    scope: S,
    kernel: K,
}

impl<S: Fn(&Filter) -> Result<Filter, String>, K: Fn()> LaunchOps for ScopedLaunch<S, K> {
    fn replayable(&self) -> Result<(), String> {
        self.inner.replayable()
    }
    fn scope(&self, base: &Filter) -> Result<Filter, String> {
        (self.scope)(base)
    }
    fn drain(&self) -> Result<(), String> {
        self.inner.drain()
    }
    fn wait(&self) -> Result<(), String> {
        self.inner.wait()
    }
    fn relaunch(&self) -> Result<(), String> {
        self.inner.events.lock().unwrap().push("relaunch".into());
        (self.kernel)();
        Ok(())
    }
}

/// ENTER, the application's launch (`ops.kernel`), EXIT.
fn run_scoped<S, K>(r: &Rig, passes: u64, ops: &ScopedLaunch<S, K>) -> ReplayRecord
where
    S: Fn(&Filter) -> Result<Filter, String>,
    K: Fn(),
{
    let mut tool = LogTool {
        passes,
        events: r.events.clone(),
        outcome: RefCell::new(None),
    };
    let cx = r.device.context(&r.registry);
    let window = Window::enter(cx, &mut tool, DispatchInfo::default(), ops);
    (ops.kernel)();
    window.exit(&mut tool, &r.registry, ops, Ok(()))
}

fn fake(r: &Rig) -> FakeLaunch {
    FakeLaunch {
        memory: r.device.memory.clone(),
        events: r.events.clone(),
        replayable: Ok(()),
    }
}

/// Words of module data after the device's one tracked allocation.
const MODULE_WORDS: usize = 4;
/// Where the module's writable data starts.
const MODULE_BASE: u64 = (WORDS * 4) as u64;

/// The driver's side of one loaded module whose `.nv.global` starts at [`MODULE_BASE`]:
/// `known` are the variables `cuModuleGetGlobal` finds (name, offset, size).
struct OneModule(Vec<(&'static str, u64, u64)>);

impl ModuleLookup for OneModule {
    fn module(&self) -> Result<u64, String> {
        Ok(1)
    }
    fn global(&self, module: u64, name: &str) -> Option<Range> {
        assert_eq!(module, 1);
        self.0
            .iter()
            .find(|(n, _, _)| *n == name)
            .map(|&(_, off, size)| (MODULE_BASE + off, size))
    }
}

/// A device with [`MODULE_WORDS`] words of module data past its tracked allocation, and the
/// registry that saw the module (kernel `bump`, a 4-byte `counter` in 16 bytes of
/// `.nv.global`) loaded.
fn module_rig() -> (Rig, ModuleRegistry) {
    let r = Rig {
        device: OneDevice::with_allocations(
            WORDS + MODULE_WORDS,
            &[(0, MODULE_BASE)],
            AGENT,
            SnapshotConfig::default().with_store(StoreTier::Host),
        ),
        registry: ContextRegistry::new(),
        events: Arc::default(),
    };
    let modules = ModuleRegistry::new();
    let image = cubin("bump", &[(".nv.global", 16, &[("counter", 0, 4)])]);
    assert_eq!(modules.on_loaded(1, &image), Ok(1));
    (r, modules)
}

/// Replays the `bump` kernel of [`module_rig`]'s cubin 4 times, its module's variables located
/// through `driver`: `counter += 1` with the rest of the device's words.
fn run_bump(r: &Rig, modules: &ModuleRegistry, driver: &OneModule) -> ReplayRecord {
    let ops = ScopedLaunch {
        inner: fake(r),
        scope: |base: &Filter| {
            let variables = modules.variables_of(0, 0x10, Some("bump"), driver)?;
            launch_filter(
                base.clone(),
                &r.device.inventory,
                &variables,
                &[],
                |_, _| None,
            )
            .map(|s| s.filter)
        },
        kernel: || r.device.memory.add_one(),
    };
    run_scoped(r, 4, &ops)
}

#[test]
fn a_module_variable_is_restored_between_passes_like_an_allocation() {
    let (r, modules) = module_rig();
    let record = run_bump(&r, &modules, &OneModule(vec![("counter", 0, 4)]));
    assert!(
        matches!(record.outcome, ReplayOutcome::Replayed { passes: 4, .. }),
        "{:?}",
        record.outcome
    );
    let got = words(&r);
    let bad = (0..WORDS + MODULE_WORDS).find(|&i| got[i] != i as u32 + 1);
    assert_eq!(
        bad, None,
        "word {bad:?} (module data from {WORDS}) is not one run's"
    );
    assert_eq!(
        record.cost.bytes_snapshotted,
        MODULE_BASE + 16,
        "the allocation and the whole .nv.global section"
    );
}

#[test]
fn a_launch_whose_module_variables_cannot_be_located_runs_once() {
    let (r, modules) = module_rig();
    let record = run_bump(&r, &modules, &OneModule(vec![]));
    let decline = record.outcome.decline().expect("declined");
    assert_eq!(decline.reason, DeclineReason::UntrackedMemory);
    assert!(decline.detail.contains("counter"), "{decline}");
    let got = words(&r);
    assert!((0..WORDS + MODULE_WORDS).all(|i| got[i] == i as u32 + 1));
    assert!(!r.events.lock().unwrap().iter().any(|e| e == "relaunch"));
}

#[test]
fn referenced_scope_snapshots_only_the_allocations_the_arguments_point_into() {
    // Two allocations of the device: the kernel's argument points into the first, and the
    // kernel writes only there.
    let half = WORDS / 2;
    let half_bytes = (half * 4) as u64;
    let r = Rig {
        device: OneDevice::with_allocations(
            WORDS,
            &[(0, half_bytes), (half_bytes, half_bytes)],
            AGENT,
            SnapshotConfig::default().with_store(StoreTier::Host),
        ),
        registry: ContextRegistry::new(),
        events: Arc::default(),
    };
    let mut pointer: u64 = 0x1000;
    let mut count: u32 = half as u32;
    let mut params: [*mut std::ffi::c_void; 2] =
        [(&raw mut pointer).cast(), (&raw mut count).cast()];
    let layout = [(0usize, 8usize), (8, 4)];
    let params_ptr = params.as_mut_ptr();
    let ops = ScopedLaunch {
        inner: fake(&r),
        scope: |_: &Filter| {
            // SAFETY: two parameters as the layout says, alive for the launch.
            let values =
                unsafe { argument_values(params_ptr, std::ptr::null_mut(), Some(&layout)) }
                    .map_err(|e| format!("{e:?}"))?;
            launch_filter(
                Filter::referenced_only(AGENT),
                &r.device.inventory,
                &[],
                &values,
                |_, _| None,
            )
            .map(|s| s.filter)
        },
        kernel: || {
            let mut m = r.device.memory.0.lock().unwrap();
            m[..half].iter_mut().for_each(|x| *x += 1);
        },
    };
    let record = run_scoped(&r, 4, &ops);
    assert!(
        matches!(record.outcome, ReplayOutcome::Replayed { passes: 4, .. }),
        "{:?}",
        record.outcome
    );
    assert_eq!(
        record.cost.bytes_snapshotted, half_bytes,
        "one allocation of two"
    );
    let got = words(&r);
    let bad = (0..WORDS).find(|&i| got[i] != i as u32 + u32::from(i < half));
    assert_eq!(bad, None, "word {bad:?} is not one run's");
}

/// The fake launch on a device whose driver follows the rule of stream capture: synchronizing
/// the context while one of its streams captures fails and invalidates that capture (as
/// `cuCtxSynchronize` does). The captures in progress are those kreplay follows.
struct CaptureAwareLaunch {
    inner: FakeLaunch,
    captures: Arc<Captures>,
    invalidated: Arc<AtomicBool>,
}

impl LaunchOps for CaptureAwareLaunch {
    fn replayable(&self) -> Result<(), String> {
        self.inner.replayable()
    }
    fn drainable(&self) -> Result<(), String> {
        self.captures.check_drainable(AGENT)
    }
    fn drain(&self) -> Result<(), String> {
        if self.captures.on_device(AGENT) > 0 {
            self.invalidated.store(true, Ordering::SeqCst);
            return Err("CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: capture invalidated".into());
        }
        self.inner.drain()
    }
    fn wait(&self) -> Result<(), String> {
        self.inner.wait()
    }
    fn relaunch(&self) -> Result<(), String> {
        self.inner.relaunch()
    }
}

fn capture_aware(
    r: &Rig,
    captures: &Arc<Captures>,
    invalidated: &Arc<AtomicBool>,
) -> CaptureAwareLaunch {
    CaptureAwareLaunch {
        inner: FakeLaunch {
            memory: r.device.memory.clone(),
            events: r.events.clone(),
            replayable: Ok(()),
        },
        captures: captures.clone(),
        invalidated: invalidated.clone(),
    }
}

#[test]
fn a_capture_in_progress_on_the_device_declines_the_replay_and_is_never_drained() {
    let r = rig(SnapshotConfig::default());
    let captures = Arc::new(Captures::new());
    let invalidated = Arc::new(AtomicBool::new(false));
    let ops = capture_aware(&r, &captures, &invalidated);
    // Another thread's capture (in progress from its cuStreamBeginCapture to its
    // cuStreamEndCapture) on a stream of this device.
    let other = CaptureStream::named(0x5000, false);
    captures.begin_enter(&r.device.locks, Some(AGENT), &[AGENT]);
    captures.begin_exit(Some((other, Some(AGENT))));

    let outcome = launch_with(&r, &ops, 4, || {
        ops.inner.app_launch();
        Ok(())
    });
    let decline = outcome.decline().expect("declined");
    assert_eq!(decline.reason, DeclineReason::BatchOrGraph, "{decline}");
    assert!(decline.to_string().contains("capture"), "{decline}");
    assert!(
        !invalidated.load(Ordering::SeqCst),
        "the capture was invalidated"
    );
    expect_one_run(&r);
    assert!(
        !r.events
            .lock()
            .unwrap()
            .iter()
            .any(|e| e == "drain" || e == "relaunch" || e.starts_with("snapshot")),
        "nothing but the launch ran"
    );
    assert!(
        !r.device.locks.agent_lock(AGENT).is_locked(),
        "lock released"
    );

    // Once the capture ended, launches are replayed again.
    assert!(captures.ended(other));
    let outcome = launch_with(&r, &ops, 4, || {
        ops.inner.app_launch();
        Ok(())
    });
    assert!(
        matches!(outcome, ReplayOutcome::Replayed { passes: 4, .. }),
        "{outcome:?}"
    );
    assert!(!invalidated.load(Ordering::SeqCst));
    let got = words(&r);
    assert!(
        (0..WORDS).all(|i| got[i] == i as u32 + 2),
        "two launches, two increments"
    );
}

#[test]
fn a_capture_cannot_begin_while_a_replay_window_holds_the_device() {
    use std::sync::mpsc;
    use std::time::Duration;

    let r = Arc::new(rig(SnapshotConfig::default()));
    let captures = Arc::new(Captures::new());
    let invalidated = Arc::new(AtomicBool::new(false));
    let ops = capture_aware(&r, &captures, &invalidated);
    let mut tool = LogTool {
        passes: 3,
        events: r.events.clone(),
        outcome: RefCell::new(None),
    };
    let window = Window::enter(
        r.device.context(&r.registry),
        &mut tool,
        DispatchInfo::default(),
        &ops,
    );
    assert!(window.is_ready(), "no capture yet: drained and snapshotted");
    let (begun_tx, begun_rx) = mpsc::channel();
    let capturer = {
        let (r, captures) = (r.clone(), captures.clone());
        std::thread::spawn(move || {
            captures.begin_enter(&r.device.locks, Some(AGENT), &[AGENT]);
            captures.begin_exit(Some((CaptureStream::named(0x6000, false), Some(AGENT))));
            begun_tx.send(()).unwrap();
        })
    };
    assert!(
        begun_rx.recv_timeout(Duration::from_millis(200)).is_err(),
        "a capture began inside an open replay window"
    );
    assert_eq!(captures.on_device(AGENT), 0);
    ops.inner.app_launch();
    let record = window.exit(&mut tool, &r.registry, &ops, Ok(()));
    assert!(matches!(
        record.outcome,
        ReplayOutcome::Replayed { passes: 3, .. }
    ));
    begun_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the capture begins once the window closed");
    capturer.join().unwrap();
    assert_eq!(captures.on_device(AGENT), 1);
    // The next launch sees it and leaves it alone.
    let outcome = launch_with(&r, &ops, 3, || {
        ops.inner.app_launch();
        Ok(())
    });
    assert_eq!(
        outcome.decline().map(|d| d.reason),
        Some(DeclineReason::BatchOrGraph)
    );
    assert!(!invalidated.load(Ordering::SeqCst));
    let got = words(&r);
    assert!((0..WORDS).all(|i| got[i] == i as u32 + 2));
}

/// A launch that logs where the window marks it, announces its submissions (ENQUEUE) and
/// reports its completions, as the injected library does while dispatch tracing is configured.
struct TracedLaunch {
    inner: FakeLaunch,
    /// Whether a replay mask of `registry` is active on this thread when an ENQUEUE is
    /// announced or completed (the tracing context is masked off for pass 1).
    registry: Arc<ContextRegistry>,
    traced: kreplay_ctxmask::ContextId,
}

fn pass_name(pass: Option<u64>) -> String {
    pass.map_or_else(|| "once".to_string(), |p| p.to_string())
}

impl TracedLaunch {
    fn log(&self, what: String) {
        let seen = if self.registry.is_active(self.traced) {
            ""
        } else {
            " (masked)"
        };
        self.inner
            .events
            .lock()
            .unwrap()
            .push(format!("{what}{seen}"));
    }
}

impl LaunchOps for TracedLaunch {
    fn replayable(&self) -> Result<(), String> {
        self.inner.replayable()
    }
    fn drain(&self) -> Result<(), String> {
        self.inner.drain()
    }
    fn wait(&self) -> Result<(), String> {
        self.inner.wait()
    }
    fn relaunch(&self) -> Result<(), String> {
        self.inner.relaunch()
    }
    fn mark(&self, at: kreplay_cuda::Mark) {
        self.log(format!("mark {at:?}"));
    }
    fn enqueue(&self, info: &DispatchInfo, pass: Option<u64>) -> Option<kreplay_cuda::Enqueued> {
        self.log(format!(
            "enqueue enter {} pass {}",
            info.dispatch_id,
            pass_name(pass)
        ));
        let events = self.inner.events.clone();
        let registry = self.registry.clone();
        let (traced, id) = (self.traced, info.dispatch_id);
        Some(kreplay_cuda::Enqueued::new(move || {
            let seen = if registry.is_active(traced) {
                ""
            } else {
                " (masked)"
            };
            events
                .lock()
                .unwrap()
                .push(format!("enqueue exit {id} pass {}{seen}", pass_name(pass)));
        }))
    }
    fn completed(&self, info: &DispatchInfo, pass: Option<u64>) {
        self.log(format!(
            "complete {} pass {}",
            info.dispatch_id,
            pass_name(pass)
        ));
    }
}

/// A tool that masks context `traced` off at PASS ENTER `mask_at` (and logs like [`LogTool`]).
struct MaskingTool {
    log: LogTool,
    traced: kreplay_ctxmask::ContextId,
    mask_at: u64,
}

impl ReplayTool for MaskingTool {
    fn config_enter(&mut self, info: &DispatchInfo) -> ToolAnswer {
        self.log.config_enter(info)
    }
    fn pass_enter(&mut self, info: &DispatchInfo, pass: u64, total: u64) {
        if pass == self.mask_at {
            kreplay_ctxmask::replay_stop_context(self.traced).expect("armed at PASS ENTER");
        }
        self.log.pass_enter(info, pass, total)
    }
    fn pass_exit(&mut self, info: &DispatchInfo, pass: u64, total: u64) -> ContinueChange {
        self.log.log(format!("pass exit {pass}"));
        self.log.pass_exit(info, pass, total)
    }
    fn should_continue(&mut self, info: &DispatchInfo, pass: u64, total: u64) -> bool {
        self.log.should_continue(info, pass, total)
    }
    fn snapshot(&mut self, info: &DispatchInfo, phase: Phase, report: &MemoryOpReport) {
        self.log.snapshot(info, phase, report)
    }
    fn restore(&mut self, i: &DispatchInfo, p: Phase, q: &RestoreRequest, r: &MemoryOpReport) {
        self.log.restore(i, p, q, r)
    }
    fn config_exit(&mut self, info: &DispatchInfo, outcome: &ReplayOutcome) {
        self.log.config_exit(info, outcome)
    }
}

#[test]
fn every_submission_of_a_launch_is_enqueued_under_its_pass_mask_and_every_enter_gets_its_exit() {
    let r = rig(SnapshotConfig::default());
    let registry = Arc::new(ContextRegistry::new());
    let traced = registry.create();
    registry.start(traced).unwrap();
    let run_masking =
        |id: u64, passes: u64, app_ok: bool, replayable: Result<(), String>, mask_at: u64| {
            let ops = TracedLaunch {
                inner: FakeLaunch {
                    memory: r.device.memory.clone(),
                    events: r.events.clone(),
                    replayable,
                },
                registry: registry.clone(),
                traced,
            };
            let mut tool = MaskingTool {
                log: LogTool {
                    passes,
                    events: r.events.clone(),
                    outcome: RefCell::new(None),
                },
                traced,
                mask_at,
            };
            let cx = r.device.context(&registry);
            let info = DispatchInfo {
                dispatch_id: id,
                ..DispatchInfo::default()
            };
            let window = Window::enter(cx, &mut tool, info, &ops);
            let launched = if app_ok {
                ops.inner.app_launch();
                Ok(())
            } else {
                Err("CUDA_ERROR_INVALID_VALUE".to_string())
            };
            window.exit(&mut tool, &registry, &ops, launched).outcome
        };
    let run = |id, passes, app_ok, replayable| run_masking(id, passes, app_ok, replayable, 1);
    let take = || std::mem::take(&mut *r.events.lock().unwrap());

    // Replayed in three passes; pass 1 masked off for the tracing context.
    assert!(matches!(
        run(1, 3, true, Ok(())),
        ReplayOutcome::Replayed { passes: 3, .. }
    ));
    assert_eq!(
        take(),
        [
            "config enter",
            "drain",
            "snapshot Enter",
            "snapshot Exit",
            "pass enter 0",
            "enqueue enter 1 pass 0",
            "mark Before",
            "app launch",
            "mark After",
            "enqueue exit 1 pass 0",
            "complete 1 pass 0",
            "pass exit 0",
            "restore",
            "pass enter 1",
            "enqueue enter 1 pass 1 (masked)",
            "mark Before (masked)",
            "relaunch",
            "mark After (masked)",
            "enqueue exit 1 pass 1 (masked)",
            "complete 1 pass 1 (masked)",
            "pass exit 1",
            "restore",
            "pass enter 2",
            "enqueue enter 1 pass 2 (masked)",
            "mark Before (masked)",
            "relaunch",
            "mark After (masked)",
            "enqueue exit 1 pass 2 (masked)",
            "complete 1 pass 2 (masked)",
            "pass exit 2",
            "config exit",
        ],
        "the mask of pass 1 is sticky for pass 2; pass 0's ENQUEUE ENTER (at API ENTER) and \
         EXIT (at API EXIT) both see pass 0's mask"
    );

    // Opted out (one pass), declined before the launch, and a failed application launch: the
    // launch's one submission is enqueued with no pass; a failed launch completes nothing.
    for (id, passes, app_ok, replayable, completes) in [
        (2, 1, true, Ok(()), true),
        (3, 4, true, Err("being captured".to_string()), true),
        (4, 1, false, Ok(()), false),
    ] {
        assert!(matches!(
            run(id, passes, app_ok, replayable),
            ReplayOutcome::RanOnce { .. }
        ));
        let events = take();
        let records: Vec<&str> = events
            .iter()
            .map(String::as_str)
            .filter(|e| e.starts_with("enqueue") || e.starts_with("complete") || *e == "app launch")
            .collect();
        let mut expected = vec![
            format!("enqueue enter {id} pass once"),
            "app launch".to_string(),
            format!("enqueue exit {id} pass once"),
        ];
        if !app_ok {
            expected.remove(1);
        }
        if completes {
            expected.push(format!("complete {id} pass once"));
        }
        assert_eq!(records, expected, "launch {id}: {events:?}");
        let exit = events.iter().position(|e| e.starts_with("enqueue exit"));
        let config_exit = events.iter().position(|e| e == "config exit");
        assert!(
            exit < config_exit,
            "submitted before CONFIG EXIT: {events:?}"
        );
    }

    // A replay whose application launch failed: pass 0's ENQUEUE still gets its EXIT.
    assert!(matches!(
        run(5, 3, false, Ok(())),
        ReplayOutcome::PassFailed { pass: 0, .. }
    ));
    let events = take();
    let records: Vec<&str> = events
        .iter()
        .map(String::as_str)
        .filter(|e| e.starts_with("enqueue") || e.starts_with("complete"))
        .collect();
    assert_eq!(records, ["enqueue enter 5 pass 0", "enqueue exit 5 pass 0"]);

    // Masked off from pass 0 on: the application's launch is announced and ended under pass
    // 0's mask although its ENTER comes at API ENTER and its EXIT at API EXIT.
    assert!(matches!(
        run_masking(6, 2, true, Ok(()), 0),
        ReplayOutcome::Replayed { passes: 2, .. }
    ));
    let events = take();
    let records: Vec<&str> = events
        .iter()
        .map(String::as_str)
        .filter(|e| e.starts_with("enqueue"))
        .collect();
    assert_eq!(
        records,
        [
            "enqueue enter 6 pass 0 (masked)",
            "enqueue exit 6 pass 0 (masked)",
            "enqueue enter 6 pass 1 (masked)",
            "enqueue exit 6 pass 1 (masked)",
        ]
    );
}

/// Replays kernel `kernel` of a module whose cubin has the kernels `say` (calls `vprintf`),
/// `grab` (calls `malloc`) and `bump` (calls nothing), its scope made as the injected library
/// makes it: the module's variables, then the device-runtime check of the context `runtime`.
fn run_runtime_kernel(
    r: &Rig,
    modules: &ModuleRegistry,
    runtime: &DeviceRuntime,
    kernel: &str,
    policy: HeapPolicy,
) -> ReplayRecord {
    let ops = ScopedLaunch {
        inner: fake(r),
        scope: |base: &Filter| {
            let variables = modules.variables_of(0, 0x10, Some(kernel), &OneModule(vec![]))?;
            runtime.check(kernel, &modules.runtime_calls(kernel), policy)?;
            launch_filter(
                base.clone(),
                &r.device.inventory,
                &variables,
                &[],
                |_, _| None,
            )
            .map(|s| s.filter)
        },
        kernel: || r.device.memory.add_one(),
    };
    run_scoped(r, 4, &ops)
}

fn runtime_rig() -> (Rig, ModuleRegistry) {
    let r = rig(SnapshotConfig::default().with_store(StoreTier::Host));
    let modules = ModuleRegistry::new();
    let image = Cubin {
        functions: &["say", "grab", "bump"],
        externs: &["vprintf", "malloc"],
        calls: &[("say", "vprintf"), ("grab", "malloc")],
        ..Cubin::default()
    }
    .image();
    modules.on_loaded(1, &image).unwrap();
    (r, modules)
}

#[test]
fn a_kernel_that_prints_runs_once_declined_and_the_next_one_is_replayed() {
    let (r, modules) = runtime_rig();
    let runtime = DeviceRuntime::new();
    let record = run_runtime_kernel(&r, &modules, &runtime, "say", HeapPolicy::Decline);
    let decline = record.outcome.decline().expect("declined");
    assert_eq!(decline.reason, DeclineReason::UntrackedMemory);
    assert!(decline.detail.contains("vprintf"), "{decline}");
    expect_one_run(&r);
    assert!(!r.events.lock().unwrap().iter().any(|e| e == "relaunch"));
    let record = run_runtime_kernel(&r, &modules, &runtime, "bump", HeapPolicy::Decline);
    assert!(
        matches!(record.outcome, ReplayOutcome::Replayed { passes: 4, .. }),
        "printing marks nothing: {:?}",
        record.outcome
    );
}

#[test]
fn after_a_kernel_used_the_device_heap_later_launches_decline_unless_trusted() {
    let (r, modules) = runtime_rig();
    let runtime = DeviceRuntime::new();
    let grab = run_runtime_kernel(&r, &modules, &runtime, "grab", HeapPolicy::Trust);
    let decline = grab
        .outcome
        .decline()
        .expect("a heap user is declined even when trusted");
    assert!(decline.detail.contains("malloc"), "{decline}");
    expect_one_run(&r);
    let bump = run_runtime_kernel(&r, &modules, &runtime, "bump", HeapPolicy::Decline);
    let decline = bump
        .outcome
        .decline()
        .expect("declined after the heap was used");
    assert_eq!(decline.reason, DeclineReason::UntrackedMemory);
    assert!(decline.detail.contains("grab"), "{decline}");
    let trusted = run_runtime_kernel(&r, &modules, &runtime, "bump", HeapPolicy::Trust);
    assert!(
        matches!(trusted.outcome, ReplayOutcome::Replayed { passes: 4, .. }),
        "{:?}",
        trusted.outcome
    );
    let got = words(&r);
    assert!(
        (0..WORDS).all(|i| got[i] == i as u32 + 3),
        "three launches, each seen once"
    );
}

/// Records, per callback, whether the window marks it as a tool callback inside a replay.
struct MarkTool {
    passes: u64,
    seen: Vec<(String, bool)>,
}

impl MarkTool {
    fn note(&mut self, what: String) {
        let inside = kreplay_cuda::window::in_replay_callback();
        self.seen.push((what, inside));
    }
}

impl ReplayTool for MarkTool {
    fn config_enter(&mut self, _: &DispatchInfo) -> ToolAnswer {
        self.note("config enter".into());
        ToolAnswer::passes(self.passes)
    }
    fn pass_enter(&mut self, _: &DispatchInfo, pass: u64, _: u64) {
        self.note(format!("pass enter {pass}"));
    }
    fn pass_exit(&mut self, _: &DispatchInfo, pass: u64, _: u64) -> ContinueChange {
        self.note(format!("pass exit {pass}"));
        ContinueChange::Keep
    }
    fn should_continue(&mut self, _: &DispatchInfo, _: u64, _: u64) -> bool {
        self.note("continue".into());
        true
    }
    fn snapshot(&mut self, _: &DispatchInfo, phase: Phase, _: &MemoryOpReport) {
        self.note(format!("snapshot {phase:?}"));
    }
    fn restore(&mut self, _: &DispatchInfo, phase: Phase, _: &RestoreRequest, _: &MemoryOpReport) {
        self.note(format!("restore {phase:?}"));
    }
    fn config_exit(&mut self, _: &DispatchInfo, _: &ReplayOutcome) {
        self.note("config exit".into());
    }
}

/// The callbacks where work a tool issues could be undone by a later restore (from SNAPSHOT
/// EXIT to the last pass) are the ones the injected library watches for device work.
#[test]
fn tool_callbacks_from_the_snapshot_on_are_marked_as_inside_the_replay_window() {
    let r = rig(SnapshotConfig::default());
    let ops = fake(&r);
    for passes in [3, 1] {
        let mut tool = MarkTool {
            passes,
            seen: Vec::new(),
        };
        let cx = r.device.context(&r.registry);
        let window = Window::enter(cx, &mut tool, DispatchInfo::default(), &ops);
        ops.app_launch();
        let record = window.exit(&mut tool, &r.registry, &ops, Ok(()));
        assert!(!kreplay_cuda::window::in_replay_callback(), "cleared after");
        let inside: Vec<&str> = tool
            .seen
            .iter()
            .filter(|(_, inside)| *inside)
            .map(|(what, _)| what.as_str())
            .collect();
        if passes == 1 {
            assert!(matches!(record.outcome, ReplayOutcome::RanOnce { .. }));
            assert!(inside.is_empty(), "{:?}", tool.seen);
            continue;
        }
        assert!(matches!(
            record.outcome,
            ReplayOutcome::Replayed { passes: 3, .. }
        ));
        for what in [
            "snapshot Exit",
            "pass enter 0",
            "pass exit 0",
            "restore Enter",
            "restore Exit",
            "pass enter 1",
            "pass exit 2",
        ] {
            assert!(inside.contains(&what), "{what}: {:?}", tool.seen);
        }
        for what in ["config enter", "snapshot Enter", "config exit"] {
            assert!(
                tool.seen.iter().any(|(w, inside)| w == what && !inside),
                "{what} is outside: {:?}",
                tool.seen
            );
        }
    }
}

/// A tool callback that panics inside the replay window (the injected library catches it)
/// leaves the thread outside the window afterwards.
#[test]
fn a_panicking_tool_callback_does_not_leave_the_thread_marked_inside_a_window() {
    struct Panics;
    impl ReplayTool for Panics {
        fn config_enter(&mut self, _: &DispatchInfo) -> ToolAnswer {
            ToolAnswer::passes(3)
        }
        fn pass_enter(&mut self, _: &DispatchInfo, _: u64, _: u64) {
            assert!(kreplay_cuda::window::in_replay_callback());
            panic!("a tool's bug");
        }
        fn pass_exit(&mut self, _: &DispatchInfo, _: u64, _: u64) -> ContinueChange {
            ContinueChange::Keep
        }
        fn should_continue(&mut self, _: &DispatchInfo, _: u64, _: u64) -> bool {
            true
        }
        fn snapshot(&mut self, _: &DispatchInfo, _: Phase, _: &MemoryOpReport) {}
        fn restore(&mut self, _: &DispatchInfo, _: Phase, _: &RestoreRequest, _: &MemoryOpReport) {}
        fn config_exit(&mut self, _: &DispatchInfo, _: &ReplayOutcome) {}
    }
    let r = rig(SnapshotConfig::default());
    let ops = fake(&r);
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let cx = r.device.context(&r.registry);
        Window::enter(cx, &mut Panics, DispatchInfo::default(), &ops)
    }));
    assert!(
        unwound.is_err(),
        "PASS ENTER of pass 0 panicked at API ENTER"
    );
    assert!(!kreplay_cuda::window::in_replay_callback());
}

/// Peer access links devices: a replay on device 1 whose group holds device 0 takes device 0's
/// writer side too, so an ordinary launch on device 0 (which may write memory device 1's kernels
/// reach, or be written by them) waits for the window; and replays on the two devices, which
/// take their group's sides in one order, never hold windows at once nor wait for each other
/// crosswise.
#[test]
fn a_replay_locks_every_device_of_its_peer_group() {
    use std::sync::atomic::AtomicU32;
    use std::time::{Duration, Instant};

    let group = [0u64, 1];
    let on = |agent: u64| DispatchInfo {
        agent_id: agent,
        ..DispatchInfo::default()
    };
    let r = Arc::new(rig(SnapshotConfig::default()));
    waits_for_a_replay_window(
        &r,
        1,
        &group,
        "device 0's ordinary launch, its peer's replay holding the group,",
        |r, entered| {
            let ops = fake(r);
            launch_telling_enter(r, 0, 1, &ops, &ops, entered);
        },
    );

    // Two threads replaying on devices 0 and 1 of the group: never two windows at once.
    let open = Arc::new(AtomicU32::new(0));
    let overlaps = Arc::new(AtomicU32::new(0));
    let deadline = Instant::now() + Duration::from_millis(400);
    let threads: Vec<_> = [0u64, 1]
        .into_iter()
        .map(|agent| {
            let (r, open, overlaps) = (r.clone(), open.clone(), overlaps.clone());
            std::thread::spawn(move || {
                let mut windows = 0;
                while Instant::now() < deadline {
                    let ops = fake(&r);
                    let mut tool = LogTool {
                        passes: 2,
                        events: Arc::default(),
                        outcome: RefCell::new(None),
                    };
                    let cx = kreplay_cuda::WindowContext {
                        group: &group,
                        ..r.device.context(&r.registry)
                    };
                    let w = Window::enter(cx, &mut tool, on(agent), &ops);
                    if open.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    std::thread::yield_now();
                    open.fetch_sub(1, Ordering::SeqCst);
                    ops.app_launch();
                    w.exit(&mut tool, &ContextRegistry::new(), &ops, Ok(()));
                    windows += 1;
                }
                windows
            })
        })
        .collect();
    let windows: Vec<u32> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(windows.iter().all(|&n| n > 0), "{windows:?}");
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "windows on two linked devices were open at once ({windows:?} windows)"
    );
}

/// The fake's operations whose re-launches fail to be submitted from the `fail_from`-th on
/// (counting from 1), as a driver call returning an error does: nothing runs.
struct RefusedRelaunch {
    inner: FakeLaunch,
    fail_from: usize,
    relaunches: std::sync::atomic::AtomicUsize,
}

impl LaunchOps for RefusedRelaunch {
    fn replayable(&self) -> Result<(), String> {
        self.inner.replayable()
    }
    fn drain(&self) -> Result<(), String> {
        self.inner.drain()
    }
    fn wait(&self) -> Result<(), String> {
        self.inner.wait()
    }
    fn relaunch(&self) -> Result<(), String> {
        if self.relaunches.fetch_add(1, Ordering::Relaxed) + 1 >= self.fail_from {
            return Err(
                "cuLaunchCooperativeKernel failed: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES".into(),
            );
        }
        self.inner.relaunch()
    }
}

#[test]
fn a_re_launch_the_driver_refuses_is_reported_as_undoing_the_application_launch() {
    // Pass 2's re-launch is refused after the restore before it: memory is back to the bytes
    // from before the application's launch, and nothing can run the kernel again. The tool and
    // the log must hear that memory does not hold what an ordinary run leaves.
    let r = rig(SnapshotConfig::default().with_store(StoreTier::Host));
    let ops = RefusedRelaunch {
        inner: fake(&r),
        fail_from: 2,
        relaunches: Default::default(),
    };
    let mut tool = LogTool {
        passes: 4,
        events: r.events.clone(),
        outcome: RefCell::new(None),
    };
    let cx = r.device.context(&r.registry);
    let window = Window::enter(cx, &mut tool, DispatchInfo::default(), &ops);
    assert!(window.is_ready());
    ops.inner.app_launch();
    let record = window.exit(&mut tool, &r.registry, &ops, Ok(()));
    let outcome = tool.outcome.borrow().clone().expect("CONFIG EXIT ran");
    assert_eq!(outcome, record.outcome);
    let ReplayOutcome::PassFailed { pass, decline } = &record.outcome else {
        panic!("{:?}", record.outcome);
    };
    assert_eq!(*pass, 2);
    assert!(
        decline.detail.contains("does NOT match an ordinary run")
            && decline.detail.contains("undone"),
        "{decline}"
    );
    let diagnostic = record.diagnostic().expect("a failed replay is diagnosed");
    assert!(diagnostic.contains("does NOT match"), "{diagnostic}");
    // What the report says is what memory holds: the snapshot, not one run's +1.
    let got = words(&r);
    assert!(got.iter().enumerate().all(|(i, &x)| x == i as u32));
}

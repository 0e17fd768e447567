//! One kernel launch replayed from its API ENTER and EXIT callbacks.
//!
//! CUPTI cannot hold a launch back: between the launch's API ENTER and EXIT callbacks the driver
//! submits it, whatever the callbacks do. So the replay window is split in two:
//!
//! * **At API ENTER** ([`Window::enter`]), before the driver submits the launch: CONFIG ENTER
//!   (the tool's pass count), then, for a replay, the device's writer lock, the drain
//!   (every stream of the device idle; declined instead while a stream of the device is being
//!   captured into a graph, see [`LaunchOps::drainable`]) and the snapshot, with the tool's
//!   SNAPSHOT ENTER/EXIT, and PASS ENTER of pass 0: a tool configures what it measures before
//!   the application's launch (pass 0) is submitted. Context toggles made there hold for the
//!   later passes too.
//! * **The application's own launch is pass 0**: it runs on the application's bytes.
//! * **At API EXIT** ([`Window::exit`]): `kreplay_passloop::run_dispatch` drives the rest with a
//!   [`ReplayDevice`] whose lock, drain and snapshot steps hand over what ENTER did (or the
//!   decline ENTER met), whose pass 0 waits for the application's launch and whose later passes
//!   re-launch it with the same parameters on the same stream, restoring the snapshot between
//!   passes. After the last pass the memory is what the application's own launch would have
//!   left; the application's stream order is untouched, so there is no completion to fire.
//!
//! The GPU side is behind [`LaunchOps`], so the same window runs over a host fake in tests.
//!
//! **Work a tool issues from its callbacks.** The tool's callbacks from the snapshot on (SNAPSHOT
//! EXIT, PASS ENTER and EXIT, the continue callback, RESTORE) run with [`in_replay_callback`]
//! true. A launch, copy or memset the tool makes there runs once, at once (kreplay's re-entry
//! guard keeps it out of the window), and what it changes in the memory the snapshot holds is
//! kept across the restores that follow: the window opens [`crate::toolwork`] with its
//! snapshot's footprint and [`LaunchOps::tool_work`], and folds what the tool's calls changed
//! into the snapshot before each restore.

use kreplay_wtrack::threads::NoCancel;
use std::cell::Cell;
use std::time::{Duration, Instant};

use kreplay_ctxmask::{ContextId, ContextRegistry};
use kreplay_locks::{AgentLocks, OwnedReadAccess, WriteGuard};
use kreplay_passloop::{
    ContinueChange, Decline, DeclineReason, DispatchInfo, MemoryOpReport, Phase, ReplayDevice,
    ReplayOutcome, ReplayPlan, ReplayRecord, ReplayTool, RestoreFailure, RestoreRequest,
    RestoreStrategy, SnapshotRequest, StoreTier, ToolAnswer, run_dispatch,
};
use kreplay_snapshot::{Filter, Snapshot, SnapshotError, Snapshotter};

use crate::toolwork::{self, ToolWorkIo};

/// What the window needs from the GPU for one launch.
pub trait LaunchOps {
    /// Whether the launch can be replayed at all (a launch captured into a graph cannot).
    fn replayable(&self) -> Result<(), String>;
    /// Whether the snapshot covers every memory the launch may write; `Err` names what it
    /// misses (live managed memory, mappings kreplay cannot attribute), and the launch is
    /// declined with `untracked_memory`.
    fn covered(&self) -> Result<(), String> {
        Ok(())
    }
    /// The snapshot filter of this launch, from the device's filter `base`: the launch adds
    /// what it reaches besides (its module's writable variables, what its arguments point
    /// into) or narrows the start (`KREPLAY_SNAPSHOT_SCOPE=referenced`). `Err` names memory
    /// the launch may write that the snapshot cannot cover, and the launch is declined with
    /// `untracked_memory`.
    fn scope(&self, base: &Filter) -> Result<Filter, String> {
        Ok(base.clone())
    }
    /// The restore strategy of this launch's snapshot when not the configured one: asked right
    /// after [`scope`](Self::scope), where `auto`'s measured choice of full device copies or
    /// verified restores on the device is made (see [`crate::choice`]). `None` (the default):
    /// the configured strategy.
    fn snapshot_strategy(&self) -> Option<kreplay_snapshot::RestoreStrategy> {
        None
    }
    /// The key under which what this launch's restores learn is kept for the next launch of
    /// the same kernel (see [`Snapshotter::take_for_kernel`]), from its dispatch's `kernel_id`.
    /// The default: `kernel_id` itself.
    fn kernel_key(&self, kernel_id: u64) -> u64 {
        kernel_id
    }
    /// Whether the launch's device may be drained now; `Err` names why not (a stream of the
    /// device is being captured into a graph: draining would invalidate the capture), and the
    /// launch is declined with `batch_or_graph`. Asked while the device's writer lock is held,
    /// right before [`drain`](Self::drain).
    fn drainable(&self) -> Result<(), String> {
        Ok(())
    }
    /// How long the launch waits for the device's work to end before it is declined
    /// (`KREPLAY_DRAIN_TIMEOUT_MS`): the drain's bound, and the bound on waiting for the calls
    /// of other threads that hold the device (see [`Window::enter`]). `None` (the default):
    /// waited for as long as it takes.
    fn drain_timeout(&self) -> Option<Duration> {
        None
    }
    /// The devices linked with the launch's device now (its peer group, itself included),
    /// asked again once the writer sides of [`WindowContext::group`] are held: a link made
    /// since the group was read is locked too. `None` (the default): the group as given.
    fn linked_devices(&self) -> Option<Vec<u64>> {
        None
    }
    /// Wait until every stream of the launch's device is idle, and of every other device of
    /// its group ([`WindowContext::group`]).
    fn drain(&self) -> Result<(), String>;
    /// Wait until the launch's stream has finished everything submitted to it.
    fn wait(&self) -> Result<(), String>;
    /// What warns, every interval, about a pass whose [`wait`](Self::wait) lasts (a running
    /// pass is never abandoned). `None` (the default): nothing is said.
    fn watchdog(&self) -> Option<&crate::watchdog::Watchdog> {
        None
    }
    /// Submit the launch again with the same parameters on the same stream.
    fn relaunch(&self) -> Result<(), String>;
    /// The launch of a pass is about to be submitted (`Before`) or was just submitted
    /// (`After`): where a dispatch-tracing implementation marks the stream (timestamps).
    fn mark(&self, at: Mark) {
        let _ = at;
    }
    /// A pass (`Some(pass)`, after it was waited for, before its PASS EXIT, under its mask) or
    /// the one run of a launch that was not replayed (`None`, at API EXIT) completed: where a
    /// dispatch-tracing implementation delivers its record.
    fn completed(&self, info: &DispatchInfo, pass: Option<u64>) {
        let _ = (info, pass);
    }
    /// The launch of pass `pass` (`Some`), or the one run of a launch that is not replayed
    /// (`None`), is about to be submitted: where a dispatch-tracing implementation announces it
    /// (KERNEL_DISPATCH ENQUEUE ENTER) and returns what announces its end (EXIT), which the
    /// window calls right after the submission, under the same pass's mask. Called before
    /// [`mark`](Self::mark)`(Before)`; the EXIT comes after `mark(After)`, whether or not the
    /// submission succeeded. The application's own launch is announced at API ENTER (after
    /// PASS ENTER 0 of a replay) and ended at API EXIT.
    fn enqueue(&self, info: &DispatchInfo, pass: Option<u64>) -> Option<Enqueued> {
        let _ = (info, pass);
        None
    }
    /// How the memory of this launch's device is read around work a tool issues from its
    /// callbacks (see [`crate::toolwork`]), asked once the snapshot is taken. `None` (the
    /// default): such work is not kept across the restores that follow.
    fn tool_work(&self) -> Option<Box<dyn ToolWorkIo>> {
        None
    }
}

/// The end of a submission announced by [`LaunchOps::enqueue`]: [`exit`](Self::exit) delivers
/// it (KERNEL_DISPATCH ENQUEUE EXIT).
pub struct Enqueued(Box<dyn FnOnce()>);

impl Enqueued {
    /// `exit` runs once, right after the announced submission.
    pub fn new(exit: impl FnOnce() + 'static) -> Enqueued {
        Enqueued(Box::new(exit))
    }

    /// The submission happened (or failed): deliver its EXIT.
    pub fn exit(self) {
        (self.0)()
    }
}

impl std::fmt::Debug for Enqueued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Enqueued").finish_non_exhaustive()
    }
}

/// Where [`LaunchOps::mark`] is called from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    /// Right before a pass's launch is submitted.
    Before,
    /// Right after it was submitted.
    After,
}

/// The shared pieces a window uses.
#[derive(Clone, Copy)]
pub struct WindowContext<'a> {
    /// Per-device locks (replay windows write, ordinary launches read).
    pub locks: &'a AgentLocks,
    /// Snapshots of the launch's device.
    pub snapshotter: &'a Snapshotter,
    /// The device's filter: where every launch's snapshot filter starts
    /// ([`LaunchOps::scope`]).
    pub filter: &'a Filter,
    /// The tool contexts (PASS ENTER's context toggles act on their replay mask).
    pub registry: &'a ContextRegistry,
    /// The devices whose kernels may write the launch's device's memory or whose memory its
    /// kernels may write (peer access, `kreplay_locks::AgentGroups`), the launch's own included,
    /// in ascending order; empty: the launch's device alone. A replay takes the writer side of
    /// each (and [`LaunchOps::drain`] drains them all).
    pub group: &'a [u64],
}

/// The devices a replay on `agent` locks: `group`, or `agent` alone.
fn locked_devices(group: &[u64], agent: u64) -> Vec<u64> {
    let mut devices = group.to_vec();
    devices.push(agent);
    devices.sort_unstable();
    devices.dedup();
    devices
}

/// The writer sides of `devices` (ascending) for a replay window. Another thread's window
/// (on any device) is waited for as long as it lasts (its passes run to their end); but a
/// device held only by readers, the calls of other threads in progress (a copy, a memset, a
/// launch being submitted), while no window is open anywhere, for longer than `timeout` is
/// declined (`agent_drain_stuck`), as a drain that does not end is: such a call waits for
/// work on the device (a synchronous copy waits for its stream), which may wait for something
/// the launching thread does only after this launch (a kernel spinning on a flag it sets), and
/// waited for without bound the program would hang.
/// `None`: waited for as long as it takes.
fn lock_devices(
    locks: &AgentLocks,
    devices: &[u64],
    timeout: Option<Duration>,
) -> Result<Vec<WriteGuard>, Decline> {
    let mut readers_since: Option<Instant> = None;
    let keep_waiting = || {
        let Some(timeout) = timeout else {
            return true;
        };
        // Nothing of ours is held between slices: a writer side taken is another window's.
        // A window on any device counts: a call holding this one may span devices (a peer
        // copy) and wait for that window, which ends.
        if locks.any_write_locked() {
            readers_since = None;
            return true;
        }
        readers_since.get_or_insert_with(Instant::now).elapsed() < timeout
    };
    match locks.write_all_until(devices, Duration::from_millis(50), keep_waiting) {
        Ok(Some(lock)) => Ok(lock),
        Ok(None) => Err(Decline::new(
            DeclineReason::AgentDrainStuck,
            format!(
                "calls of other threads (copies, memsets, launches) held device(s) {devices:?} \
                 for longer than {:?} (KREPLAY_DRAIN_TIMEOUT_MS): they wait for work on the \
                 device that waits for something after this launch",
                timeout.unwrap_or_default()
            ),
        )),
        Err(e) => Err(Decline::new(
            DeclineReason::ReentrantDispatch,
            e.to_string(),
        )),
    }
}

/// What ENTER did before the launch, and how long it took.
#[derive(Clone, Copy, Debug, Default)]
pub struct EnterCost {
    /// Waiting for the writer lock.
    pub lock_wait: Duration,
    /// The drain.
    pub drain: Duration,
    /// Planning and taking the snapshot.
    pub snapshot: Duration,
}

enum State {
    /// Not replayed: an ordinary launch (holding the reader side while replay is configured).
    Ordinary(#[allow(dead_code)] Option<OwnedReadAccess>),
    /// Replay was wanted but declined before the launch; memory untouched. The launch runs once,
    /// as an ordinary one, holding the reader side while it is submitted.
    Declined(Decline, #[allow(dead_code)] Option<OwnedReadAccess>),
    /// Locked, drained and snapshotted: ready for passes.
    Ready {
        /// The writer sides of the launch's device and its group, in ascending order.
        lock: Vec<WriteGuard>,
        plan: MemoryOpReport,
        taken: Option<Box<(Snapshot, MemoryOpReport)>>,
        /// The contexts PASS ENTER of pass 0 masked off (at API ENTER).
        masked_at_pass0: Vec<ContextId>,
    },
}

/// A launch between its API ENTER and EXIT.
pub struct Window {
    info: DispatchInfo,
    answer: ToolAnswer,
    state: State,
    cost: EnterCost,
    /// The application's launch as announced at API ENTER (its EXIT is due at API EXIT).
    enqueued: Option<Enqueued>,
}

impl std::fmt::Debug for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Window")
            .field("info", &self.info)
            .field("answer", &self.answer)
            .finish_non_exhaustive()
    }
}

thread_local! {
    static IN_REPLAY_CALLBACK: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread is inside a tool callback of a replay window whose snapshot was
/// taken (work the tool issues now may be undone by a later restore).
pub fn in_replay_callback() -> bool {
    IN_REPLAY_CALLBACK.with(Cell::get)
}

/// Runs `f` (a tool callback) with [`in_replay_callback`] true when `replaying`.
fn in_window<R>(replaying: bool, f: impl FnOnce() -> R) -> R {
    if replaying { replay_callback(f) } else { f() }
}

/// Runs `f` (a tool callback) with [`in_replay_callback`] true; the flag is put back even if
/// `f` unwinds (the callback handler catches panics, and the thread goes on).
fn replay_callback<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            IN_REPLAY_CALLBACK.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(IN_REPLAY_CALLBACK.with(|c| c.replace(true)));
    f()
}

/// The passloop's tier name for a snapshot tier.
pub fn tier(t: kreplay_snapshot::StoreTier) -> StoreTier {
    match t {
        kreplay_snapshot::StoreTier::Device => StoreTier::Device,
        kreplay_snapshot::StoreTier::Host => StoreTier::Host,
        kreplay_snapshot::StoreTier::File => StoreTier::File,
        _ => StoreTier::None,
    }
}

/// The passloop's strategy name for a snapshot strategy.
pub fn strategy(s: kreplay_snapshot::RestoreStrategy) -> RestoreStrategy {
    match s {
        kreplay_snapshot::RestoreStrategy::Hash => RestoreStrategy::Hash,
        kreplay_snapshot::RestoreStrategy::Writeset => RestoreStrategy::Writeset,
        kreplay_snapshot::RestoreStrategy::WritesetUnverified => {
            RestoreStrategy::WritesetUnverified
        }
        _ => RestoreStrategy::Full,
    }
}

fn snapshot_decline(e: &SnapshotError) -> Decline {
    let reason = DeclineReason::ALL
        .into_iter()
        .find(|r| r.as_str() == e.reason())
        .unwrap_or(DeclineReason::SnapshotFailed);
    Decline::new(reason, e.to_string())
}

impl Window {
    /// API ENTER of a launch: ask the tool, and for a replay lock, drain and snapshot.
    pub fn enter<T: ReplayTool + ?Sized, O: LaunchOps + ?Sized>(
        cx: WindowContext<'_>,
        tool: &mut T,
        info: DispatchInfo,
        ops: &O,
    ) -> Window {
        // The tool is called and the memory snapshotted on the application's thread, inside
        // its launch, which has no cancellation point: a cancellation of the thread waits for
        // the call's end (see `kreplay_wtrack::threads::NoCancel`).
        let _no_cancel = NoCancel::now();
        // A window left open by a callback that unwound is over.
        toolwork::close();
        let answer = tool.config_enter(&info);
        let mut cost = EnterCost::default();
        let mut enqueued = None;
        let state = match ReplayPlan::from_answer_within(&answer, &tool.limits()) {
            ReplayPlan::Once(_) => State::Ordinary(cx.locks.read_owned(info.agent_id).ok()),
            ReplayPlan::Replay { total_passes, .. } => {
                match Self::prepare(cx, tool, &info, ops, total_passes, &mut cost, &mut enqueued) {
                    // Declined: the launch runs once, as an ordinary one, so it too waits for
                    // a replay window another thread holds on the device (its writer side was
                    // given back, if taken). Submitted inside another window, it would run
                    // between that window's snapshot and restores, and they would undo it.
                    State::Declined(decline, _) => {
                        State::Declined(decline, cx.locks.read_owned(info.agent_id).ok())
                    }
                    state => state,
                }
            }
        };
        // The application's launch (pass 0, announced under its mask by `prepare`, or its one
        // run) is submitted next.
        if !matches!(state, State::Ready { .. }) {
            enqueued = ops.enqueue(&info, None);
        }
        ops.mark(Mark::Before);
        Window {
            info,
            answer,
            state,
            cost,
            enqueued,
        }
    }

    /// API ENTER of a launch whose device state kreplay could not make (`why`: its memory and
    /// stream on the device, its snapshotter), so nothing a replay needs is there. The
    /// tool is asked as for any launch; a replay it asks for is declined before anything is
    /// touched (`snapshot_failed`: what the passes need could not be acquired), so CONFIG EXIT
    /// tells it why, and the launch runs once as an ordinary one, holding the reader side of
    /// its device (`locks`) while it is submitted.
    pub fn enter_unprepared<T: ReplayTool + ?Sized, O: LaunchOps + ?Sized>(
        locks: &AgentLocks,
        tool: &mut T,
        info: DispatchInfo,
        ops: &O,
        why: &str,
    ) -> Window {
        // As in `enter`: the tool is called on the application's thread, inside its launch.
        let _no_cancel = NoCancel::now();
        toolwork::close();
        let answer = tool.config_enter(&info);
        let read = locks.read_owned(info.agent_id).ok();
        let state = match ReplayPlan::from_answer_within(&answer, &tool.limits()) {
            ReplayPlan::Once(_) => State::Ordinary(read),
            ReplayPlan::Replay { .. } => State::Declined(
                Decline::new(
                    DeclineReason::SnapshotFailed,
                    format!("the launch's device state could not be made: {why}"),
                ),
                read,
            ),
        };
        let enqueued = ops.enqueue(&info, None);
        ops.mark(Mark::Before);
        Window {
            info,
            answer,
            state,
            cost: EnterCost::default(),
            enqueued,
        }
    }

    fn prepare<T: ReplayTool + ?Sized, O: LaunchOps + ?Sized>(
        cx: WindowContext<'_>,
        tool: &mut T,
        info: &DispatchInfo,
        ops: &O,
        total_passes: u64,
        cost: &mut EnterCost,
        enqueued: &mut Option<Enqueued>,
    ) -> State {
        if let Err(why) = ops.replayable() {
            return State::Declined(Decline::new(DeclineReason::BatchOrGraph, why), None);
        }
        if let Err(why) = ops.covered() {
            return State::Declined(Decline::new(DeclineReason::UntrackedMemory, why), None);
        }
        let filter = match ops.scope(cx.filter) {
            Ok(filter) => filter,
            Err(why) => {
                return State::Declined(Decline::new(DeclineReason::UntrackedMemory, why), None);
            }
        };
        let waited = Instant::now();
        // A replay takes the sides of its group without ever waiting while it holds one (see
        // `AgentLocks::write_all_serving`): two replays of one group, or a replay and a thread
        // whose fenced call on one device nests one on another, never wait for each other
        // crosswise.
        let mut devices = locked_devices(cx.group, info.agent_id);
        let lock = loop {
            let lock = match lock_devices(cx.locks, &devices, ops.drain_timeout()) {
                Ok(lock) => lock,
                Err(decline) => return State::Declined(decline, None),
            };
            // Peer access enabled on another thread since the group was read: the new peers'
            // work may write this device's memory, so they are locked (and drained) too. The
            // calls that link devices wait for open windows (`fence::links_devices`), so the
            // group holds while these sides are.
            let now = ops
                .linked_devices()
                .map(|g| locked_devices(&g, info.agent_id))
                .unwrap_or_default();
            if now.iter().all(|d| devices.contains(d)) {
                break lock;
            }
            drop(lock);
            devices.extend(now);
            devices.sort_unstable();
            devices.dedup();
        };
        cost.lock_wait = waited.elapsed();
        if let Err(why) = ops.drainable() {
            return State::Declined(Decline::new(DeclineReason::BatchOrGraph, why), None);
        }
        let draining = Instant::now();
        let drained = ops.drain();
        cost.drain = draining.elapsed();
        if let Err(why) = drained {
            return State::Declined(Decline::new(DeclineReason::AgentDrainStuck, why), None);
        }
        let snapping = Instant::now();
        let plan = match cx.snapshotter.plan(&filter) {
            Ok(plan) => plan,
            Err(e) => return State::Declined(snapshot_decline(&e), None),
        };
        let planned = MemoryOpReport {
            bytes_planned: plan.bytes(),
            regions: plan.regions().len() as u64,
            chunks: plan.chunks(),
            ..Default::default()
        };
        tool.snapshot(info, Phase::Enter, &planned);
        let restores = SnapshotRequest::for_passes(total_passes).planned_restores;
        // Keyed by the launched function: what one launch's restores learned (the write set,
        // what changes) is kept for its next launch over the same memory, as on HSA.
        let taken = cx.snapshotter.take_for_kernel(
            plan.with_planned_restores(restores)
                .with_strategy(ops.snapshot_strategy()),
            ops.kernel_key(info.kernel_id),
        );
        cost.snapshot = snapping.elapsed();
        match taken {
            Ok(snapshot) => {
                let r = snapshot.report();
                let report = MemoryOpReport {
                    bytes_planned: r.bytes_planned,
                    bytes_moved: r.bytes_moved,
                    regions: r.regions,
                    chunks: r.chunks,
                    tier: tier(r.tier),
                    strategy: strategy(r.strategy),
                    ..Default::default()
                };
                toolwork::open(snapshot.footprint(), ops.tool_work());
                replay_callback(|| tool.snapshot(info, Phase::Exit, &report));
                // PASS ENTER of pass 0 before the application's launch is submitted, with the
                // context toggles armed on a replay mask of its own; what they masked off is
                // carried into the pass loop's mask at API EXIT.
                let mask = cx.registry.begin_replay();
                {
                    let _armed = mask.arm();
                    replay_callback(|| tool.pass_enter(info, 0, total_passes));
                }
                let masked_at_pass0 = mask.masked_off();
                // The application's launch is pass 0: announced under pass 0's mask.
                *enqueued = ops.enqueue(info, Some(0));
                drop(mask);
                State::Ready {
                    lock,
                    plan: planned,
                    taken: Some(Box::new((snapshot, report))),
                    masked_at_pass0,
                }
            }
            Err(e) => {
                let decline = snapshot_decline(&e);
                tool.snapshot(
                    info,
                    Phase::Exit,
                    &MemoryOpReport {
                        bytes_moved: 0,
                        declined: Some(decline.reason),
                        ..planned
                    },
                );
                State::Declined(decline, None)
            }
        }
    }

    /// The dispatch this window is about.
    pub fn info(&self) -> &DispatchInfo {
        &self.info
    }

    /// Whether ENTER prepared a replay (locked, drained, snapshotted).
    pub fn is_ready(&self) -> bool {
        matches!(self.state, State::Ready { .. })
    }

    /// API EXIT of the launch: run the passes. `launched` is the driver's verdict on the
    /// application's own launch (`Err` with its error: nothing is replayed then).
    pub fn exit<T: ReplayTool + ?Sized, O: LaunchOps + ?Sized>(
        self,
        tool: &mut T,
        registry: &ContextRegistry,
        ops: &O,
        launched: Result<(), String>,
    ) -> ReplayRecord {
        // The passes run on the application's thread, inside its launch (see `enter`).
        let _no_cancel = NoCancel::now();
        let Window {
            info,
            answer,
            state,
            cost,
            mut enqueued,
        } = self;
        ops.mark(Mark::After);
        let pass0_masked = match &state {
            State::Ready {
                masked_at_pass0, ..
            } => Some(masked_at_pass0.clone()),
            _ => None,
        };
        if pass0_masked.is_none()
            && let Some(enqueued) = enqueued.take()
        {
            // The launch's one run was submitted.
            enqueued.exit();
        }
        let launch_ok = launched.is_ok();
        let mut device = ExitDevice {
            state,
            ops,
            launched,
            pass0_enqueued: enqueued,
        };
        let mut adapter = AfterEnter {
            inner: tool,
            answer,
            replaying: pass0_masked.is_some(),
            pass0_masked,
        };
        let mut record = run_dispatch(&mut adapter, &mut device, registry, &info);
        toolwork::close();
        if let Some(enqueued) = device.pass0_enqueued.take() {
            // Pass 0 was never run by the loop: its announcement still ends.
            enqueued.exit();
        }
        // The reader side of a launch run once (or what is left of a window) is given back
        // now: it covers the submission, done before API EXIT, not the kernel's run. Held
        // while its completion is waited for below, it kept every replay window on the device
        // waiting for that kernel, and for ever when the kernel waits for such a window.
        drop(device);
        if launch_ok && matches!(record.outcome, ReplayOutcome::RanOnce { .. }) {
            // Not replayed (opted out, one pass, declined): the application's launch was its
            // one run.
            ops.completed(&info, None);
        }
        record.cost.lock_wait += cost.lock_wait;
        record.cost.drain += cost.drain;
        record.cost.snapshot += cost.snapshot;
        record.cost.total += cost.lock_wait + cost.drain + cost.snapshot;
        record
    }
}

/// The tool as the loop sees it at API EXIT: CONFIG ENTER, the SNAPSHOT callbacks and PASS
/// ENTER of pass 0 were delivered at API ENTER already.
struct AfterEnter<'t, T: ?Sized> {
    inner: &'t mut T,
    answer: ToolAnswer,
    /// `Some` (what pass 0's toggles masked off) when PASS ENTER 0 was delivered at API ENTER.
    pass0_masked: Option<Vec<ContextId>>,
    /// ENTER took a snapshot: the callbacks run inside the replay window.
    replaying: bool,
}

impl<T: ReplayTool + ?Sized> ReplayTool for AfterEnter<'_, T> {
    fn limits(&self) -> kreplay_passloop::LoopLimits {
        self.inner.limits()
    }
    fn config_enter(&mut self, _info: &DispatchInfo) -> ToolAnswer {
        self.answer
    }
    fn pass_enter(&mut self, info: &DispatchInfo, pass: u64, total_passes: u64) {
        if pass == 0
            && let Some(masked) = self.pass0_masked.take()
        {
            // Delivered at API ENTER: only its toggles are carried into this loop's mask
            // (armed now), so the later passes see what the tool masked off there.
            for context in masked {
                let _ = kreplay_ctxmask::replay_stop_context(context);
            }
            return;
        }
        let inner = &mut self.inner;
        in_window(self.replaying, || {
            inner.pass_enter(info, pass, total_passes)
        })
    }
    fn pass_exit(&mut self, info: &DispatchInfo, pass: u64, total_passes: u64) -> ContinueChange {
        let inner = &mut self.inner;
        in_window(self.replaying, || inner.pass_exit(info, pass, total_passes))
    }
    fn should_continue(&mut self, info: &DispatchInfo, current: u64, total: u64) -> bool {
        let inner = &mut self.inner;
        in_window(self.replaying, || {
            inner.should_continue(info, current, total)
        })
    }
    fn snapshot(&mut self, _info: &DispatchInfo, _phase: Phase, _report: &MemoryOpReport) {}
    fn restore(
        &mut self,
        info: &DispatchInfo,
        phase: Phase,
        request: &RestoreRequest,
        report: &MemoryOpReport,
    ) {
        let inner = &mut self.inner;
        in_window(self.replaying, || {
            inner.restore(info, phase, request, report)
        })
    }
    fn config_exit(&mut self, info: &DispatchInfo, outcome: &ReplayOutcome) {
        self.inner.config_exit(info, outcome)
    }
}

/// The device at API EXIT (see the module docs).
struct ExitDevice<'o, O: ?Sized> {
    state: State,
    ops: &'o O,
    launched: Result<(), String>,
    /// The application's launch as announced at API ENTER, ended by pass 0 under its mask.
    pass0_enqueued: Option<Enqueued>,
}

fn snapshot_request(r: &RestoreRequest) -> kreplay_snapshot::RestoreRequest {
    kreplay_snapshot::RestoreRequest {
        next_pass: r.next_pass,
        may_be_final: r.next_may_be_final,
    }
}

fn restore_report(r: &kreplay_snapshot::RestoreReport) -> MemoryOpReport {
    MemoryOpReport {
        bytes_planned: r.bytes_planned,
        bytes_moved: r.bytes_moved,
        regions: r.regions,
        chunks: r.chunks_restored,
        tier: tier(r.tier),
        strategy: strategy(r.strategy).as_run(r.unverified),
        repaired_chunks: r.repaired_chunks,
        unverified: r.unverified,
        ..Default::default()
    }
}

impl<O: LaunchOps + ?Sized> ReplayDevice for ExitDevice<'_, O> {
    type Snapshot = Snapshot;

    fn check_replayable(&mut self, _info: &DispatchInfo) -> Result<(), Decline> {
        match &self.state {
            State::Declined(d, _) => Err(d.clone()),
            State::Ordinary(_) => Err(Decline::new(
                DeclineReason::SnapshotFailed,
                "no snapshot was taken before the launch",
            )),
            State::Ready { .. } => Ok(()),
        }
    }

    fn lock_agent(&mut self, _info: &DispatchInfo) -> Result<(), Decline> {
        // Taken at API ENTER, before the drain.
        Ok(())
    }

    fn unlock_agent(&mut self, _info: &DispatchInfo) {
        if let State::Ready { lock, .. } = &mut self.state {
            lock.clear();
        }
    }

    fn drain(&mut self, _info: &DispatchInfo) -> Result<(), Decline> {
        // Done at API ENTER, before the application's launch was submitted.
        Ok(())
    }

    fn plan_snapshot(&mut self, _info: &DispatchInfo) -> Result<MemoryOpReport, Decline> {
        match &self.state {
            State::Ready { plan, .. } => Ok(*plan),
            _ => Err(Decline::new(DeclineReason::SnapshotFailed, "no snapshot")),
        }
    }

    fn take_snapshot(
        &mut self,
        _info: &DispatchInfo,
        // Taken at API ENTER, told the restores planned there.
        _request: &SnapshotRequest,
    ) -> Result<(Snapshot, MemoryOpReport), Decline> {
        match &mut self.state {
            State::Ready { taken, .. } => taken
                .take()
                .map(|b| *b)
                .ok_or_else(|| Decline::new(DeclineReason::SnapshotFailed, "snapshot used up")),
            _ => Err(Decline::new(DeclineReason::SnapshotFailed, "no snapshot")),
        }
    }

    fn run_pass(&mut self, info: &DispatchInfo, pass: u64) -> Result<(), Decline> {
        if pass == 0 {
            // The application's own launch, submitted before API EXIT.
            if let Some(enqueued) = self.pass0_enqueued.take() {
                enqueued.exit();
            }
            if let Err(why) = &self.launched {
                return Err(Decline::new(
                    DeclineReason::PassDrainStuck,
                    format!("the application's launch failed: {why}"),
                ));
            }
        } else {
            let enqueued = self.ops.enqueue(info, Some(pass));
            self.ops.mark(Mark::Before);
            let relaunched = self.ops.relaunch();
            self.ops.mark(Mark::After);
            if let Some(enqueued) = enqueued {
                enqueued.exit();
            }
            // The restore before this pass put back the bytes from before the application's
            // launch: a pass that does not run to its end leaves memory that no ordinary run
            // leaves, and nothing can run the kernel again to mend it. Say so.
            relaunched.map_err(|why| {
                Decline::new(
                    DeclineReason::PassDrainStuck,
                    format!(
                        "re-launch of pass {pass} failed: {why}; device memory does NOT match an \
                         ordinary run: it holds the bytes from before the application's \
                         launch, whose writes are undone"
                    ),
                )
            })?;
        }
        // Waited for however long it runs, with a warning every interval while it lasts.
        let watched = self.ops.watchdog().map(|w| {
            w.watch(crate::watchdog::PassWait {
                device: info.agent_id,
                dispatch: info.dispatch_id,
                pass,
            })
        });
        let waited = self.ops.wait();
        drop(watched);
        waited.map_err(|why| {
            let memory = if pass == 0 {
                String::new()
            } else {
                "; device memory does NOT match an ordinary run: the application's \
                 launch's writes are undone and this pass did not finish"
                    .to_owned()
            };
            Decline::new(
                DeclineReason::PassDrainStuck,
                format!("pass {pass} did not complete: {why}{memory}"),
            )
        })?;
        self.ops.completed(info, Some(pass));
        Ok(())
    }

    fn plan_restore(
        &mut self,
        _info: &DispatchInfo,
        snapshot: &Snapshot,
        request: &RestoreRequest,
    ) -> MemoryOpReport {
        let plan = snapshot.plan_restore(&snapshot_request(request));
        MemoryOpReport {
            bytes_planned: plan.bytes_planned,
            regions: snapshot.regions().len() as u64,
            tier: tier(snapshot.tier()),
            strategy: strategy(plan.strategy),
            ..Default::default()
        }
    }

    fn restore(
        &mut self,
        _info: &DispatchInfo,
        snapshot: &mut Snapshot,
        request: &RestoreRequest,
    ) -> Result<MemoryOpReport, RestoreFailure> {
        // What the tool's work changed since the last restore is brought back from now on.
        toolwork::fold_into(snapshot);
        snapshot
            .restore(&snapshot_request(request))
            .map(|r| restore_report(&r))
            .map_err(|e| RestoreFailure {
                report: restore_report(&e.report),
                bytes_unrestored: e.bytes_lost,
                detail: e.to_string(),
            })
    }

    fn discard_snapshot(&mut self, _info: &DispatchInfo, snapshot: Snapshot) {
        drop(snapshot);
    }

    fn run_once(&mut self, _info: &DispatchInfo) {
        // The application's launch was submitted between API ENTER and EXIT: it is the one run.
    }

    fn fire_completion(&mut self, _info: &DispatchInfo) {
        // Nothing is withheld on CUDA: the application's launch sits in its stream in order,
        // and every later operation on that stream waits for it (and for the re-launches,
        // which were waited for before API EXIT returns).
    }
}

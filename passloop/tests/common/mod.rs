//! A test device over host memory and a scripted tool, both recording what happens into one
//! shared event log.
//!
//! The device's "kernel" does `x += 1` over every element of several buffers; its snapshot is a
//! real copy of the buffers and its restore writes the copy back (unless disabled), so the tests
//! can compare final memory with one ordinary run.

// Each test binary uses a different part of this module.
#![allow(dead_code)]

use std::cell::RefCell;
use std::rc::Rc;

use kreplay_ctxmask::{ContextId, ContextRegistry};
use kreplay_passloop::{
    ContinueChange, Decline, DeclineReason, DispatchInfo, LoopLimits, MemoryOpReport, Phase,
    ReplayDevice, ReplayOutcome, ReplayRecord, ReplayTool, RestoreFailure, RestoreRequest,
    RestoreStrategy, SnapshotRequest, StoreTier, ToolAnswer, run_dispatch,
};

/// One thing the tool was told or the device was asked to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    ConfigEnter,
    CheckReplayable,
    Lock,
    Drain,
    PlanSnapshot,
    SnapshotEnter { planned: u64, moved: u64 },
    TakeSnapshot,
    SnapshotExit { planned: u64, moved: u64 },
    PassEnter { pass: u64, total: u64 },
    RunPass(u64),
    PassExit { pass: u64, total: u64 },
    Continue { pass: u64, total: u64 },
    PlanRestore(RestoreRequest),
    RestoreEnter { next_pass: u64, planned: u64 },
    Restore(RestoreRequest),
    RestoreExit { next_pass: u64, moved: u64 },
    DiscardSnapshot,
    ConfigExit(ReplayOutcome),
    RunOnce,
    FireCompletion,
    Unlock,
}

/// The shared, ordered event log.
pub type Log = Rc<RefCell<Vec<Event>>>;

pub fn new_log() -> Log {
    Rc::new(RefCell::new(Vec::new()))
}

/// The dispatch every test replays.
pub const INFO: DispatchInfo = DispatchInfo {
    agent_id: 1,
    queue_id: 2,
    kernel_id: 3,
    dispatch_id: 7,
    private_segment_size: 16,
    group_segment_size: 256,
    workgroup_size: [64, 1, 1],
    grid_size: [1024, 1, 1],
};

/// Which device step fails, and how.
#[derive(Default)]
pub struct Faults {
    pub not_replayable: Option<Decline>,
    pub lock: Option<Decline>,
    pub drain: Option<Decline>,
    /// Acquiring the passes' resources fails.
    pub prepare: Option<Decline>,
    pub plan_snapshot: Option<Decline>,
    pub take_snapshot: Option<Decline>,
    /// This pass runs its kernel but its completion handlers never drain.
    pub stuck_pass: Option<(u64, Decline)>,
    /// The restore before this pass writes back the first buffer only, then fails.
    pub failing_restore_before: Option<u64>,
}

/// The snapshot of [`HostDevice`]: a copy of every buffer.
pub struct HostSnapshot {
    buffers: Vec<Vec<u64>>,
}

/// A device over host memory; see the module docs.
pub struct HostDevice {
    pub log: Log,
    pub buffers: Vec<Vec<u64>>,
    pub faults: Faults,
    /// When set, `restore` reports success but writes nothing back.
    pub restore_disabled: bool,
    /// When set, a restore not asked to be exact reports itself unverified (as the explicitly
    /// unverified write set does), though it writes everything back.
    pub unverified_unless_final: bool,
    pub lock_held: bool,
    pub unlocks: u32,
    /// How often the application's completion fired (through run_once or fire_completion).
    pub completions: u32,
    pub live_snapshots: u32,
    /// How often `prepare` succeeded.
    pub prepared: u32,
    /// The passes' resources are held (from `prepare` until the lock is released).
    pub holds_resources: bool,
    /// The registry whose active contexts each pass's dispatch observes.
    pub registry: Rc<ContextRegistry>,
    /// `registry.active_contexts()` as seen by each pass's dispatch.
    pub active_per_pass: Vec<Vec<ContextId>>,
    /// What each `take_snapshot` was asked to take the snapshot for.
    pub snapshot_requests: Vec<SnapshotRequest>,
}

/// Element count of each test buffer (different sizes, so bytes add up distinctly).
pub const BUFFER_LENS: [usize; 3] = [16, 40, 8];

pub fn initial_buffers() -> Vec<Vec<u64>> {
    BUFFER_LENS
        .iter()
        .enumerate()
        .map(|(b, &len)| (0..len as u64).map(|i| 1000 * b as u64 + i * 7).collect())
        .collect()
}

/// Memory after one ordinary (unreplayed) run of the kernel.
pub fn after_one_run() -> Vec<Vec<u64>> {
    after_runs(1)
}

/// Memory after `runs` unrestored runs of the kernel.
pub fn after_runs(runs: u64) -> Vec<Vec<u64>> {
    initial_buffers()
        .into_iter()
        .map(|buffer| buffer.into_iter().map(|x| x + runs).collect())
        .collect()
}

pub fn footprint_bytes() -> u64 {
    (BUFFER_LENS.iter().sum::<usize>() * 8) as u64
}

impl HostDevice {
    pub fn new(log: &Log, registry: &Rc<ContextRegistry>) -> Self {
        HostDevice {
            log: log.clone(),
            buffers: initial_buffers(),
            faults: Faults::default(),
            restore_disabled: false,
            unverified_unless_final: false,
            lock_held: false,
            unlocks: 0,
            completions: 0,
            live_snapshots: 0,
            prepared: 0,
            holds_resources: false,
            registry: registry.clone(),
            active_per_pass: Vec::new(),
            snapshot_requests: Vec::new(),
        }
    }

    fn push(&self, event: Event) {
        self.log.borrow_mut().push(event);
    }

    /// The kernel: `x += 1` over every buffer.
    fn kernel(&mut self) {
        for buffer in &mut self.buffers {
            for x in buffer.iter_mut() {
                *x += 1;
            }
        }
    }

    fn assert_locked(&self, step: &str) {
        assert!(self.lock_held, "{step} ran without the agent lock");
    }

    fn plan(&self) -> MemoryOpReport {
        MemoryOpReport {
            bytes_planned: footprint_bytes(),
            bytes_moved: 0,
            regions: self.buffers.len() as u64,
            chunks: self.buffers.len() as u64,
            tier: StoreTier::Host,
            strategy: RestoreStrategy::Full,
            ..Default::default()
        }
    }
}

impl ReplayDevice for HostDevice {
    type Snapshot = HostSnapshot;

    fn check_replayable(&mut self, _info: &DispatchInfo) -> Result<(), Decline> {
        self.push(Event::CheckReplayable);
        self.faults.not_replayable.clone().map_or(Ok(()), Err)
    }

    fn lock_agent(&mut self, _info: &DispatchInfo) -> Result<(), Decline> {
        self.push(Event::Lock);
        assert!(!self.lock_held, "lock taken twice");
        if let Some(decline) = self.faults.lock.clone() {
            return Err(decline);
        }
        self.lock_held = true;
        Ok(())
    }

    fn unlock_agent(&mut self, _info: &DispatchInfo) {
        self.push(Event::Unlock);
        assert!(self.lock_held, "unlock without lock");
        self.lock_held = false;
        self.holds_resources = false;
        self.unlocks += 1;
    }

    fn drain(&mut self, _info: &DispatchInfo) -> Result<(), Decline> {
        self.push(Event::Drain);
        self.assert_locked("drain");
        self.faults.drain.clone().map_or(Ok(()), Err)
    }

    fn prepare(&mut self, _info: &DispatchInfo) -> Result<(), Decline> {
        self.assert_locked("prepare");
        if let Some(decline) = self.faults.prepare.clone() {
            return Err(decline);
        }
        self.prepared += 1;
        self.holds_resources = true;
        Ok(())
    }

    fn plan_snapshot(&mut self, _info: &DispatchInfo) -> Result<MemoryOpReport, Decline> {
        self.push(Event::PlanSnapshot);
        self.assert_locked("plan_snapshot");
        assert!(
            self.holds_resources,
            "the passes' resources are acquired before the snapshot"
        );
        match self.faults.plan_snapshot.clone() {
            Some(decline) => Err(decline),
            None => Ok(self.plan()),
        }
    }

    fn take_snapshot(
        &mut self,
        _info: &DispatchInfo,
        request: &SnapshotRequest,
    ) -> Result<(HostSnapshot, MemoryOpReport), Decline> {
        self.push(Event::TakeSnapshot);
        self.snapshot_requests.push(*request);
        self.assert_locked("take_snapshot");
        if let Some(decline) = self.faults.take_snapshot.clone() {
            return Err(decline);
        }
        self.live_snapshots += 1;
        let report = MemoryOpReport {
            bytes_moved: footprint_bytes(),
            ..self.plan()
        };
        Ok((
            HostSnapshot {
                buffers: self.buffers.clone(),
            },
            report,
        ))
    }

    fn run_pass(&mut self, _info: &DispatchInfo, pass: u64) -> Result<(), Decline> {
        self.push(Event::RunPass(pass));
        self.assert_locked("run_pass");
        // What the services of this pass's dispatch see.
        self.active_per_pass.push(self.registry.active_contexts());
        self.kernel();
        match &self.faults.stuck_pass {
            Some((stuck, decline)) if *stuck == pass => Err(decline.clone()),
            _ => Ok(()),
        }
    }

    fn plan_restore(
        &mut self,
        _info: &DispatchInfo,
        snapshot: &HostSnapshot,
        request: &RestoreRequest,
    ) -> MemoryOpReport {
        self.push(Event::PlanRestore(*request));
        let bytes = snapshot.buffers.iter().map(|b| b.len() as u64 * 8).sum();
        MemoryOpReport {
            bytes_planned: bytes,
            ..self.plan()
        }
    }

    fn restore(
        &mut self,
        _info: &DispatchInfo,
        snapshot: &mut HostSnapshot,
        request: &RestoreRequest,
    ) -> Result<MemoryOpReport, RestoreFailure> {
        self.push(Event::Restore(*request));
        self.assert_locked("restore");
        let planned = MemoryOpReport {
            bytes_planned: footprint_bytes(),
            ..self.plan()
        };
        if self.restore_disabled {
            return Ok(planned);
        }
        if self.faults.failing_restore_before == Some(request.next_pass) {
            self.buffers[0].copy_from_slice(&snapshot.buffers[0]);
            let moved = snapshot.buffers[0].len() as u64 * 8;
            return Err(RestoreFailure {
                report: MemoryOpReport {
                    bytes_moved: moved,
                    chunks: 1,
                    ..planned
                },
                bytes_unrestored: footprint_bytes() - moved,
                detail: "copy engine fault on buffer 1".into(),
            });
        }
        for (buffer, saved) in self.buffers.iter_mut().zip(&snapshot.buffers) {
            buffer.copy_from_slice(saved);
        }
        Ok(MemoryOpReport {
            bytes_moved: footprint_bytes(),
            unverified: self.unverified_unless_final && !request.next_may_be_final,
            ..planned
        })
    }

    fn discard_snapshot(&mut self, _info: &DispatchInfo, snapshot: HostSnapshot) {
        self.push(Event::DiscardSnapshot);
        drop(snapshot);
        self.live_snapshots -= 1;
    }

    fn run_once(&mut self, _info: &DispatchInfo) {
        self.push(Event::RunOnce);
        self.kernel();
        self.completions += 1;
    }

    fn fire_completion(&mut self, _info: &DispatchInfo) {
        self.push(Event::FireCompletion);
        self.completions += 1;
    }
}

type PassHook = Box<dyn FnMut(u64)>;

/// No test runs this many passes: a loop reaching it is a bug, and the test fails instead of
/// running forever.
const RUNAWAY_PASSES: u64 = 1000;

/// A tool that answers CONFIG ENTER with a fixed answer and runs scripted hooks.
pub struct ScriptedTool {
    pub log: Log,
    pub answer: ToolAnswer,
    /// The continue callback: `(current_pass, total_passes) -> keep going?`.
    pub keep_going: Box<dyn FnMut(u64, u64) -> bool>,
    /// Runs inside PASS ENTER (the toggles are armed there).
    pub on_pass_enter: PassHook,
    /// PASS EXIT's answer about the continue callback.
    pub on_pass_exit: Box<dyn FnMut(u64) -> ContinueChange>,
    /// Runs at the start of every callback with the callback's name.
    pub on_any_callback: Box<dyn FnMut(&'static str)>,
    pub outcomes: Vec<ReplayOutcome>,
    /// The limits the tool hands the loop.
    pub limits: LoopLimits,
    /// The reports of every SNAPSHOT and RESTORE EXIT, in order.
    pub exit_reports: Vec<MemoryOpReport>,
}

impl ScriptedTool {
    pub fn new(log: &Log, answer: ToolAnswer) -> Self {
        ScriptedTool {
            log: log.clone(),
            answer,
            keep_going: Box::new(|_, _| true),
            on_pass_enter: Box::new(|_| {}),
            on_pass_exit: Box::new(|_| ContinueChange::Keep),
            on_any_callback: Box::new(|_| {}),
            outcomes: Vec::new(),
            limits: LoopLimits::default(),
            exit_reports: Vec::new(),
        }
    }

    fn push(&self, event: Event) {
        self.log.borrow_mut().push(event);
    }
}

impl ReplayTool for ScriptedTool {
    fn limits(&self) -> LoopLimits {
        self.limits
    }

    fn config_enter(&mut self, _info: &DispatchInfo) -> ToolAnswer {
        (self.on_any_callback)("config_enter");
        self.push(Event::ConfigEnter);
        self.answer
    }

    fn pass_enter(&mut self, info: &DispatchInfo, pass: u64, total_passes: u64) {
        assert_eq!(info, &INFO, "every pass carries the same dispatch");
        assert!(
            total_passes == 0 || pass < total_passes,
            "pass {pass} entered beyond N = {total_passes}"
        );
        assert!(pass < RUNAWAY_PASSES, "runaway replay loop");
        (self.on_any_callback)("pass_enter");
        self.push(Event::PassEnter {
            pass,
            total: total_passes,
        });
        (self.on_pass_enter)(pass);
    }

    fn pass_exit(&mut self, _info: &DispatchInfo, pass: u64, total_passes: u64) -> ContinueChange {
        (self.on_any_callback)("pass_exit");
        self.push(Event::PassExit {
            pass,
            total: total_passes,
        });
        (self.on_pass_exit)(pass)
    }

    fn should_continue(
        &mut self,
        _info: &DispatchInfo,
        current_pass: u64,
        total_passes: u64,
    ) -> bool {
        assert!(
            total_passes == 0 || current_pass + 1 < total_passes,
            "continue consulted after the last pass ({current_pass} of {total_passes})"
        );
        (self.on_any_callback)("should_continue");
        self.push(Event::Continue {
            pass: current_pass,
            total: total_passes,
        });
        (self.keep_going)(current_pass, total_passes)
    }

    fn snapshot(&mut self, _info: &DispatchInfo, phase: Phase, report: &MemoryOpReport) {
        (self.on_any_callback)("snapshot");
        let (planned, moved) = (report.bytes_planned, report.bytes_moved);
        if phase == Phase::Exit {
            self.exit_reports.push(*report);
        }
        self.push(match phase {
            Phase::Enter => Event::SnapshotEnter { planned, moved },
            Phase::Exit => Event::SnapshotExit { planned, moved },
        });
    }

    fn restore(
        &mut self,
        _info: &DispatchInfo,
        phase: Phase,
        request: &RestoreRequest,
        report: &MemoryOpReport,
    ) {
        (self.on_any_callback)("restore");
        let next_pass = request.next_pass;
        if phase == Phase::Exit {
            self.exit_reports.push(*report);
        }
        self.push(match phase {
            Phase::Enter => Event::RestoreEnter {
                next_pass,
                planned: report.bytes_planned,
            },
            Phase::Exit => Event::RestoreExit {
                next_pass,
                moved: report.bytes_moved,
            },
        });
    }

    fn config_exit(&mut self, _info: &DispatchInfo, outcome: &ReplayOutcome) {
        (self.on_any_callback)("config_exit");
        self.push(Event::ConfigExit(outcome.clone()));
        self.outcomes.push(outcome.clone());
    }
}

/// A fresh log, registry, device and tool answering `answer`.
pub fn setup(answer: ToolAnswer) -> (Log, Rc<ContextRegistry>, HostDevice, ScriptedTool) {
    let log = new_log();
    let registry = Rc::new(ContextRegistry::new());
    let device = HostDevice::new(&log, &registry);
    let tool = ScriptedTool::new(&log, answer);
    (log, registry, device, tool)
}

/// Runs [`INFO`] through the loop.
pub fn run(tool: &mut ScriptedTool, device: &mut HostDevice) -> ReplayRecord {
    let registry = device.registry.clone();
    run_dispatch(tool, device, &registry, &INFO)
}

/// Checks what must hold after every dispatch, whatever its path: the application's completion
/// fired exactly once, the lock is not held (and was released as often as taken), the tool got
/// exactly one CONFIG EXIT with the record's outcome, no snapshot is left alive.
pub fn assert_dispatch_closed(log: &Log, device: &HostDevice, record: &ReplayRecord) {
    let events = log.borrow();
    assert_eq!(device.completions, 1, "completion must fire exactly once");
    assert!(!device.lock_held, "lock still held");
    let locks_taken = events
        .iter()
        .filter(|e| **e == Event::Lock)
        .count()
        .saturating_sub(usize::from(device.faults.lock.is_some()));
    assert_eq!(
        device.unlocks as usize, locks_taken,
        "lock/unlock imbalance"
    );
    assert_eq!(device.live_snapshots, 0, "snapshot not discarded");
    let exits: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::ConfigExit(outcome) => Some(outcome.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(exits, vec![record.outcome.clone()]);
    assert_eq!(events.first(), Some(&Event::ConfigEnter));
}

/// A decline used by fault injection.
pub fn decline(reason: DeclineReason) -> Decline {
    Decline::new(reason, format!("injected {}", reason.as_str()))
}

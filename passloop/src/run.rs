//! The loop itself.

use std::time::Instant;

use kreplay_ctxmask::ContextRegistry;

use crate::{
    ContinueChange, Decline, DispatchInfo, LoopEnd, LoopLimits, MemoryOpReport, Phase,
    RanOnceReason, ReplayCost, ReplayDevice, ReplayOutcome, ReplayPlan, ReplayRecord, ReplayTool,
    RestoreRequest, SnapshotRequest,
};

/// Runs one dispatch through the callback flow of docs/abi.md §2 and returns what happened and what it cost.
///
/// ```text
/// CONFIG ENTER ; plan from the pass-count table and the tool's limits
///   [replay] check_replayable ; lock ; drain ; prepare ; SNAPSHOT ENTER/EXIT ; begin_replay
///            for each pass: PASS ENTER (armed) ; run_pass ; PASS EXIT ;
///                           stop if last / cap reached / budget spent / continue says so ;
///                           else RESTORE ENTER/EXIT
///            end replay mask ; discard snapshot
/// CONFIG EXIT
/// run_once (not replayed) or fire_completion (replayed) — exactly one of them, once
/// unlock (if locked)
/// ```
///
/// A decline at any step before the first pass runs the dispatch once and leaves memory as
/// one ordinary run; a stuck pass or a failed restore stops the loop and is reported in the
/// outcome (see [`ReplayRecord::diagnostic`]). The agent lock is released on every path, also
/// when a tool or device callback unwinds. The toggles of `registry`'s replay mask are armed
/// during PASS ENTER only.
///
/// When a callback unwinds, releasing the lock (and resetting the replay mask) is all the loop
/// does on the way out: it calls neither `run_once` nor `fire_completion`, nor
/// `discard_snapshot` (the snapshot value is dropped), and delivers no CONFIG EXIT. Device
/// memory is as the last step before the panic left it (after a pass, that pass's writes,
/// unrestored). A backend that catches the unwind must complete the dispatch itself, or the
/// application waits for it for ever.
pub fn run_dispatch<T, D>(
    tool: &mut T,
    device: &mut D,
    registry: &ContextRegistry,
    info: &DispatchInfo,
) -> ReplayRecord
where
    T: ReplayTool + ?Sized,
    D: ReplayDevice + ?Sized,
{
    let started = Instant::now();
    let limits = tool.limits();
    let mut run = Run {
        tool,
        registry,
        info,
        cost: ReplayCost::default(),
        limits,
        started,
    };
    let plan = ReplayPlan::from_answer_within(&run.tool.config_enter(info), &limits);
    let (outcome, total_passes) = match plan {
        ReplayPlan::Once(why) => (run.finish(device, ReplayOutcome::RanOnce { why }), 0),
        ReplayPlan::Replay {
            total_passes,
            has_continue,
        } => (run.replay(device, total_passes, has_continue), total_passes),
    };
    let mut cost = run.cost;
    cost.total = started.elapsed();
    ReplayRecord {
        info: *info,
        outcome,
        total_passes,
        cost,
    }
}

fn declined(decline: Decline) -> ReplayOutcome {
    ReplayOutcome::RanOnce {
        why: RanOnceReason::Declined(decline),
    }
}

/// The agent's writer lock, held from `lock_agent` until dropped (on every path, unwinding
/// included). All device steps under the lock go through it.
struct AgentLock<'a, D: ReplayDevice + ?Sized> {
    device: &'a mut D,
    info: &'a DispatchInfo,
}

impl<D: ReplayDevice + ?Sized> Drop for AgentLock<'_, D> {
    fn drop(&mut self) {
        self.device.unlock_agent(self.info);
    }
}

/// One dispatch on its way through the loop.
struct Run<'a, T: ?Sized> {
    tool: &'a mut T,
    registry: &'a ContextRegistry,
    info: &'a DispatchInfo,
    cost: ReplayCost,
    limits: LoopLimits,
    started: Instant,
}

impl<T: ReplayTool + ?Sized> Run<'_, T> {
    /// Delivers CONFIG EXIT, then completes the dispatch exactly once: dispatches that ran no
    /// pass run once unchanged (their own completion included), replayed ones get the withheld
    /// application completion fired. This is the only place either happens.
    fn finish<D: ReplayDevice + ?Sized>(
        &mut self,
        device: &mut D,
        outcome: ReplayOutcome,
    ) -> ReplayOutcome {
        self.tool.config_exit(self.info, &outcome);
        match outcome {
            ReplayOutcome::RanOnce { .. } => device.run_once(self.info),
            ReplayOutcome::Replayed { .. }
            | ReplayOutcome::PassFailed { .. }
            | ReplayOutcome::RestoreFailed { .. } => device.fire_completion(self.info),
        }
        outcome
    }

    /// The replay path: gate, lock, then the locked steps; finishes on every path.
    fn replay<D: ReplayDevice + ?Sized>(
        &mut self,
        device: &mut D,
        total_passes: u64,
        has_continue: bool,
    ) -> ReplayOutcome {
        let info = self.info;
        if let Err(decline) = device.check_replayable(info) {
            return self.finish(device, declined(decline));
        }
        let waited = Instant::now();
        let locked = device.lock_agent(info);
        self.cost.lock_wait = waited.elapsed();
        if let Err(decline) = locked {
            return self.finish(device, declined(decline));
        }
        let lock = AgentLock { device, info };
        let outcome = self.replay_locked(&mut *lock.device, total_passes, has_continue);
        self.finish(&mut *lock.device, outcome)
        // `lock` drops here: the agent is released after the completion.
    }

    /// Drain, snapshot and passes, with the agent locked. The caller finishes.
    fn replay_locked<D: ReplayDevice + ?Sized>(
        &mut self,
        device: &mut D,
        total_passes: u64,
        has_continue: bool,
    ) -> ReplayOutcome {
        let info = self.info;
        let draining = Instant::now();
        let drained = device.drain(info);
        self.cost.drain = draining.elapsed();
        if let Err(decline) = drained {
            return declined(decline);
        }
        // Everything the passes need, before the point of no return.
        if let Err(decline) = device.prepare(info) {
            return declined(decline);
        }

        let planning = Instant::now();
        let planned = device.plan_snapshot(info);
        self.cost.snapshot = planning.elapsed();
        let plan = match planned {
            Ok(plan) => plan,
            Err(decline) => return declined(decline),
        };
        self.tool.snapshot(info, Phase::Enter, &plan);
        let copying = Instant::now();
        let taken = device.take_snapshot(info, &SnapshotRequest::for_passes(total_passes));
        self.cost.snapshot += copying.elapsed();
        let mut snapshot = match taken {
            Ok((snapshot, report)) => {
                self.cost.bytes_snapshotted = report.bytes_moved;
                self.tool.snapshot(info, Phase::Exit, &report);
                snapshot
            }
            Err(decline) => {
                let nothing_kept = MemoryOpReport {
                    bytes_moved: 0,
                    declined: Some(decline.reason),
                    ..plan
                };
                self.tool.snapshot(info, Phase::Exit, &nothing_kept);
                return declined(decline);
            }
        };

        let outcome = self.run_passes(device, &mut snapshot, total_passes, has_continue);
        device.discard_snapshot(info, snapshot);
        outcome
    }

    /// The passes, with restores between them. The replay mask lives exactly as long as this.
    fn run_passes<D: ReplayDevice + ?Sized>(
        &mut self,
        device: &mut D,
        snapshot: &mut D::Snapshot,
        total: u64,
        mut continue_set: bool,
    ) -> ReplayOutcome {
        let info = self.info;
        let mask = self.registry.begin_replay();
        // Pass 0 runs on the application's own bytes, so stopping after it is always exact; a
        // later pass may be final only when the restore before it was exact: asked to be, or
        // not the explicitly unverified kind (so a continue callback the tool installs at a PASS
        // EXIT is asked right after that pass, unless the restore before it was unverified).
        let mut may_be_final = true;
        let mut pass = 0u64;
        loop {
            {
                let _armed = mask.arm();
                self.tool.pass_enter(info, pass, total);
            }
            let running = Instant::now();
            let ran = device.run_pass(info, pass);
            self.cost.pass_times.push(running.elapsed());
            self.cost.passes_run += 1;
            match self.tool.pass_exit(info, pass, total) {
                ContinueChange::Keep => {}
                ContinueChange::Set => continue_set = true,
                ContinueChange::Clear => continue_set = false,
            }
            if let Err(decline) = ran {
                return ReplayOutcome::PassFailed { pass, decline };
            }

            let passes = pass + 1;
            if total != 0 && passes == total {
                return ReplayOutcome::Replayed {
                    passes,
                    end: LoopEnd::LastPass,
                };
            }
            // kreplay's own limits end the loop before the tool's plan; the restore before this
            // pass was exact (indefinite loops and budgets always restore exactly).
            if may_be_final {
                if total == 0 && passes >= self.limits.max_passes {
                    return ReplayOutcome::Replayed {
                        passes,
                        end: LoopEnd::MaxPasses,
                    };
                }
                if self
                    .limits
                    .budget
                    .is_some_and(|budget| self.started.elapsed() >= budget)
                {
                    return ReplayOutcome::Replayed {
                        passes,
                        end: LoopEnd::Budget,
                    };
                }
            }
            if may_be_final {
                if continue_set && !self.tool.should_continue(info, pass, total) {
                    return ReplayOutcome::Replayed {
                        passes,
                        end: LoopEnd::ContinueStopped,
                    };
                }
                if total == 0 && !continue_set {
                    return ReplayOutcome::Replayed {
                        passes,
                        end: LoopEnd::ContinueCleared,
                    };
                }
            }

            let request = RestoreRequest {
                completed_pass: pass,
                next_pass: passes,
                next_may_be_final: total == 0
                    || continue_set
                    || passes + 1 == total
                    || self.limits.budget.is_some(),
            };
            let planning = Instant::now();
            let planned = device.plan_restore(info, snapshot, &request);
            let plan_time = planning.elapsed();
            self.tool.restore(info, Phase::Enter, &request, &planned);
            let restoring = Instant::now();
            let restored = device.restore(info, snapshot, &request);
            self.cost
                .restore_times
                .push(plan_time + restoring.elapsed());
            match restored {
                Ok(report) => {
                    self.cost.bytes_restored += report.bytes_moved;
                    self.tool.restore(info, Phase::Exit, &request, &report);
                    may_be_final = request.next_may_be_final || !report.unverified;
                }
                Err(failure) => {
                    self.cost.bytes_restored += failure.report.bytes_moved;
                    let report = MemoryOpReport {
                        failed: true,
                        bytes_lost: failure.bytes_unrestored,
                        ..failure.report
                    };
                    self.tool.restore(info, Phase::Exit, &request, &report);
                    return ReplayOutcome::RestoreFailed {
                        after_pass: pass,
                        failure,
                    };
                }
            }
            pass = passes;
        }
    }
}

//! Why a dispatch was not replayed, how a replay ended, and what it cost.

use std::fmt;
use std::time::Duration;

use crate::{DispatchInfo, MemoryOpReport};

/// Why a replay was declined or stopped (docs/abi.md §3, §4). Every declined replay carries one.
///
/// `#[non_exhaustive]`: new reasons may come; a match outside this crate needs a wildcard arm.
///
/// ```compile_fail
/// use kreplay_passloop::DeclineReason;
///
/// fn memory(reason: DeclineReason) -> bool {
///     match reason {
///         DeclineReason::UntrackedMemory
///         | DeclineReason::FootprintBudget
///         | DeclineReason::SnapshotFailed => true,
///         DeclineReason::QueueDrainStuck
///         | DeclineReason::AgentDrainStuck
///         | DeclineReason::PassDrainStuck
///         | DeclineReason::ReentrantDispatch
///         | DeclineReason::InvalidPassCount
///         | DeclineReason::BatchOrGraph => false,
///     }
/// }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeclineReason {
    /// Memory the kernel may touch is not covered by the allocation inventory.
    UntrackedMemory,
    /// The snapshot would exceed the configured or available budget.
    FootprintBudget,
    /// Taking the snapshot failed (out of memory, copy failed).
    SnapshotFailed,
    /// The dispatch's queue did not drain in time.
    QueueDrainStuck,
    /// A sibling queue or an async copy on the agent did not drain in time.
    AgentDrainStuck,
    /// A pass (its kernel or a completion handler) did not finish in time.
    PassDrainStuck,
    /// The dispatch was issued from inside a replay callback on the same agent.
    ReentrantDispatch,
    /// The tool returned 0 passes without a continue callback, or more passes than the cap
    /// ([`LoopLimits::max_passes`](crate::LoopLimits::max_passes)).
    InvalidPassCount,
    /// The dispatch is part of a graph launch or a multi-packet batch.
    BatchOrGraph,
}

impl DeclineReason {
    /// All reasons, in the order of docs/abi.md §4.
    pub const ALL: [DeclineReason; 9] = [
        DeclineReason::UntrackedMemory,
        DeclineReason::FootprintBudget,
        DeclineReason::SnapshotFailed,
        DeclineReason::QueueDrainStuck,
        DeclineReason::AgentDrainStuck,
        DeclineReason::PassDrainStuck,
        DeclineReason::ReentrantDispatch,
        DeclineReason::InvalidPassCount,
        DeclineReason::BatchOrGraph,
    ];

    /// The snake_case name of the reason (docs/abi.md §4).
    pub fn as_str(self) -> &'static str {
        match self {
            DeclineReason::UntrackedMemory => "untracked_memory",
            DeclineReason::FootprintBudget => "footprint_budget",
            DeclineReason::SnapshotFailed => "snapshot_failed",
            DeclineReason::QueueDrainStuck => "queue_drain_stuck",
            DeclineReason::AgentDrainStuck => "agent_drain_stuck",
            DeclineReason::PassDrainStuck => "pass_drain_stuck",
            DeclineReason::ReentrantDispatch => "reentrant_dispatch",
            DeclineReason::InvalidPassCount => "invalid_pass_count",
            DeclineReason::BatchOrGraph => "batch_or_graph",
        }
    }
}

impl fmt::Display for DeclineReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A reason with a human-readable detail (what was stuck, how many bytes were missing, ...).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decline {
    /// The reason (docs/abi.md §4).
    pub reason: DeclineReason,
    /// Free-form detail for diagnostics.
    pub detail: String,
}

impl Decline {
    /// A decline for `reason` with `detail`.
    pub fn new(reason: DeclineReason, detail: impl Into<String>) -> Self {
        Decline {
            reason,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for Decline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.detail.is_empty() {
            write!(f, "{}", self.reason)
        } else {
            write!(f, "{}: {}", self.reason, self.detail)
        }
    }
}

impl std::error::Error for Decline {}

/// A restore between passes that did not complete: device memory no longer matches what one
/// ordinary run would leave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoreFailure {
    /// What the restore did before failing (`bytes_moved` is what was written back).
    pub report: MemoryOpReport,
    /// Bytes that should have been written back and were not (what was lost).
    pub bytes_unrestored: u64,
    /// Free-form detail for diagnostics.
    pub detail: String,
}

/// Why a dispatch ran once instead of being replayed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RanOnceReason {
    /// The tool left `replay_pass_count` NULL for this dispatch.
    OptedOut,
    /// The tool asked for one pass: the ordinary path.
    SinglePass,
    /// Replay was wanted but declined; memory was not touched by replay.
    Declined(Decline),
}

/// How the passes of a replay came to an end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LoopEnd {
    /// All N passes ran.
    LastPass,
    /// The continue callback returned false.
    ContinueStopped,
    /// An indefinite loop's continue callback was cleared at PASS EXIT, so nothing could ever
    /// stop the loop later: it ended after that pass.
    ContinueCleared,
    /// An indefinite loop reached the cap on passes
    /// ([`LoopLimits::max_passes`](crate::LoopLimits::max_passes)): ended early by kreplay.
    MaxPasses,
    /// The per-dispatch time budget
    /// ([`LoopLimits::budget`](crate::LoopLimits::budget)) was spent: no further pass was started
    /// (the running one was never cut short). Ended early by kreplay.
    Budget,
}

impl LoopEnd {
    /// Lower-case name (`last_pass`, `continue_stopped`, `continue_cleared`, `max_passes`,
    /// `budget`).
    pub fn as_str(self) -> &'static str {
        match self {
            LoopEnd::LastPass => "last_pass",
            LoopEnd::ContinueStopped => "continue_stopped",
            LoopEnd::ContinueCleared => "continue_cleared",
            LoopEnd::MaxPasses => "max_passes",
            LoopEnd::Budget => "budget",
        }
    }

    /// Whether kreplay ended the loop before the tool's plan did (cap or budget).
    pub fn is_early(self) -> bool {
        matches!(self, LoopEnd::MaxPasses | LoopEnd::Budget)
    }
}

/// How one dispatch went through the loop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplayOutcome {
    /// The dispatch ran in `passes` passes; memory ends as one ordinary run would leave it.
    Replayed {
        /// Passes run.
        passes: u64,
        /// Why the loop ended.
        end: LoopEnd,
    },
    /// The dispatch ran once, unchanged.
    RanOnce {
        /// Why it was not replayed.
        why: RanOnceReason,
    },
    /// Pass `pass` did not finish (`pass_drain_stuck`): the loop stopped there. Memory holds
    /// whatever that pass left.
    PassFailed {
        /// The failed pass (0-based).
        pass: u64,
        /// What was stuck.
        decline: Decline,
    },
    /// The restore after pass `after_pass` failed: the one unrecoverable case. The loop stopped
    /// and device memory does not match an ordinary run.
    RestoreFailed {
        /// The last pass that completed before the failed restore.
        after_pass: u64,
        /// What was lost.
        failure: RestoreFailure,
    },
}

impl ReplayOutcome {
    /// True for the failures that leave memory unlike one ordinary run (must be reported loudly).
    pub fn is_failure(&self) -> bool {
        matches!(
            self,
            ReplayOutcome::PassFailed { .. } | ReplayOutcome::RestoreFailed { .. }
        )
    }

    /// The decline, if replay was declined.
    pub fn decline(&self) -> Option<&Decline> {
        match self {
            ReplayOutcome::RanOnce {
                why: RanOnceReason::Declined(decline),
            } => Some(decline),
            ReplayOutcome::PassFailed { decline, .. } => Some(decline),
            _ => None,
        }
    }
}

/// What one dispatch cost in the loop. Durations are device-step times (tool callbacks are not
/// included), except `total`.
///
/// `#[non_exhaustive]`: more figures may come; made by the loop (or from `default()` and field
/// assignments in tests).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplayCost {
    /// Passes submitted to the device (a failed pass included).
    pub passes_run: u64,
    /// Time spent waiting for the agent's writer lock.
    pub lock_wait: Duration,
    /// Time spent draining the agent.
    pub drain: Duration,
    /// Time spent planning and taking the snapshot.
    pub snapshot: Duration,
    /// Time of each pass, in pass order.
    pub pass_times: Vec<Duration>,
    /// Time of each restore (planning included), in order.
    pub restore_times: Vec<Duration>,
    /// Bytes copied into the snapshot.
    pub bytes_snapshotted: u64,
    /// Bytes written back by all restores (a failed restore's partial bytes included).
    pub bytes_restored: u64,
    /// Wall time of the whole dispatch in the loop, tool callbacks included.
    pub total: Duration,
}

/// How one dispatch went through the loop and what it cost.
///
/// `#[non_exhaustive]`: made by the loop, or with [`ReplayRecord::new`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplayRecord {
    /// The dispatch.
    pub info: DispatchInfo,
    /// How it ended.
    pub outcome: ReplayOutcome,
    /// `total_passes` as reported to the tool: N, or 0 for an indefinite loop (0 as well when no
    /// replay was planned).
    pub total_passes: u64,
    /// Times, passes and bytes.
    pub cost: ReplayCost,
}

impl ReplayRecord {
    /// The record of the dispatch `info`: how it ended, the `total_passes` reported to the tool
    /// and what it cost.
    pub fn new(
        info: DispatchInfo,
        outcome: ReplayOutcome,
        total_passes: u64,
        cost: ReplayCost,
    ) -> Self {
        ReplayRecord {
            info,
            outcome,
            total_passes,
            cost,
        }
    }

    /// A one-line diagnostic for declines and failures (None when the dispatch was replayed or
    /// ran once by the tool's choice). The caller decides where to print it.
    pub fn diagnostic(&self) -> Option<String> {
        let info = &self.info;
        self.diagnostic_for(&format!(
            "dispatch {} (kernel {}, agent {}, queue {})",
            info.dispatch_id, info.kernel_id, info.agent_id, info.queue_id
        ))
    }

    /// Whether [`diagnostic`](Self::diagnostic) has anything to say: false for a replay that
    /// ran all its passes and for a dispatch that ran once by the tool's choice, so a caller
    /// can skip describing the dispatch (names, formatting) on the common path.
    pub fn has_diagnostic(&self) -> bool {
        match &self.outcome {
            ReplayOutcome::Replayed { end, .. } => end.is_early(),
            ReplayOutcome::RanOnce {
                why: RanOnceReason::OptedOut | RanOnceReason::SinglePass,
            } => false,
            _ => true,
        }
    }

    /// [`diagnostic`](Self::diagnostic) with the dispatch described by `which` (for example
    /// `dispatch 3 (kernel axpy, agent gfx942, queue 1)`), for a caller that knows the names of
    /// the kernel and the agent behind their ids.
    pub fn diagnostic_for(&self, which: &str) -> Option<String> {
        match &self.outcome {
            ReplayOutcome::Replayed { passes, end } if end.is_early() => Some(format!(
                "replay of {which} ended early after {passes} pass(es) ({}); memory is as after \
                 one run",
                match end {
                    LoopEnd::MaxPasses => "the cap on passes was reached",
                    _ => "the per-dispatch time budget was spent",
                }
            )),
            ReplayOutcome::Replayed { .. }
            | ReplayOutcome::RanOnce {
                why: RanOnceReason::OptedOut | RanOnceReason::SinglePass,
            } => None,
            ReplayOutcome::RanOnce {
                why: RanOnceReason::Declined(decline),
            } => Some(format!(
                "replay of {which} declined ({decline}); the dispatch ran once, memory untouched"
            )),
            ReplayOutcome::PassFailed { pass, decline } => Some(format!(
                "pass {pass} of {which} failed ({decline}); replay stopped after {} passes, \
                 memory holds what the failed pass left",
                self.cost.passes_run
            )),
            ReplayOutcome::RestoreFailed {
                after_pass,
                failure,
            } => Some(format!(
                "restore after pass {after_pass} of {which} failed: {} bytes not restored \
                 ({} of {} planned bytes written back; {}); replay stopped, device memory does \
                 NOT match an ordinary run",
                failure.bytes_unrestored,
                failure.report.bytes_moved,
                failure.report.bytes_planned,
                failure.detail
            )),
        }
    }
}

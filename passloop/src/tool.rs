//! What the loop tells the tool, and what it asks it.

use crate::{DispatchInfo, LoopLimits, MemoryOpReport, ReplayOutcome, RestoreRequest};

/// ENTER or EXIT of a phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Before the phase's work.
    Enter,
    /// After the phase's work.
    Exit,
}

/// The tool's answer at CONFIG ENTER.
///
/// `#[non_exhaustive]`: built with [`ToolAnswer::new`], [`ToolAnswer::passes`],
/// [`ToolAnswer::passes_with_continue`] or [`ToolAnswer::OPT_OUT`].
///
/// ```
/// use kreplay_passloop::ToolAnswer;
///
/// assert_eq!(ToolAnswer::new(Some(4), false), ToolAnswer::passes(4));
/// ```
///
/// ```compile_fail
/// use kreplay_passloop::ToolAnswer;
///
/// let answer = ToolAnswer { pass_count: Some(4), has_continue: false };
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct ToolAnswer {
    /// What `replay_pass_count` returned; `None` when the tool left it NULL (opt-out).
    pub pass_count: Option<u64>,
    /// Whether a `replay_continue` callback is set.
    pub has_continue: bool,
}

impl ToolAnswer {
    /// No pass-count callback: the dispatch is not replayed.
    pub const OPT_OUT: ToolAnswer = ToolAnswer {
        pass_count: None,
        has_continue: false,
    };

    /// What `replay_pass_count` returned (`None`: the tool left it NULL) and whether a
    /// `replay_continue` callback is set.
    pub const fn new(pass_count: Option<u64>, has_continue: bool) -> Self {
        ToolAnswer {
            pass_count,
            has_continue,
        }
    }

    /// `pass_count` passes, without a continue callback.
    pub fn passes(pass_count: u64) -> Self {
        ToolAnswer {
            pass_count: Some(pass_count),
            has_continue: false,
        }
    }

    /// `pass_count` passes (0 = indefinite) with a continue callback.
    pub fn passes_with_continue(pass_count: u64) -> Self {
        ToolAnswer {
            pass_count: Some(pass_count),
            has_continue: true,
        }
    }
}

/// What the tool did to its continue callback at PASS EXIT.
///
/// A callback set where none was is consulted from the next pass that was prepared as a possible
/// final pass (its restore was exact), so memory is right wherever it stops the loop. Clearing
/// the callback of an indefinite loop ends the loop after that pass (nothing could stop it
/// later); clearing it in an N-pass loop runs the remaining passes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ContinueChange {
    /// Left as it was.
    #[default]
    Keep,
    /// A continue callback is set now (new or replaced).
    Set,
    /// The continue callback was removed.
    Clear,
}

/// The tool side of the loop (implemented by the C ABI adapter, or by a Rust tool).
///
/// `total_passes` is always N, or 0 for an indefinite loop. Every ENTER is followed by its EXIT.
pub trait ReplayTool {
    /// The limits for this dispatch (cap on passes, time budget), asked once before CONFIG
    /// ENTER. The default is [`LoopLimits::default`].
    fn limits(&self) -> LoopLimits {
        LoopLimits::default()
    }

    /// CONFIG ENTER: the tool says whether and how often to replay. (The C adapter calls the
    /// tool's `replay_pass_count` in here.)
    fn config_enter(&mut self, info: &DispatchInfo) -> ToolAnswer;

    /// PASS ENTER of pass `pass` (0-based). The replay context toggles are armed during this
    /// call only.
    fn pass_enter(&mut self, info: &DispatchInfo, pass: u64, total_passes: u64);

    /// PASS EXIT of pass `pass`. Returns what the tool did to its continue callback here (docs/abi.md
    /// §2 lets it override it at PASS EXIT); [`ContinueChange::Keep`] in the common case.
    fn pass_exit(&mut self, info: &DispatchInfo, pass: u64, total_passes: u64) -> ContinueChange;

    /// The continue callback: false stops the loop after `current_pass`. Never consulted after
    /// the last of N passes.
    fn should_continue(
        &mut self,
        info: &DispatchInfo,
        current_pass: u64,
        total_passes: u64,
    ) -> bool;

    /// SNAPSHOT ENTER (with the plan) and EXIT (with what was copied; when the snapshot was
    /// declined, `bytes_moved` is 0 and `report.declined` says why).
    fn snapshot(&mut self, info: &DispatchInfo, phase: Phase, report: &MemoryOpReport);

    /// RESTORE ENTER (with the plan) and EXIT (with what was written back, repairs and whether
    /// it was verified; a failed restore has `report.failed` and `report.bytes_lost`), between
    /// passes.
    fn restore(
        &mut self,
        info: &DispatchInfo,
        phase: Phase,
        request: &RestoreRequest,
        report: &MemoryOpReport,
    );

    /// CONFIG EXIT, with how the dispatch went (declines and failures included). Delivered
    /// after the last pass and before the application's completion fires.
    fn config_exit(&mut self, info: &DispatchInfo, outcome: &ReplayOutcome);
}

/// A tool that replays every dispatch a fixed number of times and observes nothing: what a
/// backend runs when no tool asks for kernel replay itself but the user asked for N passes
/// (the "built-in tool" of `KREPLAY_PASSES`).
///
/// ```
/// use kreplay_passloop::{DispatchInfo, FixedPasses, LoopLimits, ReplayTool};
///
/// let mut tool = FixedPasses::new(4).with_limits(LoopLimits::new(8));
/// assert_eq!(tool.config_enter(&DispatchInfo::default()).pass_count, Some(4));
/// assert_eq!(tool.limits().max_passes, 8);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedPasses {
    passes: u64,
    limits: LoopLimits,
}

impl FixedPasses {
    /// Every dispatch `passes` times, under the default limits.
    pub fn new(passes: u64) -> Self {
        FixedPasses {
            passes,
            limits: LoopLimits::default(),
        }
    }

    /// The same, under `limits` (a cap on passes, a time budget).
    pub fn with_limits(mut self, limits: LoopLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The passes asked for every dispatch.
    pub fn passes(&self) -> u64 {
        self.passes
    }
}

impl ReplayTool for FixedPasses {
    fn limits(&self) -> LoopLimits {
        self.limits
    }
    fn config_enter(&mut self, _: &DispatchInfo) -> ToolAnswer {
        ToolAnswer::passes(self.passes)
    }
    fn pass_enter(&mut self, _: &DispatchInfo, _: u64, _: u64) {}
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

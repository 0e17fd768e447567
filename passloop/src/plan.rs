//! The pass-count table (docs/abi.md §2) as a pure function.

use std::time::Duration;

use crate::{Decline, DeclineReason, RanOnceReason, ToolAnswer};

/// The cap on passes per dispatch unless configured otherwise (`KREPLAY_MAX_PASSES`).
pub const DEFAULT_MAX_PASSES: u64 = 1024;

/// Limits the loop applies to every dispatch, whatever the tool answers.
///
/// `#[non_exhaustive]`: built with [`LoopLimits::new`] (or `default`) and
/// [`with_budget`](LoopLimits::with_budget).
///
/// ```
/// use std::time::Duration;
/// use kreplay_passloop::LoopLimits;
///
/// let limits = LoopLimits::new(64).with_budget(Some(Duration::from_secs(1)));
/// assert_eq!(limits.max_passes, 64);
/// ```
///
/// ```compile_fail
/// use kreplay_passloop::LoopLimits;
///
/// let limits = LoopLimits { max_passes: 64, budget: None };
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct LoopLimits {
    /// The most passes one dispatch may run (at least 1): a larger pass count is declined as
    /// `invalid_pass_count`, and an indefinite loop ends after this many passes
    /// ([`LoopEnd::MaxPasses`](crate::LoopEnd::MaxPasses)).
    pub max_passes: u64,
    /// Time per dispatch (from CONFIG ENTER) after which no further pass starts
    /// ([`LoopEnd::Budget`](crate::LoopEnd::Budget)); a running pass is never cut short. With a
    /// budget every restore is exact, since any pass may turn out to be the last. `None`: no
    /// budget.
    pub budget: Option<Duration>,
}

impl LoopLimits {
    /// At most `max_passes` passes per dispatch, no time budget.
    pub const fn new(max_passes: u64) -> Self {
        LoopLimits {
            max_passes,
            budget: None,
        }
    }

    /// These limits with a time budget per dispatch (`None`: no budget).
    pub const fn with_budget(mut self, budget: Option<Duration>) -> Self {
        self.budget = budget;
        self
    }
}

impl Default for LoopLimits {
    /// [`DEFAULT_MAX_PASSES`], no budget.
    fn default() -> Self {
        LoopLimits {
            max_passes: DEFAULT_MAX_PASSES,
            budget: None,
        }
    }
}

/// What to do with a dispatch, decided from the tool's CONFIG ENTER answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplayPlan {
    /// Run the dispatch once, unchanged: no lock, no snapshot, no PASS callbacks.
    Once(RanOnceReason),
    /// Replay it.
    Replay {
        /// N, or 0 for an indefinite loop (then a continue callback is set).
        total_passes: u64,
        /// Whether a continue callback is set at CONFIG ENTER.
        has_continue: bool,
    },
}

impl ReplayPlan {
    /// Applies the pass-count table:
    ///
    /// | `pass_count` | continue | plan |
    /// |---|---|---|
    /// | `None` | any | once, opted out |
    /// | 1 | any | once, single pass |
    /// | N > 1 | any | replay N (at most N with continue) |
    /// | 0 | set | replay indefinitely (`total_passes` 0) |
    /// | 0 | unset | once, declined with `invalid_pass_count` |
    /// | N > [`DEFAULT_MAX_PASSES`] | any | once, declined with `invalid_pass_count` |
    pub fn from_answer(answer: &ToolAnswer) -> ReplayPlan {
        Self::from_answer_within(answer, &LoopLimits::default())
    }

    /// [`from_answer`](Self::from_answer) with the cap of `limits` (a pass count above
    /// `limits.max_passes` is declined with a diagnostic naming the cap).
    pub fn from_answer_within(answer: &ToolAnswer, limits: &LoopLimits) -> ReplayPlan {
        let cap = limits.max_passes.max(1);
        match (answer.pass_count, answer.has_continue) {
            (Some(n), _) if n > cap => ReplayPlan::Once(RanOnceReason::Declined(Decline::new(
                DeclineReason::InvalidPassCount,
                format!(
                    "replay_pass_count returned {n}, above the cap of {cap} passes per dispatch \
                     (KREPLAY_MAX_PASSES)"
                ),
            ))),
            (None, _) => ReplayPlan::Once(RanOnceReason::OptedOut),
            (Some(1), _) => ReplayPlan::Once(RanOnceReason::SinglePass),
            (Some(0), false) => ReplayPlan::Once(RanOnceReason::Declined(Decline::new(
                DeclineReason::InvalidPassCount,
                "replay_pass_count returned 0 without a replay_continue callback \
                 (0 passes means 'until replay_continue returns 0')",
            ))),
            (Some(total_passes), has_continue) => ReplayPlan::Replay {
                total_passes,
                has_continue,
            },
        }
    }
}

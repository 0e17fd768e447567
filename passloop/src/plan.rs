//! SPEC's pass-count table as a pure function.

use crate::{Decline, DeclineReason, RanOnceReason, ToolAnswer};

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
    pub fn from_answer(answer: &ToolAnswer) -> ReplayPlan {
        match (answer.pass_count, answer.has_continue) {
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

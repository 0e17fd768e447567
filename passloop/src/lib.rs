//! The kernel replay plan and pass loop: the pass-count table (docs/abi.md §2), the CONFIG / SNAPSHOT / PASS /
//! RESTORE phases, decline reasons, diagnostics and per-dispatch cost accounting.
//!
//! The loop knows no GPU API. A backend implements [`ReplayDevice`] (lock, drain, snapshot, run
//! a pass, restore, run once, fire completion); the tool side implements [`ReplayTool`] (the C
//! ABI adapter does, calling the tool's `replay_pass_count` / `replay_continue`). Per-pass
//! context masking comes from [`kreplay_ctxmask`]. [`run_dispatch`] drives one dispatch and
//! returns a [`ReplayRecord`].
//!
//! A device whose "kernel" does `x += 1` over host memory, replayed in three passes; memory ends
//! as one ordinary run would leave it:
//!
//! ```
//! use kreplay_ctxmask::ContextRegistry;
//! use kreplay_passloop::*;
//!
//! struct Host { data: Vec<u32>, completions: u32 }
//!
//! impl ReplayDevice for Host {
//!     type Snapshot = Vec<u32>;
//!     fn check_replayable(&mut self, _: &DispatchInfo) -> Result<(), Decline> { Ok(()) }
//!     fn lock_agent(&mut self, _: &DispatchInfo) -> Result<(), Decline> { Ok(()) }
//!     fn unlock_agent(&mut self, _: &DispatchInfo) {}
//!     fn drain(&mut self, _: &DispatchInfo) -> Result<(), Decline> { Ok(()) }
//!     fn plan_snapshot(&mut self, _: &DispatchInfo) -> Result<MemoryOpReport, Decline> {
//!         let bytes = 4 * self.data.len() as u64;
//!         Ok(MemoryOpReport { bytes_planned: bytes, regions: 1, tier: StoreTier::Host,
//!                             ..Default::default() })
//!     }
//!     fn take_snapshot(&mut self, i: &DispatchInfo, _: &SnapshotRequest)
//!         -> Result<(Vec<u32>, MemoryOpReport), Decline> {
//!         let plan = self.plan_snapshot(i)?;
//!         Ok((self.data.clone(), MemoryOpReport { bytes_moved: plan.bytes_planned, ..plan }))
//!     }
//!     fn run_pass(&mut self, _: &DispatchInfo, _pass: u64) -> Result<(), Decline> {
//!         self.data.iter_mut().for_each(|x| *x += 1);
//!         Ok(())
//!     }
//!     fn plan_restore(&mut self, _: &DispatchInfo, s: &Vec<u32>, _: &RestoreRequest)
//!         -> MemoryOpReport {
//!         MemoryOpReport { bytes_planned: 4 * s.len() as u64, ..Default::default() }
//!     }
//!     fn restore(&mut self, _: &DispatchInfo, s: &mut Vec<u32>, _: &RestoreRequest)
//!         -> Result<MemoryOpReport, RestoreFailure> {
//!         self.data.copy_from_slice(s);
//!         let bytes = 4 * s.len() as u64;
//!         Ok(MemoryOpReport { bytes_planned: bytes, bytes_moved: bytes, ..Default::default() })
//!     }
//!     fn discard_snapshot(&mut self, _: &DispatchInfo, _: Vec<u32>) {}
//!     fn run_once(&mut self, i: &DispatchInfo) {
//!         self.run_pass(i, 0).unwrap();
//!         self.completions += 1;
//!     }
//!     fn fire_completion(&mut self, _: &DispatchInfo) { self.completions += 1; }
//! }
//!
//! /// Three passes, nothing else.
//! struct Tool;
//! impl ReplayTool for Tool {
//!     fn config_enter(&mut self, _: &DispatchInfo) -> ToolAnswer { ToolAnswer::passes(3) }
//!     fn pass_enter(&mut self, _: &DispatchInfo, _: u64, _: u64) {}
//!     fn pass_exit(&mut self, _: &DispatchInfo, _: u64, _: u64) -> ContinueChange {
//!         ContinueChange::Keep
//!     }
//!     fn should_continue(&mut self, _: &DispatchInfo, _: u64, _: u64) -> bool { true }
//!     fn snapshot(&mut self, _: &DispatchInfo, _: Phase, _: &MemoryOpReport) {}
//!     fn restore(&mut self, _: &DispatchInfo, _: Phase, _: &RestoreRequest,
//!                _: &MemoryOpReport) {}
//!     fn config_exit(&mut self, _: &DispatchInfo, _: &ReplayOutcome) {}
//! }
//!
//! let mut device = Host { data: vec![10, 20], completions: 0 };
//! let record = run_dispatch(&mut Tool, &mut device, &ContextRegistry::new(),
//!                           &DispatchInfo::default());
//! assert_eq!(record.outcome, ReplayOutcome::Replayed { passes: 3, end: LoopEnd::LastPass });
//! assert_eq!(device.data, vec![11, 21]); // as after one ordinary run
//! assert_eq!(device.completions, 1);
//! assert_eq!((record.cost.bytes_snapshotted, record.cost.bytes_restored), (8, 16));
//! ```

mod device;
mod dispatch;
mod groups;
mod outcome;
mod plan;
mod run;
pub mod settings;
mod tool;

pub use device::{
    MemoryOpReport, RegionSources, ReplayDevice, RestoreRequest, RestoreStrategy, SnapshotRequest,
    SourceTally, StoreTier,
};
pub use dispatch::DispatchInfo;
pub use groups::{HardwareCounter, PlanError, plan_groups};
pub use outcome::{
    Decline, DeclineReason, LoopEnd, RanOnceReason, ReplayCost, ReplayOutcome, ReplayRecord,
    RestoreFailure,
};
pub use plan::{DEFAULT_MAX_PASSES, LoopLimits, ReplayPlan};
pub use run::run_dispatch;
pub use tool::{ContinueChange, FixedPasses, Phase, ReplayTool, ToolAnswer};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decline_reasons_have_the_spec_names() {
        let names: Vec<_> = DeclineReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(
            names,
            [
                "untracked_memory",
                "footprint_budget",
                "snapshot_failed",
                "queue_drain_stuck",
                "agent_drain_stuck",
                "pass_drain_stuck",
                "reentrant_dispatch",
                "invalid_pass_count",
                "batch_or_graph",
            ]
        );
    }

    #[test]
    fn decline_displays_reason_and_detail() {
        let decline = Decline::new(DeclineReason::QueueDrainStuck, "queue 3 after 100 ms");
        assert_eq!(
            decline.to_string(),
            "queue_drain_stuck: queue 3 after 100 ms"
        );
        assert_eq!(
            Decline::new(DeclineReason::BatchOrGraph, "").to_string(),
            "batch_or_graph"
        );
    }

    #[test]
    fn pass_count_table_maps_every_row() {
        let plan = |pass_count, has_continue| {
            ReplayPlan::from_answer(&ToolAnswer {
                pass_count,
                has_continue,
            })
        };
        for has_continue in [false, true] {
            assert_eq!(
                plan(None, has_continue),
                ReplayPlan::Once(RanOnceReason::OptedOut)
            );
            assert_eq!(
                plan(Some(1), has_continue),
                ReplayPlan::Once(RanOnceReason::SinglePass)
            );
            assert_eq!(
                plan(Some(5), has_continue),
                ReplayPlan::Replay {
                    total_passes: 5,
                    has_continue
                }
            );
        }
        assert_eq!(
            plan(Some(0), true),
            ReplayPlan::Replay {
                total_passes: 0,
                has_continue: true
            }
        );
        match plan(Some(0), false) {
            ReplayPlan::Once(RanOnceReason::Declined(decline)) => {
                assert_eq!(decline.reason, DeclineReason::InvalidPassCount);
                assert!(decline.detail.contains("replay_continue"));
            }
            other => panic!("0 passes without continue must be invalid, got {other:?}"),
        }
    }

    #[test]
    fn only_pass_and_restore_failures_count_as_failures() {
        let decline = Decline::new(DeclineReason::PassDrainStuck, "");
        assert!(
            ReplayOutcome::PassFailed {
                pass: 1,
                decline: decline.clone()
            }
            .is_failure()
        );
        assert!(
            ReplayOutcome::RestoreFailed {
                after_pass: 0,
                failure: RestoreFailure {
                    report: MemoryOpReport::default(),
                    bytes_unrestored: 1,
                    detail: String::new(),
                },
            }
            .is_failure()
        );
        assert!(
            !ReplayOutcome::RanOnce {
                why: RanOnceReason::Declined(decline)
            }
            .is_failure()
        );
        assert!(
            !ReplayOutcome::Replayed {
                passes: 2,
                end: LoopEnd::LastPass
            }
            .is_failure()
        );
    }
}

/// The README's example, compiled and run as a doctest so that it cannot go stale.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

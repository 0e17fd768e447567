//! Per-process counters of what replay did: dispatches, replays, passes, declines per reason,
//! bytes snapshotted, restored and lost, repairs. Read through `kreplay_get_counters`, printed at
//! finalize when `KREPLAY_LOG=info`.
//!
//! Counting is a handful of relaxed atomic additions per dispatch, on the thread that ran it.

use std::sync::atomic::{AtomicU64, Ordering};

use kreplay_passloop::{MemoryOpReport, RanOnceReason, ReplayOutcome, ReplayRecord};

use crate::abi::{Counters, DeclineReason, ReplayEnd, ReplayOutcomeKind};

const DISPATCHES: usize = 0;
const REPLAYS: usize = 1;
const PASSES: usize = 2;
const RAN_ONCE: usize = 3;
const DECLINES: usize = 4;
const ENDED_EARLY: usize = 5;
const PASS_FAILURES: usize = 6;
const RESTORE_FAILURES: usize = 7;
const BYTES_SNAPSHOTTED: usize = 8;
const BYTES_RESTORED: usize = 9;
const BYTES_LOST: usize = 10;
const CHUNKS_REPAIRED: usize = 11;
const UNVERIFIED_RESTORES: usize = 12;
const FIELDS: usize = 13;

static TOTALS: [AtomicU64; FIELDS] = [const { AtomicU64::new(0) }; FIELDS];
static BY_REASON: [AtomicU64; 16] = [const { AtomicU64::new(0) }; 16];

fn add(field: usize, n: u64) {
    if n != 0 {
        TOTALS[field].fetch_add(n, Ordering::Relaxed);
    }
}

/// The C value of a loop decline reason.
pub(crate) fn decline_reason(reason: kreplay_passloop::DeclineReason) -> DeclineReason {
    DeclineReason::VALUES
        .iter()
        .map(|(_, v)| *v)
        .find(|v| {
            v.label()
                .is_some_and(|l| l.to_bytes() == reason.as_str().as_bytes())
        })
        .unwrap_or(DeclineReason::NONE)
}

/// How `outcome` is reported at CONFIG EXIT: outcome kind, loop end, decline reason.
pub(crate) fn classify(outcome: &ReplayOutcome) -> (ReplayOutcomeKind, ReplayEnd, DeclineReason) {
    let end = |end: kreplay_passloop::LoopEnd| match end {
        kreplay_passloop::LoopEnd::LastPass => ReplayEnd::LAST_PASS,
        kreplay_passloop::LoopEnd::ContinueStopped => ReplayEnd::CONTINUE_STOPPED,
        kreplay_passloop::LoopEnd::ContinueCleared => ReplayEnd::CONTINUE_CLEARED,
        kreplay_passloop::LoopEnd::MaxPasses => ReplayEnd::MAX_PASSES,
        kreplay_passloop::LoopEnd::Budget => ReplayEnd::BUDGET,
        _ => ReplayEnd::NONE,
    };
    match outcome {
        ReplayOutcome::Replayed { end: e, .. } if e.is_early() => {
            (ReplayOutcomeKind::ENDED_EARLY, end(*e), DeclineReason::NONE)
        }
        ReplayOutcome::Replayed { end: e, .. } => {
            (ReplayOutcomeKind::REPLAYED, end(*e), DeclineReason::NONE)
        }
        ReplayOutcome::RanOnce {
            why: RanOnceReason::Declined(d),
        } => (
            ReplayOutcomeKind::DECLINED,
            ReplayEnd::NONE,
            decline_reason(d.reason),
        ),
        ReplayOutcome::RanOnce { .. } => (
            ReplayOutcomeKind::RAN_ONCE,
            ReplayEnd::NONE,
            DeclineReason::NONE,
        ),
        ReplayOutcome::PassFailed { decline, .. } => (
            ReplayOutcomeKind::PASS_FAILED,
            ReplayEnd::NONE,
            decline_reason(decline.reason),
        ),
        ReplayOutcome::RestoreFailed { .. } => (
            ReplayOutcomeKind::RESTORE_FAILED,
            ReplayEnd::NONE,
            DeclineReason::NONE,
        ),
    }
}

/// Counts one dispatch that went through the replay loop.
pub(crate) fn record_dispatch(record: &ReplayRecord) {
    add(DISPATCHES, 1);
    let (kind, _, reason) = classify(&record.outcome);
    match kind {
        ReplayOutcomeKind::REPLAYED => add(REPLAYS, 1),
        ReplayOutcomeKind::ENDED_EARLY => {
            add(REPLAYS, 1);
            add(ENDED_EARLY, 1);
        }
        ReplayOutcomeKind::RAN_ONCE => add(RAN_ONCE, 1),
        ReplayOutcomeKind::DECLINED => add(DECLINES, 1),
        ReplayOutcomeKind::PASS_FAILED => add(PASS_FAILURES, 1),
        _ => add(RESTORE_FAILURES, 1),
    }
    if reason != DeclineReason::NONE && kind == ReplayOutcomeKind::DECLINED {
        BY_REASON[(reason.0 as usize).min(15)].fetch_add(1, Ordering::Relaxed);
    }
    if let ReplayOutcome::RestoreFailed { failure, .. } = &record.outcome {
        add(BYTES_LOST, failure.bytes_unrestored);
    }
    add(PASSES, record.cost.passes_run);
    add(BYTES_SNAPSHOTTED, record.cost.bytes_snapshotted);
    add(BYTES_RESTORED, record.cost.bytes_restored);
}

/// Counts what one RESTORE EXIT reports (repairs, unverified restores).
pub(crate) fn record_restore(report: &MemoryOpReport) {
    add(CHUNKS_REPAIRED, report.repaired_chunks);
    add(UNVERIFIED_RESTORES, u64::from(report.unverified));
}

/// The counters so far.
pub fn snapshot() -> Counters {
    let get = |field: usize| TOTALS[field].load(Ordering::Relaxed);
    let mut declines_by_reason = [0u64; 16];
    for (out, count) in declines_by_reason.iter_mut().zip(&BY_REASON) {
        *out = count.load(Ordering::Relaxed);
    }
    Counters {
        dispatches: get(DISPATCHES),
        replays: get(REPLAYS),
        passes: get(PASSES),
        ran_once: get(RAN_ONCE),
        declines: get(DECLINES),
        ended_early: get(ENDED_EARLY),
        pass_failures: get(PASS_FAILURES),
        restore_failures: get(RESTORE_FAILURES),
        bytes_snapshotted: get(BYTES_SNAPSHOTTED),
        bytes_restored: get(BYTES_RESTORED),
        bytes_lost: get(BYTES_LOST),
        chunks_repaired: get(CHUNKS_REPAIRED),
        unverified_restores: get(UNVERIFIED_RESTORES),
        declines_by_reason,
        ..Counters::default()
    }
}

/// The counters as one line for the log.
pub fn summary(c: &Counters) -> String {
    let mut line = format!(
        "replay counters: {} dispatch(es), {} replayed ({} pass(es), {} ended early), {} ran \
         once, {} declined, {} pass failure(s), {} restore failure(s); {} byte(s) snapshotted, \
         {} restored, {} lost; {} chunk(s) repaired, {} unverified restore(s)",
        c.dispatches,
        c.replays,
        c.passes,
        c.ended_early,
        c.ran_once,
        c.declines,
        c.pass_failures,
        c.restore_failures,
        c.bytes_snapshotted,
        c.bytes_restored,
        c.bytes_lost,
        c.chunks_repaired,
        c.unverified_restores
    );
    let reasons: Vec<String> = c
        .declines_by_reason
        .iter()
        .enumerate()
        .filter(|(_, n)| **n > 0)
        .map(|(r, n)| format!("{} {n}", DeclineReason(r as u32)))
        .collect();
    if !reasons.is_empty() {
        line.push_str(&format!("; declines: {}", reasons.join(", ")));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use kreplay_passloop::{Decline, DispatchInfo, LoopEnd, ReplayCost, RestoreFailure};

    fn record(outcome: ReplayOutcome, passes: u64) -> ReplayRecord {
        let mut cost = ReplayCost::default();
        cost.passes_run = passes;
        cost.bytes_snapshotted = 100;
        cost.bytes_restored = 10 * passes;
        ReplayRecord::new(DispatchInfo::default(), outcome, passes, cost)
    }

    #[test]
    fn every_outcome_is_counted_under_its_kind_and_reason() {
        let before = snapshot();
        record_dispatch(&record(
            ReplayOutcome::Replayed {
                passes: 3,
                end: LoopEnd::LastPass,
            },
            3,
        ));
        record_dispatch(&record(
            ReplayOutcome::Replayed {
                passes: 2,
                end: LoopEnd::MaxPasses,
            },
            2,
        ));
        record_dispatch(&record(
            ReplayOutcome::RanOnce {
                why: RanOnceReason::Declined(Decline::new(
                    kreplay_passloop::DeclineReason::FootprintBudget,
                    "",
                )),
            },
            0,
        ));
        record_dispatch(&record(
            ReplayOutcome::RestoreFailed {
                after_pass: 0,
                failure: RestoreFailure {
                    report: MemoryOpReport::default(),
                    bytes_unrestored: 7,
                    detail: String::new(),
                },
            },
            1,
        ));
        record_restore(&MemoryOpReport {
            repaired_chunks: 2,
            unverified: true,
            ..Default::default()
        });
        let after = snapshot();
        let delta = |f: fn(&Counters) -> u64| f(&after) - f(&before);
        assert_eq!(delta(|c| c.dispatches), 4);
        assert_eq!(delta(|c| c.replays), 2);
        assert_eq!(delta(|c| c.ended_early), 1);
        assert_eq!(delta(|c| c.passes), 6);
        assert_eq!(delta(|c| c.declines), 1);
        assert_eq!(delta(|c| c.restore_failures), 1);
        assert_eq!(delta(|c| c.bytes_lost), 7);
        assert_eq!(delta(|c| c.bytes_snapshotted), 400);
        assert_eq!(delta(|c| c.chunks_repaired), 2);
        assert_eq!(delta(|c| c.unverified_restores), 1);
        let budget = DeclineReason::FOOTPRINT_BUDGET.0 as usize;
        assert_eq!(
            after.declines_by_reason[budget] - before.declines_by_reason[budget],
            1
        );
        assert!(summary(&after).contains("footprint_budget"));
    }
}

//! Turning what the demo observed into rows, checks, a table and a verdict.
//!
//! Three sources meet here: the application's own list of dispatches, what the tool saw through
//! the C ABI ([`ToolReport`]) and kreplay's cost records ([`ReplayRecord`]). [`build_rows`] joins
//! them by dispatch id and checks every dispatch against the plan; [`compare`] checks the
//! application's results against the unprofiled run.

use std::time::Duration;

use kreplay_passloop::{LoopEnd, RanOnceReason, ReplayOutcome, ReplayRecord};

use super::app::Buffer;
use super::tool::{DispatchObservation, ToolReport};
use crate::format::{Align, Table, format_bytes, format_duration};

/// What the demo asked kreplay for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Passes per dispatch (1 = not replayed).
    pub passes: u64,
    /// Whether memory is restored between passes.
    pub restore: bool,
}

/// One dispatch: who saw which pass, what it cost, and what did not go as planned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DispatchRow {
    /// The dispatch id.
    pub dispatch_id: u64,
    /// Kernel name (from the runtime's kernel registry).
    pub kernel: String,
    /// Passes that ran (1 when not replayed).
    pub passes_run: u64,
    /// How the dispatch ended (`replayed`, `single pass`, `declined: ...`).
    pub outcome: String,
    /// For each replayed pass, the tracing contexts (by number) that got a record of it.
    pub pass_contexts: Vec<Vec<usize>>,
    /// For each replayed pass, the dispatch records delivered for it.
    pub pass_records: Vec<u32>,
    /// Contexts that got a record without a pass (the dispatch ran once).
    pub unreplayed_contexts: Vec<usize>,
    /// Dispatch records delivered without a pass.
    pub unreplayed_records: u32,
    /// Bytes copied into the snapshot.
    pub bytes_snapshotted: u64,
    /// The snapshot's (regions, bytes) per source: the agent's memory, referenced memory,
    /// module variables, adopted memory (SNAPSHOT EXIT).
    pub snapshot_sources: [(u64, u64); 4],
    /// Bytes written back by all restores.
    pub bytes_restored: u64,
    /// Bytes written back by each restore, in order.
    pub restore_bytes: Vec<u64>,
    /// Snapshot storage tier (`-` without a snapshot).
    pub tier: String,
    /// Restore strategy (`-` without a restore).
    pub strategy: String,
    /// Waiting for the agent's writer lock.
    pub lock_wait: Duration,
    /// Draining the agent.
    pub drain: Duration,
    /// Planning and taking the snapshot.
    pub snapshot: Duration,
    /// Each pass.
    pub pass_times: Vec<Duration>,
    /// Each restore.
    pub restore_times: Vec<Duration>,
    /// What did not go as planned (empty when everything did).
    pub problems: Vec<String>,
}

impl DispatchRow {
    /// Sum of the pass times.
    pub fn passes_total(&self) -> Duration {
        self.pass_times.iter().sum()
    }

    /// Sum of the restore times.
    pub fn restores_total(&self) -> Duration {
        self.restore_times.iter().sum()
    }

    /// The context column: per pass, the contexts that saw it (`c0|c1|c2`); `c0+c2` when two
    /// saw one pass, `-` when none did; for a dispatch that ran once, the contexts that saw it.
    pub fn contexts_cell(&self) -> String {
        let list = |contexts: &[usize]| {
            if contexts.is_empty() {
                "-".to_string()
            } else {
                contexts
                    .iter()
                    .map(|c| format!("c{c}"))
                    .collect::<Vec<_>>()
                    .join("+")
            }
        };
        if self.pass_contexts.is_empty() {
            list(&self.unreplayed_contexts)
        } else {
            self.pass_contexts
                .iter()
                .map(|c| list(c))
                .collect::<Vec<_>>()
                .join("|")
        }
    }
}

/// Joins the three sources into one row per dispatch (in dispatch-id order) and checks each
/// against `plan`. `kernels` is the application's dispatch sequence; `kernel_name` names a
/// kernel id. Problems that belong to no single row are returned beside the rows.
pub fn build_rows(
    plan: Plan,
    kernels: &[&str],
    tool: &ToolReport,
    records: &[ReplayRecord],
    kernel_name: impl Fn(u64) -> Option<&'static str>,
) -> (Vec<DispatchRow>, Vec<String>) {
    let mut problems = tool.problems.clone();
    if !tool.initialized {
        problems.push("the demo tool was not initialized by kreplay".into());
    }
    if tool.dispatches.len() != kernels.len() {
        problems.push(format!(
            "the application made {} dispatches, the tool saw {} for {}",
            kernels.len(),
            if tool.replay_by_other {
                "dispatch records"
            } else {
                "CONFIG ENTER"
            },
            tool.dispatches.len()
        ));
    }
    for record in records {
        if !tool
            .dispatches
            .iter()
            .any(|d| d.dispatch_id == record.info.dispatch_id)
        {
            problems.push(format!(
                "kreplay recorded dispatch {}, which the tool never saw",
                record.info.dispatch_id
            ));
        }
    }
    let rows = tool
        .dispatches
        .iter()
        .enumerate()
        .map(|(index, seen)| {
            let record = records
                .iter()
                .find(|r| r.info.dispatch_id == seen.dispatch_id);
            let mut row = row_of(plan, tool.replay_by_other, seen, record, &kernel_name);
            if let Some(expected) = kernels.get(index)
                && row.kernel != *expected
            {
                row.problems.push(format!(
                    "dispatch #{} of the application was {expected}, the tool saw {}",
                    index + 1,
                    row.kernel
                ));
            }
            row
        })
        .collect();
    (rows, problems)
}

fn row_of(
    plan: Plan,
    replay_by_other: bool,
    seen: &DispatchObservation,
    record: Option<&ReplayRecord>,
    kernel_name: &impl Fn(u64) -> Option<&'static str>,
) -> DispatchRow {
    let mut row = DispatchRow {
        dispatch_id: seen.dispatch_id,
        kernel: kernel_name(seen.kernel_id)
            .map_or_else(|| format!("kernel {:#x}", seen.kernel_id), str::to_string),
        passes_run: (seen.passes.len() as u64).max(1),
        pass_contexts: seen.passes.iter().map(|p| sorted(&p.contexts)).collect(),
        pass_records: seen.passes.iter().map(|p| p.records).collect(),
        unreplayed_contexts: sorted(&seen.unreplayed_contexts),
        unreplayed_records: seen.unreplayed_records,
        bytes_snapshotted: seen.snapshot.map_or(0, |s| s.bytes_moved),
        snapshot_sources: seen.snapshot.map_or([(0, 0); 4], |s| s.sources),
        bytes_restored: seen.restores.iter().map(|r| r.bytes_moved).sum(),
        restore_bytes: seen.restores.iter().map(|r| r.bytes_moved).collect(),
        tier: seen
            .snapshot
            .and_then(|s| s.tier.label())
            .map_or_else(|| "-".to_string(), |l| l.to_string_lossy().into_owned()),
        // A restore that skipped verification names the shortcut (the C payload keeps WRITESET
        // and sets `unverified`), so the table says which ran.
        strategy: if seen.restores.iter().any(|m| m.unverified) {
            "writeset-unverified".to_string()
        } else {
            seen.restores
                .first()
                .and_then(|m| m.strategy.label())
                .map_or_else(|| "-".to_string(), |l| l.to_string_lossy().into_owned())
        },
        problems: seen.problems.clone(),
        ..DispatchRow::default()
    };
    if replay_by_other && !seen.passes.is_empty() && seen.snapshot.is_none() {
        // Another tool's replay: its SNAPSHOT and RESTORE records went to that tool. '-' would
        // say "ran once".
        row.tier = "?".to_string();
        row.strategy = "?".to_string();
    }
    row.outcome = if seen.passes.is_empty() {
        "ran once".to_string()
    } else {
        "replayed".to_string()
    };
    if let Some(record) = record {
        row.outcome = outcome_text(&record.outcome);
        let cost = &record.cost;
        row.passes_run = cost.passes_run.max(1);
        row.bytes_snapshotted = cost.bytes_snapshotted;
        row.bytes_restored = cost.bytes_restored;
        row.lock_wait = cost.lock_wait;
        row.drain = cost.drain;
        row.snapshot = cost.snapshot;
        row.pass_times = cost.pass_times.clone();
        row.restore_times = cost.restore_times.clone();
    }
    let problems = if replay_by_other {
        check_observed(record, &row)
    } else {
        check_plan(plan, seen, record, &row)
    };
    row.problems.extend(problems);
    row
}

/// Everything about `row` that contradicts itself when another tool chose the passes: the
/// demo's one tracing context must have seen each pass kreplay ran exactly once, and replay
/// must not have failed.
fn check_observed(record: Option<&ReplayRecord>, row: &DispatchRow) -> Vec<String> {
    let mut problems = Vec::new();
    let observed = row.pass_contexts.len() as u64;
    match record {
        None if observed > 0 => {
            problems.push("kreplay has no cost record of this replayed dispatch".into())
        }
        None => {}
        Some(record) => {
            if matches!(
                record.outcome,
                ReplayOutcome::PassFailed { .. } | ReplayOutcome::RestoreFailed { .. }
            ) {
                problems.push(format!("replay failed: {}", outcome_text(&record.outcome)));
            }
            // A decline means the tool asked for passes and the dispatch ran once anyway
            // (abi.md §4): not the tool's plan, whatever the plan was.
            if matches!(
                record.outcome,
                ReplayOutcome::RanOnce {
                    why: RanOnceReason::Declined(_)
                }
            ) {
                problems.push(format!(
                    "the tool asked for passes, kreplay {}",
                    outcome_text(&record.outcome)
                ));
            }
            let ran = if matches!(record.outcome, ReplayOutcome::Replayed { .. }) {
                record.cost.passes_run
            } else {
                0
            };
            if observed != ran {
                problems.push(format!(
                    "kreplay reports {ran} replayed passes, the tracing context saw {observed}"
                ));
            }
        }
    }
    // Every pass runs the same kernel once: each must produce the records of pass 0.
    if let Some(&first) = row.pass_records.first()
        && let Some(pass) = row
            .pass_records
            .iter()
            .position(|&records| records == 0 || records != first)
    {
        problems.push(format!(
            "pass {pass} produced {} dispatch records, pass 0 produced {first}",
            row.pass_records[pass]
        ));
    }
    if observed == 0 && row.unreplayed_records == 0 {
        problems.push("the dispatch produced no dispatch record".into());
    }
    if observed > 0 && row.unreplayed_records > 0 {
        problems.push(format!(
            "{} dispatch records of a replayed dispatch carried no pass",
            row.unreplayed_records
        ));
    }
    problems
}

fn sorted(contexts: &[usize]) -> Vec<usize> {
    let mut contexts = contexts.to_vec();
    contexts.sort_unstable();
    contexts
}

fn outcome_text(outcome: &ReplayOutcome) -> String {
    match outcome {
        ReplayOutcome::Replayed { passes, end } if end.is_early() => {
            format!("ended early after {passes} pass(es): {}", end.as_str())
        }
        ReplayOutcome::Replayed { .. } => "replayed".into(),
        ReplayOutcome::RanOnce { why } => match why {
            RanOnceReason::OptedOut => "opted out".into(),
            RanOnceReason::SinglePass => "single pass".into(),
            RanOnceReason::Declined(decline) => format!("declined: {decline}"),
            other => format!("ran once: {other:?}"),
        },
        ReplayOutcome::PassFailed { pass, decline } => format!("pass {pass} failed: {decline}"),
        ReplayOutcome::RestoreFailed { after_pass, .. } => {
            format!("restore after pass {after_pass} FAILED")
        }
    }
}

/// Everything about `row` that differs from `plan`.
fn check_plan(
    plan: Plan,
    seen: &DispatchObservation,
    record: Option<&ReplayRecord>,
    row: &DispatchRow,
) -> Vec<String> {
    let mut problems = Vec::new();
    if seen.config_exit.is_none() {
        problems.push("CONFIG EXIT never came".into());
    }
    if plan.passes <= 1 {
        if !seen.passes.is_empty() {
            problems.push(format!(
                "{} passes ran, none were asked for",
                seen.passes.len()
            ));
        }
        if seen.snapshot.is_some() {
            problems.push("a snapshot was taken for a dispatch that runs once".into());
        }
        if let Some(record) = record
            && !matches!(
                record.outcome,
                ReplayOutcome::RanOnce {
                    why: RanOnceReason::SinglePass
                }
            )
        {
            problems.push(format!(
                "expected a single pass, kreplay reports {:?}",
                record.outcome
            ));
        }
        if row.unreplayed_contexts != [0] {
            problems.push(format!(
                "the dispatch should reach exactly context c0, it reached [{}]",
                row.contexts_cell()
            ));
        }
        return problems;
    }

    let n = plan.passes;
    match record {
        None => problems.push("kreplay has no cost record of this dispatch".into()),
        Some(record) => {
            let planned = ReplayOutcome::Replayed {
                passes: n,
                end: LoopEnd::LastPass,
            };
            if record.outcome != planned {
                problems.push(format!(
                    "not replayed as planned: {} ({} passes run, {n} asked)",
                    outcome_text(&record.outcome),
                    record.cost.passes_run
                ));
            }
        }
    }
    if seen.passes.len() as u64 != n {
        problems.push(format!(
            "PASS ENTER came {} times, expected {n}",
            seen.passes.len()
        ));
    }
    if let Some(pass) = seen.passes.iter().position(|p| !p.exited) {
        problems.push(format!("PASS EXIT never came for pass {pass}"));
    }
    if seen.snapshot.is_none() {
        problems.push("no SNAPSHOT EXIT".into());
    }
    if plan.restore && seen.restores.len() as u64 != n - 1 {
        problems.push(format!(
            "{} restores between {n} passes, expected {}",
            seen.restores.len(),
            n - 1
        ));
    }
    if !row.unreplayed_contexts.is_empty() {
        problems.push(format!(
            "contexts [{}] got records without a replay pass",
            row.unreplayed_contexts
                .iter()
                .map(|c| format!("c{c}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    for (pass, contexts) in row.pass_contexts.iter().enumerate() {
        let expected = pass % n as usize;
        if contexts != &[expected] {
            problems.push(format!(
                "pass {pass} should reach exactly context c{expected}, it reached {}",
                if contexts.is_empty() {
                    "none".to_string()
                } else {
                    contexts
                        .iter()
                        .map(|c| format!("c{c}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ));
        }
    }
    problems
}

/// Renders the per-dispatch table.
pub fn render_table(rows: &[DispatchRow]) -> String {
    let mut table = Table::new(&[
        ("id", Align::Right),
        ("kernel", Align::Left),
        ("passes", Align::Right),
        ("contexts per pass", Align::Left),
        ("snapshot", Align::Right),
        ("restored", Align::Right),
        ("tier", Align::Left),
        ("strategy", Align::Left),
        ("lock wait", Align::Right),
        ("drain", Align::Right),
        ("snap time", Align::Right),
        ("passes total", Align::Right),
        ("restores total", Align::Right),
        ("", Align::Left),
    ]);
    for row in rows {
        // A dispatch that ran once has no replay cost to show.
        let replayed = !row.pass_contexts.is_empty();
        let bytes = |b: u64| {
            if replayed {
                format_bytes(b)
            } else {
                "-".into()
            }
        };
        let time = |d: Duration| {
            if replayed {
                format_duration(d)
            } else {
                "-".into()
            }
        };
        table.row(vec![
            row.dispatch_id.to_string(),
            row.kernel.clone(),
            row.passes_run.to_string(),
            row.contexts_cell(),
            bytes(row.bytes_snapshotted),
            bytes(row.bytes_restored),
            row.tier.clone(),
            row.strategy.clone(),
            time(row.lock_wait),
            time(row.drain),
            time(row.snapshot),
            time(row.passes_total()),
            time(row.restores_total()),
            if row.problems.is_empty() {
                String::new()
            } else {
                "<- not as planned".to_string()
            },
        ]);
    }
    if rows.len() > 1 {
        let bytes = |f: fn(&DispatchRow) -> u64| format_bytes(rows.iter().map(f).sum());
        let time =
            |f: fn(&DispatchRow) -> Duration| format_duration(rows.iter().map(f).sum::<Duration>());
        table.row(vec![
            "total".into(),
            format!("{} dispatches", rows.len()),
            rows.iter().map(|r| r.passes_run).sum::<u64>().to_string(),
            String::new(),
            bytes(|r| r.bytes_snapshotted),
            bytes(|r| r.bytes_restored),
            String::new(),
            String::new(),
            time(|r| r.lock_wait),
            time(|r| r.drain),
            time(|r| r.snapshot),
            time(DispatchRow::passes_total),
            time(DispatchRow::restores_total),
        ]);
    }
    table.render()
}

/// The result of comparing the profiled run's buffers with the unprofiled run's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verification {
    /// Every buffer is equal.
    Equal {
        /// Buffers compared.
        buffers: usize,
        /// Bytes compared.
        bytes: u64,
    },
    /// Some buffer differs.
    Different {
        /// The first difference (buffer, index, both values) and how much differs.
        detail: String,
    },
}

/// Compares the buffers of two runs, element by element.
pub fn compare(reference: &[Buffer], profiled: &[Buffer]) -> Verification {
    if reference.len() != profiled.len() {
        return Verification::Different {
            detail: format!(
                "the profiled run returned {} buffers, the unprofiled run {}",
                profiled.len(),
                reference.len()
            ),
        };
    }
    let mut bytes = 0;
    for (want, got) in reference.iter().zip(profiled) {
        if want.name != got.name || want.data.len() != got.data.len() {
            return Verification::Different {
                detail: format!(
                    "buffer {} ({} elements) does not match buffer {} ({} elements)",
                    got.name,
                    got.data.len(),
                    want.name,
                    want.data.len()
                ),
            };
        }
        if let Some(index) = want.data.iter().zip(&got.data).position(|(a, b)| a != b) {
            let differing = want
                .data
                .iter()
                .zip(&got.data)
                .filter(|(a, b)| a != b)
                .count();
            return Verification::Different {
                detail: format!(
                    "buffer {} differs first at index {index}: {} (profiled) != {} (unprofiled); \
                     {differing} of {} elements differ",
                    want.name,
                    got.data[index],
                    want.data[index],
                    want.data.len()
                ),
            };
        }
        bytes += want.bytes();
    }
    Verification::Equal {
        buffers: reference.len(),
        bytes,
    }
}

/// The verification line (and whether it passed): PASS needs equal results and no dispatch or
/// tool problem.
pub fn verdict_line(verification: &Verification, problem_count: usize) -> (bool, String) {
    match (verification, problem_count) {
        (Verification::Equal { buffers, bytes }, 0) => (
            true,
            format!(
                "verification: PASS — results equal an unprofiled run ({buffers} buffers, {bytes} \
                 bytes compared)"
            ),
        ),
        (Verification::Equal { buffers, bytes }, problems) => (
            false,
            format!(
                "verification: FAIL — results equal an unprofiled run ({buffers} buffers, {bytes} \
                 bytes compared), but {problems} thing(s) did not go as planned (listed above)"
            ),
        ),
        (Verification::Different { detail }, _) => {
            (false, format!("verification: FAIL — {detail}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::demo::tool::{MemoryEvent, PassObservation};
    use kreplay::abi::{DeclineReason, RestoreStrategy, SnapshotTier, Status};
    use kreplay_passloop::{DispatchInfo, ReplayCost};

    fn memory(pass: u64, bytes: u64) -> MemoryEvent {
        MemoryEvent {
            pass,
            bytes_planned: bytes,
            bytes_moved: bytes,
            regions: 3,
            chunks: 1,
            tier: SnapshotTier::HOST,
            strategy: RestoreStrategy::FULL,
            status: Status::SUCCESS,
            decline: DeclineReason::NONE,
            sources: [(2, bytes - 4), (0, 0), (1, 4), (0, 0)],
            unverified: false,
        }
    }

    fn observed(id: u64, n: u64, contexts: &[&[usize]]) -> DispatchObservation {
        DispatchObservation {
            dispatch_id: id,
            kernel_id: 7,
            planned_passes: n,
            passes: contexts
                .iter()
                .map(|c| PassObservation {
                    contexts: c.to_vec(),
                    records: c.len() as u32,
                    exited: true,
                })
                .collect(),
            unreplayed_contexts: Vec::new(),
            unreplayed_records: 0,
            snapshot: Some(memory(0, 100)),
            restores: (0..n.saturating_sub(1)).map(|p| memory(p, 100)).collect(),
            config_exit: Some((n, DeclineReason::NONE)),
            toggles_ok: 0,
            problems: Vec::new(),
        }
    }

    fn record(id: u64, n: u64) -> ReplayRecord {
        let mut cost = ReplayCost::default();
        cost.passes_run = n;
        cost.lock_wait = Duration::from_micros(2);
        cost.drain = Duration::from_micros(3);
        cost.snapshot = Duration::from_micros(40);
        cost.pass_times = vec![Duration::from_micros(10); n as usize];
        cost.restore_times = vec![Duration::from_micros(5); n as usize - 1];
        cost.bytes_snapshotted = 100;
        cost.bytes_restored = 100 * (n - 1);
        cost.total = Duration::from_micros(200);
        ReplayRecord::new(
            DispatchInfo {
                dispatch_id: id,
                kernel_id: 7,
                ..DispatchInfo::default()
            },
            ReplayOutcome::Replayed {
                passes: n,
                end: LoopEnd::LastPass,
            },
            n,
            cost,
        )
    }

    fn tool(dispatches: Vec<DispatchObservation>) -> ToolReport {
        ToolReport {
            initialized: true,
            dispatches,
            ..ToolReport::default()
        }
    }

    const PLAN: Plan = Plan {
        passes: 3,
        restore: true,
    };

    #[test]
    fn a_dispatch_whose_restores_skipped_verification_says_so() {
        let mut seen = observed(5, 4, &[&[0], &[1], &[2], &[3]]);
        for (i, r) in seen.restores.iter_mut().enumerate() {
            r.strategy = RestoreStrategy::WRITESET;
            // The first restore learns (verified); the later ones are the opt-in shortcut.
            r.unverified = i > 0;
        }
        let (rows, _) = build_rows(
            PLAN,
            &["axpy"],
            &tool(vec![seen.clone()]),
            &[record(5, 4)],
            |_| Some("axpy"),
        );
        assert_eq!(rows[0].strategy, "writeset-unverified");
        for r in seen.restores.iter_mut() {
            r.unverified = false;
        }
        let (rows, _) = build_rows(PLAN, &["axpy"], &tool(vec![seen]), &[record(5, 4)], |_| {
            Some("axpy")
        });
        assert_eq!(rows[0].strategy, "writeset");
    }

    #[test]
    fn a_dispatch_replayed_as_planned_has_no_problems() {
        let (rows, problems) = build_rows(
            PLAN,
            &["axpy"],
            &tool(vec![observed(5, 3, &[&[0], &[1], &[2]])]),
            &[record(5, 3)],
            |_| Some("axpy"),
        );
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(rows.len(), 1);
        let row = &rows[0];
        assert!(row.problems.is_empty(), "{:?}", row.problems);
        assert_eq!(row.contexts_cell(), "c0|c1|c2");
        assert_eq!((row.bytes_snapshotted, row.bytes_restored), (100, 200));
        assert_eq!((row.tier.as_str(), row.strategy.as_str()), ("host", "full"));
        assert_eq!(row.passes_total(), Duration::from_micros(30));
        assert_eq!(row.outcome, "replayed");
    }

    #[test]
    fn a_pass_seen_by_two_contexts_or_none_is_a_masking_problem() {
        let (rows, _) = build_rows(
            PLAN,
            &["axpy"],
            &tool(vec![observed(5, 3, &[&[0, 1], &[], &[2]])]),
            &[record(5, 3)],
            |_| Some("axpy"),
        );
        assert_eq!(rows[0].contexts_cell(), "c0+c1|-|c2");
        let problems = rows[0].problems.join("\n");
        assert!(
            problems.contains("pass 0 should reach exactly context c0"),
            "{problems}"
        );
        assert!(problems.contains("pass 1 should reach exactly context c1, it reached none"));
    }

    #[test]
    fn a_declined_replay_or_missing_restores_are_reported() {
        let mut declined = record(5, 3);
        declined.outcome = ReplayOutcome::RanOnce {
            why: RanOnceReason::Declined(kreplay_passloop::Decline::new(
                kreplay_passloop::DeclineReason::FootprintBudget,
                "too big",
            )),
        };
        let mut seen = observed(5, 3, &[&[0], &[1], &[2]]);
        seen.restores.clear();
        let (rows, _) = build_rows(PLAN, &["axpy"], &tool(vec![seen]), &[declined], |_| {
            Some("axpy")
        });
        let problems = rows[0].problems.join("\n");
        assert!(
            problems.contains("declined: footprint_budget"),
            "{problems}"
        );
        assert!(
            problems.contains("0 restores between 3 passes"),
            "{problems}"
        );
        assert_eq!(rows[0].outcome, "declined: footprint_budget: too big");
    }

    #[test]
    fn without_restore_missing_restores_are_expected() {
        let mut seen = observed(5, 3, &[&[0], &[1], &[2]]);
        seen.restores.clear();
        let plan = Plan {
            passes: 3,
            restore: false,
        };
        let (rows, _) = build_rows(plan, &["axpy"], &tool(vec![seen]), &[record(5, 3)], |_| {
            Some("axpy")
        });
        assert!(rows[0].problems.is_empty(), "{:?}", rows[0].problems);
        assert_eq!(rows[0].strategy, "-");
    }

    #[test]
    fn a_single_pass_dispatch_reaches_context_zero_once() {
        let mut seen = observed(9, 1, &[]);
        seen.snapshot = None;
        seen.restores.clear();
        seen.unreplayed_contexts = vec![0];
        let plan = Plan {
            passes: 1,
            restore: true,
        };
        let (rows, problems) =
            build_rows(plan, &["remix"], &tool(vec![seen]), &[], |_| Some("remix"));
        assert!(problems.is_empty());
        assert!(rows[0].problems.is_empty(), "{:?}", rows[0].problems);
        assert_eq!(rows[0].contexts_cell(), "c0");
        assert_eq!(rows[0].passes_run, 1);
        assert_eq!(rows[0].outcome, "ran once");
    }

    #[test]
    fn dispatch_counts_and_kernel_order_are_checked_against_the_application() {
        let (rows, problems) = build_rows(
            PLAN,
            &["scale_add", "axpy"],
            &tool(vec![observed(5, 3, &[&[0], &[1], &[2]])]),
            &[record(5, 3), record(6, 3)],
            |_| Some("axpy"),
        );
        assert!(problems.iter().any(|p| p.contains("made 2 dispatches")));
        assert!(problems.iter().any(|p| p.contains("dispatch 6")));
        assert!(rows[0].problems.iter().any(|p| p.contains("was scale_add")));
    }

    #[test]
    fn the_table_has_one_line_per_dispatch_and_flags_problems() {
        let good = DispatchRow {
            dispatch_id: 1,
            kernel: "scale_add".into(),
            passes_run: 2,
            pass_contexts: vec![vec![0], vec![1]],
            bytes_snapshotted: 8 << 20,
            bytes_restored: 8 << 20,
            tier: "host".into(),
            strategy: "full".into(),
            pass_times: vec![Duration::from_micros(500), Duration::from_micros(700)],
            ..DispatchRow::default()
        };
        let bad = DispatchRow {
            dispatch_id: 12,
            kernel: "remix".into(),
            problems: vec!["x".into()],
            ..good.clone()
        };
        let text = render_table(&[good, bad]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines[0].trim_start().starts_with("id  kernel"), "{text}");
        assert!(lines[1].contains("c0|c1"));
        assert!(lines[1].contains("8.00 MiB"));
        assert!(lines[1].contains("1.20ms"), "{}", lines[1]);
        assert!(!lines[1].contains("not as planned"));
        assert!(lines[2].trim_start().starts_with("12  remix"), "{text}");
        assert!(lines[2].ends_with("<- not as planned"));
        // The total row adds up both dispatches.
        assert!(lines[3].starts_with("total  2 dispatches"), "{text}");
        assert!(lines[3].contains("16.00 MiB"), "{text}");
        assert!(lines[3].contains("2.40ms"), "{text}");
    }

    #[test]
    fn a_dispatch_that_ran_once_shows_no_replay_cost() {
        let once = DispatchRow {
            dispatch_id: 1,
            kernel: "axpy".into(),
            passes_run: 1,
            unreplayed_contexts: vec![0],
            tier: "-".into(),
            strategy: "-".into(),
            ..DispatchRow::default()
        };
        let text = render_table(&[once]);
        let cells: Vec<&str> = text.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(cells[..4], ["1", "axpy", "1", "c0"]);
        assert!(cells[4..].iter().all(|c| *c == "-"), "{cells:?}");
    }

    fn buffer(name: &'static str, data: Vec<u32>) -> Buffer {
        Buffer { name, data }
    }

    #[test]
    fn equal_buffers_pass_and_count_their_bytes() {
        let a = vec![buffer("x", vec![1, 2, 3]), buffer("hist", vec![9])];
        assert_eq!(
            compare(&a, &a.clone()),
            Verification::Equal {
                buffers: 2,
                bytes: 16
            }
        );
        let (pass, line) = verdict_line(&compare(&a, &a), 0);
        assert!(pass);
        assert_eq!(
            line,
            "verification: PASS — results equal an unprofiled run (2 buffers, 16 bytes compared)"
        );
    }

    #[test]
    fn the_first_difference_is_named_with_both_values() {
        let reference = vec![buffer("x", vec![1, 2, 3]), buffer("y", vec![4, 5, 6])];
        let profiled = vec![buffer("x", vec![1, 2, 3]), buffer("y", vec![4, 50, 60])];
        let Verification::Different { detail } = compare(&reference, &profiled) else {
            panic!("buffers differ");
        };
        assert_eq!(
            detail,
            "buffer y differs first at index 1: 50 (profiled) != 5 (unprofiled); 2 of 3 \
             elements differ"
        );
        let (pass, line) = verdict_line(&Verification::Different { detail }, 0);
        assert!(!pass);
        assert!(line.starts_with("verification: FAIL — buffer y"));
    }

    #[test]
    fn equal_results_with_plan_problems_still_fail() {
        let (pass, line) = verdict_line(
            &Verification::Equal {
                buffers: 1,
                bytes: 4,
            },
            2,
        );
        assert!(!pass);
        assert!(line.contains("2 thing(s) did not go as planned"));
    }
}

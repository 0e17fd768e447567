//! kreplay's own limits on the loop (the cap on passes, the per-dispatch time budget), resources
//! acquired before the snapshot, and what the tool learns at SNAPSHOT and RESTORE EXIT when
//! something went wrong.

mod common;

use std::time::Duration;

use common::{
    Event, after_one_run, assert_dispatch_closed, decline, footprint_bytes, initial_buffers, run,
    setup,
};
use kreplay_passloop::{
    DEFAULT_MAX_PASSES, DeclineReason, LoopEnd, LoopLimits, RanOnceReason, ReplayOutcome,
    ReplayPlan, ToolAnswer,
};

fn limits(max_passes: u64, budget: Option<Duration>) -> LoopLimits {
    LoopLimits::new(max_passes).with_budget(budget)
}

fn invalid_pass_count_detail(outcome: &ReplayOutcome) -> String {
    match outcome {
        ReplayOutcome::RanOnce {
            why: RanOnceReason::Declined(d),
        } if d.reason == DeclineReason::InvalidPassCount => d.detail.clone(),
        other => panic!("expected an invalid_pass_count decline, got {other:?}"),
    }
}

#[test]
fn a_pass_count_above_the_cap_runs_once_as_invalid_pass_count_naming_the_cap() {
    for (cap, answer) in [
        (DEFAULT_MAX_PASSES, ToolAnswer::passes(u64::MAX)),
        (
            DEFAULT_MAX_PASSES,
            ToolAnswer::passes_with_continue(u64::MAX),
        ),
        (8, ToolAnswer::passes(9)),
    ] {
        let (log, _registry, mut device, mut tool) = setup(answer);
        tool.limits = limits(cap, None);
        let record = run(&mut tool, &mut device);
        let detail = invalid_pass_count_detail(&record.outcome);
        assert!(
            detail.contains(&cap.to_string()) && detail.contains("KREPLAY_MAX_PASSES"),
            "the diagnostic names the cap: {detail}"
        );
        assert!(record.has_diagnostic());
        assert!(record.diagnostic().unwrap().contains(&cap.to_string()));
        assert_eq!(
            device.buffers,
            after_one_run(),
            "ran once, memory untouched"
        );
        assert_eq!(
            log.borrow().as_slice(),
            [
                Event::ConfigEnter,
                Event::ConfigExit(record.outcome.clone()),
                Event::RunOnce
            ],
            "no lock, no snapshot, no pass"
        );
        assert_dispatch_closed(&log, &device, &record);
    }
}

#[test]
fn a_pass_count_at_the_cap_is_replayed() {
    let (log, _registry, mut device, mut tool) = setup(ToolAnswer::passes(4));
    tool.limits = limits(4, None);
    let record = run(&mut tool, &mut device);
    assert_eq!(
        record.outcome,
        ReplayOutcome::Replayed {
            passes: 4,
            end: LoopEnd::LastPass
        }
    );
    assert_eq!(device.buffers, after_one_run());
    assert_dispatch_closed(&log, &device, &record);
}

#[test]
fn an_indefinite_loop_whose_continue_never_stops_ends_at_the_cap() {
    let (log, _registry, mut device, mut tool) = setup(ToolAnswer::passes_with_continue(0));
    tool.limits = limits(6, None);
    let record = run(&mut tool, &mut device);
    assert_eq!(
        record.outcome,
        ReplayOutcome::Replayed {
            passes: 6,
            end: LoopEnd::MaxPasses
        }
    );
    assert!(
        record.diagnostic().unwrap().contains("cap"),
        "ending early is reported: {:?}",
        record.diagnostic()
    );
    let continues = log
        .borrow()
        .iter()
        .filter(|e| matches!(e, Event::Continue { .. }))
        .count();
    assert_eq!(
        continues, 5,
        "continue is not consulted after the capped pass"
    );
    assert_eq!(device.buffers, after_one_run(), "memory as after one run");
    assert_dispatch_closed(&log, &device, &record);
}

#[test]
fn the_default_cap_is_1024_passes() {
    assert_eq!(LoopLimits::default(), limits(1024, None));
    assert_eq!(
        ReplayPlan::from_answer(&ToolAnswer::passes(1024)),
        ReplayPlan::Replay {
            total_passes: 1024,
            has_continue: false
        }
    );
    let plan = ReplayPlan::from_answer(&ToolAnswer::passes(1025));
    assert!(
        matches!(plan, ReplayPlan::Once(RanOnceReason::Declined(ref d)) if d.detail.contains("1024")),
        "{plan:?}"
    );
}

#[test]
fn a_spent_budget_stops_further_passes_never_the_running_one() {
    let (log, _registry, mut device, mut tool) = setup(ToolAnswer::passes(5));
    // A zero budget is spent as soon as the first pass ends: that pass completes, no other
    // starts.
    tool.limits = limits(DEFAULT_MAX_PASSES, Some(Duration::ZERO));
    let record = run(&mut tool, &mut device);
    assert_eq!(
        record.outcome,
        ReplayOutcome::Replayed {
            passes: 1,
            end: LoopEnd::Budget
        }
    );
    let runs: Vec<u64> = log
        .borrow()
        .iter()
        .filter_map(|e| match e {
            Event::RunPass(p) => Some(*p),
            _ => None,
        })
        .collect();
    assert_eq!(
        runs,
        vec![0],
        "the running pass finished, no further pass started"
    );
    assert!(record.has_diagnostic());
    assert!(record.diagnostic().unwrap().contains("budget"));
    assert_eq!(device.buffers, after_one_run());
    assert_dispatch_closed(&log, &device, &record);
}

#[test]
fn with_a_budget_every_restore_is_exact_so_any_pass_may_be_the_last() {
    let (log, _registry, mut device, mut tool) = setup(ToolAnswer::passes(4));
    tool.limits = limits(DEFAULT_MAX_PASSES, Some(Duration::from_secs(3600)));
    let record = run(&mut tool, &mut device);
    assert_eq!(
        record.outcome,
        ReplayOutcome::Replayed {
            passes: 4,
            end: LoopEnd::LastPass
        }
    );
    let requests: Vec<bool> = log
        .borrow()
        .iter()
        .filter_map(|e| match e {
            Event::Restore(r) => Some(r.next_may_be_final),
            _ => None,
        })
        .collect();
    assert_eq!(requests, vec![true; 3]);
    assert_dispatch_closed(&log, &device, &record);
}

#[test]
fn a_resource_failure_before_the_snapshot_declines_and_runs_once() {
    let (log, _registry, mut device, mut tool) = setup(ToolAnswer::passes(3));
    device.faults.prepare = Some(decline(DeclineReason::SnapshotFailed));
    let record = run(&mut tool, &mut device);
    match &record.outcome {
        ReplayOutcome::RanOnce {
            why: RanOnceReason::Declined(d),
        } => assert_eq!(d.reason, DeclineReason::SnapshotFailed),
        other => panic!("expected a decline, got {other:?}"),
    }
    let events = log.borrow().clone();
    assert!(
        !events.iter().any(|e| matches!(
            e,
            Event::PlanSnapshot | Event::SnapshotEnter { .. } | Event::PassEnter { .. }
        )),
        "no snapshot and no pass after a failed prepare: {events:?}"
    );
    assert_eq!(device.buffers, after_one_run());
    assert_dispatch_closed(&log, &device, &record);
}

#[test]
fn a_declined_snapshot_exit_carries_the_reason() {
    let (log, _registry, mut device, mut tool) = setup(ToolAnswer::passes(3));
    device.faults.take_snapshot = Some(decline(DeclineReason::FootprintBudget));
    let record = run(&mut tool, &mut device);
    assert_eq!(tool.exit_reports.len(), 1, "one SNAPSHOT EXIT");
    let exit = tool.exit_reports[0];
    assert_eq!(exit.declined, Some(DeclineReason::FootprintBudget));
    assert_eq!(exit.bytes_moved, 0);
    assert_dispatch_closed(&log, &device, &record);

    let (log, _registry, mut device, mut tool) = setup(ToolAnswer::passes(2));
    let record = run(&mut tool, &mut device);
    assert_eq!(
        tool.exit_reports[0].declined, None,
        "a taken snapshot is not declined"
    );
    assert!(!tool.exit_reports[1].failed, "a good restore did not fail");
    assert_dispatch_closed(&log, &device, &record);
}

#[test]
fn a_failed_restore_exit_carries_the_failure_and_the_bytes_lost() {
    let (log, _registry, mut device, mut tool) = setup(ToolAnswer::passes(3));
    device.faults.failing_restore_before = Some(2);
    let record = run(&mut tool, &mut device);
    let restores = &tool.exit_reports[1..];
    assert_eq!(restores.len(), 2);
    assert!(!restores[0].failed && restores[0].bytes_lost == 0);
    assert!(
        restores[1].failed,
        "the failed restore says so: {:?}",
        restores[1]
    );
    let moved = initial_buffers()[0].len() as u64 * 8;
    assert_eq!(restores[1].bytes_lost, footprint_bytes() - moved);
    match &record.outcome {
        ReplayOutcome::RestoreFailed { failure, .. } => {
            assert_eq!(failure.bytes_unrestored, restores[1].bytes_lost)
        }
        other => panic!("expected a failed restore, got {other:?}"),
    }
    assert_dispatch_closed(&log, &device, &record);
}

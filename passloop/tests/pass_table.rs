//! Every row of the pass-count table (docs/abi.md §2), the exact callback order, early exit, indefinite loops
//! and the continue callback's rules.

mod common;

use common::{Event, INFO, after_one_run, assert_dispatch_closed, footprint_bytes, run, setup};
use kreplay_passloop::{
    ContinueChange, DeclineReason, LoopEnd, RanOnceReason, ReplayOutcome, RestoreRequest,
    ToolAnswer,
};

fn passes_entered(events: &[Event]) -> Vec<(u64, u64)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::PassEnter { pass, total } => Some((*pass, *total)),
            _ => None,
        })
        .collect()
}

fn continues_asked(events: &[Event]) -> Vec<u64> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Continue { pass, .. } => Some(*pass),
            _ => None,
        })
        .collect()
}

fn restore_requests(events: &[Event]) -> Vec<RestoreRequest> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Restore(request) => Some(*request),
            _ => None,
        })
        .collect()
}

#[test]
fn null_pass_count_runs_once_without_lock_snapshot_or_passes() {
    let (log, _registry, mut device, mut tool) = setup(ToolAnswer::OPT_OUT);
    let record = run(&mut tool, &mut device);
    let expected_outcome = ReplayOutcome::RanOnce {
        why: RanOnceReason::OptedOut,
    };
    assert_eq!(record.outcome, expected_outcome);
    assert_eq!(
        *log.borrow(),
        vec![
            Event::ConfigEnter,
            Event::ConfigExit(expected_outcome),
            Event::RunOnce,
        ]
    );
    assert_eq!(device.buffers, after_one_run());
    assert_eq!(record.diagnostic(), None);
    assert!(!record.has_diagnostic());
    assert_eq!(record.cost.passes_run, 0);
    assert_dispatch_closed(&log, &device, &record);
}

#[test]
fn null_pass_count_ignores_a_continue_callback() {
    let (log, _registry, mut device, mut tool) = setup(ToolAnswer::new(None, true));
    let record = run(&mut tool, &mut device);
    assert_eq!(
        record.outcome,
        ReplayOutcome::RanOnce {
            why: RanOnceReason::OptedOut
        }
    );
    assert!(continues_asked(&log.borrow()).is_empty());
    assert_dispatch_closed(&log, &device, &record);
}

#[test]
fn one_pass_is_the_ordinary_path_without_snapshot_or_pass_callbacks() {
    for answer in [ToolAnswer::passes(1), ToolAnswer::passes_with_continue(1)] {
        let (log, _registry, mut device, mut tool) = setup(answer);
        let record = run(&mut tool, &mut device);
        let expected_outcome = ReplayOutcome::RanOnce {
            why: RanOnceReason::SinglePass,
        };
        assert_eq!(record.outcome, expected_outcome);
        assert_eq!(
            *log.borrow(),
            vec![
                Event::ConfigEnter,
                Event::ConfigExit(expected_outcome),
                Event::RunOnce,
            ],
            "{answer:?}"
        );
        assert_eq!(device.buffers, after_one_run());
        assert_eq!(record.diagnostic(), None);
        assert_dispatch_closed(&log, &device, &record);
    }
}

#[test]
fn n_passes_without_continue_runs_exactly_n_in_spec_order() {
    let (log, _registry, mut device, mut tool) = setup(ToolAnswer::passes(3));
    let record = run(&mut tool, &mut device);
    let outcome = ReplayOutcome::Replayed {
        passes: 3,
        end: LoopEnd::LastPass,
    };
    assert_eq!(record.outcome, outcome);
    let fp = footprint_bytes();
    let restore = |completed_pass, next_may_be_final| {
        let request = RestoreRequest {
            completed_pass,
            next_pass: completed_pass + 1,
            next_may_be_final,
        };
        [
            Event::PlanRestore(request),
            Event::RestoreEnter {
                next_pass: request.next_pass,
                planned: fp,
            },
            Event::Restore(request),
            Event::RestoreExit {
                next_pass: request.next_pass,
                moved: fp,
            },
        ]
    };
    let pass = |pass| {
        [
            Event::PassEnter { pass, total: 3 },
            Event::RunPass(pass),
            Event::PassExit { pass, total: 3 },
        ]
    };
    let mut expected = vec![
        Event::ConfigEnter,
        Event::CheckReplayable,
        Event::Lock,
        Event::Drain,
        Event::PlanSnapshot,
        Event::SnapshotEnter {
            planned: fp,
            moved: 0,
        },
        Event::TakeSnapshot,
        Event::SnapshotExit {
            planned: fp,
            moved: fp,
        },
    ];
    expected.extend(pass(0));
    expected.extend(restore(0, false));
    expected.extend(pass(1));
    expected.extend(restore(1, true));
    expected.extend(pass(2));
    expected.extend([
        Event::DiscardSnapshot,
        Event::ConfigExit(outcome),
        Event::FireCompletion,
        Event::Unlock,
    ]);
    assert_eq!(*log.borrow(), expected);
    assert_eq!(device.buffers, after_one_run());
    assert_dispatch_closed(&log, &device, &record);
}

#[test]
fn n_passes_with_continue_that_never_stops_runs_n_and_is_not_asked_after_the_last() {
    let (log, _registry, mut device, mut tool) = setup(ToolAnswer::passes_with_continue(4));
    let record = run(&mut tool, &mut device);
    assert_eq!(
        record.outcome,
        ReplayOutcome::Replayed {
            passes: 4,
            end: LoopEnd::LastPass
        }
    );
    let events = log.borrow();
    assert_eq!(continues_asked(&events), vec![0, 1, 2]);
    // The continue callback follows PASS EXIT and precedes the restore.
    let exit_1 = events
        .iter()
        .position(|e| *e == Event::PassExit { pass: 1, total: 4 })
        .unwrap();
    assert_eq!(events[exit_1 + 1], Event::Continue { pass: 1, total: 4 });
    assert!(matches!(events[exit_1 + 2], Event::PlanRestore(_)));
    drop(events);
    assert_eq!(device.buffers, after_one_run());
    assert_dispatch_closed(&log, &device, &record);
}

#[test]
fn n_passes_with_continue_stop_early_without_a_restore_after_the_final_pass() {
    let (log, _registry, mut device, mut tool) = setup(ToolAnswer::passes_with_continue(5));
    tool.keep_going = Box::new(|pass, total| {
        assert_eq!(total, 5);
        pass < 1
    });
    let record = run(&mut tool, &mut device);
    assert_eq!(
        record.outcome,
        ReplayOutcome::Replayed {
            passes: 2,
            end: LoopEnd::ContinueStopped
        }
    );
    let events = log.borrow();
    assert_eq!(passes_entered(&events), vec![(0, 5), (1, 5)]);
    assert_eq!(continues_asked(&events), vec![0, 1]);
    assert_eq!(restore_requests(&events).len(), 1);
    let stop = events
        .iter()
        .position(|e| *e == Event::Continue { pass: 1, total: 5 })
        .unwrap();
    assert_eq!(events[stop + 1], Event::DiscardSnapshot);
    drop(events);
    assert_eq!(record.cost.passes_run, 2);
    assert_eq!(device.buffers, after_one_run());
    assert_dispatch_closed(&log, &device, &record);
}

#[test]
fn continue_stopping_after_the_first_pass_needs_no_restore() {
    let (log, _registry, mut device, mut tool) = setup(ToolAnswer::passes_with_continue(3));
    tool.keep_going = Box::new(|_, _| false);
    let record = run(&mut tool, &mut device);
    assert_eq!(
        record.outcome,
        ReplayOutcome::Replayed {
            passes: 1,
            end: LoopEnd::ContinueStopped
        }
    );
    assert!(restore_requests(&log.borrow()).is_empty());
    assert_eq!(record.cost.bytes_restored, 0);
    assert_eq!(device.buffers, after_one_run());
    assert_dispatch_closed(&log, &device, &record);
}

#[test]
fn zero_with_continue_runs_until_continue_says_stop_and_reports_total_zero() {
    let (log, _registry, mut device, mut tool) = setup(ToolAnswer::passes_with_continue(0));
    tool.keep_going = Box::new(|pass, total| {
        assert_eq!(total, 0);
        pass < 6
    });
    let record = run(&mut tool, &mut device);
    assert_eq!(
        record.outcome,
        ReplayOutcome::Replayed {
            passes: 7,
            end: LoopEnd::ContinueStopped
        }
    );
    assert_eq!(record.total_passes, 0);
    let events = log.borrow();
    assert_eq!(
        passes_entered(&events),
        (0..7).map(|p| (p, 0)).collect::<Vec<_>>()
    );
    assert_eq!(continues_asked(&events), (0..7).collect::<Vec<_>>());
    // Any pass of an indefinite loop may be its last: every restore must be exact.
    let requests = restore_requests(&events);
    assert_eq!(requests.len(), 6);
    assert!(requests.iter().all(|r| r.next_may_be_final));
    drop(events);
    assert_eq!(device.buffers, after_one_run());
    assert_dispatch_closed(&log, &device, &record);
}

#[test]
fn zero_without_continue_is_invalid_runs_once_and_says_so() {
    let (log, _registry, mut device, mut tool) = setup(ToolAnswer::passes(0));
    let record = run(&mut tool, &mut device);
    match &record.outcome {
        ReplayOutcome::RanOnce {
            why: RanOnceReason::Declined(decline),
        } => assert_eq!(decline.reason, DeclineReason::InvalidPassCount),
        other => panic!("expected an invalid_pass_count decline, got {other:?}"),
    }
    let events = log.borrow();
    assert_eq!(
        *events,
        vec![
            Event::ConfigEnter,
            Event::ConfigExit(record.outcome.clone()),
            Event::RunOnce,
        ]
    );
    drop(events);
    let diagnostic = record
        .diagnostic()
        .expect("invalid pass count must be visible");
    assert!(diagnostic.contains("invalid_pass_count"), "{diagnostic}");
    assert!(diagnostic.contains("dispatch 7"), "{diagnostic}");
    assert_eq!(tool.outcomes, vec![record.outcome.clone()]);
    assert_eq!(device.buffers, after_one_run());
    assert_dispatch_closed(&log, &device, &record);
}

#[test]
fn restore_requests_mark_only_the_last_of_n_as_possibly_final_without_continue() {
    let (log, _registry, mut device, mut tool) = setup(ToolAnswer::passes(4));
    run(&mut tool, &mut device);
    let requests = restore_requests(&log.borrow());
    let flags: Vec<_> = requests
        .iter()
        .map(|r| (r.completed_pass, r.next_pass, r.next_may_be_final))
        .collect();
    assert_eq!(flags, vec![(0, 1, false), (1, 2, false), (2, 3, true)]);
}

#[test]
fn restore_requests_are_all_possibly_final_with_continue() {
    let (log, _registry, mut device, mut tool) = setup(ToolAnswer::passes_with_continue(4));
    run(&mut tool, &mut device);
    let requests = restore_requests(&log.borrow());
    assert_eq!(requests.len(), 3);
    assert!(requests.iter().all(|r| r.next_may_be_final));
}

#[test]
fn continue_set_at_pass_exit_is_asked_right_after_that_pass() {
    // N = 5 without continue at CONFIG ENTER; at PASS EXIT of pass 1 the tool sets one that
    // always says stop. kreplay.h: "Asked after each PASS EXIT except the last of a fixed
    // count": asked after pass 1 (it was first asked after pass 2, and a third pass ran).
    let (log, _registry, mut device, mut tool) = setup(ToolAnswer::passes(5));
    tool.on_pass_exit = Box::new(|pass| {
        if pass == 1 {
            ContinueChange::Set
        } else {
            ContinueChange::Keep
        }
    });
    tool.keep_going = Box::new(|_, _| false);
    let record = run(&mut tool, &mut device);
    assert_eq!(
        record.outcome,
        ReplayOutcome::Replayed {
            passes: 2,
            end: LoopEnd::ContinueStopped
        }
    );
    assert_eq!(continues_asked(&log.borrow()), vec![1]);
    assert_eq!(device.buffers, after_one_run());
    assert_dispatch_closed(&log, &device, &record);
}

#[test]
fn continue_set_after_an_unverified_restore_is_asked_after_the_next_exact_one() {
    // The same, where the restore before pass 1 was the explicitly unverified kind (not asked
    // to be exact): pass 1 may have run on other bytes, so the loop cannot end there; it asks
    // after pass 2, whose restore was exact.
    let (log, _registry, mut device, mut tool) = setup(ToolAnswer::passes(5));
    device.unverified_unless_final = true;
    tool.on_pass_exit = Box::new(|pass| {
        if pass == 1 {
            ContinueChange::Set
        } else {
            ContinueChange::Keep
        }
    });
    tool.keep_going = Box::new(|_, _| false);
    let record = run(&mut tool, &mut device);
    assert_eq!(
        record.outcome,
        ReplayOutcome::Replayed {
            passes: 3,
            end: LoopEnd::ContinueStopped
        }
    );
    let events = log.borrow();
    assert_eq!(continues_asked(&events), vec![2]);
    let flags: Vec<_> = restore_requests(&events)
        .iter()
        .map(|r| r.next_may_be_final)
        .collect();
    assert_eq!(flags, vec![false, true]);
    drop(events);
    assert_eq!(device.buffers, after_one_run());
    assert_dispatch_closed(&log, &device, &record);
}

#[test]
fn continue_set_at_the_first_pass_exit_can_stop_right_away() {
    let (log, _registry, mut device, mut tool) = setup(ToolAnswer::passes(5));
    tool.on_pass_exit = Box::new(|_| ContinueChange::Set);
    tool.keep_going = Box::new(|_, _| false);
    let record = run(&mut tool, &mut device);
    assert_eq!(
        record.outcome,
        ReplayOutcome::Replayed {
            passes: 1,
            end: LoopEnd::ContinueStopped
        }
    );
    assert_eq!(continues_asked(&log.borrow()), vec![0]);
    assert_eq!(device.buffers, after_one_run());
}

#[test]
fn continue_cleared_in_an_n_pass_loop_runs_the_remaining_passes() {
    let (log, _registry, mut device, mut tool) = setup(ToolAnswer::passes_with_continue(4));
    tool.on_pass_exit = Box::new(|pass| {
        if pass == 0 {
            ContinueChange::Clear
        } else {
            ContinueChange::Keep
        }
    });
    tool.keep_going = Box::new(|_, _| panic!("a cleared continue callback was called"));
    let record = run(&mut tool, &mut device);
    assert_eq!(
        record.outcome,
        ReplayOutcome::Replayed {
            passes: 4,
            end: LoopEnd::LastPass
        }
    );
    let flags: Vec<_> = restore_requests(&log.borrow())
        .iter()
        .map(|r| r.next_may_be_final)
        .collect();
    // Without a continue callback only the restore before the last of N must be exact.
    assert_eq!(flags, vec![false, false, true]);
    assert_eq!(device.buffers, after_one_run());
}

#[test]
fn continue_cleared_in_an_indefinite_loop_ends_it_after_that_pass() {
    let (log, _registry, mut device, mut tool) = setup(ToolAnswer::passes_with_continue(0));
    tool.on_pass_exit = Box::new(|pass| {
        if pass == 2 {
            ContinueChange::Clear
        } else {
            ContinueChange::Keep
        }
    });
    let record = run(&mut tool, &mut device);
    assert_eq!(
        record.outcome,
        ReplayOutcome::Replayed {
            passes: 3,
            end: LoopEnd::ContinueCleared
        }
    );
    assert_eq!(continues_asked(&log.borrow()), vec![0, 1]);
    assert_eq!(device.buffers, after_one_run());
    assert_dispatch_closed(&log, &device, &record);
}

#[test]
fn every_pass_reports_the_same_dispatch_and_distinct_pass_indices() {
    // ScriptedTool asserts that every PASS ENTER carries INFO; here the indices are checked.
    let (log, _registry, mut device, mut tool) = setup(ToolAnswer::passes(6));
    let record = run(&mut tool, &mut device);
    assert_eq!(record.info, INFO);
    assert_eq!(
        passes_entered(&log.borrow()),
        (0..6).map(|p| (p, 6)).collect::<Vec<_>>()
    );
}

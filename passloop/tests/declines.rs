//! Each decline reason from the step that produces it, stuck passes, failed restores, the lock
//! released on every path, and the application's completion fired exactly once on every path.

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};

use common::{
    Event, Faults, HostDevice, ScriptedTool, after_one_run, assert_dispatch_closed, decline,
    footprint_bytes, initial_buffers, run, setup,
};
use kreplay_passloop::{DeclineReason, LoopEnd, RanOnceReason, ReplayOutcome, ToolAnswer};

/// The events a declined replay produces, from CONFIG ENTER on, for the failing step.
fn declined_events(reason: DeclineReason, outcome: &ReplayOutcome) -> (Faults, Vec<Event>) {
    let fp = footprint_bytes();
    let injected = decline(reason);
    let mut faults = Faults::default();
    let mut events = vec![Event::ConfigEnter, Event::CheckReplayable];
    let locked = match reason {
        DeclineReason::BatchOrGraph => {
            faults.not_replayable = Some(injected);
            false
        }
        DeclineReason::ReentrantDispatch => {
            faults.lock = Some(injected);
            events.push(Event::Lock);
            false
        }
        DeclineReason::QueueDrainStuck | DeclineReason::AgentDrainStuck => {
            faults.drain = Some(injected);
            events.extend([Event::Lock, Event::Drain]);
            true
        }
        DeclineReason::UntrackedMemory | DeclineReason::FootprintBudget => {
            faults.plan_snapshot = Some(injected);
            events.extend([Event::Lock, Event::Drain, Event::PlanSnapshot]);
            true
        }
        DeclineReason::SnapshotFailed => {
            faults.take_snapshot = Some(injected);
            events.extend([
                Event::Lock,
                Event::Drain,
                Event::PlanSnapshot,
                Event::SnapshotEnter {
                    planned: fp,
                    moved: 0,
                },
                Event::TakeSnapshot,
                // Paired EXIT: nothing usable was kept.
                Event::SnapshotExit {
                    planned: fp,
                    moved: 0,
                },
            ]);
            true
        }
        other => unreachable!("{other:?} is not a decline of a device step before the passes"),
    };
    events.extend([Event::ConfigExit(outcome.clone()), Event::RunOnce]);
    if locked {
        events.push(Event::Unlock);
    }
    (faults, events)
}

#[test]
fn each_pre_pass_decline_runs_once_releases_the_lock_and_reports_its_reason() {
    let reasons = [
        DeclineReason::BatchOrGraph,
        DeclineReason::ReentrantDispatch,
        DeclineReason::QueueDrainStuck,
        DeclineReason::AgentDrainStuck,
        DeclineReason::UntrackedMemory,
        DeclineReason::FootprintBudget,
        DeclineReason::SnapshotFailed,
    ];
    for reason in reasons {
        let (log, _registry, mut device, mut tool) = setup(ToolAnswer::passes(3));
        let outcome = ReplayOutcome::RanOnce {
            why: RanOnceReason::Declined(decline(reason)),
        };
        let (faults, expected) = declined_events(reason, &outcome);
        device.faults = faults;
        let record = run(&mut tool, &mut device);
        assert_eq!(record.outcome, outcome, "{reason}");
        assert_eq!(*log.borrow(), expected, "{reason}");
        assert!(!record.outcome.is_failure());
        assert_eq!(record.outcome.decline(), Some(&decline(reason)));
        // Memory is as one ordinary run left it; replay touched nothing.
        assert_eq!(device.buffers, after_one_run(), "{reason}");
        assert_eq!(record.cost.passes_run, 0);
        assert_eq!(record.cost.bytes_snapshotted, 0);
        assert!(record.has_diagnostic());
        let diagnostic = record.diagnostic().expect("declines are reported");
        assert!(diagnostic.contains(reason.as_str()), "{diagnostic}");
        assert!(diagnostic.contains("injected"), "{diagnostic}");
        assert_dispatch_closed(&log, &device, &record);
    }
}

#[test]
fn footprint_budget_exceeded_while_copying_declines_like_a_failed_snapshot() {
    let (log, _registry, mut device, mut tool) = setup(ToolAnswer::passes(2));
    device.faults.take_snapshot = Some(decline(DeclineReason::FootprintBudget));
    let record = run(&mut tool, &mut device);
    assert_eq!(
        record.outcome.decline().map(|d| d.reason),
        Some(DeclineReason::FootprintBudget)
    );
    assert_eq!(device.buffers, after_one_run());
    assert_eq!(device.live_snapshots, 0);
    assert_dispatch_closed(&log, &device, &record);
}

#[test]
fn a_stuck_pass_stops_the_loop_loudly_and_still_completes_once() {
    let (log, _registry, mut device, mut tool) = setup(ToolAnswer::passes(4));
    device.faults.stuck_pass = Some((1, decline(DeclineReason::PassDrainStuck)));
    let record = run(&mut tool, &mut device);
    let expected_outcome = ReplayOutcome::PassFailed {
        pass: 1,
        decline: decline(DeclineReason::PassDrainStuck),
    };
    assert_eq!(record.outcome, expected_outcome);
    assert!(record.outcome.is_failure());
    let events = log.borrow();
    let from_pass_1 = events
        .iter()
        .position(|e| *e == Event::PassEnter { pass: 1, total: 4 })
        .unwrap();
    assert_eq!(
        events[from_pass_1..],
        [
            Event::PassEnter { pass: 1, total: 4 },
            Event::RunPass(1),
            // ENTER and EXIT stay paired even for the failed pass.
            Event::PassExit { pass: 1, total: 4 },
            Event::DiscardSnapshot,
            Event::ConfigExit(expected_outcome),
            Event::FireCompletion,
            Event::Unlock,
        ]
    );
    drop(events);
    assert_eq!(record.cost.passes_run, 2);
    assert_eq!(record.cost.pass_times.len(), 2);
    assert!(record.has_diagnostic());
    let diagnostic = record.diagnostic().expect("a failed pass is reported");
    assert!(diagnostic.contains("pass 1"), "{diagnostic}");
    assert!(diagnostic.contains("pass_drain_stuck"), "{diagnostic}");
    assert_dispatch_closed(&log, &device, &record);
}

#[test]
fn a_failed_restore_is_reported_with_what_was_lost_and_stops_the_loop() {
    let (log, _registry, mut device, mut tool) = setup(ToolAnswer::passes(4));
    device.faults.failing_restore_before = Some(2);
    let record = run(&mut tool, &mut device);
    let first_buffer_bytes = initial_buffers()[0].len() as u64 * 8;
    let lost = footprint_bytes() - first_buffer_bytes;
    match &record.outcome {
        ReplayOutcome::RestoreFailed {
            after_pass,
            failure,
        } => {
            assert_eq!(*after_pass, 1);
            assert_eq!(failure.bytes_unrestored, lost);
            assert_eq!(failure.report.bytes_moved, first_buffer_bytes);
        }
        other => panic!("expected RestoreFailed, got {other:?}"),
    }
    assert!(record.outcome.is_failure());
    let events = log.borrow();
    let tail_from = events
        .iter()
        .position(|e| matches!(e, Event::RestoreEnter { next_pass: 2, .. }))
        .unwrap();
    assert_eq!(
        events[tail_from + 1..],
        [
            Event::Restore(kreplay_passloop::RestoreRequest {
                completed_pass: 1,
                next_pass: 2,
                next_may_be_final: false,
            }),
            // The tool sees the partial restore at EXIT.
            Event::RestoreExit {
                next_pass: 2,
                moved: first_buffer_bytes,
            },
            Event::DiscardSnapshot,
            Event::ConfigExit(record.outcome.clone()),
            Event::FireCompletion,
            Event::Unlock,
        ]
    );
    assert!(!events.contains(&Event::PassEnter { pass: 2, total: 4 }));
    drop(events);
    // The loss is real: the first buffer was rolled back, the others hold pass 1's result on
    // top of pass 0's (restored) input, i.e. one run; the first buffer holds the input.
    let mut expected = after_one_run();
    expected[0] = initial_buffers()[0].clone();
    assert_eq!(device.buffers, expected);
    assert_ne!(device.buffers, after_one_run());
    assert!(record.has_diagnostic());
    let diagnostic = record
        .diagnostic()
        .expect("a failed restore must never be silent");
    assert!(
        diagnostic.contains(&format!("{lost} bytes not restored")),
        "{diagnostic}"
    );
    assert!(diagnostic.contains("after pass 1"), "{diagnostic}");
    assert!(diagnostic.contains("copy engine fault"), "{diagnostic}");
    assert_eq!(tool.outcomes, vec![record.outcome.clone()]);
    assert_eq!(
        record.cost.bytes_restored,
        footprint_bytes() + first_buffer_bytes
    );
    assert_dispatch_closed(&log, &device, &record);
}

#[test]
fn the_lock_is_released_and_the_mask_reset_when_a_tool_callback_unwinds() {
    let (log, registry, mut device, mut tool) = setup(ToolAnswer::passes(3));
    let context = registry.create();
    registry.start(context).unwrap();
    tool.on_pass_enter = Box::new(move |pass| {
        kreplay_ctxmask::replay_stop_context(context).unwrap();
        if pass == 1 {
            panic!("tool bug in PASS ENTER");
        }
    });
    let unwound = catch_unwind(AssertUnwindSafe(|| run(&mut tool, &mut device)));
    assert!(unwound.is_err());
    assert!(!device.lock_held);
    assert_eq!(device.unlocks, 1);
    assert_eq!(log.borrow().last(), Some(&Event::Unlock));
    assert!(registry.is_active(context), "mask must reset on unwind");
}

/// Every path through the loop, as (name, answer, device setup, tool setup).
type Scenario = (
    &'static str,
    ToolAnswer,
    fn(&mut HostDevice),
    fn(&mut ScriptedTool),
);

#[test]
fn application_completion_fires_exactly_once_on_every_path() {
    fn nothing(_: &mut HostDevice) {}
    fn no_script(_: &mut ScriptedTool) {}
    let scenarios: Vec<Scenario> = vec![
        ("opt-out", ToolAnswer::OPT_OUT, nothing, no_script),
        ("single pass", ToolAnswer::passes(1), nothing, no_script),
        ("invalid", ToolAnswer::passes(0), nothing, no_script),
        ("n passes", ToolAnswer::passes(3), nothing, no_script),
        (
            "early stop",
            ToolAnswer::passes_with_continue(3),
            nothing,
            |t| t.keep_going = Box::new(|p, _| p < 1),
        ),
        (
            "indefinite",
            ToolAnswer::passes_with_continue(0),
            nothing,
            |t| t.keep_going = Box::new(|p, _| p < 4),
        ),
        (
            "batch",
            ToolAnswer::passes(3),
            |d| d.faults.not_replayable = Some(decline(DeclineReason::BatchOrGraph)),
            no_script,
        ),
        (
            "reentrant",
            ToolAnswer::passes(3),
            |d| d.faults.lock = Some(decline(DeclineReason::ReentrantDispatch)),
            no_script,
        ),
        (
            "drain",
            ToolAnswer::passes(3),
            |d| d.faults.drain = Some(decline(DeclineReason::AgentDrainStuck)),
            no_script,
        ),
        (
            "plan",
            ToolAnswer::passes(3),
            |d| d.faults.plan_snapshot = Some(decline(DeclineReason::UntrackedMemory)),
            no_script,
        ),
        (
            "snapshot",
            ToolAnswer::passes(3),
            |d| d.faults.take_snapshot = Some(decline(DeclineReason::SnapshotFailed)),
            no_script,
        ),
        (
            "stuck pass 0",
            ToolAnswer::passes(3),
            |d| d.faults.stuck_pass = Some((0, decline(DeclineReason::PassDrainStuck))),
            no_script,
        ),
        (
            "failed restore",
            ToolAnswer::passes(3),
            |d| d.faults.failing_restore_before = Some(1),
            no_script,
        ),
    ];
    for (name, answer, device_setup, tool_setup) in scenarios {
        let (log, _registry, mut device, mut tool) = setup(answer);
        device_setup(&mut device);
        tool_setup(&mut tool);
        let record = run(&mut tool, &mut device);
        let completions = log
            .borrow()
            .iter()
            .filter(|e| matches!(e, Event::RunOnce | Event::FireCompletion))
            .count();
        assert_eq!(completions, 1, "{name}: {:?}", record.outcome);
        // The completion comes after CONFIG EXIT (and before the unlock, when locked).
        let events = log.borrow();
        let exit = events
            .iter()
            .position(|e| matches!(e, Event::ConfigExit(_)))
            .unwrap();
        assert!(
            matches!(events[exit + 1], Event::RunOnce | Event::FireCompletion),
            "{name}"
        );
        drop(events);
        assert_dispatch_closed(&log, &device, &record);
    }
}

#[test]
fn a_replayed_dispatch_reports_no_diagnostic() {
    let (_log, _registry, mut device, mut tool) = setup(ToolAnswer::passes(2));
    let record = run(&mut tool, &mut device);
    assert_eq!(
        record.outcome,
        ReplayOutcome::Replayed {
            passes: 2,
            end: LoopEnd::LastPass
        }
    );
    assert_eq!(record.diagnostic(), None);
    assert!(!record.has_diagnostic());
    assert_eq!(record.outcome.decline(), None);
}

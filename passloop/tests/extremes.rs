//! Pass counts at their extremes (0, 1, `u64::MAX`), caps of 0 and `u64::MAX`, a zero time
//! budget, and callbacks that unwind part way through a replay.

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use common::*;
use kreplay_passloop::*;

#[test]
fn u64_max_passes_under_the_default_cap_is_declined_and_runs_once() {
    let (log, _registry, mut device, mut tool) = setup(ToolAnswer::passes(u64::MAX));
    let record = run(&mut tool, &mut device);
    assert!(
        matches!(&record.outcome, ReplayOutcome::RanOnce { why: RanOnceReason::Declined(d) }
            if d.reason == DeclineReason::InvalidPassCount),
        "{:?}",
        record.outcome
    );
    assert_eq!(device.buffers, after_one_run());
    assert_dispatch_closed(&log, &device, &record);
}

#[test]
fn u64_max_passes_under_an_unlimited_cap_ends_when_continue_says_so_without_overflow() {
    let (log, _registry, mut device, mut tool) = setup(ToolAnswer::passes_with_continue(u64::MAX));
    tool.limits = LoopLimits::new(u64::MAX);
    tool.keep_going = Box::new(|pass, total| {
        assert_eq!(total, u64::MAX);
        pass < 2
    });
    let record = run(&mut tool, &mut device);
    assert_eq!(
        record.outcome,
        ReplayOutcome::Replayed {
            passes: 3,
            end: LoopEnd::ContinueStopped
        }
    );
    assert_eq!(record.total_passes, u64::MAX);
    assert_eq!(device.buffers, after_one_run());
    assert_dispatch_closed(&log, &device, &record);
}

#[test]
fn an_indefinite_loop_under_a_cap_of_zero_runs_one_pass() {
    let (log, _registry, mut device, mut tool) = setup(ToolAnswer::passes_with_continue(0));
    tool.limits = LoopLimits::new(0);
    tool.keep_going = Box::new(|_, _| true);
    let record = run(&mut tool, &mut device);
    assert_eq!(
        record.outcome,
        ReplayOutcome::Replayed {
            passes: 1,
            end: LoopEnd::MaxPasses
        }
    );
    assert_eq!(device.buffers, after_one_run());
    assert_dispatch_closed(&log, &device, &record);
}

#[test]
fn two_passes_under_a_cap_of_zero_are_declined_as_above_the_cap_of_one() {
    let (log, _registry, mut device, mut tool) = setup(ToolAnswer::passes(2));
    tool.limits = LoopLimits::new(0);
    let record = run(&mut tool, &mut device);
    let decline = record.outcome.decline().expect("declined").clone();
    assert_eq!(decline.reason, DeclineReason::InvalidPassCount);
    assert!(decline.detail.contains("cap of 1"), "{decline}");
    assert_dispatch_closed(&log, &device, &record);
}

#[test]
fn a_zero_time_budget_stops_after_the_first_pass_with_memory_as_one_run() {
    let (log, _registry, mut device, mut tool) = setup(ToolAnswer::passes(5));
    tool.limits = LoopLimits::default().with_budget(Some(Duration::ZERO));
    let record = run(&mut tool, &mut device);
    assert_eq!(
        record.outcome,
        ReplayOutcome::Replayed {
            passes: 1,
            end: LoopEnd::Budget
        }
    );
    assert_eq!(device.buffers, after_one_run());
    assert_dispatch_closed(&log, &device, &record);
}

#[test]
fn a_huge_time_budget_does_not_overflow_and_lets_every_pass_run() {
    let (log, _registry, mut device, mut tool) = setup(ToolAnswer::passes(4));
    tool.limits = LoopLimits::default().with_budget(Some(Duration::MAX));
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

/// What the documentation of `run_dispatch` promises when a callback unwinds: the agent is
/// unlocked and nothing else is done on the device. The snapshot is dropped without
/// `discard_snapshot`, the application's completion does not fire, and memory is as the last
/// step before the panic left it (here: the second pass ran on restored bytes, unrestored
/// after it). Completing the dispatch is left to the backend that catches the unwind.
#[test]
fn a_tool_panic_after_a_pass_unlocks_the_agent_and_leaves_the_dispatch_to_the_backend() {
    let (log, _registry, mut device, mut tool) = setup(ToolAnswer::passes(4));
    tool.on_pass_exit = Box::new(|pass| {
        if pass == 1 {
            panic!("tool bug in PASS EXIT");
        }
        ContinueChange::Keep
    });
    let unwound = catch_unwind(AssertUnwindSafe(|| run(&mut tool, &mut device)));
    assert!(unwound.is_err());
    assert!(!device.lock_held);
    assert_eq!(device.unlocks, 1);
    assert_eq!(device.completions, 0, "no completion fired on unwind");
    assert_eq!(
        device.live_snapshots, 1,
        "discard_snapshot not called on unwind"
    );
    assert_eq!(device.buffers, after_one_run());
    let events = log.borrow();
    assert_eq!(events.last(), Some(&Event::Unlock));
    assert!(!events.contains(&Event::DiscardSnapshot));
    assert!(!events.iter().any(|e| matches!(e, Event::ConfigExit(_))));
}

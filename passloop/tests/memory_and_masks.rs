//! End to end over host memory (`x += 1` over several buffers, real snapshot and restore), the
//! cost record, and per-pass context masking through the loop.

mod common;

use std::cell::RefCell;
use std::rc::Rc;

use common::{
    after_one_run, after_runs, assert_dispatch_closed, footprint_bytes, initial_buffers, run, setup,
};
use kreplay_ctxmask::{ContextId, ToggleError, replay_start_context, replay_stop_context};
use kreplay_passloop::{LoopEnd, LoopLimits, ReplayOutcome, SnapshotRequest, ToolAnswer};

/// The snapshot is taken knowing the restores the loop plans after it (N - 1 of N passes; at
/// most that many with a continue callback; unknown for an indefinite loop), and the loop then
/// restores no more than it said.
#[test]
fn the_snapshot_is_told_the_restores_the_loop_plans_after_it() {
    for (answer, planned) in [
        (ToolAnswer::passes(2), Some(1)),
        (ToolAnswer::passes(38), Some(37)),
        (ToolAnswer::passes_with_continue(4), Some(3)),
        (ToolAnswer::passes_with_continue(0), None),
    ] {
        let (log, _registry, mut device, mut tool) = setup(answer);
        // The indefinite loop ends at kreplay's cap.
        tool.limits = LoopLimits::new(40);
        let record = run(&mut tool, &mut device);
        let total = answer.pass_count.unwrap();
        assert_eq!(
            device.snapshot_requests,
            vec![SnapshotRequest {
                total_passes: total,
                planned_restores: planned,
            }],
            "{answer:?}"
        );
        let restores = record.cost.restore_times.len() as u64;
        assert!(
            planned.is_none_or(|p| restores <= p),
            "{answer:?}: {restores} restores"
        );
        assert_dispatch_closed(&log, &device, &record);
    }
}

#[test]
fn replayed_kernel_leaves_memory_as_one_ordinary_run() {
    let (log, _registry, mut device, mut tool) = setup(ToolAnswer::passes(5));
    assert_eq!(device.buffers, initial_buffers());
    let record = run(&mut tool, &mut device);
    assert_eq!(
        record.outcome,
        ReplayOutcome::Replayed {
            passes: 5,
            end: LoopEnd::LastPass
        }
    );
    assert_eq!(device.buffers, after_one_run());
    assert_dispatch_closed(&log, &device, &record);
}

#[test]
fn without_restore_the_same_replay_leaves_the_wrong_values() {
    // Proves the test above can fail: the device's restore does nothing here, so each pass adds
    // one more to every element.
    let (_log, _registry, mut device, mut tool) = setup(ToolAnswer::passes(5));
    device.restore_disabled = true;
    run(&mut tool, &mut device);
    assert_ne!(device.buffers, after_one_run());
    assert_eq!(device.buffers, after_runs(5));
    assert_eq!(device.buffers[1][0], initial_buffers()[1][0] + 5);
}

#[test]
fn early_stopped_and_indefinite_replays_also_leave_one_run() {
    let (_log, _registry, mut device, mut tool) = setup(ToolAnswer::passes_with_continue(6));
    tool.keep_going = Box::new(|pass, _| pass < 3);
    run(&mut tool, &mut device);
    assert_eq!(device.buffers, after_one_run());

    let (_log, _registry, mut device, mut tool) = setup(ToolAnswer::passes_with_continue(0));
    tool.keep_going = Box::new(|pass, _| pass < 9);
    let record = run(&mut tool, &mut device);
    assert_eq!(record.cost.passes_run, 10);
    assert_eq!(device.buffers, after_one_run());
}

#[test]
fn the_cost_record_counts_passes_restores_and_bytes() {
    let (_log, _registry, mut device, mut tool) = setup(ToolAnswer::passes(4));
    let record = run(&mut tool, &mut device);
    let fp = footprint_bytes();
    assert_eq!(record.total_passes, 4);
    assert_eq!(record.cost.passes_run, 4);
    assert_eq!(record.cost.pass_times.len(), 4);
    assert_eq!(record.cost.restore_times.len(), 3);
    assert_eq!(record.cost.bytes_snapshotted, fp);
    assert_eq!(record.cost.bytes_restored, 3 * fp);
    let measured = record.cost.lock_wait
        + record.cost.drain
        + record.cost.snapshot
        + record.cost.pass_times.iter().sum::<std::time::Duration>()
        + record
            .cost
            .restore_times
            .iter()
            .sum::<std::time::Duration>();
    assert!(record.cost.total >= measured, "{record:?}");
}

#[test]
fn the_cost_record_of_an_unreplayed_dispatch_is_empty() {
    let (_log, _registry, mut device, mut tool) = setup(ToolAnswer::OPT_OUT);
    let record = run(&mut tool, &mut device);
    assert_eq!(record.cost.passes_run, 0);
    assert!(record.cost.pass_times.is_empty() && record.cost.restore_times.is_empty());
    assert_eq!(
        (record.cost.bytes_snapshotted, record.cost.bytes_restored),
        (0, 0)
    );
    assert_eq!(record.cost.lock_wait, std::time::Duration::ZERO);
}

type Attempts = Rc<RefCell<Vec<(&'static str, Result<(), ToggleError>)>>>;

/// Started contexts a, b, c and a never-started d.
fn contexts(registry: &kreplay_ctxmask::ContextRegistry) -> [ContextId; 4] {
    let ids = [
        registry.create(),
        registry.create(),
        registry.create(),
        registry.create(),
    ];
    for &id in &ids[..3] {
        registry.start(id).unwrap();
    }
    ids
}

#[test]
fn toggles_in_pass_enter_mask_this_and_later_passes_of_the_dispatch() {
    let (log, registry, mut device, mut tool) = setup(ToolAnswer::passes(4));
    let [a, b, c, d] = contexts(&registry);
    let attempts: Attempts = Rc::default();
    let seen = attempts.clone();
    tool.on_pass_enter = Box::new(move |pass| {
        let mut seen = seen.borrow_mut();
        match pass {
            0 => seen.push(("stop b", replay_stop_context(b))),
            // Pass 1: nothing; the mask of pass 0 sticks.
            2 => {
                seen.push(("start b", replay_start_context(b)));
                seen.push(("stop c", replay_stop_context(c)));
            }
            3 => seen.push(("start d", replay_start_context(d))),
            _ => {}
        }
    });
    let record = run(&mut tool, &mut device);
    assert_eq!(
        *attempts.borrow(),
        vec![
            ("stop b", Ok(())),
            ("start b", Ok(())),
            ("stop c", Ok(())),
            // d was not started when the replay began: a toggle cannot promote it.
            ("start d", Err(ToggleError::NotStarted)),
        ]
    );
    // What each pass's dispatch saw.
    assert_eq!(
        device.active_per_pass,
        vec![vec![a, c], vec![a, c], vec![a, b], vec![a, b]]
    );
    // The replay's end reset the mask; global state was never touched.
    assert_eq!(registry.active_contexts(), vec![a, b, c]);
    for id in [a, b, c] {
        assert_eq!(registry.is_started(id), Ok(true));
    }
    assert_eq!(registry.is_started(d), Ok(false));
    assert_dispatch_closed(&log, &device, &record);
}

#[test]
fn toggles_outside_pass_enter_are_refused_in_every_other_callback() {
    let (_log, registry, mut device, mut tool) = setup(ToolAnswer::passes_with_continue(3));
    let [a, ..] = contexts(&registry);
    let attempts: Attempts = Rc::default();
    let seen = attempts.clone();
    tool.on_any_callback = Box::new(move |callback| {
        if callback != "pass_enter" {
            seen.borrow_mut().push((callback, replay_stop_context(a)));
        }
    });
    run(&mut tool, &mut device);
    let attempts = attempts.borrow();
    let callbacks: std::collections::BTreeSet<_> = attempts.iter().map(|(c, _)| *c).collect();
    assert_eq!(
        callbacks.into_iter().collect::<Vec<_>>(),
        vec![
            "config_enter",
            "config_exit",
            "pass_exit",
            "restore",
            "should_continue",
            "snapshot"
        ]
    );
    for (callback, result) in attempts.iter() {
        assert_eq!(*result, Err(ToggleError::NotArmed), "{callback}");
    }
    // Nothing was masked by the refused attempts.
    assert!(
        device
            .active_per_pass
            .iter()
            .all(|active| active.contains(&a))
    );
}

#[test]
fn masks_do_not_carry_over_to_the_next_dispatch() {
    let (_log, registry, mut device, mut tool) = setup(ToolAnswer::passes(2));
    let [a, b, c, _] = contexts(&registry);
    tool.on_pass_enter = Box::new(move |pass| {
        if pass == 0 {
            replay_stop_context(b).unwrap();
        }
    });
    run(&mut tool, &mut device);
    assert_eq!(device.active_per_pass, vec![vec![a, c], vec![a, c]]);

    device.active_per_pass.clear();
    tool.on_pass_enter = Box::new(|_| {});
    run(&mut tool, &mut device);
    assert_eq!(device.active_per_pass, vec![vec![a, b, c], vec![a, b, c]]);
}

#[test]
fn a_context_stopped_globally_during_the_replay_leaves_the_following_passes() {
    let (_log, registry, mut device, mut tool) = setup(ToolAnswer::passes(3));
    let [a, b, c, _] = contexts(&registry);
    let global = registry.clone();
    tool.on_pass_enter = Box::new(move |pass| {
        if pass == 1 {
            global.stop(c).unwrap();
        }
    });
    run(&mut tool, &mut device);
    assert_eq!(
        device.active_per_pass,
        vec![vec![a, b, c], vec![a, b], vec![a, b]]
    );
}

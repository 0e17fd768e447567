//! C tools: GPU work a tool submits from its callbacks (kreplay.h: "A callback may
//! submit GPU work ... it never deadlocks"). Each scenario runs in a child process.

mod common;
#[path = "c_probe_tools/harness.rs"]
mod harness;

use std::time::Duration;

use harness::*;

const DEADLINE: Duration = Duration::from_secs(90);

#[test]
fn a_dispatch_a_tool_submits_and_waits_for_in_its_complete_callback_completes_promptly() {
    let name =
        "a_dispatch_a_tool_submits_and_waits_for_in_its_complete_callback_completes_promptly";
    if in_child(name) {
        return standard_child_with_gpu(1, 2);
    }
    let (problems, run) = run_scenario(name, &["complete_submits.c"], &[], DEADLINE);
    assert!(
        problems.is_empty(),
        "problems: {problems:#?}\n{}",
        run.report()
    );
}

#[test]
fn a_dispatch_a_tool_submits_in_the_complete_callback_of_a_replay_pass_completes_promptly() {
    let name =
        "a_dispatch_a_tool_submits_in_the_complete_callback_of_a_replay_pass_completes_promptly";
    if in_child(name) {
        return standard_child_with_gpu(1, 2);
    }
    let (problems, run) = run_scenario(
        name,
        &["complete_submits.c"],
        &[("PROBE_WITH_REPLAY", "1")],
        DEADLINE,
    );
    assert!(
        problems.is_empty(),
        "problems: {problems:#?}\n{}",
        run.report()
    );
}

#[test]
fn a_dispatch_a_replay_callback_submits_from_its_own_thread_and_waits_for_completes() {
    let name = "a_dispatch_a_replay_callback_submits_from_its_own_thread_and_waits_for_completes";
    if in_child(name) {
        return standard_child_with_gpu(1, 2);
    }
    let (problems, run) = run_scenario(
        name,
        &["worker_submits.c"],
        &[("PROBE_SAME_THREAD", "1")],
        DEADLINE,
    );
    assert!(
        problems.is_empty(),
        "problems: {problems:#?}\n{}",
        run.report()
    );
}

/// Not a defect: kreplay.h says that while a replay callback runs the agent being replayed does
/// no other work, and re-entrant work is recognized on the callback's own thread only; a tool
/// helper thread's dispatch waits (in its doorbell) until the replay ends. Kept to document it.
#[test]
#[ignore = "documented limitation: only the callback's own thread's work is re-entrant"]
fn a_dispatch_a_replay_callback_has_its_helper_thread_submit_completes_while_it_waits() {
    let name = "a_dispatch_a_replay_callback_has_its_helper_thread_submit_completes_while_it_waits";
    if in_child(name) {
        return standard_child_with_gpu(1, 2);
    }
    let (problems, run) = run_scenario(name, &["worker_submits.c"], &[], DEADLINE);
    assert!(
        problems.is_empty(),
        "problems: {problems:#?}\n{}",
        run.report()
    );
}

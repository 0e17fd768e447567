//! C tools whose contexts are stopped or finalized by one thread while another thread's
//! dispatches are being traced, counted or replayed. Each scenario runs in a child process with a
//! deadline.

mod common;
#[path = "c_tools_hunt/harness.rs"]
mod harness;

use std::time::Duration;

use harness::*;

const DEADLINE: Duration = Duration::from_secs(90);

fn scenario(name: &str, sources: &[&str], env: &[(&str, &str)]) {
    let (problems, run) = run_scenario(name, sources, env, DEADLINE);
    assert!(
        problems.is_empty(),
        "problems: {problems:#?}\n{}",
        run.report()
    );
}

#[test]
fn no_counter_record_reaches_a_context_another_thread_stopped_while_its_dispatch_was_counted() {
    let name =
        "no_counter_record_reaches_a_context_another_thread_stopped_while_its_dispatch_was_counted";
    if in_child(name) {
        return standard_child(1, 3);
    }
    scenario(
        name,
        &["counting_stop.c"],
        &[("PROBE_MODE", "stop_other_thread")],
    );
}

#[test]
fn no_counter_record_reaches_a_tool_that_finalized_itself_while_its_dispatch_was_counted() {
    let name =
        "no_counter_record_reaches_a_tool_that_finalized_itself_while_its_dispatch_was_counted";
    if in_child(name) {
        return standard_child(1, 3);
    }
    scenario(name, &["counting_stop.c"], &[("PROBE_MODE", "finalize_here")]);
}

//! C tools: dispatch counter collection the way a profiler sets it up lazily, from
//! inside its CONFIG ENTER callback. Each scenario runs in a child process.

mod common;
#[path = "c_probe_tools/harness.rs"]
mod harness;

use std::time::Duration;

use harness::*;

const DEADLINE: Duration = Duration::from_secs(60);

fn scenario(name: &str, mode: &str) {
    let (problems, run) = run_scenario(
        name,
        &["counting_lazy.c"],
        &[("PROBE_MODE", mode)],
        DEADLINE,
    );
    assert!(
        problems.is_empty(),
        "problems: {problems:#?}\n{}",
        run.report()
    );
}

#[test]
fn iterate_agent_counters_returns_what_its_callback_returned() {
    let name = "iterate_agent_counters_returns_what_its_callback_returned";
    if in_child(name) {
        return standard_child(1, 1);
    }
    scenario(name, "iterate_status");
}

#[test]
fn counter_functions_called_in_initialize_say_kreplay_is_not_loaded_yet() {
    let name = "counter_functions_called_in_initialize_say_kreplay_is_not_loaded_yet";
    if in_child(name) {
        return standard_child(1, 1);
    }
    scenario(name, "before_load");
}

#[test]
fn a_tool_planning_counters_lazily_in_config_enter_gets_every_counter_once_per_dispatch() {
    let name =
        "a_tool_planning_counters_lazily_in_config_enter_gets_every_counter_once_per_dispatch";
    if in_child(name) {
        return standard_child(2, 2);
    }
    scenario(name, "lazy_plan");
}

/// A counting service configured on a context the tool never starts counts nothing; kreplay
/// says so at initialization, as it does for kernel replay (it said nothing, and the tool
/// received no counter record without learning why).
#[test]
fn a_counting_service_on_a_context_never_started_is_warned_about() {
    let name = "a_counting_service_on_a_context_never_started_is_warned_about";
    if in_child(name) {
        return standard_child(1, 1);
    }
    let (problems, run) = run_scenario(
        name,
        &["counting_lazy.c"],
        &[("PROBE_MODE", "unstarted")],
        DEADLINE,
    );
    assert!(
        problems.is_empty(),
        "problems: {problems:#?}\n{}",
        run.report()
    );
    assert!(
        run.stderr
            .contains("configured dispatch counting on a context it has not started"),
        "{}",
        run.report()
    );
}

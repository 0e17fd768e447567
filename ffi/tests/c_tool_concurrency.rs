//! C tools whose contexts are stopped or finalized by one thread while another thread's
//! dispatches are being traced, counted or replayed. Each scenario runs in a child process with a
//! deadline.

mod common;
#[path = "c_probe_tools/harness.rs"]
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
    scenario(
        name,
        &["counting_stop.c"],
        &[("PROBE_MODE", "finalize_here")],
    );
}

/// kreplay loaded; one application thread per GPU agent (two) runs `rounds` rounds over
/// `buffers` buffers of its agent at the same time as the other; results checked; OnUnload; the
/// tools' reports.
fn two_agents_child(buffers: usize, rounds: u32) {
    two_threads_child(buffers, rounds, [0, 1]);
}

/// kreplay loaded; two application threads, on GPU agents `agents`, each run `rounds` rounds
/// over `buffers` buffers of their own at the same time; results checked; OnUnload; the tools'
/// reports.
fn two_threads_child(buffers: usize, rounds: u32, agents: [usize; 2]) {
    let mut table = kreplay_softhsa::OwnedApiTable::softhsa();
    let loaded = load_kreplay(&mut table);
    let mut problems = Vec::new();
    if !loaded.loaded {
        problems.push("OnLoad returned false".to_string());
    }
    {
        // SAFETY: the table stays alive and valid while `hsa` is used.
        let hsa = unsafe { kreplay_softhsa::testing::Hsa::from_table(table.table()) };
        let session = hsa.init().expect("hsa_init");
        let hsa = &hsa;
        // Both applications set up their buffers (plain CPU stores, which a replay of the other
        // could not fence on a shared agent) before either dispatches.
        let ready = &std::sync::Barrier::new(2);
        let per_agent: Vec<Vec<String>> = std::thread::scope(|s| {
            let threads: Vec<_> = agents
                .into_iter()
                .map(|agent| {
                    s.spawn(move || {
                        let mut app = App::new(hsa, agent, buffers);
                        ready.wait();
                        let mut problems = Vec::new();
                        for _ in 0..rounds {
                            problems.extend(app.round());
                        }
                        problems.extend(app.check());
                        problems
                            .into_iter()
                            .map(|p| format!("agent {agent}: {p}"))
                            .collect()
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        problems.extend(per_agent.into_iter().flatten());
        drop(session);
    }
    // SAFETY: the runtime's shutdown call.
    unsafe { (loaded.on_unload)() };
    for tool in std::env::var("KREPLAY_TOOL_LIBRARIES")
        .unwrap_or_default()
        .split(':')
        .filter(|p| !p.is_empty())
    {
        let r = tool_report(std::path::Path::new(tool));
        if !r.is_empty() {
            problems.push(format!("tool: {r}"));
        }
    }
    for p in &problems {
        println!("TOOL-PROBLEM: {p}");
    }
    println!("PROBE-DONE");
}

#[test]
fn replays_overlapping_on_two_agents_keep_their_own_passes_user_data_and_masks() {
    let name = "replays_overlapping_on_two_agents_keep_their_own_passes_user_data_and_masks";
    if in_child(name) {
        return two_agents_child(2, 3);
    }
    scenario(name, &["overlap.c"], &[("PROBE_MODE", "mask")]);
}

#[test]
fn contexts_stopped_and_restarted_from_pass_callbacks_of_overlapping_replays_break_nothing() {
    let name =
        "contexts_stopped_and_restarted_from_pass_callbacks_of_overlapping_replays_break_nothing";
    if in_child(name) {
        return two_agents_child(2, 3);
    }
    scenario(name, &["overlap.c"], &[("PROBE_MODE", "stop_other")]);
}

#[test]
fn a_tool_finalized_by_its_own_thread_is_finalized_after_its_running_pass_count_callback() {
    let name =
        "a_tool_finalized_by_its_own_thread_is_finalized_after_its_running_pass_count_callback";
    if in_child(name) {
        return standard_child(1, 3);
    }
    scenario(name, &["finalize_race.c"], &[("PROBE_MODE", "pass_count")]);
}

#[test]
fn a_tool_finalized_by_its_own_thread_is_finalized_after_its_running_continue_callback() {
    let name =
        "a_tool_finalized_by_its_own_thread_is_finalized_after_its_running_continue_callback";
    if in_child(name) {
        return standard_child(1, 3);
    }
    scenario(name, &["finalize_race.c"], &[("PROBE_MODE", "continue")]);
}

#[test]
fn a_second_finalize_call_returns_only_once_the_tool_is_finalized() {
    let name = "a_second_finalize_call_returns_only_once_the_tool_is_finalized";
    if in_child(name) {
        return standard_child(1, 3);
    }
    scenario(
        name,
        &["finalize_twice.c"],
        &[("PROBE_MODE", "two_threads"), ("PROBE_TRIGGER_AT", "1")],
    );
}

#[test]
fn on_unload_ends_only_after_a_finalize_the_tool_started_on_its_own_thread() {
    let name = "on_unload_ends_only_after_a_finalize_the_tool_started_on_its_own_thread";
    if in_child(name) {
        return standard_child(1, 3);
    }
    scenario(
        name,
        &["finalize_twice.c"],
        &[("PROBE_MODE", "unload"), ("PROBE_TRIGGER_AT", "3")],
    );
}

#[test]
fn a_replay_whose_owner_another_thread_stops_mid_loop_ends_after_that_pass_silently() {
    let name = "a_replay_whose_owner_another_thread_stops_mid_loop_ends_after_that_pass_silently";
    if in_child(name) {
        return standard_child(1, 3);
    }
    scenario(name, &["owner_stop.c"], &[]);
}

#[test]
fn counting_masked_to_one_pass_of_overlapping_replays_counts_that_pass_of_each_dispatch() {
    let name =
        "counting_masked_to_one_pass_of_overlapping_replays_counts_that_pass_of_each_dispatch";
    if in_child(name) {
        return two_agents_child(2, 3);
    }
    scenario(name, &["overlap.c"], &[("PROBE_MODE", "count")]);
}

#[test]
fn a_context_another_thread_starts_between_enter_and_exit_gets_no_unpaired_exit() {
    let name = "a_context_another_thread_starts_between_enter_and_exit_gets_no_unpaired_exit";
    if in_child(name) {
        return standard_child(1, 3);
    }
    scenario(name, &["start_between.c"], &[]);
}

#[test]
fn a_replay_owner_stopped_and_restarted_inside_a_replay_gets_no_exit_without_its_enter() {
    let name =
        "a_replay_owner_stopped_and_restarted_inside_a_replay_gets_no_exit_without_its_enter";
    if in_child(name) {
        return standard_child(1, 3);
    }
    scenario(name, &["owner_pairs.c"], &[]);
}

/// kreplay loaded; an application thread runs `rounds` rounds over `buffers` buffers of GPU
/// agent 0 while the main thread calls OnUnload as soon as the tool's `probe_unload_go` says so;
/// results checked; the tool's report.
fn unload_while_dispatching_child(buffers: usize, rounds: u32) {
    let mut table = kreplay_softhsa::OwnedApiTable::softhsa();
    let loaded = load_kreplay(&mut table);
    let tool = std::env::var("KREPLAY_TOOL_LIBRARIES").unwrap();
    let mut problems = Vec::new();
    {
        // SAFETY: the table stays alive and valid while `hsa` is used.
        let hsa = unsafe { kreplay_softhsa::testing::Hsa::from_table(table.table()) };
        let session = hsa.init().expect("hsa_init");
        // SAFETY: the tool is loaded by kreplay; `probe_unload_go` has this signature.
        let lib = unsafe { libloading::Library::new(&tool) }.expect("tool library");
        // SAFETY: as above.
        let go = unsafe {
            *lib.get::<extern "C" fn() -> i32>(b"probe_unload_go\0")
                .unwrap()
        };
        let hsa = &hsa;
        std::thread::scope(|s| {
            let app = s.spawn(move || {
                let mut app = App::new(hsa, 0, buffers);
                let mut problems = Vec::new();
                for _ in 0..rounds {
                    problems.extend(app.round());
                }
                problems.extend(app.check());
                problems
            });
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while go() == 0 && std::time::Instant::now() < deadline && !app.is_finished() {
                std::thread::yield_now();
            }
            // SAFETY: the runtime's shutdown call (here while the application still runs).
            unsafe { (loaded.on_unload)() };
            problems.extend(app.join().unwrap());
        });
        drop(session);
    }
    let r = tool_report(std::path::Path::new(&tool));
    if !r.is_empty() {
        problems.push(format!("tool: {r}"));
    }
    for p in &problems {
        println!("TOOL-PROBLEM: {p}");
    }
    println!("PROBE-DONE");
}

#[test]
fn on_unload_in_the_middle_of_a_replay_leaves_the_application_data_as_single_runs_would() {
    let name =
        "on_unload_in_the_middle_of_a_replay_leaves_the_application_data_as_single_runs_would";
    if in_child(name) {
        return unload_while_dispatching_child(2, 4);
    }
    scenario(name, &["unload_mid_replay.c"], &[]);
}

#[test]
fn replays_of_two_threads_on_one_agent_keep_their_own_passes_user_data_and_masks() {
    let name = "replays_of_two_threads_on_one_agent_keep_their_own_passes_user_data_and_masks";
    if in_child(name) {
        return two_threads_child(2, 4, [0, 0]);
    }
    scenario(name, &["overlap.c"], &[("PROBE_MODE", "same_agent")]);
}

#[test]
fn a_tool_finalizing_itself_in_a_callback_that_on_unload_waits_for_is_finalized_after_it() {
    let name =
        "a_tool_finalizing_itself_in_a_callback_that_on_unload_waits_for_is_finalized_after_it";
    if in_child(name) {
        return unload_while_dispatching_child(2, 4);
    }
    scenario(
        name,
        &["unload_mid_replay.c"],
        &[("PROBE_MODE", "finalize_in_callback")],
    );
}

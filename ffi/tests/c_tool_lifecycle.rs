//! C tools: lifecycle (a tool finalizing itself from a callback, a tool that
//! finalized itself during initialize, unload and reload). Each scenario runs in a child process.

mod common;
#[path = "c_probe_tools/harness.rs"]
mod harness;

use std::time::Duration;

use harness::*;

const DEADLINE: Duration = Duration::from_secs(60);

fn assert_clean(problems: &[String], run: &ChildRun) {
    assert!(
        problems.is_empty(),
        "problems: {problems:#?}\n{}",
        run.report()
    );
}

#[test]
fn a_tool_that_finalizes_itself_in_config_enter_is_never_called_again() {
    let name = "a_tool_that_finalizes_itself_in_config_enter_is_never_called_again";
    if in_child(name) {
        return standard_child(2, 2);
    }
    let (problems, run) = run_scenario(
        name,
        &["finalize_in_callback.c"],
        &[("PROBE_FINALIZE_AT", "config_enter")],
        DEADLINE,
    );
    assert_clean(&problems, &run);
}

#[test]
fn a_tool_that_finalizes_itself_in_pass_enter_is_never_called_again() {
    let name = "a_tool_that_finalizes_itself_in_pass_enter_is_never_called_again";
    if in_child(name) {
        return standard_child(2, 2);
    }
    let (problems, run) = run_scenario(
        name,
        &["finalize_in_callback.c"],
        &[("PROBE_FINALIZE_AT", "pass_enter")],
        DEADLINE,
    );
    assert_clean(&problems, &run);
}

#[test]
fn a_tool_that_starts_its_contexts_again_in_its_finalize_is_refused_and_never_called_again() {
    let name =
        "a_tool_that_starts_its_contexts_again_in_its_finalize_is_refused_and_never_called_again";
    if in_child(name) {
        return standard_child(2, 2);
    }
    let (problems, run) = run_scenario(
        name,
        &["finalize_in_callback.c"],
        &[
            ("PROBE_FINALIZE_AT", "config_enter"),
            ("PROBE_RESTART_IN_FINALIZE", "1"),
        ],
        DEADLINE,
    );
    assert_clean(&problems, &run);
}

#[test]
fn a_tool_that_starts_its_contexts_again_in_its_finalize_at_unload_is_refused() {
    let name = "a_tool_that_starts_its_contexts_again_in_its_finalize_at_unload_is_refused";
    if in_child(name) {
        return standard_child(2, 2);
    }
    let (problems, run) = run_scenario(
        name,
        &["finalize_in_callback.c"],
        &[
            ("PROBE_FINALIZE_AT", "never"),
            ("PROBE_RESTART_IN_FINALIZE", "1"),
        ],
        DEADLINE,
    );
    assert_clean(&problems, &run);
}

#[test]
fn a_tool_initialized_after_a_tool_that_failed_its_initialize_can_own_kernel_replay() {
    let name = "a_tool_initialized_after_a_tool_that_failed_its_initialize_can_own_kernel_replay";
    if in_child(name) {
        return standard_child(1, 2);
    }
    let (problems, run) = run_scenario(
        name,
        &["early_detach.c", "replay_owner.c"],
        &[("PROBE_DETACH_HOW", "fail")],
        DEADLINE,
    );
    assert_clean(&problems, &run);
}

#[test]
fn a_tool_initialized_after_a_tool_that_finalized_itself_in_initialize_can_own_kernel_replay() {
    let name =
        "a_tool_initialized_after_a_tool_that_finalized_itself_in_initialize_can_own_kernel_replay";
    if in_child(name) {
        return standard_child(1, 2);
    }
    let (problems, run) = run_scenario(
        name,
        &["early_detach.c", "replay_owner.c"],
        &[("PROBE_DETACH_HOW", "finalize")],
        DEADLINE,
    );
    assert_clean(&problems, &run);
}

#[test]
fn a_tool_finalized_from_its_own_thread_is_not_finalized_while_its_callback_runs() {
    let name = "a_tool_finalized_from_its_own_thread_is_not_finalized_while_its_callback_runs";
    if in_child(name) {
        return standard_child(1, 2);
    }
    let (problems, run) = run_scenario(name, &["timer_detach.c"], &[], DEADLINE);
    assert_clean(&problems, &run);
}

#[test]
#[ignore = "known limit: kreplay's tools are initialized once per process; after hsa_shut_down finalized them, a runtime loaded again is not profiled (OnLoad returns false and says why)"]
fn a_runtime_loaded_again_after_hsa_shut_down_is_profiled_again() {
    let name = "a_runtime_loaded_again_after_hsa_shut_down_is_profiled_again";
    if in_child(name) {
        return two_sessions_child(1, 2);
    }
    let (problems, run) = run_scenario(name, &["session_counter.c"], &[], DEADLINE);
    assert_clean(&problems, &run);
}

fn exit_scenario(name: &str, at: &str) {
    // Folders of this process's own: another copy of this test binary running the same
    // scenario at once writes its record (and spills) beside, not into, these.
    let dir = common::scratch_dir(name).join(format!("records-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let spill = common::scratch_dir(name).join(format!("spill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&spill);
    std::fs::create_dir_all(&spill).unwrap();
    // The scenario's buffers are small; the file tier needs room for them on `spill`'s disk.
    if !common::spill_room(&spill, 16 << 20) {
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_dir_all(&spill);
        return;
    }
    let (_, run) = run_scenario(
        name,
        &["exit_in_callback.c"],
        &[
            ("PROBE_EXIT_AT", at),
            ("KREPLAY_RECORD_DIR", dir.to_str().unwrap()),
            ("KREPLAY_SNAPSHOT_STORE", "file"),
            ("KREPLAY_SPILL_DIR", spill.to_str().unwrap()),
        ],
        Duration::from_secs(30),
    );
    assert!(
        !run.hung && run.status == Some(7),
        "the process must end with the tool's exit status 7\n{}",
        run.report()
    );
    let records: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    assert_eq!(
        records.len(),
        1,
        "one run record: {records:?}\n{}",
        run.report()
    );
    let record: kreplay::run_record::RunRecord =
        serde_json::from_str(&std::fs::read_to_string(&records[0]).unwrap())
            .expect("a valid record");
    let launches: u64 = record.kernels.iter().map(|k| k.launches).sum();
    assert_eq!(
        launches, 1,
        "dispatch 1 completed before the exit: {record:?}"
    );
    let left: Vec<_> = std::fs::read_dir(&spill)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "spill files left behind: {left:?}");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&spill);
}

#[test]
fn a_tool_exiting_the_process_in_pass_enter_ends_it_promptly_with_its_record_written() {
    let name = "a_tool_exiting_the_process_in_pass_enter_ends_it_promptly_with_its_record_written";
    if in_child(name) {
        return standard_child(1, 3);
    }
    exit_scenario(name, "pass_enter");
}

#[test]
fn a_tool_exiting_the_process_in_restore_exit_ends_it_promptly_with_its_record_written() {
    let name =
        "a_tool_exiting_the_process_in_restore_exit_ends_it_promptly_with_its_record_written";
    if in_child(name) {
        return standard_child(1, 3);
    }
    exit_scenario(name, "restore_exit");
}

/// ROCm's `hsa_shut_down` calls every tools library's `OnUnload`, then closes the libraries
/// (`dlclose`), on the application's thread that shut the runtime down; that thread goes on and
/// ends later. Here it is a thread of its own that ends once it has done so.
fn shut_down_on_a_thread_child() {
    let mut table = kreplay_softhsa::OwnedApiTable::softhsa();
    let loaded = load_kreplay(&mut table);
    let mut problems = Vec::new();
    {
        // SAFETY: the table stays alive and valid while `hsa` is used.
        let hsa = unsafe { kreplay_softhsa::testing::Hsa::from_table(table.table()) };
        let session = hsa.init().expect("hsa_init");
        let mut app = App::new(&hsa, 0, 1);
        problems.extend(app.round());
        problems.extend(app.check());
        drop(session);
    }
    let Loaded {
        library, on_unload, ..
    } = loaded;
    let shutting_down = std::thread::spawn(move || {
        // SAFETY: the runtime's shutdown call, then its closing of the tools library.
        unsafe { on_unload() };
        drop(library);
    });
    if shutting_down.join().is_err() {
        problems.push("the thread that shut the runtime down panicked".into());
    }
    for p in &problems {
        println!("TOOL-PROBLEM: {p}");
    }
    println!("PROBE-DONE");
}

/// The thread that shut the runtime down ends normally after the runtime closed libkreplay:
/// it was killed by SIGSEGV at its end, in a thread-exit hook libkreplay had registered there
/// (its code unmapped by the close).
#[test]
fn a_thread_that_shut_the_runtime_down_ends_normally_after_libkreplay_is_closed() {
    let name = "a_thread_that_shut_the_runtime_down_ends_normally_after_libkreplay_is_closed";
    if in_child(name) {
        return shut_down_on_a_thread_child();
    }
    let (problems, run) = run_tools(name, &[], &[], DEADLINE);
    assert_clean(&problems, &run);
}

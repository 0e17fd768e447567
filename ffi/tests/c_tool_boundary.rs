//! C tools at the edges of the interface: out-pointers and arrays at misaligned addresses and
//! element counts no array can have. kreplay.h: "Functions never abort the process: a failure
//! is returned as a status". Each scenario runs in a child process with the tool
//! tests/c_probe_tools/boundary.c; the application's results must stay those of one run.

mod common;
#[path = "c_probe_tools/harness.rs"]
mod harness;

use std::time::Duration;

use harness::*;

const DEADLINE: Duration = Duration::from_secs(60);

fn scenario(name: &str, mode: &str) {
    let (problems, run) = run_scenario(name, &["boundary.c"], &[("PROBE_MODE", mode)], DEADLINE);
    assert!(
        problems.is_empty(),
        "problems: {problems:#?}\n{}",
        run.report()
    );
}

/// Every out-pointer and input array of the interface at an odd address (a field of a packed
/// struct, a pointer into a byte buffer) is read and written as an aligned one is. Before, a
/// debug build of kreplay aborted the process on the first one (Rust's checked `ptr::write`).
#[test]
fn misaligned_pointers_are_read_and_written_like_aligned_ones() {
    let name = "misaligned_pointers_are_read_and_written_like_aligned_ones";
    if in_child(name) {
        return standard_child(1, 1);
    }
    scenario(name, "misaligned");
}

/// An operation or counter list whose count no array can have (SIZE_MAX, ...) is
/// KREPLAY_STATUS_ERROR_INVALID_ARGUMENT and configures or writes nothing. Before, kreplay
/// made a slice of that length: an abort in a debug build, a read past the caller's array in a
/// release one.
#[test]
fn counts_no_array_can_have_are_invalid_arguments() {
    let name = "counts_no_array_can_have_are_invalid_arguments";
    if in_child(name) {
        return standard_child(1, 1);
    }
    scenario(name, "huge_counts");
}

/// Two copies of tests/c_probe_tools/intruder.c: the host owns kernel replay; the intruder
/// configures services on the host's context (not its own) and then fails or stays inactive.
fn intruder_scenario(name: &str, mode: &str) {
    let first = build_tool("intruder.c", name);
    let second = first.with_file_name("libintruder_copy.so");
    std::fs::copy(&first, &second).expect("copy the tool");
    let (problems, run) = run_tools(name, &[first, second], &[("PROBE_MODE", mode)], DEADLINE);
    assert!(
        problems.is_empty(),
        "problems: {problems:#?}\n{}",
        run.report()
    );
}

/// docs/abi.md: a tool whose initialize returns non-zero "is failed: its contexts are stopped
/// and its services removed". Before, only the services on its own contexts went: one it
/// configured on another tool's context stayed, and its callback ran for every dispatch.
#[test]
fn a_failed_tool_keeps_no_service_it_configured_on_another_tools_context() {
    let name = "a_failed_tool_keeps_no_service_it_configured_on_another_tools_context";
    if in_child(name) {
        return standard_child(1, 2);
    }
    intruder_scenario(name, "fail");
}

/// The same for a tool whose kreplay_configure returns NULL (it stays inactive).
#[test]
fn an_inactive_tool_keeps_no_service_it_configured_on_another_tools_context() {
    let name = "an_inactive_tool_keeps_no_service_it_configured_on_another_tools_context";
    if in_child(name) {
        return standard_child(1, 2);
    }
    intruder_scenario(name, "decline");
}

/// kreplay.h: a tool that finalizes itself from a callback gets nothing more, "nothing of the
/// tool is called after it". Before, a service it had configured on another tool's context
/// (still started) kept calling it for every later dispatch.
#[test]
fn a_tool_finalized_from_its_callback_gets_nothing_more_through_another_tools_context() {
    let name = "a_tool_finalized_from_its_callback_gets_nothing_more_through_another_tools_context";
    if in_child(name) {
        return standard_child(1, 3);
    }
    intruder_scenario(name, "finalize");
}

/// The finalize function kreplay hands a tool finalizes that tool only: called with another
/// tool's client id (a stale or guessed one: handles are small numbers) it finalizes nobody.
/// Before, it finalized the other tool, whose replays then stopped.
#[test]
fn a_tools_finalize_function_called_with_another_client_id_finalizes_no_other_tool() {
    let name = "a_tools_finalize_function_called_with_another_client_id_finalizes_no_other_tool";
    if in_child(name) {
        return standard_child(1, 2);
    }
    intruder_scenario(name, "other_id");
}

/// A client name with no NUL within reason (64 KiB before it) is cut in kreplay's messages,
/// which say so; before, every message naming the tool carried all of it.
#[test]
fn a_client_name_without_a_nul_within_reason_is_cut_in_messages() {
    let name = "a_client_name_without_a_nul_within_reason_is_cut_in_messages";
    if in_child(name) {
        return standard_child(1, 1);
    }
    let (problems, run) =
        run_scenario(name, &["long_name.c"], &[("KREPLAY_LOG", "info")], DEADLINE);
    assert!(
        problems.is_empty(),
        "problems: {problems:#?}\n{}",
        run.report()
    );
    let longest = run.stderr.lines().map(str::len).max().unwrap_or(0);
    assert!(
        longest < 1024,
        "a line of {longest} bytes on stderr: the tool's name was printed whole"
    );
    assert!(
        run.stderr.contains("NNNNNNNN"),
        "the tool is not named at all:\n{}",
        run.stderr
    );
}

/// A tool that owns kernel replay but left CONFIG out of its operations is never asked for a
/// pass count, so no dispatch is replayed: kreplay says so when the service is configured
/// (before, nothing told the tool why it saw no PASS record).
#[test]
fn kernel_replay_configured_without_config_is_warned_about() {
    let name = "kernel_replay_configured_without_config_is_warned_about";
    if in_child(name) {
        return standard_child(1, 1);
    }
    let (problems, run) = run_scenario(
        name,
        &["boundary.c"],
        &[("PROBE_MODE", "no_config")],
        DEADLINE,
    );
    assert!(
        problems.is_empty(),
        "problems: {problems:#?}\n{}",
        run.report()
    );
    assert!(
        run.stderr.contains("without its CONFIG operation"),
        "no warning:\n{}",
        run.report()
    );
}

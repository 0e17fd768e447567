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
    let (problems, run) = run_scenario(
        name,
        &["boundary.c"],
        &[("PROBE_MODE", mode)],
        DEADLINE,
    );
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

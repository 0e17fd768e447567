//! A C tool calling the whole interface at random (tests/c_probe_tools/random_calls.c): from
//! every kind of callback, from PASS ENTER and a thread it spawns there, from a thread of its own
//! running beside the replays, and from its finalize, with garbage handles, NULL and misaligned
//! pointers, unknown enumeration values and counts no array can have. Each call must return the
//! exact status kreplay.h documents for its arguments and where it is made; nothing may crash or
//! hang, and the application's results must be those of one run. `PROBE_SEED=N` (inherited by
//! the child) replaces the fixed seed for a longer campaign.

mod common;
#[path = "c_probe_tools/harness.rs"]
mod harness;

use std::time::Duration;

use harness::*;

const DEADLINE: Duration = Duration::from_secs(120);

#[test]
fn random_calls_from_everywhere_get_their_documented_statuses() {
    let name = "random_calls_from_everywhere_get_their_documented_statuses";
    if in_child(name) {
        return standard_child(3, 4);
    }
    let (problems, run) = run_scenario(name, &["random_calls.c"], &[], DEADLINE);
    assert!(
        problems.is_empty(),
        "problems: {problems:#?}\n{}",
        run.report()
    );
}

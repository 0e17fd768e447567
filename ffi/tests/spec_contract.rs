//! The payload promises of SPEC §2 held against C tools that do what the header does not ask of
//! them: kreplay fills in `size`, `dispatch_info` ("always set"; one `dispatch_id` for every
//! pass), the pass indices and "every field that does not apply set to zero"; a tool sets only
//! `replay_pass_count` and `replay_continue`. What a tool writes elsewhere in one record must not
//! reach the next record, another service's record, or the pass-count and continue callbacks.

mod common;
#[path = "c_probe_tools/harness.rs"]
mod harness;

use std::time::Duration;

use harness::*;

const DEADLINE: Duration = Duration::from_secs(120);

#[test]
fn what_a_tool_scribbles_over_a_payload_never_reaches_another_record_or_callback() {
    let name = "what_a_tool_scribbles_over_a_payload_never_reaches_another_record_or_callback";
    if in_child(name) {
        return standard_child(2, 2);
    }
    let (problems, run) = run_scenario(name, &["spec_scribble.c"], &[], DEADLINE);
    assert!(problems.is_empty(), "{problems:#?}\n{}", run.report());
}

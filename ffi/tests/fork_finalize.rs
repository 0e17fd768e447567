//! The application forks while another of its threads is inside a tool's client finalize call
//! (a tool asking to be finalized, perhaps again: kreplay looks through the finalizes in
//! progress and waits for the tool's own). Only the forking thread exists in the child: the
//! list of finalizes in progress, had its lock stayed held there, would make the child's first
//! finalize call (or its unload) wait forever. Each child asks for the finalize too and must
//! finish.

mod common;

use common::finalizing_tool::{self, ask_for_finalize};
use common::forked::fork_while;

use kreplay::abi::Status;
use kreplay::api::kreplay_force_configure;
use kreplay::lifecycle::{self, ToolSearch};
use kreplay::logging::{self, LogLevel};

#[test]
fn a_forked_child_can_ask_for_a_finalize_while_a_parent_thread_was_asking_at_the_fork() {
    // Every refused finalize is warned about: not printed here.
    logging::set_level(LogLevel::Off);
    assert_eq!(
        kreplay_force_configure(Some(finalizing_tool::configure)),
        Status::SUCCESS
    );
    lifecycle::initialize_tools_with(&ToolSearch::default()).expect("tools initialize");
    assert_eq!(lifecycle::finalize_tools(), 1, "the tool finalizes");
    // Another thread of the application: the tool asks for its finalize over and over.
    let failures = fork_while(1000, ask_for_finalize, || {
        ask_for_finalize();
        true
    });
    assert!(failures.is_empty(), "{failures:#?}");
}

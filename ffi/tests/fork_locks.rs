//! The application forks while another of its threads is inside a kreplay call that holds one
//! of kreplay's locks (starting a context, creating one). Only the forking thread exists in the
//! child: a lock held by another thread at the fork is never released there, and the child's
//! first kreplay call that needs it would wait forever. Each child calls those functions and
//! must finish.

use common::forked::fork_while;
use std::time::Duration;

use kreplay::abi::{ContextHandle, Status};
use kreplay::api::{kreplay_create_context, kreplay_start_context, kreplay_stop_context};
use kreplay::lifecycle::{self, ToolSearch};

#[test]
fn a_forked_child_can_use_kreplay_while_a_parent_thread_was_inside_it_at_the_fork() {
    // kreplay loaded, as in an application whose runtime initialized it.
    lifecycle::initialize_tools_with(&ToolSearch::default()).expect("tools initialize");
    let mut ctx = ContextHandle::default();
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { kreplay_create_context(&mut ctx) }, Status::SUCCESS);
    let failures = fork_while(
        40,
        // Another thread of the application, in and out of kreplay's locks all the time.
        || {
            let _ = kreplay_start_context(ctx);
            let mut other = ContextHandle::default();
            // SAFETY: a valid out-pointer.
            let _ = unsafe { kreplay_create_context(&mut other) };
        },
        || {
            let mut fresh = ContextHandle::default();
            // SAFETY: a valid out-pointer.
            let created = unsafe { kreplay_create_context(&mut fresh) };
            created == Status::SUCCESS
                && kreplay_start_context(ctx) == Status::SUCCESS
                && kreplay_start_context(fresh) == Status::SUCCESS
                && kreplay_stop_context(fresh) == Status::SUCCESS
        },
    );
    assert!(failures.is_empty(), "{failures:#?}");
}

mod common;
#[path = "c_probe_tools/harness.rs"]
mod harness;

#[test]
fn a_tool_that_forks_inside_every_callback_neither_hangs_nor_leaves_its_children_stuck() {
    // kreplay's fork handlers take its locks before every fork of the process: a fork from a
    // thread that is inside a kreplay callback (while kreplay may hold one of them) must not
    // wait for good. The tool forks in configure, initialize, every replay and dispatch record,
    // the pass-count callback and finalize; the child exits at once.
    let name =
        "a_tool_that_forks_inside_every_callback_neither_hangs_nor_leaves_its_children_stuck";
    if harness::in_child(name) {
        return harness::standard_child(2, 2);
    }
    let (problems, run) = harness::run_scenario(
        name,
        &["fork_in_callbacks.c"],
        &[],
        Duration::from_secs(120),
    );
    assert!(problems.is_empty(), "{problems:#?}\n{}", run.report());
}

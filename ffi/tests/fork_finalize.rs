//! The application forks while another of its threads is inside a tool's client finalize call
//! (a tool asking to be finalized, perhaps again: kreplay looks through the finalizes in
//! progress and waits for the tool's own). Only the forking thread exists in the child: the
//! list of finalizes in progress, had its lock stayed held there, would make the child's first
//! finalize call (or its unload) wait forever. Each child asks for the finalize too and must
//! finish.

mod common;

use common::finalizing_tool::{self, ask_for_finalize};
use common::forked::{_exit, fork, wait_child};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

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
    let stop = AtomicBool::new(false);
    let asked = AtomicU32::new(0);
    let mut failures = Vec::new();
    std::thread::scope(|scope| {
        // Another thread of the application: the tool asks for its finalize over and over.
        scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                ask_for_finalize();
                asked.fetch_add(1, Ordering::Relaxed);
            }
        });
        for round in 0..1000 {
            // The other thread is at it (not still starting) before each fork.
            let before = asked.load(Ordering::Relaxed);
            while asked.load(Ordering::Relaxed) < before + 2 {
                std::thread::yield_now();
            }
            // SAFETY: the child only calls kreplay and leaves with _exit.
            let pid = unsafe { fork() };
            if pid == 0 {
                ask_for_finalize();
                // SAFETY: leaves the child at once.
                unsafe { _exit(0) };
            }
            assert!(pid > 0, "fork failed");
            match wait_child(pid, Duration::from_secs(10)) {
                Some(0) => {}
                other => {
                    failures.push(format!(
                        "fork {round}: the child ended with {other:?} (None: hung)"
                    ));
                    break;
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(failures.is_empty(), "{failures:#?}");
}

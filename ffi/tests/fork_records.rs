//! The application forks while another of its threads holds one of the run record's locks
//! (`kreplay run` records the run: its record, its file name) or the list of replay records.
//! Only the forking thread exists in the child: a lock held by another thread at the fork is
//! never released there, and the child's exit handler (which writes the run record) or its
//! own calls would wait forever. Each child does what its exit handler does, and must finish.

mod common;

use common::forked::fork_while;

use kreplay::lifecycle::{self, ToolSearch};
use kreplay::{hsa_tool, run_record};

#[test]
fn a_forked_child_writes_its_record_at_exit_while_a_parent_thread_held_the_record_at_the_fork() {
    // kreplay loaded and recording, as under `kreplay run`.
    lifecycle::initialize_tools_with(&ToolSearch::default()).expect("tools initialize");
    let dir = std::env::temp_dir().join(format!("kreplay-fork-records-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    run_record::start(dir.clone(), "hsa", "built-in", 1, Vec::new(), Vec::new());
    hsa_tool::set_collect_replay_records(true);
    let failures = fork_while(
        40,
        // Another thread of the application, in and out of the record's locks all the time.
        || {
            let _ = run_record::file();
            let _ = run_record::snapshot();
            let _ = hsa_tool::take_replay_records();
        },
        || {
            // What the exit handler does, then the record and the replay records read.
            run_record::write();
            let ok = run_record::snapshot().is_some() && run_record::file().is_some();
            let _ = hsa_tool::take_replay_records();
            ok
        },
    );
    // The children wrote nothing: the one record file is the parent's.
    let files = std::fs::read_dir(&dir).unwrap().count();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(failures.is_empty(), "{failures:#?}");
    assert_eq!(files, 1, "only the parent's record file");
}

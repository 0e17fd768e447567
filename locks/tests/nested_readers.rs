//! A nested ordinary dispatch (a reader taken while the thread already holds a reader, which the
//! crate supports and takes recursively) against a replay of a linked group, whose writer sides
//! are taken with `write_all_serving` as the backends take them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use kreplay_locks::{AgentGroups, AgentLocks};

/// Agents 1 and 2 share memory. An ordinary dispatch on agent 2 holds its reader side while it
/// submits, and its submission issues a nested ordinary dispatch on agent 1 (a tool callback at
/// dispatch time launching on the peer GPU). Meanwhile a replay on agent 1 locks its group
/// [1, 2]. Both must finish within the bound. Taking the group's sides in ascending order, each
/// waited for in turn, deadlocked: the replay held 1 and waited for 2, the dispatch held 2 and
/// waited for 1.
#[test]
fn nested_dispatch_on_a_lower_linked_agent_and_a_group_replay_both_finish() {
    let locks = Arc::new(AgentLocks::new());
    locks.set_enabled(true);
    let groups = Arc::new(AgentGroups::new());
    groups.link(&[1, 2]);

    let (outer_held_tx, outer_held_rx) = mpsc::channel();
    let replay_holds_1 = Arc::new(AtomicBool::new(false));
    let (done_tx, done_rx) = mpsc::channel::<&'static str>();

    // The ordinary dispatch on agent 2, with a nested one on agent 1.
    let dispatcher = {
        let locks = locks.clone();
        let done = done_tx.clone();
        std::thread::spawn(move || {
            let outer = locks.read(2).unwrap();
            outer_held_tx.send(()).unwrap();
            // Wait until the replay has taken agent 1 (bounded; then the nested dispatch).
            let start = Instant::now();
            while !locks.agent_lock(1).is_write_locked() && start.elapsed() < Duration::from_secs(5)
            {
                std::thread::yield_now();
            }
            let nested = locks.read(1).unwrap();
            drop(nested);
            drop(outer);
            let _ = done.send("dispatch");
        })
    };

    // The replay on agent 1: its group, ascending.
    outer_held_rx.recv().unwrap();
    let replay = {
        let locks = locks.clone();
        let groups = groups.clone();
        let replay_holds_1 = replay_holds_1.clone();
        std::thread::spawn(move || {
            let group = groups.group(1);
            assert_eq!(group, [1, 2]);
            let guards = locks
                .write_all_serving(&group, Duration::from_millis(5), || {})
                .unwrap();
            replay_holds_1.store(true, Ordering::SeqCst);
            drop(guards);
            let _ = done_tx.send("replay");
        })
    };

    let mut finished = Vec::new();
    while finished.len() < 2 {
        match done_rx.recv_timeout(Duration::from_secs(10)) {
            Ok(who) => finished.push(who),
            Err(_) => panic!(
                "deadlock: finished {finished:?}; agent 1 write-locked: {}, agent 2 locked: {}",
                locks.agent_lock(1).is_write_locked(),
                locks.agent_lock(2).is_locked()
            ),
        }
    }
    dispatcher.join().unwrap();
    replay.join().unwrap();
}

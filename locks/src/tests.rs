use super::*;

use std::sync::atomic::AtomicUsize;
use std::sync::mpsc;
use std::sync::{Barrier, Mutex};
use std::thread;

/// Upper bound for anything that is expected to happen; never reached in a passing run.
const LONG: Duration = Duration::from_secs(10);
/// Window during which something is expected *not* to happen.
const SHORT: Duration = Duration::from_millis(30);

/// Runs a test body on its own thread and fails (instead of hanging) if it does not finish
/// within [`LONG`], e.g. because a lock deadlocked.
fn bounded<T: Send + 'static>(name: &str, body: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let handle = thread::spawn(move || {
        let _ = tx.send(body());
    });
    match rx.recv_timeout(2 * LONG) {
        Ok(value) => {
            handle.join().unwrap();
            value
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{name} did not finish within {:?}: deadlock", 2 * LONG)
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => match handle.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => unreachable!("body finished without sending its result"),
        },
    }
}

fn enabled() -> AgentLocks {
    let locks = AgentLocks::new();
    locks.set_enabled(true);
    locks
}

#[test]
fn readers_on_one_agent_hold_the_lock_concurrently() {
    bounded("readers_on_one_agent_hold_the_lock_concurrently", || {
        let locks = enabled();
        let (tx, rx) = mpsc::channel();
        let outer = locks.read(1).unwrap();
        assert!(outer.is_locked());
        thread::scope(|s| {
            s.spawn(|| {
                let inner = locks.read(1).unwrap();
                assert!(inner.is_locked());
                tx.send(()).unwrap();
            });
            // The second reader gets in while the first still holds the lock.
            rx.recv_timeout(LONG)
                .expect("a second reader was blocked by the first");
        });
        drop(outer);
        assert!(!locks.agent_lock(1).is_locked());
    });
}

/// Spawns a reader of `agent` while the caller holds the writer side, checks that it does not
/// get in during a short window, then releases the writer and checks that the reader acquired
/// only after the release.
fn assert_reader_blocked_until_release(locks: &AgentLocks, agent: u64, window: WriteGuard) {
    let released = AtomicBool::new(false);
    let (ready_tx, ready_rx) = mpsc::channel();
    let (got_tx, got_rx) = mpsc::channel();
    thread::scope(|s| {
        s.spawn(|| {
            ready_tx.send(()).unwrap();
            let guard = locks.read(agent).unwrap();
            assert!(guard.is_locked());
            got_tx.send(released.load(Ordering::SeqCst)).unwrap();
        });
        ready_rx.recv_timeout(LONG).unwrap();
        assert!(
            got_rx.recv_timeout(SHORT).is_err(),
            "a reader got in while the writer side was held"
        );
        released.store(true, Ordering::SeqCst);
        drop(window);
        let saw_release = got_rx
            .recv_timeout(LONG)
            .expect("reader never got in after release");
        assert!(saw_release, "reader acquired before the writer released");
    });
}

#[test]
fn writer_excludes_readers_of_its_agent_until_released() {
    bounded(
        "writer_excludes_readers_of_its_agent_until_released",
        || {
            let locks = enabled();
            let window = locks.write(3).unwrap();
            assert!(locks.agent_lock(3).is_write_locked());
            assert_reader_blocked_until_release(&locks, 3, window);
        },
    );
}

#[test]
fn writer_does_not_block_readers_of_other_agents() {
    bounded("writer_does_not_block_readers_of_other_agents", || {
        let locks = enabled();
        let _window = locks.write(3).unwrap();
        let (tx, rx) = mpsc::channel();
        thread::scope(|s| {
            s.spawn(|| {
                let guard = locks.read(4).unwrap();
                assert!(guard.is_locked());
                tx.send(()).unwrap();
            });
            rx.recv_timeout(LONG)
                .expect("a reader of another agent was blocked by a replay window");
        });
    });
}

#[test]
fn two_agents_replay_at_once_on_two_threads() {
    bounded("two_agents_replay_at_once_on_two_threads", || {
        let locks = enabled();
        let (a_tx, a_rx) = mpsc::channel();
        let (b_tx, b_rx) = mpsc::channel();
        thread::scope(|s| {
            let locks = &locks;
            let a = s.spawn(move || {
                let _window = locks.write(10).unwrap();
                a_tx.send(()).unwrap();
                // Still holding agent 10's window: agent 11's window must open meanwhile.
                b_rx.recv_timeout(LONG).is_ok()
            });
            let b = s.spawn(move || {
                let _window = locks.write(11).unwrap();
                b_tx.send(()).unwrap();
                a_rx.recv_timeout(LONG).is_ok()
            });
            assert!(
                a.join().unwrap(),
                "agent 11's window did not overlap agent 10's"
            );
            assert!(
                b.join().unwrap(),
                "agent 10's window did not overlap agent 11's"
            );
        });
    });
}

#[test]
fn reentrant_read_and_write_on_same_thread_are_detected() {
    bounded(
        "reentrant_read_and_write_on_same_thread_are_detected",
        || {
            let locks = enabled();
            let window = locks.write(5).unwrap();
            match locks.read(5) {
                Err(Reentrant { agent }) => assert_eq!(agent, 5),
                Ok(_) => panic!("re-entrant read was not detected"),
            }
            assert_eq!(locks.write(5).unwrap_err(), Reentrant { agent: 5 });
            assert_eq!(
                locks.try_write_for(5, LONG).unwrap_err(),
                TryWriteError::Reentrant(Reentrant { agent: 5 })
            );
            assert!(matches!(locks.read_owned(5), Err(Reentrant { agent: 5 })));
            assert_eq!(Reentrant { agent: 5 }.reason(), "reentrant_dispatch");

            // Other agents are still available from inside the window, on both sides.
            assert!(locks.read(6).unwrap().is_locked());
            let other = locks.write(6).unwrap();
            drop(other);

            // Another thread's read still blocks until the writer releases.
            assert_reader_blocked_until_release(&locks, 5, window);
            // After the window, the same thread reads normally again.
            assert!(locks.read(5).unwrap().is_locked());
        },
    );
}

#[test]
fn reentrancy_is_detected_while_registry_disabled_for_writers() {
    bounded(
        "reentrancy_is_detected_while_registry_disabled_for_writers",
        || {
            let locks = AgentLocks::new();
            let _window = locks.write(9).unwrap();
            assert_eq!(locks.write(9).unwrap_err(), Reentrant { agent: 9 });
        },
    );
}

#[test]
fn replay_requested_inside_an_ordinary_dispatch_is_reentrant() {
    bounded(
        "replay_requested_inside_an_ordinary_dispatch_is_reentrant",
        || {
            let locks = enabled();
            let reader = locks.read(2).unwrap();
            assert_eq!(locks.write(2).unwrap_err(), Reentrant { agent: 2 });
            assert!(matches!(
                locks.try_write_for(2, LONG),
                Err(TryWriteError::Reentrant(_))
            ));
            // A different agent is fine.
            drop(locks.write(3).unwrap());
            drop(reader);
            drop(locks.write(2).unwrap());
        },
    );
}

#[test]
fn nested_reader_does_not_queue_behind_a_waiting_writer() {
    bounded(
        "nested_reader_does_not_queue_behind_a_waiting_writer",
        || {
            let locks = enabled();
            let (ready_tx, ready_rx) = mpsc::channel();
            let (nested_tx, nested_rx) = mpsc::channel();
            let (writer_tx, writer_rx) = mpsc::channel();
            thread::scope(|s| {
                let locks = &locks;
                s.spawn(move || {
                    let outer = locks.read(7).unwrap();
                    ready_tx.send(()).unwrap();
                    // Give the writer its chance to queue up, then take a nested reader.
                    let writer_in = writer_rx.recv_timeout(SHORT).is_ok();
                    let inner = locks.read(7).unwrap();
                    assert!(inner.is_locked());
                    nested_tx.send(writer_in).unwrap();
                    drop(inner);
                    drop(outer);
                });
                ready_rx.recv_timeout(LONG).unwrap();
                s.spawn(move || {
                    let _window = locks.write(7).unwrap();
                    let _ = writer_tx.send(());
                });
                let writer_got_in_early = nested_rx
                    .recv_timeout(LONG)
                    .expect("nested reader deadlocked behind a waiting writer");
                assert!(
                    !writer_got_in_early,
                    "writer acquired while a reader was held"
                );
            });
            assert!(!locks.agent_lock(7).is_locked());
        },
    );
}

#[test]
fn disabled_registry_takes_no_lock() {
    bounded("disabled_registry_takes_no_lock", || {
        let locks = AgentLocks::new();
        assert!(!locks.is_enabled());
        assert!(matches!(locks.read(1), Ok(ReadAccess::NotNeeded)));
        assert!(matches!(
            locks.read_owned(1),
            Ok(OwnedReadAccess::NotNeeded)
        ));
        // The reader path did not even create the agent's lock.
        assert!(locks.is_empty());

        // A replay window is open, yet disabled readers pass straight through.
        let window = locks.write(1).unwrap();
        let (tx, rx) = mpsc::channel();
        thread::scope(|s| {
            s.spawn(|| {
                let access = locks.read(1).unwrap();
                tx.send(access.is_locked()).unwrap();
            });
            let locked = rx
                .recv_timeout(LONG)
                .expect("a disabled reader waited on the lock");
            assert!(!locked);
        });
        drop(window);

        locks.set_enabled(true);
        assert!(locks.read(1).unwrap().is_locked());
        locks.set_enabled(false);
        assert!(!locks.read(1).unwrap().is_locked());
    });
}

#[test]
fn concurrent_lazy_creation_gives_one_lock_per_agent() {
    bounded("concurrent_lazy_creation_gives_one_lock_per_agent", || {
        // Few slots, so most agents land in overflow tables created concurrently too.
        let locks = AgentLocks::with_slots(4);
        const THREADS: usize = 8;
        const AGENTS: u64 = 300;
        let barrier = Barrier::new(THREADS);
        let seen: Mutex<Vec<Vec<usize>>> = Mutex::new(Vec::new());
        thread::scope(|s| {
            for t in 0..THREADS {
                let (locks, barrier, seen) = (&locks, &barrier, &seen);
                s.spawn(move || {
                    barrier.wait();
                    // Threads walk the agents in different orders to collide on creation.
                    let mut addrs = vec![0usize; AGENTS as usize];
                    for i in 0..AGENTS {
                        let agent = if t % 2 == 0 { i } else { AGENTS - 1 - i };
                        // Spread the keys like pointer-sized handles.
                        let key = 0x7f00_0000_0000 + agent * 0x40;
                        let lock = locks.agent_lock(key);
                        assert_eq!(lock.agent(), key);
                        addrs[agent as usize] = lock as *const AgentLock as usize;
                    }
                    seen.lock().unwrap().push(addrs);
                });
            }
        });
        let seen = seen.into_inner().unwrap();
        assert_eq!(seen.len(), THREADS);
        for other in &seen[1..] {
            assert_eq!(
                other, &seen[0],
                "two threads got different locks for one agent"
            );
        }
        let mut distinct = seen[0].clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), AGENTS as usize, "two agents share a lock");
        assert_eq!(locks.len(), AGENTS as usize);
    });
}

#[test]
fn overflowed_agents_keep_working_locks() {
    bounded("overflowed_agents_keep_working_locks", || {
        let locks = AgentLocks::with_slots(1);
        locks.set_enabled(true);
        for agent in 0..10 {
            let _ = locks.agent_lock(agent);
        }
        assert_eq!(locks.len(), 10);
        let window = locks.write(9).unwrap();
        assert!(locks.agent_lock(9).is_write_locked());
        assert!(!locks.agent_lock(8).is_locked());
        assert!(locks.read(8).unwrap().is_locked());
        assert_reader_blocked_until_release(&locks, 9, window);
        assert_eq!(locks.len(), 10);
    });
}

#[test]
fn try_write_for_times_out_when_another_thread_holds_the_window() {
    bounded(
        "try_write_for_times_out_when_another_thread_holds_the_window",
        || {
            let locks = enabled();
            let window = locks.write(4).unwrap();
            let timeout = Duration::from_millis(20);
            thread::scope(|s| {
                let result = s
                    .spawn(|| locks.try_write_for(4, timeout).map(|_| ()))
                    .join()
                    .unwrap();
                match result {
                    Err(TryWriteError::TimedOut { agent, waited }) => {
                        assert_eq!(agent, 4);
                        assert!(waited >= timeout, "gave up after {waited:?}");
                    }
                    other => panic!("expected a timeout, got {other:?}"),
                }
            });
            drop(window);
            assert!(locks.try_write_for(4, LONG).is_ok());
        },
    );
}

#[test]
fn try_read_for_gives_up_while_another_thread_holds_the_window() {
    bounded(
        "try_read_for_gives_up_while_another_thread_holds_the_window",
        || {
            let locks = enabled();
            let window = locks.write(7).unwrap();
            thread::scope(|s| {
                let got = s
                    .spawn(|| {
                        locks
                            .try_read_for(7, Duration::ZERO)
                            .map(|r| r.map(|a| a.is_locked()))
                    })
                    .join()
                    .unwrap();
                assert_eq!(got, Ok(None), "a writer holds agent 7");
            });
            assert!(matches!(
                locks.try_read_for(7, Duration::ZERO),
                Err(Reentrant { agent: 7 })
            ));
            drop(window);
            let got = locks.try_read_for(7, Duration::ZERO).unwrap();
            assert!(got.is_some_and(|r| r.is_locked()));
        },
    );
}

#[test]
fn writer_is_not_starved_by_a_stream_of_readers() {
    bounded("writer_is_not_starved_by_a_stream_of_readers", || {
        let locks = enabled();
        let stop = AtomicBool::new(false);
        let reads = AtomicUsize::new(0);
        let (started_tx, started_rx) = mpsc::channel();
        thread::scope(|s| {
            for _ in 0..3 {
                let (locks, stop, reads, started_tx) = (&locks, &stop, &reads, started_tx.clone());
                s.spawn(move || {
                    let mut first = true;
                    while !stop.load(Ordering::Relaxed) {
                        let guard = locks.read(12).unwrap();
                        reads.fetch_add(1, Ordering::Relaxed);
                        if first {
                            started_tx.send(()).unwrap();
                            first = false;
                        }
                        drop(guard);
                    }
                });
            }
            for _ in 0..3 {
                started_rx.recv_timeout(LONG).unwrap();
            }
            let result = locks.try_write_for(12, LONG);
            stop.store(true, Ordering::Relaxed);
            assert!(result.is_ok(), "writer starved behind readers: {result:?}");
        });
        assert!(reads.load(Ordering::Relaxed) >= 3);
    });
}

#[test]
fn write_guard_is_owned_and_can_be_released_on_another_thread() {
    bounded(
        "write_guard_is_owned_and_can_be_released_on_another_thread",
        || {
            fn assert_send_sync_static<T: Send + Sync + 'static>(_: &T) {}
            let locks = enabled();
            let window = locks.write(21).unwrap();
            assert_send_sync_static(&window);
            assert_eq!(window.agent(), 21);
            thread::scope(|s| {
                s.spawn(move || drop(window)).join().unwrap();
            });
            assert!(!locks.agent_lock(21).is_locked());
            // The acquiring thread is no longer considered inside the window.
            assert!(locks.read(21).unwrap().is_locked());
        },
    );
}

#[test]
fn adopted_window_moves_reentrancy_to_the_new_thread() {
    bounded("adopted_window_moves_reentrancy_to_the_new_thread", || {
        let locks = enabled();
        let window = locks.write(22).unwrap();
        thread::scope(|s| {
            let locks = &locks;
            s.spawn(move || {
                window.adopt_current_thread();
                assert_eq!(locks.read(22).unwrap_err(), Reentrant { agent: 22 });
                assert_eq!(locks.write(22).unwrap_err(), Reentrant { agent: 22 });
                drop(window);
            })
            .join()
            .unwrap();
        });
        assert!(locks.read(22).unwrap().is_locked());
    });
}

#[test]
fn owned_reader_outlives_the_borrow_and_releases_on_drop() {
    bounded(
        "owned_reader_outlives_the_borrow_and_releases_on_drop",
        || {
            let locks = Arc::new(enabled());
            let guard = match locks.read_owned(30).unwrap() {
                OwnedReadAccess::Locked(guard) => guard,
                OwnedReadAccess::NotNeeded => panic!("enabled registry skipped the lock"),
            };
            assert_eq!(guard.agent(), 30);
            assert!(locks.agent_lock(30).is_locked());
            assert!(!locks.agent_lock(30).is_write_locked());
            // A replay window on another thread waits for it.
            let timeout = Duration::from_millis(10);
            thread::scope(|s| {
                let blocked = s
                    .spawn(|| locks.try_write_for(30, timeout).is_err())
                    .join()
                    .unwrap();
                assert!(blocked, "writer got in while an owned reader was held");
            });
            drop(guard);
            assert!(!locks.agent_lock(30).is_locked());
        },
    );
}

#[test]
fn waiting_readers_and_writers_serve_others_until_the_window_closes() {
    bounded(
        "waiting_readers_and_writers_serve_others_until_the_window_closes",
        || {
            let locks = Arc::new(enabled());
            let window = locks.write(40).unwrap();
            let (served_tx, served_rx) = mpsc::channel::<&'static str>();
            thread::scope(|s| {
                let reader = {
                    let (locks, tx) = (&locks, served_tx.clone());
                    s.spawn(move || {
                        let access = locks
                            .read_serving(40, Duration::from_millis(1), || {
                                let _ = tx.send("reader");
                            })
                            .unwrap();
                        access.is_locked()
                    })
                };
                let writer = {
                    let (locks, tx) = (&locks, served_tx.clone());
                    s.spawn(move || {
                        let guard = locks
                            .write_serving(40, Duration::from_millis(1), || {
                                let _ = tx.send("writer");
                            })
                            .unwrap();
                        guard.agent()
                    })
                };
                // Both keep serving while the window is open: each reports at least once
                // before the window closes.
                let mut seen = (false, false);
                while !(seen.0 && seen.1) {
                    match served_rx.recv().unwrap() {
                        "reader" => seen.0 = true,
                        _ => seen.1 = true,
                    }
                }
                drop(window);
                assert!(
                    reader.join().unwrap(),
                    "the reader got the lock after the window"
                );
                assert_eq!(writer.join().unwrap(), 40);
            });
            // Re-entrancy is still detected by the serving variants.
            let window = locks.write(41).unwrap();
            assert!(
                locks
                    .read_serving(41, Duration::from_millis(1), || {})
                    .is_err()
            );
            assert!(
                locks
                    .write_serving(41, Duration::from_millis(1), || {})
                    .is_err()
            );
            drop(window);
        },
    );
}

#[test]
fn a_writer_still_waiting_for_readers_is_not_reported_as_holding_the_writer_side() {
    bounded(
        "a_writer_still_waiting_for_readers_is_not_reported_as_holding_the_writer_side",
        || {
            let locks = Arc::new(enabled());
            let (held_tx, held_rx) = mpsc::channel();
            let (release_tx, release_rx) = mpsc::channel::<()>();
            let reader = {
                let locks = locks.clone();
                thread::spawn(move || {
                    let read = locks.read(40).unwrap();
                    held_tx.send(()).unwrap();
                    let _ = release_rx.recv_timeout(LONG);
                    drop(read);
                })
            };
            held_rx.recv().unwrap();
            // A replay about to open a window: it waits for the reader to leave.
            let writer = {
                let locks = locks.clone();
                thread::spawn(move || {
                    let window = locks.try_write_for(40, LONG).unwrap();
                    drop(window);
                })
            };
            // While it waits (it has marked the lock to keep new readers out), no window is
            // open: a backend telling a window held from calls in progress must not see one.
            let deadline = std::time::Instant::now() + SHORT * 5;
            let mut seen = false;
            while std::time::Instant::now() < deadline && !seen {
                seen = locks.agent_lock(40).is_write_locked();
                thread::yield_now();
            }
            release_tx.send(()).unwrap();
            reader.join().unwrap();
            writer.join().unwrap();
            assert!(
                !seen,
                "a waiting writer was reported as holding the writer side"
            );
        },
    );
}

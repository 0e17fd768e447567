//! Behaviour of global context state, replay masks and the armed-only toggles.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use kreplay_ctxmask::{
    ContextError, ContextId, ContextRegistry, ToggleError, replay_start_context,
    replay_stop_context,
};

/// Upper bound for any wait on another thread in these tests.
const DEADLINE: Duration = Duration::from_secs(10);

fn registry_with_started(count: usize) -> (ContextRegistry, Vec<ContextId>) {
    let registry = ContextRegistry::new();
    let ids: Vec<_> = (0..count).map(|_| registry.create()).collect();
    for &id in &ids {
        registry.start(id).unwrap();
    }
    (registry, ids)
}

#[test]
fn ids_start_at_one_and_zero_is_unknown() {
    let registry = ContextRegistry::new();
    assert_eq!(registry.create(), ContextId(1));
    assert_eq!(registry.create(), ContextId(2));
    assert_eq!(
        registry.is_started(ContextId(0)),
        Err(ContextError::UnknownContext)
    );
    assert_eq!(
        registry.start(ContextId(0)),
        Err(ContextError::UnknownContext)
    );
}

#[test]
fn ids_never_created_are_unknown_and_never_active() {
    let registry = ContextRegistry::new();
    let id = registry.create();
    let never = ContextId(id.0 + 1);
    assert_eq!(registry.start(never), Err(ContextError::UnknownContext));
    assert_eq!(registry.stop(never), Err(ContextError::UnknownContext));
    assert_eq!(
        registry.is_started(never),
        Err(ContextError::UnknownContext)
    );
    assert!(!registry.is_active(never));
}

#[test]
fn new_contexts_are_stopped_until_started_and_stop_again() {
    let registry = ContextRegistry::new();
    let id = registry.create();
    assert_eq!(registry.is_started(id), Ok(false));
    assert!(!registry.is_active(id));
    registry.start(id).unwrap();
    assert_eq!(registry.is_started(id), Ok(true));
    assert!(registry.is_active(id));
    registry.stop(id).unwrap();
    assert_eq!(registry.is_started(id), Ok(false));
    assert!(!registry.is_active(id));
}

#[test]
fn active_contexts_lists_started_ones_in_id_order() {
    let registry = ContextRegistry::new();
    let ids: Vec<_> = (0..5).map(|_| registry.create()).collect();
    registry.start(ids[3]).unwrap();
    registry.start(ids[0]).unwrap();
    registry.start(ids[2]).unwrap();
    assert_eq!(registry.active_contexts(), vec![ids[0], ids[2], ids[3]]);
}

#[test]
fn registries_do_not_share_contexts() {
    let a = ContextRegistry::new();
    let b = ContextRegistry::new();
    let id = a.create();
    a.start(id).unwrap();
    assert_eq!(b.is_started(id), Err(ContextError::UnknownContext));
}

#[test]
fn global_registry_is_one_instance() {
    let first = ContextRegistry::global() as *const ContextRegistry;
    let second = ContextRegistry::global() as *const ContextRegistry;
    assert_eq!(first, second);
    let id = ContextRegistry::global().create();
    assert_eq!(ContextRegistry::global().is_started(id), Ok(false));
}

#[test]
fn registry_and_ids_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<ContextRegistry>();
    send_sync::<ContextId>();
}

#[test]
fn toggles_outside_any_replay_loop_are_not_armed() {
    let (_registry, ids) = registry_with_started(1);
    assert_eq!(replay_stop_context(ids[0]), Err(ToggleError::NotArmed));
    assert_eq!(replay_start_context(ids[0]), Err(ToggleError::NotArmed));
}

#[test]
fn toggles_in_a_loop_but_outside_pass_enter_are_refused_and_change_nothing() {
    let (registry, ids) = registry_with_started(2);
    let mask = registry.begin_replay();
    assert_eq!(replay_stop_context(ids[0]), Err(ToggleError::NotArmed));
    assert!(registry.is_active(ids[0]));
    assert!(mask.is_enabled(ids[0]));
    {
        let _armed = mask.arm();
    }
    // Armed once, then disarmed again (PASS ENTER is over).
    assert_eq!(replay_stop_context(ids[1]), Err(ToggleError::NotArmed));
    assert!(registry.is_active(ids[1]));
    assert!(mask.masked_off().is_empty());
}

#[test]
fn stop_toggle_masks_a_context_for_this_threads_dispatches_only_while_looping() {
    let (registry, ids) = registry_with_started(2);
    {
        let mask = registry.begin_replay();
        {
            let _armed = mask.arm();
            assert_eq!(replay_stop_context(ids[1]), Ok(()));
        }
        assert!(registry.is_active(ids[0]));
        assert!(!registry.is_active(ids[1]));
        assert!(!mask.is_enabled(ids[1]));
        assert_eq!(registry.active_contexts(), vec![ids[0]]);
        assert_eq!(mask.masked_off(), vec![ids[1]]);
    }
    assert!(registry.is_active(ids[1]));
    assert_eq!(registry.active_contexts(), ids);
}

#[test]
fn toggles_never_touch_global_state() {
    let (registry, ids) = registry_with_started(1);
    let mask = registry.begin_replay();
    let _armed = mask.arm();
    replay_stop_context(ids[0]).unwrap();
    assert_eq!(registry.is_started(ids[0]), Ok(true));
    replay_start_context(ids[0]).unwrap();
    replay_stop_context(ids[0]).unwrap();
    assert_eq!(registry.is_started(ids[0]), Ok(true));
}

#[test]
fn toggling_a_context_stopped_when_the_loop_began_is_not_started() {
    let registry = ContextRegistry::new();
    let started = registry.create();
    let stopped = registry.create();
    registry.start(started).unwrap();
    let mask = registry.begin_replay();
    let _armed = mask.arm();
    assert_eq!(replay_start_context(stopped), Err(ToggleError::NotStarted));
    assert_eq!(replay_stop_context(stopped), Err(ToggleError::NotStarted));
    // A toggle cannot promote a globally stopped context.
    assert!(!registry.is_active(stopped));
    assert!(!mask.is_enabled(stopped));
    assert_eq!(registry.is_started(stopped), Ok(false));
}

#[test]
fn toggling_an_unknown_context_is_not_started() {
    let (registry, ids) = registry_with_started(1);
    let mask = registry.begin_replay();
    let _armed = mask.arm();
    assert_eq!(
        replay_stop_context(ContextId(ids[0].0 + 100)),
        Err(ToggleError::NotStarted)
    );
    assert_eq!(
        replay_start_context(ContextId(0)),
        Err(ToggleError::NotStarted)
    );
}

#[test]
fn context_started_after_the_loop_began_cannot_be_toggled_but_is_active() {
    let registry = ContextRegistry::new();
    let late = registry.create();
    let mask = registry.begin_replay();
    registry.start(late).unwrap();
    let _armed = mask.arm();
    assert_eq!(replay_stop_context(late), Err(ToggleError::NotStarted));
    assert!(registry.is_active(late));
    assert!(mask.is_enabled(late));
    assert_eq!(mask.started_at_begin(), Vec::<ContextId>::new());
}

#[test]
fn masks_are_sticky_across_passes_until_toggled_back() {
    let (registry, ids) = registry_with_started(3);
    let mask = registry.begin_replay();
    // Pass 0: stop context 0.
    {
        let _armed = mask.arm();
        replay_stop_context(ids[0]).unwrap();
    }
    assert_eq!(registry.active_contexts(), vec![ids[1], ids[2]]);
    // Pass 1: no toggles at all: the mask of pass 0 still holds.
    {
        let _armed = mask.arm();
    }
    assert_eq!(registry.active_contexts(), vec![ids[1], ids[2]]);
    // Pass 2: swap which one is off.
    {
        let _armed = mask.arm();
        replay_start_context(ids[0]).unwrap();
        replay_stop_context(ids[2]).unwrap();
    }
    assert_eq!(registry.active_contexts(), vec![ids[0], ids[1]]);
    // A context the tool never masks was active on every pass.
    assert!(registry.is_active(ids[1]));
}

#[test]
fn repeated_toggles_are_idempotent() {
    let (registry, ids) = registry_with_started(1);
    let mask = registry.begin_replay();
    let _armed = mask.arm();
    replay_stop_context(ids[0]).unwrap();
    replay_stop_context(ids[0]).unwrap();
    assert_eq!(mask.masked_off(), vec![ids[0]]);
    replay_start_context(ids[0]).unwrap();
    replay_start_context(ids[0]).unwrap();
    assert!(mask.masked_off().is_empty());
    assert!(registry.is_active(ids[0]));
}

#[test]
fn masks_reset_when_the_loop_ends() {
    let (registry, ids) = registry_with_started(2);
    {
        let mask = registry.begin_replay();
        let _armed = mask.arm();
        replay_stop_context(ids[0]).unwrap();
        replay_stop_context(ids[1]).unwrap();
    }
    assert_eq!(registry.active_contexts(), ids);
    // A second loop on the same registry starts with an empty mask.
    let mask = registry.begin_replay();
    assert!(mask.masked_off().is_empty());
    assert!(mask.is_enabled(ids[0]) && mask.is_enabled(ids[1]));
}

#[test]
fn global_stop_during_the_loop_wins_over_the_mask() {
    let (registry, ids) = registry_with_started(1);
    let mask = registry.begin_replay();
    registry.stop(ids[0]).unwrap();
    assert!(!registry.is_active(ids[0]));
    assert!(!mask.is_enabled(ids[0]));
    // It was started when the loop began, so toggling it is allowed, but cannot revive it.
    let _armed = mask.arm();
    assert_eq!(replay_start_context(ids[0]), Ok(()));
    assert!(!registry.is_active(ids[0]));
    assert_eq!(registry.is_started(ids[0]), Ok(false));
}

#[test]
fn inner_loop_hides_the_outer_until_dropped() {
    let (registry, ids) = registry_with_started(2);
    let outer = registry.begin_replay();
    {
        let _armed = outer.arm();
        replay_stop_context(ids[0]).unwrap();
    }
    {
        let inner = registry.begin_replay();
        // The inner loop starts with its own, empty mask.
        assert!(registry.is_active(ids[0]));
        assert!(registry.is_active(ids[1]));
        {
            let _armed = inner.arm();
            replay_stop_context(ids[1]).unwrap();
        }
        assert!(registry.is_active(ids[0]));
        assert!(!registry.is_active(ids[1]));
        // The outer mask is unchanged by toggles routed to the inner loop.
        assert_eq!(outer.masked_off(), vec![ids[0]]);
    }
    // Back to the outer loop's mask.
    assert!(!registry.is_active(ids[0]));
    assert!(registry.is_active(ids[1]));
}

#[test]
fn toggles_route_to_the_innermost_loop_even_when_the_outer_is_armed() {
    let (registry, ids) = registry_with_started(1);
    let outer = registry.begin_replay();
    let _outer_armed = outer.arm();
    {
        // A nested loop begun during the outer PASS ENTER: it is not armed itself.
        let inner = registry.begin_replay();
        assert_eq!(replay_stop_context(ids[0]), Err(ToggleError::NotArmed));
        let _inner_armed = inner.arm();
        assert_eq!(replay_stop_context(ids[0]), Ok(()));
        assert_eq!(inner.masked_off(), vec![ids[0]]);
    }
    // Inner gone: the outer is armed again and its mask untouched.
    assert!(outer.masked_off().is_empty());
    assert_eq!(replay_stop_context(ids[0]), Ok(()));
    assert_eq!(outer.masked_off(), vec![ids[0]]);
}

#[test]
fn out_of_order_drop_removes_the_right_loop() {
    let (registry, ids) = registry_with_started(1);
    let outer = registry.begin_replay();
    let inner = registry.begin_replay();
    {
        let _armed = inner.arm();
        replay_stop_context(ids[0]).unwrap();
    }
    drop(outer);
    // The inner loop is still in place and still masks.
    assert!(!registry.is_active(ids[0]));
    drop(inner);
    assert!(registry.is_active(ids[0]));
}

#[test]
fn a_loop_of_another_registry_does_not_mask_this_one() {
    let (a, a_ids) = registry_with_started(1);
    let (b, b_ids) = registry_with_started(1);
    let mask_a = a.begin_replay();
    {
        let _armed = mask_a.arm();
        replay_stop_context(a_ids[0]).unwrap();
    }
    assert!(!a.is_active(a_ids[0]));
    assert!(b.is_active(b_ids[0]));
    // b's loop nested inside a's: a's dispatches still see a's mask.
    let mask_b = b.begin_replay();
    assert!(!a.is_active(a_ids[0]));
    assert!(mask_b.is_enabled(b_ids[0]));
}

#[test]
fn another_threads_dispatches_ignore_this_threads_mask() {
    let (registry, ids) = registry_with_started(2);
    let (to_worker, worker_rx) = mpsc::channel::<()>();
    let (to_main, main_rx) = mpsc::channel::<(bool, bool, Result<(), ToggleError>)>();
    thread::scope(|s| {
        let registry = &registry;
        let ids = &ids;
        s.spawn(move || {
            worker_rx
                .recv_timeout(DEADLINE)
                .expect("main thread signal");
            let toggle = replay_stop_context(ids[1]);
            to_main
                .send((
                    registry.is_active(ids[0]),
                    registry.is_active(ids[1]),
                    toggle,
                ))
                .unwrap();
        });
        let mask = registry.begin_replay();
        let _armed = mask.arm();
        replay_stop_context(ids[0]).unwrap();
        to_worker.send(()).unwrap();
        let (worker_sees_0, worker_sees_1, worker_toggle) =
            main_rx.recv_timeout(DEADLINE).expect("worker answer");
        // The worker sees global state only, and it has no loop to toggle.
        assert!(worker_sees_0);
        assert!(worker_sees_1);
        assert_eq!(worker_toggle, Err(ToggleError::NotArmed));
        // This thread still sees its own mask, untouched by the worker's attempt.
        assert!(!registry.is_active(ids[0]));
        assert!(registry.is_active(ids[1]));
    });
}

#[test]
fn concurrent_loops_on_two_threads_keep_separate_masks() {
    let (registry, ids) = registry_with_started(2);
    let barrier = std::sync::Barrier::new(2);
    thread::scope(|s| {
        let run = |masked: ContextId, kept: ContextId| {
            let registry = &registry;
            let barrier = &barrier;
            move || {
                let mask = registry.begin_replay();
                {
                    let _armed = mask.arm();
                    replay_stop_context(masked).unwrap();
                }
                // Both loops are in place at the same time here.
                barrier.wait();
                let seen = (registry.is_active(masked), registry.is_active(kept));
                barrier.wait();
                seen
            }
        };
        let first = s.spawn(run(ids[0], ids[1]));
        let second = s.spawn(run(ids[1], ids[0]));
        assert_eq!(first.join().unwrap(), (false, true));
        assert_eq!(second.join().unwrap(), (false, true));
    });
    assert_eq!(registry.active_contexts(), ids);
}

#[test]
fn concurrent_creation_gives_distinct_ids_with_independent_state() {
    const THREADS: u64 = 4;
    const PER_THREAD: u64 = 200;
    let registry = ContextRegistry::new();
    let mut all: Vec<ContextId> = thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let registry = &registry;
                s.spawn(move || {
                    let mut mine = Vec::new();
                    for i in 0..PER_THREAD {
                        let id = registry.create();
                        if (t + i) % 2 == 0 {
                            registry.start(id).unwrap();
                        }
                        mine.push((id, (t + i) % 2 == 0));
                    }
                    for &(id, started) in &mine {
                        assert_eq!(registry.is_started(id), Ok(started));
                    }
                    mine.into_iter().map(|(id, _)| id).collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    all.sort();
    let expected: Vec<_> = (1..=THREADS * PER_THREAD).map(ContextId).collect();
    assert_eq!(all, expected);
}

#[test]
fn a_mask_leaving_scope_during_unwinding_still_resets() {
    let (registry, ids) = registry_with_started(1);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mask = registry.begin_replay();
        let _armed = mask.arm();
        replay_stop_context(ids[0]).unwrap();
        panic!("tool callback failed");
    }));
    assert!(result.is_err());
    assert!(registry.is_active(ids[0]));
    assert_eq!(replay_stop_context(ids[0]), Err(ToggleError::NotArmed));
}

/// A replay loop run from a thread-local destructor at thread exit, after the crate's own
/// thread-locals were destroyed: what it saw, or where it panicked.
fn replay_loop_from_a_thread_local_destructor() -> Result<Vec<String>, String> {
    use std::cell::Cell;
    use std::sync::Mutex;

    static SEEN: Mutex<Option<Result<Vec<String>, String>>> = Mutex::new(None);

    fn replay_loop() -> Vec<String> {
        let (registry, ids) = registry_with_started(2);
        let mut seen = Vec::new();
        {
            let mask = registry.begin_replay();
            {
                let _pass0 = mask.arm();
                replay_stop_context(ids[0]).unwrap();
            }
            seen.push(format!(
                "pass 1: {} {}",
                registry.is_active(ids[0]),
                registry.is_active(ids[1])
            ));
            {
                let inner = registry.begin_replay();
                seen.push(format!("inner: {}", inner.is_enabled(ids[0])));
            }
            seen.push(format!("masked off: {:?}", mask.masked_off()));
        }
        seen.push(format!("after: {}", registry.is_active(ids[0])));
        seen
    }

    struct AtExit(Cell<bool>);
    impl Drop for AtExit {
        fn drop(&mut self) {
            if self.0.get() {
                let seen = std::panic::catch_unwind(replay_loop).map_err(|panic| {
                    panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_default()
                });
                *SEEN.lock().unwrap() = Some(seen);
            }
        }
    }
    thread_local! {
        static AT_EXIT: AtExit = const { AtExit(Cell::new(false)) };
    }

    thread::spawn(|| {
        // Made first, so destroyed after the crate's thread-locals, which the loop below makes.
        AT_EXIT.with(|at_exit| at_exit.0.set(true));
        let (registry, _) = registry_with_started(1);
        drop(registry.begin_replay());
    })
    .join()
    .unwrap();
    SEEN.lock().unwrap().take().expect("the destructor ran")
}

#[test]
fn a_replay_loop_from_a_thread_local_destructor_at_thread_exit_masks_as_usual() {
    assert_eq!(
        replay_loop_from_a_thread_local_destructor(),
        Ok(vec![
            "pass 1: false true".to_string(),
            "inner: true".to_string(),
            format!("masked off: {:?}", [ContextId(1)]),
            "after: true".to_string(),
        ])
    );
}

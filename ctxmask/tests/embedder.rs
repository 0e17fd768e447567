//! Masks under load: many threads nesting replay loops at once while contexts are started and
//! stopped globally, loops of several registries on one thread, and a replay run from a
//! `pthread_key_create` destructor on a thread that never used the crate before.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::{Barrier, Mutex};
use std::thread;

use kreplay_ctxmask::{
    ContextId, ContextRegistry, ToggleError, replay_start_context, replay_stop_context,
};

unsafe extern "C" {
    // glibc's thread-specific data (`pthread_key_t` is an `unsigned int` there).
    fn pthread_key_create(
        key: *mut c_uint,
        destructor: Option<unsafe extern "C" fn(*mut c_void)>,
    ) -> c_int;
    fn pthread_setspecific(key: c_uint, value: *const c_void) -> c_int;
}

fn started(registry: &ContextRegistry, count: usize) -> Vec<ContextId> {
    (0..count)
        .map(|_| {
            let id = registry.create();
            registry.start(id).unwrap();
            id
        })
        .collect()
}

/// Eight threads each run an outer and an inner loop masking a context of their own, all
/// loops live at once, while the main thread starts and stops another context globally: every
/// thread sees its own masks only, and none survive the loops.
#[test]
fn many_threads_nest_loops_while_global_state_changes() {
    const THREADS: usize = 8;
    let registry = ContextRegistry::new();
    let ids = started(&registry, THREADS + 1);
    let flapping = ids[THREADS];
    let all_in = Barrier::new(THREADS + 1);
    let checked = Barrier::new(THREADS + 1);
    let failures = Mutex::new(Vec::<String>::new());
    thread::scope(|s| {
        for t in 0..THREADS {
            let (registry, ids, all_in, checked, failures) =
                (&registry, &ids, &all_in, &checked, &failures);
            s.spawn(move || {
                let mine = ids[t];
                let next = ids[(t + 1) % THREADS];
                let check = |what: &str, ok: bool| {
                    if !ok {
                        failures.lock().unwrap().push(format!("thread {t}: {what}"));
                    }
                };
                for _round in 0..50 {
                    let outer = registry.begin_replay();
                    {
                        let _armed = outer.arm();
                        replay_stop_context(mine).unwrap();
                    }
                    {
                        let inner = registry.begin_replay();
                        {
                            let _armed = inner.arm();
                            replay_stop_context(next).unwrap();
                        }
                        check("inner hides outer", registry.is_active(mine));
                        check("inner masks next", !registry.is_active(next));
                    }
                    check("outer masks mine", !registry.is_active(mine));
                    check("outer leaves next", registry.is_active(next));
                    let others = ids[..THREADS]
                        .iter()
                        .filter(|&&id| id != mine)
                        .all(|&id| registry.is_active(id));
                    check("others unmasked", others);
                    drop(outer);
                    check(
                        "loop ended",
                        ids[..THREADS].iter().all(|&id| registry.is_active(id)),
                    );
                }
                // One more loop held while every thread checks its own view at once.
                let held = registry.begin_replay();
                {
                    let _armed = held.arm();
                    replay_stop_context(mine).unwrap();
                }
                all_in.wait();
                check("held masks mine", !registry.is_active(mine));
                check(
                    "held masks nothing else",
                    registry.active_contexts().iter().all(|&id| id != mine)
                        && registry.active_contexts().contains(&next),
                );
                checked.wait();
            });
        }
        for i in 0..20_000 {
            if i % 2 == 0 {
                registry.stop(flapping).unwrap();
            } else {
                registry.start(flapping).unwrap();
            }
        }
        all_in.wait();
        // The main thread runs no loop: every started context is active here.
        for &id in &ids[..THREADS] {
            assert!(
                registry.is_active(id),
                "{id:?} masked on a thread without a loop"
            );
        }
        checked.wait();
    });
    let failures = failures.into_inner().unwrap();
    assert!(failures.is_empty(), "{failures:?}");
    assert!(ids[..THREADS].iter().all(|&id| registry.is_active(id)));
}

/// Toggles go to the innermost loop of the thread whatever its registry, and a loop of one
/// registry never masks another's: with loops of two registries nested, masking through the
/// inner one leaves the outer registry's contexts alone.
#[test]
fn nested_loops_of_two_registries_keep_their_masks_apart() {
    let a = ContextRegistry::new();
    let b = ContextRegistry::new();
    let a_ids = started(&a, 2);
    let b_ids = started(&b, 2);
    let outer = a.begin_replay();
    {
        let _armed = outer.arm();
        replay_stop_context(a_ids[0]).unwrap();
    }
    {
        let inner = b.begin_replay();
        let _armed = inner.arm();
        replay_stop_context(b_ids[1]).unwrap();
        assert!(!a.is_active(a_ids[0]), "a's outer mask still holds for a");
        assert!(a.is_active(a_ids[1]));
        assert!(b.is_active(b_ids[0]) && !b.is_active(b_ids[1]));
    }
    assert!(!a.is_active(a_ids[0]));
    assert!(b.is_active(b_ids[1]), "b's loop ended");
    drop(outer);
    assert!(a.is_active(a_ids[0]));
}

/// A context stopped and started again globally during a loop that masked it stays masked for
/// the loop (the mask is sticky); one stopped at the loop's start and started during it is
/// active but cannot be masked.
#[test]
fn global_stop_and_start_during_a_loop() {
    let registry = ContextRegistry::new();
    let ids = started(&registry, 2);
    registry.stop(ids[1]).unwrap();
    let mask = registry.begin_replay();
    {
        let _armed = mask.arm();
        replay_stop_context(ids[0]).unwrap();
    }
    registry.stop(ids[0]).unwrap();
    assert!(!registry.is_active(ids[0]));
    registry.start(ids[0]).unwrap();
    assert!(
        !registry.is_active(ids[0]),
        "masked for the rest of the loop"
    );
    registry.start(ids[1]).unwrap();
    assert!(registry.is_active(ids[1]));
    let _armed = mask.arm();
    assert_eq!(replay_stop_context(ids[1]), Err(ToggleError::NotStarted));
    assert_eq!(replay_start_context(ids[0]), Ok(()));
    assert!(registry.is_active(ids[0]));
}

/// A replay loop run from a pthread key destructor, the thread's first use of the crate.
#[test]
fn a_replay_from_a_pthread_key_destructor_on_a_fresh_thread_masks_as_usual() {
    static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());
    unsafe extern "C" fn run(_: *mut c_void) {
        let seen = std::panic::catch_unwind(|| {
            let registry = ContextRegistry::new();
            let ids = started(&registry, 2);
            let mask = registry.begin_replay();
            {
                let _armed = mask.arm();
                replay_stop_context(ids[1]).unwrap();
            }
            let during = (registry.is_active(ids[0]), registry.is_active(ids[1]));
            drop(mask);
            (during, registry.is_active(ids[1]))
        });
        SEEN.lock().unwrap().push(format!("{seen:?}"));
    }
    thread::spawn(|| {
        let mut key: c_uint = 0;
        // SAFETY: a valid out pointer and a destructor that never unwinds.
        assert_eq!(unsafe { pthread_key_create(&mut key, Some(run)) }, 0);
        // SAFETY: a non-null value makes the destructor run at thread exit.
        assert_eq!(unsafe { pthread_setspecific(key, std::ptr::dangling()) }, 0);
    })
    .join()
    .unwrap();
    assert_eq!(*SEEN.lock().unwrap(), ["Ok(((true, false), true))"]);
}

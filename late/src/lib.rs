//! Per-thread state that stays usable after the thread's own thread-locals are destroyed.
//!
//! An application may call into kreplay from a thread-local destructor at thread exit (a C++
//! `thread_local`'s destructor, a `pthread_key_create` destructor), after Rust's thread-locals,
//! kreplay's included, were destroyed. A `thread_local!` that owns a value with a destructor
//! cannot be reached then: `LocalKey::with` panics, `try_with` fails. The per-thread state of a
//! replay (its context masks, a CUDA launch's window, the reader sides of fenced calls) must
//! still be there, since the call replays like any other.
//!
//! [`with`] runs a closure on such a thread-local, a `RefCell<T>`, while it lives and, once it
//! is destroyed, on a heap copy of the state reached from a second thread-local, a [`Late<T>`],
//! which has no destructor and so stays readable until the thread ends. The copy starts as
//! `T::default()`, is made on first use and is freed when the outermost [`with`] call using it
//! returns (or unwinds) with the state [`Vacant`]; calls nested inside one another share it. A
//! copy still holding something when the thread ends is not freed (nothing of the thread runs
//! after its last destructor); state with a scoped owner (a guard that empties it when dropped)
//! is vacant again by then.
//!
//! A thread whose first call comes from a `pthread_key_create` destructor, which glibc runs
//! after every thread-local destructor, finds the thread-local never made: using it makes it
//! then, and its destructor, registered too late, never runs. What it holds when the thread
//! ends stays allocated, vacant or not (a `Vec` keeps its capacity); only such threads pay it.
//!
//! The copy belongs to its thread: it is made, reached and freed by that thread only, and takes
//! no lock.
//!
//! The crate knows nothing about any GPU runtime and has no dependencies.

use std::cell::{Cell, RefCell};
use std::thread::LocalKey;

/// State that can be empty: a late copy is freed once it is.
pub trait Vacant: Default {
    /// Whether the state holds nothing (is as [`Default::default`] made it, as far as its
    /// owner cares).
    fn is_vacant(&self) -> bool;
}

impl<T> Vacant for Option<T> {
    fn is_vacant(&self) -> bool {
        self.is_none()
    }
}

impl<T> Vacant for Vec<T> {
    fn is_vacant(&self) -> bool {
        self.is_empty()
    }
}

/// Where a thread's state goes once its thread-local is destroyed. Declare it in a
/// `thread_local!` beside that thread-local, with a `const` initializer ([`Late::new`]); it has
/// no destructor, so it stays readable until the thread ends.
#[derive(Debug)]
pub struct Late<T: 'static> {
    /// The heap copy (null until needed), made and freed by this thread only.
    state: Cell<*mut RefCell<T>>,
    /// How many [`with`] calls of this thread are inside it on the copy.
    depth: Cell<u32>,
}

impl<T> Late<T> {
    /// No late copy yet.
    pub const fn new() -> Late<T> {
        // Without a destructor, the thread-local holding a `Late` is never destroyed.
        const { assert!(!std::mem::needs_drop::<Late<T>>()) };
        Late {
            state: Cell::new(std::ptr::null_mut()),
            depth: Cell::new(0),
        }
    }
}

impl<T> Default for Late<T> {
    fn default() -> Late<T> {
        Late::new()
    }
}

/// Runs `f` on this thread's state: the thread-local `local` while it lives, or, once it is
/// destroyed (thread exit), the late copy `late` keeps.
pub fn with<T: Vacant, R>(
    local: &'static LocalKey<RefCell<T>>,
    late: &'static LocalKey<Late<T>>,
    f: impl FnOnce(&RefCell<T>) -> R,
) -> R {
    let mut f = Some(f);
    if let Ok(value) = local.try_with(|state| (f.take().expect("called once"))(state)) {
        return value;
    }
    let f = f.take().expect("not called yet");
    // `Late` has no destructor: its thread-local is readable until the thread ends.
    late.with(|late| {
        if late.state.get().is_null() {
            late.state
                .set(Box::into_raw(Box::new(RefCell::new(T::default()))));
        }
        let state = late.state.get();
        late.depth.set(late.depth.get() + 1);
        let _leave = Leave(late);
        // SAFETY: `state` came from `Box::into_raw` on this thread and is reached only from
        // this thread's `late`; it is freed only by `Leave` when no call of this thread is
        // inside `with` (depth 0), so it is alive for this call, `f` included.
        f(unsafe { &*state })
    })
}

/// Leaves a [`with`] call on the late copy (also when `f` unwinds): the outermost one frees a
/// copy left vacant.
struct Leave<'a, T: Vacant + 'static>(&'a Late<T>);

impl<T: Vacant> Drop for Leave<'_, T> {
    fn drop(&mut self) {
        let late = self.0;
        late.depth.set(late.depth.get() - 1);
        let state = late.state.get();
        if late.depth.get() > 0 || state.is_null() {
            return;
        }
        // SAFETY: as in `with`: made by this thread, and no call of it is inside (depth 0).
        let vacant = unsafe { &*state }.try_borrow().is_ok_and(|s| s.is_vacant());
        if vacant {
            late.state.set(std::ptr::null_mut());
            // SAFETY: the pointer `Box::into_raw` gave, no longer reachable (cleared above),
            // and no reference to it is alive (depth 0).
            drop(unsafe { Box::from_raw(state) });
        }
    }
}

/// The README's example, compiled and run as a doctest so that it cannot go stale.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};

    thread_local! {
        static STACK: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
        static STACK_LATE: Late<Vec<u32>> = const { Late::new() };
    }

    /// Whether this thread's late copy of [`STACK`] exists.
    fn stack_late_copy_exists() -> bool {
        STACK_LATE.with(|late| !late.state.get().is_null())
    }

    /// Whether [`STACK`] is destroyed: what the calls that follow must not need.
    fn stack_is_destroyed() -> bool {
        STACK.try_with(|_| ()).is_err()
    }

    /// Runs `alive` on a new thread, then `f` as a thread-specific data destructor does, after
    /// the thread's Rust thread-locals (those `alive` used) were destroyed.
    fn at_thread_exit_after(alive: fn(), f: fn()) {
        extern "C" fn run(f: *mut libc::c_void) {
            // SAFETY: the function pointer `at_thread_exit` stored.
            let f: fn() = unsafe { std::mem::transmute::<*mut libc::c_void, fn()>(f) };
            let _ = std::panic::catch_unwind(f);
        }
        std::thread::spawn(move || {
            // Alive (and so destroyed at exit) before the destructor runs.
            alive();
            // SAFETY: zeroed storage for the key.
            let mut key: libc::pthread_key_t = unsafe { std::mem::zeroed() };
            // SAFETY: a valid out pointer and a destructor that never unwinds.
            assert_eq!(unsafe { libc::pthread_key_create(&mut key, Some(run)) }, 0);
            // SAFETY: the key just made; a non-null value makes its destructor run.
            let set = unsafe { libc::pthread_setspecific(key, f as *mut libc::c_void) };
            assert_eq!(set, 0);
        })
        .join()
        .unwrap();
    }

    /// [`at_thread_exit_after`] a use of [`STACK`].
    fn at_thread_exit(f: fn()) {
        at_thread_exit_after(|| with(&STACK, &STACK_LATE, |s| s.borrow_mut().push(0)), f);
    }

    /// Runs `f` on a new thread from the destructor of a `thread_local!` made before
    /// [`STACK`] was first used there, so destroyed after it.
    fn from_a_thread_local_destructor(f: fn()) {
        struct RunOnDrop(Cell<Option<fn()>>);
        impl Drop for RunOnDrop {
            fn drop(&mut self) {
                if let Some(f) = self.0.take() {
                    // A panic out of a thread-local destructor would abort the process.
                    let _ = std::panic::catch_unwind(f);
                }
            }
        }
        thread_local! {
            static AT_EXIT: RunOnDrop = const { RunOnDrop(Cell::new(None)) };
        }
        std::thread::spawn(move || {
            AT_EXIT.with(|at_exit| at_exit.0.set(Some(f)));
            with(&STACK, &STACK_LATE, |s| s.borrow_mut().push(0));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn while_the_thread_local_lives_it_holds_the_state_and_no_late_copy_is_made() {
        with(&STACK, &STACK_LATE, |s| s.borrow_mut().push(7));
        assert_eq!(STACK.with(|s| s.borrow().clone()), vec![7]);
        assert!(!stack_late_copy_exists());
        assert_eq!(with(&STACK, &STACK_LATE, |s| s.borrow_mut().pop()), Some(7));
    }

    #[test]
    fn state_is_kept_after_the_thread_locals_are_destroyed_and_nested_calls_share_it() {
        static SEEN: Mutex<Vec<Vec<u32>>> = Mutex::new(Vec::new());
        at_thread_exit(|| {
            assert!(stack_is_destroyed());
            with(&STACK, &STACK_LATE, |s| s.borrow_mut().push(1));
            with(&STACK, &STACK_LATE, |outer| {
                outer.borrow_mut().push(2);
                with(&STACK, &STACK_LATE, |inner| inner.borrow_mut().push(3));
                SEEN.lock().unwrap().push(outer.borrow().clone());
                outer.borrow_mut().clear();
            });
            // Vacant after the outermost call: freed, and a fresh copy starts empty.
            with(&STACK, &STACK_LATE, |s| {
                SEEN.lock().unwrap().push(s.borrow().clone())
            });
        });
        assert_eq!(*SEEN.lock().unwrap(), vec![vec![1, 2, 3], vec![]]);
    }

    #[test]
    fn state_used_from_a_thread_local_destructor_is_kept_until_vacant_then_freed() {
        /// What the destructor saw, in order.
        static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());
        fn saw(what: impl Into<String>) {
            SEEN.lock().unwrap().push(what.into());
        }
        from_a_thread_local_destructor(|| {
            saw(format!("destroyed {}", stack_is_destroyed()));
            // A scoped owner: pushes, works with the state, pops.
            with(&STACK, &STACK_LATE, |s| s.borrow_mut().push(1));
            saw(format!("copy after push {}", stack_late_copy_exists()));
            with(&STACK, &STACK_LATE, |s| s.borrow_mut().push(2));
            let both = with(&STACK, &STACK_LATE, |s| s.borrow().clone());
            saw(format!("{both:?}"));
            with(&STACK, &STACK_LATE, |s| s.borrow_mut().pop());
            saw(format!("copy after one pop {}", stack_late_copy_exists()));
            with(&STACK, &STACK_LATE, |s| s.borrow_mut().pop());
            saw(format!("copy when vacant {}", stack_late_copy_exists()));
        });
        assert_eq!(
            *SEEN.lock().unwrap(),
            [
                "destroyed true",
                "copy after push true",
                "[1, 2]",
                "copy after one pop true",
                "copy when vacant false",
            ]
        );
    }

    #[test]
    fn a_call_that_unwinds_on_the_late_copy_still_frees_it_when_vacant() {
        static FREED: AtomicBool = AtomicBool::new(false);
        at_thread_exit(|| {
            let unwound = std::panic::catch_unwind(|| {
                with(&STACK, &STACK_LATE, |s| {
                    s.borrow_mut().push(1);
                    s.borrow_mut().clear();
                    std::panic::resume_unwind(Box::new("inside"))
                })
            });
            assert!(unwound.is_err());
            FREED.store(!stack_late_copy_exists(), Ordering::SeqCst);
        });
        assert!(FREED.load(Ordering::SeqCst));
    }

    /// Live values of [`Counted`].
    static LIVE: AtomicIsize = AtomicIsize::new(0);

    /// State counting its live values in [`LIVE`].
    struct Counted(Vec<u32>);

    impl Default for Counted {
        fn default() -> Counted {
            LIVE.fetch_add(1, Ordering::SeqCst);
            Counted(Vec::new())
        }
    }

    impl Drop for Counted {
        fn drop(&mut self) {
            LIVE.fetch_sub(1, Ordering::SeqCst);
        }
    }

    impl Vacant for Counted {
        fn is_vacant(&self) -> bool {
            self.0.is_empty()
        }
    }

    thread_local! {
        static COUNTED: RefCell<Counted> = RefCell::new(Counted::default());
        static COUNTED_LATE: Late<Counted> = const { Late::new() };
    }

    #[test]
    fn late_copies_of_exiting_threads_are_freed_so_memory_does_not_grow_with_threads() {
        static LATE_CALLS: AtomicIsize = AtomicIsize::new(0);
        for _ in 0..200 {
            at_thread_exit_after(
                || with(&COUNTED, &COUNTED_LATE, |c| c.borrow_mut().0.clear()),
                || {
                    if COUNTED.try_with(|_| ()).is_ok() {
                        return;
                    }
                    with(&COUNTED, &COUNTED_LATE, |c| c.borrow_mut().0.push(1));
                    with(&COUNTED, &COUNTED_LATE, |c| {
                        LATE_CALLS.fetch_add(c.borrow().0.len() as isize, Ordering::SeqCst);
                        c.borrow_mut().0.clear();
                    });
                },
            );
        }
        // Every thread used its late copy, and every copy (and thread-local) is gone.
        assert_eq!(LATE_CALLS.load(Ordering::SeqCst), 200);
        assert_eq!(LIVE.load(Ordering::SeqCst), 0);
    }
}

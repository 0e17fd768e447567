//! Per-thread state that outlives the thread's own thread-locals.
//!
//! An application may launch from a thread-local destructor (a C++ `thread_local`'s, a
//! `pthread_key_create` destructor) at thread exit, after Rust's thread-locals, kreplay's
//! included, were destroyed. kreplay's per-thread state on the launch path (the window held
//! from a launch's API ENTER to its EXIT, the reader sides of fenced calls, the tool's work
//! kept in a window) lives in thread-locals that own values with destructors; reached then,
//! they panic. [`with`] runs on the thread-local while it lives and, once it is gone, on a
//! heap copy reached from a second thread-local that has no destructor (and so stays readable
//! to the thread's end): created on first use and freed when the outermost call using it
//! returns with the state vacant.

use std::cell::{Cell, RefCell};
use std::thread::LocalKey;

/// State that can be empty: a late copy is freed once it is.
pub(crate) trait Vacant: Default {
    /// Whether the state holds nothing.
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

/// The late copy of a thread's state, in a thread-local with no destructor (declare it with a
/// `const` initializer: [`Late::new`]).
#[derive(Debug)]
pub(crate) struct Late<T: 'static> {
    /// The heap copy (null until needed), made and freed by this thread only.
    state: Cell<*mut RefCell<T>>,
    /// How many [`with`] calls of this thread are inside it.
    depth: Cell<u32>,
}

impl<T> Late<T> {
    /// No late copy yet.
    pub(crate) const fn new() -> Late<T> {
        Late {
            state: Cell::new(std::ptr::null_mut()),
            depth: Cell::new(0),
        }
    }
}

/// Runs `f` on this thread's state: the thread-local `local`, or, once it is destroyed (thread
/// exit), its late copy in `late`.
pub(crate) fn with<T: Vacant, R>(
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

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        static STACK: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
        static STACK_LATE: Late<Vec<u32>> = const { Late::new() };
    }

    /// Runs `f` as a thread-specific data destructor does, after the thread's Rust
    /// thread-locals were destroyed.
    fn at_thread_exit(f: fn()) {
        extern "C" fn run(f: *mut libc::c_void) {
            // SAFETY: the function pointer `at_thread_exit` stored.
            let f: fn() = unsafe { std::mem::transmute::<*mut libc::c_void, fn()>(f) };
            let _ = std::panic::catch_unwind(f);
        }
        std::thread::spawn(move || {
            // Alive (and so destroyed at exit) before the destructor runs.
            with(&STACK, &STACK_LATE, |s| s.borrow_mut().push(0));
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

    static SEEN: std::sync::Mutex<Vec<Vec<u32>>> = std::sync::Mutex::new(Vec::new());

    #[test]
    fn state_is_kept_after_the_thread_locals_are_destroyed_and_nested_calls_share_it() {
        at_thread_exit(|| {
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
}

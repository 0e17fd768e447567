//! The state used from the destructors a thread runs as it exits: C++-style thread-local
//! destructors (`__cxa_thread_atexit_impl`, what a C++ `thread_local` registers) and
//! `pthread_key_create` destructors, with nested calls, recursion and panics inside.

use std::cell::RefCell;
use std::ffi::{c_int, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicIsize, Ordering};

use kreplay_late::{Late, Vacant};

/// Live values of [`Counted`] (states of every thread of every test here).
static LIVE: AtomicIsize = AtomicIsize::new(0);
/// Serializes the tests that count [`LIVE`].
static COUNTING: Mutex<()> = Mutex::new(());

/// State counting its live values.
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
    static STATE: RefCell<Counted> = RefCell::new(Counted::default());
    static STATE_LATE: Late<Counted> = const { Late::new() };
}

fn push(v: u32) {
    kreplay_late::with(&STATE, &STATE_LATE, |s| s.borrow_mut().0.push(v));
}

fn pop() -> Option<u32> {
    kreplay_late::with(&STATE, &STATE_LATE, |s| s.borrow_mut().0.pop())
}

fn local_is_destroyed() -> bool {
    STATE.try_with(|_| ()).is_err()
}

unsafe extern "C" {
    /// glibc's registration of a C++ `thread_local`'s destructor.
    fn __cxa_thread_atexit_impl(
        dtor: unsafe extern "C" fn(*mut c_void),
        obj: *mut c_void,
        dso_symbol: *mut c_void,
    ) -> c_int;
}

/// What the destructors saw.
static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// A scoped owner working from a destructor: pushes, nests, pops, and reports.
fn scoped_work(tag: &str) {
    let destroyed = local_is_destroyed();
    push(1);
    let nested = kreplay_late::with(&STATE, &STATE_LATE, |outer| {
        outer.borrow_mut().0.push(2);
        push(3);
        let seen = outer.borrow().0.clone();
        outer.borrow_mut().0.truncate(1);
        seen
    });
    let last = pop();
    SEEN.lock()
        .unwrap()
        .push(format!("{tag}: destroyed {destroyed} {nested:?} {last:?}"));
}

unsafe extern "C" fn cxx_dtor(_: *mut c_void) {
    if std::panic::catch_unwind(|| scoped_work("c++")).is_err() {
        SEEN.lock().unwrap().push("c++: panicked".into());
    }
}

/// A C++ `thread_local` made before the state was first used is destroyed after it: its
/// destructor works on the late copy, and the copy is freed once vacant.
#[test]
fn a_cxx_thread_local_destructor_after_the_state_is_destroyed_keeps_and_frees_it() {
    let _serial = COUNTING.lock().unwrap();
    SEEN.lock().unwrap().clear();
    std::thread::spawn(|| {
        // SAFETY: a destructor that never unwinds; any address of this binary names it.
        let rc = unsafe {
            __cxa_thread_atexit_impl(cxx_dtor, std::ptr::null_mut(), cxx_dtor as *mut c_void)
        };
        assert_eq!(rc, 0);
        push(9);
        assert_eq!(pop(), Some(9));
    })
    .join()
    .unwrap();
    assert_eq!(
        *SEEN.lock().unwrap(),
        ["c++: destroyed true [1, 2, 3] Some(1)"]
    );
    assert_eq!(LIVE.load(Ordering::SeqCst), 0, "a state was not freed");
}

/// Recursion a thousand calls deep on the late copy, a panic at the bottom caught halfway:
/// the copy stays shared by every level, and is freed after the outermost call.
#[test]
fn deep_recursion_and_a_panic_on_the_late_copy_keep_one_copy_then_free_it() {
    fn descend(depth: u32) -> usize {
        kreplay_late::with(&STATE, &STATE_LATE, |s| s.borrow_mut().0.push(depth));
        let below = if depth == 1000 {
            panic!("at the bottom")
        } else if depth == 500 {
            std::panic::catch_unwind(|| descend(depth + 1)).unwrap_or(usize::MAX)
        } else {
            descend(depth + 1)
        };
        kreplay_late::with(&STATE, &STATE_LATE, |s| s.borrow_mut().0.pop());
        below
    }
    unsafe extern "C" fn run(_: *mut c_void) {
        let got = std::panic::catch_unwind(|| {
            let before = LIVE.load(Ordering::SeqCst);
            let result = kreplay_late::with(&STATE, &STATE_LATE, |_| descend(0));
            // Levels 501..1000 pushed and never popped (the panic skipped their pops).
            let left = kreplay_late::with(&STATE, &STATE_LATE, |s| s.borrow().0.len());
            kreplay_late::with(&STATE, &STATE_LATE, |s| s.borrow_mut().0.clear());
            (before, result, left)
        });
        SEEN.lock().unwrap().push(format!("{got:?}"));
    }
    let _serial = COUNTING.lock().unwrap();
    SEEN.lock().unwrap().clear();
    std::thread::spawn(|| {
        // SAFETY: a destructor that never unwinds; any address of this binary names it.
        let rc = unsafe { __cxa_thread_atexit_impl(run, std::ptr::null_mut(), run as *mut c_void) };
        assert_eq!(rc, 0);
        push(1);
        pop();
    })
    .join()
    .unwrap();
    // The panic message is printed by the hook; what matters is what the levels saw.
    assert_eq!(
        *SEEN.lock().unwrap(),
        [format!("Ok((0, {}, 500))", usize::MAX)]
    );
    assert_eq!(LIVE.load(Ordering::SeqCst), 0, "a state was not freed");
}

/// A pthread key's destructor (run after every thread-local destructor) on a thread that used
/// the state before: the late copy again.
#[test]
fn a_pthread_key_destructor_works_on_the_late_copy() {
    unsafe extern "C" fn run(_: *mut c_void) {
        if std::panic::catch_unwind(|| scoped_work("key")).is_err() {
            SEEN.lock().unwrap().push("key: panicked".into());
        }
    }
    let _serial = COUNTING.lock().unwrap();
    SEEN.lock().unwrap().clear();
    std::thread::spawn(|| {
        push(1);
        pop();
        let mut key: libc::pthread_key_t = 0;
        // SAFETY: a valid out pointer and a destructor that never unwinds.
        assert_eq!(unsafe { libc::pthread_key_create(&mut key, Some(run)) }, 0);
        // SAFETY: a non-null value (never read) makes the destructor run at thread exit.
        let set = unsafe { libc::pthread_setspecific(key, std::ptr::dangling()) };
        assert_eq!(set, 0);
    })
    .join()
    .unwrap();
    assert_eq!(
        *SEEN.lock().unwrap(),
        ["key: destroyed true [1, 2, 3] Some(1)"]
    );
    assert_eq!(LIVE.load(Ordering::SeqCst), 0, "a state was not freed");
}

//! The signal mask the crate's threads start with, whatever the creating thread blocked.

use std::thread::Builder;

use kreplay_wtrack::threads;

fn mask() -> libc::sigset_t {
    // SAFETY: reads the calling thread's mask into a set we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        assert_eq!(
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut set),
            0
        );
        set
    }
}

fn blocked(set: &libc::sigset_t, s: libc::c_int) -> bool {
    // SAFETY: `set` is initialized.
    unsafe { libc::sigismember(set, s) == 1 }
}

/// A fault in a thread of the crate's raises its signal on that thread: blocked there, the
/// kernel kills the process instead of running the application's handler. The creating
/// thread may block them (a thread that takes every signal with sigwait, say); the new thread
/// must not inherit that.
#[test]
fn synchronous_signals_are_deliverable_even_where_the_creator_blocked_them() {
    let child = std::thread::spawn(|| {
        // SAFETY: a set we own, blocked on this (test) thread only.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for s in [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE] {
                libc::sigaddset(&mut set, s);
            }
            assert_eq!(
                libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()),
                0
            );
        }
        let before = mask();
        let child = threads::spawn(Builder::new(), mask)
            .unwrap()
            .join()
            .unwrap();
        let after = mask();
        (before, child, after)
    })
    .join()
    .unwrap();
    let (before, child, after) = child;
    for s in [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE] {
        assert!(!blocked(&child, s), "signal {s} blocked in the new thread");
        assert_eq!(blocked(&before, s), blocked(&after, s), "the creator's {s}");
    }
    assert!(blocked(&child, libc::SIGINT) && blocked(&child, libc::SIGTERM));
}

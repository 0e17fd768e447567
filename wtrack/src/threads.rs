//! The signal mask kreplay's own threads start with.
//!
//! A thread inherits the signal mask of the thread that creates it. kreplay starts its threads
//! (copy pool, completion watchers, drains) lazily, from whichever thread first needs them: an
//! application thread, a runtime thread. Where that thread does not block the application's
//! asynchronous signals, a thread of kreplay's would not either, and the kernel may deliver a
//! process-directed SIGINT, SIGTERM, SIGCHLD or SIGUSR1 to it: an application that blocks them
//! in all its threads and takes them with `sigwait` in one (a common server pattern) would see
//! the process end, or the signal vanish, and one that handles them would run its handler on a
//! thread it does not know. So kreplay starts its threads with every signal blocked but those
//! the kernel raises on the faulting thread itself (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP,
//! SIGSYS), which must stay deliverable: blocked, a fault ends the process whatever handler the
//! application installed; they are unblocked even where the creating thread blocked them. The
//! mask is set on the creating thread around the creation and put back right after, so the new
//! thread never runs a moment with another.

use std::io;
use std::thread::{Builder, JoinHandle};

/// Runs `start`, which starts threads, with the calling thread's signals blocked as kreplay's
/// threads must start (see the module's documentation), and then restores the caller's mask:
/// every thread `start` creates inherits that mask.
pub fn with_async_signals_blocked<R>(start: impl FnOnce() -> R) -> R {
    let _restore = sys::Blocked::now();
    start()
}

/// [`Builder::spawn`], the new thread starting with the asynchronous signals blocked.
pub fn spawn<F, T>(builder: Builder, f: F) -> io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    with_async_signals_blocked(|| builder.spawn(f))
}

/// Cancellation of the calling thread turned off until dropped (on the same thread), then put
/// back as it was.
///
/// kreplay works on the application's threads, inside calls that have no cancellation point
/// of their own (a doorbell store on HSA, a kernel launch on CUDA), and calls the tool there.
/// If the application cancels such a thread (`pthread_cancel`, deferred) meanwhile, the first
/// cancellation point reached inside (a tool's `printf`, kreplay's own file reads, a wait)
/// unwinds the thread through kreplay's frames: the unwind is caught at an `extern "C"`
/// boundary and the process aborts ("exception not rethrown"), or a replay is cut in the
/// middle with memory unrestored and locks held. With cancellation off for the call, a pending
/// request acts at the application's next cancellation point instead, once the call returned
/// as it would without kreplay. Setting the state is not a cancellation point, and nests.
#[derive(Debug)]
#[must_use = "cancellation is off only while the guard lives"]
pub struct NoCancel {
    old: Option<std::ffi::c_int>,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl NoCancel {
    /// Turns cancellation of the calling thread off.
    pub fn now() -> NoCancel {
        NoCancel {
            old: cancel_sys::disable_cancel(),
            _not_send: std::marker::PhantomData,
        }
    }
}

impl Drop for NoCancel {
    fn drop(&mut self) {
        if let Some(old) = self.old {
            cancel_sys::restore_cancel(old);
        }
    }
}

#[cfg(target_os = "linux")]
mod cancel_sys {
    use std::ffi::c_int;

    /// `PTHREAD_CANCEL_DISABLE` (the same value in glibc and musl).
    const PTHREAD_CANCEL_DISABLE: c_int = 1;

    unsafe extern "C" {
        fn pthread_setcancelstate(state: c_int, old: *mut c_int) -> c_int;
    }

    /// Turns the calling thread's cancellation off; returns the state it had.
    pub(super) fn disable_cancel() -> Option<c_int> {
        let mut old: c_int = 0;
        // SAFETY: sets this thread's own cancellation state; `old` is a valid out pointer.
        // pthread_setcancelstate is not a cancellation point.
        let ok = unsafe { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &mut old) } == 0;
        ok.then_some(old)
    }

    /// Puts back the state [`disable_cancel`] returned, on the same thread.
    pub(super) fn restore_cancel(old: c_int) {
        // SAFETY: sets this thread's own cancellation state back; not a cancellation point.
        unsafe { pthread_setcancelstate(old, std::ptr::null_mut()) };
    }
}

#[cfg(not(target_os = "linux"))]
mod cancel_sys {
    pub(super) fn disable_cancel() -> Option<std::ffi::c_int> {
        None
    }

    pub(super) fn restore_cancel(_old: std::ffi::c_int) {}
}

#[cfg(unix)]
mod sys {
    /// Signals raised on the thread that causes them, left unblocked.
    const SYNCHRONOUS: [libc::c_int; 6] = [
        libc::SIGSEGV,
        libc::SIGBUS,
        libc::SIGFPE,
        libc::SIGILL,
        libc::SIGTRAP,
        libc::SIGSYS,
    ];

    /// The calling thread's previous mask, put back when dropped.
    pub(super) struct Blocked {
        old: Option<libc::sigset_t>,
    }

    impl Blocked {
        pub(super) fn now() -> Blocked {
            // SAFETY: both sets are plain data initialized by sigfillset/sigdelset and by
            // pthread_sigmask (which writes `old` only when it succeeds, checked below).
            unsafe {
                let mut block: libc::sigset_t = std::mem::zeroed();
                libc::sigfillset(&mut block);
                for s in SYNCHRONOUS {
                    libc::sigdelset(&mut block, s);
                }
                let mut old: libc::sigset_t = std::mem::zeroed();
                // SIG_SETMASK, not SIG_BLOCK: the synchronous signals must be deliverable in
                // the new thread even where the creating thread blocked them.
                let ok = libc::pthread_sigmask(libc::SIG_SETMASK, &block, &mut old) == 0;
                Blocked {
                    old: ok.then_some(old),
                }
            }
        }
    }

    impl Drop for Blocked {
        fn drop(&mut self) {
            if let Some(old) = &self.old {
                // SAFETY: `old` is the mask pthread_sigmask returned for this thread.
                unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, old, std::ptr::null_mut()) };
            }
        }
    }
}

#[cfg(not(unix))]
mod sys {
    pub(super) struct Blocked;

    impl Blocked {
        pub(super) fn now() -> Blocked {
            Blocked
        }
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

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

    fn has(set: &libc::sigset_t, s: libc::c_int) -> bool {
        // SAFETY: `set` is initialized.
        unsafe { libc::sigismember(set, s) == 1 }
    }

    /// The calling thread's cancellation state (0: enabled, 1: disabled).
    #[cfg(target_os = "linux")]
    fn cancel_state() -> libc::c_int {
        unsafe extern "C" {
            fn pthread_setcancelstate(state: libc::c_int, old: *mut libc::c_int) -> libc::c_int;
        }
        let mut state = 0;
        // SAFETY: sets this thread's state to disabled and back to what it was; `state` is a
        // valid out pointer.
        unsafe {
            assert_eq!(pthread_setcancelstate(1, &mut state), 0);
            assert_eq!(pthread_setcancelstate(state, std::ptr::null_mut()), 0);
        }
        state
    }

    /// Cancellation is off while a guard lives, nested guards leave it off until the
    /// outermost one ends, and the thread's own state comes back after.
    #[cfg(target_os = "linux")]
    #[test]
    fn cancellation_is_off_while_a_guard_lives_and_comes_back_as_it_was() {
        std::thread::spawn(|| {
            assert_eq!(cancel_state(), 0);
            {
                let _outer = NoCancel::now();
                assert_eq!(cancel_state(), 1);
                drop(NoCancel::now());
                assert_eq!(cancel_state(), 1, "still off after an inner guard");
            }
            assert_eq!(cancel_state(), 0);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_spawned_thread_blocks_async_signals_and_the_caller_keeps_its_mask() {
        let before = mask();
        let child = spawn(Builder::new(), mask).unwrap().join().unwrap();
        for s in [
            libc::SIGINT,
            libc::SIGTERM,
            libc::SIGCHLD,
            libc::SIGUSR1,
            libc::SIGHUP,
        ] {
            assert!(has(&child, s), "signal {s} is not blocked");
        }
        for s in [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL] {
            assert!(!has(&child, s), "synchronous signal {s} is blocked");
        }
        let after = mask();
        for s in 1..32 {
            assert_eq!(has(&before, s), has(&after, s), "the caller's signal {s}");
        }
    }
}

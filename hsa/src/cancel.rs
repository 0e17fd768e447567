//! Thread cancellation held off while kreplay works on an application's thread.
//!
//! A replay runs inside the handler call of the doorbell store that submitted its dispatch, on
//! the application's thread, and calls the tool there (and so may tracing). If the application
//! cancels that thread (`pthread_cancel`, deferred) meanwhile, the first cancellation point
//! reached inside (a tool's `printf`, kreplay's own file and `/proc` reads) unwinds the thread
//! through kreplay's frames: the unwind is caught at an `extern "C"` boundary and the process
//! aborts ("exception not rethrown"), or a replay is cut in the middle with memory unrestored.
//! A doorbell store has no cancellation point without kreplay, so kreplay turns cancellation
//! off for the call and puts the thread's state back after: a pending request then acts at the
//! application's next cancellation point, once the dispatch was handled as one run would be.

use std::ffi::c_int;

/// `PTHREAD_CANCEL_DISABLE` (the same value in glibc and musl).
#[cfg(target_os = "linux")]
const PTHREAD_CANCEL_DISABLE: c_int = 1;

#[cfg(target_os = "linux")]
unsafe extern "C" {
    fn pthread_setcancelstate(state: c_int, old: *mut c_int) -> c_int;
}

/// Cancellation of the calling thread turned off until dropped (on the same thread).
pub(crate) struct NoCancel {
    old: Option<c_int>,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl NoCancel {
    pub(crate) fn now() -> NoCancel {
        #[cfg(target_os = "linux")]
        let old = {
            let mut old: c_int = 0;
            // SAFETY: sets this thread's own cancellation state; `old` is a valid out pointer.
            // pthread_setcancelstate is not a cancellation point.
            let ok = unsafe { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &mut old) } == 0;
            ok.then_some(old)
        };
        #[cfg(not(target_os = "linux"))]
        let old = None;
        NoCancel {
            old,
            _not_send: std::marker::PhantomData,
        }
    }
}

impl Drop for NoCancel {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        if let Some(old) = self.old {
            // SAFETY: puts back the state `now` found on this same thread (the guard is not
            // Send); not a cancellation point.
            unsafe { pthread_setcancelstate(old, std::ptr::null_mut()) };
        }
    }
}

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
//!
//! The guard is shared with the CUDA backend ([`kreplay_wtrack::threads::NoCancel`]).

pub(crate) use kreplay_wtrack::threads::NoCancel;

//! A Rust host's logger receives kreplay's messages (`logging::install_stderr_logger` leaves a
//! logger the process has in place). A logger that forks (to hand a message to a helper
//! program) makes kreplay's fork handlers run inside the logging call: kreplay must not be
//! holding one of the locks they take then, or the forking thread waits for itself for good.

use std::ffi::{c_char, c_int, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use kreplay::abi::{ClientFinalizeFn, ClientId, Status, ToolConfigureResult};
use kreplay::api::kreplay_force_configure;
use kreplay::lifecycle::{self, ToolSearch};

unsafe extern "C" {
    fn fork() -> c_int;
    fn waitpid(pid: c_int, status: *mut c_int, options: c_int) -> c_int;
    fn _exit(code: c_int) -> !;
}

/// Messages the logger forked for.
static FORKS: AtomicUsize = AtomicUsize::new(0);

/// Forks for each of kreplay's messages; the child leaves at once, the parent reaps it.
struct ForkingLogger;

impl log::Log for ForkingLogger {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        if record.target() != "kreplay" {
            return;
        }
        // SAFETY: the child only leaves with _exit.
        let pid = unsafe { fork() };
        if pid == 0 {
            // SAFETY: leaves the child at once.
            unsafe { _exit(0) };
        }
        if pid > 0 {
            let mut status = 0;
            // SAFETY: our child; `status` is writable.
            unsafe { waitpid(pid, &mut status, 0) };
            FORKS.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn flush(&self) {}
}

static HANDLE: AtomicU32 = AtomicU32::new(0);
static FINALIZE: Mutex<ClientFinalizeFn> = Mutex::new(None);

unsafe extern "C" fn configure(
    _: u32,
    _: *const c_char,
    _: u32,
    client: *mut ClientId,
) -> *mut ToolConfigureResult {
    static mut RESULT: ToolConfigureResult = ToolConfigureResult {
        size: size_of::<ToolConfigureResult>(),
        initialize: Some(initialize),
        finalize: None,
        tool_data: std::ptr::null_mut(),
    };
    // SAFETY: kreplay passes a valid client id.
    HANDLE.store(unsafe { (*client).handle }, Ordering::SeqCst);
    &raw mut RESULT
}

unsafe extern "C" fn initialize(finalize: ClientFinalizeFn, _: *mut c_void) -> c_int {
    *FINALIZE.lock().unwrap() = finalize;
    0
}

#[test]
fn a_logger_that_forks_receives_kreplays_warnings_without_hanging() {
    log::set_logger(&ForkingLogger).expect("the test's logger");
    log::set_max_level(log::LevelFilter::Trace);
    assert_eq!(kreplay_force_configure(Some(configure)), Status::SUCCESS);
    lifecycle::initialize_tools_with(&ToolSearch::default()).expect("tools initialize");
    let finalize = FINALIZE
        .lock()
        .unwrap()
        .expect("the tool's finalize function");
    let handle = HANDLE.load(Ordering::SeqCst);
    // The tool finalizes itself, then asks again (warned: finalized already), and calls its
    // finalize with an id not its own (warned), on a thread the test can give up on.
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let own = ClientId {
            name: std::ptr::null(),
            handle,
        };
        // SAFETY: the tool's finalize function, with its own id, then a stale and a wrong one.
        unsafe {
            finalize(own);
            finalize(own);
            finalize(ClientId {
                name: std::ptr::null(),
                handle: handle + 1000,
            });
        }
        let _ = done.send(());
    });
    assert!(
        finished.recv_timeout(Duration::from_secs(30)).is_ok(),
        "a finalize call that logs a warning did not return (its logger forked)"
    );
    assert!(
        FORKS.load(Ordering::SeqCst) >= 2,
        "the warnings reached the logger"
    );
}

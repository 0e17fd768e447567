//! A Rust host's logger receives kreplay's messages (`logging::install_stderr_logger` leaves a
//! logger the process has in place). A logger that forks (to hand a message to a helper
//! program) makes kreplay's fork handlers run inside the logging call: kreplay must not be
//! holding one of the locks they take then, or the forking thread waits for itself for good.

mod common;

use std::ffi::c_int;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::finalizing_tool;
use kreplay::abi::{ClientId, Status};
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

#[test]
fn a_logger_that_forks_receives_kreplays_warnings_without_hanging() {
    log::set_logger(&ForkingLogger).expect("the test's logger");
    log::set_max_level(log::LevelFilter::Trace);
    assert_eq!(
        kreplay_force_configure(Some(finalizing_tool::configure)),
        Status::SUCCESS
    );
    lifecycle::initialize_tools_with(&ToolSearch::default()).expect("tools initialize");
    let finalize = finalizing_tool::finalize_fn();
    let handle = finalizing_tool::handle();
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

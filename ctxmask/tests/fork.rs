//! A process that uses the registry forks while another of its threads is creating contexts
//! (the registry then allocates a segment of started flags, once). Only the forking thread
//! exists in the child: an allocation that thread left half done must not make the child's own
//! use of the registry wait forever.

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::time::{Duration, Instant};

use kreplay_ctxmask::ContextRegistry;

unsafe extern "C" {
    fn fork() -> c_int;
    fn waitpid(pid: c_int, status: *mut c_int, options: c_int) -> c_int;
    fn kill(pid: c_int, signal: c_int) -> c_int;
    fn _exit(code: c_int) -> !;
}

const WNOHANG: c_int = 1;
const SIGKILL: c_int = 9;

/// Waits for child `pid` at most `limit` (killing it then); its exit code, or `None`.
fn wait_child(pid: c_int, limit: Duration) -> Option<c_int> {
    let deadline = Instant::now() + limit;
    let mut status: c_int = 0;
    loop {
        // SAFETY: `pid` is our child; `status` is writable.
        if unsafe { waitpid(pid, &mut status, WNOHANG) } == pid {
            return ((status & 0x7f) == 0).then_some((status >> 8) & 0xff);
        }
        if Instant::now() >= deadline {
            // SAFETY: our child, reaped right after.
            unsafe {
                kill(pid, SIGKILL);
                waitpid(pid, &mut status, 0);
            }
            return None;
        }
        std::thread::yield_now();
    }
}

/// The registry the creating thread uses now; the one before it is freed only after this one
/// is published, so the pointer a child sees is always alive in its copy of memory.
static CURRENT: AtomicPtr<ContextRegistry> = AtomicPtr::new(std::ptr::null_mut());

/// Contexts each registry gets before the next replaces it: its first 12 segments.
const PER_REGISTRY: u64 = 64 * ((1 << 12) - 1);

#[test]
fn a_forked_child_can_create_and_start_contexts_while_a_parent_thread_was_allocating_flags() {
    let stop = AtomicBool::new(false);
    let mut failures = Vec::new();
    std::thread::scope(|scope| {
        // Another thread of the application, creating contexts all the time (each registry
        // allocates a segment of flags at contexts 1, 65, 193, ...).
        scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let registry = Box::into_raw(Box::new(ContextRegistry::new()));
                let old = CURRENT.swap(registry, Ordering::AcqRel);
                if !old.is_null() {
                    // SAFETY: `old` came from `Box::into_raw` and is no longer published.
                    drop(unsafe { Box::from_raw(old) });
                }
                // SAFETY: published above; freed only by this thread, after the next one.
                let registry = unsafe { &*registry };
                for _ in 0..PER_REGISTRY {
                    registry.create();
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                }
            }
        });
        while CURRENT.load(Ordering::Acquire).is_null() {
            std::thread::yield_now();
        }
        for round in 0..40 {
            // SAFETY: the child only uses the registry and leaves with _exit.
            let pid = unsafe { fork() };
            if pid == 0 {
                // SAFETY: alive in this copy of memory (see `CURRENT`).
                let registry = unsafe { &*CURRENT.load(Ordering::Acquire) };
                let id = registry.create();
                let ok = registry.start(id).is_ok() && registry.is_active(id);
                let global = ContextRegistry::global();
                let mine = global.create();
                let ok = ok && global.start(mine).is_ok() && global.is_started(mine) == Ok(true);
                // SAFETY: leaves the child at once.
                unsafe { _exit(if ok { 0 } else { 1 }) };
            }
            assert!(pid > 0, "fork failed");
            match wait_child(pid, Duration::from_secs(10)) {
                Some(0) => {}
                other => {
                    failures.push(format!(
                        "fork {round}: the child ended with {other:?} (None: hung)"
                    ));
                    break;
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    let last = CURRENT.swap(std::ptr::null_mut(), Ordering::AcqRel);
    // SAFETY: the creating thread has ended; `last` came from `Box::into_raw`.
    drop(unsafe { Box::from_raw(last) });
    assert!(failures.is_empty(), "{failures:#?}");
}

//! kreplay's own threads and the application's signals.
//!
//! A common server pattern: every thread of the application blocks the asynchronous signals
//! (SIGINT, SIGTERM, SIGCHLD, SIGUSR1, ...) and one thread takes them with `sigwait`. A
//! process-directed signal goes to some thread that does not block it; if a thread kreplay
//! started does not, the signal lands there instead: a SIGCHLD or SIGUSR1 is lost or ends the
//! process, a SIGTERM ends it without the application's orderly shutdown. kreplay starts its
//! threads lazily, from whichever thread needs them first, so they must not take the mask of
//! that thread: they start with the asynchronous signals blocked.
//!
//! The scenario needs every thread of the process under its control, the test harness's main
//! thread included, so this test has a `main` of its own (`harness = false`) and runs in a
//! process of its own, bounded by its waits.

#[allow(dead_code, unused_macros)]
#[macro_use]
mod support;

use kreplay_hsa::InstallOptions;
use support::app::{self, Aql};
use support::counted::{AddOneArgs, add_one};
use support::tool::{Script, TestHooks};

/// The signals a `sigwait` server takes, in the order they are sent (SIGCHLD first: its
/// default action is to be discarded, so a thread taking it loses it without a trace).
const SERVED: [libc::c_int; 4] = [libc::SIGCHLD, libc::SIGUSR1, libc::SIGINT, libc::SIGTERM];
/// Signals only the thread that causes them receives: kreplay's threads must keep them
/// deliverable (a blocked SIGSEGV on a fault ends the process whatever the application's
/// handler).
const SYNCHRONOUS: [libc::c_int; 4] = [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL];

fn set_of(signals: &[libc::c_int]) -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialize and fill the set we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in signals {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Sets the calling thread's mask to `set` (`how`: SIG_BLOCK / SIG_SETMASK).
fn mask(how: libc::c_int, set: &libc::sigset_t) {
    // SAFETY: `set` is initialized; the old mask is not asked for.
    let rc = unsafe { libc::pthread_sigmask(how, set, std::ptr::null_mut()) };
    assert_eq!(rc, 0, "pthread_sigmask");
}

/// Every thread of the process: (name, blocked signal mask as /proc shows it).
fn threads() -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let path = task.expect("a task").path();
        let (Ok(name), Ok(status)) = (
            std::fs::read_to_string(path.join("comm")),
            std::fs::read_to_string(path.join("status")),
        ) else {
            continue; // the thread ended meanwhile
        };
        let blocked = status
            .lines()
            .find_map(|l| l.strip_prefix("SigBlk:"))
            .map(|v| u64::from_str_radix(v.trim(), 16).expect("a hex mask"))
            .expect("a SigBlk line");
        out.push((name.trim().to_owned(), blocked));
    }
    out
}

fn bit(signal: libc::c_int) -> u64 {
    1 << (signal - 1)
}

fn main() {
    // First of all, as the pattern prescribes: every thread started from here on inherits it.
    mask(libc::SIG_BLOCK, &set_of(&SERVED));
    let name = "kreplays_threads_leave_the_applications_signals_to_its_sigwait_thread";
    kreplays_threads_leave_the_applications_signals_to_its_sigwait_thread();
    println!("test {name} ... ok");
}

/// The application blocks the served signals before anything else (so every thread of
/// the runtime inherits that), except on one worker that resets its mask; that worker's
/// replayed dispatch and async copy make kreplay start its copy pool and completion
/// threads. The worker ends; then every served signal sent to the process reaches the
/// `sigwait`, and kreplay's threads block them but none of the synchronous ones.
fn kreplays_threads_leave_the_applications_signals_to_its_sigwait_thread() {
    let served = set_of(&SERVED);

    let hooks = TestHooks::new(0);
    let app = app::install(hooks.clone(), InstallOptions::default());
    hooks.set_script(Script::passes(2));
    let gpu = app.gpus[0];
    let pools = app.pools(gpu);
    let queue = app.queue(gpu);
    let kernel = kreplay_softhsa::register_kernel("signals_add_one", add_one);
    let buf = app.buffer(pools.coarse, &[1; 4096]);
    let other = app.buffer(pools.coarse, &[2; 4096]);
    let kernarg = app.kernargs(
        &pools,
        AddOneArgs {
            buf: buf.0,
            len: 4096,
            pad: 0,
        },
    );
    let (src, dst) = (
        app.buffer(pools.coarse, &[7; 1024]),
        app.alloc(pools.coarse, 4096),
    );
    // The runtime's own threads start now, under the blocked mask (nothing replayed yet).
    let done = app.signal(1);
    app.dispatch(queue, Aql::dispatch(kernel, 4096, 64, kernarg, done));
    assert_eq!(app.wait_zero(done), 0);
    let copied = app.signal(1);
    app.async_copy(dst, gpu, src, gpu, 4096, copied);
    assert_eq!(app.wait_zero(copied), 0);

    hooks.configure_replay(true);
    let worker = std::thread::spawn(move || {
        mask(libc::SIG_SETMASK, &set_of(&[]));
        let done = app.signal(1);
        let kernarg = app.kernargs(
            &pools,
            AddOneArgs {
                buf: other.0,
                len: 4096,
                pad: 0,
            },
        );
        app.dispatch(queue, Aql::dispatch(kernel, 4096, 64, kernarg, done));
        assert_eq!(app.wait_zero(done), 0);
        let copied = app.signal(1);
        app.async_copy(dst, gpu, src, gpu, 4096, copied);
        assert_eq!(app.wait_zero(copied), 0);
    });
    worker.join().expect("the worker ran");
    assert_eq!(app.read(buf, 4), vec![2; 4]);
    assert_eq!(
        app.read(other, 4),
        vec![3; 4],
        "the worker's dispatch ran once"
    );
    assert_eq!(app.read(dst, 4), vec![7; 4]);

    let all = threads();
    let ours: Vec<&(String, u64)> = all
        .iter()
        .filter(|(n, _)| n.starts_with("kreplay-"))
        .collect();
    assert!(
        ours.iter().any(|(n, _)| n.starts_with("kreplay-pool"))
            && ours.iter().any(|(n, _)| n.starts_with("kreplay-complet")),
        "the scenario started kreplay's pool and completion threads (names cut at 15 bytes): {all:?}"
    );
    for (name, blocked) in &ours {
        for s in SERVED {
            assert!(
                blocked & bit(s) != 0,
                "{name} takes signal {s} (SigBlk {blocked:#x})"
            );
        }
        for s in SYNCHRONOUS {
            assert!(
                blocked & bit(s) == 0,
                "{name} blocks synchronous signal {s} (SigBlk {blocked:#x})"
            );
        }
    }

    for s in SERVED {
        // SAFETY: sends a signal to this process; every thread but kreplay's blocks it.
        assert_eq!(unsafe { libc::kill(libc::getpid(), s) }, 0);
        let timeout = libc::timespec {
            tv_sec: 3,
            tv_nsec: 0,
        };
        // SAFETY: `served` is initialized; no siginfo is asked for.
        let got = unsafe { libc::sigtimedwait(&served, std::ptr::null_mut(), &timeout) };
        assert_eq!(got, s, "signal {s} never reached the application's sigwait");
    }
}

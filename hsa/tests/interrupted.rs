//! Replays on a thread that signals keep interrupting: the application installs a handler
//! without `SA_RESTART` (so a blocking system call it interrupts fails with `EINTR`) and
//! another thread sends it to the replaying thread as fast as it can, as a sampling profiler's
//! timer or a runtime's preemption signal would. Snapshots (a spill file too), tracked and
//! hashed restores and the waits for passes go on: every dispatch is replayed, none declined,
//! and memory ends as after one run each.

#[allow(dead_code)]
#[macro_use]
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use kreplay_hsa::InstallOptions;
use kreplay_passloop::ReplayOutcome;
use kreplay_snapshot::{RestoreStrategy, SnapshotConfig, StoreTier};
use support::app::{self, Aql};
use support::counted::{AddOneArgs, add_one};
use support::tool::{Script, TestHooks};

static CAUGHT: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_signal(_: libc::c_int) {
    CAUGHT.fetch_add(1, Ordering::Relaxed);
}

/// Installs [`on_signal`] for SIGUSR2, without `SA_RESTART`.
fn install_handler() {
    // SAFETY: a plain handler that only touches an atomic; the sigaction struct is ours.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
        libc::sigemptyset(&mut action.sa_mask);
        action.sa_flags = 0;
        assert_eq!(
            libc::sigaction(libc::SIGUSR2, &action, std::ptr::null_mut()),
            0
        );
    }
}

fn interrupted_replays(store: StoreTier, strategy: RestoreStrategy) {
    const DISPATCHES: u32 = 24;
    const LEN: u32 = 64 * 1024;
    install_handler();
    let spill = std::env::temp_dir().join(format!("kreplay-interrupted-{}", std::process::id()));
    std::fs::create_dir_all(&spill).unwrap();
    let hooks = TestHooks::new(0);
    let app = app::install(
        hooks.clone(),
        InstallOptions {
            snapshot: SnapshotConfig::default()
                .with_store(store)
                .with_strategy(strategy)
                .with_spill_dir(Some(spill.clone())),
            ..Default::default()
        },
    );
    hooks.configure_replay(true);
    hooks.set_script(Script::passes(3));
    let gpu = app.gpus[0];
    let pools = app.pools(gpu);
    let queue = app.queue(gpu);
    let kernel = kreplay_softhsa::register_kernel("interrupted_add_one", add_one);
    let init: Vec<u32> = (0..LEN).collect();
    let bufs = [
        app.buffer(pools.coarse, &init),
        app.buffer(pools.coarse, &init),
    ];

    // SAFETY: pthread_self has no preconditions.
    let target = unsafe { libc::pthread_self() } as usize;
    let stop = Arc::new(AtomicBool::new(false));
    let bomber = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut sent = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // SAFETY: `target` is this scenario's thread, alive until `stop` is set.
                unsafe { libc::pthread_kill(target as libc::pthread_t, libc::SIGUSR2) };
                sent += 1;
                std::thread::yield_now();
            }
            sent
        })
    };
    for i in 0..DISPATCHES {
        let buf = bufs[(i % 2) as usize];
        let done = app.signal(1);
        let kernarg = app.kernargs(
            &pools,
            AddOneArgs {
                buf: buf.0,
                len: LEN,
                pad: 0,
            },
        );
        app.dispatch(queue, Aql::dispatch(kernel, LEN, 256, kernarg, done));
        assert_eq!(app.wait_zero(done), 0);
    }
    stop.store(true, Ordering::Relaxed);
    let sent = bomber.join().unwrap();
    let caught = CAUGHT.load(Ordering::Relaxed);
    assert!(
        caught > 0,
        "no signal reached the replaying thread ({sent} sent)"
    );

    for buf in bufs {
        let expected: Vec<u32> = init.iter().map(|v| v + DISPATCHES / 2).collect();
        assert_eq!(app.read(buf, LEN as usize), expected);
    }
    let dispatches = hooks.configured_dispatches();
    assert_eq!(dispatches.len(), DISPATCHES as usize);
    for info in dispatches {
        let outcome = hooks.finished_record(info.dispatch_id).outcome;
        assert!(
            matches!(outcome, ReplayOutcome::Replayed { passes: 3, .. }),
            "{outcome:?} ({caught} signals caught)"
        );
    }
    println!("{caught} of {sent} signals caught by the replaying thread");
    let _ = std::fs::remove_dir_all(&spill);
}

scenarios! {
    fn replays_interrupted_by_signals_with_a_spill_file_and_full_restores() {
        interrupted_replays(StoreTier::File, RestoreStrategy::Full);
    }

    fn replays_interrupted_by_signals_with_a_host_store_and_tracked_restores() {
        interrupted_replays(StoreTier::Host, RestoreStrategy::Tracked);
    }

    fn replays_interrupted_by_signals_with_hashed_restores() {
        interrupted_replays(StoreTier::Auto, RestoreStrategy::Hash);
    }
}

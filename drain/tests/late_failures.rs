//! A pass's queue failing after the pass completed, and concurrent counting: the waits end with
//! what happened, bounded in time.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kreplay_drain::{
    AsyncCopyTracker, DrainConfig, InFlightCounter, PassCompletion, wait_pass_patiently,
};

const BOUND: Duration = Duration::from_secs(10);

/// A pass that completes between the loop's first look and its failure check, on a queue that
/// fails right after (a later packet faulted). `failed` reports the queue's state, which says
/// nothing about a pass that already completed.
struct CompletedThenFailed {
    looks: AtomicUsize,
    handlers: Arc<AtomicUsize>,
}

impl PassCompletion for CompletedThenFailed {
    fn is_complete(&self) -> bool {
        // Running at the first look, complete from then on.
        self.looks.fetch_add(1, Ordering::SeqCst) > 0
    }
    fn pending_handlers(&self) -> usize {
        self.handlers.load(Ordering::SeqCst)
    }
    fn failed(&self) -> Option<String> {
        Some("its queue failed".into())
    }
}

/// A pass that completed was reported as one that can never complete (`PassNeverCompletes`)
/// when its queue failed afterwards: the failure was asked before completion was looked at
/// again.
#[test]
fn a_pass_that_completed_before_its_queue_failed_is_reported_complete() {
    let pass = CompletedThenFailed {
        looks: AtomicUsize::new(0),
        handlers: Arc::new(AtomicUsize::new(0)),
    };
    let config = DrainConfig::new(Duration::from_secs(1));
    let report = wait_pass_patiently(&pass, &config, &mut |_| {}).expect("it completed");
    assert!(report.waited_for_completion);
}

/// Once the pass completed, its completion has come: the wait for its completion handlers goes
/// on however its queue fares, as for any running handler.
#[test]
fn handlers_of_a_completed_pass_are_waited_for_after_its_queue_failed() {
    let handlers = Arc::new(AtomicUsize::new(1));
    let pass = CompletedThenFailed {
        looks: AtomicUsize::new(1),
        handlers: handlers.clone(),
    };
    let (tx, rx) = mpsc::channel::<()>();
    let finisher = std::thread::spawn(move || {
        // The handler finishes a little later, on its own thread.
        let _ = rx.recv_timeout(Duration::from_millis(50));
        handlers.store(0, Ordering::SeqCst);
    });
    let config = DrainConfig::new(Duration::from_secs(1));
    let started = Instant::now();
    let report = wait_pass_patiently(&pass, &config, &mut |_| {}).expect("handlers finished");
    drop(tx);
    finisher.join().unwrap();
    assert_eq!(report.handlers_waited_on, 1);
    assert!(started.elapsed() < BOUND);
}

/// Copies started and finished from many threads at once, with waiters on other threads: every
/// waiter sees zero once the last copy lands, none waits past it.
#[test]
fn concurrent_starts_finishes_and_waiters_agree_on_zero() {
    let counter = Arc::new(InFlightCounter::new());
    let go = Arc::new(AtomicBool::new(false));
    for _ in 0..4 {
        counter.start();
    }
    let (tx, rx) = mpsc::channel();
    for _ in 0..4 {
        let counter = counter.clone();
        let tx = tx.clone();
        std::thread::spawn(move || {
            let idle = counter.wait_zero(Instant::now() + BOUND);
            tx.send(idle).unwrap();
        });
    }
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let counter = counter.clone();
            let go = go.clone();
            std::thread::spawn(move || {
                while !go.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
                for _ in 0..10_000 {
                    counter.start();
                    counter.finish();
                }
                counter.finish(); // one of the four started up front
            })
        })
        .collect();
    go.store(true, Ordering::Release);
    for w in workers {
        w.join().unwrap();
    }
    for _ in 0..4 {
        assert!(rx.recv_timeout(BOUND).expect("every waiter returns"));
    }
    assert_eq!(counter.in_flight(), 0);
    // Extra finishes never take the count below zero.
    counter.finish();
    assert_eq!(counter.count(), 0);
}

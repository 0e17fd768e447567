//! The drainer used from several threads at once: each caller gets the result of its own drain
//! (a failed synchronisation of its context), never another's; and a synchronisation that
//! panics fails its own drain only (it ended the drain thread, and every later drain timed out).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, mpsc};
use std::time::Duration;

use kreplay_cuda::drainer::Drainer;

/// Context 1 always fails to synchronise; context 2 always succeeds. Two threads drain 1 and 2
/// concurrently many times: the one draining 1 must always see its error, the one draining 2
/// always Ok.
#[test]
fn concurrent_drains_each_get_their_own_result() {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let syncs = Arc::new(AtomicUsize::new(0));
        let s = syncs.clone();
        let d = Arc::new(Drainer::new(Duration::from_secs(5), move |ctx| {
            s.fetch_add(1, Ordering::Relaxed);
            // A synchronisation that takes a moment, so the other caller queues behind it.
            if ctx == 1 {
                std::thread::sleep(Duration::from_micros(300));
                Err(format!("cuCtxSynchronize failed on context {ctx}"))
            } else {
                Ok(())
            }
        }));
        let rounds = 2000;
        let barrier = Arc::new(Barrier::new(2));
        let mut wrong = Vec::new();
        let handles: Vec<_> = [1usize, 2]
            .into_iter()
            .map(|ctx| {
                let d = d.clone();
                let b = barrier.clone();
                std::thread::spawn(move || {
                    let mut bad = Vec::new();
                    for round in 0..rounds {
                        b.wait();
                        let got = d.drain(ctx);
                        let right = if ctx == 1 { got.is_err() } else { got.is_ok() };
                        if !right {
                            bad.push(format!("round {round}: drain({ctx}) -> {got:?}"));
                        }
                    }
                    bad
                })
            })
            .collect();
        for h in handles {
            wrong.extend(h.join().unwrap());
        }
        tx.send(wrong).unwrap();
    });
    let wrong = rx.recv_timeout(Duration::from_secs(120)).expect("hung");
    assert!(
        wrong.is_empty(),
        "{} of 4000 drains got another caller's result, e.g. {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(4)]
    );
}

/// A synchronisation that panics on the drain thread (once) must not leave every later drain of
/// the device failing at its timeout.
#[test]
fn a_panicking_sync_does_not_wedge_later_drains() {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let d = Drainer::new(Duration::from_millis(300), move |ctx| {
            if ctx == 7 {
                panic!("sync of context 7 panicked");
            }
            Ok(())
        });
        let first = d.drain(7);
        let later = d.drain(1);
        tx.send((first, later)).unwrap();
    });
    let (first, later) = rx.recv_timeout(Duration::from_secs(30)).expect("hung");
    assert!(first.is_err(), "{first:?}");
    assert_eq!(later, Ok(()), "a later drain of a healthy context");
}

//! A tracker used outside any rayon pool must not need rayon's global pool: that pool is the
//! application's, which may keep every worker of it busy (here: waiting for the very call that
//! would queue work behind them). A file of its own: it configures the global pool.

#![allow(clippy::single_range_in_vec_init)] // one range of addresses per list is what is meant

use std::sync::mpsc;
use std::time::Duration;

use kreplay_wtrack::{SCAN_PIECE, WriteTracker, available};

#[test]
fn a_large_footprint_is_followed_while_the_global_pools_workers_are_all_busy() {
    if let Err(why) = available() {
        eprintln!("skipped: {why}");
        return;
    }
    const WORKERS: usize = 2;
    rayon::ThreadPoolBuilder::new()
        .num_threads(WORKERS)
        .build_global()
        .expect("the first use of the global pool in this process");
    // Every worker of the application's pool waits until the tracker's calls have returned.
    let (release, held) = mpsc::channel::<()>();
    let held = std::sync::Arc::new(std::sync::Mutex::new(held));
    let (started_tx, started) = mpsc::channel();
    for _ in 0..WORKERS {
        let (held, started_tx) = (held.clone(), started_tx.clone());
        rayon::spawn(move || {
            started_tx.send(()).unwrap();
            let _ = held.lock().unwrap().recv();
        });
    }
    for _ in 0..WORKERS {
        started.recv().unwrap();
    }
    let len = 4 * SCAN_PIECE;
    // SAFETY: a new anonymous mapping, never touched; unmapped at the end.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    let base = p as usize;
    let (done_tx, done) = mpsc::channel();
    let caller = std::thread::spawn(move || {
        let tracker = WriteTracker::new(&[base..base + len]).unwrap();
        // SAFETY: inside the mapping.
        unsafe { std::ptr::write_volatile((base + SCAN_PIECE + 5) as *mut u8, 1) };
        let mut written = Vec::new();
        tracker.written(&mut written).unwrap();
        tracker.protect(&written).unwrap();
        done_tx.send(written).unwrap();
    });
    let answer = done.recv_timeout(Duration::from_secs(20));
    for _ in 0..WORKERS {
        release.send(()).unwrap();
    }
    caller.join().unwrap();
    // SAFETY: our own mapping, no longer used.
    unsafe { libc::munmap(p, len) };
    let written = answer.expect("the tracker waited for the application's busy pool");
    assert!(written.iter().any(|r| r.contains(&(base + SCAN_PIECE))));
}

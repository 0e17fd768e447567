//! Threads write while the tracker protects and scans: every store that began after a
//! `protect` returned, and finished before a scan began, is in that scan's answer.

#![allow(clippy::single_range_in_vec_init)] // one range of addresses per list is what is meant

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kreplay_wtrack::{WriteTracker, available, page_size};

/// Small pages, the whole range protected again each round.
#[test]
fn stores_racing_with_protect_and_scan_are_never_missed() {
    race(64, false, false);
}

/// Transparent huge pages, only the pages found written protected again each round (as a
/// restore does), which splits the huge pages under the writers.
#[test]
fn stores_racing_with_partial_protects_of_huge_pages_are_never_missed() {
    race(1024, true, true);
}

fn race(pages: usize, huge: bool, partial: bool) {
    if let Err(why) = available() {
        eprintln!("skipped: {why}");
        return;
    }
    const WRITERS: usize = 3;
    const ROUNDS: u64 = 100;
    let page = page_size();
    let len = pages * page;
    let align = 2 << 20;
    // SAFETY: a new anonymous mapping, replacing nothing; unmapped at the end.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len + align,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(ptr, libc::MAP_FAILED);
    let base = (ptr as usize).div_ceil(align) * align;
    let advice = if huge {
        libc::MADV_HUGEPAGE
    } else {
        libc::MADV_NOHUGEPAGE
    };
    // SAFETY: advice on our own mapping, then every page written once.
    unsafe {
        libc::madvise(base as *mut libc::c_void, len, advice);
        std::ptr::write_bytes(base as *mut u8, 1, len);
    }
    let tracker = WriteTracker::new(&[base..base + len]).unwrap();
    // The round each store began in, logged once it is done.
    let epoch = AtomicU64::new(0);
    let log: Mutex<Vec<(usize, u64)>> = Mutex::new(Vec::new());
    let done = AtomicBool::new(false);
    let mut missed = Vec::new();
    std::thread::scope(|s| {
        for w in 0..WRITERS {
            let (epoch, log, done) = (&epoch, &log, &done);
            s.spawn(move || {
                let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ (w as u64 + 1);
                while !done.load(Ordering::SeqCst) {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    let p = (state % pages as u64) as usize;
                    let began = epoch.load(Ordering::SeqCst);
                    // SAFETY: inside the mapping, which outlives the scope.
                    unsafe { std::ptr::write_volatile((base + p * page) as *mut u8, w as u8) };
                    log.lock().unwrap().push((p, began));
                }
            });
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut written = vec![base..base + len];
        for round in 1..=ROUNDS {
            if Instant::now() > deadline {
                break;
            }
            if partial {
                tracker.protect(&written).unwrap();
            } else {
                tracker.protect(&[base..base + len]).unwrap();
            }
            log.lock().unwrap().clear();
            epoch.store(round, Ordering::SeqCst);
            // Let some stores of this round land.
            while !log.lock().unwrap().iter().any(|&(_, e)| e == round) {
                std::thread::yield_now();
            }
            let logged: Vec<usize> = log
                .lock()
                .unwrap()
                .iter()
                .filter(|&&(_, e)| e == round)
                .map(|&(p, _)| p)
                .collect();
            written.clear();
            tracker.written(&mut written).unwrap();
            for p in logged {
                let addr = base + p * page;
                if !written.iter().any(|r| r.contains(&addr)) {
                    missed.push((round, p));
                }
            }
        }
        done.store(true, Ordering::SeqCst);
    });
    drop(tracker);
    // SAFETY: our own mapping, no longer used.
    unsafe { libc::munmap(ptr, len + align) };
    assert!(missed.is_empty(), "stores not reported: {missed:?}");
}

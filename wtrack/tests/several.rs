//! Several trackers at once: adjacent and overlapping ranges, and any drop order.

#![allow(clippy::single_range_in_vec_init)] // one range of addresses per list is what is meant

use std::ops::Range;

use kreplay_wtrack::{TrackError, WriteTracker, available, page_size};

/// A private anonymous mapping of `pages` pages without huge pages, each written once (leaked:
/// a few pages per test, some mapped over).
fn populated(pages: usize) -> usize {
    let len = pages * page_size();
    // SAFETY: a new anonymous mapping, replacing nothing.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: advice on our own mapping, then every page written once.
    unsafe {
        libc::madvise(p, len, libc::MADV_NOHUGEPAGE);
        std::ptr::write_bytes(p.cast::<u8>(), 1, len);
    }
    p as usize
}

fn write(addr: usize) {
    // SAFETY: callers pass addresses inside a mapping of their own.
    unsafe { std::ptr::write_volatile(addr as *mut u8, 7) };
}

fn pages(tracker: &WriteTracker, base: usize) -> Vec<usize> {
    let mut out: Vec<Range<usize>> = Vec::new();
    tracker.written(&mut out).unwrap();
    out.iter()
        .flat_map(|r| (r.start..r.end).step_by(page_size()))
        .map(|a| (a - base) / page_size())
        .collect()
}

fn skip() -> bool {
    if let Err(why) = available() {
        eprintln!("skipped: {why}");
        return true;
    }
    false
}

/// Two trackers on adjacent ranges of one mapping each see their own pages; a third asking for
/// pages of both is refused, and nothing of it stays; dropping either leaves the other whole,
/// and its range can be followed again.
#[test]
fn adjacent_trackers_are_independent_whatever_the_drop_order() {
    if skip() {
        return;
    }
    let page = page_size();
    let base = populated(12);
    let a = WriteTracker::new(&[base..base + 6 * page]).unwrap();
    let b = WriteTracker::new(&[base + 6 * page..base + 12 * page]).unwrap();
    let both = WriteTracker::new(&[base + 5 * page..base + 7 * page]).unwrap_err();
    assert!(
        matches!(both, TrackError::Refused { .. }),
        "overlapping a followed range: {both}"
    );
    write(base + 5 * page);
    write(base + 6 * page);
    assert_eq!((pages(&a, base), pages(&b, base)), (vec![5], vec![6]));
    drop(a);
    write(base + 8 * page);
    assert_eq!(pages(&b, base), vec![6, 8]);
    let again = WriteTracker::new(&[base..base + 6 * page]).unwrap();
    write(base + page);
    assert_eq!(pages(&again, base), vec![1]);
    drop(b);
    write(base + 2 * page);
    assert_eq!(pages(&again, base), vec![1, 2]);
}

/// Memory mapped over a followed range, then followed by a second tracker: the first must say
/// its memory was replaced, not report the second's pages as its own nor protect them again
/// (which would hide the second's writes), and dropping it must leave the second alone.
#[test]
fn a_tracker_whose_addresses_another_now_follows_refuses_and_leaves_it_alone() {
    if skip() {
        return;
    }
    let page = page_size();
    let base = populated(8);
    let old = WriteTracker::new(&[base..base + 8 * page]).unwrap();
    // SAFETY: MAP_FIXED over the test's own mapping.
    let p = unsafe {
        libc::mmap(
            base as *mut libc::c_void,
            8 * page,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    assert_eq!(p as usize, base);
    let new = WriteTracker::new(&[base..base + 8 * page]).unwrap();
    write(base + 3 * page);
    let read = old.written(&mut Vec::new());
    assert!(
        matches!(read, Err(TrackError::Replaced { .. })),
        "the old tracker read {read:?}"
    );
    let protect = old.protect(&[base..base + 8 * page]);
    assert!(
        matches!(protect, Err(TrackError::Replaced { .. })),
        "the old tracker protected: {protect:?}"
    );
    assert_eq!(pages(&new, base), vec![3], "the new tracker's write");
    drop(old);
    write(base + 5 * page);
    assert_eq!(pages(&new, base), vec![3, 5]);
}

//! The application changes its own memory map while a range is followed: discarded pages,
//! huge pages, mremap and mprotect are still reported; and a tracker dropped while a forked child
//! lives stops following (it left the range registered until the child exited).

#![allow(clippy::single_range_in_vec_init)] // one range of addresses per list is what is meant

use std::ops::Range;

use kreplay_wtrack::{WriteTracker, available, page_size};

const MIB2: usize = 2 << 20;

fn skip() -> bool {
    if let Err(why) = available() {
        eprintln!("skipped: {why}");
        return true;
    }
    false
}

/// A private anonymous mapping of `len` bytes aligned to 2 MiB (leaked on purpose: tests
/// remap parts of it).
fn aligned(len: usize, huge: bool) -> usize {
    // SAFETY: new anonymous mapping.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len + MIB2,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    let base = (p as usize).div_ceil(MIB2) * MIB2;
    let advice = if huge {
        libc::MADV_HUGEPAGE
    } else {
        libc::MADV_NOHUGEPAGE
    };
    // SAFETY: advice on our own mapping.
    unsafe { libc::madvise(base as *mut libc::c_void, len, advice) };
    base
}

fn fill(base: usize, len: usize, byte: u8) {
    // SAFETY: inside our mapping.
    unsafe { std::ptr::write_bytes(base as *mut u8, byte, len) };
}

fn read(addr: usize) -> u8 {
    // SAFETY: inside our mapping.
    unsafe { std::ptr::read_volatile(addr as *const u8) }
}

fn reported(tracker: &WriteTracker, addr: usize) -> Result<bool, String> {
    let mut out: Vec<Range<usize>> = Vec::new();
    tracker.written(&mut out).map_err(|e| e.to_string())?;
    Ok(out.iter().any(|r| r.contains(&addr)))
}

fn madvise(addr: usize, len: usize, advice: libc::c_int) {
    // SAFETY: advice on our own mapping.
    let rc = unsafe { libc::madvise(addr as *mut libc::c_void, len, advice) };
    assert_eq!(rc, 0, "madvise: {}", std::io::Error::last_os_error());
}

/// MADV_DONTNEED of a whole 2 MiB-aligned block of 4 KiB pages: every byte turns to zero. A
/// restore must see those pages as changed.
#[test]
fn dontneed_of_a_whole_page_table_is_reported() {
    if skip() {
        return;
    }
    let len = 3 * MIB2;
    let base = aligned(len, false);
    fill(base, len, 0xAB);
    let tracker = WriteTracker::new(&[base..base + len]).unwrap();
    madvise(base + MIB2, MIB2, libc::MADV_DONTNEED);
    assert_eq!(read(base + MIB2 + 123 * page_size()), 0, "zeroed");
    // Read back without touching anything else.
    let mut out = Vec::new();
    let pages = tracker.written(&mut out).unwrap();
    eprintln!("reported {pages} pages: {out:x?}");
    // Reading mapped the zero page at one page: look at another, untouched, page.
    let untouched = base + MIB2 + 7 * page_size();
    assert!(
        out.iter().any(|r| r.contains(&untouched)),
        "page zeroed by MADV_DONTNEED not reported written: {out:x?}"
    );
}

/// The same, each page read afterwards (zero page mapped).
#[test]
fn dontneed_of_a_whole_page_table_then_read_is_reported() {
    if skip() {
        return;
    }
    let len = 3 * MIB2;
    let base = aligned(len, false);
    fill(base, len, 0xAB);
    let tracker = WriteTracker::new(&[base..base + len]).unwrap();
    madvise(base + MIB2, MIB2, libc::MADV_DONTNEED);
    assert_eq!(reported(&tracker, base + MIB2 + 5 * page_size()), Ok(true));
}

/// A transparent huge page thrown away whole.
#[test]
fn dontneed_of_a_huge_page_is_reported() {
    if skip() {
        return;
    }
    let len = 2 * MIB2;
    let base = aligned(len, true);
    fill(base, len, 0xCD);
    let tracker = WriteTracker::new(&[base..base + len]).unwrap();
    madvise(base, MIB2, libc::MADV_DONTNEED);
    let mut out = Vec::new();
    tracker.written(&mut out).unwrap();
    eprintln!("reported {out:x?}");
    assert!(
        out.iter().any(|r| r.contains(&(base + 4096 * 9))),
        "huge page zeroed but not reported: {out:x?}"
    );
}

/// Writes to a followed THP are reported, pages beyond it not.
#[test]
fn writes_to_a_huge_page_are_reported() {
    if skip() {
        return;
    }
    let len = 2 * MIB2;
    let base = aligned(len, true);
    fill(base, len, 0xCD);
    let tracker = WriteTracker::new(&[base..base + len]).unwrap();
    // SAFETY: inside.
    unsafe { std::ptr::write_volatile((base + MIB2 + 77) as *mut u8, 1) };
    assert_eq!(reported(&tracker, base + MIB2 + 77), Ok(true));
    assert_eq!(reported(&tracker, base + 77), Ok(false));
}

/// mremap shrinks a followed mapping in place and grows it back: the tail's bytes are gone
/// (zeros now).
#[test]
fn mremap_shrink_then_grow_back_is_reported() {
    if skip() {
        return;
    }
    let len = 4 * MIB2;
    // Exactly one VMA of 8 MiB, so shrinking and growing stays in place.
    let base = aligned(len, false);
    // Trim to exactly [base, base+len) so the VMA is ours alone.
    fill(base, len, 0x5A);
    let tracker = WriteTracker::new(&[base..base + len]).unwrap();
    // SAFETY: remapping our own mapping in place.
    let p = unsafe { libc::mremap(base as *mut libc::c_void, len, 2 * MIB2, 0) };
    assert_eq!(p as usize, base);
    // SAFETY: growing it back in place (the pages after it were ours: aligned() over-mapped,
    // but the tail we released is free again).
    let q = unsafe { libc::mremap(base as *mut libc::c_void, 2 * MIB2, len, 0) };
    if q == libc::MAP_FAILED {
        eprintln!(
            "could not grow in place: {}",
            std::io::Error::last_os_error()
        );
        return;
    }
    assert_eq!(read(base + 3 * MIB2 + 100), 0, "the tail was dropped");
    let mut out = Vec::new();
    match tracker.written(&mut out) {
        Err(e) => eprintln!("tracker could not say: {e} (acceptable)"),
        Ok(_) => {
            eprintln!("reported {out:x?}");
            assert!(
                out.iter()
                    .any(|r| r.contains(&(base + 3 * MIB2 + 9 * 4096))),
                "tail zeroed by mremap but not reported: {out:x?}"
            );
        }
    }
}

/// mprotect read-only and back: writes after it still reported; untouched pages not.
#[test]
fn mprotect_round_trip_keeps_following() {
    if skip() {
        return;
    }
    let len = MIB2;
    let base = aligned(len, false);
    fill(base, len, 1);
    let tracker = WriteTracker::new(&[base..base + len]).unwrap();
    for prot in [
        libc::PROT_READ,
        libc::PROT_NONE,
        libc::PROT_READ | libc::PROT_WRITE,
    ] {
        // SAFETY: our mapping.
        let changed =
            unsafe { libc::mprotect((base + 4096 * 4) as *mut libc::c_void, 4096 * 8, prot) };
        assert_eq!(changed, 0);
    }
    // SAFETY: inside.
    unsafe { std::ptr::write_volatile((base + 4096 * 5) as *mut u8, 9) };
    assert_eq!(reported(&tracker, base + 4096 * 5), Ok(true));
    assert_eq!(reported(&tracker, base + 4096 * 6), Ok(false));
    assert_eq!(reported(&tracker, base + 4096 * 20), Ok(false));
}

/// A child forked while a range is followed, and still alive when the tracker is dropped: the
/// range must be free to follow again (dropping stops following it).
#[test]
fn dropping_a_tracker_while_a_forked_child_lives_stops_following() {
    if skip() {
        return;
    }
    let len = 16 * 4096;
    let base = aligned(len, false);
    fill(base, len, 1);
    let tracker = WriteTracker::new(&[base..base + len]).unwrap();
    let mut fds = [0; 2];
    // SAFETY: a new pipe.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: the child only blocks on a read and exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let mut b = [0u8; 1];
        // SAFETY: our own descriptors.
        unsafe {
            libc::close(fds[1]);
            libc::read(fds[0], b.as_mut_ptr().cast(), 1);
            libc::_exit(0);
        }
    }
    // SAFETY: our own descriptor.
    unsafe { libc::close(fds[0]) };
    drop(tracker);
    let again = WriteTracker::new(&[base..base + len]);
    // SAFETY: release the child (a byte, not end of file: a child forked by another test may
    // hold a copy of this pipe's write end) and reap it.
    unsafe {
        libc::write(fds[1], [1u8].as_ptr().cast(), 1);
        libc::close(fds[1]);
        let mut st = 0;
        libc::waitpid(pid, &mut st, 0);
    }
    assert!(
        again.is_ok(),
        "range still registered after the tracker was dropped: {:?}",
        again.err()
    );
}

/// The same without reading the tail back first: nothing maps a page there, so the kernel
/// has no page table for it at all; its bytes are zeros all the same.
#[test]
fn mremap_shrink_then_grow_back_is_reported_with_the_tail_left_untouched() {
    if skip() {
        return;
    }
    let len = 4 * MIB2;
    let base = aligned(len, false);
    fill(base, len, 0x5A);
    let tracker = WriteTracker::new(&[base..base + len]).unwrap();
    // SAFETY: remapping our own mapping in place.
    let p = unsafe { libc::mremap(base as *mut libc::c_void, len, 2 * MIB2, 0) };
    assert_eq!(p as usize, base);
    // SAFETY: growing it back in place over the addresses just released.
    let q = unsafe { libc::mremap(base as *mut libc::c_void, 2 * MIB2, len, 0) };
    if q == libc::MAP_FAILED {
        eprintln!(
            "could not grow in place: {}",
            std::io::Error::last_os_error()
        );
        return;
    }
    let mut out = Vec::new();
    match tracker.written(&mut out) {
        Err(e) => eprintln!("tracker could not say: {e} (acceptable)"),
        Ok(_) => assert!(
            out.iter()
                .any(|r| r.contains(&(base + 3 * MIB2 + 9 * 4096))),
            "tail zeroed by mremap but not reported: {out:x?}"
        ),
    }
    assert_eq!(read(base + 3 * MIB2 + 9 * 4096), 0, "the tail was dropped");
}

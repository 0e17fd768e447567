//! Write tracking seen from outside: whatever pages are written, by whichever thread, the
//! tracker reports them; pages left alone stay unreported; memory it cannot follow is refused.
//! Skipped, with the reason printed, where the kernel offers no asynchronous write protection.

#![allow(clippy::single_range_in_vec_init)] // one range of addresses per list is what is meant

use std::ops::Range;

use kreplay_wtrack::{TrackError, WriteTracker, available, page_size};

/// A private anonymous mapping without huge pages (so page reports are exact), unmapped on drop.
struct Scratch {
    ptr: *mut u8,
    len: usize,
}

impl Scratch {
    fn new(pages: usize) -> Scratch {
        Scratch::mapped(pages, libc::MAP_PRIVATE)
    }

    /// A private mapping of `pages` pages, each written once (so each has a page of its own).
    fn populated(pages: usize) -> Scratch {
        let mem = Scratch::new(pages);
        for p in 0..pages {
            mem.write(p * page_size(), 1);
        }
        mem
    }

    /// An anonymous mapping of `pages` pages, private or shared (`sharing`).
    fn mapped(pages: usize, sharing: libc::c_int) -> Scratch {
        let len = pages * page_size();
        // SAFETY: a new anonymous mapping, replacing nothing.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                sharing | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED);
        // SAFETY: advice on our own mapping.
        unsafe { libc::madvise(ptr, len, libc::MADV_NOHUGEPAGE) };
        Scratch {
            ptr: ptr.cast(),
            len,
        }
    }
    fn range(&self) -> Range<usize> {
        self.ptr as usize..self.ptr as usize + self.len
    }
    fn write(&self, offset: usize, byte: u8) {
        assert!(offset < self.len);
        // SAFETY: inside the mapping.
        unsafe { std::ptr::write_volatile(self.ptr.add(offset), byte) };
    }
    fn read(&self, offset: usize) -> u8 {
        // SAFETY: inside the mapping.
        unsafe { std::ptr::read_volatile(self.ptr.add(offset)) }
    }
}

// SAFETY: the mapping is plain memory; the tests write it with volatile byte stores from
// several threads, which is what they check the tracker sees.
unsafe impl Sync for Scratch {}

impl Drop for Scratch {
    fn drop(&mut self) {
        // SAFETY: our own mapping, no longer used.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

fn skip() -> bool {
    if let Err(why) = available() {
        eprintln!("skipped: write tracking is not available here: {why}");
        return true;
    }
    false
}

fn pages_of(ranges: &[Range<usize>], base: usize) -> Vec<usize> {
    let page = page_size();
    let mut out: Vec<usize> = ranges
        .iter()
        .flat_map(|r| (r.start..r.end).step_by(page))
        .map(|a| (a - base) / page)
        .collect();
    out.sort_unstable();
    out
}

/// A private mapping of `pages` pages, each written once, followed by a new tracker; with the
/// mapping's first address.
fn populated_and_followed(pages: usize) -> (Scratch, usize, WriteTracker) {
    let mem = Scratch::populated(pages);
    let base = mem.range().start;
    let tracker = WriteTracker::new(&[mem.range()]).unwrap();
    (mem, base, tracker)
}

/// The pages (indices from `base`) `tracker` reports written.
fn written_pages(tracker: &WriteTracker, base: usize) -> Vec<usize> {
    let mut written = Vec::new();
    tracker.written(&mut written).unwrap();
    pages_of(&written, base)
}

/// A small deterministic generator (xorshift), so every run writes the same pages.
fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn every_page_written_by_any_thread_is_reported_and_no_other() {
    if skip() {
        return;
    }
    let pages = 1024;
    let page = page_size();
    let mem = Scratch::new(pages);
    // Half the pages populated before tracking starts, half never touched (no page yet).
    for p in 0..pages / 2 {
        mem.write(p * page, 1);
    }
    let tracker = WriteTracker::new(&[mem.range()]).unwrap();
    let mut expected = std::collections::BTreeSet::new();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut offsets = Vec::new();
    for _ in 0..300 {
        let off = (xorshift(&mut state) as usize) % mem.len;
        offsets.push(off);
        expected.insert(off / page);
    }
    // The first and last byte, and a page whose only access is a read.
    offsets.extend([0, mem.len - 1]);
    expected.extend([0, pages - 1]);
    let quiet = (0..pages).find(|p| !expected.contains(p)).unwrap();
    let _ = mem.read(quiet * page + 7);
    let base = mem.range().start;
    std::thread::scope(|s| {
        for part in offsets.chunks(40) {
            let mem = &mem;
            s.spawn(move || part.iter().for_each(|&o| mem.write(o, 0xAB)));
        }
    });
    let mut written = Vec::new();
    let n = tracker.written(&mut written).unwrap();
    let got = pages_of(&written, base);
    assert_eq!(got, expected.iter().copied().collect::<Vec<_>>());
    assert_eq!(n, expected.len());
}

#[test]
fn a_footprint_followed_in_pieces_on_several_threads_reports_exactly_its_written_runs() {
    if skip() {
        return;
    }
    let page = page_size();
    let piece = kreplay_wtrack::SCAN_PIECE / page;
    // Two followed ranges, the first of three pieces and a half: protecting them and scanning
    // them are split. The first is populated beforehand (a page left unprotected would be
    // reported), the second not (unpopulated pages count as protected too).
    let first = Scratch::populated(piece * 7 / 2);
    let second = Scratch::new(piece + 3);
    // Split across the threads of a pool of the caller's (outside any, on the calling thread).
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(4)
        .build()
        .unwrap();
    let tracker = pool
        .install(|| WriteTracker::new(&[first.range(), second.range()]))
        .unwrap();
    // Runs that straddle the pieces' boundaries, one that ends at a boundary, one that starts
    // at one, single pages, and the last page of each range.
    let mut runs: Vec<Range<usize>> = vec![
        0..1,
        piece - 2..piece + 2,
        2 * piece - 5..2 * piece,
        3 * piece..3 * piece + 1,
        3 * piece + 9..3 * piece + 10,
        piece * 7 / 2 - 1..piece * 7 / 2,
    ];
    runs.sort_by_key(|r| r.start);
    for r in &runs {
        for p in r.clone() {
            first.write(p * page + 11, 7);
        }
    }
    let second_pages = [piece - 1, piece, piece + 2];
    for p in second_pages {
        second.write(p * page, 7);
    }
    let mut written = Vec::new();
    let n = pool.install(|| tracker.written(&mut written)).unwrap();
    let mut alone = Vec::new();
    tracker.written(&mut alone).unwrap();
    assert_eq!(alone, written, "the same scanned outside any pool");
    // Reported in address order, each run of adjacent pages as one range, nothing else.
    let (a, b) = (first.range().start, second.range().start);
    let mut expected: Vec<Range<usize>> = runs
        .iter()
        .map(|r| a + r.start * page..a + r.end * page)
        .collect();
    let mut tail: Vec<Range<usize>> = vec![
        b + (piece - 1) * page..b + (piece + 1) * page,
        b + (piece + 2) * page..b + (piece + 3) * page,
    ];
    expected.append(&mut tail);
    expected.sort_by_key(|r| r.start);
    // The two mappings may lie next to each other: a run may then continue into the other.
    let mut merged: Vec<Range<usize>> = Vec::new();
    for r in expected {
        match merged.last_mut() {
            Some(last) if last.end == r.start => last.end = r.end,
            _ => merged.push(r),
        }
    }
    assert_eq!(written, merged);
    let pages: usize = runs.iter().map(|r| r.len()).sum::<usize>() + second_pages.len();
    assert_eq!(n, pages);
}

#[test]
fn protected_pages_count_as_unwritten_until_written_again() {
    if skip() {
        return;
    }
    let page = page_size();
    let mem = Scratch::new(64);
    let base = mem.range().start;
    let tracker = WriteTracker::new(&[mem.range()]).unwrap();
    mem.write(3 * page, 1);
    mem.write(40 * page + 100, 1);
    let mut written = Vec::new();
    tracker.written(&mut written).unwrap();
    assert_eq!(pages_of(&written, base), vec![3, 40]);
    // Reading does not protect: still written.
    let mut again = Vec::new();
    tracker.written(&mut again).unwrap();
    assert_eq!(again, written);
    tracker.protect(&written).unwrap();
    let mut none = Vec::new();
    assert_eq!(tracker.written(&mut none).unwrap(), 0);
    mem.write(40 * page, 2);
    mem.write(41 * page, 2);
    let mut next = Vec::new();
    tracker.written(&mut next).unwrap();
    assert_eq!(pages_of(&next, base), vec![40, 41]);
    assert_eq!(next.len(), 1, "adjacent pages come back as one range");
}

#[test]
fn unaligned_ranges_are_widened_to_their_pages() {
    if skip() {
        return;
    }
    let page = page_size();
    let mem = Scratch::new(8);
    let base = mem.range().start;
    let tracker = WriteTracker::new(&[base + 10..base + 2 * page + 1]).unwrap();
    assert_eq!(tracker.ranges(), &[base..base + 3 * page]);
    mem.write(2, 9); // before the requested start, same page
    mem.write(2 * page + 50, 9); // after the requested end, same page
    mem.write(5 * page, 9); // outside: not followed
    assert_eq!(written_pages(&tracker, base), vec![0, 2]);
}

#[test]
fn shared_memory_is_refused_because_another_mapping_could_write_it() {
    if skip() {
        return;
    }
    let shared = Scratch::mapped(4, libc::MAP_SHARED);
    let err = WriteTracker::new(&[shared.range()]).unwrap_err();
    assert!(
        matches!(&err, TrackError::Refused { reason, .. } if reason.contains("shared")),
        "{err}"
    );
}

#[test]
fn memory_replaced_behind_the_trackers_back_is_never_reported_clean() {
    if skip() {
        return;
    }
    let page = page_size();
    let (mem, base, tracker) = populated_and_followed(16);
    // Pages 4..8 are replaced by a new mapping (what a free and a new allocation at the same
    // address would do) and written there.
    // SAFETY: MAP_FIXED over pages of our own mapping.
    let p = unsafe {
        libc::mmap(
            (base + 4 * page) as *mut libc::c_void,
            4 * page,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    mem.write(5 * page, 7);
    let mut written = Vec::new();
    match tracker.written(&mut written) {
        Err(_) => {}
        Ok(_) => assert!(pages_of(&written, base).contains(&5), "{written:x?}"),
    }
}

#[test]
fn a_fault_costs_something_measurable_and_bounded() {
    if skip() {
        return;
    }
    let cost = kreplay_wtrack::fault_cost().expect("measured where tracking is available");
    assert!(cost > std::time::Duration::ZERO);
    assert!(cost < std::time::Duration::from_millis(1), "{cost:?}");
    // Every price of following a page is measured, positive and below a millisecond a page.
    let costs = kreplay_wtrack::page_costs().expect("measured where tracking is available");
    for (what, ns) in [
        ("fault", costs.fault_ns),
        ("scan", costs.scan_ns),
        ("protect", costs.protect_ns),
    ] {
        assert!(ns > 0.0 && ns < 1e6, "{what}: {ns} ns per page");
    }
}

/// Pages whose contents the kernel throws away at the process's request read back as zeros
/// afterwards: a change of their bytes that no store made.
#[test]
fn pages_discarded_with_madvise_are_reported_written_even_if_nothing_stores_to_them() {
    if skip() {
        return;
    }
    let page = page_size();
    let (mem, base, tracker) = populated_and_followed(32);
    let advise = |first: usize, pages: usize, advice: libc::c_int| {
        // SAFETY: advice on pages of our own mapping, which the test reads afterwards only.
        let rc = unsafe {
            libc::madvise(
                (base + first * page) as *mut libc::c_void,
                pages * page,
                advice,
            )
        };
        assert_eq!(
            rc,
            0,
            "madvise({advice}): {}",
            std::io::Error::last_os_error()
        );
    };
    advise(3, 2, libc::MADV_DONTNEED); // pages 3, 4: zeros, left unread
    advise(10, 1, libc::MADV_DONTNEED); // page 10: zeros, read afterwards
    assert_eq!(mem.read(10 * page), 0);
    advise(20, 1, libc::MADV_FREE); // page 20: freed lazily, then reclaimed
    advise(20, 1, libc::MADV_PAGEOUT);
    let mut written = Vec::new();
    match tracker.written(&mut written) {
        Err(e) => panic!("the tracker could not say: {e}"),
        Ok(_) => {
            let pages = pages_of(&written, base);
            for p in [3, 4, 10] {
                assert_eq!(mem.read(p * page), 0);
                assert!(pages.contains(&p), "page {p} changed, reported {pages:?}");
            }
            if mem.read(20 * page) == 0 {
                assert!(pages.contains(&20), "page 20 changed, reported {pages:?}");
            }
            assert!(!pages.contains(&0) && !pages.contains(&31), "{pages:?}");
        }
    }
}

/// An application that forks (a subprocess started by a runtime, say) shares its pages with the
/// child copy-on-write until either writes them: the parent's stores after the fork must still
/// be reported, and the child's must not (they go to the child's own copies).
#[test]
fn writes_after_the_process_forks_are_still_reported_and_the_childs_are_not() {
    if skip() {
        return;
    }
    let page = page_size();
    let (mem, base, tracker) = populated_and_followed(16);
    // SAFETY: the child only stores to its own copy of the mapping and exits without running
    // anything else of the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        mem.write(9 * page, 9);
        // SAFETY: leaving the child at once, skipping the parent's destructors.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: waiting for the child forked above.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    mem.write(3 * page, 3);
    let pages = written_pages(&tracker, base);
    assert_eq!(
        pages,
        vec![3],
        "the parent wrote page 3 only; reported {pages:?}"
    );
    assert_eq!(
        mem.read(9 * page),
        1,
        "the child's store stays in the child"
    );
}

/// Stores the kernel makes on the process's behalf (a `read(2)` into the buffer, a
/// `process_vm_writev` aimed at it) go through the same page tables: the pages they fill must
/// be reported, or a restore would leave their bytes in place.
#[test]
fn pages_the_kernel_fills_for_a_system_call_are_reported() {
    if skip() {
        return;
    }
    let page = page_size();
    let (mem, base, tracker) = populated_and_followed(16);
    // read(2) from a pipe into page 5.
    let mut fds = [0; 2];
    // SAFETY: a new pipe.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let msg = [7u8; 64];
    // SAFETY: writing our own bytes to the pipe's write end.
    let sent = unsafe { libc::write(fds[1], msg.as_ptr().cast(), msg.len()) };
    assert_eq!(sent, 64);
    // SAFETY: the kernel stores 64 bytes inside page 5 of the mapping.
    let got = unsafe { libc::read(fds[0], mem.ptr.add(5 * page + 100).cast(), 64) };
    assert_eq!(got, 64, "read: {}", std::io::Error::last_os_error());
    // SAFETY: our own descriptors.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
    // process_vm_writev into page 11, from this process to itself.
    let local = libc::iovec {
        iov_base: msg.as_ptr() as *mut libc::c_void,
        iov_len: 16,
    };
    // SAFETY: page 11 lies inside the mapping.
    let target = unsafe { mem.ptr.add(11 * page) };
    let remote = libc::iovec {
        iov_base: target.cast(),
        iov_len: 16,
    };
    // SAFETY: one local and one remote vector, both valid; the target is this process.
    let wrote = unsafe { libc::process_vm_writev(libc::getpid(), &local, 1, &remote, 1, 0) };
    if wrote < 0 {
        // Forbidden here (a seccomp filter or ptrace policy): the read(2) case still stands.
        eprintln!(
            "process_vm_writev not allowed here: {}",
            std::io::Error::last_os_error()
        );
    } else {
        assert_eq!(wrote, 16);
    }
    let pages = written_pages(&tracker, base);
    let want = if wrote < 0 { vec![5] } else { vec![5, 11] };
    assert_eq!(pages, want, "reported {pages:?}");
    assert_eq!(mem.read(5 * page + 100), 7);
}

//! What an error says: the address it is about and why, in words a caller can act on.

#![allow(clippy::single_range_in_vec_init)] // one range of addresses per list is what is meant

use std::ops::Range;

use kreplay_wtrack::{Mapping, WriteTracker, available, page_size, private_anonymous_cover};

/// A private anonymous mapping of `pages` pages without huge pages, each written once (leaked:
/// the tests map other memory over parts of it).
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
    // SAFETY: advice on our own mapping.
    unsafe { libc::madvise(p, len, libc::MADV_NOHUGEPAGE) };
    // SAFETY: inside the mapping just made.
    unsafe { std::ptr::write_bytes(p.cast::<u8>(), 1, len) };
    p as usize
}

/// Maps new anonymous memory (`sharing`: private or shared) over `range`, as a free and a new
/// allocation at the same address would.
fn map_over(range: Range<usize>, sharing: libc::c_int) {
    // SAFETY: MAP_FIXED over pages of a mapping of the test's own.
    let p = unsafe {
        libc::mmap(
            range.start as *mut libc::c_void,
            range.end - range.start,
            libc::PROT_READ | libc::PROT_WRITE,
            sharing | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    assert_eq!(
        p as usize,
        range.start,
        "{}",
        std::io::Error::last_os_error()
    );
}

/// Memory mapped again over part of a followed range is no longer followed: both reading the
/// written pages and protecting them must fail, saying where, and what lies there now.
#[test]
fn memory_mapped_over_a_followed_range_is_named_in_the_error() {
    if let Err(why) = available() {
        eprintln!("skipped: {why}");
        return;
    }
    let page = page_size();
    let base = populated(16);
    let tracker = WriteTracker::new(&[base..base + 16 * page]).unwrap();
    let replaced = base + 4 * page;
    map_over(replaced..replaced + 4 * page, libc::MAP_SHARED);
    let read = tracker.written(&mut Vec::new()).unwrap_err().to_string();
    let protect = tracker
        .protect(&[base..base + 16 * page])
        .unwrap_err()
        .to_string();
    for text in [read, protect] {
        assert!(
            text.contains(&format!("{replaced:#x}")) && text.contains("shared"),
            "{text}"
        );
    }
}

/// The same for private anonymous memory mapped again: the kind of memory it could follow,
/// but not the memory it began following.
#[test]
fn private_memory_mapped_again_over_a_followed_range_is_named_in_the_error() {
    if let Err(why) = available() {
        eprintln!("skipped: {why}");
        return;
    }
    let page = page_size();
    let base = populated(16);
    let tracker = WriteTracker::new(&[base..base + 16 * page]).unwrap();
    let replaced = base + 9 * page;
    map_over(replaced..replaced + page, libc::MAP_PRIVATE);
    let text = tracker.written(&mut Vec::new()).unwrap_err().to_string();
    assert!(
        text.contains(&format!("{replaced:#x}")) && text.contains("no longer followed"),
        "{text}"
    );
}

/// The main thread's stack is private, writable and has no file: refused, but not as
/// file-backed memory, which it is not.
#[test]
fn the_stack_is_refused_as_the_stack_not_as_a_file() {
    let maps: Vec<Mapping> = [
        "7ffd1000-7ffd3000 rw-p 00000000 00:00 0 [stack]",
        "7ffd3000-7ffd4000 rw-p 00000000 00:00 0",
    ]
    .into_iter()
    .filter_map(Mapping::parse)
    .collect();
    let why = private_anonymous_cover(&maps, 0x7ffd2000..0x7ffd4000).unwrap_err();
    assert!(
        why.contains("[stack]") && !why.contains("file-backed"),
        "{why}"
    );
}

/// Each followed range may split a mapping in two or three: a request for more ranges than the
/// process has mappings left is refused up front, saying so, instead of failing with an
/// out-of-memory error after filling the process's table of mappings (which fails the
/// application's own allocations meanwhile).
#[test]
fn more_ranges_than_the_process_may_have_mappings_are_refused_saying_why() {
    if let Err(why) = available() {
        eprintln!("skipped: {why}");
        return;
    }
    let Some(limit) = std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .filter(|&limit| limit <= 1 << 20)
    else {
        eprintln!("skipped: no usable vm.max_map_count");
        return;
    };
    let page = page_size();
    // Every other page of one mapping: each range splits it twice.
    let count = limit / 2 + 64;
    // SAFETY: a new anonymous mapping, never touched (no memory is used).
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            2 * count * page,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    let base = p as usize;
    let ranges: Vec<Range<usize>> = (0..count)
        .map(|i| base + 2 * i * page..base + (2 * i + 1) * page)
        .collect();
    let text = WriteTracker::new(&ranges).unwrap_err().to_string();
    // SAFETY: our own mapping, no longer used.
    unsafe { libc::munmap(p, 2 * count * page) };
    assert!(text.contains("max_map_count"), "{text}");
}

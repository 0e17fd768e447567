//! A process that forks while a range is followed: the child inherits a copy of the tracker,
//! whose descriptors still reach the parent's memory, not the child's.

#![allow(clippy::single_range_in_vec_init)] // one range of addresses per list is what is meant

use std::ops::Range;

use kreplay_wtrack::{TrackError, WriteTracker, available, page_size};

/// A private anonymous mapping of `pages` pages without huge pages, each written once (leaked:
/// a few pages per test).
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
    let base = p as usize;
    for i in 0..pages {
        write(base + i * page_size());
    }
    base
}

fn write(addr: usize) {
    // SAFETY: callers pass addresses inside a mapping of their own.
    unsafe { std::ptr::write_volatile(addr as *mut u8, 7) };
}

/// The pages (indices from `base`) `tracker` reports written.
fn written_pages(tracker: &WriteTracker, base: usize) -> Result<Vec<usize>, String> {
    let mut out: Vec<Range<usize>> = Vec::new();
    tracker.written(&mut out).map_err(|e| e.to_string())?;
    Ok(out
        .iter()
        .flat_map(|r| (r.start..r.end).step_by(page_size()))
        .map(|a| (a - base) / page_size())
        .collect())
}

/// The child's calls must fail instead of reporting the parent's pages or protecting them again
/// (which would hide writes the parent made), and the child dropping its copy must leave the
/// parent's tracking as it was.
#[test]
fn a_forked_childs_copy_of_a_tracker_leaves_the_parents_tracking_alone() {
    if let Err(why) = available() {
        eprintln!("skipped: {why}");
        return;
    }
    let page = page_size();
    let base = populated(16);
    let tracker = WriteTracker::new(&[base..base + 16 * page]).unwrap();
    write(base + 3 * page);
    // SAFETY: the child calls the tracker, drops it and leaves with _exit, running nothing else
    // of the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let mut code = 0;
        if !matches!(
            tracker.written(&mut Vec::new()),
            Err(TrackError::Forked { .. })
        ) {
            code |= 1;
        }
        if !matches!(
            tracker.protect(&[base..base + 16 * page]),
            Err(TrackError::Forked { .. })
        ) {
            code |= 2;
        }
        drop(tracker);
        // SAFETY: leaving the child at once.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waiting for the child forked above.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status));
    let code = libc::WEXITSTATUS(status);
    assert_eq!(code & 1, 0, "the child's written() did not fail as forked");
    assert_eq!(code & 2, 0, "the child's protect() did not fail as forked");
    write(base + 5 * page);
    assert_eq!(written_pages(&tracker, base), Ok(vec![3, 5]));
}

/// The error a child gets says which process the tracker belongs to, and why it refuses.
#[test]
fn the_forked_error_names_the_process_that_owns_the_tracker() {
    let text = TrackError::Forked { owner: 1234 }.to_string();
    assert!(text.contains("1234") && text.contains("fork"), "{text}");
}

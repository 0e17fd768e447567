//! A counted kernel the scenarios share: `add` adds to a buffer and notes, per tag, how often it
//! ran and what the buffer's first word held when it started (each scenario runs in a process
//! of its own, so the counts are the scenario's).

use std::sync::atomic::{AtomicU32, Ordering};

use kreplay_softhsa::WorkGroup;
use parking_lot::Mutex;

/// Runs of `add` per tag.
static RUNS: [AtomicU32; 64] = [const { AtomicU32::new(0) }; 64];
/// The value of the first word each run started from, as (tag, value).
static SEEN: Mutex<Vec<(u32, u32)>> = Mutex::new(Vec::new());

/// The kernel arguments of [`add`].
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct AddArgs {
    pub buf: u64,
    pub len: u32,
    /// Below 64.
    pub tag: u32,
    pub amount: u32,
}

/// `buf[i] += amount` for every work-item below `len`; work-group 0 counts the run under its
/// tag and notes `buf[0]`.
pub fn add(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries an `AddArgs` block.
    let args: AddArgs = unsafe { group.kernargs() };
    let buf = args.buf as *mut u32;
    if group.group_id() == [0, 0, 0] {
        note_run(args.tag, buf);
    }
    for [i, _, _] in group.work_items() {
        if i < args.len {
            // SAFETY: each work-item owns index `i` of a buffer of `len` u32.
            unsafe { *buf.add(i as usize) += args.amount };
        }
    }
}

/// The kernel arguments of [`add_one`].
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct AddOneArgs {
    pub buf: u64,
    pub len: u32,
    pub pad: u32,
}

/// `buf[i] += 1` for every work-item below `len`.
pub fn add_one(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries an `AddOneArgs` block.
    let args: AddOneArgs = unsafe { group.kernargs() };
    for [i, _, _] in group.work_items() {
        if i < args.len {
            // SAFETY: the buffer holds `len` u32s; each work-item owns index `i`.
            unsafe { *(args.buf as *mut u32).add(i as usize) += 1 };
        }
    }
}

/// Counts a run under `tag`.
pub fn count_run(tag: u32) {
    RUNS[tag as usize].fetch_add(1, Ordering::SeqCst);
}

/// Counts a run under `tag` and notes the first word at `first` (at least one readable u32).
pub fn note_run(tag: u32, first: *const u32) {
    count_run(tag);
    // SAFETY: the caller's kernel owns at least one u32 at `first`.
    SEEN.lock()
        .push((tag, unsafe { std::ptr::read_volatile(first) }));
}

/// How often a kernel ran under `tag`.
pub fn runs(tag: u32) -> u32 {
    RUNS[tag as usize].load(Ordering::SeqCst)
}

/// The first words the runs under `tag` started from, in order.
pub fn seen(tag: u32) -> Vec<u32> {
    SEEN.lock()
        .iter()
        .filter(|(t, _)| *t == tag)
        .map(|(_, v)| *v)
        .collect()
}

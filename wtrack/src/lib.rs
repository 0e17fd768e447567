//! Page-level tracking of the writes this process's own threads make to some of its memory.
//!
//! A replay that knows which pages a pass wrote can restore exactly those, without hashing the
//! rest of the footprint to find out. When a device's memory is memory of this process that only
//! its CPU threads write (a software device), the kernel's page tables know: [`WriteTracker`]
//! registers the ranges with a `userfaultfd` in asynchronous write-protect mode (Linux 6.7+:
//! `UFFD_FEATURE_WP_ASYNC`), so the first store to each protected page is let through by the
//! kernel and only un-protects the page, and reads the un-protected ("written") pages back with
//! the `PAGEMAP_SCAN` ioctl of `/proc/self/pagemap`. No signal handler and no fault thread is
//! involved, and nothing else in the process can tell, except that the first store to a tracked
//! page after each [`protect`](WriteTracker::protect) costs a minor fault ([`page_costs`]).
//! Starting to follow a range and stopping (dropping the tracker) each walk its page tables,
//! at about what protecting its pages again costs per page: on a large footprint a tracker
//! costs that twice before it saves anything. Memory never touched gets its page tables made
//! when protected (about a 512th of its size, kept until it is unmapped: 32 MiB for a 16 GiB
//! reservation), so follow what is in use, not a whole reservation.
//!
//! What it can follow: private anonymous writable mappings (heap, `mmap(MAP_PRIVATE |
//! MAP_ANONYMOUS)`), checked against `/proc/self/maps` before anything is registered. Shared or
//! file-backed memory is refused, because a write through another mapping of the same pages
//! (another address, another process) would not mark the pages this tracker watches. Writes by
//! a device's DMA engine never pass through the CPU's page tables either: only a backend whose
//! memory is written by this process's CPU may use it. A range the process already registered
//! with a `userfaultfd` of its own is refused by the kernel (`EBUSY`), and while a tracker
//! follows a range the process cannot register it with one of its own, nor collapse it into
//! huge pages (`MADV_COLLAPSE`); each range followed may split a mapping in two or three, and
//! ranges that would split the process's mappings past its limit (`vm.max_map_count`) are
//! refused before anything is registered.
//! Pages the kernel pinned for I/O before they were protected (io_uring fixed buffers, RDMA)
//! are written through the kernel's own mapping, which no tracker sees ([`pinned_bytes`]);
//! so are, while they last, transfers pinned only for their duration (an `O_DIRECT` read in
//! flight through `libaio` or `io_uring`, a `process_vm_writev` running on another thread)
//! when the pages are protected meanwhile, which no counter shows.
//! A child forked while a tracker lives inherits a copy of it whose descriptors still reach
//! the parent's memory: there every call fails ([`TrackError::Forked`]) rather than read or
//! protect the parent's pages, and dropping the copy leaves the parent's tracking alone.
//! Memory mapped anew over a followed range (unmapped and mapped again, `mmap` with
//! `MAP_FIXED`, `mremap`) is not followed any more: calls fail with [`TrackError::Replaced`],
//! naming where, and do so too once another tracker of this process follows the new memory
//! (they would otherwise read, and protect again, that tracker's pages). Memory unmapped and
//! left so is reported as not written: nothing lies there to write back.
//!
//! Pages are the unit: ranges are widened to whole pages, so a write to a neighbour sharing a
//! page is reported too (a superset, never a subset, of the pages written).
//!
//! ```no_run
//! use kreplay_wtrack::WriteTracker;
//!
//! let mut buf = vec![0u8; 1 << 20];
//! let range = buf.as_ptr() as usize..buf.as_ptr() as usize + buf.len();
//! let tracker = WriteTracker::new(&[range])?;
//! buf[5000] = 1;
//! let mut written = Vec::new();
//! tracker.written(&mut written)?;
//! assert!(written.iter().any(|r| r.contains(&(buf.as_ptr() as usize + 5000))));
//! tracker.protect(&written)?; // after writing them back: follow them again
//! # Ok::<(), kreplay_wtrack::TrackError>(())
//! ```

use std::fmt;
use std::io;
use std::ops::Range;
use std::time::Duration;

use rayon::prelude::*;

// The system calls, or where they do not exist a stand-in of the same shape that refuses.
mod live;
mod maps;
#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
#[path = "linux.rs"]
mod sys;
#[cfg(not(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
)))]
#[path = "unsupported.rs"]
mod sys;

pub use maps::{Mapping, private_anonymous_cover};

pub mod threads;

/// Why writes could not be tracked.
#[derive(Debug)]
#[non_exhaustive]
pub enum TrackError {
    /// This kernel, its configuration or the platform offers no asynchronous write protection.
    Unsupported(String),
    /// A range is not memory the tracker can follow.
    Refused {
        /// First byte of the range.
        addr: usize,
        /// Its length.
        len: usize,
        /// Why.
        reason: String,
    },
    /// Part of a followed range is not the memory the tracker began following any more: it
    /// was unmapped and mapped again, mapped over (`mmap` with `MAP_FIXED`) or moved there
    /// (`mremap`) since. What was written there is unknown (treat it as written); a new
    /// tracker can follow the new memory if it is memory a tracker can follow.
    Replaced {
        /// First byte no longer followed.
        addr: usize,
        /// Bytes from there that are not.
        len: usize,
        /// What is mapped there now.
        now: String,
    },
    /// Called in a child forked from the process that made the tracker: the tracker's
    /// descriptors reach that process's memory, not the child's, so the child can neither read
    /// nor protect anything through it (dropping the child's copy leaves the owner's tracking
    /// alone).
    Forked {
        /// The process that made the tracker and whose memory it follows.
        owner: u32,
    },
    /// A system call failed.
    Failed {
        /// Which.
        what: &'static str,
        /// What it said.
        error: io::Error,
    },
}

impl fmt::Display for TrackError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrackError::Unsupported(why) => write!(f, "write tracking unavailable: {why}"),
            TrackError::Refused { addr, len, reason } => {
                write!(
                    f,
                    "cannot track writes to {len} bytes at {addr:#x}: {reason}"
                )
            }
            TrackError::Replaced { addr, len, now } => write!(
                f,
                "{len} bytes at {addr:#x} are no longer followed: {now} was mapped there \
                 since tracking began"
            ),
            TrackError::Forked { owner } => write!(
                f,
                "this tracker follows the memory of process {owner}, which forked this one: \
                 a forked child cannot read or protect pages through it"
            ),
            TrackError::Failed { what, error } => write!(f, "{what} failed: {error}"),
        }
    }
}

impl std::error::Error for TrackError {}

/// Follows the writes to a set of ranges of this process's memory, page by page (see the crate
/// docs). Dropping it stops following them (the kernel un-protects the pages).
pub struct WriteTracker {
    inner: sys::Tracker,
    /// The followed ranges, widened to pages, sorted and disjoint.
    ranges: Vec<Range<usize>>,
    page: usize,
    /// Set once another tracker of this process registered some of these addresses (see
    /// `live`): the memory there was replaced.
    lost: live::Lost,
}

impl Drop for WriteTracker {
    fn drop(&mut self) {
        // A forked child's copy was never entered in the child's list (and takes no lock
        // there that another thread of the parent may have held when it forked).
        if std::process::id() == self.inner.owner() {
            live::leave(&self.lost);
        }
    }
}

impl fmt::Debug for WriteTracker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteTracker")
            .field("ranges", &self.ranges)
            .field("page", &self.page)
            .finish()
    }
}

impl WriteTracker {
    /// Start following the writes to `ranges` (any order, may overlap, may be unaligned): from
    /// now on, every page of them counts as not written until a store reaches it. All or
    /// nothing: on an error nothing stays registered.
    pub fn new(ranges: &[Range<usize>]) -> Result<Self, TrackError> {
        let page = page_size();
        let ranges = widen_and_merge(ranges, page);
        let inner = sys::Tracker::register(&ranges)?;
        let tracker = WriteTracker {
            lost: live::enter(&ranges),
            inner,
            ranges,
            page,
        };
        tracker.in_pieces(&tracker.ranges, |r| tracker.inner.protect(r))?;
        Ok(tracker)
    }

    /// The followed ranges: the requested ones widened to whole pages, sorted and merged.
    pub fn ranges(&self) -> &[Range<usize>] {
        &self.ranges
    }

    /// The page size, the unit of everything reported.
    pub fn page_size(&self) -> usize {
        self.page
    }

    /// Bytes followed.
    pub fn bytes(&self) -> usize {
        self.ranges.iter().map(|r| r.end - r.start).sum()
    }

    /// Append to `out` the page ranges written since tracking began or since they were last
    /// [`protect`](Self::protect)ed (sorted, whole pages, adjacent pages merged); returns the
    /// pages appended. Reading does not protect them again. An error means the set is unknown
    /// (treat everything as written): [`TrackError::Replaced`] where memory was mapped anew
    /// over a followed range, naming where; in a child forked from the process that made the
    /// tracker it is [`TrackError::Forked`].
    ///
    /// The kernel walks the page tables of every followed page, about a nanosecond or two
    /// each; a footprint of more than [`SCAN_PIECE`] bytes is scanned in pieces of that size
    /// on the threads of the rayon pool the caller runs in, the answers joined in order.
    /// Outside any pool it is scanned on the calling thread alone: rayon's global pool is the
    /// application's, whose workers may all be busy (waiting for this very call, even), and
    /// whose threads would start with the mask of whichever thread first needed them.
    /// [`new`](Self::new) and [`protect`](Self::protect) do the same.
    pub fn written(&self, out: &mut Vec<Range<usize>>) -> Result<usize, TrackError> {
        self.in_owner()?;
        let before = out.len();
        let found = self.in_pieces(&self.ranges, |r| {
            let mut part = Vec::new();
            self.inner.scan(r, &mut part).map(|()| part)
        })?;
        for r in found.into_iter().flatten() {
            match out[before..].last_mut() {
                Some(last) if last.end == r.start => last.end = r.end,
                _ => out.push(r),
            }
        }
        let pages = out[before..]
            .iter()
            .map(|r| (r.end - r.start) / self.page)
            .sum();
        Ok(pages)
    }

    /// Follow the writes to `ranges` again from now on (widened to pages, clipped to the
    /// followed ranges): call it after writing them back. An error means some of them may not
    /// be followed (stop trusting [`written`](Self::written)); in a child forked from the
    /// process that made the tracker it is [`TrackError::Forked`] and protects nothing.
    pub fn protect(&self, ranges: &[Range<usize>]) -> Result<(), TrackError> {
        self.in_owner()?;
        let parts: Vec<Range<usize>> = widen_and_merge(ranges, self.page)
            .into_iter()
            .flat_map(|r| clip(&self.ranges, r))
            .collect();
        self.in_pieces(&parts, |r| self.inner.protect(r))?;
        Ok(())
    }

    /// Refuses in any process but the one that made the tracker (a child forked from it):
    /// there the descriptors would read, and protect, the parent's pages; and once another
    /// tracker follows some of its addresses (its memory there was replaced): the requests
    /// would read, and protect, the other tracker's pages.
    fn in_owner(&self) -> Result<(), TrackError> {
        let owner = self.inner.owner();
        if std::process::id() != owner {
            return Err(TrackError::Forked { owner });
        }
        if let Some(lost) = self.lost.get() {
            return Err(TrackError::Replaced {
                addr: lost.start,
                len: lost.end - lost.start,
                now: "new memory (which another tracker follows)".into(),
            });
        }
        Ok(())
    }

    /// `f` over `parts` (page-aligned, sorted, disjoint), its answers in order: on this thread
    /// where they add up to at most [`SCAN_PIECE`] bytes, where the caller runs in no rayon
    /// pool (the global one is the application's: never touched) or where its pool has one
    /// thread, else cut into pieces of that size and run on the caller's pool's threads at
    /// once. Scanning and protecting both walk the page tables, a nanosecond or two per page.
    fn in_pieces<T: Send>(
        &self,
        parts: &[Range<usize>],
        f: impl Fn(Range<usize>) -> Result<T, TrackError> + Sync + Send,
    ) -> Result<Vec<T>, TrackError> {
        let total: usize = parts.iter().map(|r| r.end - r.start).sum();
        let in_a_pool = rayon::current_thread_index().is_some();
        if total <= SCAN_PIECE || !in_a_pool || rayon::current_num_threads() < 2 {
            return parts.iter().cloned().map(f).collect();
        }
        split(parts, SCAN_PIECE).into_par_iter().map(f).collect()
    }
}

/// Above this many bytes, [`WriteTracker::written`] scans, and protecting protects, in pieces
/// of this size on several threads (those of the rayon pool the caller runs in, if any). On the 2-core development machine a scan of 1 GiB of 4 KiB pages took
/// 260-540 us on one thread; a piece of 64 MiB takes a few dozen, well above what handing it
/// to another thread costs.
pub const SCAN_PIECE: usize = 64 << 20;

/// `ranges` (sorted, disjoint) cut into consecutive pieces of at most `piece` bytes (`piece` a
/// multiple of the page size), in order.
fn split(ranges: &[Range<usize>], piece: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    for r in ranges {
        let mut start = r.start;
        while start < r.end {
            let end = r.end.min(start.saturating_add(piece));
            out.push(start..end);
            start = end;
        }
    }
    out
}

/// The system page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|&p| p > 0).unwrap_or(4096)
}

/// What following one page costs this process, in nanoseconds: measured once per process on a
/// scratch mapping of 256 pages (the best of three rounds of each), see [`page_costs`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PageCosts {
    /// The first store to a protected page, paid by the thread making it (a minor fault the
    /// kernel resolves itself).
    pub fault_ns: f64,
    /// Scanning a page in a [`WriteTracker::written`] scan (every page of the scratch mapping
    /// written: the dearest case per page scanned).
    pub scan_ns: f64,
    /// Protecting a page again ([`WriteTracker::protect`]); starting to follow a range
    /// ([`WriteTracker::new`]) and stopping (dropping the tracker) cost about as much per page.
    pub protect_ns: f64,
}

/// What following a page costs here, measured once per process (about a millisecond) and kept;
/// `None` where tracking is unavailable. The scratch mapping is small: its page tables stay
/// cached, where those of a large footprint do not, and the syscalls' fixed costs weigh more
/// per page. These are priors, for a caller that measures its own ranges as it goes; on the
/// development machine a fault in a 256 MiB footprint cost 1.2-1.45 times the probe's.
pub fn page_costs() -> Option<PageCosts> {
    static COSTS: std::sync::OnceLock<Option<PageCosts>> = std::sync::OnceLock::new();
    *COSTS.get_or_init(|| sys::measure_page_costs(256, 3))
}

/// What the first store to a protected page costs the thread making it (see [`page_costs`]).
pub fn fault_cost() -> Option<Duration> {
    page_costs().map(|c| Duration::from_nanos(c.fault_ns.round() as u64))
}

/// Whether writes can be tracked here at all (the kernel offers asynchronous write protection
/// and `PAGEMAP_SCAN`): tried once on a scratch mapping of its own (so whatever the caller's
/// trackers follow does not change the answer), the answer kept.
pub fn available() -> Result<(), String> {
    static AVAILABLE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    AVAILABLE
        .get_or_init(|| sys::probe().map_err(|e| e.to_string()))
        .clone()
}

/// Bytes of this process's memory the kernel holds pinned for I/O (`VmPin` of
/// `/proc/self/status`: io_uring fixed buffers, RDMA memory regions and the like), 0 where
/// the kernel does not say. The kernel writes such pages through a mapping of its own, not
/// through the process's page tables: a write there is never reported by a tracker, so while
/// any are pinned a caller should not rely on what a tracker saw between its own operations.
/// Only long-lived pins are counted: a transfer that pins pages for its own duration (an
/// `O_DIRECT` read in flight) is not, and is seen by no tracker either if the pages are
/// protected while it runs.
pub fn pinned_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status.lines().find_map(|line| {
                let kb = line.strip_prefix("VmPin:")?.trim().strip_suffix("kB")?;
                kb.trim().parse::<u64>().ok()
            })
        })
        .map_or(0, |kb| kb.saturating_mul(1024))
}

/// `ranges` widened to whole pages, sorted, with overlapping and adjacent ones merged; empty
/// ones dropped.
pub fn widen_and_merge(ranges: &[Range<usize>], page: usize) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = ranges
        .iter()
        .filter(|r| r.start < r.end)
        .map(|r| {
            let start = r.start - r.start % page;
            let end = r.end.div_ceil(page).saturating_mul(page);
            start..end
        })
        .collect();
    out.sort_by_key(|r| r.start);
    let mut merged: Vec<Range<usize>> = Vec::with_capacity(out.len());
    for r in out {
        match merged.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => merged.push(r),
        }
    }
    merged
}

/// The parts of `r` inside the sorted, disjoint `within`.
fn clip(within: &[Range<usize>], r: Range<usize>) -> impl Iterator<Item = Range<usize>> + '_ {
    within.iter().filter_map(move |w| {
        let start = w.start.max(r.start);
        let end = w.end.min(r.end);
        (start < end).then_some(start..end)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_widen_to_pages_and_merge_when_they_touch() {
        let got = widen_and_merge(&[9000..9001, 100..200, 4096..4097, 20000..20000], 4096);
        assert_eq!(got, vec![0..12288]);
        let got = widen_and_merge(&[0..4096, 8192..8193], 4096);
        assert_eq!(got, vec![0..4096, 8192..12288]);
    }

    #[test]
    fn ranges_split_into_pieces_in_order_covering_every_byte() {
        let got = split(&[0..10, 20..25, 30..30], 4);
        assert_eq!(got, vec![0..4, 4..8, 8..10, 20..24, 24..25]);
        let whole = split(std::slice::from_ref(&(0..8)), 8);
        assert_eq!((whole.len(), whole.first()), (1, Some(&(0..8))));
    }

    #[test]
    fn clipping_keeps_only_the_parts_inside() {
        let within = [0..4096, 8192..16384];
        let got: Vec<_> = clip(&within, 2048..12288).collect();
        assert_eq!(got, vec![2048..4096, 8192..12288]);
    }
}

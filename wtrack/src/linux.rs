//! The system calls: a `userfaultfd` in asynchronous write-protect mode, `PAGEMAP_SCAN`, and
//! `/proc/self/maps` to check what a range is before registering it.
//! The constants and structures are those of Linux's `uapi/linux/userfaultfd.h` and
//! `uapi/linux/fs.h` (6.7+), written out here because older C headers lack them.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use crate::TrackError;

/// `_IOC(dir, type, nr, size)` of the generic ioctl encoding (x86_64, aarch64).
const fn ioc(dir: u64, ty: u64, nr: u64, size: usize) -> u64 {
    (dir << 30) | ((size as u64) << 16) | (ty << 8) | nr
}
const IOC_WRITE: u64 = 1;
const IOC_READ: u64 = 2;

const UFFD_API: u64 = 0xAA;
const UFFD_USER_MODE_ONLY: libc::c_int = 1;
const UFFD_FEATURE_WP_UNPOPULATED: u64 = 1 << 13;
const UFFD_FEATURE_WP_ASYNC: u64 = 1 << 15;
const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;
const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1 << 0;

#[repr(C)]
#[derive(Default)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}

const UFFDIO_API: u64 = ioc(IOC_READ | IOC_WRITE, UFFD_API, 0x3F, size_of::<UffdioApi>());
const UFFDIO_REGISTER: u64 = ioc(
    IOC_READ | IOC_WRITE,
    UFFD_API,
    0x00,
    size_of::<UffdioRegister>(),
);
/// `_IOR(UFFDIO, _UFFDIO_UNREGISTER, struct uffdio_range)`.
const UFFDIO_UNREGISTER: u64 = ioc(IOC_READ, UFFD_API, 0x01, size_of::<UffdioRange>());
const UFFDIO_WRITEPROTECT: u64 = ioc(
    IOC_READ | IOC_WRITE,
    UFFD_API,
    0x06,
    size_of::<UffdioWriteprotect>(),
);

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

#[repr(C)]
#[derive(Default)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

const PAGEMAP_SCAN: u64 = ioc(
    IOC_READ | IOC_WRITE,
    b'f' as u64,
    16,
    size_of::<PmScanArg>(),
);
const PAGE_IS_WRITTEN: u64 = 1 << 1;
/// Fail the scan where a page is not under asynchronous write protection (a range that is not
/// ours any more) instead of reporting it as written or not.
const PM_SCAN_CHECK_WPASYNC: u64 = 1 << 1;

const _: () = assert!(size_of::<PmScanArg>() == 96);
const _: () = assert!(size_of::<UffdioRegister>() == 32);

fn failed(what: &'static str) -> TrackError {
    TrackError::Failed {
        what,
        error: io::Error::last_os_error(),
    }
}

/// The registered `userfaultfd` and the pagemap file the scans go through.
pub(crate) struct Tracker {
    uffd: OwnedFd,
    pagemap: File,
    /// The ranges registered with `uffd`, unregistered on drop.
    registered: Vec<Range<usize>>,
    /// The process that registered them. A child forked from it inherits both descriptors,
    /// which still reach this process's memory, not the child's.
    owner: u32,
}

impl Drop for Tracker {
    /// Unregisters every range (which clears its protection) before the descriptor closes.
    /// Closing alone unregisters nothing while another process holds the descriptor too (a
    /// child forked while the ranges were followed keeps it until it exits or execs): the
    /// ranges would stay registered and protected, and could never be followed again.
    ///
    /// In a forked child nothing is unregistered: through the inherited descriptor that would
    /// stop the parent's tracking.
    fn drop(&mut self) {
        if std::process::id() != self.owner {
            return;
        }
        for r in &self.registered {
            let mut range = span(r);
            // SAFETY: UFFDIO_UNREGISTER reads one `uffdio_range`, which `range` is; a range
            // unmapped since only makes the call fail, which changes nothing.
            unsafe { libc::ioctl(self.uffd.as_raw_fd(), UFFDIO_UNREGISTER as _, &mut range) };
        }
    }
}

impl Tracker {
    /// Checks that `ranges` (page-aligned, disjoint) are private anonymous memory, registers
    /// them for write protection and protects every page of them.
    pub(crate) fn new(ranges: &[Range<usize>]) -> Result<Tracker, TrackError> {
        let tracker = Tracker::register(ranges)?;
        for r in ranges {
            tracker.protect(r.clone())?;
        }
        Ok(tracker)
    }

    /// [`new`](Tracker::new) without protecting anything yet: the caller protects the ranges
    /// (every page of them) before relying on a scan.
    pub(crate) fn register(ranges: &[Range<usize>]) -> Result<Tracker, TrackError> {
        let mappings = read_self_maps()?;
        for r in ranges {
            if let Err(reason) = crate::private_anonymous_cover(&mappings, r.clone()) {
                return Err(TrackError::Refused {
                    addr: r.start,
                    len: r.end - r.start,
                    reason,
                });
            }
        }
        check_map_count(&mappings, ranges)?;
        // SAFETY: the userfaultfd system call takes only flags; the returned descriptor is
        // checked before use and owned below.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_userfaultfd,
                libc::O_CLOEXEC | libc::O_NONBLOCK | UFFD_USER_MODE_ONLY,
            )
        };
        if fd < 0 {
            return Err(TrackError::Unsupported(format!(
                "userfaultfd: {}",
                io::Error::last_os_error()
            )));
        }
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        let uffd = unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) };
        let mut api = UffdioApi {
            api: UFFD_API,
            features: UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_API reads and writes one `uffdio_api`, which `api` is (layout as in
        // the uapi header).
        if unsafe { libc::ioctl(uffd.as_raw_fd(), UFFDIO_API as _, &mut api) } != 0 {
            return Err(TrackError::Unsupported(format!(
                "asynchronous write protection (UFFD_FEATURE_WP_ASYNC, Linux 6.7+): {}",
                io::Error::last_os_error()
            )));
        }
        let pagemap = File::open("/proc/self/pagemap").map_err(|error| TrackError::Failed {
            what: "opening /proc/self/pagemap",
            error,
        })?;
        let mut tracker = Tracker {
            uffd,
            pagemap,
            registered: Vec::with_capacity(ranges.len()),
            owner: std::process::id(),
        };
        for r in ranges {
            let mut reg = UffdioRegister {
                range: span(r),
                mode: UFFDIO_REGISTER_MODE_WP,
                ioctls: 0,
            };
            // SAFETY: UFFDIO_REGISTER reads and writes one `uffdio_register`; the range is
            // memory of this process that the caller checked is mapped.
            if unsafe { libc::ioctl(tracker.uffd.as_raw_fd(), UFFDIO_REGISTER as _, &mut reg) } != 0
            {
                let error = io::Error::last_os_error();
                // Dropping `tracker` unregisters the ranges registered so far.
                return Err(if error.raw_os_error() == Some(libc::EBUSY) {
                    TrackError::Refused {
                        addr: r.start,
                        len: r.end - r.start,
                        reason: "already registered with another userfaultfd".into(),
                    }
                } else if error.raw_os_error() == Some(libc::ENOMEM) {
                    TrackError::Failed {
                        what: "UFFDIO_REGISTER (each followed range may split a mapping in \
                               two or three; the process may have reached vm.max_map_count)",
                        error,
                    }
                } else {
                    TrackError::Failed {
                        what: "UFFDIO_REGISTER",
                        error,
                    }
                });
            }
            tracker.registered.push(r.clone());
        }
        Ok(tracker)
    }

    /// The process whose memory the descriptors reach (the one that made the tracker).
    pub(crate) fn owner(&self) -> u32 {
        self.owner
    }

    /// Protect the pages of `r` (page-aligned, inside a registered range) again.
    pub(crate) fn protect(&self, r: Range<usize>) -> Result<(), TrackError> {
        let mut wp = UffdioWriteprotect {
            range: span(&r),
            mode: UFFDIO_WRITEPROTECT_MODE_WP,
        };
        // SAFETY: UFFDIO_WRITEPROTECT reads and writes one `uffdio_writeprotect`; the range is
        // registered with this descriptor.
        if unsafe { libc::ioctl(self.uffd.as_raw_fd(), UFFDIO_WRITEPROTECT as _, &mut wp) } != 0 {
            let error = failed("UFFDIO_WRITEPROTECT");
            // ENOENT: a mapping of `r` is not registered for write protection any more.
            return Err(if errno_of(&error) == Some(libc::ENOENT) {
                no_longer_followed(&r, error)
            } else {
                error
            });
        }
        Ok(())
    }

    /// Append the written pages of `r` (a registered range) to `out`, merging with the last
    /// range appended when adjacent.
    pub(crate) fn scan(
        &self,
        r: Range<usize>,
        out: &mut Vec<Range<usize>>,
    ) -> Result<(), TrackError> {
        let mut buf = [PageRegion::default(); 256];
        let mut start = r.start as u64;
        let end = r.end as u64;
        while start < end {
            let mut arg = PmScanArg {
                size: size_of::<PmScanArg>() as u64,
                flags: PM_SCAN_CHECK_WPASYNC,
                start,
                end,
                vec: buf.as_mut_ptr() as u64,
                vec_len: buf.len() as u64,
                category_mask: PAGE_IS_WRITTEN,
                return_mask: PAGE_IS_WRITTEN,
                ..PmScanArg::default()
            };
            // SAFETY: PAGEMAP_SCAN reads `arg` and writes at most `vec_len` page regions into
            // `buf`, and `walk_end` into `arg`.
            let n = unsafe { libc::ioctl(self.pagemap.as_raw_fd(), PAGEMAP_SCAN as _, &mut arg) };
            if n < 0 {
                let error = failed("PAGEMAP_SCAN");
                // PM_SCAN_CHECK_WPASYNC: a page of `r` is not under this protection any more.
                return Err(if errno_of(&error) == Some(libc::EPERM) {
                    no_longer_followed(&r, error)
                } else {
                    error
                });
            }
            for region in &buf[..n as usize] {
                let (s, e) = (region.start as usize, region.end as usize);
                match out.last_mut() {
                    Some(last) if last.end == s => last.end = e,
                    _ => out.push(s..e),
                }
            }
            if arg.walk_end <= start {
                return Err(TrackError::Failed {
                    what: "PAGEMAP_SCAN",
                    error: io::Error::other("the scan made no progress"),
                });
            }
            start = arg.walk_end;
        }
        Ok(())
    }
}

/// Refuses `ranges` (sorted, disjoint, page-aligned, all inside `mappings`) where registering
/// them would split the process's mappings past its limit (`vm.max_map_count`): the kernel
/// would fail part-way with `ENOMEM`, after filling the table of mappings, which fails the
/// application's own `mmap` calls (and allocations) meanwhile. Each range splits the mapping
/// it starts inside, and the one it ends inside, unless it starts or ends on its boundary.
fn check_map_count(mappings: &[crate::Mapping], ranges: &[Range<usize>]) -> Result<(), TrackError> {
    let (Some(first), Some(last)) = (ranges.first(), ranges.last()) else {
        return Ok(());
    };
    let Some(limit) = std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
    else {
        return Ok(());
    };
    let inside = |at: usize| {
        let i = mappings.partition_point(|m| m.range.end <= at);
        mappings
            .get(i)
            .is_some_and(|m| m.range.start < at && at < m.range.end)
    };
    let splits = ranges
        .iter()
        .map(|r| usize::from(inside(r.start)) + usize::from(inside(r.end)))
        .sum::<usize>();
    if mappings.len() + splits <= limit {
        return Ok(());
    }
    Err(TrackError::Refused {
        addr: first.start,
        len: last.end - first.start,
        reason: format!(
            "following these {} ranges would split mappings into {splits} more, past the \
             process's limit of {limit} (vm.max_map_count; {} in use): follow fewer, larger \
             ranges",
            ranges.len(),
            mappings.len()
        ),
    })
}

fn errno_of(error: &TrackError) -> Option<i32> {
    match error {
        TrackError::Failed { error, .. } => error.raw_os_error(),
        _ => None,
    }
}

/// Where the kernel said part of `r` is no longer registered: the first mapping of `r` that
/// `/proc/self/smaps` lists without the write-protect registration (`uw` among its
/// `VmFlags`), as [`TrackError::Replaced`]; `fallback` where none is found.
fn no_longer_followed(r: &Range<usize>, fallback: TrackError) -> TrackError {
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
        return fallback;
    };
    let mut current: Option<crate::Mapping> = None;
    for line in smaps.lines() {
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            let Some(m) = current.take() else { continue };
            let overlap = m.range.start.max(r.start)..m.range.end.min(r.end);
            if overlap.start < overlap.end && !flags.split_whitespace().any(|f| f == "uw") {
                return TrackError::Replaced {
                    addr: overlap.start,
                    len: overlap.end - overlap.start,
                    now: m.describe(),
                };
            }
        } else if let Some(m) = crate::Mapping::parse(line) {
            current = Some(m);
        }
    }
    fallback
}

fn read_self_maps() -> Result<Vec<crate::Mapping>, TrackError> {
    let text = std::fs::read_to_string("/proc/self/maps").map_err(|error| TrackError::Failed {
        what: "reading /proc/self/maps",
        error,
    })?;
    Ok(text.lines().filter_map(crate::Mapping::parse).collect())
}

fn span(r: &Range<usize>) -> UffdioRange {
    UffdioRange {
        start: r.start as u64,
        len: (r.end - r.start) as u64,
    }
}

/// A private anonymous mapping of this crate's own, unmapped when dropped: probing on memory no
/// caller can be following (a block of the malloc heap could share a page with a range a
/// caller's tracker follows, and registering it would fail as already registered).
struct Scratch {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Scratch {
    fn new(len: usize) -> Option<Scratch> {
        // SAFETY: a new private anonymous mapping; nothing is replaced.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        (ptr != libc::MAP_FAILED).then_some(Scratch { ptr, len })
    }

    fn range(&self) -> Range<usize> {
        self.ptr as usize..self.ptr as usize + self.len
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping `new` made, which nothing uses any more.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// Whether a tracker works here: one made, and scanned, on a scratch mapping of a few pages.
pub(crate) fn probe() -> Result<(), TrackError> {
    let scratch = Scratch::new(4 * crate::page_size()).ok_or_else(|| failed("mmap"))?;
    let tracker = Tracker::new(std::slice::from_ref(&scratch.range()))?;
    tracker.scan(scratch.range(), &mut Vec::new())
}

/// What following a page costs, measured on a scratch mapping of `pages` pages: one store to
/// each protected page (the fault), a scan that finds every page written, and protecting them
/// all again; each the best of `rounds`, per page.
pub(crate) fn measure_page_costs(pages: usize, rounds: usize) -> Option<crate::PageCosts> {
    let page = crate::page_size();
    let len = pages * page;
    let scratch = Scratch::new(len)?;
    let ptr = scratch.ptr;
    let base = scratch.range().start;
    // SAFETY: the mapping is `len` bytes, ours alone.
    unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), 1, len) };
    let tracker = Tracker::new(std::slice::from_ref(&(base..base + len))).ok()?;
    let mut best = [Duration::MAX; 3];
    let mut out = Vec::new();
    for round in 0..rounds {
        let start = Instant::now();
        for p in 0..pages {
            // SAFETY: inside the mapping; a volatile store so the write is not elided.
            unsafe { std::ptr::write_volatile(ptr.cast::<u8>().add(p * page), round as u8) };
        }
        best[0] = best[0].min(start.elapsed());
        out.clear();
        let start = Instant::now();
        tracker.scan(base..base + len, &mut out).ok()?;
        best[1] = best[1].min(start.elapsed());
        let start = Instant::now();
        tracker.protect(base..base + len).ok()?;
        best[2] = best[2].min(start.elapsed());
    }
    let per_page = |d: Duration| d.as_nanos() as f64 / pages as f64;
    Some(crate::PageCosts {
        fault_ns: per_page(best[0]),
        scan_ns: per_page(best[1]),
        protect_ns: per_page(best[2]),
    })
}

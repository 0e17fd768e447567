//! The tiered snapshot store: device shadow, host mapping, spill file.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::{MmapMut, MmapOptions};
use parking_lot::Mutex;

use crate::config::{SnapshotConfig, StoreTier, budget_from_available};
use crate::device::DeviceMemory;
use crate::track::Followed;

/// Where a store's bytes live.
pub(crate) enum Backing {
    /// Nothing to hold (an empty plan), in the tier that was asked for.
    Empty(StoreTier),
    /// A device allocation from `alloc_shadow`.
    Device { addr: u64 },
    /// Anonymous host mapping, possibly registered with the device.
    Host { map: MmapMut, pinned: bool },
    /// Shared mapping of a spill file (already unlinked where the platform allows).
    File {
        map: MmapMut,
        _file: File,
        path: Option<PathBuf>,
    },
}

/// A snapshot store: `capacity` bytes in one tier. Dropping it frees the bytes (shadow freed,
/// host store unregistered, spill file removed).
pub(crate) struct Store {
    pub(crate) backing: Backing,
    pub(crate) capacity: u64,
    device: Arc<dyn DeviceMemory>,
    /// Whether the store was kept from an earlier snapshot (its pages are already in place,
    /// so copying into it costs what copies cost, not what first touching memory costs).
    pub(crate) reused: bool,
}

impl Store {
    pub(crate) fn tier(&self) -> StoreTier {
        match self.backing {
            Backing::Empty(tier) => tier,
            Backing::Host { .. } => StoreTier::Host,
            Backing::Device { .. } => StoreTier::Device,
            Backing::File { .. } => StoreTier::File,
        }
    }

    pub(crate) fn pinned(&self) -> bool {
        matches!(self.backing, Backing::Host { pinned: true, .. })
    }

    /// Host-addressable bytes of the store (host and file tiers; empty otherwise).
    pub(crate) fn bytes(&self) -> &[u8] {
        match &self.backing {
            Backing::Host { map, .. } | Backing::File { map, .. } => map,
            Backing::Empty(_) | Backing::Device { .. } => &[],
        }
    }

    /// Mutable host-addressable bytes (host and file tiers; empty otherwise).
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.backing {
            Backing::Host { map, .. } | Backing::File { map, .. } => map,
            Backing::Empty(_) | Backing::Device { .. } => &mut [],
        }
    }

    /// The device address of a device-tier store.
    pub(crate) fn device_addr(&self) -> Option<u64> {
        match self.backing {
            Backing::Device { addr } => Some(addr),
            _ => None,
        }
    }

    /// Move the bytes out, leaving an empty store behind (whose drop frees nothing).
    pub(crate) fn take(&mut self) -> Store {
        Store {
            backing: std::mem::replace(&mut self.backing, Backing::Empty(StoreTier::Host)),
            capacity: std::mem::take(&mut self.capacity),
            device: self.device.clone(),
            reused: self.reused,
        }
    }

    /// Whether a store may be kept for reuse after its snapshot drops.
    pub(crate) fn reusable(&self) -> bool {
        matches!(self.backing, Backing::Host { .. } | Backing::File { .. })
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        match &mut self.backing {
            Backing::Device { addr } => self.device.free_shadow(*addr, self.capacity),
            Backing::Host { map, pinned: true } => {
                self.device.unregister_host(map.as_ptr(), map.len())
            }
            Backing::File { path, .. } => {
                if let Some(p) = path.take() {
                    let _ = std::fs::remove_file(p);
                }
            }
            Backing::Host { .. } | Backing::Empty(_) => {}
        }
    }
}

/// Allocates stores and keeps the last reusable one, and the footprint still followed after
/// its replay with the store holding its bytes.
pub(crate) struct StoreSource {
    pub(crate) device: Arc<dyn DeviceMemory>,
    cached: Mutex<Option<Store>>,
    followed: Mutex<Option<Followed>>,
}

impl StoreSource {
    pub(crate) fn new(device: Arc<dyn DeviceMemory>) -> Self {
        StoreSource {
            device,
            cached: Mutex::new(None),
            followed: Mutex::new(None),
        }
    }

    /// The footprint still followed, taken out (the caller continues from it or ends it).
    pub(crate) fn take_followed(&self) -> Option<Followed> {
        self.followed.lock().take()
    }

    /// Keep following `followed` after its replay; one footprint at a time (an earlier one is
    /// returned, for the caller to end).
    pub(crate) fn keep_followed(&self, followed: Followed) -> Option<Followed> {
        self.followed.lock().replace(followed)
    }

    /// Bytes of the footprint still followed, if any.
    pub(crate) fn followed_bytes(&self) -> Option<u64> {
        self.followed
            .lock()
            .as_ref()
            .map(|f| f.regions.iter().map(|r| r.size).sum())
    }

    /// A store of at least `len` bytes. Under `Auto`: a device shadow on `agent` if the device
    /// has room, else the kept (host or file) store if it fits, else fresh host memory, else a
    /// spill file.
    /// A forced tier tries that tier only. The error lists what each tier said.
    pub(crate) fn acquire(
        &self,
        len: u64,
        agent: Option<u64>,
        config: &SnapshotConfig,
    ) -> Result<Store, String> {
        if len == 0 {
            let tier = match config.store {
                StoreTier::Auto => StoreTier::Host,
                forced => forced,
            };
            return Ok(Store {
                backing: Backing::Empty(tier),
                capacity: 0,
                device: self.device.clone(),
                reused: false,
            });
        }
        let tiers: &[StoreTier] = match config.store {
            StoreTier::Auto => &[StoreTier::Device, StoreTier::Host, StoreTier::File],
            StoreTier::Device => &[StoreTier::Device],
            StoreTier::Host => &[StoreTier::Host],
            StoreTier::File => &[StoreTier::File],
        };
        let mut notes = Vec::new();
        let mut cache_checked = false;
        for &tier in tiers {
            if tier != StoreTier::Device && !cache_checked {
                cache_checked = true;
                let kept = self.cached.lock().take();
                match kept {
                    Some(mut kept)
                        if kept.capacity >= len
                            && (config.store == StoreTier::Auto || kept.tier() == tier) =>
                    {
                        kept.reused = true;
                        return Ok(kept);
                    }
                    // Too small or the wrong tier: free it before allocating a new one.
                    other => drop(other),
                }
            }
            match self.allocate(tier, len, agent, config) {
                Ok(store) => return Ok(store),
                Err(why) => notes.push(format!("{tier}: {why}")),
            }
        }
        Err(notes.join("; "))
    }

    /// Offer a store back for reuse; kept when reusable and larger than the one already kept.
    pub(crate) fn give_back(&self, store: Store) {
        if !store.reusable() {
            return;
        }
        let mut slot = self.cached.lock();
        if slot
            .as_ref()
            .is_none_or(|kept| kept.capacity < store.capacity)
        {
            *slot = Some(store);
        }
    }

    /// Free the kept store, if any.
    pub(crate) fn release_cached(&self) {
        let kept = self.cached.lock().take();
        drop(kept);
    }

    fn allocate(
        &self,
        tier: StoreTier,
        len: u64,
        agent: Option<u64>,
        config: &SnapshotConfig,
    ) -> Result<Store, String> {
        let device = self.device.clone();
        let backing = match tier {
            StoreTier::Device => {
                let agent = agent.ok_or("no owner agent in the filter")?;
                let addr = self
                    .device
                    .alloc_shadow(agent, len)
                    .ok_or("no device shadow available on the agent")?;
                Backing::Device { addr }
            }
            StoreTier::Host => {
                let size = usize::try_from(len).map_err(|_| "size exceeds the address space")?;
                // The kernel grants anonymous memory it does not have (overcommit), and ends
                // the process when the copy touches it: a store larger than what may still be
                // taken (the machine's or the cgroup's room, less a margin) is not made.
                if let Some(available) = too_much_memory(len) {
                    return Err(format!(
                        "{len} bytes would leave too little memory: {available} bytes are \
                         available (MemAvailable or the memory cgroup's room)"
                    ));
                }
                let map = MmapOptions::new()
                    .len(size)
                    .map_anon()
                    .map_err(|e| format!("host allocation of {len} bytes failed: {e}"))?;
                let pinned = self.device.register_host(map.as_ptr(), map.len());
                Backing::Host { map, pinned }
            }
            StoreTier::File => spill_file(&config.spill_dir(), len)?,
            StoreTier::Auto => return Err("auto is not a tier".into()),
        };
        Ok(Store {
            backing,
            capacity: len,
            device,
            reused: false,
        })
    }
}

/// Stores from this size on are made only where the memory for them is available: reading
/// what is available (`/proc/meminfo`, the memory cgroups) costs tens of microseconds, several
/// times what a small store costs, and next to the memory's own margin a smaller store is not
/// what ends a process.
const MEMORY_CHECK_MIN_BYTES: u64 = 16 << 20;

/// The memory available now (the machine's or the memory cgroup's room), where `len` bytes of
/// memory from it would leave too little: more than may be taken of it (see
/// [`budget_from_available`]). `None` for a store below [`MEMORY_CHECK_MIN_BYTES`], one that
/// fits, or where what is available cannot be read.
fn too_much_memory(len: u64) -> Option<u64> {
    if len < MEMORY_CHECK_MIN_BYTES {
        return None;
    }
    crate::config::available_memory().filter(|&available| len > budget_from_available(available))
}

/// The bytes spill files in `dir` may take now: all but the larger of 512 MiB and a quarter of
/// its file system's free space (a larger spill file is refused); `None` where the free space
/// cannot be read. A tool (or a test) can ask before forcing the file tier.
pub fn spill_room(dir: &Path) -> Option<u64> {
    free_space(dir).map(budget_from_available)
}

/// Why a spill file of `len` bytes in `dir` would be refused now, or `None` where the file tier
/// would make it: larger than the process may write (`RLIMIT_FSIZE`), on a file system that
/// keeps its files in memory (tmpfs) with too little memory for it, or beyond [`spill_room`].
fn spill_refusal(dir: &Path, len: u64) -> Option<String> {
    if let Some(limit) = file_size_limit().filter(|limit| len > *limit) {
        return Some(format!(
            "a spill file of {len} bytes exceeds the process's file size limit \
             (RLIMIT_FSIZE) of {limit} bytes"
        ));
    }
    // A tmpfs keeps its files in memory: there a spill file is a host store the kernel
    // would kill the process for (see the host tier).
    if let Some(available) = too_much_memory(len).filter(|_| memory_backed(dir)) {
        return Some(format!(
            "{} keeps its files in memory (tmpfs): a spill file of {len} bytes would leave \
             too little memory, {available} bytes are available",
            dir.display()
        ));
    }
    // Filling a file past what its file system has free would write until the disk is full
    // (ENOSPC after minutes for a large store, with every other writer on that disk failing
    // meanwhile): a spill file is made only within the room the file system leaves, under the
    // same margin as memory.
    if let Some(free) = free_space(dir).filter(|&free| len > budget_from_available(free)) {
        return Some(format!(
            "{} has {free} bytes free: a spill file of {len} bytes would leave too little room \
             (all but a quarter of the free space or 512 MiB, whichever is larger, may be taken)",
            dir.display()
        ));
    }
    None
}

static SPILL_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Create a spill file of `len` bytes in `dir`, with its blocks allocated up front (so a full
/// disk is an error now, not a fault while copying), and map it. The file has no name in `dir`
/// from before it is filled (see [`unnamed_file`]), so it disappears with the mapping even if
/// the process dies while filling it.
///
/// A file larger than the process may write (`RLIMIT_FSIZE`) is refused before it is made:
/// growing a file past that limit raises SIGXFSZ, which ends a process that left the signal at
/// its default action.
fn spill_file(dir: &Path, len: u64) -> Result<Backing, String> {
    let size = usize::try_from(len).map_err(|_| "size exceeds the address space")?;
    if let Some(why) = spill_refusal(dir, len) {
        return Err(why);
    }
    let (mut file, path) = unnamed_file(dir)
        .map_err(|e| format!("cannot create a spill file in {}: {e}", dir.display()))?;
    let fail = |what: String| {
        if let Some(p) = &path {
            let _ = std::fs::remove_file(p);
        }
        what
    };
    let zeros = vec![0u8; (1 << 20).min(size)];
    let mut left = size;
    while left > 0 {
        let n = left.min(zeros.len());
        file.write_all(&zeros[..n]).map_err(|e| {
            fail(format!(
                "cannot fill a spill file in {}: {e}",
                dir.display()
            ))
        })?;
        left -= n;
    }
    // SAFETY: the file was just created by this process, without a name (O_TMPFILE) or under
    // a unique one (create_new) that was removed at once; no other mapping or writer of it
    // exists, so the mapping's bytes change only through this MmapMut.
    let map = unsafe { MmapOptions::new().len(size).map_mut(&file) }
        .map_err(|e| fail(format!("cannot map a spill file in {}: {e}", dir.display())))?;
    Ok(Backing::File {
        map,
        _file: file,
        path,
    })
}

/// A new, empty file in `dir` that has no name there, so that it goes with the process however
/// the process ends (a kill while a large file is filled included): made without a name
/// (`O_TMPFILE`) where the file system allows it, else created under a unique name and removed
/// at once. The path is returned only where that removal failed (the store removes it when
/// dropped).
pub(crate) fn unnamed_file(dir: &Path) -> std::io::Result<(File, Option<PathBuf>)> {
    if let Some(file) = tmpfile(dir)? {
        return Ok((file, None));
    }
    let path = dir.join(format!(
        "kreplay-spill-{}-{}",
        std::process::id(),
        SPILL_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)?;
    match std::fs::remove_file(&path) {
        Ok(()) => Ok((file, None)),
        Err(_) => Ok((file, Some(path))),
    }
}

/// A file without a name in `dir` (`O_TMPFILE`); `None` where the kernel or the file system
/// has no such files.
#[cfg(target_os = "linux")]
fn tmpfile(dir: &Path) -> std::io::Result<Option<File>> {
    use std::os::unix::fs::OpenOptionsExt;
    match OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .open(dir)
    {
        Ok(file) => Ok(Some(file)),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL | libc::ENOSYS)
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Files without a name are Linux's (`O_TMPFILE`): elsewhere a spill file is named, then its
/// name removed.
#[cfg(not(target_os = "linux"))]
fn tmpfile(_dir: &Path) -> std::io::Result<Option<File>> {
    Ok(None)
}

/// The bytes free to an unprivileged process on the file system holding `dir` (`statvfs`'s
/// available blocks); `None` where that cannot be asked.
fn free_space(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `path` is a NUL-terminated string that outlives the call, and `stat` points to
    // writable memory of the size of a `statvfs`, which the call fills when it returns 0.
    if unsafe { libc::statvfs(path.as_ptr(), stat.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled the whole struct.
    let stat = unsafe { stat.assume_init() };
    #[allow(clippy::unnecessary_cast)] // c_ulong and fsblkcnt_t are not u64 everywhere
    (stat.f_bavail as u64).checked_mul(stat.f_frsize as u64)
}

/// Whether `dir` lies on a file system that keeps its files in memory (tmpfs, ramfs): the type
/// of the deepest mount point above it in `/proc/self/mountinfo` (false where unknown).
fn memory_backed(dir: &Path) -> bool {
    let (Ok(dir), Ok(mounts)) = (
        dir.canonicalize(),
        std::fs::read_to_string("/proc/self/mountinfo"),
    ) else {
        return false;
    };
    fs_type_of(&dir, &mounts).is_some_and(|t| matches!(t, "tmpfs" | "ramfs"))
}

/// The file system type of the deepest mount point above `dir` in a mountinfo text (the last
/// one listed where several are mounted on the same point).
fn fs_type_of<'a>(dir: &Path, mountinfo: &'a str) -> Option<&'a str> {
    let mut best: Option<(usize, &str)> = None;
    for line in mountinfo.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let (Some(point), Some(dash)) = (fields.get(4), fields.iter().position(|f| *f == "-"))
        else {
            continue;
        };
        let Some(fstype) = fields.get(dash + 1) else {
            continue;
        };
        let point = PathBuf::from(unescape_mount_point(point));
        if dir.starts_with(&point) {
            let depth = point.components().count();
            if best.is_none_or(|(d, _)| depth >= d) {
                best = Some((depth, fstype));
            }
        }
    }
    best.map(|(_, t)| t)
}

/// A mountinfo mount point with its octal escapes (`\040` for a space) undone.
fn unescape_mount_point(point: &str) -> String {
    let bytes = point.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push(d.iter().fold(0u8, |v, c| v.wrapping_mul(8) + (c - b'0')));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The process's file size limit (the soft `RLIMIT_FSIZE`) in bytes, from `/proc/self/limits`;
/// `None` when unlimited or where it cannot be read. Writing a file past it raises SIGXFSZ,
/// which ends a process that left the signal at its default action: a library writing files
/// into its host process asks first.
pub fn file_size_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    file_size_limit_in(&limits)
}

/// The soft "Max file size" of a `/proc/<pid>/limits` text (`None`: unlimited or absent).
fn file_size_limit_in(limits: &str) -> Option<u64> {
    limits
        .lines()
        .find_map(|l| l.strip_prefix("Max file size"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_file_size_limit_is_read_from_proc_limits() {
        let text = "Limit                     Soft Limit           Hard Limit           Units     \n\
                    Max cpu time              unlimited            unlimited            seconds   \n\
                    Max file size             262144               unlimited            bytes     \n";
        assert_eq!(file_size_limit_in(text), Some(262144));
        let unlimited = text.replace("262144   ", "unlimited");
        assert_eq!(file_size_limit_in(&unlimited), None);
        assert_eq!(file_size_limit_in("Max cpu time 1 1 seconds\n"), None);
    }

    #[test]
    fn a_folders_file_system_is_its_deepest_mount_points() {
        let info = "22 1 0:21 / / rw,relatime - ext4 /dev/vda rw\n\
                    23 22 0:22 / /dev/shm rw,nosuid - tmpfs tmpfs rw,size=100k\n\
                    24 22 0:23 / /tmp rw - tmpfs tmpfs rw\n\
                    25 24 0:24 / /tmp rw shared:1 - ext4 /dev/vdb rw\n\
                    26 22 0:25 / /mnt/odd\\040dir rw - ramfs none rw\n";
        let of = |p: &str| fs_type_of(Path::new(p), info);
        assert_eq!(of("/dev/shm/kreplay"), Some("tmpfs"));
        assert_eq!(of("/dev/shmx"), Some("ext4"), "whole components only");
        assert_eq!(of("/tmp/x"), Some("ext4"), "the last mount on a point wins");
        assert_eq!(of("/mnt/odd dir/spill"), Some("ramfs"));
        assert_eq!(of("/var/tmp"), Some("ext4"));
        assert_eq!(fs_type_of(Path::new("/x"), ""), None);
    }
}

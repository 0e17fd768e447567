//! `kreplay_snapshot::DeviceMemory` for one CUDA device (one context).
//!
//! Every copy runs on a non-blocking stream of kreplay's own, created in the device's context,
//! and is waited for before the call returns. The snapshot's tiers map as follows:
//!
//! * **device shadow**: `cuMemAlloc` on the device, granted only when it leaves the application
//!   [`ShadowBudget`]'s headroom free (`cuMemGetInfo`); the shadow is kept after a snapshot and
//!   reused by the next one, and given back as soon as the application allocates again
//!   ([`CudaMemory::release_kept_shadow`]) so it never competes with the application;
//! * **pinned host**: the snapshot crate's host store, page-locked with `cuMemHostRegister`
//!   (`register_host`), so copies to and from it run at the link's full speed;
//! * **spill file**: the snapshot crate's own, copied through host reads and writes.
//!
//! The device kernels ([`crate::kernels`]) give it two capabilities: `hash_chunks` hashes
//! every chunk on the device (xxh3_64, equal to the host's), so the snapshot crate's hash and
//! verified write-set strategies work on device shadows without reading memory over PCIe; and
//! a restore of many scattered pieces is one gather launch instead of one copy per piece.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use kreplay_snapshot::{
    Capabilities, ChunkWrite, CopyError, DeviceCopy, DeviceMemory, HashRange, Inventory,
    StoreBytes, StoreTier, VerifiedRestore,
};
use parking_lot::Mutex;

use crate::driver::{
    CU_MEMHOSTREGISTER_DEVICEMAP, CU_MEMHOSTREGISTER_PORTABLE, CU_STREAM_NON_BLOCKING, CuContext,
    CuDevicePtr, CuError, CuStream, Driver,
};
use crate::guard::Guard;
use crate::kernels::{
    GATHER_TILE, GatherEntry, HASH_DEVICE_MIN_LEN, Kernels, RestoreEntry, gather_tiles,
    gather_tiles_into, hash_entries, restore_entries_into, use_gather,
};
use xxhash_rust::xxh3::xxh3_64;

/// How much device memory a shadow must leave to the application.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShadowBudget {
    /// Bytes that must stay free on the device after the shadow is allocated, at least.
    pub min_headroom: u64,
    /// Fraction (in percent) of the device's total memory that must stay free, at least.
    pub headroom_percent: u64,
}

impl Default for ShadowBudget {
    /// At least 2 GiB or 10% of the device, whichever is larger, stays free.
    fn default() -> Self {
        ShadowBudget {
            min_headroom: 2 << 30,
            headroom_percent: 10,
        }
    }
}

impl ShadowBudget {
    /// The headroom on a device of `total` bytes.
    pub fn headroom(&self, total: u64) -> u64 {
        self.min_headroom
            .max(total / 100 * self.headroom_percent.min(100))
    }

    /// Whether a shadow of `size` bytes may be allocated with `free` of `total` bytes free.
    pub fn allows(&self, size: u64, free: u64, total: u64) -> bool {
        size.checked_add(self.headroom(total))
            .is_some_and(|need| need <= free)
    }
}

/// A device shadow allocation kreplay holds.
#[derive(Clone, Copy, Debug)]
struct Shadow {
    addr: CuDevicePtr,
    size: u64,
}

/// Device memory of one CUDA context, as the snapshot sees it.
pub struct CudaMemory {
    driver: &'static Driver,
    /// The application's allocations (for allocation boundaries when merging copies).
    inventory: Arc<Inventory>,
    ctx: usize,
    stream: usize,
    budget: ShadowBudget,
    /// The shadow not in use, kept for the next snapshot.
    kept: Mutex<Option<Shadow>>,
    /// The shadow a live snapshot holds.
    lent: Mutex<Option<Shadow>>,
    /// Whether shadows are allowed at all (the configured tier).
    shadows: bool,
    /// The device kernels, JIT-loaded into the context on first use (or why they could not be).
    kernels: OnceLock<Result<Kernels, String>>,
    /// Device scratch for kernel launches (gather lists, chunk hashes).
    scratch: Mutex<Scratch>,
    /// Whether `hash_chunks` is offered (see [`CudaMemory::set_hash_on_device`]).
    hash_on_device: AtomicBool,
    /// Host ranges pinned by `register_host` that the device can read directly:
    /// (host address, length, device address).
    mapped: Mutex<Vec<(usize, usize, CuDevicePtr)>>,
    /// Where this memory's host time goes (the exit summary's `memory` fields).
    times: Times,
}

/// Counters of [`CudaMemory`]'s own calls, for the exit summary.
#[derive(Default)]
struct Times {
    copies: AtomicU64,
    copy_ns: AtomicU64,
    copy_wait_ns: AtomicU64,
    verified: AtomicU64,
    verified_ns: AtomicU64,
    verified_wait_ns: AtomicU64,
    lists_uploaded: AtomicU64,
    hashes: AtomicU64,
    hash_ns: AtomicU64,
    hash_wait_ns: AtomicU64,
    shadow_allocs: AtomicU64,
    shadow_alloc_ns: AtomicU64,
}

/// What [`CudaMemory`]'s calls cost on the host, summed since the memory was made: how many
/// device-to-device copy batches (snapshots of device shadows and full restores), verified
/// restores and hash launches it ran, their time from call to return and the part of it spent
/// waiting for its stream; restore lists uploaded; shadows allocated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryTimes {
    /// `copy_on_device` calls (snapshot copies into a device shadow, full restores from one).
    pub copies: u64,
    /// Their time, ns.
    pub copy_ns: u64,
    /// Of which waiting for kreplay's stream, ns.
    pub copy_wait_ns: u64,
    /// Verified restores run on the device.
    pub verified: u64,
    /// Their time, ns.
    pub verified_ns: u64,
    /// Of which waiting for kreplay's stream, ns.
    pub verified_wait_ns: u64,
    /// Verified restores that had to upload their range lists (the others found the lists of
    /// the previous restore still on the device).
    pub lists_uploaded: u64,
    /// Hash launches (snapshots that hash on the device).
    pub hashes: u64,
    /// Their time, ns.
    pub hash_ns: u64,
    /// Of which waiting for kreplay's stream (the hash launch and the hashes' copy back), ns.
    pub hash_wait_ns: u64,
    /// Device shadows allocated (`cuMemAlloc`; reuses of the kept one not counted).
    pub shadow_allocs: u64,
    /// Their time (free of the old one, `cuMemGetInfo`, `cuMemAlloc`), ns.
    pub shadow_alloc_ns: u64,
}

impl MemoryTimes {
    /// The sum of two devices' times.
    pub fn add(&self, o: &MemoryTimes) -> MemoryTimes {
        MemoryTimes {
            copies: self.copies + o.copies,
            copy_ns: self.copy_ns + o.copy_ns,
            copy_wait_ns: self.copy_wait_ns + o.copy_wait_ns,
            verified: self.verified + o.verified,
            verified_ns: self.verified_ns + o.verified_ns,
            verified_wait_ns: self.verified_wait_ns + o.verified_wait_ns,
            lists_uploaded: self.lists_uploaded + o.lists_uploaded,
            hashes: self.hashes + o.hashes,
            hash_ns: self.hash_ns + o.hash_ns,
            hash_wait_ns: self.hash_wait_ns + o.hash_wait_ns,
            shadow_allocs: self.shadow_allocs + o.shadow_allocs,
            shadow_alloc_ns: self.shadow_alloc_ns + o.shadow_alloc_ns,
        }
    }
}

fn since(start: Instant) -> u64 {
    start.elapsed().as_nanos() as u64
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// Whether a list must go to the device again: not when the device buffer at `at` already
/// holds exactly `now` (what the last upload to it sent, remembered in `sent`, `sent_at`).
/// Records `now` as sent when it answers yes; [`forget_upload`] undoes that when the upload
/// fails.
/// A buffer is named by its address and size: a buffer regrown (freed and allocated again,
/// always larger) at the same address is another buffer.
fn upload_needed<T: PartialEq + Copy>(
    sent: &mut Vec<T>,
    sent_at: &mut (CuDevicePtr, u64),
    now: &[T],
    at: (CuDevicePtr, u64),
) -> bool {
    if *sent_at == at && at.0 != 0 && sent.as_slice() == now {
        return false;
    }
    sent.clear();
    sent.extend_from_slice(now);
    *sent_at = at;
    true
}

/// The device buffer's content is unknown (an upload or the stream failed).
fn forget_upload<T>(sent: &mut Vec<T>, sent_at: &mut (CuDevicePtr, u64)) {
    sent.clear();
    *sent_at = (0, 0);
}

/// Device buffers the kernels read their lists from and write their results to, grown on
/// demand and kept (they are small: 24 bytes per MiB gathered, 8 per chunk hashed).
#[derive(Default)]
struct Scratch {
    list: Option<Shadow>,
    hashes: Option<Shadow>,
    /// A snapshot's chunk hashes for verified restores, and the snapshot they belong to.
    snap: Option<Shadow>,
    snap_id: u64,
    /// The bitmap of chunks a verified restore found changed, and their number after it.
    bits: Option<Shadow>,
    /// The copies of the chunks a verified restore found changed.
    found: Option<Shadow>,
    /// A verified restore's gather list of its learned write set.
    tiles: Option<Shadow>,
    /// Host lists of a verified restore, kept between restores for their memory: the
    /// detection's entries, the learned set's copies (as handed over, then merged) and its
    /// gather tiles.
    entries: Vec<RestoreEntry>,
    set: Vec<DeviceCopy>,
    merged: Vec<DeviceCopy>,
    set_tiles: Vec<GatherEntry>,
    /// The verified restore's own buffer for its detection entries (`list` serves the other
    /// launches), and what the last upload put there and into `tiles`: a restore whose lists
    /// did not change since (the same snapshot, the same learned set) uploads nothing.
    vlist: Option<Shadow>,
    sent_entries: Vec<RestoreEntry>,
    sent_entries_at: (CuDevicePtr, u64),
    sent_tiles: Vec<GatherEntry>,
    sent_tiles_at: (CuDevicePtr, u64),
    /// Page-locked host memory that results come back into (a verified restore's bitmap, a
    /// hash launch's hashes): a copy to pageable memory costs the driver a staging copy and
    /// returns later than one to page-locked memory.
    readback: PinnedSlot,
}

/// A page-locked host buffer: its address and size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Pinned {
    addr: usize,
    size: usize,
}

/// A page-locked host buffer grown on demand and kept, or none when the driver refused one
/// (then it is not asked again, and results come back into the caller's own memory).
#[derive(Debug, Default)]
struct PinnedSlot {
    buf: Option<Pinned>,
    refused: bool,
}

impl PinnedSlot {
    /// The address of a buffer of at least `size` bytes: the kept one, or a new one of the
    /// next power of two (at least 4 KiB) from `alloc`, the too small one handed to `free`
    /// first. `None` when `alloc` fails (now or before): read back into pageable memory.
    fn get(
        &mut self,
        size: usize,
        alloc: impl FnOnce(usize) -> Option<usize>,
        free: impl FnOnce(usize),
    ) -> Option<usize> {
        if let Some(b) = self.buf
            && b.size >= size
        {
            return Some(b.addr);
        }
        if self.refused {
            return None;
        }
        if let Some(old) = self.buf.take() {
            free(old.addr);
        }
        let size = size.max(4096).next_power_of_two();
        match alloc(size) {
            Some(addr) if addr != 0 => {
                self.buf = Some(Pinned { addr, size });
                Some(addr)
            }
            _ => {
                self.refused = true;
                None
            }
        }
    }

    /// The buffer, given up (to be freed at teardown).
    fn take(&mut self) -> Option<Pinned> {
        self.buf.take()
    }
}

/// `cuMemAllocHost` of `size` bytes (the current context's), or `None`.
fn alloc_pinned(driver: &Driver, size: usize) -> Option<usize> {
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: writes the address of a new page-locked allocation of `size` bytes.
    let rc = unsafe { (driver.mem_alloc_host)(&mut p, size) };
    (rc == crate::driver::CUDA_SUCCESS && !p.is_null()).then_some(p as usize)
}

/// The address of `slot`'s page-locked buffer of at least `size` bytes (see
/// [`PinnedSlot::get`]), allocated and freed through `driver`; `None`: read back into pageable
/// memory.
fn readback_buffer(driver: &Driver, slot: &mut PinnedSlot, size: usize) -> Option<usize> {
    slot.get(
        size,
        |n| alloc_pinned(driver, n),
        |p| free_pinned(driver, p),
    )
}

/// `cuMemFreeHost` of a buffer from [`alloc_pinned`] that nothing uses any more.
fn free_pinned(driver: &Driver, addr: usize) {
    // SAFETY: a page-locked allocation of ours; the stream that used it was waited for.
    unsafe { (driver.mem_free_host)(addr as *mut c_void) };
}

/// A scratch buffer of at least `size` bytes in `slot`, reallocated (power-of-two sizes) when
/// too small. The current context is the memory's.
fn scratch_buffer(
    driver: &Driver,
    slot: &mut Option<Shadow>,
    size: u64,
) -> Result<CuDevicePtr, CuError> {
    if let Some(s) = *slot
        && s.size >= size
    {
        return Ok(s.addr);
    }
    if let Some(old) = slot.take() {
        // SAFETY: our scratch allocation; the stream that used it was waited for.
        unsafe { (driver.mem_free)(old.addr) };
    }
    let size = size.max(4096).next_power_of_two();
    let mut addr: CuDevicePtr = 0;
    // SAFETY: allocates in the current context and writes the address.
    driver.check("cuMemAlloc_v2", unsafe {
        (driver.mem_alloc)(&mut addr, size as usize)
    })?;
    *slot = Some(Shadow { addr, size });
    Ok(addr)
}

impl std::fmt::Debug for CudaMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaMemory")
            .field("ctx", &format_args!("{:#x}", self.ctx))
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

/// Merge copies that continue each other into one: the snapshot hands restores over in pieces
/// of at most 1 MiB, and one driver copy per piece is launch-bound (about 0.25 TB/s measured on
/// the H200 against 2 TB/s for whole allocations). A copy may not span two allocations (the
/// driver rejects it with `CUDA_ERROR_INVALID_VALUE`, and neighbouring allocations are often
/// adjacent in the address space), so two copies merge only when `same_allocation` says that
/// both their destinations and both their sources lie in one allocation.
pub fn coalesce_copies(
    copies: &[DeviceCopy],
    same_allocation: impl Fn(u64, u64) -> bool,
) -> Vec<DeviceCopy> {
    let mut out: Vec<DeviceCopy> = Vec::with_capacity(copies.len().min(64));
    coalesce_copies_into(&mut out, copies, same_allocation);
    out
}

/// [`coalesce_copies`] into `out` (cleared first), reusing its memory.
pub fn coalesce_copies_into(
    out: &mut Vec<DeviceCopy>,
    copies: &[DeviceCopy],
    same_allocation: impl Fn(u64, u64) -> bool,
) {
    out.clear();
    for c in copies.iter().filter(|c| c.len > 0) {
        match out.last_mut() {
            Some(last)
                if last.dst.checked_add(last.len) == Some(c.dst)
                    && last.src.checked_add(last.len) == Some(c.src)
                    && same_allocation(last.dst, c.dst)
                    && same_allocation(last.src, c.src) =>
            {
                last.len += c.len;
            }
            _ => out.push(*c),
        }
    }
}

/// Answers "do `a` and `b` lie in one allocation" for [`coalesce_copies`], remembering the
/// last few allocations found: a restore hands over thousands of pieces of a few allocations,
/// and looking each one up (two locks and a tree search) cost about 2 ms for the 32 Ki pieces of
/// a 32 GiB restore on the H200, 12% of the copy.
pub struct AllocationCache<F: Fn(u64) -> Option<(u64, u64)>> {
    lookup: F,
    recent: std::cell::RefCell<Vec<(u64, u64)>>,
}

impl<F: Fn(u64) -> Option<(u64, u64)>> AllocationCache<F> {
    /// Allocations that remembered: at least one per side of a copy (source and destination).
    const KEEP: usize = 4;

    /// A cache over `lookup`, which gives the allocation `[start, end)` holding an address.
    pub fn new(lookup: F) -> Self {
        AllocationCache {
            lookup,
            recent: std::cell::RefCell::new(Vec::with_capacity(Self::KEEP)),
        }
    }

    /// Whether `a` and `b` lie in one allocation.
    pub fn same(&self, a: u64, b: u64) -> bool {
        let inside = |r: &(u64, u64), x: u64| x >= r.0 && x < r.1;
        let mut recent = self.recent.borrow_mut();
        if let Some(r) = recent.iter().find(|r| inside(r, a)) {
            return inside(r, b);
        }
        let Some(r) = (self.lookup)(a) else {
            return false;
        };
        if recent.len() == Self::KEEP {
            recent.remove(0);
        }
        recent.push(r);
        inside(&r, b)
    }
}

/// Merge host-to-device writes whose destinations (in one allocation) and host sources both
/// continue each other, as [`coalesce_copies`] does for device copies.
pub fn coalesce_writes(
    writes: &[ChunkWrite<'_>],
    same_allocation: impl Fn(u64, u64) -> bool,
) -> Vec<(u64, *const u8, usize)> {
    let mut out: Vec<(u64, *const u8, usize)> = Vec::with_capacity(writes.len().min(64));
    for w in writes.iter().filter(|w| !w.data.is_empty()) {
        match out.last_mut() {
            Some((addr, ptr, len))
                if addr.checked_add(*len as u64) == Some(w.addr)
                    && ptr.wrapping_add(*len) == w.data.as_ptr()
                    && same_allocation(*addr, w.addr) =>
            {
                *len += w.data.len();
            }
            _ => out.push((w.addr, w.data.as_ptr(), w.data.len())),
        }
    }
    out
}

fn failed(addr: u64, len: u64, e: CuError) -> CopyError {
    CopyError::failed(addr, len, e.to_string())
}

impl CudaMemory {
    /// Memory of context `ctx`, with a new non-blocking stream of kreplay's own in it.
    /// `tier` is the configured snapshot tier: shadows are handed out under `Auto` and `Device`.
    ///
    /// # Safety
    /// `ctx` is a live context that stays alive as long as the returned memory (kreplay uses
    /// the primary contexts applications launch in, which live until CUDA is torn down).
    pub unsafe fn new(
        driver: &'static Driver,
        inventory: Arc<Inventory>,
        ctx: CuContext,
        budget: ShadowBudget,
        tier: StoreTier,
    ) -> Result<Arc<CudaMemory>, CuError> {
        let _guard = Guard::enter();
        // SAFETY: ctx is alive by the caller's promise.
        unsafe { driver.make_current(ctx) }?;
        let mut stream: CuStream = std::ptr::null_mut();
        // SAFETY: creates a stream in the current context (ctx) and writes its handle.
        driver.check("cuStreamCreate", unsafe {
            (driver.stream_create)(&mut stream, CU_STREAM_NON_BLOCKING)
        })?;
        Ok(Arc::new(CudaMemory {
            driver,
            inventory,
            ctx: ctx as usize,
            stream: stream as usize,
            budget,
            kept: Mutex::new(None),
            lent: Mutex::new(None),
            shadows: matches!(tier, StoreTier::Auto | StoreTier::Device),
            kernels: OnceLock::new(),
            scratch: Mutex::new(Scratch::default()),
            hash_on_device: AtomicBool::new(true),
            mapped: Mutex::new(Vec::new()),
            times: Times::default(),
        }))
    }

    /// The context this memory belongs to.
    pub fn context(&self) -> CuContext {
        self.ctx as CuContext
    }

    /// kreplay's stream in this context (every copy and kernel of this memory runs on it).
    pub fn stream(&self) -> CuStream {
        self.stream as CuStream
    }

    /// Offer the device hash kernel to the snapshot (the default) or not. Without it the
    /// snapshot crate's `auto` strategy restores device shadows in full, and hashing (if a
    /// strategy asks for it) reads memory to the host.
    pub fn set_hash_on_device(&self, on: bool) {
        self.hash_on_device.store(on, Ordering::Relaxed);
    }

    /// Load the device kernels into the context now if they are not yet (a failure is kept
    /// and met again by whatever needs them).
    pub fn load_kernels(&self) {
        if self.kernels.get().is_none()
            && let Ok(_guard) = self.enter()
        {
            let _ = self.kernels();
        }
    }

    /// The device kernels of this context, loaded on first use (the caller has made the
    /// context current).
    pub fn kernels(&self) -> Result<&Kernels, String> {
        self.kernels
            .get_or_init(|| {
                let _guard = Guard::enter();
                Kernels::load(self.driver).map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Copy `copies` (merged, at least one) with one gather launch; the wait for it is added
    /// to `waited`.
    fn gather(&self, copies: &[DeviceCopy], waited: &AtomicU64) -> Result<(), CopyError> {
        let first = copies[0];
        let fail = |e: CuError| failed(first.dst, first.len, e);
        let kernels = self
            .kernels()
            .map_err(|e| CopyError::failed(first.dst, first.len, e))?;
        let tiles: Vec<GatherEntry> = gather_tiles(copies, GATHER_TILE);
        let bytes = std::mem::size_of_val(tiles.as_slice());
        let mut scratch = self.scratch.lock();
        let list = scratch_buffer(self.driver, &mut scratch.list, bytes as u64).map_err(fail)?;
        // SAFETY: tiles lives until the wait below; list has room for it (just sized).
        let rc = unsafe {
            (self.driver.memcpy_htod_async)(list, tiles.as_ptr().cast(), bytes, self.stream())
        };
        self.driver
            .check("cuMemcpyHtoDAsync_v2", rc)
            // SAFETY: every entry lies in a tracked, fenced allocation or our shadow (the
            // snapshot's pieces), both live until the wait.
            .and_then(|()| unsafe {
                kernels.gather(self.driver, self.stream(), list, tiles.len() as u64)
            })
            .and_then(|()| self.sync_timed(waited))
            .map_err(|e| {
                let _ = self.sync();
                fail(e)
            })
    }

    /// The device copies that do `writes` (merged host-to-device writes) by reading their
    /// sources through the device addresses of registered host ranges, or `None` when a source
    /// lies outside every such range.
    fn mapped_copies(&self, writes: &[(u64, *const u8, usize)]) -> Option<Vec<DeviceCopy>> {
        let mapped = self.mapped.lock();
        let mut last: Option<(usize, usize, CuDevicePtr)> = None;
        writes
            .iter()
            .map(|&(addr, ptr, len)| {
                let p = ptr as usize;
                let inside = |m: &(usize, usize, CuDevicePtr)| p >= m.0 && p + len <= m.0 + m.1;
                let m = match last.filter(inside) {
                    Some(m) => m,
                    None => *mapped.iter().find(|m| inside(m))?,
                };
                last = Some(m);
                Some(DeviceCopy {
                    dst: addr,
                    src: m.2 + (p - m.0) as u64,
                    len: len as u64,
                })
            })
            .collect()
    }

    /// Make the context current on this (possibly worker) thread.
    fn enter(&self) -> Result<Guard, CuError> {
        let guard = Guard::enter();
        // SAFETY: the context of this memory; contexts kreplay replays on are primary contexts
        // that live until the process tears CUDA down.
        unsafe { self.driver.make_current(self.context()) }?;
        Ok(guard)
    }

    fn sync(&self) -> Result<(), CuError> {
        // SAFETY: our own stream, alive as long as self.
        self.driver.check("cuStreamSynchronize", unsafe {
            (self.driver.stream_synchronize)(self.stream())
        })
    }

    /// Free the kept shadow (the application is allocating: leave it the memory). Returns the
    /// bytes given back.
    pub fn release_kept_shadow(&self) -> u64 {
        let Some(shadow) = self.kept.lock().take() else {
            return 0;
        };
        if let Ok(_guard) = self.enter() {
            // SAFETY: the shadow was allocated by cuMemAlloc in this context and is not in use
            // (it is not lent to a snapshot).
            unsafe { (self.driver.mem_free)(shadow.addr) };
        }
        shadow.size
    }

    /// The allocation `[start, end)` holding `a`: kreplay's lent shadow, or a tracked
    /// allocation. (Called while the snapshot holds the inventory's copy fence, so no free can
    /// intervene.)
    fn allocation_of(&self, a: u64) -> Option<(u64, u64)> {
        if let Some(s) = *self.lent.lock()
            && a >= s.addr
            && a - s.addr < s.size
        {
            return Some((s.addr, s.addr + s.size));
        }
        self.inventory.lookup(a).map(|al| (al.base, al.end()))
    }

    /// Bytes of device memory kreplay holds now (kept and lent shadows).
    pub fn shadow_bytes(&self) -> u64 {
        self.kept.lock().map_or(0, |s| s.size) + self.lent.lock().map_or(0, |s| s.size)
    }

    /// What this memory's calls have cost on the host so far.
    pub fn times(&self) -> MemoryTimes {
        let t = &self.times;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        MemoryTimes {
            copies: l(&t.copies),
            copy_ns: l(&t.copy_ns),
            copy_wait_ns: l(&t.copy_wait_ns),
            verified: l(&t.verified),
            verified_ns: l(&t.verified_ns),
            verified_wait_ns: l(&t.verified_wait_ns),
            lists_uploaded: l(&t.lists_uploaded),
            hashes: l(&t.hashes),
            hash_ns: l(&t.hash_ns),
            hash_wait_ns: l(&t.hash_wait_ns),
            shadow_allocs: l(&t.shadow_allocs),
            shadow_alloc_ns: l(&t.shadow_alloc_ns),
        }
    }

    /// Wait for kreplay's stream, adding the wait to `counter`.
    fn sync_timed(&self, counter: &AtomicU64) -> Result<(), CuError> {
        let start = Instant::now();
        let r = self.sync();
        add(counter, since(start));
        r
    }
}

impl Drop for CudaMemory {
    fn drop(&mut self) {
        self.release_kept_shadow();
        if let Ok(_guard) = self.enter() {
            let scratch = std::mem::take(&mut *self.scratch.lock());
            let all = [
                scratch.list,
                scratch.hashes,
                scratch.snap,
                scratch.bits,
                scratch.found,
                scratch.tiles,
                scratch.vlist,
            ];
            for s in all.into_iter().flatten() {
                // SAFETY: our scratch allocations, no longer used.
                unsafe { (self.driver.mem_free)(s.addr) };
            }
            let mut readback = scratch.readback;
            if let Some(p) = readback.take() {
                free_pinned(self.driver, p.addr);
            }
            if let Some(Ok(k)) = self.kernels.get() {
                // SAFETY: our module; nothing of it runs any more.
                unsafe { (self.driver.module_unload)(k.module()) };
            }
            // SAFETY: our own stream, no longer used by anyone.
            unsafe { (self.driver.stream_destroy)(self.stream()) };
        }
    }
}

impl DeviceMemory for CudaMemory {
    fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), CopyError> {
        let len = dst.len() as u64;
        let _guard = self.enter().map_err(|e| failed(addr, len, e))?;
        // SAFETY: dst is a live host buffer of dst.len() bytes; addr..addr+len is a tracked
        // device allocation the caller keeps alive (inventory fence); we wait for the copy below.
        let rc = unsafe {
            (self.driver.memcpy_dtoh_async)(
                dst.as_mut_ptr().cast::<c_void>(),
                addr,
                dst.len(),
                self.stream(),
            )
        };
        self.driver
            .check("cuMemcpyDtoHAsync_v2", rc)
            .and_then(|()| self.sync())
            .map_err(|e| failed(addr, len, e))
    }

    fn write(&self, addr: u64, src: &[u8]) -> Result<(), CopyError> {
        self.write_batch(&[ChunkWrite { addr, data: src }])
    }

    fn capabilities(&self) -> Capabilities {
        // Offered only where the configuration asks for it (`set_hash_on_device`): `auto` keeps
        // full copies of device shadows (see `choice::hash_on_device_for`).
        let on = self.hash_on_device.load(Ordering::Relaxed);
        let (device_hash, verified_restore) = match on.then(|| self.enter()) {
            Some(Ok(_guard)) => self
                .kernels()
                .map_or((false, false), |k| (true, k.has_restore_verified())),
            _ => (false, false),
        };
        Capabilities::NONE
            .with_device_hash(device_hash)
            .with_batched_writes(true)
            .with_verified_restore(verified_restore)
    }

    fn hash_chunks(
        &self,
        addr: u64,
        len: u64,
        chunk_size: u64,
        out: &mut [u64],
    ) -> Result<(), CopyError> {
        if chunk_size == 0 || out.len() as u64 != len.div_ceil(chunk_size) {
            return Err(CopyError::failed(
                addr,
                len,
                format!(
                    "hash of {len} bytes in {chunk_size}-byte chunks into {} hashes",
                    out.len()
                ),
            ));
        }
        self.hash_chunk_ranges(
            &[HashRange {
                addr,
                len,
                first: 0,
            }],
            chunk_size,
            out,
        )
    }

    fn hash_chunk_ranges(
        &self,
        ranges: &[HashRange],
        chunk_size: u64,
        out: &mut [u64],
    ) -> Result<(), CopyError> {
        let Some(first) = ranges.iter().find(|r| r.len > 0) else {
            return Ok(());
        };
        let fail = |e: CuError| failed(first.addr, first.len, e);
        if chunk_size == 0 {
            return Err(CopyError::failed(first.addr, first.len, "chunk size 0"));
        }
        // The output span the ranges cover, checked against `out`.
        let mut span = (usize::MAX, 0usize);
        for r in ranges.iter().filter(|r| r.len > 0) {
            let end = r.first + r.len.div_ceil(chunk_size) as usize;
            if end > out.len() {
                return Err(CopyError::failed(
                    r.addr,
                    r.len,
                    format!("hashes up to {end} into {} entries", out.len()),
                ));
            }
            span = (span.0.min(r.first), span.1.max(end));
        }
        let (lo, hi) = span;
        let triples: Vec<(u64, u64, u64)> = ranges
            .iter()
            .map(|r| (r.addr, r.len, (r.first - lo) as u64))
            .collect();
        let start = Instant::now();
        let (entries, work) = hash_entries(&triples, chunk_size);
        let _guard = self.enter().map_err(fail)?;
        let kernels = self
            .kernels()
            .map_err(|e| CopyError::failed(first.addr, first.len, e))?;
        // Last chunks short enough for xxh3's short-input paths are hashed here.
        // (index in out, device address, bytes)
        let mut tails: Vec<(usize, u64, Vec<u8>)> = entries
            .iter()
            .filter_map(|e| {
                let n = e.len.div_ceil(chunk_size);
                let start = (n - 1) * chunk_size;
                (e.len - start < HASH_DEVICE_MIN_LEN).then(|| {
                    (
                        lo + e.out_first as usize + n as usize - 1,
                        e.addr + start,
                        vec![0u8; (e.len - start) as usize],
                    )
                })
            })
            .collect();
        let list_bytes = std::mem::size_of_val(entries.as_slice());
        let out_bytes = (hi - lo) * 8;
        let mut scratch = self.scratch.lock();
        let dev_list =
            scratch_buffer(self.driver, &mut scratch.list, list_bytes as u64).map_err(fail)?;
        let dev_out =
            scratch_buffer(self.driver, &mut scratch.hashes, out_bytes as u64).map_err(fail)?;
        // The hashes, then the tails, come back into page-locked memory where the driver
        // gives some (one staging-free copy each instead of the driver's pageable path).
        let tail_bytes: usize = tails.iter().map(|t| t.2.len()).sum();
        let pinned = readback_buffer(self.driver, &mut scratch.readback, out_bytes + tail_bytes);
        let host_out = &mut out[lo..hi];
        let out_to = pinned.map_or(host_out.as_mut_ptr().cast::<c_void>(), |p| p as *mut c_void);
        let mut tail_at = out_bytes;
        let tail_to: Vec<*mut c_void> = tails
            .iter_mut()
            .map(|(_, _, bytes)| match pinned {
                Some(p) => {
                    let to = (p + tail_at) as *mut c_void;
                    tail_at += bytes.len();
                    to
                }
                None => bytes.as_mut_ptr().cast(),
            })
            .collect();
        // SAFETY: every range is a tracked allocation fenced by the inventory (or our shadow);
        // dev_list and dev_out were just sized for the list and the span; entries, host_out,
        // the tails and the pinned buffer (sized for the span and the tails) live until the
        // wait below.
        let queued = unsafe {
            self.driver
                .check(
                    "cuMemcpyHtoDAsync_v2",
                    (self.driver.memcpy_htod_async)(
                        dev_list,
                        entries.as_ptr().cast(),
                        list_bytes,
                        self.stream(),
                    ),
                )
                .and_then(|()| {
                    kernels.hash(
                        self.driver,
                        self.stream(),
                        dev_list,
                        entries.len() as u64,
                        work,
                        chunk_size,
                        dev_out,
                    )
                })
                .and_then(|()| {
                    self.driver.check(
                        "cuMemcpyDtoHAsync_v2",
                        (self.driver.memcpy_dtoh_async)(out_to, dev_out, out_bytes, self.stream()),
                    )
                })
                .and_then(|()| {
                    tails
                        .iter()
                        .zip(&tail_to)
                        .try_for_each(|((_, at, bytes), &to)| {
                            self.driver.check(
                                "cuMemcpyDtoHAsync_v2",
                                (self.driver.memcpy_dtoh_async)(
                                    to,
                                    *at,
                                    bytes.len(),
                                    self.stream(),
                                ),
                            )
                        })
                })
        };
        let waited = self.sync_timed(&self.times.hash_wait_ns);
        if let (Ok(()), Ok(()), Some(p)) = (&queued, &waited, pinned) {
            // SAFETY: the stream just waited for copied the span's hashes to p and each tail
            // to its place after them; none of it overlaps host_out or the tails' vectors.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    p as *const u8,
                    host_out.as_mut_ptr().cast::<u8>(),
                    out_bytes,
                );
                for ((_, _, bytes), &from) in tails.iter_mut().zip(&tail_to) {
                    std::ptr::copy_nonoverlapping(
                        from as *const u8,
                        bytes.as_mut_ptr(),
                        bytes.len(),
                    );
                }
            }
        }
        add(&self.times.hashes, 1);
        add(&self.times.hash_ns, since(start));
        queued.and(waited).map_err(fail)?;
        for (index, _, bytes) in tails {
            out[index] = xxh3_64(&bytes);
        }
        Ok(())
    }

    fn restore_verified(
        &self,
        job: &VerifiedRestore<'_>,
        changed: &mut [u64],
    ) -> Result<(), CopyError> {
        let Some(first) = job.ranges.iter().find(|r| r.len > 0) else {
            return Ok(());
        };
        let start = Instant::now();
        let fail = |e: CuError| failed(first.addr, first.len, e);
        let cs = job.chunk_size;
        let chunks = job.hashes.len();
        if cs == 0 || changed.len() != chunks.div_ceil(64) {
            return Err(CopyError::failed(
                first.addr,
                first.len,
                format!(
                    "verified restore of {chunks} chunks of {cs} bytes with {} bitmap words",
                    changed.len()
                ),
            ));
        }
        for r in job.ranges.iter().filter(|r| r.len > 0) {
            if r.first + r.len.div_ceil(cs) as usize > chunks {
                return Err(CopyError::failed(r.addr, r.len, "range past the hashes"));
            }
        }
        // The store's device address: the shadow, or the device mapping of the pinned store.
        let (store, on_device) = match job.store {
            StoreBytes::Device(addr) => (addr, true),
            StoreBytes::Host(bytes) => {
                let p = bytes.as_ptr() as usize;
                let mapped = self.mapped.lock();
                let Some(m) = mapped
                    .iter()
                    .find(|m| p >= m.0 && p + bytes.len() <= m.0 + m.1)
                else {
                    return Err(CopyError::Unsupported);
                };
                (m.2 + (p - m.0) as u64, false)
            }
        };
        let _guard = self.enter().map_err(fail)?;
        let kernels = match self.kernels() {
            Ok(k) if k.has_restore_verified() => k,
            _ => return Err(CopyError::Unsupported),
        };
        let mut scratch = self.scratch.lock();
        // The host lists, built in memory kept from the last restore (given back below).
        let mut entries = std::mem::take(&mut scratch.entries);
        let mut set = std::mem::take(&mut scratch.set);
        let mut merged = std::mem::take(&mut scratch.merged);
        let mut set_tiles = std::mem::take(&mut scratch.set_tiles);
        let work = restore_entries_into(
            &mut entries,
            job.ranges
                .iter()
                .filter(|r| !r.write)
                .map(|r| (r.addr, store + r.store_offset, r.len, r.first as u64)),
            cs,
        );
        // The learned write set: copied from the store unhashed, on the same stream.
        set.clear();
        set.extend(job.ranges.iter().filter(|r| r.write).map(|r| DeviceCopy {
            dst: r.addr,
            src: store + r.store_offset,
            len: r.len,
        }));
        let ranges = AllocationCache::new(|a| self.allocation_of(a));
        coalesce_copies_into(&mut merged, &set, |a, b| ranges.same(a, b));
        // Few whole copies between device allocations go to the copy engine; the rest (and any
        // read from the pinned host store through its mapping) to one gather launch.
        if on_device && !use_gather(merged.len()) {
            set_tiles.clear();
        } else {
            gather_tiles_into(&mut set_tiles, &merged, GATHER_TILE);
        }
        let list_bytes = std::mem::size_of_val(entries.as_slice());
        let snap_bytes = std::mem::size_of_val(job.hashes);
        // The bitmap, then the number of copies found (zeroed on the device below).
        let bits_bytes = std::mem::size_of_val(&*changed);
        let found_bytes = work * std::mem::size_of::<GatherEntry>() as u64;
        let tiles_bytes = std::mem::size_of_val(set_tiles.as_slice());
        let mut buffer = |slot: fn(&mut Scratch) -> &mut Option<Shadow>, n: u64| {
            scratch_buffer(self.driver, slot(&mut scratch), n).map_err(fail)
        };
        let dev_list = buffer(|s| &mut s.vlist, list_bytes as u64)?;
        let dev_bits = buffer(|s| &mut s.bits, (bits_bytes + 8) as u64)?;
        let dev_found = buffer(|s| &mut s.found, found_bytes)?;
        let dev_tiles = buffer(|s| &mut s.tiles, tiles_bytes as u64)?;
        let had = scratch.snap.map(|s| s.addr);
        let dev_snap =
            scratch_buffer(self.driver, &mut scratch.snap, snap_bytes as u64).map_err(fail)?;
        // The bitmap comes back into page-locked memory where the driver gives some.
        let pinned = readback_buffer(self.driver, &mut scratch.readback, bits_bytes);
        // The snapshot's hashes go to the device once per snapshot (and after a regrowth).
        let upload_hashes = scratch.snap_id != job.snapshot_id || had != Some(dev_snap);
        scratch.snap_id = 0;
        let htod = |dst: CuDevicePtr, src: *const c_void, n: usize| {
            if n == 0 {
                return Ok(());
            }
            // SAFETY: src is a live host buffer of n bytes until the wait below; dst is a
            // scratch buffer just sized for it.
            let rc = unsafe { (self.driver.memcpy_htod_async)(dst, src, n, self.stream()) };
            self.driver.check("cuMemcpyHtoDAsync_v2", rc)
        };
        let dev_count = dev_bits + bits_bytes as u64;
        // The lists go up only when they differ from what the buffers hold: between two
        // relearnings of the write set every restore of a snapshot hands over the same ones.
        let s = &mut *scratch;
        let named = |b: &Option<Shadow>| b.map_or((0, 0), |b| (b.addr, b.size));
        let (list_at, tiles_at) = (named(&s.vlist), named(&s.tiles));
        let send_entries = upload_needed(
            &mut s.sent_entries,
            &mut s.sent_entries_at,
            &entries,
            list_at,
        );
        let send_tiles = upload_needed(
            &mut s.sent_tiles,
            &mut s.sent_tiles_at,
            &set_tiles,
            tiles_at,
        );
        if send_entries || send_tiles {
            add(&self.times.lists_uploaded, 1);
        }
        let queued = (if send_entries {
            htod(dev_list, entries.as_ptr().cast(), list_bytes)
        } else {
            Ok(())
        })
        .and_then(|()| {
            if upload_hashes && work > 0 {
                htod(dev_snap, job.hashes.as_ptr().cast(), snap_bytes)
            } else {
                Ok(())
            }
        })
        .and_then(|()| {
            // SAFETY: dev_bits is a scratch buffer of bits_bytes + 8 bytes (sized above).
            let rc = unsafe {
                (self.driver.memset_d8_async)(dev_bits, 0, bits_bytes + 8, self.stream())
            };
            self.driver.check("cuMemsetD8Async", rc)
        })
        .and_then(|()| {
            if send_tiles {
                htod(dev_tiles, set_tiles.as_ptr().cast(), tiles_bytes)
            } else {
                Ok(())
            }
        })
        .and_then(|()| {
            if work == 0 {
                return Ok(());
            }
            // SAFETY: every live range is a tracked allocation fenced by the inventory and
            // every source lies in the snapshot's store (our shadow, or the pinned store
            // mapped by register_host), both alive until the wait; the scratch buffers were
            // sized above (the found list for one copy per chunk).
            unsafe {
                kernels.restore_verified(
                    self.driver,
                    self.stream(),
                    dev_list,
                    entries.len() as u64,
                    work,
                    cs,
                    dev_snap,
                    dev_bits,
                    dev_found,
                    dev_count,
                )
            }
        })
        .and_then(|()| {
            if !set_tiles.is_empty() {
                // SAFETY: the tiles (uploaded above) lie in fenced allocations and the
                // store, alive until the wait.
                return unsafe {
                    kernels.gather(
                        self.driver,
                        self.stream(),
                        dev_tiles,
                        set_tiles.len() as u64,
                    )
                };
            }
            merged.iter().try_for_each(|c| {
                // SAFETY: a fenced allocation and our shadow, both device memory of this
                // context, alive until the wait.
                let rc = unsafe {
                    (self.driver.memcpy_dtod_async)(c.dst, c.src, c.len as usize, self.stream())
                };
                self.driver.check("cuMemcpyDtoDAsync_v2", rc)
            })
        })
        .and_then(|()| {
            let to = pinned.map_or(changed.as_mut_ptr().cast::<c_void>(), |p| p as *mut c_void);
            // SAFETY: `to` is the pinned buffer (at least bits_bytes, kept in the scratch) or
            // changed (bits_bytes), live until the wait below.
            let rc =
                unsafe { (self.driver.memcpy_dtoh_async)(to, dev_bits, bits_bytes, self.stream()) };
            self.driver.check("cuMemcpyDtoHAsync_v2", rc)
        });
        let waited = self.sync_timed(&self.times.verified_wait_ns);
        if let (Ok(()), Ok(()), Some(p)) = (&queued, &waited, pinned) {
            // SAFETY: the pinned buffer holds bits_bytes of the bitmap, copied there by the
            // stream just waited for; it does not overlap changed.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    p as *const u8,
                    changed.as_mut_ptr().cast::<u8>(),
                    bits_bytes,
                )
            };
        }
        scratch.entries = entries;
        scratch.set = set;
        scratch.merged = merged;
        scratch.set_tiles = set_tiles;
        add(&self.times.verified, 1);
        add(&self.times.verified_ns, since(start));
        if let Err(e) = queued.and(waited) {
            let s = &mut *scratch;
            forget_upload(&mut s.sent_entries, &mut s.sent_entries_at);
            forget_upload(&mut s.sent_tiles, &mut s.sent_tiles_at);
            return Err(fail(e));
        }
        scratch.snap_id = job.snapshot_id;
        Ok(())
    }

    fn alloc_shadow(&self, _agent: u64, size: u64) -> Option<u64> {
        if !self.shadows || size == 0 {
            return None;
        }
        let _guard = self.enter().ok()?;
        let mut kept = self.kept.lock();
        if let Some(shadow) = kept.take_if(|s| s.size >= size) {
            *self.lent.lock() = Some(shadow);
            return Some(shadow.addr);
        }
        let start = Instant::now();
        // Too small (or none): free it before measuring what is free.
        if let Some(old) = kept.take() {
            // SAFETY: a shadow of ours, not lent.
            unsafe { (self.driver.mem_free)(old.addr) };
        }
        let (free, total) = self.driver.mem_info().ok()?;
        if !self.budget.allows(size, free, total) {
            return None;
        }
        let mut addr: CuDevicePtr = 0;
        // SAFETY: allocates in the current context (ours) and writes the address.
        let rc = unsafe { (self.driver.mem_alloc)(&mut addr, size as usize) };
        add(&self.times.shadow_allocs, 1);
        add(&self.times.shadow_alloc_ns, since(start));
        self.driver.check("cuMemAlloc_v2", rc).ok()?;
        *self.lent.lock() = Some(Shadow { addr, size });
        Some(addr)
    }

    fn free_shadow(&self, addr: u64, _size: u64) {
        let mut lent = self.lent.lock();
        match *lent {
            Some(shadow) if shadow.addr == addr => {
                *lent = None;
                // Keep it for the next snapshot; the application's next allocation frees it.
                let mut kept = self.kept.lock();
                if let Some(old) = kept.replace(shadow)
                    && let Ok(_guard) = self.enter()
                {
                    // SAFETY: an older kept shadow of ours, not lent.
                    unsafe { (self.driver.mem_free)(old.addr) };
                }
            }
            _ => {
                if let Ok(_guard) = self.enter() {
                    // SAFETY: the snapshot hands back only addresses alloc_shadow gave out.
                    unsafe { (self.driver.mem_free)(addr) };
                }
            }
        }
    }

    fn copy_on_device(&self, copies: &[DeviceCopy]) -> Result<(), CopyError> {
        let Some(first) = copies.first() else {
            return Ok(());
        };
        let start = Instant::now();
        let _guard = self.enter().map_err(|e| failed(first.dst, first.len, e))?;
        let ranges = AllocationCache::new(|a| self.allocation_of(a));
        let merged = coalesce_copies(copies, |a, b| ranges.same(a, b));
        let done = |r| {
            add(&self.times.copies, 1);
            add(&self.times.copy_ns, since(start));
            r
        };
        if use_gather(merged.len()) && self.kernels().is_ok() {
            return done(self.gather(&merged, &self.times.copy_wait_ns));
        }
        for c in merged {
            // SAFETY: both ranges are live device memory of this context (a tracked allocation
            // fenced by the inventory, and our shadow); the stream is waited for below.
            let rc = unsafe {
                (self.driver.memcpy_dtod_async)(c.dst, c.src, c.len as usize, self.stream())
            };
            if let Err(e) = self.driver.check("cuMemcpyDtoDAsync_v2", rc) {
                let _ = self.sync();
                return done(Err(failed(c.dst, c.len, e)));
            }
        }
        let waited = self.sync_timed(&self.times.copy_wait_ns);
        done(waited.map_err(|e| failed(first.dst, first.len, e)))
    }

    fn write_batch(&self, writes: &[ChunkWrite<'_>]) -> Result<(), CopyError> {
        let Some(first) = writes.first() else {
            return Ok(());
        };
        let _guard = self
            .enter()
            .map_err(|e| failed(first.addr, first.data.len() as u64, e))?;
        let ranges = AllocationCache::new(|a| self.allocation_of(a));
        let merged = coalesce_writes(writes, |a, b| ranges.same(a, b));
        // Many scattered writes from a device-mapped (pinned) store: one gather launch whose
        // blocks read the store over the link, instead of one copy call per write (each costs a
        // few microseconds of driver time, more than moving a 64 KiB chunk).
        if use_gather(merged.len())
            && self.kernels().is_ok()
            && let Some(copies) = self.mapped_copies(&merged)
        {
            // Host-tier writes: their wait is not one of the counted copies'.
            return self.gather(&copies, &AtomicU64::new(0));
        }
        for (addr, ptr, len) in merged {
            // SAFETY: ptr..ptr+len spans host buffers of the list that continue each other
            // (checked by coalesce_writes), all alive (the snapshot store) until the wait below;
            // the destination is a tracked, fenced device allocation.
            let rc = unsafe {
                (self.driver.memcpy_htod_async)(addr, ptr.cast::<c_void>(), len, self.stream())
            };
            if let Err(e) = self.driver.check("cuMemcpyHtoDAsync_v2", rc) {
                let _ = self.sync();
                return Err(failed(addr, len as u64, e));
            }
        }
        self.sync()
            .map_err(|e| failed(first.addr, first.data.len() as u64, e))
    }

    fn register_host(&self, ptr: *const u8, len: usize) -> bool {
        let Ok(_guard) = self.enter() else {
            return false;
        };
        // SAFETY: ptr..ptr+len is the snapshot's host mapping, alive until unregister_host.
        let rc = unsafe {
            (self.driver.mem_host_register)(
                ptr as *mut c_void,
                len,
                CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP,
            )
        };
        if rc != crate::driver::CUDA_SUCCESS {
            return false;
        }
        let mut dev: CuDevicePtr = 0;
        // SAFETY: ptr was just registered with DEVICEMAP; the driver writes its device address.
        let rc =
            unsafe { (self.driver.mem_host_get_device_pointer)(&mut dev, ptr as *mut c_void, 0) };
        if rc == crate::driver::CUDA_SUCCESS && dev != 0 {
            self.mapped.lock().push((ptr as usize, len, dev));
        }
        true
    }

    fn unregister_host(&self, ptr: *const u8, _len: usize) {
        self.mapped.lock().retain(|m| m.0 != ptr as usize);
        if let Ok(_guard) = self.enter() {
            // SAFETY: ptr was registered by register_host and is still mapped.
            unsafe { (self.driver.mem_host_unregister)(ptr as *mut c_void) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restore_list_goes_to_the_device_again_only_when_it_or_its_buffer_changed() {
        let mut sent: Vec<u64> = Vec::new();
        let mut at = (0, 0);
        let list = [1u64, 2, 3];
        // The first restore uploads; the next with the same list into the same buffer not.
        assert!(upload_needed(&mut sent, &mut at, &list, (0x1000, 4096)));
        assert!(!upload_needed(&mut sent, &mut at, &list, (0x1000, 4096)));
        // Another list (the learned set grew), another buffer, a regrown buffer at the same
        // address: each uploads once.
        assert!(upload_needed(
            &mut sent,
            &mut at,
            &[1, 2, 4],
            (0x1000, 4096)
        ));
        assert!(!upload_needed(
            &mut sent,
            &mut at,
            &[1, 2, 4],
            (0x1000, 4096)
        ));
        assert!(upload_needed(
            &mut sent,
            &mut at,
            &[1, 2, 4],
            (0x2000, 4096)
        ));
        assert!(upload_needed(
            &mut sent,
            &mut at,
            &[1, 2, 4],
            (0x2000, 8192)
        ));
        assert!(!upload_needed(
            &mut sent,
            &mut at,
            &[1, 2, 4],
            (0x2000, 8192)
        ));
        // A failed upload leaves the buffer unknown: the same list goes again.
        forget_upload(&mut sent, &mut at);
        assert!(upload_needed(
            &mut sent,
            &mut at,
            &[1, 2, 4],
            (0x2000, 8192)
        ));
        // No buffer yet (address 0) always uploads.
        let mut none = (0, 0);
        let mut empty: Vec<u64> = Vec::new();
        assert!(upload_needed(&mut empty, &mut none, &[], (0, 0)));
        assert!(upload_needed(&mut empty, &mut none, &[], (0, 0)));
    }

    #[test]
    fn results_come_back_into_one_kept_pinned_buffer_regrown_only_when_too_small() {
        use std::cell::RefCell;
        let allocs = RefCell::new(Vec::new());
        let frees = RefCell::new(Vec::new());
        let mut next = 0x10_0000usize;
        let mut alloc = |n: usize| {
            allocs.borrow_mut().push(n);
            next += 0x10_0000;
            Some(next)
        };
        let mut slot = PinnedSlot::default();
        // The first read-back allocates (a power of two, at least 4 KiB); later ones that fit
        // reuse it without asking the driver again.
        let a = slot.get(100, &mut alloc, |p| frees.borrow_mut().push(p));
        assert_eq!(a, Some(0x20_0000));
        for n in [1, 100, 4096] {
            assert_eq!(slot.get(n, &mut alloc, |p| frees.borrow_mut().push(p)), a);
        }
        assert_eq!(*allocs.borrow(), [4096]);
        // A larger one frees the old buffer first, then allocates the next power of two.
        let b = slot.get(5000, &mut alloc, |p| frees.borrow_mut().push(p));
        assert_eq!(b, Some(0x30_0000));
        assert_eq!(*allocs.borrow(), [4096, 8192]);
        assert_eq!(*frees.borrow(), [0x20_0000]);
        // Teardown gets the live buffer, once.
        assert_eq!(
            slot.take(),
            Some(Pinned {
                addr: 0x30_0000,
                size: 8192
            })
        );
        assert_eq!(slot.take(), None);
    }

    #[test]
    fn a_refused_pinned_buffer_reads_back_into_pageable_memory_from_then_on() {
        let mut asked = 0;
        let mut slot = PinnedSlot::default();
        let mut refuse = |_| {
            asked += 1;
            None
        };
        assert_eq!(
            slot.get(64, &mut refuse, |_| panic!("nothing to free")),
            None
        );
        assert_eq!(
            slot.get(64, &mut refuse, |_| panic!("nothing to free")),
            None
        );
        // The driver is asked once: a process short of page-locked memory is not asked at
        // every restore.
        assert_eq!(asked, 1);
        // A null address is a refusal too.
        let mut slot = PinnedSlot::default();
        assert_eq!(slot.get(64, |_| Some(0), |_| {}), None);
        assert_eq!(slot.take(), None);
    }

    #[test]
    fn contiguous_copies_merge_and_others_stay_apart() {
        let c = |dst, src, len| DeviceCopy { dst, src, len };
        let anywhere = |_, _| true;
        let merged = coalesce_copies(
            &[
                c(0x1000, 0x9000, 0x100),
                c(0x1100, 0x9100, 0x100),
                c(0x1200, 0x9200, 0x0),
                c(0x1200, 0x9200, 0x200),
                // destination continues, source does not
                c(0x1400, 0xa000, 0x100),
                // gap in the destination
                c(0x2000, 0xa100, 0x100),
            ],
            anywhere,
        );
        assert_eq!(
            merged,
            [
                c(0x1000, 0x9000, 0x400),
                c(0x1400, 0xa000, 0x100),
                c(0x2000, 0xa100, 0x100)
            ]
        );
        assert!(coalesce_copies(&[], anywhere).is_empty());
    }

    #[test]
    fn copies_never_merge_across_adjacent_allocations() {
        // Two allocations back to back in the address space, copied into one shadow: the
        // driver rejects a copy that spans both, so they must stay two copies.
        let allocations = [(0x1000u64, 0x1000u64), (0x2000, 0x1000)];
        let same = |a: u64, b: u64| {
            let which = |x: u64| allocations.iter().position(|&(s, l)| x >= s && x < s + l);
            (0x9000..0xb000).contains(&a) && (0x9000..0xb000).contains(&b)
                || which(a).is_some() && which(a) == which(b)
        };
        let c = |dst, src, len| DeviceCopy { dst, src, len };
        let pieces = [
            c(0x9000, 0x1000, 0x800),
            c(0x9800, 0x1800, 0x800),
            c(0xa000, 0x2000, 0x1000),
        ];
        assert_eq!(
            coalesce_copies(&pieces, same),
            [c(0x9000, 0x1000, 0x1000), c(0xa000, 0x2000, 0x1000)]
        );
        let store = vec![0u8; 0x2000];
        let writes = [
            ChunkWrite {
                addr: 0x1000,
                data: &store[..0x1000],
            },
            ChunkWrite {
                addr: 0x2000,
                data: &store[0x1000..],
            },
        ];
        assert_eq!(coalesce_writes(&writes, same).len(), 2);
    }

    #[test]
    fn allocation_cache_looks_each_allocation_up_once_and_keeps_neighbours_apart() {
        let allocations = [(0x1000u64, 0x2000u64), (0x2000, 0x3000), (0x9000, 0xb000)];
        let lookups = std::cell::Cell::new(0);
        let cache = AllocationCache::new(|a| {
            lookups.set(lookups.get() + 1);
            allocations.iter().copied().find(|&(s, e)| a >= s && a < e)
        });
        // A thousand pieces of one allocation and of the shadow: two lookups.
        for i in 0..1000u64 {
            assert!(cache.same(0x1000 + i, 0x1000 + i + 1));
            assert!(cache.same(0x9000 + 2 * i, 0x9000 + 2 * i + 2));
        }
        assert_eq!(lookups.get(), 2);
        // Adjacent allocations are still two.
        assert!(!cache.same(0x1fff, 0x2000));
        assert!(cache.same(0x2000, 0x2fff));
        // Untracked memory belongs to no allocation.
        assert!(!cache.same(0x5000, 0x5001));
        // A range is never remembered past its end.
        assert!(!cache.same(0xafff, 0xb000));
    }

    #[test]
    fn writes_merge_only_when_host_and_device_ranges_both_continue() {
        let store = vec![7u8; 4096];
        let w = |addr, from: usize, to: usize| ChunkWrite {
            addr,
            data: &store[from..to],
        };
        let merged = coalesce_writes(
            &[
                w(0x10000, 0, 1024),
                w(0x10400, 1024, 2048),
                // device continues, host jumps
                w(0x10800, 3072, 4096),
                // host continues, device jumps
                w(0x20000, 0, 512),
            ],
            |_, _| true,
        );
        let base = store.as_ptr();
        assert_eq!(
            merged,
            [
                (0x10000, base, 2048),
                (0x10800, base.wrapping_add(3072), 1024),
                (0x20000, base, 512)
            ]
        );
    }

    #[test]
    fn shadow_budget_leaves_the_larger_of_the_minimum_and_the_fraction_free() {
        let gib = 1u64 << 30;
        let budget = ShadowBudget::default();
        // 141 GB device: 10% (14 GiB) beats the 2 GiB minimum.
        let total = 141 * gib;
        assert_eq!(budget.headroom(total), total / 100 * 10);
        assert!(budget.allows(gib, 100 * gib, total));
        assert!(!budget.allows(90 * gib, 100 * gib, total));
        // Small device: the 2 GiB minimum applies.
        assert_eq!(budget.headroom(8 * gib), 2 * gib);
        assert!(budget.allows(gib, 3 * gib, 8 * gib));
        assert!(!budget.allows(gib + 1, 3 * gib, 8 * gib));
        // No overflow on absurd sizes.
        assert!(!budget.allows(u64::MAX, u64::MAX, total));
    }
}

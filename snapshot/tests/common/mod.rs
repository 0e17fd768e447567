//! A test device: buffers of host memory at synthetic device addresses, with switches for every
//! optional capability, failure injection and counters of what the snapshot asked it to do.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use kreplay_snapshot::*;
use parking_lot::{Mutex, RwLock};

/// Which optional capabilities the test device offers.
#[derive(Clone, Copy, Debug, Default)]
pub struct Caps {
    pub host_visible: bool,
    pub shadow: bool,
    pub device_hash: bool,
    pub batched: bool,
    pub pin: bool,
    /// `restore_verified` (needs `device_hash`'s hashes too).
    pub verified_restore: bool,
}

impl Caps {
    pub fn all() -> Self {
        Caps {
            host_visible: true,
            shadow: true,
            device_hash: true,
            batched: true,
            pin: true,
            verified_restore: true,
        }
    }
}

#[derive(Default)]
pub struct Counters {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub bytes_written: AtomicU64,
    pub batches: AtomicU64,
    pub device_copies: AtomicU64,
    pub hash_calls: AtomicU64,
    /// `hash_chunk_ranges` calls (each also counts its ranges in `hash_calls`).
    pub hash_batches: AtomicU64,
    pub windows: AtomicU64,
    pub registers: AtomicU64,
    pub unregisters: AtomicU64,
    pub shadows_live: AtomicU64,
    /// `restore_verified` calls that did the restore.
    pub verified_restores: AtomicU64,
}

pub struct TestDevice {
    pub caps: Caps,
    /// Buffers by device address. Each buffer is a boxed slice that never moves while it lives.
    mem: RwLock<BTreeMap<u64, Mutex<Box<[u8]>>>>,
    next_addr: AtomicU64,
    pub fail_reads: AtomicBool,
    pub fail_writes: AtomicBool,
    /// `restore_verified` fails after writing its first changed chunk.
    pub fail_verified: AtomicBool,
    /// `restore_verified` refuses host stores (`Unsupported`), as a device that cannot read
    /// an unpinned store does.
    pub verified_device_stores_only: AtomicBool,
    pub counters: Counters,
    /// Called at the start of every write (used to hold a restore inside a write).
    pub on_write: Mutex<Option<Box<dyn FnMut() + Send>>>,
    /// The hashes `restore_verified` was last given, by snapshot id: like a GPU, the device
    /// keeps its own copy and uses it while the id is the same (`VerifiedRestore::snapshot_id`).
    kept_hashes: Mutex<Option<(u64, Vec<u64>)>>,
}

impl TestDevice {
    pub fn new(caps: Caps) -> Arc<Self> {
        Arc::new(TestDevice {
            caps,
            mem: RwLock::new(BTreeMap::new()),
            next_addr: AtomicU64::new(0x1000_0000),
            fail_reads: AtomicBool::new(false),
            fail_writes: AtomicBool::new(false),
            fail_verified: AtomicBool::new(false),
            verified_device_stores_only: AtomicBool::new(false),
            counters: Counters::default(),
            on_write: Mutex::new(None),
            kept_hashes: Mutex::new(None),
        })
    }

    /// A new device buffer of `size` bytes filled with `fill`, not tracked anywhere.
    pub fn raw_alloc(&self, size: u64, fill: u8) -> u64 {
        let addr = self.next_addr.fetch_add(
            size.next_multiple_of(0x10_0000) + 0x10_0000,
            Ordering::Relaxed,
        );
        self.mem.write().insert(
            addr,
            Mutex::new(vec![fill; size as usize].into_boxed_slice()),
        );
        addr
    }

    /// A buffer at a chosen address (for address reuse).
    pub fn raw_alloc_at(&self, addr: u64, size: u64, fill: u8) {
        self.mem.write().insert(
            addr,
            Mutex::new(vec![fill; size as usize].into_boxed_slice()),
        );
    }

    pub fn raw_free(&self, addr: u64) {
        self.mem.write().remove(&addr);
    }

    /// Allocate and report to the inventory, like a backend's alloc wrapper.
    pub fn alloc(
        &self,
        inventory: &Inventory,
        size: u64,
        agent: u64,
        kind: MemoryKind,
        fill: u8,
    ) -> u64 {
        let addr = self.raw_alloc(size, fill);
        inventory.on_alloc(NewAllocation {
            base: addr,
            size,
            owner_agent: agent,
            kind,
        });
        addr
    }

    /// Free and report to the inventory, like a backend's free wrapper (inventory first: it
    /// waits for any copy in progress).
    pub fn free(&self, inventory: &Inventory, addr: u64) {
        inventory.on_free(addr);
        self.raw_free(addr);
    }

    fn with<R>(&self, addr: u64, len: u64, f: impl FnOnce(&mut [u8]) -> R) -> Result<R, CopyError> {
        let mem = self.mem.read();
        let (&base, buf) = mem
            .range(..=addr)
            .next_back()
            .ok_or_else(|| CopyError::failed(addr, len, "no such buffer"))?;
        let mut buf = buf.lock();
        let off = (addr - base) as usize;
        if off + len as usize > buf.len() {
            return Err(CopyError::failed(addr, len, "out of bounds"));
        }
        Ok(f(&mut buf[off..off + len as usize]))
    }

    /// Host-side view for tests (not through the snapshot).
    pub fn peek(&self, addr: u64, len: u64) -> Vec<u8> {
        self.with(addr, len, |b| b.to_vec()).unwrap()
    }

    pub fn poke(&self, addr: u64, data: &[u8]) {
        self.with(addr, data.len() as u64, |b| b.copy_from_slice(data))
            .unwrap()
    }
}

impl DeviceMemory for TestDevice {
    fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), CopyError> {
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        if self.fail_reads.load(Ordering::Relaxed) {
            return Err(CopyError::failed(
                addr,
                dst.len() as u64,
                "injected read failure",
            ));
        }
        self.with(addr, dst.len() as u64, |b| dst.copy_from_slice(b))
    }

    fn write(&self, addr: u64, src: &[u8]) -> Result<(), CopyError> {
        if let Some(hook) = self.on_write.lock().as_mut() {
            hook();
        }
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        if self.fail_writes.load(Ordering::Relaxed) {
            return Err(CopyError::failed(
                addr,
                src.len() as u64,
                "injected write failure",
            ));
        }
        self.counters
            .bytes_written
            .fetch_add(src.len() as u64, Ordering::Relaxed);
        self.with(addr, src.len() as u64, |b| b.copy_from_slice(src))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::NONE
            .with_device_hash(self.caps.device_hash)
            .with_batched_writes(self.caps.batched)
            .with_verified_restore(self.caps.verified_restore)
    }

    fn host_window(&self, addr: u64, len: u64) -> Option<HostWindow> {
        if !self.caps.host_visible {
            return None;
        }
        self.counters.windows.fetch_add(1, Ordering::Relaxed);
        let ptr = self.with(addr, len, |b| b.as_mut_ptr()).ok()?;
        // SAFETY: the buffer is a boxed slice that stays at this address until raw_free, which
        // the tests only call after the inventory's on_free (so never during a copy), and test
        // code does not touch device memory while a snapshot or restore runs.
        Some(unsafe { HostWindow::new(ptr, len as usize) })
    }

    fn alloc_shadow(&self, _agent: u64, size: u64) -> Option<u64> {
        if !self.caps.shadow {
            return None;
        }
        self.counters.shadows_live.fetch_add(1, Ordering::Relaxed);
        Some(self.raw_alloc(size, 0))
    }

    fn free_shadow(&self, addr: u64, _size: u64) {
        self.counters.shadows_live.fetch_sub(1, Ordering::Relaxed);
        self.raw_free(addr);
    }

    fn copy_on_device(&self, copies: &[DeviceCopy]) -> Result<(), CopyError> {
        if !self.caps.shadow {
            return Err(CopyError::Unsupported);
        }
        self.counters.device_copies.fetch_add(1, Ordering::Relaxed);
        for c in copies {
            let data = self.with(c.src, c.len, |b| b.to_vec())?;
            if self.fail_writes.load(Ordering::Relaxed) {
                return Err(CopyError::failed(c.dst, c.len, "injected copy failure"));
            }
            self.with(c.dst, c.len, |b| b.copy_from_slice(&data))?;
        }
        Ok(())
    }

    fn hash_chunks(
        &self,
        addr: u64,
        len: u64,
        chunk_size: u64,
        out: &mut [u64],
    ) -> Result<(), CopyError> {
        if !self.caps.device_hash {
            return Err(CopyError::Unsupported);
        }
        self.counters.hash_calls.fetch_add(1, Ordering::Relaxed);
        if self.fail_reads.load(Ordering::Relaxed) {
            return Err(CopyError::failed(addr, len, "injected hash failure"));
        }
        self.with(addr, len, |b| {
            for (h, c) in out.iter_mut().zip(b.chunks(chunk_size as usize)) {
                *h = xxhash_rust::xxh3::xxh3_64(c);
            }
        })
    }

    fn hash_chunk_ranges(
        &self,
        ranges: &[HashRange],
        chunk_size: u64,
        out: &mut [u64],
    ) -> Result<(), CopyError> {
        if !self.caps.device_hash {
            return Err(CopyError::Unsupported);
        }
        self.counters.hash_batches.fetch_add(1, Ordering::Relaxed);
        for r in ranges {
            let n = r.len.div_ceil(chunk_size) as usize;
            let Some(part) = out.get_mut(r.first..r.first + n) else {
                return Err(CopyError::failed(
                    r.addr,
                    r.len,
                    "hash range outside the output",
                ));
            };
            self.hash_chunks(r.addr, r.len, chunk_size, part)?;
        }
        Ok(())
    }

    fn restore_verified(
        &self,
        job: &VerifiedRestore<'_>,
        changed: &mut [u64],
    ) -> Result<(), CopyError> {
        if !self.caps.verified_restore {
            return Err(CopyError::Unsupported);
        }
        if matches!(job.store, StoreBytes::Host(_))
            && self.verified_device_stores_only.load(Ordering::Relaxed)
        {
            return Err(CopyError::Unsupported);
        }
        assert_eq!(changed.len(), job.hashes.len().div_ceil(64));
        assert!(changed.iter().all(|w| *w == 0), "the bitmap comes zeroed");
        let mut kept = self.kept_hashes.lock();
        if kept.as_ref().is_none_or(|(id, _)| *id != job.snapshot_id) {
            *kept = Some((job.snapshot_id, job.hashes.to_vec()));
        }
        let hashes = &kept.as_ref().expect("kept above").1;
        let cs = job.chunk_size;
        for r in job.ranges {
            for k in 0..r.len.div_ceil(cs) {
                let off = k * cs;
                let n = cs.min(r.len - off);
                let saved = match job.store {
                    StoreBytes::Device(shadow) => self.peek(shadow + r.store_offset + off, n),
                    StoreBytes::Host(bytes) => {
                        let at = (r.store_offset + off) as usize;
                        bytes[at..at + n as usize].to_vec()
                    }
                };
                let g = r.first + k as usize;
                let differs = !r.write
                    && xxhash_rust::xxh3::xxh3_64(&self.peek(r.addr + off, n)) != hashes[g];
                if r.write || differs {
                    self.poke(r.addr + off, &saved);
                    self.counters.bytes_written.fetch_add(n, Ordering::Relaxed);
                }
                if differs {
                    changed[g / 64] |= 1 << (g % 64);
                    if self.fail_verified.load(Ordering::Relaxed) {
                        return Err(CopyError::failed(r.addr + off, n, "injected failure"));
                    }
                }
            }
        }
        self.counters
            .verified_restores
            .fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn write_batch(&self, writes: &[ChunkWrite<'_>]) -> Result<(), CopyError> {
        self.counters.batches.fetch_add(1, Ordering::Relaxed);
        writes.iter().try_for_each(|w| self.write(w.addr, w.data))
    }

    fn register_host(&self, _ptr: *const u8, _len: usize) -> bool {
        if self.caps.pin {
            self.counters.registers.fetch_add(1, Ordering::Relaxed);
        }
        self.caps.pin
    }

    fn unregister_host(&self, _ptr: *const u8, _len: usize) {
        self.counters.unregisters.fetch_add(1, Ordering::Relaxed);
    }
}

/// A snapshotter over `device` with `config`.
pub fn snapshotter(
    device: &Arc<TestDevice>,
    inventory: &Arc<Inventory>,
    config: SnapshotConfig,
) -> Snapshotter {
    Snapshotter::new(inventory.clone(), device.clone(), config).unwrap()
}

/// A deterministic byte pattern.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub const FINAL: RestoreRequest = RestoreRequest {
    next_pass: 1,
    may_be_final: true,
};

pub fn not_final(next_pass: u64) -> RestoreRequest {
    RestoreRequest {
        next_pass,
        may_be_final: false,
    }
}

/// Room kept beyond a test's own spill files, for the other writers on the same file system
/// (other tests, builds) between the check and the spill.
const SPILL_SLACK: u64 = 64 << 20;

/// Whether spill files of `bytes` bytes in all fit in `dir` (the spill folder the test uses),
/// printing why the file tier's part of the test is skipped when they do not: kreplay refuses a
/// spill file that would leave its file system short (`kreplay_snapshot::spill_room`), so on
/// a machine with little disk free a test of the file tier would fail for the machine, not the
/// code.
pub fn spill_room(dir: &std::path::Path, bytes: u64) -> bool {
    let short = kreplay_snapshot::spill_room(dir).filter(|&room| room < bytes + SPILL_SLACK);
    if let Some(room) = short {
        eprintln!(
            "skipped: {} leaves {room} bytes for spill files: too little for {bytes}",
            dir.display()
        );
    }
    short.is_none()
}

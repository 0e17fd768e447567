//! A device whose memory is host memory: the benches' stand-in for a GPU.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kreplay_snapshot::{
    Capabilities, ChunkWrite, CopyError, DeviceCopy, DeviceMemory, HostWindow, Inventory,
    MemoryKind, NewAllocation,
};
use memmap2::{MmapMut, MmapOptions};
use parking_lot::{Mutex, RwLock};
use rayon::prelude::*;
use xxhash_rust::xxh3::xxh3_64;

/// Bytes per block of `copy_on_device` (the pieces kreplay's own copies use too).
const COPY_BLOCK: usize = 1 << 20;

/// Which optional capabilities a [`HostDevice`] offers besides plain reads and writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostDeviceOptions {
    /// `alloc_shadow` and `copy_on_device` (device-resident snapshot tier).
    pub device_shadow: bool,
    /// `hash_chunks`, computed in parallel like a device hash kernel.
    pub device_hash: bool,
    /// `write_batch` counts as one device operation.
    pub batched_writes: bool,
}

impl HostDeviceOptions {
    /// Every optional capability.
    pub fn all() -> Self {
        HostDeviceOptions {
            device_shadow: true,
            device_hash: true,
            batched_writes: true,
        }
    }
}

/// How often the snapshot called each device operation.
#[derive(Debug, Default)]
pub struct DeviceStats {
    /// `read` calls.
    pub reads: AtomicU64,
    /// `write` calls (including those of batches).
    pub writes: AtomicU64,
    /// `write_batch` calls.
    pub batches: AtomicU64,
    /// `copy_on_device` calls.
    pub device_copies: AtomicU64,
    /// `hash_chunks` calls.
    pub hashes: AtomicU64,
    /// Shadow allocations currently live.
    pub shadows_live: AtomicU64,
}

/// One allocation: an anonymous mapping whose host address is its device address.
struct Buffer {
    map: RwLock<MmapMut>,
    len: u64,
}

/// Device memory made of host memory, like a software runtime's: a device address is the host
/// address of the allocation. Every access through [`DeviceMemory`] locks the allocation
/// (shared for reads, exclusive for writes), so it is safe to use from any thread; host
/// windows (direct access, the fast path) are opt-in through the `unsafe` constructor.
pub struct HostDevice {
    options: HostDeviceOptions,
    host_windows: bool,
    buffers: RwLock<BTreeMap<u64, Arc<Buffer>>>,
    /// The last freed shadow (address, size), kept for reuse like a device allocator's cache.
    spare_shadow: Mutex<Option<(u64, u64)>>,
    /// Operation counters.
    pub stats: DeviceStats,
}

impl HostDevice {
    /// A device without host windows: the snapshot reaches memory only through `read`/`write`
    /// (like a discrete GPU).
    pub fn new(options: HostDeviceOptions) -> Self {
        HostDevice {
            options,
            host_windows: false,
            buffers: RwLock::new(BTreeMap::new()),
            spare_shadow: Mutex::new(None),
            stats: DeviceStats::default(),
        }
    }

    /// A device that also hands out host windows, so the snapshot copies and hashes memory
    /// directly (like a software runtime, or host-visible memory).
    ///
    /// # Safety
    /// While a snapshot is taken or restored, nothing may access this device's memory (no
    /// `read`/`write`/`fill` calls from other threads, no frees except through an inventory
    /// whose `on_free` runs first): the snapshot accesses it through raw pointers then.
    pub unsafe fn with_host_windows(options: HostDeviceOptions) -> Self {
        HostDevice {
            host_windows: true,
            ..HostDevice::new(options)
        }
    }

    /// The options this device was built with.
    pub fn options(&self) -> HostDeviceOptions {
        self.options
    }

    /// Allocate `size` bytes (zeroed) and return the device address.
    pub fn alloc(&self, size: u64) -> Result<u64, String> {
        let len = usize::try_from(size.max(1)).map_err(|_| "size exceeds the address space")?;
        let map = MmapOptions::new()
            .len(len)
            .map_anon()
            .map_err(|e| format!("allocation of {size} bytes failed: {e}"))?;
        let addr = map.as_ptr() as u64;
        let len = map.len() as u64;
        self.buffers.write().insert(
            addr,
            Arc::new(Buffer {
                map: RwLock::new(map),
                len,
            }),
        );
        Ok(addr)
    }

    /// Allocate and report the allocation to `inventory` (what a backend's alloc wrapper does).
    pub fn alloc_tracked(
        &self,
        inventory: &Inventory,
        size: u64,
        agent: u64,
        kind: MemoryKind,
    ) -> Result<u64, String> {
        let addr = self.alloc(size)?;
        inventory.on_alloc(NewAllocation {
            base: addr,
            size,
            owner_agent: agent,
            kind,
        });
        Ok(addr)
    }

    /// Free an allocation. Returns whether `addr` was one.
    pub fn free(&self, addr: u64) -> bool {
        self.buffers.write().remove(&addr).is_some()
    }

    /// Report the free to `inventory` (waiting for any copy in progress), then free.
    pub fn free_tracked(&self, inventory: &Inventory, addr: u64) -> bool {
        inventory.on_free(addr);
        self.free(addr)
    }

    /// Run `f` on `[addr, addr + len)` of the allocation containing it, holding the
    /// allocation's lock exclusively.
    fn modify<R>(
        &self,
        addr: u64,
        len: u64,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, CopyError> {
        let (base, buffer) = self.find(addr, len)?;
        let start = (addr - base) as usize;
        Ok(f(&mut buffer.map.write()[start..start + len as usize]))
    }

    fn find(&self, addr: u64, len: u64) -> Result<(u64, Arc<Buffer>), CopyError> {
        let buffers = self.buffers.read();
        let (&base, buffer) = buffers
            .range(..=addr)
            .next_back()
            .ok_or_else(|| CopyError::failed(addr, len, "no allocation at this address"))?;
        if addr + len > base + buffer.len {
            return Err(CopyError::failed(addr, len, "outside the allocation"));
        }
        Ok((base, buffer.clone()))
    }

    /// Set `len` bytes at `addr` to `byte`.
    pub fn fill(&self, addr: u64, len: u64, byte: u8) -> Result<(), CopyError> {
        self.modify(addr, len, |b| b.fill(byte))
    }

    /// XOR one byte at `addr` with `mask` (a cheap way to dirty a chunk).
    pub fn flip(&self, addr: u64, mask: u8) -> Result<(), CopyError> {
        self.modify(addr, 1, |b| b[0] ^= mask)
    }

    /// A copy of `len` bytes at `addr`.
    pub fn to_vec(&self, addr: u64, len: u64) -> Result<Vec<u8>, CopyError> {
        let mut v = vec![0u8; len as usize];
        self.read(addr, &mut v)?;
        Ok(v)
    }
}

impl DeviceMemory for HostDevice {
    fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), CopyError> {
        self.stats.reads.fetch_add(1, Ordering::Relaxed);
        let (base, buffer) = self.find(addr, dst.len() as u64)?;
        let start = (addr - base) as usize;
        dst.copy_from_slice(&buffer.map.read()[start..start + dst.len()]);
        Ok(())
    }

    fn write(&self, addr: u64, src: &[u8]) -> Result<(), CopyError> {
        self.stats.writes.fetch_add(1, Ordering::Relaxed);
        self.modify(addr, src.len() as u64, |b| b.copy_from_slice(src))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::NONE
            .with_device_hash(self.options.device_hash)
            .with_batched_writes(self.options.batched_writes)
            // Its memory is this process's, written only by the bench's stores.
            .with_cpu_writes(self.host_windows)
    }

    fn host_window(&self, addr: u64, len: u64) -> Option<HostWindow> {
        if !self.host_windows {
            return None;
        }
        let (base, buffer) = self.find(addr, len).ok()?;
        let ptr = buffer.map.write().as_mut_ptr();
        // SAFETY: the pointer addresses `len` bytes inside a live mapping (checked by `find`);
        // the mapping stays put until `free`, which callers run only after the inventory's
        // on_free (excluded while the window is in use), and the caller of
        // `with_host_windows` promised no other access during snapshot and restore.
        Some(unsafe { HostWindow::new(ptr.add((addr - base) as usize), len as usize) })
    }

    fn alloc_shadow(&self, _agent: u64, size: u64) -> Option<u64> {
        if !self.options.device_shadow {
            return None;
        }
        let spare = self.spare_shadow.lock().take();
        let addr = match spare {
            Some((addr, spare_size)) if spare_size >= size => addr,
            other => {
                if let Some((addr, _)) = other {
                    self.free(addr);
                }
                self.alloc(size).ok()?
            }
        };
        self.stats.shadows_live.fetch_add(1, Ordering::Relaxed);
        Some(addr)
    }

    /// Keeps the freed shadow for the next `alloc_shadow` that fits, as a device allocator's
    /// cache would (the larger of it and the current spare is kept, the other freed).
    fn free_shadow(&self, addr: u64, size: u64) {
        self.stats.shadows_live.fetch_sub(1, Ordering::Relaxed);
        let mut spare = self.spare_shadow.lock();
        let to_free = if spare.is_none_or(|(_, spare_size)| spare_size < size) {
            spare.replace((addr, size)).map(|(old, _)| old)
        } else {
            Some(addr)
        };
        drop(spare);
        if let Some(old) = to_free {
            self.free(old);
        }
    }

    fn copy_on_device(&self, copies: &[DeviceCopy]) -> Result<(), CopyError> {
        if !self.options.device_shadow {
            return Err(CopyError::Unsupported);
        }
        self.stats.device_copies.fetch_add(1, Ordering::Relaxed);
        // Like a copy engine working through a list: one copy after the other, each under the
        // locks of its two allocations (taken in address order; one lock when they coincide)
        // and split into 1 MiB blocks copied in parallel with streaming stores, as the copy
        // ceiling's best method does.
        let stream = |to: &mut [u8], from: &[u8]| {
            to.par_chunks_mut(COPY_BLOCK)
                .zip(from.par_chunks(COPY_BLOCK))
                .for_each(|(t, f)| {
                    // SAFETY: `t` and `f` hold the same number of bytes, in different
                    // allocations.
                    unsafe { crate::ceiling::copy_streaming(t.as_mut_ptr(), f.as_ptr(), t.len()) }
                });
        };
        copies.iter().try_for_each(|c| {
            let (src_base, src) = self.find(c.src, c.len)?;
            let (dst_base, dst) = self.find(c.dst, c.len)?;
            let (s, d) = ((c.src - src_base) as usize, (c.dst - dst_base) as usize);
            let n = c.len as usize;
            if Arc::ptr_eq(&src, &dst) {
                dst.map.write().copy_within(s..s + n, d);
            } else if src_base < dst_base {
                let from = src.map.read();
                stream(&mut dst.map.write()[d..d + n], &from[s..s + n]);
            } else {
                let mut to = dst.map.write();
                stream(&mut to[d..d + n], &src.map.read()[s..s + n]);
            }
            Ok(())
        })
    }

    fn hash_chunks(
        &self,
        addr: u64,
        len: u64,
        chunk_size: u64,
        out: &mut [u64],
    ) -> Result<(), CopyError> {
        if !self.options.device_hash {
            return Err(CopyError::Unsupported);
        }
        self.stats.hashes.fetch_add(1, Ordering::Relaxed);
        let (base, buffer) = self.find(addr, len)?;
        let start = (addr - base) as usize;
        let map = buffer.map.read();
        map[start..start + len as usize]
            .par_chunks(chunk_size as usize)
            .zip(out.par_iter_mut())
            .for_each(|(chunk, h)| *h = xxh3_64(chunk));
        Ok(())
    }

    fn write_batch(&self, writes: &[ChunkWrite<'_>]) -> Result<(), CopyError> {
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        writes
            .par_iter()
            .try_for_each(|w| self.write(w.addr, w.data))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_writes_are_bounds_checked() {
        let dev = HostDevice::new(HostDeviceOptions::default());
        let a = dev.alloc(100).unwrap();
        dev.write(a + 10, &[1, 2, 3]).unwrap();
        assert_eq!(dev.to_vec(a + 9, 5).unwrap(), vec![0, 1, 2, 3, 0]);
        assert!(dev.write(a + 99, &[1, 2]).is_err());
        assert!(dev.read(a + 1000, &mut [0; 1]).is_err());
        assert!(
            dev.host_window(a, 100).is_none(),
            "no windows unless opted in"
        );
        assert!(dev.free(a));
        assert!(dev.read(a, &mut [0; 1]).is_err());
    }

    #[test]
    fn a_device_copy_between_allocations_copies_every_byte_and_nothing_else() {
        let dev = HostDevice::new(HostDeviceOptions::all());
        let len = 3 * COPY_BLOCK as u64 + 4096 + 37;
        let src = dev.alloc(len + 64).unwrap();
        let data: Vec<u8> = (0..len + 64).map(|i| (i * 13 + i / 4099) as u8).collect();
        dev.write(src, &data).unwrap();
        let dst = dev.alloc_shadow(1, len + 64).unwrap();
        dev.fill(dst, len + 64, 0xEE).unwrap();
        // Odd offsets on both sides, so the streaming body starts unaligned and a tail is left.
        dev.copy_on_device(&[DeviceCopy {
            dst: dst + 3,
            src: src + 5,
            len,
        }])
        .unwrap();
        let got = dev.to_vec(dst, len + 64).unwrap();
        assert!(got[..3].iter().all(|&b| b == 0xEE));
        assert!(got[3..3 + len as usize] == data[5..5 + len as usize]);
        assert!(got[3 + len as usize..].iter().all(|&b| b == 0xEE));
    }

    #[test]
    fn freed_shadow_is_reused_when_it_fits() {
        let dev = HostDevice::new(HostDeviceOptions::all());
        let s1 = dev.alloc_shadow(1, 4096).unwrap();
        dev.free_shadow(s1, 4096);
        assert_eq!(dev.alloc_shadow(1, 1000), Some(s1));
        dev.free_shadow(s1, 4096);
        // The 4 KiB spare is too small: a new shadow is allocated (the address may coincide
        // with the freed spare's, so check its size instead: 8 KiB are usable).
        let s2 = dev.alloc_shadow(1, 8192).unwrap();
        assert_eq!(dev.stats.shadows_live.load(Ordering::Relaxed), 1);
        dev.copy_on_device(&[DeviceCopy {
            dst: s2 + 4096,
            src: s2,
            len: 4096,
        }])
        .unwrap();
    }
}

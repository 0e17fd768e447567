//! What the snapshot needs from a device: the [`DeviceMemory`] trait a backend implements.

use std::fmt;
use std::ptr::NonNull;

/// A device copy (or hash, or shadow operation) that did not happen.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CopyError {
    /// The device does not offer this optional capability.
    Unsupported,
    /// The operation was attempted and failed.
    Failed {
        /// Device address the failing operation started at.
        addr: u64,
        /// Length of the failing operation in bytes.
        len: u64,
        /// What the backend said.
        detail: String,
    },
}

impl CopyError {
    /// A failed operation on `[addr, addr + len)`.
    pub fn failed(addr: u64, len: u64, detail: impl Into<String>) -> Self {
        CopyError::Failed {
            addr,
            len,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for CopyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CopyError::Unsupported => f.write_str("operation not supported by the device"),
            CopyError::Failed { addr, len, detail } => {
                write!(
                    f,
                    "device copy of {len} bytes at {addr:#x} failed: {detail}"
                )
            }
        }
    }
}

impl std::error::Error for CopyError {}

/// Optional capabilities a device announces up front, so strategies can be chosen without
/// trying. (Capabilities that are naturally per call — host access, shadow allocation — are
/// announced by their method returning `Some`.)
///
/// `#[non_exhaustive]`: built from [`Capabilities::NONE`] and the `with_*` methods.
///
/// ```
/// use kreplay_snapshot::Capabilities;
///
/// let caps = Capabilities::NONE.with_batched_writes(true);
/// assert!(caps.batched_writes && !caps.device_hash);
/// ```
///
/// ```compile_fail
/// use kreplay_snapshot::Capabilities;
///
/// let caps = Capabilities { device_hash: false, batched_writes: true };
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// [`DeviceMemory::hash_chunks`] is implemented (a device hash kernel).
    pub device_hash: bool,
    /// [`DeviceMemory::write_batch`] issues one device operation for the whole list.
    pub batched_writes: bool,
    /// [`DeviceMemory::restore_verified`] is implemented: hashing, comparing and writing back
    /// changed chunks in one device operation.
    pub verified_restore: bool,
    /// Memory behind the [`HostWindow`]s this device hands out is written only by this
    /// process's CPU threads (a software device: its kernels and copies are host code), so the
    /// CPU's page tables see every write and restores may follow them instead of hashing
    /// (`RestoreStrategy::Tracked`). Never set it for memory a GPU or DMA engine writes.
    pub cpu_writes: bool,
}

impl Capabilities {
    /// No optional capability (the default).
    pub const NONE: Capabilities = Capabilities {
        device_hash: false,
        batched_writes: false,
        verified_restore: false,
        cpu_writes: false,
    };

    /// These capabilities with [`device_hash`](Self::device_hash) set to `yes`.
    pub const fn with_device_hash(mut self, yes: bool) -> Self {
        self.device_hash = yes;
        self
    }

    /// These capabilities with [`batched_writes`](Self::batched_writes) set to `yes`.
    pub const fn with_batched_writes(mut self, yes: bool) -> Self {
        self.batched_writes = yes;
        self
    }

    /// These capabilities with [`cpu_writes`](Self::cpu_writes) set to `yes`.
    pub const fn with_cpu_writes(mut self, yes: bool) -> Self {
        self.cpu_writes = yes;
        self
    }

    /// These capabilities with [`verified_restore`](Self::verified_restore) set to `yes`.
    pub const fn with_verified_restore(mut self, yes: bool) -> Self {
        self.verified_restore = yes;
        self
    }
}

/// Direct host access to a host-visible device range, handed out by
/// [`DeviceMemory::host_window`]. The snapshot copies through it with plain loads and stores.
#[derive(Debug, Clone, Copy)]
pub struct HostWindow {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a HostWindow is a (pointer, length) pair; whoever constructed it promised (see `new`)
// that the range may be read and written from any thread while the allocation is live.
unsafe impl Send for HostWindow {}
// SAFETY: as above; shared use only hands out the raw pointer.
unsafe impl Sync for HostWindow {}

impl HostWindow {
    /// Wrap a host pointer to device memory.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes, from any thread, for as long as
    /// the allocation containing the range stays live in the [`crate::Inventory`] (the snapshot
    /// only uses a window while it holds the inventory's read side, which excludes frees), and
    /// nothing else may write the range during a snapshot or restore (the backend has drained
    /// the agent). `ptr` must not be null unless `len` is 0.
    pub unsafe fn new(ptr: *mut u8, len: usize) -> Self {
        HostWindow {
            ptr: NonNull::new(ptr).unwrap_or(NonNull::dangling()),
            len,
        }
    }

    /// The host pointer to the first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the window is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// One device-to-device copy of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceCopy {
    /// Destination device address.
    pub dst: u64,
    /// Source device address.
    pub src: u64,
    /// Bytes to copy.
    pub len: u64,
}

/// One range of a batched chunk hash ([`DeviceMemory::hash_chunk_ranges`]): the chunks of
/// `[addr, addr + len)` (cut at multiples of the chunk size from `addr`, the last one possibly
/// shorter) whose hashes go to `out[first..]`, one per chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HashRange {
    /// Device address of the first chunk.
    pub addr: u64,
    /// Bytes of the range.
    pub len: u64,
    /// Index in `out` of the first chunk's hash.
    pub first: usize,
}

/// Where a snapshot's bytes are, for [`DeviceMemory::restore_verified`].
#[derive(Clone, Copy, Debug)]
pub enum StoreBytes<'a> {
    /// A device shadow starting at this device address.
    Device(u64),
    /// Host memory (pinned through [`DeviceMemory::register_host`] when the device could).
    Host(&'a [u8]),
}

/// One range of a [`VerifiedRestore`]: the chunks of `[addr, addr + len)` (cut at multiples of
/// the chunk size from `addr`, the last one possibly shorter), whose snapshotted bytes start
/// `store_offset` bytes into the store and whose global chunk indices start at `first`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VerifyRange {
    /// Device address of the first chunk.
    pub addr: u64,
    /// Bytes of the range.
    pub len: u64,
    /// Offset of the range's first byte in the store.
    pub store_offset: u64,
    /// Global index of the first chunk (in the snapshot's hashes and in the changed set).
    pub first: usize,
    /// Write every chunk from the store without hashing it (a learned write set); otherwise
    /// hash each chunk, and write it back only when it differs from the snapshot.
    pub write: bool,
}

/// A verified restore done by the device in one operation ([`DeviceMemory::restore_verified`]).
#[derive(Clone, Copy, Debug)]
pub struct VerifiedRestore<'a> {
    /// The ranges, each inside one allocation.
    pub ranges: &'a [VerifyRange],
    /// The snapshot's bytes.
    pub store: StoreBytes<'a>,
    /// Chunk size of the hashes.
    pub chunk_size: u64,
    /// `xxh3_64` (seed 0) of every chunk as snapshotted, by global chunk index.
    pub hashes: &'a [u64],
    /// Names this snapshot's hashes and store for as long as the snapshot lives (never reused
    /// within a process), so a device may keep its own copy of `hashes` between restores.
    pub snapshot_id: u64,
}

/// One host-to-device write of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkWrite<'a> {
    /// Destination device address.
    pub addr: u64,
    /// Bytes to write there.
    pub data: &'a [u8],
}

/// The device memory operations a snapshot needs. A backend implements this for its device;
/// only `read` and `write` are required, everything else is an optional capability whose
/// default says "not supported".
///
/// Device addresses are opaque `u64`s: the snapshot never dereferences one unless the device
/// hands out a [`HostWindow`] for it.
///
/// Rules for implementors: no method may call back into the inventory's `on_alloc`/`on_free`
/// (snapshot and restore hold its read side while calling the device), and memory handed out
/// by [`alloc_shadow`](DeviceMemory::alloc_shadow) must not be reported to the inventory.
/// Methods may be called from several threads at once (rayon workers).
pub trait DeviceMemory: Send + Sync {
    /// Copy `dst.len()` bytes at device address `addr` into host memory.
    fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), CopyError>;

    /// Copy `src` into device memory at `addr`.
    fn write(&self, addr: u64, src: &[u8]) -> Result<(), CopyError>;

    /// Capabilities announced up front.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    /// Direct host access to `[addr, addr + len)` if that range is host-visible (on a software
    /// device all memory is; on a discrete GPU usually none is).
    fn host_window(&self, addr: u64, len: u64) -> Option<HostWindow> {
        let _ = (addr, len);
        None
    }

    /// Allocate `size` bytes of device memory on `agent` to hold a device-resident snapshot.
    /// `None` when unsupported or when the agent has no room. A device that returns `Some` must
    /// implement [`copy_on_device`](DeviceMemory::copy_on_device).
    fn alloc_shadow(&self, agent: u64, size: u64) -> Option<u64> {
        let _ = (agent, size);
        None
    }

    /// Free memory returned by [`alloc_shadow`](DeviceMemory::alloc_shadow).
    fn free_shadow(&self, addr: u64, size: u64) {
        let _ = (addr, size);
    }

    /// Perform every device-to-device copy of the list (ideally as one device operation) and
    /// return when all are complete.
    fn copy_on_device(&self, copies: &[DeviceCopy]) -> Result<(), CopyError> {
        let _ = copies;
        Err(CopyError::Unsupported)
    }

    /// A device hash kernel: for each `chunk_size` chunk of `[addr, addr + len)` (the last one
    /// may be shorter), store `xxh3_64` (seed 0) of its bytes in `out[i]`.
    /// `out.len() == len.div_ceil(chunk_size)`. Announce it with `Capabilities::device_hash`.
    fn hash_chunks(
        &self,
        addr: u64,
        len: u64,
        chunk_size: u64,
        out: &mut [u64],
    ) -> Result<(), CopyError> {
        let _ = (addr, len, chunk_size, out);
        Err(CopyError::Unsupported)
    }

    /// [`hash_chunks`](DeviceMemory::hash_chunks) over many ranges at once (ideally one device
    /// operation): for each range, `out[r.first + k]` receives the hash of its chunk `k`. The
    /// ranges are sorted by `first` and their entries in `out` do not overlap; entries of `out`
    /// no range covers may be overwritten with any value. The default calls `hash_chunks` once
    /// per range.
    fn hash_chunk_ranges(
        &self,
        ranges: &[HashRange],
        chunk_size: u64,
        out: &mut [u64],
    ) -> Result<(), CopyError> {
        if chunk_size == 0 {
            return Err(CopyError::Unsupported);
        }
        let mut rest: &mut [u64] = out;
        let mut at = 0;
        for r in ranges {
            let n = r.len.div_ceil(chunk_size) as usize;
            let tail = std::mem::take(&mut rest);
            let Some(skip) = r.first.checked_sub(at).filter(|s| s + n <= tail.len()) else {
                return Err(CopyError::failed(
                    r.addr,
                    r.len,
                    format!("hash range at {} overlaps or exceeds the output", r.first),
                ));
            };
            let (part, tail) = tail[skip..].split_at_mut(n);
            self.hash_chunks(r.addr, r.len, chunk_size, part)?;
            rest = tail;
            at = r.first + n;
        }
        Ok(())
    }

    /// Perform every write of the list. The default issues one [`write`](DeviceMemory::write)
    /// per entry; a device with `Capabilities::batched_writes` does it in one device operation.
    fn write_batch(&self, writes: &[ChunkWrite<'_>]) -> Result<(), CopyError> {
        writes.iter().try_for_each(|w| self.write(w.addr, w.data))
    }

    /// A verified restore in one device operation: for every chunk of every range, write it
    /// from the store when the range says `write`; otherwise compare the live chunk with the
    /// snapshot (its hash with `job.hashes`, or its bytes directly) and, when they differ,
    /// write it from the store and set its bit in `changed` (bit `c % 64` of word `c / 64` for
    /// global chunk `c`; the caller passes the words zeroed, one bit per chunk of `hashes`).
    /// Returns when memory holds the snapshot's bytes in every range. `Unsupported` (the
    /// default, also for a store the device cannot read) means nothing was done; any other
    /// error may leave some chunks written. Announce it with `Capabilities::verified_restore`.
    fn restore_verified(
        &self,
        job: &VerifiedRestore<'_>,
        changed: &mut [u64],
    ) -> Result<(), CopyError> {
        let _ = (job, changed);
        Err(CopyError::Unsupported)
    }

    /// Register (pin) a host store so device copies to and from it run at full speed. Returns
    /// whether it did; the store is unregistered before it is freed.
    fn register_host(&self, ptr: *const u8, len: usize) -> bool {
        let _ = (ptr, len);
        false
    }

    /// Undo a successful [`register_host`](DeviceMemory::register_host).
    fn unregister_host(&self, ptr: *const u8, len: usize) {
        let _ = (ptr, len);
    }
}

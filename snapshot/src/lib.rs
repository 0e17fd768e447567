//! Allocation inventory, snapshot and restore of device memory for kernel replay.
//!
//! A replayed kernel runs several times and every pass must start from the bytes the first pass
//! saw. This crate keeps track of device allocations ([`Inventory`], fed by a backend's alloc
//! and free hooks), copies the ones a replay may touch into a [`Snapshot`]
//! ([`Filter::for_replay`]: the dispatch's agent, coarse-grained device memory;
//! [`Filter::reach`]: any allocation an address the dispatch uses points into, executable memory
//! excepted; [`Filter::vouch`]: ranges outside the inventory such as module variables; each
//! region keeps its [`RegionSource`]), and writes them back between passes. It knows nothing about any GPU runtime: a backend implements the small
//! [`DeviceMemory`] trait (two required copy methods plus optional capabilities).
//!
//! * **Safety against frees.** Snapshot and restore copies hold the inventory's read side;
//!   `on_free` takes the write side, so memory cannot be freed under a copy. A region freed (or
//!   whose address now belongs to a newer allocation generation) is skipped, never written.
//! * **Declines, not aborts.** A snapshot that cannot be complete (budget, out of memory in every
//!   tier, a failed copy, an untracked required address) is a typed [`SnapshotError`] whose
//!   [`reason`](SnapshotError::reason) is the decline reason (docs/abi.md §4); device memory is untouched.
//! * **Tiered store.** A device-resident shadow when the device offers one, else host memory
//!   (registered with the device if it can pin), else a memory-mapped spill file
//!   ([`StoreTier`]).
//! * **Restore cost tracks bytes mutated.** Per-chunk xxh3 hashes taken while copying (AVX2
//!   chosen at run time, whatever the build's target flags, four chunks hashed in one loop so
//!   that a thread keeps four streams of reads in flight); restores write back only changed
//!   chunks ([`RestoreStrategy::Hash`]; where the CPU reads both the memory and the snapshot,
//!   each changed chunk is written back right after it was hashed, while it is still in the
//!   cache), or learn a write set and verify before every pass
//!   ([`RestoreStrategy::Writeset`]: the set is written back from the store and every other
//!   live chunk is hashed, so each pass starts from the snapshotted bytes; a change outside the
//!   set is written back and reported as a repair). Only the explicit opt-in
//!   [`RestoreStrategy::WritesetUnverified`] writes the learned set without hashing the rest
//!   (checked every K restores and before any possibly-final pass), and its reports say so
//!   ([`RestoreReport::unverified`]). Copies run in parallel on kreplay's rayon pool (streaming stores from
//!   64 MiB); partial restores are merged into runs and issued as one batch when the device
//!   batches.
//! * **Following writes across dispatches.** Where a replay followed its footprint's writes
//!   ([`RestoreStrategy::Tracked`], or `auto` where that pays) and keeps its store, the
//!   footprint stays followed after the snapshot is dropped ([`Snapshotter::following`]): the
//!   next snapshot of the same allocations copies only the pages written since, and a
//!   snapshot of other allocations, [`Snapshotter::stop_following`] or
//!   [`Snapshotter::release_cached_store`] stop following it. Not kept while the process has
//!   memory pinned for I/O (io_uring fixed buffers, RDMA: the kernel writes it past the page
//!   tables, `kreplay_wtrack::pinned_bytes`), nor when the footprint has over 1,024 ranges
//!   (each may split a mapping); and a footprint kept followed cannot meanwhile be registered
//!   with the application's own `userfaultfd` nor collapsed with `MADV_COLLAPSE`.
//! * **A pool of its own.** Parallel copies, hashes and page scans run on this crate's own
//!   rayon pool ([`pool::install`]), never on the global one an application may keep busy.
//! * **Reuse across dispatches.** [`Snapshotter::take_for_kernel`] keeps what a dispatch's
//!   restores learned (the write set, how many chunks changed, whether full restores won) per
//!   kernel and region set, and the next dispatch of that kernel starts from it; verification
//!   is unchanged.
//!
//! The auto strategy: snapshots under [`AUTO_FULL_BELOW_BYTES`] restore in full, and so do
//! device-tier snapshots when the device has no hash kernel and the memory is not host-visible
//! (hashing would pull every byte over the host link while a full restore stays on the device).
//! All others choose before each restore the cheapest of a full restore, a hash restore and a
//! verified write-set restore, estimated from the copy and hash rates the snapshotter's restores
//! measured (each kind's cost relative to the machine's current speed, which every measurement
//! of any kind moves, so a copy rate measured minutes ago follows the bandwidth the hash passes
//! measure now; both are medians of the latest 8 measurements, so one disturbed copy does not
//! sway them) and from what this kernel's restores found changed (never the unverified shortcut;
//! when a verified restore leads a full one by less than 5% and no copy has been measured for
//! 16 measurements, or whatever the lead after 32, it copies everything, which measures the copy
//! rate again; a rate measured again after 32 measurements of other kinds replaces its earlier
//! measurements instead of being outvoted by them; partial write-backs are costed at the rate
//! of write-backs of their kind, streaming or not);
//! the first restore of a kernel with nothing learned hashes everything. Hashing while
//! snapshotting costs something too (what a hashing snapshot measured beyond a plain copy):
//! auto takes the hashes only when the restores expected repay them with a margin (5% of a copy
//! of the footprint, 25% while the copy rate is stale: a plain snapshot measures the copy
//! again), counting at least 0.15 of a hash pass for them: those the replay plans
//! ([`SnapshotPlan::with_planned_restores`], which the pass loop sets to N - 1), else those of
//! the kernel's last dispatch, or for a kernel seen for the first time those of the latest
//! dispatch of any kernel; otherwise it restores in full, hashing again every 16 restores to
//! notice a change. What a restore saves comes from what the kernel's earlier dispatches found
//! changed; for a kernel seen for the first time (or whose earlier dispatches restored in full,
//! learning nothing about that) the best case (nothing changes) must repay the
//! hashes, and when at the share the latest dispatch of any kernel changed they would not, the
//! guess that costs less when wrong is taken (a short replay copies, a long one hashes). A replay that runs past the restores expected has the store (the
//! snapshot's bytes) hashed once, when that pays over as many restores again, and chooses among
//! the verified strategies from then on.
//!
//! The budget (`KREPLAY_MAX_SNAPSHOT_BYTES`, 0 = derived): see
//! [`SnapshotConfig::derived_budget`] — available memory (the machine's, or the memory cgroup's
//! room where less) minus a quarter of it or 512 MiB, whichever is larger. A host store of 16
//! MiB or more is made only within the same rule applied to the memory available when it is
//! made (the kernel would grant more and kill the process for touching it); beyond, `auto`
//! spills to a file, made only within the same rule applied to the room its file system has
//! free (a larger file would fill the disk before its write failed).
//!
//! # Example
//!
//! A toy device whose "device memory" is one host buffer, addressed by offset:
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use kreplay_snapshot::*;
//!
//! struct Toy(Mutex<Vec<u8>>);
//! impl DeviceMemory for Toy {
//!     fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), CopyError> {
//!         let mem = self.0.lock().unwrap();
//!         dst.copy_from_slice(&mem[addr as usize..addr as usize + dst.len()]);
//!         Ok(())
//!     }
//!     fn write(&self, addr: u64, src: &[u8]) -> Result<(), CopyError> {
//!         self.0.lock().unwrap()[addr as usize..addr as usize + src.len()].copy_from_slice(src);
//!         Ok(())
//!     }
//! }
//!
//! let device = Arc::new(Toy(Mutex::new(vec![1u8; 8192])));
//! let inventory = Arc::new(Inventory::new());
//! let buffer = NewAllocation { base: 0, size: 4096, owner_agent: 1, kind: MemoryKind::CoarseDevice };
//! inventory.on_alloc(buffer); // agent 1's buffer: snapshotted
//! let kernargs = NewAllocation { base: 4096, kind: MemoryKind::Kernarg, ..buffer };
//! inventory.on_alloc(kernargs); // kernel arguments: excluded
//!
//! let config = SnapshotConfig::default()
//!     .with_chunk_size(1024)
//!     .with_store(StoreTier::Host)
//!     .with_strategy(RestoreStrategy::Hash);
//! let snapshotter = Snapshotter::new(inventory, device.clone(), config).unwrap();
//! let mut snapshot = snapshotter.snapshot(&Filter::for_replay(1)).unwrap();
//! assert_eq!(snapshot.report().bytes_moved, 4096);
//!
//! device.0.lock().unwrap()[100] = 42;                        // pass 0 mutates memory
//! let report = snapshot
//!     .restore(&RestoreRequest { next_pass: 1, may_be_final: true })
//!     .unwrap();
//! assert_eq!(device.0.lock().unwrap()[100], 1);              // restored
//! assert_eq!(report.chunks_restored, 1);                     // one 1 KiB chunk was dirty
//! ```

mod config;
mod copy;
mod device;
mod fold;
mod hash;
mod inventory;
mod layout;
mod learned;
pub mod pool;
mod report;
mod snapshot;
mod source;
mod store;
mod track;

pub use config::{
    ConfigError, DEFAULT_CHUNK_SIZE, DEFAULT_VERIFY_EVERY, MAX_CHUNK_SIZE, MIN_CHUNK_SIZE,
    ParseEnumError, RestoreStrategy, SnapshotConfig, SnapshotScope, StoreTier,
};
pub use device::{
    Capabilities, ChunkWrite, CopyError, DeviceCopy, DeviceMemory, HashRange, HostWindow,
    StoreBytes, VerifiedRestore, VerifyRange,
};
pub use fold::{Capture, Delta, Footprint};
pub use hash::{HashImpl, chunk_hash, chunk_hashes, hash_impl};
pub use inventory::{
    Allocation, Filter, Inventory, KindSet, MIN_ADDRESS, MemoryKind, NewAllocation, Region,
    aligned_values,
};
pub use report::{RestoreError, RestoreReport, SnapshotError, SnapshotReport};
pub use snapshot::{
    AUTO_FULL_BELOW_BYTES, RestorePlan, RestoreRequest, Snapshot, SnapshotPlan, Snapshotter,
};

/// The README's example, compiled and run as a doctest so that it cannot go stale.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
pub use source::{RegionSource, SourceBreakdown, SourceTally};
pub use store::{file_size_limit, spill_room};

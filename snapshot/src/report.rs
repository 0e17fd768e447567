//! What snapshots and restores report, and how they fail.

use std::fmt;
use std::time::Duration;

use crate::config::{RestoreStrategy, StoreTier};
use crate::device::CopyError;
use crate::inventory::Region;
use crate::source::SourceBreakdown;

/// What taking a snapshot did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SnapshotReport {
    /// Bytes the plan selected.
    pub bytes_planned: u64,
    /// Bytes copied into the store.
    pub bytes_moved: u64,
    /// Regions held by the snapshot.
    pub regions: u64,
    /// Planned regions freed before the copy started (not held, nothing to restore).
    pub regions_skipped: u64,
    /// Chunks held (each region is cut into `chunk_size` chunks, the last one may be shorter).
    pub chunks: u64,
    /// Tier the bytes are stored in (never `Auto`).
    pub tier: StoreTier,
    /// Strategy the next restore will use (never `Auto`).
    pub strategy: RestoreStrategy,
    /// Whether a host store was registered (pinned) with the device.
    pub pinned: bool,
    /// Whether per-chunk hashes were taken (needed by the hash and write-set strategies).
    pub hashed: bool,
    /// Wall time of taking it (store acquisition, copy and hashing).
    pub elapsed: Duration,
    /// Regions and bytes held, per source (agent memory, referenced, module variables,
    /// adopted).
    pub sources: SourceBreakdown,
}

/// What one restore did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RestoreReport {
    /// Upper bound of the bytes the restore could write, known before it starts.
    pub bytes_planned: u64,
    /// Bytes written back to device memory.
    pub bytes_moved: u64,
    /// Bytes of live memory hashed to find changed chunks.
    pub bytes_hashed: u64,
    /// Regions still live (eligible for restore).
    pub regions: u64,
    /// Regions freed or reused since the snapshot: skipped, never written.
    pub regions_skipped: u64,
    /// The skipped regions.
    pub skipped: Vec<Region>,
    /// Chunks of the live regions.
    pub chunks: u64,
    /// Chunks written back.
    pub chunks_restored: u64,
    /// Write set: chunks found changed outside the learned set by verification, restored and
    /// added to the set.
    pub repaired_chunks: u64,
    /// Tier the bytes came from (never `Auto`).
    pub tier: StoreTier,
    /// Strategy used (never `Auto`).
    pub strategy: RestoreStrategy,
    /// Whether this restore knew every chunk that changed: it compared hashes of every live
    /// chunk (hash strategy, write-set learning or verification) or followed every write to
    /// them in the page tables (tracked).
    pub verified: bool,
    /// Whether this restore wrote a learned write set back without checking the rest of the
    /// footprint (only under the opt-in `WritesetUnverified`): memory outside the set may differ
    /// from the snapshot.
    pub unverified: bool,
    /// Tracked: bytes of the pages this restore wrote back and left writable, not followed
    /// again, because the latest passes wrote them each time. The next pass writes them
    /// without a fault, and the next restore writes them back whatever that pass did.
    pub bytes_left_open: u64,
    /// Wall time.
    pub elapsed: Duration,
}

/// A snapshot that could not be taken completely. Device memory was not written.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SnapshotError {
    /// The plan exceeds `SnapshotConfig::max_bytes`.
    FootprintBudget {
        /// Bytes the plan needs.
        planned: u64,
        /// The budget.
        budget: u64,
    },
    /// A required address lies in no tracked allocation, so the footprint cannot be known.
    UntrackedMemory {
        /// The address.
        addr: u64,
    },
    /// No allowed tier could hold the bytes (out of memory everywhere, or the forced tier is
    /// not available).
    StoreUnavailable {
        /// The tier asked for (`Auto` when every tier was tried).
        tier: StoreTier,
        /// Bytes that needed a home.
        bytes: u64,
        /// What each tier said.
        detail: String,
    },
    /// A device copy (or hash) failed while taking the snapshot.
    CopyFailed(CopyError),
}

impl SnapshotError {
    /// The decline reason (docs/abi.md §4): `footprint_budget`, `untracked_memory` or `snapshot_failed`.
    pub fn reason(&self) -> &'static str {
        match self {
            SnapshotError::FootprintBudget { .. } => "footprint_budget",
            SnapshotError::UntrackedMemory { .. } => "untracked_memory",
            SnapshotError::StoreUnavailable { .. } | SnapshotError::CopyFailed(_) => {
                "snapshot_failed"
            }
        }
    }
}

impl fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SnapshotError::FootprintBudget { planned, budget } => write!(
                f,
                "snapshot of {planned} bytes exceeds the budget of {budget} bytes"
            ),
            SnapshotError::UntrackedMemory { addr } => {
                write!(f, "address {addr:#x} lies in no tracked allocation")
            }
            SnapshotError::StoreUnavailable {
                tier,
                bytes,
                detail,
            } => write!(
                f,
                "no snapshot store for {bytes} bytes (tier {tier}): {detail}"
            ),
            SnapshotError::CopyFailed(e) => write!(f, "snapshot copy failed: {e}"),
        }
    }
}

impl std::error::Error for SnapshotError {}

/// A restore that did not complete: device memory may differ from the snapshot. This is the
/// unrecoverable case of a replay; it carries what was lost.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RestoreError {
    /// The first device error seen.
    pub error: CopyError,
    /// Bytes that should have been written and may not have been.
    pub bytes_lost: u64,
    /// Chunks those bytes span.
    pub chunks_lost: u64,
    /// What the restore did up to the failure (`bytes_moved` counts confirmed writes).
    pub report: Box<RestoreReport>,
}

impl fmt::Display for RestoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "restore failed, {} bytes in {} chunks not restored: {}",
            self.bytes_lost, self.chunks_lost, self.error
        )
    }
}

impl std::error::Error for RestoreError {}

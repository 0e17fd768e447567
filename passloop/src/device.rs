//! What the loop needs from a device backend.

use crate::{Decline, DeclineReason, DispatchInfo, RestoreFailure};

/// Where a snapshot is kept.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreTier {
    /// No storage was used (nothing to snapshot, or nothing stored yet).
    #[default]
    None,
    /// A shadow copy in the agent's own memory.
    Device,
    /// Pinned or ordinary host memory.
    Host,
    /// A memory-mapped spill file.
    File,
}

impl StoreTier {
    /// Lower-case name (`none`, `device`, `host`, `file`).
    pub fn as_str(self) -> &'static str {
        match self {
            StoreTier::None => "none",
            StoreTier::Device => "device",
            StoreTier::Host => "host",
            StoreTier::File => "file",
        }
    }
}

/// How restores find the bytes to write back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RestoreStrategy {
    /// Write back the whole footprint.
    #[default]
    Full,
    /// Write back the chunks whose hash changed.
    Hash,
    /// Write back the chunks learned to be written (verified).
    Writeset,
    /// Write back the chunks learned to be written without checking the rest of the footprint
    /// (an explicit opt-in, never chosen on the tool's or the user's behalf).
    WritesetUnverified,
    /// The chunks of the pages followed as written since the previous restore were written
    /// back, nothing hashed.
    Tracked,
}

impl RestoreStrategy {
    /// Lower-case name (`full`, `hash`, `writeset`, `writeset-unverified`, `tracked`).
    pub fn as_str(self) -> &'static str {
        match self {
            RestoreStrategy::Full => "full",
            RestoreStrategy::Hash => "hash",
            RestoreStrategy::Writeset => "writeset",
            RestoreStrategy::WritesetUnverified => "writeset-unverified",
            RestoreStrategy::Tracked => "tracked",
        }
    }

    /// The name of what a restore did: a write-set restore that skipped its check
    /// (`unverified`) is [`RestoreStrategy::WritesetUnverified`], anything else keeps its name.
    pub fn as_run(self, unverified: bool) -> RestoreStrategy {
        match self {
            RestoreStrategy::Writeset | RestoreStrategy::WritesetUnverified if unverified => {
                RestoreStrategy::WritesetUnverified
            }
            other => other,
        }
    }
}

/// Regions and bytes from one source of a snapshot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SourceTally {
    /// Regions.
    pub regions: u64,
    /// Bytes.
    pub bytes: u64,
}

/// Where a snapshot's regions come from: the agent's own memory (the scope's starting point),
/// memory a kernel argument points into, module-scope variables of loaded code, and memory
/// adopted because the runtime knew it and the backend did not.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RegionSources {
    /// The agent's memory selected by the scope.
    pub agent: SourceTally,
    /// Allocations a kernel argument points into (beyond the agent's memory).
    pub referenced: SourceTally,
    /// Writable module-scope variables.
    pub module_variables: SourceTally,
    /// Memory adopted for this snapshot.
    pub adopted: SourceTally,
}

/// What a snapshot or restore plans (at ENTER) or did (at EXIT).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemoryOpReport {
    /// Bytes the operation expects to move (the footprint for a snapshot).
    pub bytes_planned: u64,
    /// Bytes actually moved (0 in a plan).
    pub bytes_moved: u64,
    /// Allocations covered.
    pub regions: u64,
    /// Chunks covered (or moved, at EXIT).
    pub chunks: u64,
    /// Where the snapshot is kept.
    pub tier: StoreTier,
    /// How restores pick bytes.
    pub strategy: RestoreStrategy,
    /// SNAPSHOT EXIT: why the snapshot was not taken (the replay was declined, memory is
    /// untouched). Set by the loop.
    pub declined: Option<DeclineReason>,
    /// RESTORE EXIT: the restore failed; device memory no longer matches the snapshot. Set by
    /// the loop.
    pub failed: bool,
    /// RESTORE EXIT of a failed restore: bytes that should have been written back and were not.
    pub bytes_lost: u64,
    /// RESTORE EXIT: chunks found changed outside the learned write set and written back by
    /// this restore (a repair; the count is included in `chunks`).
    pub repaired_chunks: u64,
    /// RESTORE EXIT: the restore wrote the learned write set back without checking the rest of
    /// the footprint (an explicit opt-in); the next pass may not start from the first pass's
    /// bytes.
    pub unverified: bool,
    /// SNAPSHOT ENTER/EXIT: regions and bytes per source.
    pub sources: RegionSources,
}

/// What a restore between passes prepares for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RestoreRequest {
    /// The pass that just ran (0-based).
    pub completed_pass: u64,
    /// The pass that runs next (`completed_pass + 1`).
    pub next_pass: u64,
    /// Whether the next pass may be the final one, i.e. its results are what the application
    /// sees: true before the last of N passes and whenever a continue callback could stop the
    /// loop after it. A backend must then restore exactly (verified), never approximately.
    pub next_may_be_final: bool,
}

/// What a snapshot is taken for: the passes the loop plans after it, so that a backend's
/// snapshot can weigh what it prepares for the restores against how many there will be.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SnapshotRequest {
    /// The passes planned: N, or 0 for an indefinite loop (a continue callback decides).
    pub total_passes: u64,
    /// The restores planned after the snapshot: N - 1 for N passes (at most that many: a
    /// continue callback or a time budget may stop the loop earlier); `None` for an indefinite
    /// loop.
    pub planned_restores: Option<u64>,
}

impl SnapshotRequest {
    /// The request of a replay of `total_passes` passes (0: indefinite).
    pub fn for_passes(total_passes: u64) -> Self {
        SnapshotRequest {
            total_passes,
            planned_restores: total_passes.checked_sub(1),
        }
    }
}

/// The device steps of one replayed dispatch, implemented by a backend.
///
/// The loop calls them in the order of docs/abi.md §2 on one thread and times each. Every step that can fail
/// returns the [`Decline`] it produced; the loop then takes the safe path (see
/// [`run_dispatch`](crate::run_dispatch)).
///
/// **The application's completion fires exactly once per dispatch**: either through
/// [`run_once`](Self::run_once) (the dispatch ran unchanged, with its own completion), or through
/// [`fire_completion`](Self::fire_completion) after replayed passes (which run with the
/// application's completion withheld). The loop calls exactly one of the two, exactly once,
/// unless a tool or device callback unwinds: then it calls neither (see
/// [`run_dispatch`](crate::run_dispatch)).
pub trait ReplayDevice {
    /// A snapshot taken by [`take_snapshot`](Self::take_snapshot).
    type Snapshot;

    /// Can this dispatch be replayed at all? Declines graph launches and multi-packet batches
    /// (`batch_or_graph`). Called before anything is locked.
    fn check_replayable(&mut self, info: &DispatchInfo) -> Result<(), Decline>;

    /// Takes the agent's writer lock, waiting for ordinary dispatches in flight. Fails with
    /// `reentrant_dispatch` when the calling thread already holds the agent (a dispatch issued
    /// from a replay callback). On success the loop calls
    /// [`unlock_agent`](Self::unlock_agent) exactly once, on every path.
    fn lock_agent(&mut self, info: &DispatchInfo) -> Result<(), Decline>;

    /// Releases the lock taken by [`lock_agent`](Self::lock_agent).
    fn unlock_agent(&mut self, info: &DispatchInfo);

    /// Drains the dispatch's queue, every sibling queue on the agent and its async copies.
    /// Fails with `queue_drain_stuck` or `agent_drain_stuck`.
    fn drain(&mut self, info: &DispatchInfo) -> Result<(), Decline>;

    /// Acquires everything the passes will need (completion signals, packet slots, ...), after
    /// the drain and before the snapshot: once the snapshot is taken, running out of a resource
    /// could only abandon the replay halfway, so a failure here is a decline (the dispatch runs
    /// once, memory untouched). Resources are released when the device is dropped or by
    /// [`discard_snapshot`](Self::discard_snapshot). The default acquires nothing.
    fn prepare(&mut self, info: &DispatchInfo) -> Result<(), Decline> {
        let _ = info;
        Ok(())
    }

    /// Plans the snapshot (which regions, how many bytes, which tier) without copying. Fails
    /// with `untracked_memory` or `footprint_budget`.
    fn plan_snapshot(&mut self, info: &DispatchInfo) -> Result<MemoryOpReport, Decline>;

    /// Takes the planned snapshot for the passes `request` plans. Fails with `snapshot_failed`
    /// (or `footprint_budget` when the store ran out); a failed snapshot must leave device
    /// memory untouched.
    fn take_snapshot(
        &mut self,
        info: &DispatchInfo,
        request: &SnapshotRequest,
    ) -> Result<(Self::Snapshot, MemoryOpReport), Decline>;

    /// Runs pass `pass`: submits the kernel (application completion withheld) and waits for it
    /// and every completion handler of the pass, however long the kernel runs (a running pass is
    /// never abandoned: a backend warns about a long pass and keeps waiting). Called on the
    /// loop's thread with the replay mask installed, so `ContextRegistry::is_active` there sees
    /// this pass's mask. An error (`pass_drain_stuck`) means the pass could not be run at all or
    /// its completion can never come; the loop then stops.
    fn run_pass(&mut self, info: &DispatchInfo, pass: u64) -> Result<(), Decline>;

    /// Plans the restore `request` describes (bytes expected to move), without moving any.
    fn plan_restore(
        &mut self,
        info: &DispatchInfo,
        snapshot: &Self::Snapshot,
        request: &RestoreRequest,
    ) -> MemoryOpReport;

    /// Writes the snapshot back so the next pass sees the bytes the first pass saw.
    // A failed restore is rare and carries the whole report the tool is told about; it is
    // returned once per restore, so its size costs nothing worth a box in every backend.
    #[allow(clippy::result_large_err)]
    fn restore(
        &mut self,
        info: &DispatchInfo,
        snapshot: &mut Self::Snapshot,
        request: &RestoreRequest,
    ) -> Result<MemoryOpReport, RestoreFailure>;

    /// Frees the snapshot once the passes are over (on every path after a successful
    /// [`take_snapshot`](Self::take_snapshot), except a callback unwinding: the snapshot is
    /// then dropped without this call).
    fn discard_snapshot(&mut self, info: &DispatchInfo, snapshot: Self::Snapshot);

    /// Runs the dispatch once, unchanged, **its own completion included**: the ordinary path
    /// (opt-out, single pass) and every decline. Called with the agent lock still held when one
    /// was taken, so it must not take that lock again.
    fn run_once(&mut self, info: &DispatchInfo);

    /// Fires the application's completion once after replayed passes (also after a failed pass
    /// or restore, so the application never hangs).
    fn fire_completion(&mut self, info: &DispatchInfo);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unverified_write_set_restore_has_a_name_of_its_own() {
        assert_eq!(
            RestoreStrategy::Writeset.as_run(true).as_str(),
            "writeset-unverified"
        );
        assert_eq!(RestoreStrategy::Writeset.as_run(false).as_str(), "writeset");
        assert_eq!(
            RestoreStrategy::WritesetUnverified.as_run(false),
            RestoreStrategy::WritesetUnverified,
            "a snapshot configured for it keeps the name"
        );
        assert_eq!(RestoreStrategy::Full.as_run(true), RestoreStrategy::Full);
        assert_eq!(RestoreStrategy::Hash.as_run(true), RestoreStrategy::Hash);
    }
}

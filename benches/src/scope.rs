//! The snapshot scope case: a kernel that references 1% of a large footprint, snapshotted and
//! restored under both scopes (`agent`: the agent's whole coarse-grained memory plus what is
//! referenced; `referenced`: only what the dispatch's arguments reach).

use std::sync::Arc;
use std::time::Instant;

use kreplay_snapshot::{
    Filter, Inventory, MemoryKind, RegionSource, RestoreRequest, SnapshotConfig, SnapshotScope,
    Snapshotter, StoreTier,
};

use crate::device::{HostDevice, HostDeviceOptions};

/// Allocations the footprint is split into: the kernel references one of them (1%).
pub const SCOPE_REGIONS: u64 = 100;

/// One scope's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct ScopeRow {
    /// The scope.
    pub scope: SnapshotScope,
    /// The agent's tracked memory.
    pub footprint: u64,
    /// Bytes copied into the snapshot.
    pub bytes_snapshotted: u64,
    /// Regions in the snapshot.
    pub regions: u64,
    /// Best snapshot time, seconds.
    pub snapshot_seconds: f64,
    /// Bytes the restore after the kernel's pass wrote back.
    pub bytes_restored: u64,
    /// Best restore time (a verified restore before a possibly final pass), seconds.
    pub restore_seconds: f64,
}

/// Measures both scopes over `footprint` bytes in [`SCOPE_REGIONS`] allocations of one agent,
/// the kernel writing every byte of the one allocation its argument points into; host store,
/// the default (auto) restore strategy, best of `repeats`.
pub fn run_scope_case(
    footprint: u64,
    repeats: usize,
    host_windows: bool,
) -> Result<Vec<ScopeRow>, String> {
    let options = HostDeviceOptions {
        device_shadow: false,
        device_hash: false,
        batched_writes: true,
    };
    let device = Arc::new(if host_windows {
        // SAFETY: one operation at a time on this thread: nothing touches device memory while a
        // snapshot or restore runs, and nothing is freed meanwhile.
        unsafe { HostDevice::with_host_windows(options) }
    } else {
        HostDevice::new(options)
    });
    let inventory = Arc::new(Inventory::new());
    let size = (footprint / SCOPE_REGIONS).max(1);
    let mut referenced = 0;
    for i in 0..SCOPE_REGIONS {
        let addr = device.alloc_tracked(&inventory, size, 1, MemoryKind::CoarseDevice)?;
        device
            .fill(addr, size, i as u8)
            .map_err(|e| e.to_string())?;
        if i == SCOPE_REGIONS / 2 {
            referenced = addr;
        }
    }
    let mut rows = Vec::new();
    for scope in [SnapshotScope::Agent, SnapshotScope::Referenced] {
        let snapshotter = Snapshotter::new(
            inventory.clone(),
            device.clone(),
            SnapshotConfig::default()
                .with_store(StoreTier::Host)
                .with_scope(scope),
        )
        .map_err(|e| e.to_string())?;
        let start = match scope {
            SnapshotScope::Agent => Filter::for_replay(1),
            SnapshotScope::Referenced => Filter::referenced_only(1),
            other => return Err(format!("scope {other} is not measured")),
        };
        let filter = start.reach(referenced + 8, RegionSource::Referenced);
        let mut row = ScopeRow {
            scope,
            footprint: size * SCOPE_REGIONS,
            bytes_snapshotted: 0,
            regions: 0,
            snapshot_seconds: f64::INFINITY,
            bytes_restored: 0,
            restore_seconds: f64::INFINITY,
        };
        for round in 0..repeats.max(1) {
            let t = Instant::now();
            let mut snapshot = snapshotter.snapshot(&filter).map_err(|e| e.to_string())?;
            row.snapshot_seconds = row.snapshot_seconds.min(t.elapsed().as_secs_f64());
            row.bytes_snapshotted = snapshot.report().bytes_moved;
            row.regions = snapshot.report().regions;
            // The kernel's pass: it rewrites the buffer its argument points at.
            device
                .fill(referenced, size, 0xA0 ^ round as u8)
                .map_err(|e| e.to_string())?;
            let t = Instant::now();
            let report = snapshot
                .restore(&RestoreRequest {
                    next_pass: 1,
                    may_be_final: true,
                })
                .map_err(|e| e.error.to_string())?;
            row.restore_seconds = row.restore_seconds.min(t.elapsed().as_secs_f64());
            row.bytes_restored = report.bytes_moved;
            // Each round measures a snapshot that copies its scope: a footprint kept followed
            // since the round before, which the restore left as the store holds it, would be
            // snapshotted by a scan that copies nothing, whatever its scope.
            drop(snapshot);
            snapshotter.stop_following();
        }
        rows.push(row);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_referenced_scope_snapshots_one_percent_and_the_agent_scope_everything() {
        // Two rounds: the second snapshot copies its scope again, as the first did.
        let rows = run_scope_case(4 << 20, 2, true).unwrap();
        assert_eq!(rows.len(), 2);
        let (agent, referenced) = (&rows[0], &rows[1]);
        assert_eq!(agent.scope, SnapshotScope::Agent);
        assert_eq!(agent.bytes_snapshotted, agent.footprint);
        assert_eq!(agent.regions, SCOPE_REGIONS);
        assert_eq!(
            referenced.bytes_snapshotted,
            referenced.footprint / SCOPE_REGIONS
        );
        assert_eq!(referenced.regions, 1);
        for r in &rows {
            assert!(
                r.bytes_restored > 0 && r.bytes_restored <= r.bytes_snapshotted,
                "{r:?}"
            );
            assert!(r.snapshot_seconds.is_finite() && r.restore_seconds.is_finite());
        }
    }
}

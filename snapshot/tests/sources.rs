//! Regions beyond the owner-agent rule: allocations an address points into (any owner or kind
//! but executable), ranges the caller vouches for, and the per-source report.

mod common;

use std::sync::Arc;

use common::*;
use kreplay_snapshot::*;

fn config() -> SnapshotConfig {
    SnapshotConfig::default()
        .with_store(StoreTier::Host)
        .with_strategy(RestoreStrategy::Full)
        .with_chunk_size(4096)
}

#[test]
fn reached_allocations_of_any_owner_and_kind_are_restored_but_executable_memory_is_not() {
    let dev = TestDevice::new(Caps::default());
    let inv = Arc::new(Inventory::new());
    let own = dev.alloc(&inv, 8192, 1, MemoryKind::CoarseDevice, 1);
    let other = dev.alloc(&inv, 4096, 2, MemoryKind::CoarseDevice, 2);
    let fine = dev.alloc(&inv, 4096, 1, MemoryKind::FineDevice, 3);
    let host = dev.alloc(&inv, 4096, 9, MemoryKind::Host, 4);
    let code = dev.alloc(&inv, 4096, 1, MemoryKind::Executable, 5);
    let unrelated = dev.alloc(&inv, 4096, 2, MemoryKind::CoarseDevice, 6);
    let snap = snapshotter(&dev, &inv, config());
    let filter = Filter::for_replay(1)
        .reach(own + 10, RegionSource::Referenced)
        .reach(other + 100, RegionSource::Referenced)
        .reach(fine, RegionSource::Referenced)
        .reach(host + 4095, RegionSource::Adopted)
        .reach(code + 8, RegionSource::Referenced);
    let plan = snap.plan(&filter).unwrap();
    let b = plan.breakdown();
    assert_eq!(
        b.agent,
        SourceTally {
            regions: 1,
            bytes: 8192
        },
        "the agent's memory counts as agent memory even when referenced"
    );
    assert_eq!(
        b.referenced,
        SourceTally {
            regions: 2,
            bytes: 8192
        }
    );
    assert_eq!(
        b.adopted,
        SourceTally {
            regions: 1,
            bytes: 4096
        }
    );
    let mut s = snap.take(plan).unwrap();
    assert_eq!(s.report().sources, b);
    for (addr, seed) in [
        (own, 11),
        (other, 12),
        (fine, 13),
        (host, 14),
        (code, 15),
        (unrelated, 16),
    ] {
        dev.poke(addr, &pattern(4096, seed));
    }
    s.restore(&FINAL).unwrap();
    assert_eq!(dev.peek(own, 1), vec![1]);
    assert_eq!(dev.peek(other, 4096), vec![2; 4096]);
    assert_eq!(dev.peek(fine, 4096), vec![3; 4096]);
    assert_eq!(dev.peek(host, 4096), vec![4; 4096]);
    assert_eq!(
        dev.peek(code, 4096),
        pattern(4096, 15),
        "executable memory is never written"
    );
    assert_eq!(
        dev.peek(unrelated, 4096),
        pattern(4096, 16),
        "unreferenced memory of another agent is not touched"
    );
}

#[test]
fn a_reached_address_in_no_tracked_allocation_is_untracked_memory() {
    let dev = TestDevice::new(Caps::default());
    let inv = Arc::new(Inventory::new());
    dev.alloc(&inv, 4096, 1, MemoryKind::CoarseDevice, 1);
    let stray = dev.raw_alloc(4096, 0);
    let snap = snapshotter(&dev, &inv, config());
    let err = snap
        .plan(&Filter::for_replay(1).reach(stray + 4, RegionSource::Referenced))
        .unwrap_err();
    assert_eq!(err.reason(), "untracked_memory");
}

#[test]
fn vouched_ranges_are_restored_and_not_counted_twice_inside_a_selected_allocation() {
    let dev = TestDevice::new(Caps::default());
    let inv = Arc::new(Inventory::new());
    let own = dev.alloc(&inv, 4096, 1, MemoryKind::CoarseDevice, 1);
    // Loaded code: one untracked buffer holding a variable at +256 (the rest is code).
    let segment = dev.raw_alloc(4096, 7);
    let snap = snapshotter(&dev, &inv, config());
    let filter = Filter::referenced_only(1)
        .vouch(segment + 256, 8, RegionSource::ModuleVariable)
        .reach(own, RegionSource::Referenced)
        .vouch(own + 64, 16, RegionSource::ModuleVariable);
    let plan = snap.plan(&filter).unwrap();
    assert_eq!(plan.regions().len(), 2, "{:?}", plan.regions());
    let b = plan.breakdown();
    assert_eq!(
        b.module_variables,
        SourceTally {
            regions: 1,
            bytes: 8
        }
    );
    assert_eq!(
        b.referenced,
        SourceTally {
            regions: 1,
            bytes: 4096
        }
    );
    assert_eq!(
        b.agent,
        SourceTally::default(),
        "referenced_only selects nothing by the agent rule"
    );
    let mut s = snap.take(plan).unwrap();
    dev.poke(segment, &[9; 4096]);
    dev.poke(own, &[9; 4096]);
    s.restore(&FINAL).unwrap();
    let after = dev.peek(segment, 4096);
    assert_eq!(&after[256..264], &[7; 8], "the variable is restored");
    assert_eq!(after[255], 9, "bytes around the variable are not");
    assert_eq!(after[264], 9);
    assert_eq!(dev.peek(own, 4096), vec![1; 4096]);
}

#[test]
fn snapshot_scope_parses_its_two_names_and_nothing_else() {
    assert_eq!("agent".parse::<SnapshotScope>(), Ok(SnapshotScope::Agent));
    assert_eq!(
        " Referenced ".parse::<SnapshotScope>(),
        Ok(SnapshotScope::Referenced)
    );
    for bad in ["", "all", "ref", "agent,referenced"] {
        let err = bad.parse::<SnapshotScope>().unwrap_err().to_string();
        assert!(err.contains("agent, referenced"), "{err}");
    }
    assert_eq!(SnapshotConfig::default().scope, SnapshotScope::Agent);
}

//! An embedder's edge cases: allocations the runtime reports with sizes that run past the end of
//! the address space or add up past it, zero-length ranges, an address registered twice, and
//! restores after the memory under a snapshot changed.

mod common;

use std::sync::Arc;

use common::{Caps, TestDevice};
use kreplay_snapshot::*;

fn config() -> SnapshotConfig {
    SnapshotConfig::default()
        .with_chunk_size(4096)
        .with_store(StoreTier::Host)
        .with_strategy(RestoreStrategy::Full)
}

fn request() -> RestoreRequest {
    RestoreRequest {
        next_pass: 1,
        may_be_final: true,
    }
}

/// An allocation reported with a size running past the end of the address space (a corrupt
/// size from the runtime) made the sizes of a selection add up past `u64::MAX`: planning
/// panicked on the overflow (and in a release build wrapped, planning a few bytes).
#[test]
fn sizes_running_past_the_end_of_the_address_space_plan_without_overflowing() {
    let dev = TestDevice::new(Caps::default());
    let inv = Arc::new(Inventory::new());
    inv.on_alloc(NewAllocation {
        base: 0x1000,
        size: 0x1000,
        owner_agent: 1,
        kind: MemoryKind::CoarseDevice,
    });
    inv.on_alloc(NewAllocation {
        base: 0x10_0000,
        size: u64::MAX,
        owner_agent: 1,
        kind: MemoryKind::CoarseDevice,
    });
    assert_eq!(
        inv.get(0x10_0000).unwrap().size,
        u64::MAX - 0x10_0000,
        "tracked up to the end of the address space"
    );
    let snap = Snapshotter::new(inv, dev, config().with_max_bytes(Some(1 << 40))).unwrap();
    let planned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        snap.plan(&Filter::for_replay(1)).map(|p| p.bytes())
    }))
    .expect("planning does not panic");
    match planned {
        Err(SnapshotError::FootprintBudget { planned, .. }) => {
            assert_eq!(planned, u64::MAX - 0x10_0000 + 0x1000)
        }
        other => panic!("expected a budget decline, got {other:?}"),
    }
}

#[test]
fn an_allocation_running_past_the_end_of_the_address_space_is_declined_not_a_panic() {
    let dev = TestDevice::new(Caps::default());
    let inv = Arc::new(Inventory::new());
    inv.on_alloc(NewAllocation {
        base: u64::MAX - 0xfff,
        size: 0x2000,
        owner_agent: 1,
        kind: MemoryKind::CoarseDevice,
    });
    let snap = Snapshotter::new(inv, dev, config()).unwrap();
    let taken = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        snap.snapshot(&Filter::for_replay(1)).map(|s| s.bytes())
    }));
    match taken {
        Ok(Err(e)) => eprintln!("declined: {e}"),
        Ok(Ok(bytes)) => panic!("snapshot of memory that wraps past u64::MAX took {bytes}"),
        Err(_) => panic!("snapshot panicked"),
    }
}

#[test]
fn a_store_larger_than_memory_and_disk_is_declined_in_every_tier_not_an_abort() {
    let dev = TestDevice::new(Caps::default());
    let inv = Arc::new(Inventory::new());
    inv.on_alloc(NewAllocation {
        base: 0x1000,
        size: 1 << 62,
        owner_agent: 1,
        kind: MemoryKind::CoarseDevice,
    });
    for store in [StoreTier::Host, StoreTier::Auto, StoreTier::File] {
        let snap = Snapshotter::new(inv.clone(), dev.clone(), config().with_store(store)).unwrap();
        let e = snap
            .snapshot(&Filter::for_replay(1))
            .err()
            .expect("declined");
        assert_eq!(e.reason(), "snapshot_failed", "{store:?}: {e}");
    }
}

#[test]
fn a_zero_length_allocation_is_never_snapshotted_and_a_zero_length_vouch_adds_nothing() {
    let dev = TestDevice::new(Caps::default());
    let inv = Arc::new(Inventory::new());
    let a = dev.alloc(&inv, 8192, 1, MemoryKind::CoarseDevice, 1);
    inv.on_alloc(NewAllocation {
        base: a + 0x10_0000 - 16,
        size: 0,
        owner_agent: 1,
        kind: MemoryKind::CoarseDevice,
    });
    let snap = Snapshotter::new(inv.clone(), dev.clone(), config()).unwrap();
    let s = snap
        .snapshot(&Filter::for_replay(1).vouch(a, 0, RegionSource::ModuleVariable))
        .unwrap();
    assert_eq!(s.regions().len(), 1);
    assert_eq!(s.bytes(), 8192);
}

/// A zero-byte allocation reported inside a live one (a sub-allocator handing out an empty
/// block) dropped the live allocation as if its free had been missed: it was never snapshotted
/// again, so the passes of a replay overwrote it unrestored. So did forgetting zero bytes.
#[test]
fn a_zero_length_allocation_or_forget_inside_a_live_allocation_leaves_it_tracked_and_restored() {
    let dev = TestDevice::new(Caps::default());
    let inv = Arc::new(Inventory::new());
    let a = dev.alloc(&inv, 8192, 1, MemoryKind::CoarseDevice, 1);
    inv.on_alloc(NewAllocation {
        base: a + 4096,
        size: 0,
        owner_agent: 1,
        kind: MemoryKind::CoarseDevice,
    });
    assert_eq!(
        inv.forget_overlapping(a + 100, 0),
        0,
        "zero bytes overlap nothing"
    );
    for addr in [a, a + 4095, a + 4096, a + 8191] {
        assert_eq!(inv.lookup(addr).map(|x| x.base), Some(a), "{addr:#x}");
    }
    let snap = Snapshotter::new(inv.clone(), dev.clone(), config()).unwrap();
    let mut s = snap.snapshot(&Filter::for_replay(1)).unwrap();
    assert_eq!(s.bytes(), 8192);
    dev.poke(a + 5000, &[9; 100]);
    s.restore(&request()).unwrap();
    assert_eq!(dev.peek(a + 5000, 100), vec![1; 100]);
}

#[test]
fn restoring_twice_and_after_the_region_was_reallocated_with_another_size() {
    let dev = TestDevice::new(Caps::default());
    let inv = Arc::new(Inventory::new());
    let a = dev.alloc(&inv, 8192, 1, MemoryKind::CoarseDevice, 1);
    let snap = Snapshotter::new(inv.clone(), dev.clone(), config()).unwrap();
    let mut s = snap.snapshot(&Filter::for_replay(1)).unwrap();
    dev.poke(a, &[9; 100]);
    s.restore(&request()).unwrap();
    s.restore(&request()).unwrap();
    assert_eq!(dev.peek(a, 100), vec![1; 100]);
    // Freed and allocated again, smaller: never written into.
    dev.free(&inv, a);
    dev.raw_alloc_at(a, 4096, 7);
    inv.on_alloc(NewAllocation {
        base: a,
        size: 4096,
        owner_agent: 1,
        kind: MemoryKind::CoarseDevice,
    });
    let r = s.restore(&request()).unwrap();
    assert_eq!(r.regions_skipped, 1);
    assert_eq!(dev.peek(a, 4096), vec![7; 4096]);
}

#[test]
fn the_same_allocation_registered_twice_is_skipped_by_an_older_snapshot_and_reported() {
    let dev = TestDevice::new(Caps::default());
    let inv = Arc::new(Inventory::new());
    let a = dev.alloc(&inv, 8192, 1, MemoryKind::CoarseDevice, 1);
    let snap = Snapshotter::new(inv.clone(), dev.clone(), config()).unwrap();
    let mut s = snap.snapshot(&Filter::for_replay(1)).unwrap();
    inv.on_alloc(NewAllocation {
        base: a,
        size: 8192,
        owner_agent: 1,
        kind: MemoryKind::CoarseDevice,
    });
    let r = s.restore(&request()).unwrap();
    assert_eq!(r.regions_skipped, 1);
}

#[test]
fn dropping_the_snapshotter_before_its_snapshot_keeps_the_snapshot_usable() {
    let dev = TestDevice::new(Caps::default());
    let inv = Arc::new(Inventory::new());
    let a = dev.alloc(&inv, 8192, 1, MemoryKind::CoarseDevice, 1);
    let snap = Snapshotter::new(inv.clone(), dev.clone(), config()).unwrap();
    let mut s = snap.snapshot(&Filter::for_replay(1)).unwrap();
    drop(snap);
    dev.poke(a, &[9; 10]);
    s.restore(&request()).unwrap();
    assert_eq!(dev.peek(a, 10), vec![1; 10]);
}

#[test]
fn vouched_ranges_adjacent_and_overlapping_each_other_are_restored_once() {
    let dev = TestDevice::new(Caps::default());
    let inv = Arc::new(Inventory::new());
    let raw = dev.raw_alloc(3 * 4096, 3);
    let snap = Snapshotter::new(inv.clone(), dev.clone(), config()).unwrap();
    let filter = Filter::referenced_only(1)
        .vouch(raw, 4096, RegionSource::ModuleVariable)
        .vouch(raw + 4096, 4096, RegionSource::ModuleVariable)
        .vouch(raw + 100, 8192, RegionSource::ModuleVariable)
        .vouch(raw + 2 * 4096, 4096, RegionSource::ModuleVariable);
    let mut s = snap.snapshot(&filter).unwrap();
    assert_eq!(s.bytes(), 3 * 4096);
    dev.poke(raw, &[0; 3 * 4096]);
    s.restore(&request()).unwrap();
    assert_eq!(dev.peek(raw, 3 * 4096), vec![3; 3 * 4096]);
}

#[test]
fn a_vouched_range_running_past_u64_max_is_not_a_panic() {
    let dev = TestDevice::new(Caps::default());
    let inv = Arc::new(Inventory::new());
    let snap = Snapshotter::new(inv, dev, config()).unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        snap.plan(&Filter::referenced_only(1).vouch(
            u64::MAX - 10,
            100,
            RegionSource::ModuleVariable,
        ))
        .map(|p| p.bytes())
    }));
    eprintln!("{r:?}");
    assert!(r.is_ok());
}

//! Inventory behaviour: generations, lookups, filters, concurrency.

use std::sync::Arc;

use kreplay_snapshot::*;

#[test]
fn address_reused_after_free_is_a_new_generation() {
    let inv = Inventory::new();
    let g1 = inv.on_alloc(NewAllocation {
        base: 0x1000,
        size: 0x100,
        owner_agent: 1,
        kind: MemoryKind::CoarseDevice,
    });
    let old = inv.get(0x1000).unwrap().region();
    assert!(inv.is_live(&old));
    assert_eq!(inv.on_free(0x1000).unwrap().generation, g1);
    assert!(!inv.is_live(&old));
    let g2 = inv.on_alloc(NewAllocation {
        base: 0x1000,
        size: 0x100,
        owner_agent: 1,
        kind: MemoryKind::CoarseDevice,
    });
    assert!(g2 > g1);
    assert!(
        !inv.is_live(&old),
        "the old region must not match the new allocation"
    );
    assert!(inv.is_live(&inv.get(0x1000).unwrap().region()));
}

#[test]
fn lookup_finds_the_allocation_containing_an_address() {
    let inv = Inventory::new();
    inv.on_alloc(NewAllocation {
        base: 0x1000,
        size: 0x100,
        owner_agent: 1,
        kind: MemoryKind::CoarseDevice,
    });
    inv.on_alloc(NewAllocation {
        base: 0x2000,
        size: 0x10,
        owner_agent: 2,
        kind: MemoryKind::Kernarg,
    });
    assert_eq!(inv.lookup(0x1000).unwrap().base, 0x1000);
    assert_eq!(inv.lookup(0x10ff).unwrap().base, 0x1000);
    assert!(inv.lookup(0x1100).is_none());
    assert!(inv.lookup(0xfff).is_none());
    assert_eq!(inv.lookup(0x200f).unwrap().kind, MemoryKind::Kernarg);
    assert!(inv.get(0x1001).is_none());
    assert!(
        inv.on_free(0x1001).is_none(),
        "free takes a base, not an interior address"
    );
    assert_eq!(inv.len(), 2);
}

#[test]
fn overlapping_alloc_drops_stale_allocations_whose_free_was_missed() {
    let inv = Inventory::new();
    inv.on_alloc(NewAllocation {
        base: 0x1000,
        size: 0x1000,
        owner_agent: 1,
        kind: MemoryKind::CoarseDevice,
    });
    inv.on_alloc(NewAllocation {
        base: 0x3000,
        size: 0x1000,
        owner_agent: 1,
        kind: MemoryKind::CoarseDevice,
    });
    inv.on_alloc(NewAllocation {
        base: 0x5000,
        size: 0x1000,
        owner_agent: 1,
        kind: MemoryKind::CoarseDevice,
    });
    // Covers the tail of the first and all of the second; the third is untouched.
    inv.on_alloc(NewAllocation {
        base: 0x1800,
        size: 0x2000,
        owner_agent: 1,
        kind: MemoryKind::CoarseDevice,
    });
    let bases: Vec<u64> = inv.select(&Filter::any()).iter().map(|r| r.base).collect();
    assert_eq!(bases, vec![0x1800, 0x5000]);
}

#[test]
fn replay_filter_keeps_only_the_agents_coarse_device_memory() {
    let inv = Inventory::new();
    for (i, kind) in MemoryKind::ALL.iter().enumerate() {
        inv.on_alloc(NewAllocation {
            base: 0x10_0000 * (i as u64 + 1),
            size: 64,
            owner_agent: 1,
            kind: *kind,
        });
        inv.on_alloc(NewAllocation {
            base: 0x100_0000 * (i as u64 + 1),
            size: 64,
            owner_agent: 2,
            kind: *kind,
        });
    }
    inv.on_alloc(NewAllocation {
        base: 0x9000_0000,
        size: 0,
        owner_agent: 1,
        kind: MemoryKind::CoarseDevice,
    }); // empty: never selected
    let picked = inv.select(&Filter::for_replay(1));
    assert_eq!(picked.len(), 1);
    assert_eq!(
        inv.get(picked[0].base).unwrap().kind,
        MemoryKind::CoarseDevice
    );
    assert_eq!(inv.get(picked[0].base).unwrap().owner_agent, 1);

    assert_eq!(inv.select(&Filter::any()).len(), 10);
    assert_eq!(inv.select(&Filter::any().owner(2)).len(), 5);
    let fine_and_host = KindSet::only(MemoryKind::FineDevice).with(MemoryKind::Host);
    assert_eq!(inv.select(&Filter::any().kinds(fine_and_host)).len(), 4);
    assert_eq!(inv.select(&Filter::any().kinds(KindSet::EMPTY)).len(), 0);
    for kind in MemoryKind::ALL {
        assert_eq!(
            kind.is_snapshot_eligible(),
            kind == MemoryKind::CoarseDevice
        );
    }
}

#[test]
fn concurrent_allocs_and_frees_keep_the_inventory_exact() {
    let inv = Arc::new(Inventory::new());
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let inv = inv.clone();
            std::thread::spawn(move || {
                let mut gens = Vec::new();
                for i in 0..2000u64 {
                    let base = (t << 32) | (i << 8);
                    gens.push(inv.on_alloc(NewAllocation {
                        base,
                        size: 0x80,
                        owner_agent: t,
                        kind: MemoryKind::CoarseDevice,
                    }));
                    if i % 2 == 0 {
                        assert!(inv.on_free(base).is_some());
                    }
                }
                gens
            })
        })
        .collect();
    let mut gens: Vec<u64> = threads
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    assert_eq!(inv.len(), 4 * 1000);
    gens.sort_unstable();
    gens.dedup();
    assert_eq!(
        gens.len(),
        8000,
        "every allocation gets a distinct generation"
    );
}

#[test]
fn shared_types_can_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Inventory>();
    send_sync::<Snapshotter>();
    send_sync::<Snapshot>();
    send_sync::<SnapshotError>();
    send_sync::<RestoreError>();
}

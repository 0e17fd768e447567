//! Regions of odd sizes (1 byte, one short of a chunk, one past it), adjacent to each other,
//! with chunk sizes that are not powers of two, restored by every strategy from every store,
//! with and without the device's optional capabilities: every restore that may precede a final
//! pass leaves exactly the snapshotted bytes.

mod common;

use std::sync::Arc;

use common::*;
use kreplay_snapshot::*;

/// Sizes of adjacent allocations carved out of one device buffer.
const SIZES: [u64; 8] = [1, 511, 999, 1000, 1001, 12_295, 64, 4096];

fn carve(dev: &TestDevice, inv: &Inventory, agent: u64) -> (u64, u64) {
    let total: u64 = SIZES.iter().sum();
    let base = dev.raw_alloc(total, 0);
    dev.poke(base, &pattern(total as usize, agent));
    let mut at = base;
    for size in SIZES {
        inv.on_alloc(NewAllocation {
            base: at,
            size,
            owner_agent: agent,
            kind: MemoryKind::CoarseDevice,
        });
        at += size;
    }
    (base, total)
}

/// Writes a few bytes of every pass somewhere else: region edges, the middle, nowhere.
fn mutate(dev: &TestDevice, base: u64, total: u64, pass: u64) {
    let mut edges = vec![0u64, total - 1];
    let mut at = 0;
    for size in SIZES {
        edges.push(at);
        edges.push(at + size - 1);
        at += size;
    }
    match pass % 4 {
        0 => edges.iter().for_each(|&e| dev.poke(base + e, &[0xA5])),
        1 => dev.poke(base + total / 2, &pattern(2000, pass + 9)),
        2 => {}
        _ => dev.poke(base, &vec![0x5A; total as usize]),
    }
}

#[test]
fn odd_and_adjacent_regions_restore_exactly_under_every_strategy_store_and_chunk_size() {
    let caps_sets = [
        ("no capabilities", Caps::default()),
        (
            "host visible",
            Caps {
                host_visible: true,
                ..Default::default()
            },
        ),
        ("everything", Caps::all()),
    ];
    let strategies = [
        RestoreStrategy::Full,
        RestoreStrategy::Hash,
        RestoreStrategy::Writeset,
        RestoreStrategy::WritesetUnverified,
        RestoreStrategy::Tracked,
        RestoreStrategy::Auto,
    ];
    for (caps_name, caps) in caps_sets {
        for store in [StoreTier::Host, StoreTier::File, StoreTier::Auto] {
            // Spill files go to the system temporary directory.
            if store == StoreTier::File && !common::spill_room(&std::env::temp_dir(), 16 << 20) {
                continue;
            }
            for chunk in [512u64, 1000, 4096] {
                for strategy in strategies {
                    let what = format!("{caps_name}, {store:?}, chunk {chunk}, {strategy:?}");
                    let dev = TestDevice::new(caps);
                    let inv = Arc::new(Inventory::new());
                    let (base, total) = carve(&dev, &inv, 1);
                    let original = dev.peek(base, total);
                    let config = SnapshotConfig::default()
                        .with_strategy(strategy)
                        .with_store(store)
                        .with_chunk_size(chunk);
                    let snap = snapshotter(&dev, &inv, config);
                    let mut s = snap
                        .take_for_kernel(snap.plan(&Filter::for_replay(1)).unwrap(), 5)
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert_eq!(s.bytes(), total, "{what}");
                    assert_eq!(s.regions().len(), SIZES.len(), "{what}");
                    for pass in 0..8 {
                        mutate(&dev, base, total, pass);
                        let r = s
                            .restore(&RestoreRequest {
                                next_pass: pass + 1,
                                may_be_final: true,
                            })
                            .unwrap_or_else(|e| panic!("{what}, pass {pass}: {e}"));
                        assert!(!r.unverified, "{what}");
                        assert!(
                            dev.peek(base, total) == original,
                            "{what}: bytes differ after the restore following pass {pass}"
                        );
                    }
                }
            }
        }
    }
}

/// The same regions in a device shadow, with and without a host window on it (the software
/// runtime's shadows have one), hashing on the device, batched writes and pinning: restores
/// that hash through host windows read the store through the shadow's window, which must cover
/// the padding the store puts between regions of odd sizes, not only the regions' bytes.
#[test]
fn odd_and_adjacent_regions_restore_exactly_from_a_device_shadow_whatever_it_offers() {
    let shadow = Caps {
        shadow: true,
        ..Default::default()
    };
    for caps in [
        Caps {
            host_visible: true,
            ..shadow
        },
        shadow,
        Caps {
            batched: true,
            ..shadow
        },
        Caps {
            device_hash: true,
            ..shadow
        },
        Caps {
            host_visible: true,
            device_hash: true,
            ..shadow
        },
        Caps {
            host_visible: true,
            batched: true,
            pin: true,
            ..shadow
        },
        Caps::all(),
    ] {
        for chunk in [512u64, 1000, 4096] {
            for strategy in [
                RestoreStrategy::Hash,
                RestoreStrategy::Writeset,
                RestoreStrategy::WritesetUnverified,
                RestoreStrategy::Auto,
            ] {
                let what = format!("{caps:?}, chunk {chunk}, {strategy:?}");
                let dev = TestDevice::new(caps);
                let inv = Arc::new(Inventory::new());
                let (base, total) = carve(&dev, &inv, 1);
                let original = dev.peek(base, total);
                let config = SnapshotConfig::default()
                    .with_strategy(strategy)
                    .with_store(StoreTier::Device)
                    .with_chunk_size(chunk);
                let snap = snapshotter(&dev, &inv, config);
                let mut s = snap
                    .take_for_kernel(snap.plan(&Filter::for_replay(1)).unwrap(), 5)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(s.tier(), StoreTier::Device, "{what}");
                for pass in 0..8 {
                    mutate(&dev, base, total, pass);
                    s.restore(&RestoreRequest {
                        next_pass: pass + 1,
                        may_be_final: true,
                    })
                    .unwrap_or_else(|e| panic!("{what}, pass {pass}: {e}"));
                    assert!(
                        dev.peek(base, total) == original,
                        "{what}: bytes differ after the restore following pass {pass}"
                    );
                }
            }
        }
    }
}

/// Several threads snapshot and restore their own agents' memory through one snapshotter at
/// once (stores kept and reused between them, kernels learned side by side); each ends with its
/// own bytes, within a bound.
#[test]
fn one_snapshotter_shared_by_threads_restores_each_agent_exactly() {
    let dev = TestDevice::new(Caps {
        host_visible: true,
        ..Default::default()
    });
    let inv = Arc::new(Inventory::new());
    let snap = Arc::new(snapshotter(
        &dev,
        &inv,
        SnapshotConfig::default()
            .with_strategy(RestoreStrategy::Auto)
            .with_chunk_size(512),
    ));
    let (tx, rx) = std::sync::mpsc::channel();
    let mut handles = Vec::new();
    for agent in 1..=4u64 {
        let (base, total) = carve(&dev, &inv, agent);
        let original = dev.peek(base, total);
        let (dev, snap, tx) = (dev.clone(), snap.clone(), tx.clone());
        handles.push(std::thread::spawn(move || {
            for round in 0..20u64 {
                let plan = snap.plan(&Filter::for_replay(agent)).unwrap();
                let mut s = snap.take_for_kernel(plan, agent % 2).unwrap();
                for pass in 0..3 {
                    mutate(&dev, base, total, round + pass);
                    s.restore(&RestoreRequest {
                        next_pass: pass + 1,
                        may_be_final: true,
                    })
                    .unwrap();
                    assert!(dev.peek(base, total) == original, "agent {agent}");
                }
            }
            tx.send(agent).unwrap();
        }));
    }
    drop(tx);
    let mut done: Vec<u64> = (0..4)
        .map(|_| {
            rx.recv_timeout(std::time::Duration::from_secs(120))
                .expect("every thread finishes")
        })
        .collect();
    done.sort();
    assert_eq!(done, [1, 2, 3, 4]);
    for h in handles {
        h.join().unwrap();
    }
}

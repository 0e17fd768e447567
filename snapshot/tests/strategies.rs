//! Partial restores: hash, write set (learning, verification, repair), auto, batching.

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use common::*;
use kreplay_snapshot::*;

const CS: u64 = 4096;

fn config(strategy: RestoreStrategy, store: StoreTier) -> SnapshotConfig {
    SnapshotConfig::default()
        .with_strategy(strategy)
        .with_store(store)
        .with_chunk_size(CS)
}

/// One 64-chunk buffer with a known pattern.
fn setup(caps: Caps) -> (Arc<TestDevice>, Arc<Inventory>, u64, Vec<u8>) {
    let dev = TestDevice::new(caps);
    let inv = Arc::new(Inventory::new());
    let a = dev.alloc(&inv, 64 * CS, 1, MemoryKind::CoarseDevice, 0);
    let data = pattern((64 * CS) as usize, 1);
    dev.poke(a, &data);
    (dev, inv, a, data)
}

fn dirty(dev: &TestDevice, a: u64, chunks: &[u64]) {
    for &c in chunks {
        dev.poke(a + c * CS + 17, &[0xEE; 3]);
    }
}

#[test]
fn hash_restore_writes_only_changed_chunks_in_every_hashing_mode() {
    let modes = [
        (
            "host window",
            Caps {
                host_visible: true,
                ..Default::default()
            },
        ),
        ("scratch reads", Caps::default()),
        (
            "device hash",
            Caps {
                device_hash: true,
                ..Default::default()
            },
        ),
    ];
    for (name, caps) in modes {
        let (dev, inv, a, data) = setup(caps);
        let mut s = snapshotter(&dev, &inv, config(RestoreStrategy::Hash, StoreTier::Host))
            .snapshot(&Filter::for_replay(1))
            .unwrap();
        assert!(s.report().hashed);
        dirty(&dev, a, &[0, 5, 6, 63]);
        let r = s.restore(&not_final(1)).unwrap();
        assert_eq!(r.strategy, RestoreStrategy::Hash, "{name}");
        assert!(r.verified);
        assert_eq!(r.chunks_restored, 4, "{name}");
        assert_eq!(r.bytes_moved, 4 * CS, "{name}");
        assert_eq!(r.bytes_hashed, 64 * CS);
        assert_eq!(dev.peek(a, 64 * CS), data, "{name}");
        if caps.device_hash {
            assert!(dev.counters.hash_calls.load(Ordering::Relaxed) >= 1);
        }
        let r = s.restore(&not_final(2)).unwrap();
        assert_eq!(r.chunks_restored, 0, "{name}: nothing changed");
    }
}

#[test]
fn unverified_writeset_learns_after_pass_zero_then_restores_only_the_learned_chunks() {
    let (dev, inv, a, data) = setup(Caps::default());
    let mut s = snapshotter(
        &dev,
        &inv,
        config(RestoreStrategy::WritesetUnverified, StoreTier::Host),
    )
    .snapshot(&Filter::for_replay(1))
    .unwrap();
    assert_eq!(s.learned_chunks(), None);
    dirty(&dev, a, &[3, 4]);
    let r = s.restore(&not_final(1)).unwrap();
    assert!(r.verified, "the first restore learns by hashing");
    assert_eq!(r.strategy, RestoreStrategy::Writeset);
    assert_eq!(r.chunks_restored, 2);
    assert_eq!(s.learned_chunks(), Some(2));

    dirty(&dev, a, &[3, 4]);
    let plan = s.plan_restore(&not_final(2));
    assert!(!plan.verify);
    assert_eq!(plan.bytes_planned, 2 * CS);
    assert_eq!(plan.bytes_to_hash, 0);
    let reads_before = dev.counters.reads.load(Ordering::Relaxed);
    let r = s.restore(&not_final(2)).unwrap();
    assert!(!r.verified);
    assert!(r.unverified, "the shortcut reports itself");
    assert_eq!(r.bytes_hashed, 0);
    assert_eq!(r.chunks_restored, 2);
    assert_eq!(
        dev.counters.reads.load(Ordering::Relaxed),
        reads_before,
        "no device reads without verification"
    );
    assert_eq!(dev.peek(a, 64 * CS), data);
}

#[test]
fn unverified_writeset_misses_a_change_outside_the_set_until_the_final_verification() {
    let (dev, inv, a, data) = setup(Caps {
        host_visible: true,
        ..Default::default()
    });
    let mut s = snapshotter(
        &dev,
        &inv,
        config(RestoreStrategy::WritesetUnverified, StoreTier::Host),
    )
    .snapshot(&Filter::for_replay(1))
    .unwrap();
    dirty(&dev, a, &[10]);
    s.restore(&not_final(1)).unwrap(); // learns {10}
    // The writer's write set grows: chunk 20 is written too.
    dirty(&dev, a, &[10, 20]);
    let r = s.restore(&not_final(2)).unwrap();
    assert!(!r.verified);
    assert_eq!(r.chunks_restored, 1);
    assert_ne!(
        dev.peek(a, 64 * CS),
        data,
        "unverified restore misses chunk 20"
    );
    dirty(&dev, a, &[10]);
    // The next pass may be the final one: verification is forced.
    let plan = s.plan_restore(&FINAL);
    assert!(plan.verify);
    let r = s.restore(&FINAL).unwrap();
    assert!(r.verified);
    assert_eq!(r.repaired_chunks, 1, "chunk 20 repaired and reported");
    assert_eq!(r.chunks_restored, 2);
    assert_eq!(s.learned_chunks(), Some(2));
    assert_eq!(dev.peek(a, 64 * CS), data);
}

#[test]
fn unverified_writeset_verifies_every_kth_restore() {
    let (dev, inv, _a, _data) = setup(Caps::default());
    let mut s = snapshotter(
        &dev,
        &inv,
        config(RestoreStrategy::WritesetUnverified, StoreTier::Host).with_verify_every(3),
    )
    .snapshot(&Filter::for_replay(1))
    .unwrap();
    let verified: Vec<bool> = (1..=7)
        .map(|p| s.restore(&not_final(p)).unwrap().verified)
        .collect();
    assert_eq!(verified, [true, false, false, true, false, false, true]);

    let mut s = snapshotter(
        &dev,
        &inv,
        config(RestoreStrategy::WritesetUnverified, StoreTier::Host).with_verify_every(0),
    )
    .snapshot(&Filter::for_replay(1))
    .unwrap();
    let verified: Vec<bool> = (1..=4)
        .map(|p| {
            let req = RestoreRequest {
                next_pass: p,
                may_be_final: p == 4,
            };
            s.restore(&req).unwrap().verified
        })
        .collect();
    assert_eq!(verified, [true, false, false, true]);
}

#[test]
fn auto_restores_small_snapshots_in_full() {
    let (dev, inv, a, data) = setup(Caps::default()); // 256 KiB < 1 MiB
    let mut s = snapshotter(&dev, &inv, config(RestoreStrategy::Auto, StoreTier::Host))
        .snapshot(&Filter::for_replay(1))
        .unwrap();
    assert_eq!(s.report().strategy, RestoreStrategy::Full);
    assert!(!s.report().hashed);
    dirty(&dev, a, &[1]);
    let r = s.restore(&FINAL).unwrap();
    assert_eq!(r.strategy, RestoreStrategy::Full);
    assert_eq!(r.chunks_restored, 64);
    assert_eq!(dev.peek(a, 64 * CS), data);
}

#[test]
fn auto_learns_a_write_set_and_switches_to_full_when_most_chunks_change() {
    let dev = TestDevice::new(Caps {
        host_visible: true,
        ..Default::default()
    });
    let inv = Arc::new(Inventory::new());
    let n = 512u64; // 2 MiB of 4 KiB chunks
    let a = dev.alloc(&inv, n * CS, 1, MemoryKind::CoarseDevice, 0);
    let data = pattern((n * CS) as usize, 2);
    dev.poke(a, &data);
    let mut s = snapshotter(&dev, &inv, config(RestoreStrategy::Auto, StoreTier::Host))
        .snapshot(&Filter::for_replay(1))
        .unwrap();
    assert_eq!(s.report().strategy, RestoreStrategy::Writeset);
    dirty(&dev, a, &[7]);
    let r = s.restore(&not_final(1)).unwrap();
    assert_eq!(
        (r.strategy, r.verified, r.chunks_restored),
        (RestoreStrategy::Writeset, true, 1)
    );
    dirty(&dev, a, &[7]);
    let r = s.restore(&not_final(2)).unwrap();
    assert_eq!(
        (r.strategy, r.verified, r.unverified, r.chunks_restored),
        (RestoreStrategy::Writeset, true, false, 1),
        "auto never takes the unverified shortcut"
    );
    // Now most of memory changes; the forced verification sees it.
    let most: Vec<u64> = (0..n).filter(|c| c % 4 != 0).collect();
    dirty(&dev, a, &most);
    let r = s.restore(&FINAL).unwrap();
    assert!(r.verified);
    assert_eq!(r.chunks_restored, most.len() as u64);
    assert_eq!(dev.peek(a, n * CS), data);
    let r = s.restore(&not_final(4)).unwrap();
    assert_eq!(r.strategy, RestoreStrategy::Full);
    assert_eq!(r.chunks_restored, n);
}

#[test]
fn auto_on_a_device_shadow_without_a_hash_kernel_restores_in_full() {
    let dev = TestDevice::new(Caps {
        shadow: true,
        ..Default::default()
    });
    let inv = Arc::new(Inventory::new());
    let a = dev.alloc(&inv, 2 << 20, 1, MemoryKind::CoarseDevice, 9);
    let mut s = snapshotter(&dev, &inv, config(RestoreStrategy::Auto, StoreTier::Auto))
        .snapshot(&Filter::for_replay(1))
        .unwrap();
    assert_eq!(s.tier(), StoreTier::Device);
    assert_eq!(s.report().strategy, RestoreStrategy::Full);
    dev.poke(a, &[1; 100]);
    let copies = dev.counters.device_copies.load(Ordering::Relaxed);
    let r = s.restore(&FINAL).unwrap();
    assert_eq!(r.tier, StoreTier::Device);
    assert_eq!(
        dev.counters.device_copies.load(Ordering::Relaxed),
        copies + 1,
        "one batch"
    );
    assert_eq!(r.bytes_moved, 2 << 20);
    assert_eq!(dev.peek(a, 100), vec![9; 100]);
}

#[test]
fn device_shadow_with_device_hash_restores_scattered_chunks_in_one_device_copy() {
    let (dev, inv, a, data) = setup(Caps {
        shadow: true,
        device_hash: true,
        ..Default::default()
    });
    let mut s = snapshotter(&dev, &inv, config(RestoreStrategy::Hash, StoreTier::Device))
        .snapshot(&Filter::for_replay(1))
        .unwrap();
    dirty(&dev, a, &[1, 9, 30, 31, 50]);
    let copies = dev.counters.device_copies.load(Ordering::Relaxed);
    let r = s.restore(&FINAL).unwrap();
    assert_eq!(r.chunks_restored, 5);
    assert_eq!(
        dev.counters.device_copies.load(Ordering::Relaxed),
        copies + 1
    );
    assert_eq!(dev.peek(a, 64 * CS), data);
}

#[test]
fn a_device_hash_restore_hashes_every_region_in_one_batched_call() {
    let dev = TestDevice::new(Caps {
        shadow: true,
        device_hash: true,
        ..Default::default()
    });
    let inv = Arc::new(Inventory::new());
    // Several 1 MiB pieces in one region, and a second region.
    let a = dev.alloc(&inv, 3 << 20, 1, MemoryKind::CoarseDevice, 0);
    let b = dev.alloc(&inv, 1 << 20, 1, MemoryKind::CoarseDevice, 0);
    let (da, db) = (pattern(3 << 20, 1), pattern(1 << 20, 2));
    dev.poke(a, &da);
    dev.poke(b, &db);
    for strategy in [
        RestoreStrategy::Hash,
        RestoreStrategy::Writeset,
        RestoreStrategy::WritesetUnverified,
    ] {
        let mut s = snapshotter(&dev, &inv, config(strategy, StoreTier::Device))
            .snapshot(&Filter::for_replay(1))
            .unwrap();
        for round in 0..3 {
            dirty(&dev, a, &[5, 300, 700]);
            dirty(&dev, b, &[100]);
            let before = dev.counters.hash_batches.load(Ordering::Relaxed);
            let r = s
                .restore(&RestoreRequest {
                    next_pass: round + 1,
                    may_be_final: round == 2,
                })
                .unwrap();
            let batches = dev.counters.hash_batches.load(Ordering::Relaxed) - before;
            let expected = u64::from(r.verified);
            assert_eq!(batches, expected, "{strategy}, restore {round}: hash calls");
            assert_eq!(r.chunks_restored, 4, "{strategy}, restore {round}");
            assert_eq!(dev.peek(a, 3 << 20), da, "{strategy}, restore {round}");
            assert_eq!(dev.peek(b, 1 << 20), db, "{strategy}, restore {round}");
        }
    }
}

#[test]
fn scattered_chunk_restores_are_one_batched_call_when_the_device_batches() {
    let (dev, inv, a, data) = setup(Caps {
        batched: true,
        ..Default::default()
    });
    let mut s = snapshotter(&dev, &inv, config(RestoreStrategy::Hash, StoreTier::Host))
        .snapshot(&Filter::for_replay(1))
        .unwrap();
    dirty(&dev, a, &[2, 8, 9, 40]);
    let r = s.restore(&FINAL).unwrap();
    assert_eq!(r.chunks_restored, 4);
    assert_eq!(dev.counters.batches.load(Ordering::Relaxed), 1);
    assert_eq!(
        dev.counters.writes.load(Ordering::Relaxed),
        3,
        "adjacent dirty chunks 8 and 9 merged into one write"
    );
    assert_eq!(dev.peek(a, 64 * CS), data);
}

#[test]
fn hash_pass_that_cannot_read_memory_falls_back_to_a_full_restore() {
    let (dev, inv, a, data) = setup(Caps::default());
    let mut s = snapshotter(&dev, &inv, config(RestoreStrategy::Hash, StoreTier::Host))
        .snapshot(&Filter::for_replay(1))
        .unwrap();
    dirty(&dev, a, &[12]);
    dev.fail_reads.store(true, Ordering::Relaxed);
    let r = s.restore(&FINAL).unwrap();
    assert_eq!(r.strategy, RestoreStrategy::Full);
    assert!(!r.verified);
    assert_eq!(r.chunks_restored, 64);
    assert_eq!(dev.peek(a, 64 * CS), data);
}

#[test]
fn restore_plan_matches_what_the_restore_does() {
    let (dev, inv, a, _) = setup(Caps::default());
    let mut s = snapshotter(
        &dev,
        &inv,
        config(RestoreStrategy::Writeset, StoreTier::Host),
    )
    .snapshot(&Filter::for_replay(1))
    .unwrap();
    for pass in 1..6 {
        dirty(&dev, a, &[pass]);
        let req = not_final(pass);
        let plan = s.plan_restore(&req);
        let r = s.restore(&req).unwrap();
        assert_eq!(plan.strategy, r.strategy);
        assert_eq!(plan.verify, r.verified);
        assert_eq!(plan.bytes_planned, r.bytes_planned);
        assert!(r.bytes_moved <= plan.bytes_planned);
    }
}

#[test]
fn auto_on_a_host_visible_device_shadow_learns_a_write_set() {
    let dev = TestDevice::new(Caps {
        shadow: true,
        host_visible: true,
        ..Default::default()
    });
    let inv = Arc::new(Inventory::new());
    let a = dev.alloc(&inv, 2 << 20, 1, MemoryKind::CoarseDevice, 9);
    let mut s = snapshotter(&dev, &inv, config(RestoreStrategy::Auto, StoreTier::Auto))
        .snapshot(&Filter::for_replay(1))
        .unwrap();
    assert_eq!(s.tier(), StoreTier::Device);
    assert_eq!(s.report().strategy, RestoreStrategy::Writeset);
    dev.poke(a + 5 * CS, &[1; 10]);
    let r = s.restore(&FINAL).unwrap();
    assert_eq!(
        (r.strategy, r.chunks_restored),
        (RestoreStrategy::Writeset, 1)
    );
    assert_eq!(dev.peek(a + 5 * CS, 10), vec![9; 10]);
}

/// docs/abi.md §3 rule 11: under `writeset` and under `auto` above the full-restore threshold, a pass
/// that writes outside the set learned from pass 0 must not make the next pass start from bytes
/// the first pass never saw: every restore verifies, repairs and reports the repair.
#[test]
fn verified_writeset_and_auto_repair_a_write_outside_the_learned_set_before_the_very_next_pass() {
    for strategy in [RestoreStrategy::Writeset, RestoreStrategy::Auto] {
        let dev = TestDevice::new(Caps::default());
        let inv = Arc::new(Inventory::new());
        let n = 512u64; // 2 MiB: auto learns a write set
        let a = dev.alloc(&inv, n * CS, 1, MemoryKind::CoarseDevice, 0);
        let data = pattern((n * CS) as usize, 5);
        dev.poke(a, &data);
        let mut s = snapshotter(&dev, &inv, config(strategy, StoreTier::Host))
            .snapshot(&Filter::for_replay(1))
            .unwrap();
        assert_eq!(
            s.report().strategy,
            RestoreStrategy::Writeset,
            "{strategy:?}"
        );
        dirty(&dev, a, &[3]);
        let r = s.restore(&not_final(1)).unwrap();
        assert_eq!((r.chunks_restored, r.repaired_chunks), (1, 0));
        // Pass 1 writes chunk 3 again and chunk 40, outside the learned set; the next pass is
        // not a possible final one.
        dirty(&dev, a, &[3, 40]);
        let plan = s.plan_restore(&not_final(2));
        assert!(plan.verify, "{strategy:?}: every restore verifies");
        let r = s.restore(&not_final(2)).unwrap();
        assert_eq!(
            dev.peek(a, n * CS),
            data,
            "{strategy:?}: pass 2 starts from the bytes pass 0 saw"
        );
        assert!(r.verified && !r.unverified, "{strategy:?}");
        assert_eq!(r.repaired_chunks, 1, "{strategy:?}: the repair is reported");
        assert_eq!(
            r.chunks_restored, 2,
            "{strategy:?}: only changed chunks are written"
        );
        assert_eq!(r.bytes_moved, 2 * CS);
        assert_eq!(
            r.bytes_hashed,
            (n - 1) * CS,
            "{strategy:?}: every chunk outside the learned set is hashed (chunk 3, in the set, \
             is written from the store)"
        );
    }
}

/// What the restores of one snapshot reported and left: (chunks restored, repaired, bytes
/// moved, bytes hashed, verified) per restore, and whether memory equalled the snapshot after
/// each.
fn restore_rounds(
    caps: Caps,
    strategy: RestoreStrategy,
    store: StoreTier,
    refuse_host: bool,
) -> Vec<(u64, u64, u64, u64, bool, bool)> {
    let dev = TestDevice::new(caps);
    dev.verified_device_stores_only
        .store(refuse_host, Ordering::Relaxed);
    let inv = Arc::new(Inventory::new());
    // Two regions; the second ends in a short chunk.
    let a = dev.alloc(&inv, 40 * CS, 1, MemoryKind::CoarseDevice, 0);
    let b = dev.alloc(&inv, 20 * CS + 100, 1, MemoryKind::CoarseDevice, 0);
    let (da, db) = (
        pattern((40 * CS) as usize, 7),
        pattern((20 * CS + 100) as usize, 8),
    );
    dev.poke(a, &da);
    dev.poke(b, &db);
    let mut s = snapshotter(&dev, &inv, config(strategy, store))
        .snapshot(&Filter::for_replay(1))
        .unwrap();
    let mut out = Vec::new();
    for round in 0..4u64 {
        dirty(&dev, a, &[2, 3, 39]);
        // The short last chunk of b, then (from round 2) a chunk outside what was learned.
        dev.poke(b + 20 * CS + 50, &[round as u8 + 1; 4]);
        if round >= 2 {
            dirty(&dev, b, &[round]);
        }
        let r = s
            .restore(&RestoreRequest {
                next_pass: round + 1,
                may_be_final: round == 3,
            })
            .unwrap();
        let same = dev.peek(a, 40 * CS) == da && dev.peek(b, 20 * CS + 100) == db;
        out.push((
            r.chunks_restored,
            r.repaired_chunks,
            r.bytes_moved,
            r.bytes_hashed,
            r.verified,
            same,
        ));
    }
    out
}

#[test]
fn a_verified_restore_done_by_the_device_in_one_call_reports_and_leaves_what_two_steps_do() {
    let with = Caps {
        shadow: true,
        device_hash: true,
        verified_restore: true,
        pin: true,
        ..Default::default()
    };
    let without = Caps {
        verified_restore: false,
        ..with
    };
    for store in [StoreTier::Device, StoreTier::Host] {
        for strategy in [
            RestoreStrategy::Hash,
            RestoreStrategy::Writeset,
            RestoreStrategy::WritesetUnverified,
        ] {
            let fused = restore_rounds(with, strategy, store, false);
            let two_steps = restore_rounds(without, strategy, store, false);
            assert_eq!(fused, two_steps, "{strategy} on {store:?}");
            // Every verified restore leaves the snapshot (an unverified one may miss a write
            // outside the set until the next verification, by design).
            assert!(
                fused.iter().all(|r| r.5 || !r.4),
                "{strategy} on {store:?}: {fused:?}"
            );
            // The device's own path is taken: one call per verified restore, no hash batch.
            let dev = TestDevice::new(with);
            let inv = Arc::new(Inventory::new());
            let x = dev.alloc(&inv, 8 * CS, 1, MemoryKind::CoarseDevice, 0);
            let data = pattern((8 * CS) as usize, 3);
            dev.poke(x, &data);
            let mut s = snapshotter(&dev, &inv, config(strategy, store))
                .snapshot(&Filter::for_replay(1))
                .unwrap();
            let hashes_before = dev.counters.hash_batches.load(Ordering::Relaxed);
            dirty(&dev, x, &[4]);
            let r = s.restore(&FINAL).unwrap();
            assert_eq!(dev.peek(x, 8 * CS), data);
            assert_eq!((r.chunks_restored, r.bytes_moved), (1, CS));
            assert_eq!(dev.counters.verified_restores.load(Ordering::Relaxed), 1);
            assert_eq!(
                dev.counters.hash_batches.load(Ordering::Relaxed),
                hashes_before,
                "{strategy} on {store:?}: no separate hash call"
            );
        }
    }
}

#[test]
fn a_device_that_cannot_do_a_verified_restore_of_a_store_leaves_it_to_the_two_step_path() {
    let caps = Caps {
        shadow: true,
        device_hash: true,
        verified_restore: true,
        ..Default::default()
    };
    let refused = restore_rounds(caps, RestoreStrategy::Writeset, StoreTier::Host, true);
    let two_steps = restore_rounds(
        Caps {
            verified_restore: false,
            ..caps
        },
        RestoreStrategy::Writeset,
        StoreTier::Host,
        false,
    );
    assert_eq!(refused, two_steps);
    assert!(refused.iter().all(|r| r.5));
}

#[test]
fn a_verified_device_restore_that_fails_part_way_is_followed_by_a_full_restore() {
    let dev = TestDevice::new(Caps {
        shadow: true,
        device_hash: true,
        verified_restore: true,
        ..Default::default()
    });
    let (inv, n) = (Arc::new(Inventory::new()), 64u64);
    let a = dev.alloc(&inv, n * CS, 1, MemoryKind::CoarseDevice, 0);
    let data = pattern((n * CS) as usize, 4);
    dev.poke(a, &data);
    let mut s = snapshotter(&dev, &inv, config(RestoreStrategy::Hash, StoreTier::Device))
        .snapshot(&Filter::for_replay(1))
        .unwrap();
    dirty(&dev, a, &[1, 2, 60]);
    dev.fail_verified.store(true, Ordering::Relaxed);
    let r = s.restore(&not_final(1)).unwrap();
    assert_eq!(r.strategy, RestoreStrategy::Full);
    assert_eq!(r.bytes_moved, n * CS);
    assert_eq!(dev.peek(a, n * CS), data);
}

#[test]
fn writeset_unverified_is_parsed_as_its_own_opt_in() {
    assert_eq!(
        "writeset-unverified".parse::<RestoreStrategy>(),
        Ok(RestoreStrategy::WritesetUnverified)
    );
    assert_eq!(
        RestoreStrategy::WritesetUnverified.as_str(),
        "writeset-unverified"
    );
}

/// auto carries what a dispatch learned to the next dispatch of the same kernel: a kernel that
/// rewrites most of memory gets full restores without the snapshot's hashes, one that writes a
/// few chunks gets its learned set written from the store and the rest hashed; either way
/// every pass starts from that dispatch's snapshot.
#[test]
fn auto_reuses_what_earlier_dispatches_of_a_kernel_learned() {
    let dev = TestDevice::new(Caps {
        host_visible: true,
        ..Default::default()
    });
    let inv = Arc::new(Inventory::new());
    let n = 512u64; // 2 MiB of 4 KiB chunks: above auto's full-restore threshold
    let a = dev.alloc(&inv, n * CS, 1, MemoryKind::CoarseDevice, 0);
    dev.poke(a, &pattern((n * CS) as usize, 9));
    let snapshotter = snapshotter(&dev, &inv, config(RestoreStrategy::Auto, StoreTier::Host));
    let take = |kernel| {
        let plan = snapshotter.plan(&Filter::for_replay(1)).unwrap();
        snapshotter.take_for_kernel(plan, kernel).unwrap()
    };
    let most: Vec<u64> = (0..n).filter(|c| c % 8 != 0).collect();
    let few = [5u64, 300];
    for dispatch in 0..3 {
        // The kernel that writes few chunks first: a new kernel after one that rewrote most of
        // memory is guessed to rewrite as much and restored in full when its replay is short
        // (see `auto_guesses_what_a_new_kernel_changes_from_the_kernels_replayed_before_it`).
        for (kernel, writes) in [(2u64, &few[..]), (1, &most[..])] {
            let before = dev.peek(a, n * CS);
            let mut s = take(kernel);
            let mut strategies = Vec::new();
            for pass in 0..3u64 {
                dirty(&dev, a, writes);
                let r = s.restore(&not_final(pass + 1)).unwrap();
                assert_eq!(
                    dev.peek(a, n * CS),
                    before,
                    "kernel {kernel} dispatch {dispatch} pass {pass}"
                );
                strategies.push((r.strategy, r.bytes_hashed));
            }
            match (kernel, dispatch) {
                // Nothing learned yet: the first restore hashes everything.
                (_, 0) => assert_eq!(strategies[0], (RestoreStrategy::Writeset, n * CS)),
                (1, _) => {
                    assert_eq!(
                        s.report().strategy,
                        RestoreStrategy::Full,
                        "no hashes taken"
                    );
                    assert!(
                        strategies
                            .iter()
                            .all(|&(st, h)| st == RestoreStrategy::Full && h == 0),
                        "{strategies:?}"
                    );
                }
                _ => assert!(
                    strategies
                        .iter()
                        .all(|&(st, h)| st == RestoreStrategy::Writeset && h == (n - 2) * CS),
                    "the learned set is written, the rest hashed: {strategies:?}"
                ),
            }
            // The application changes memory between dispatches.
            dirty(&dev, a, &[100 + dispatch]);
        }
    }
    assert_eq!(snapshotter.kernels_learned(), 2);
}

/// auto took a snapshot without hashes because the replays before it restored once (a 2-pass
/// tool), and then the replay runs 20 passes: once it has run past the restores expected, the
/// store (which holds the snapshot's bytes) is hashed once and the remaining restores hash and
/// write what changed (the learned set from the store, the rest hashed) instead of copying
/// everything 19 times. Every pass still starts from the snapshot's bytes, in two regions (the
/// second not a whole number of chunks), and a write outside the learned set late in the
/// replay is found and repaired before the very next pass.
#[test]
fn auto_hashes_the_store_when_a_replay_runs_past_the_restores_it_expected() {
    let dev = TestDevice::new(Caps {
        host_visible: true,
        ..Default::default()
    });
    let inv = Arc::new(Inventory::new());
    // 2 MiB in all (above auto's full-restore threshold, below the size whose timings teach
    // rates: the default rates decide, so the choice is the same on every machine).
    let (n1, n2) = (300u64, 211u64);
    let a = dev.alloc(&inv, n1 * CS, 1, MemoryKind::CoarseDevice, 0);
    let b = dev.alloc(&inv, n2 * CS + 1000, 1, MemoryKind::CoarseDevice, 0);
    dev.poke(a, &pattern((n1 * CS) as usize, 11));
    dev.poke(b, &pattern((n2 * CS + 1000) as usize, 12));
    let all = n1 * CS + n2 * CS + 1000;
    let snapshotter = snapshotter(&dev, &inv, config(RestoreStrategy::Auto, StoreTier::Host));
    let take = |kernel| {
        let plan = snapshotter.plan(&Filter::for_replay(1)).unwrap();
        snapshotter.take_for_kernel(plan, kernel).unwrap()
    };
    let memory = || (dev.peek(a, n1 * CS), dev.peek(b, n2 * CS + 1000));

    // A 2-pass replay of another kernel: one restore.
    let before = memory();
    let mut s = take(1);
    dirty(&dev, a, &[3]);
    s.restore(&FINAL).unwrap();
    assert_eq!(memory(), before);
    drop(s);

    // A new kernel, 20 passes, writing a few chunks of both regions each pass.
    let mut s = take(2);
    assert!(
        !s.report().hashed,
        "one restore expected: the snapshot's hashes would not pay"
    );
    let mut restores = Vec::new();
    for pass in 0..19u64 {
        dirty(&dev, a, &[5, 120]);
        dirty(&dev, b, &[7, n2]); // chunk n2 is the last, partial one
        if pass == 15 {
            dirty(&dev, a, &[250]); // outside what the earlier passes wrote
        }
        let req = RestoreRequest {
            next_pass: pass + 1,
            may_be_final: pass == 18,
        };
        let plan = s.plan_restore(&req);
        let r = s.restore(&req).unwrap();
        assert_eq!(
            memory(),
            before,
            "pass {} starts from the snapshot",
            pass + 1
        );
        assert_eq!(
            (plan.strategy, plan.verify, plan.bytes_planned),
            (r.strategy, r.verified, r.bytes_planned),
            "RESTORE ENTER's plan is what restore {} does",
            pass + 1
        );
        restores.push(r);
    }
    let full = restores.iter().filter(|r| !r.verified).count();
    assert!(
        full <= 2,
        "the store is hashed once the replay runs past one restore: {full} full restores"
    );
    assert!(restores.iter().all(|r| r.verified || r.bytes_moved == all));
    let late = &restores[full + 1..];
    assert!(
        late.iter().all(|r| r.verified
            && !r.unverified
            && r.bytes_hashed < all
            && r.bytes_moved < all / 10),
        "the learned set is written from the store and the rest hashed: {late:?}"
    );
    assert_eq!(
        restores[15].repaired_chunks, 1,
        "the write outside the set is repaired before the next pass"
    );
}

/// Replays `restores` restores of `snapshot`, `writes` changed before each (and after the last
/// pass, which is not restored); every pass must start from `before`.
fn replay_restores(
    dev: &TestDevice,
    a: u64,
    snapshot: &mut Snapshot,
    restores: u64,
    writes: &[u64],
    before: &[u8],
) {
    let len = before.len() as u64;
    for pass in 0..restores {
        dirty(dev, a, writes);
        let req = RestoreRequest {
            next_pass: pass + 1,
            may_be_final: pass + 1 == restores,
        };
        snapshot.restore(&req).unwrap();
        assert_eq!(
            dev.peek(a, len),
            before,
            "pass {} starts from the snapshot",
            pass + 1
        );
    }
    dirty(dev, a, writes);
}

/// Under `auto`, the restores the replay plans decide whether the snapshot hashes, not what
/// other dispatches restored: after a 38-pass replay of one kernel, a 2-pass replay of a new
/// kernel (1 restore planned) copies without hashing, since one restore cannot repay the
/// hashes; so does a 2-pass replay of the 38-pass kernel itself; and after those short replays
/// a 38-pass replay of a new kernel hashes at once instead of copying everything until it runs
/// past the one restore the short replays suggest. Every pass starts from the snapshot's bytes
/// whatever was chosen.
#[test]
fn auto_hashes_a_snapshot_only_when_the_restores_planned_for_it_repay_the_hashes() {
    let dev = TestDevice::new(Caps {
        host_visible: true,
        ..Default::default()
    });
    let inv = Arc::new(Inventory::new());
    // 2 MiB: above auto's full-restore threshold, below the size whose timings teach rates,
    // so the default rates decide on every machine (a restore saves 0.4 of a copy at best,
    // hashing adds 0.6 of one to the snapshot: 1 restore does not repay it, 2 do).
    let n = 512u64;
    let a = dev.alloc(&inv, n * CS, 1, MemoryKind::CoarseDevice, 0);
    dev.poke(a, &pattern((n * CS) as usize, 21));
    let snapshotter = snapshotter(&dev, &inv, config(RestoreStrategy::Auto, StoreTier::Host));
    let take = |kernel, restores| {
        let plan = snapshotter
            .plan(&Filter::for_replay(1))
            .unwrap()
            .with_planned_restores(Some(restores));
        snapshotter.take_for_kernel(plan, kernel).unwrap()
    };
    let writes = [3u64, 200, 411];
    let replay = |kernel, restores| {
        let before = dev.peek(a, n * CS);
        let mut s = take(kernel, restores);
        let hashed = s.report().hashed;
        replay_restores(&dev, a, &mut s, restores, &writes, &before);
        hashed
    };

    assert!(
        replay(1, 37),
        "a first dispatch planning 37 restores hashes"
    );
    assert!(
        !replay(2, 1),
        "a new kernel's 2-pass replay after a 38-pass one: 1 restore cannot repay the hashes"
    );
    assert!(
        !replay(1, 1),
        "the kernel's earlier dispatch restored 37 times, this one plans 1"
    );
    assert!(
        replay(3, 37),
        "after 2-pass replays, a new kernel planning 37 restores hashes at once"
    );
    assert!(
        replay(2, 37),
        "and so does the 2-pass kernel replayed with 38 passes"
    );
}

/// Under `auto`, a kernel seen for the first time is guessed to change what the kernels
/// replayed before it changed, where guessing wrong costs more than the hashes: after a kernel
/// that rewrote an eighth of memory, a new kernel's 3-pass replay (2 restores, which would save
/// at most 0.2 of a copy beyond the hashes at the default rates) copies without hashing, and
/// so does its next 3-pass dispatch (the first restored in full and learned nothing about what
/// the kernel changes), while a 6-pass replay (5 restores) hashes; after a kernel that rewrote
/// 3 chunks of 512 a new kernel's 3-pass replay hashes. Every pass starts from the snapshot's
/// bytes whatever was chosen.
#[test]
fn auto_guesses_what_a_new_kernel_changes_from_the_kernels_replayed_before_it() {
    let dev = TestDevice::new(Caps {
        host_visible: true,
        ..Default::default()
    });
    let inv = Arc::new(Inventory::new());
    // 2 MiB: the default rates decide on every machine.
    let n = 512u64;
    let a = dev.alloc(&inv, n * CS, 1, MemoryKind::CoarseDevice, 0);
    dev.poke(a, &pattern((n * CS) as usize, 22));
    let snapshotter = snapshotter(&dev, &inv, config(RestoreStrategy::Auto, StoreTier::Host));
    let replay = |kernel, restores, writes: &[u64]| {
        let before = dev.peek(a, n * CS);
        let plan = snapshotter
            .plan(&Filter::for_replay(1))
            .unwrap()
            .with_planned_restores(Some(restores));
        let mut s = snapshotter.take_for_kernel(plan, kernel).unwrap();
        let hashed = s.report().hashed;
        replay_restores(&dev, a, &mut s, restores, writes, &before);
        hashed
    };
    let eighth: Vec<u64> = (0..n).filter(|c| c % 8 == 3).collect();
    let three = [7u64, 250, 500];

    assert!(
        replay(1, 37, &eighth),
        "nothing known: the best case decides"
    );
    assert!(
        !replay(2, 2, &three),
        "after a kernel that rewrote an eighth, 2 restores risk less unhashed"
    );
    assert!(
        !replay(2, 2, &three),
        "its earlier dispatch restored in full, so it says nothing about what changes: the same guess"
    );
    assert!(
        replay(3, 5, &three),
        "5 restores risk more unhashed: hashed"
    );
    assert!(
        replay(4, 2, &three),
        "after a kernel that rewrote 3 chunks: hashed"
    );
}

/// A plan may name the strategy of its snapshot (a backend that measured per launch which way
/// is cheaper): under `auto`, a 2-restore replay planned on a device shadow with device hashing
/// copies without hashing (one restore saved cannot repay the hashes at the default rates), but
/// the same plan asking for the verified write set hashes the snapshot, learns what the kernel
/// writes at its first restore and verifies every restore after it; asking for full restores
/// copies everything, and asking for nothing keeps auto's choice. Every pass starts from the
/// snapshot's bytes whatever was chosen.
#[test]
fn a_plan_naming_its_strategy_is_restored_by_it_instead_of_the_configured_one() {
    let dev = TestDevice::new(Caps {
        shadow: true,
        device_hash: true,
        verified_restore: true,
        ..Default::default()
    });
    let inv = Arc::new(Inventory::new());
    let n = 512u64;
    let a = dev.alloc(&inv, n * CS, 1, MemoryKind::CoarseDevice, 0);
    dev.poke(a, &pattern((n * CS) as usize, 23));
    let snapshotter = snapshotter(&dev, &inv, config(RestoreStrategy::Auto, StoreTier::Device));
    let writes = [3u64, 200, 411];
    let tag = std::cell::Cell::new(0x10u8);
    // Each pass writes bytes no earlier pass wrote (the snapshot holds the last replay's).
    let pass = || {
        tag.set(tag.get() + 1);
        for &c in &writes {
            dev.poke(a + c * CS + 17, &[tag.get(); 3]);
        }
    };
    let replay = |strategy: Option<RestoreStrategy>| {
        let before = dev.peek(a, n * CS);
        let plan = snapshotter
            .plan(&Filter::for_replay(1))
            .unwrap()
            .with_planned_restores(Some(1))
            .with_strategy(strategy);
        assert_eq!(plan.strategy(), strategy);
        let mut s = snapshotter.take(plan).unwrap();
        assert_eq!(s.tier(), StoreTier::Device);
        let hashed = s.report().hashed;
        let mut restores = Vec::new();
        for next in 1..=3u64 {
            pass();
            let r = s
                .restore(&RestoreRequest {
                    next_pass: next,
                    may_be_final: next == 3,
                })
                .unwrap();
            assert_eq!(dev.peek(a, n * CS), before, "pass {next} starts anew");
            restores.push((r.strategy, r.verified, r.bytes_moved));
        }
        pass();
        (hashed, restores)
    };
    let (hashed, restores) = replay(None);
    assert!(
        !hashed,
        "auto: one planned restore does not repay the hashes"
    );
    assert!(
        restores
            .iter()
            .all(|r| r.0 == RestoreStrategy::Full && !r.1)
    );
    let (hashed, restores) = replay(Some(RestoreStrategy::Writeset));
    assert!(hashed, "the write set asked for hashes the snapshot");
    assert!(
        restores
            .iter()
            .all(|r| r.0 == RestoreStrategy::Writeset && r.1 && r.2 == 3 * CS),
        "every restore verifies and writes the 3 changed chunks: {restores:?}"
    );
    let (hashed, restores) = replay(Some(RestoreStrategy::Full));
    assert!(!hashed);
    assert!(
        restores
            .iter()
            .all(|r| r.0 == RestoreStrategy::Full && r.2 == n * CS)
    );
}

#[test]
fn a_hash_restore_from_a_snapshot_the_cpu_can_read_writes_changed_chunks_back_during_its_hash_pass()
{
    // A device shadow the CPU can read through a window: the hash pass writes the changed
    // chunks back itself, so no device copy follows it.
    let (dev, inv, a, data) = setup(Caps {
        shadow: true,
        host_visible: true,
        ..Default::default()
    });
    let mut s = snapshotter(&dev, &inv, config(RestoreStrategy::Hash, StoreTier::Device))
        .snapshot(&Filter::for_replay(1))
        .unwrap();
    assert_eq!(s.tier(), StoreTier::Device);
    dirty(&dev, a, &[1, 9, 63]);
    let copies = dev.counters.device_copies.load(Ordering::Relaxed);
    let r = s.restore(&not_final(1)).unwrap();
    assert_eq!(
        dev.counters.device_copies.load(Ordering::Relaxed),
        copies,
        "written back by the hash pass, not by a device copy after it"
    );
    assert_eq!((r.chunks_restored, r.bytes_moved), (3, 3 * CS));
    assert_eq!(r.bytes_hashed, 64 * CS);
    assert!(r.verified);
    assert_eq!(dev.peek(a, 64 * CS), data);
    let r = s.restore(&FINAL).unwrap();
    assert_eq!(r.chunks_restored, 0, "nothing changed since");
}

#[test]
fn a_hash_pass_that_writes_back_restores_short_last_chunks_and_leaves_freed_regions_alone() {
    // Regions that end inside a chunk, one freed before the restore; every tier the CPU can
    // read, and a write set's learning restore (which hashes everything) as well as `hash`.
    for (store, strategy) in [
        (StoreTier::Host, RestoreStrategy::Hash),
        (StoreTier::Device, RestoreStrategy::Hash),
        (StoreTier::Host, RestoreStrategy::Writeset),
        (StoreTier::Device, RestoreStrategy::Writeset),
    ] {
        let what = format!("{store:?} {strategy:?}");
        let dev = TestDevice::new(Caps {
            shadow: true,
            host_visible: true,
            ..Default::default()
        });
        let inv = Arc::new(Inventory::new());
        let sizes = [10 * CS + 100, 3 * CS - 5, 5 * CS];
        let bufs: Vec<(u64, Vec<u8>)> = sizes
            .iter()
            .enumerate()
            .map(|(i, &size)| {
                let addr = dev.alloc(&inv, size, 1, MemoryKind::CoarseDevice, 0);
                let data = pattern(size as usize, 10 + i as u64);
                dev.poke(addr, &data);
                (addr, data)
            })
            .collect();
        let mut s = snapshotter(&dev, &inv, config(strategy, store))
            .snapshot(&Filter::for_replay(1))
            .unwrap();
        assert_eq!(s.tier(), store, "{what}");
        let (a, b, c) = (bufs[0].0, bufs[1].0, bufs[2].0);
        dev.poke(a + sizes[0] - 1, &[0xEE]); // the 100-byte last chunk of the first region
        dev.poke(b, &[0xEE; 7]); // the first chunk of the second
        dev.poke(b + sizes[1] - 2, &[0xEE; 2]); // and its short last one
        dev.poke(c, &[0xEE; 3]);
        dev.free(&inv, c);
        let r = s.restore(&not_final(1)).unwrap();
        assert!(r.verified, "{what}");
        assert_eq!(r.regions_skipped, 1, "{what}: the freed region");
        assert_eq!(r.chunks_restored, 3, "{what}");
        assert_eq!(r.bytes_moved, 100 + CS + (CS - 5), "{what}");
        for (addr, data) in &bufs[..2] {
            assert_eq!(&dev.peek(*addr, data.len() as u64), data, "{what}");
        }
        // The next pass writes the same chunks again: a write set restores them from what it
        // learned, a hash restore finds them again.
        dev.poke(a + sizes[0] - 1, &[0xEE]);
        dev.poke(b, &[0xEE; 7]);
        let r = s.restore(&FINAL).unwrap();
        for (addr, data) in &bufs[..2] {
            assert_eq!(
                &dev.peek(*addr, data.len() as u64),
                data,
                "{what}: second restore"
            );
        }
        assert!(r.chunks_restored >= 2, "{what}");
    }
}

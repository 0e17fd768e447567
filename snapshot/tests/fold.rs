//! Folding changes into a snapshot: bytes changed by other work between a capture and the
//! fold survive every later restore, byte for byte, under every strategy and store tier, while
//! the pass's own writes (even in the same chunk) are still undone.

mod common;

use common::*;
use kreplay_snapshot::*;

const STRATEGIES: [RestoreStrategy; 5] = [
    RestoreStrategy::Full,
    RestoreStrategy::Hash,
    RestoreStrategy::Writeset,
    RestoreStrategy::WritesetUnverified,
    RestoreStrategy::Auto,
];

/// One snapshot of a 64 KiB buffer in 4 KiB chunks; each "pass" overwrites bytes 0..100 and
/// 20_000..20_100; after pass 0 other work changes bytes 100..164 (the pass's chunk) and
/// 50_000..50_010 (a chunk no pass writes), and after pass 2 bytes 164..196 and 40_000..40_006,
/// each captured before and folded in after. Every later restore must give the original bytes
/// with exactly that work's bytes on top. The second fold comes after restores that verified
/// on the device: a device keeping its own copy of the hashes must get the folded ones.
fn folded_work_survives(strategy: RestoreStrategy, store: StoreTier, caps: Caps) {
    folded_work_survives_refused(strategy, store, caps, false);
}

/// [`folded_work_survives`]; where `refused`, every device write fails while the work is folded
/// in (a device shadow refuses it).
fn folded_work_survives_refused(
    strategy: RestoreStrategy,
    store: StoreTier,
    caps: Caps,
    refused: bool,
) {
    let dev = TestDevice::new(caps);
    let inv = std::sync::Arc::new(Inventory::new());
    let size = 64 * 1024;
    let buf = dev.alloc(&inv, size, 1, MemoryKind::CoarseDevice, 0);
    let original = pattern(size as usize, 3);
    dev.poke(buf, &original);
    let config = SnapshotConfig::default()
        .with_store(store)
        .with_strategy(strategy)
        .with_chunk_size(4096)
        .with_verify_every(4);
    let snap = snapshotter(&dev, &inv, config);
    let mut s = snap.snapshot(&Filter::for_replay(1)).unwrap();
    let pass = |n: u64| {
        dev.poke(buf, &pattern(100, 50 + n));
        dev.poke(buf + 20_000, &pattern(100, 80 + n));
    };
    let mut expected = original.clone();
    for p in 0..6u64 {
        pass(p);
        let work = match p {
            0 => vec![(100u64, pattern(64, 7)), (50_000, vec![0xA5; 10])],
            2 => vec![(164u64, pattern(32, 9)), (40_000, vec![0x5A; 6])],
            _ => Vec::new(),
        };
        if !work.is_empty() {
            let capture = snap.capture(&s.footprint()).unwrap();
            assert_eq!(capture.bytes(), size);
            let work_bytes: u64 = work.iter().map(|(_, b)| b.len() as u64).sum();
            for (offset, bytes) in &work {
                // Make sure each written byte really differs, so the delta is exact.
                let bytes: Vec<u8> = bytes
                    .iter()
                    .enumerate()
                    .map(|(i, b)| {
                        if *b == original[*offset as usize + i] {
                            !b
                        } else {
                            *b
                        }
                    })
                    .collect();
                dev.poke(buf + offset, &bytes);
                expected[*offset as usize..*offset as usize + bytes.len()].copy_from_slice(&bytes);
            }
            let delta = snap.changes(&capture).unwrap();
            assert_eq!(
                delta.bytes(),
                work_bytes,
                "{strategy} {store}: only the work's bytes"
            );
            dev.fail_writes
                .store(refused, std::sync::atomic::Ordering::Relaxed);
            let folded = s.fold(&delta);
            dev.fail_writes
                .store(false, std::sync::atomic::Ordering::Relaxed);
            assert_eq!(folded.unwrap(), work_bytes, "{strategy} {store} {caps:?}");
        }
        let request = if p == 5 { FINAL } else { not_final(p + 1) };
        let report = s.restore(&request).unwrap();
        if strategy == RestoreStrategy::Hash && !refused {
            // The folded chunks' hashes were refreshed: only the pass's two chunks differ.
            assert_eq!(report.chunks_restored, 2, "{store} {caps:?}: {report:?}");
        }
        let now = dev.peek(buf, size);
        let wrong = (0..size as usize)
            .filter(|&i| now[i] != expected[i])
            .count();
        assert_eq!(
            wrong,
            0,
            "{strategy} {store} {caps:?}: restore before pass {} left {wrong} byte(s) unlike the snapshot with the work folded in",
            p + 1
        );
    }
}

#[test]
fn folded_changes_survive_every_restore_under_every_strategy_and_tier() {
    for strategy in STRATEGIES {
        for store in [StoreTier::Device, StoreTier::Host, StoreTier::File] {
            // Spill files go to the system temporary directory.
            if store == StoreTier::File && !common::spill_room(&std::env::temp_dir(), 16 << 20) {
                continue;
            }
            for host_visible in [false, true] {
                let caps = Caps {
                    host_visible,
                    shadow: true,
                    ..Default::default()
                };
                folded_work_survives(strategy, store, caps);
            }
            folded_work_survives(strategy, store, Caps::all());
        }
    }
}

/// The device shadow refuses the folded bytes (its device copies fail while the work is folded
/// in): they are kept beside it and every restore writes them, under every strategy.
#[test]
fn folded_changes_a_device_shadow_refuses_still_survive_every_restore() {
    for strategy in STRATEGIES {
        for host_visible in [false, true] {
            let caps = Caps {
                host_visible,
                shadow: true,
                ..Default::default()
            };
            folded_work_survives_refused(strategy, StoreTier::Device, caps, true);
        }
        folded_work_survives_refused(strategy, StoreTier::Device, Caps::all(), true);
    }
}

/// A restore that cannot write the bytes a shadow refused fails, saying how many it lost.
#[test]
fn a_restore_that_cannot_write_refused_folded_bytes_fails_with_them_lost() {
    let dev = TestDevice::new(Caps {
        shadow: true,
        ..Default::default()
    });
    let inv = std::sync::Arc::new(Inventory::new());
    let buf = dev.alloc(&inv, 8192, 1, MemoryKind::CoarseDevice, 0);
    let config = SnapshotConfig::default()
        .with_store(StoreTier::Device)
        .with_strategy(RestoreStrategy::Full)
        .with_chunk_size(4096);
    let snap = snapshotter(&dev, &inv, config);
    let mut s = snap.snapshot(&Filter::for_replay(1)).unwrap();
    let capture = snap.capture(&s.footprint()).unwrap();
    dev.poke(buf + 10, &[7; 16]);
    let delta = snap.changes(&capture).unwrap();
    dev.fail_writes
        .store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(s.fold(&delta).unwrap(), 16);
    let err = s.restore(&FINAL).unwrap_err();
    dev.fail_writes
        .store(false, std::sync::atomic::Ordering::Relaxed);
    assert!(err.bytes_lost >= 16, "{err:?}");
}

#[test]
fn a_delta_lists_exactly_the_changed_bytes_and_skips_freed_regions() {
    let dev = TestDevice::new(Caps::default());
    let inv = std::sync::Arc::new(Inventory::new());
    let a = dev.alloc(&inv, 4096, 1, MemoryKind::CoarseDevice, 1);
    let b = dev.alloc(&inv, 4096, 1, MemoryKind::CoarseDevice, 2);
    let snap = snapshotter(&dev, &inv, SnapshotConfig::default());
    let plan = snap.plan(&Filter::for_replay(1)).unwrap();
    let capture = snap.capture(&plan.footprint()).unwrap();
    assert_eq!(snap.changes(&capture).unwrap().bytes(), 0);
    dev.poke(a + 10, &[9, 1, 9]);
    dev.poke(a + 12, &[9]);
    dev.poke(b, &[7; 8]);
    let delta = snap.changes(&capture).unwrap();
    let changes: Vec<(u64, Vec<u8>)> = delta.changes().map(|(x, y)| (x, y.to_vec())).collect();
    // Byte 11 was written with the value it had: not a change.
    assert_eq!(
        changes,
        vec![(a + 10, vec![9]), (a + 12, vec![9]), (b, vec![7; 8])]
    );
    dev.free(&inv, b);
    assert_eq!(
        snap.changes(&capture).unwrap().bytes(),
        2,
        "a freed region is left out"
    );
}

/// A range known to be written is taken whole, bytes written with the value they held
/// included, and folding it makes the snapshot hold exactly those bytes there: a word the work
/// set to what a pass had left in some of its bytes is not torn.
#[test]
fn a_written_range_is_folded_whole_even_where_bytes_kept_their_value() {
    let dev = TestDevice::new(Caps::default());
    let inv = std::sync::Arc::new(Inventory::new());
    let buf = dev.alloc(&inv, 4096, 1, MemoryKind::CoarseDevice, 0);
    dev.poke(buf, &0x3FFu32.to_le_bytes());
    let snap = snapshotter(&dev, &inv, SnapshotConfig::default());
    let mut s = snap.snapshot(&Filter::for_replay(1)).unwrap();
    // The pass: the word becomes 0x400; then the work sets it to 0xABC0_0000, whose low byte
    // is the one the pass left.
    dev.poke(buf, &0x400u32.to_le_bytes());
    let capture = snap.capture(&s.footprint()).unwrap();
    dev.poke(buf, &0xABC0_0000u32.to_le_bytes());
    assert_eq!(
        snap.changes(&capture).unwrap().bytes(),
        3,
        "a capture sees three changed bytes"
    );
    let written = snap.written(buf, 4).unwrap();
    assert_eq!(written.bytes(), 4);
    assert_eq!(s.fold(&written).unwrap(), 4);
    s.restore(&FINAL).unwrap();
    assert_eq!(dev.peek(buf, 4), 0xABC0_0000u32.to_le_bytes());
    let mut both = snap.written(buf + 8, 0).unwrap();
    assert!(both.is_empty(), "an empty range writes nothing");
    both.append(snap.written(buf + 8, 2).unwrap());
    assert_eq!(both.bytes(), 2);
}

/// A kernel-reachable range vouched twice at one base, shorter first: the longer one counts (it
/// was cut to the first, and the rest of it was never restored).
#[test]
fn a_longer_range_vouched_at_a_base_already_vouched_is_restored_whole() {
    let dev = TestDevice::new(Caps::default());
    let inv = std::sync::Arc::new(Inventory::new());
    let var = dev.raw_alloc(4096, 0);
    let original = pattern(64, 5);
    dev.poke(var, &original);
    let snap = snapshotter(&dev, &inv, SnapshotConfig::default());
    let filter = Filter::referenced_only(1)
        .vouch(var, 8, RegionSource::ModuleVariable)
        .vouch(var, 64, RegionSource::ModuleVariable);
    for strategy in STRATEGIES {
        let snap = snapshotter(
            &dev,
            &inv,
            SnapshotConfig::default().with_strategy(strategy),
        );
        let mut s = snap.snapshot(&filter).unwrap();
        dev.poke(var, &[0xEE; 64]);
        s.restore(&FINAL).unwrap();
        assert_eq!(dev.peek(var, 64), original, "{strategy}");
    }
    assert_eq!(snap.plan(&filter).unwrap().bytes(), 64);
}

/// Vouched ranges that overlap become one region: work folded into the shared bytes survives
/// every restore, counted once (it was folded into one of two overlapping regions and undone
/// from the other).
#[test]
fn work_folded_into_overlapping_vouched_ranges_survives_every_restore() {
    for strategy in STRATEGIES {
        let dev = TestDevice::new(Caps::default());
        let inv = std::sync::Arc::new(Inventory::new());
        let var = dev.raw_alloc(8192, 0);
        let original = pattern(4096, 11);
        dev.poke(var, &original);
        let filter = Filter::referenced_only(1)
            .vouch(var, 2048, RegionSource::ModuleVariable)
            .vouch(var + 1024, 2048, RegionSource::ModuleVariable);
        let config = SnapshotConfig::default()
            .with_strategy(strategy)
            .with_store(StoreTier::Host)
            .with_chunk_size(512);
        let snap = snapshotter(&dev, &inv, config);
        let mut s = snap.snapshot(&filter).unwrap();
        assert_eq!(s.regions().len(), 1, "{strategy}: merged");
        let mut expected = original.clone();
        for p in 0..4u64 {
            dev.poke(var + 100, &pattern(32, 40 + p));
            if p == 0 {
                let capture = snap.capture(&s.footprint()).unwrap();
                let work: Vec<u8> = original[1500..1516].iter().map(|b| !b).collect();
                dev.poke(var + 1500, &work);
                expected[1500..1516].copy_from_slice(&work);
                let delta = snap.changes(&capture).unwrap();
                assert_eq!(delta.bytes(), 16, "{strategy}");
                assert_eq!(s.fold(&delta).unwrap(), 16, "{strategy}: folded once");
            }
            let request = if p == 3 { FINAL } else { not_final(p + 1) };
            s.restore(&request).unwrap();
            assert_eq!(dev.peek(var, 4096), expected, "{strategy}, restore {p}");
        }
    }
}

/// A written range that runs past the end of the region it starts in keeps its part inside
/// (the whole change was skipped, and those bytes were undone by the next restore).
#[test]
fn a_written_range_running_past_its_region_keeps_its_part_inside() {
    let dev = TestDevice::new(Caps::default());
    let inv = std::sync::Arc::new(Inventory::new());
    let buf = dev.alloc(&inv, 4096, 1, MemoryKind::CoarseDevice, 0);
    let var = dev.raw_alloc(4096, 0);
    dev.poke(buf, &pattern(4096, 21));
    let snap = snapshotter(&dev, &inv, SnapshotConfig::default());
    // The snapshot holds buf whole and the first 2 KiB of `var`; the work writes 200 bytes
    // from 1,900 bytes into `var`, 148 of them inside the vouched range.
    let filter = Filter::for_replay(1).vouch(var, 2048, RegionSource::ModuleVariable);
    let mut s = snap.snapshot(&filter).unwrap();
    dev.poke(buf, &[0; 64]);
    let work = pattern(200, 33);
    dev.poke(var + 1900, &work);
    let written = snap.written(var + 1900, 200).unwrap();
    assert_eq!(s.fold(&written).unwrap(), 148);
    s.restore(&FINAL).unwrap();
    assert_eq!(dev.peek(var + 1900, 200), work, "the work's bytes stay");
    assert_eq!(
        dev.peek(buf, 4096),
        pattern(4096, 21),
        "the pass's are undone"
    );
}

/// A written range in a region freed since the snapshot was planned is left out: its memory may
/// be gone (reading it faulted when the allocator had unmapped it), and a restore never writes
/// it again; the live region's part is kept.
#[test]
fn a_written_range_in_a_region_freed_since_is_left_out() {
    let dev = TestDevice::new(Caps::default());
    let inv = std::sync::Arc::new(Inventory::new());
    let kept = dev.alloc(&inv, 4096, 1, MemoryKind::CoarseDevice, 0);
    let freed = dev.alloc(&inv, 4096, 2, MemoryKind::CoarseDevice, 0);
    let snap = snapshotter(&dev, &inv, SnapshotConfig::default());
    let mut s = snap.snapshot(&Filter::for_replay(1)).unwrap();
    let footprint = s.footprint();
    dev.poke(kept, &[7; 64]);
    dev.free(&inv, freed);
    let mut delta = snap.written_within(&footprint, freed, 64).unwrap();
    assert!(delta.is_empty(), "nothing of the freed region is read");
    delta.append(snap.written_within(&footprint, kept, 64).unwrap());
    assert_eq!(s.fold(&delta).unwrap(), 64);
    s.restore(&FINAL).unwrap();
    assert_eq!(dev.peek(kept, 64), vec![7; 64]);
}

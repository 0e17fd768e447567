//! Snapshot and full restore: correctness, skipped regions, declines, tiers, store lifetime.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use common::*;
use kreplay_snapshot::*;

fn full(store: StoreTier) -> SnapshotConfig {
    SnapshotConfig::default()
        .with_store(store)
        .with_strategy(RestoreStrategy::Full)
        .with_chunk_size(4096)
}

#[test]
fn full_restore_makes_bytes_identical_in_every_tier_with_and_without_host_access() {
    for host_visible in [false, true] {
        for store in [StoreTier::Device, StoreTier::Host, StoreTier::File] {
            // Spill files go to the system temporary directory.
            if store == StoreTier::File && !common::spill_room(&std::env::temp_dir(), 16 << 20) {
                continue;
            }
            let dev = TestDevice::new(Caps {
                host_visible,
                shadow: true,
                ..Default::default()
            });
            let inv = Arc::new(Inventory::new());
            let sizes = [1u64, 4096, 4097, 100_000, 3 << 20];
            let bufs: Vec<(u64, Vec<u8>)> = sizes
                .iter()
                .enumerate()
                .map(|(i, &size)| {
                    let a = dev.alloc(&inv, size, 1, MemoryKind::CoarseDevice, 0);
                    let data = pattern(size as usize, i as u64);
                    dev.poke(a, &data);
                    (a, data)
                })
                .collect();
            let snap = snapshotter(&dev, &inv, full(store));
            let mut s = snap.snapshot(&Filter::for_replay(1)).unwrap();
            let r = s.report().clone();
            assert_eq!(r.tier, store);
            assert_eq!(r.bytes_moved, sizes.iter().sum::<u64>());
            assert_eq!(r.regions, sizes.len() as u64);
            for (i, (a, _)) in bufs.iter().enumerate() {
                dev.poke(*a, &pattern(sizes[i] as usize, 100 + i as u64));
            }
            let rr = s.restore(&FINAL).unwrap();
            assert_eq!(rr.strategy, RestoreStrategy::Full);
            assert_eq!(rr.bytes_moved, r.bytes_moved);
            for (a, data) in &bufs {
                assert!(
                    dev.peek(*a, data.len() as u64) == *data,
                    "tier {store} host_visible {host_visible}: bytes differ after restore"
                );
            }
        }
    }
}

#[test]
fn region_freed_between_snapshot_and_restore_is_skipped_and_reported() {
    let dev = TestDevice::new(Caps::default());
    let inv = Arc::new(Inventory::new());
    let keep = dev.alloc(&inv, 8192, 1, MemoryKind::CoarseDevice, 1);
    let gone = dev.alloc(&inv, 8192, 1, MemoryKind::CoarseDevice, 2);
    let snap = snapshotter(&dev, &inv, full(StoreTier::Host));
    let mut s = snap.snapshot(&Filter::for_replay(1)).unwrap();
    let gone_region = *s.regions().iter().find(|r| r.base == gone).unwrap();
    dev.poke(keep, &[9; 8192]);
    dev.free(&inv, gone);
    let rr = s.restore(&FINAL).unwrap();
    assert_eq!(rr.regions, 1);
    assert_eq!(rr.regions_skipped, 1);
    assert_eq!(rr.skipped, vec![gone_region]);
    assert_eq!(rr.bytes_moved, 8192, "only the live region is written");
    assert_eq!(dev.peek(keep, 8192), vec![1; 8192]);
}

#[test]
fn address_reused_by_a_new_allocation_is_never_restored_into() {
    let dev = TestDevice::new(Caps {
        host_visible: true,
        ..Default::default()
    });
    let inv = Arc::new(Inventory::new());
    let a = dev.alloc(&inv, 4096, 1, MemoryKind::CoarseDevice, 7);
    let snap = snapshotter(&dev, &inv, full(StoreTier::Host));
    let mut s = snap.snapshot(&Filter::for_replay(1)).unwrap();
    // Freed and reallocated at the same address with the same size and agent.
    dev.free(&inv, a);
    dev.raw_alloc_at(a, 4096, 0x55);
    inv.on_alloc(NewAllocation {
        base: a,
        size: 4096,
        owner_agent: 1,
        kind: MemoryKind::CoarseDevice,
    });
    let rr = s.restore(&FINAL).unwrap();
    assert_eq!(rr.regions_skipped, 1);
    assert_eq!(rr.bytes_moved, 0);
    assert_eq!(
        dev.peek(a, 4096),
        vec![0x55; 4096],
        "new allocation untouched"
    );
}

#[test]
fn region_freed_between_plan_and_take_is_left_out_of_the_snapshot() {
    let dev = TestDevice::new(Caps::default());
    let inv = Arc::new(Inventory::new());
    dev.alloc(&inv, 4096, 1, MemoryKind::CoarseDevice, 1);
    let gone = dev.alloc(&inv, 4096, 1, MemoryKind::CoarseDevice, 2);
    let snap = snapshotter(&dev, &inv, full(StoreTier::Host));
    let plan = snap.plan(&Filter::for_replay(1)).unwrap();
    assert_eq!(plan.bytes(), 8192);
    dev.free(&inv, gone);
    let s = snap.take(plan).unwrap();
    assert_eq!(s.report().regions, 1);
    assert_eq!(s.report().regions_skipped, 1);
    assert_eq!(s.report().bytes_planned, 8192);
    assert_eq!(s.report().bytes_moved, 4096);
}

#[test]
fn budget_overrun_declines_with_footprint_budget_and_touches_nothing() {
    let dev = TestDevice::new(Caps::all());
    let inv = Arc::new(Inventory::new());
    let a = dev.alloc(&inv, 10_000, 1, MemoryKind::CoarseDevice, 3);
    let snap = snapshotter(
        &dev,
        &inv,
        full(StoreTier::Auto).with_max_bytes(Some(9_999)),
    );
    let err = snap.snapshot(&Filter::for_replay(1)).err().unwrap();
    assert_eq!(
        err,
        SnapshotError::FootprintBudget {
            planned: 10_000,
            budget: 9_999
        }
    );
    assert_eq!(err.reason(), "footprint_budget");
    assert_eq!(dev.counters.writes.load(Ordering::Relaxed), 0);
    assert_eq!(dev.counters.shadows_live.load(Ordering::Relaxed), 0);
    assert_eq!(dev.peek(a, 10_000), vec![3; 10_000]);
    // Exactly at the budget is accepted.
    let snap = snapshotter(
        &dev,
        &inv,
        full(StoreTier::Auto).with_max_bytes(Some(10_000)),
    );
    assert!(snap.snapshot(&Filter::for_replay(1)).is_ok());
}

#[test]
fn copy_failure_declines_with_snapshot_failed_and_frees_the_store() {
    for store in [StoreTier::Host, StoreTier::Device] {
        let dev = TestDevice::new(Caps {
            shadow: true,
            ..Default::default()
        });
        let inv = Arc::new(Inventory::new());
        let a = dev.alloc(&inv, 3 << 20, 1, MemoryKind::CoarseDevice, 4);
        dev.fail_reads.store(true, Ordering::Relaxed);
        if store == StoreTier::Device {
            // Device tier copies on the device; make that fail instead.
            dev.fail_writes.store(true, Ordering::Relaxed);
        }
        let snap = snapshotter(&dev, &inv, full(store));
        let err = snap.snapshot(&Filter::for_replay(1)).err().unwrap();
        assert!(matches!(err, SnapshotError::CopyFailed(_)), "{err}");
        assert_eq!(err.reason(), "snapshot_failed");
        assert_eq!(dev.counters.writes.load(Ordering::Relaxed), 0);
        assert_eq!(dev.counters.shadows_live.load(Ordering::Relaxed), 0);
        assert_eq!(dev.peek(a, 3 << 20), vec![4; 3 << 20]);
    }
}

#[test]
fn forced_tier_that_is_unavailable_declines_with_snapshot_failed() {
    let dev = TestDevice::new(Caps::default()); // no shadow allocation
    let inv = Arc::new(Inventory::new());
    dev.alloc(&inv, 4096, 1, MemoryKind::CoarseDevice, 0);
    let snap = snapshotter(&dev, &inv, full(StoreTier::Device));
    let err = snap.snapshot(&Filter::for_replay(1)).err().unwrap();
    assert!(
        matches!(
            err,
            SnapshotError::StoreUnavailable {
                tier: StoreTier::Device,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(err.reason(), "snapshot_failed");
    // A spill directory removed after start-up (a missing one is refused at start-up): the
    // file tier fails too.
    let dir = std::env::temp_dir().join(format!("kreplay-gone-spill-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let snap = snapshotter(
        &dev,
        &inv,
        full(StoreTier::File).with_spill_dir(Some(dir.clone())),
    );
    std::fs::remove_dir(&dir).unwrap();
    let err = snap.snapshot(&Filter::for_replay(1)).err().unwrap();
    assert_eq!(err.reason(), "snapshot_failed");
    assert!(err.to_string().contains("file"), "{err}");
}

#[test]
fn auto_tier_falls_back_from_device_to_host() {
    let dev = TestDevice::new(Caps::default());
    let inv = Arc::new(Inventory::new());
    dev.alloc(&inv, 4096, 1, MemoryKind::CoarseDevice, 0);
    let s = snapshotter(&dev, &inv, full(StoreTier::Auto))
        .snapshot(&Filter::for_replay(1))
        .unwrap();
    assert_eq!(s.tier(), StoreTier::Host);
    let dev = TestDevice::new(Caps {
        shadow: true,
        ..Default::default()
    });
    dev.alloc(&inv, 4096, 1, MemoryKind::CoarseDevice, 0);
    let inv2 = Arc::new(Inventory::new());
    dev.alloc(&inv2, 4096, 1, MemoryKind::CoarseDevice, 0);
    let s = snapshotter(&dev, &inv2, full(StoreTier::Auto))
        .snapshot(&Filter::for_replay(1))
        .unwrap();
    assert_eq!(s.tier(), StoreTier::Device);
    assert_eq!(dev.counters.shadows_live.load(Ordering::Relaxed), 1);
    drop(s);
    assert_eq!(
        dev.counters.shadows_live.load(Ordering::Relaxed),
        0,
        "shadow freed on drop"
    );
}

#[test]
fn untracked_required_address_declines_with_untracked_memory() {
    let dev = TestDevice::new(Caps::default());
    let inv = Arc::new(Inventory::new());
    let a = dev.alloc(&inv, 4096, 1, MemoryKind::CoarseDevice, 0);
    let k = dev.alloc(&inv, 64, 1, MemoryKind::Kernarg, 0);
    let snap = snapshotter(&dev, &inv, full(StoreTier::Host));
    // Inside tracked allocations (even an excluded kind): fine.
    assert!(
        snap.snapshot(&Filter::for_replay(1).require(a + 100).require(k))
            .is_ok()
    );
    let err = snap
        .snapshot(&Filter::for_replay(1).require(a + 4096))
        .err()
        .unwrap();
    assert_eq!(err, SnapshotError::UntrackedMemory { addr: a + 4096 });
    assert_eq!(err.reason(), "untracked_memory");
}

#[test]
fn spill_file_leaves_nothing_in_the_spill_directory() {
    let dir = std::env::temp_dir().join(format!("kreplay-snap-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    if !common::spill_room(&dir, 1 << 20) {
        let _ = std::fs::remove_dir(&dir);
        return;
    }
    let dev = TestDevice::new(Caps::default());
    let inv = Arc::new(Inventory::new());
    let a = dev.alloc(&inv, 50_000, 1, MemoryKind::CoarseDevice, 0);
    dev.poke(a, &pattern(50_000, 5));
    let snap = snapshotter(
        &dev,
        &inv,
        full(StoreTier::File)
            .with_spill_dir(Some(dir.clone()))
            .with_keep_store(false),
    );
    let mut s = snap.snapshot(&Filter::for_replay(1)).unwrap();
    assert_eq!(s.tier(), StoreTier::File);
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "unlinked once mapped"
    );
    dev.poke(a, &[0; 50_000]);
    s.restore(&FINAL).unwrap();
    assert_eq!(dev.peek(a, 50_000), pattern(50_000, 5));
    drop(s);
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    std::fs::remove_dir(&dir).unwrap();
}

#[test]
fn host_store_is_pinned_once_and_reused_by_the_next_snapshot() {
    let dev = TestDevice::new(Caps {
        pin: true,
        ..Default::default()
    });
    let inv = Arc::new(Inventory::new());
    dev.alloc(&inv, 100_000, 1, MemoryKind::CoarseDevice, 0);
    let snap = snapshotter(&dev, &inv, full(StoreTier::Host));
    let s1 = snap.snapshot(&Filter::for_replay(1)).unwrap();
    assert!(s1.report().pinned);
    drop(s1);
    let s2 = snap.snapshot(&Filter::for_replay(1)).unwrap();
    assert!(s2.report().pinned);
    assert_eq!(
        dev.counters.registers.load(Ordering::Relaxed),
        1,
        "store reused"
    );
    drop(s2);
    assert_eq!(dev.counters.unregisters.load(Ordering::Relaxed), 0);
    snap.release_cached_store();
    assert_eq!(dev.counters.unregisters.load(Ordering::Relaxed), 1);

    let no_keep = snapshotter(&dev, &inv, full(StoreTier::Host).with_keep_store(false));
    drop(no_keep.snapshot(&Filter::for_replay(1)).unwrap());
    drop(no_keep.snapshot(&Filter::for_replay(1)).unwrap());
    assert_eq!(dev.counters.registers.load(Ordering::Relaxed), 3);
    assert_eq!(dev.counters.unregisters.load(Ordering::Relaxed), 3);
}

#[test]
fn empty_selection_snapshots_and_restores_nothing() {
    let dev = TestDevice::new(Caps::all());
    let inv = Arc::new(Inventory::new());
    dev.alloc(&inv, 4096, 2, MemoryKind::CoarseDevice, 0);
    let snap = snapshotter(&dev, &inv, SnapshotConfig::default());
    let mut s = snap.snapshot(&Filter::for_replay(1)).unwrap();
    assert_eq!(s.report().bytes_moved, 0);
    assert_eq!(s.report().regions, 0);
    let rr = s.restore(&FINAL).unwrap();
    assert_eq!(rr.bytes_moved, 0);
    assert_eq!(dev.counters.writes.load(Ordering::Relaxed), 0);
}

#[test]
fn failed_restore_reports_the_bytes_not_restored() {
    let dev = TestDevice::new(Caps::default());
    let inv = Arc::new(Inventory::new());
    let a = dev.alloc(&inv, 3 << 20, 1, MemoryKind::CoarseDevice, 0);
    let mut s = snapshotter(&dev, &inv, full(StoreTier::Host))
        .snapshot(&Filter::for_replay(1))
        .unwrap();
    dev.poke(a, &[1; 16]);
    dev.fail_writes.store(true, Ordering::Relaxed);
    let err = s.restore(&FINAL).unwrap_err();
    assert_eq!(err.bytes_lost, 3 << 20);
    assert_eq!(err.report.bytes_moved, 0);
    assert!(err.to_string().contains("not restored"));
    dev.fail_writes.store(false, Ordering::Relaxed);
    s.restore(&FINAL).unwrap();
    assert_eq!(dev.peek(a, 16), vec![0; 16]);
}

#[test]
fn free_waits_until_a_restore_in_progress_is_done() {
    let dev = TestDevice::new(Caps::default());
    let inv = Arc::new(Inventory::new());
    let a = dev.alloc(&inv, 4096, 1, MemoryKind::CoarseDevice, 0);
    let b = dev.alloc(&inv, 4096, 1, MemoryKind::CoarseDevice, 0);
    let (release, restorer) = restore_held_in_a_write(&dev, &inv);

    let (freed_tx, freed_rx) = mpsc::channel::<()>();
    let freer = {
        let inv = inv.clone();
        std::thread::spawn(move || {
            inv.on_free(b);
            let _ = freed_tx.send(());
        })
    };
    // The free must not get through while the restore is held in its write.
    assert!(
        freed_rx.recv_timeout(Duration::from_millis(200)).is_err(),
        "free completed during a restore"
    );
    for _ in 0..2 {
        let _ = release.send(());
    }
    assert_eq!(
        restorer.join().unwrap(),
        8192,
        "the restore wrote both buffers"
    );
    freed_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("free completes after the restore");
    freer.join().unwrap();
    assert!(inv.get(a).is_some() && inv.get(b).is_none());
}

/// Holds a restore of agent 1's memory inside its first device write; returns the channel that
/// releases it and the restoring thread.
fn restore_held_in_a_write(
    dev: &Arc<TestDevice>,
    inv: &Arc<Inventory>,
) -> (mpsc::Sender<()>, std::thread::JoinHandle<u64>) {
    let mut s = snapshotter(dev, inv, full(StoreTier::Host))
        .snapshot(&Filter::for_replay(1))
        .unwrap();
    let (in_write_tx, in_write_rx) = mpsc::channel::<()>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let release_rx = parking_lot::Mutex::new(release_rx);
    *dev.on_write.lock() = Some(Box::new(move || {
        let _ = in_write_tx.send(());
        let _ = release_rx.lock().recv_timeout(Duration::from_secs(10));
    }));
    let restorer = std::thread::spawn(move || s.restore(&FINAL).unwrap().bytes_moved);
    in_write_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("restore reached the device");
    (release_tx, restorer)
}

#[test]
fn allocs_and_other_agents_frees_do_not_wait_for_a_restore() {
    let dev = TestDevice::new(Caps::default());
    let inv = Arc::new(Inventory::new());
    let a = dev.alloc(&inv, 4096, 1, MemoryKind::CoarseDevice, 0);
    let other = dev.alloc(&inv, 4096, 2, MemoryKind::CoarseDevice, 0);
    let (release, restorer) = restore_held_in_a_write(&dev, &inv);

    // While agent 1's restore is held: a free on agent 2 and new allocations on both agents.
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let worker = {
        let inv = inv.clone();
        std::thread::spawn(move || {
            assert!(inv.on_free(other).is_some());
            inv.on_alloc(NewAllocation {
                base: 0x7000_0000,
                size: 4096,
                owner_agent: 2,
                kind: MemoryKind::CoarseDevice,
            });
            inv.on_alloc(NewAllocation {
                base: 0x7100_0000,
                size: 4096,
                owner_agent: 1,
                kind: MemoryKind::CoarseDevice,
            });
            let _ = done_tx.send(());
        })
    };
    let got_through = done_rx.recv_timeout(Duration::from_secs(10)).is_ok();
    for _ in 0..2 {
        let _ = release.send(());
    }
    assert!(
        got_through,
        "an alloc or another agent's free waited for agent 1's restore"
    );
    assert_eq!(restorer.join().unwrap(), 4096);
    worker.join().unwrap();
    assert!(inv.get(a).is_some() && inv.get(other).is_none());
}

#[test]
fn an_alloc_dropping_a_stale_entry_waits_for_the_restore_writing_into_it() {
    let dev = TestDevice::new(Caps::default());
    let inv = Arc::new(Inventory::new());
    let a = dev.alloc(&inv, 4096, 1, MemoryKind::CoarseDevice, 0);
    let (release, restorer) = restore_held_in_a_write(&dev, &inv);

    // A new allocation at `a` means its free was missed: `a` is stale, but the restore may be
    // writing into it right now, so dropping it must wait.
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let worker = {
        let inv = inv.clone();
        std::thread::spawn(move || {
            inv.on_alloc(NewAllocation {
                base: a,
                size: 4096,
                owner_agent: 3,
                kind: MemoryKind::CoarseDevice,
            });
            let _ = done_tx.send(());
        })
    };
    assert!(
        done_rx.recv_timeout(Duration::from_millis(200)).is_err(),
        "a stale entry was dropped during a restore writing into it"
    );
    for _ in 0..2 {
        let _ = release.send(());
    }
    done_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the alloc completes after the restore");
    assert_eq!(restorer.join().unwrap(), 4096);
    worker.join().unwrap();
    assert_eq!(inv.get(a).map(|x| x.owner_agent), Some(3));
}

#[test]
fn restores_racing_allocs_and_frees_never_touch_freed_memory() {
    // The test device fails any write to memory it no longer has, so a restore that wrote into
    // a freed buffer would return an error.
    let dev = TestDevice::new(Caps::default());
    let inv = Arc::new(Inventory::new());
    let stable = dev.alloc(&inv, 64 << 10, 1, MemoryKind::CoarseDevice, 1);
    let churn: Vec<u64> = (0..8)
        .map(|_| dev.alloc(&inv, 16 << 10, 1, MemoryKind::CoarseDevice, 2))
        .collect();
    let snap = snapshotter(&dev, &inv, full(StoreTier::Host));
    let stop = Arc::new(AtomicBool::new(false));
    let churner = {
        let (dev, inv, stop) = (dev.clone(), inv.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut live = churn;
            let mut frees = 0u64;
            while !stop.load(Ordering::Relaxed) && frees < 20_000 {
                let addr = live.remove(0);
                dev.free(&inv, addr);
                frees += 1;
                live.push(dev.alloc(&inv, 16 << 10, 1, MemoryKind::CoarseDevice, 3));
            }
            frees
        })
    };
    let mut skipped = 0;
    for pass in 0..200 {
        let mut s = snap.snapshot(&Filter::for_replay(1)).unwrap();
        dev.poke(stable, &[pass as u8; 64]);
        let r = s.restore(&FINAL).expect("restore wrote only live memory");
        skipped += r.regions_skipped;
        assert_eq!(dev.peek(stable, 64), vec![1; 64]);
    }
    stop.store(true, Ordering::Relaxed);
    let frees = churner.join().unwrap();
    assert!(frees > 0);
    println!("{frees} frees raced 200 snapshot/restore rounds; {skipped} regions skipped");
}

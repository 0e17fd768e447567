//! Restore correctness under every strategy and tier, on devices with and without host access:
//! random dirty patterns, writes across chunk boundaries, a writer whose write set changes, and
//! verification before every possibly-final pass. After every restore that the strategy
//! guarantees exact (all of them, as long as the writer stays within its learned write set; for
//! the write set, every verified restore), tracked memory is byte-identical to the snapshot.

mod support;

use std::sync::Arc;

use kreplay_benches::{HostDevice, HostDeviceOptions, SplitMix64};
use kreplay_snapshot::*;

const CS: u64 = 4096;

#[derive(Clone, Copy, Debug)]
enum DeviceKind {
    /// Host windows plus every optional capability.
    SoftwareFull,
    /// Host windows only.
    SoftwarePlain,
    /// Reads and writes only, with batched writes.
    DiscreteBatched,
    /// Reads and writes only, with a device hash kernel and shadows.
    DiscreteHashing,
}

const DEVICES: [DeviceKind; 4] = [
    DeviceKind::SoftwareFull,
    DeviceKind::SoftwarePlain,
    DeviceKind::DiscreteBatched,
    DeviceKind::DiscreteHashing,
];
const TIERS: [StoreTier; 4] = [
    StoreTier::Auto,
    StoreTier::Host,
    StoreTier::File,
    StoreTier::Device,
];
const STRATEGIES: [RestoreStrategy; 6] = [
    RestoreStrategy::Auto,
    RestoreStrategy::Full,
    RestoreStrategy::Hash,
    RestoreStrategy::Writeset,
    RestoreStrategy::WritesetUnverified,
    RestoreStrategy::Tracked,
];

/// Whether writes to this device's memory can be followed here (host windows on a machine
/// whose kernel offers asynchronous write protection).
fn tracks(kind: DeviceKind) -> bool {
    matches!(kind, DeviceKind::SoftwareFull | DeviceKind::SoftwarePlain)
        && kreplay_wtrack::available().is_ok()
}

/// [`tracks`], printing why a test that needs it is skipped when it does not.
fn tracks_or_says_why(kind: DeviceKind) -> bool {
    let yes = tracks(kind);
    if !yes {
        eprintln!(
            "skipped: writes cannot be followed here: {:?}",
            kreplay_wtrack::available()
        );
    }
    yes
}

fn device(kind: DeviceKind) -> HostDevice {
    let (windows, options) = match kind {
        DeviceKind::SoftwareFull => (true, HostDeviceOptions::all()),
        DeviceKind::SoftwarePlain => (true, HostDeviceOptions::default()),
        DeviceKind::DiscreteBatched => (
            false,
            HostDeviceOptions {
                batched_writes: true,
                ..Default::default()
            },
        ),
        DeviceKind::DiscreteHashing => (
            false,
            HostDeviceOptions {
                device_shadow: true,
                device_hash: true,
                ..Default::default()
            },
        ),
    };
    if windows {
        // SAFETY: each test drives its device from one thread: no access to device memory runs
        // concurrently with a snapshot or restore, and frees go through the inventory first.
        unsafe { HostDevice::with_host_windows(options) }
    } else {
        HostDevice::new(options)
    }
}

/// Tracked regions with random contents, and the bytes each must hold after a restore.
struct World {
    device: Arc<HostDevice>,
    inventory: Arc<Inventory>,
    regions: Vec<(u64, u64)>,
    expected: Vec<Vec<u8>>,
    rng: SplitMix64,
}

impl World {
    /// Sizes chosen to end mid-chunk, be shorter than a chunk, and be a single byte.
    fn new(kind: DeviceKind, sizes: &[u64], seed: u64) -> Self {
        let device = Arc::new(device(kind));
        let inventory = Arc::new(Inventory::new());
        let mut rng = SplitMix64::new(seed);
        let mut regions = Vec::new();
        let mut expected = Vec::new();
        for &size in sizes {
            let addr = device
                .alloc_tracked(&inventory, size, 1, MemoryKind::CoarseDevice)
                .unwrap();
            let data: Vec<u8> = (0..size).map(|_| rng.next_u64() as u8).collect();
            device.write(addr, &data).unwrap();
            regions.push((addr, size));
            expected.push(data);
        }
        // Memory that must never be snapshotted or restored: another agent, and kernarg.
        device
            .alloc_tracked(&inventory, 3 * CS, 2, MemoryKind::CoarseDevice)
            .unwrap();
        device
            .alloc_tracked(&inventory, CS, 1, MemoryKind::Kernarg)
            .unwrap();
        World {
            device,
            inventory,
            regions,
            expected,
            rng,
        }
    }

    fn snapshotter(&self, tier: StoreTier, strategy: RestoreStrategy) -> Snapshotter {
        let config = SnapshotConfig::default()
            .with_store(tier)
            .with_strategy(strategy)
            .with_chunk_size(CS)
            .with_verify_every(0)
            .with_keep_store(false);
        Snapshotter::new(self.inventory.clone(), self.device.clone(), config).unwrap()
    }

    /// A snapshotter over the host tier that keeps its store, and so keeps following a
    /// footprint between dispatches where its replay followed writes.
    fn keeping_snapshotter(&self, strategy: RestoreStrategy) -> Snapshotter {
        let config = SnapshotConfig::default()
            .with_store(StoreTier::Host)
            .with_strategy(strategy)
            .with_chunk_size(CS)
            .with_verify_every(0);
        Snapshotter::new(self.inventory.clone(), self.device.clone(), config).unwrap()
    }

    /// What memory holds now becomes what every restore must bring back.
    fn settle(&mut self) {
        self.expected = self
            .regions
            .iter()
            .map(|&(addr, size)| self.device.to_vec(addr, size).unwrap())
            .collect();
    }

    /// One replay of `passes` passes, each making the writes `ops`, restoring after every pass
    /// but the last; checks that every restore brought back what memory held at the snapshot.
    /// Returns the snapshot's report.
    fn replay(
        &mut self,
        snapshotter: &Snapshotter,
        ops: &[(usize, u64, u64)],
        passes: u64,
        what: &str,
    ) -> SnapshotReport {
        self.settle();
        let mut s = snapshotter.snapshot(&Filter::for_replay(1)).unwrap();
        self.run_passes(&mut s, passes, what, |w, _| {
            for &op in ops {
                w.write(op);
            }
        });
        s.report().clone()
    }

    /// The passes of a replay of `s`: `writes` makes pass p's writes, and every pass but the
    /// last is followed by a restore, after which memory must hold what it held at the snapshot
    /// (see [`World::settle`]). Returns the restores' reports.
    fn run_passes(
        &mut self,
        s: &mut Snapshot,
        passes: u64,
        what: &str,
        mut writes: impl FnMut(&mut World, u64),
    ) -> Vec<RestoreReport> {
        let mut reports = Vec::new();
        // The first pass starts from the snapshot too; checked here as before every later pass,
        // so that every pass is timed with the same check before it.
        assert!(
            self.identical(),
            "{what}: memory changed between the snapshot and the first pass"
        );
        for pass in 0..passes {
            writes(self, pass);
            if pass + 1 == passes {
                break;
            }
            let r = s
                .restore(&RestoreRequest {
                    next_pass: pass + 1,
                    may_be_final: pass + 2 == passes,
                })
                .unwrap();
            assert!(
                self.identical(),
                "{what}: pass {pass}: the next pass would not start from the snapshot"
            );
            reports.push(r);
        }
        reports
    }

    fn bytes(&self) -> u64 {
        self.regions.iter().map(|r| r.1).sum()
    }

    fn identical(&self) -> bool {
        self.regions
            .iter()
            .zip(&self.expected)
            .all(|(&(addr, size), data)| self.device.to_vec(addr, size).unwrap() == *data)
    }

    /// Perform write `op` = (region, offset, len) with random bytes.
    fn write(&mut self, (region, offset, len): (usize, u64, u64)) {
        let bytes: Vec<u8> = (0..len).map(|_| self.rng.next_u64() as u8).collect();
        self.device
            .write(self.regions[region].0 + offset, &bytes)
            .unwrap();
    }

    /// A random write set: `n` random small writes, plus writes straddling chunk boundaries,
    /// the first byte and the last byte of each region.
    fn write_set(&mut self, n: usize) -> Vec<(usize, u64, u64)> {
        let mut ops = Vec::new();
        for (r, &(_, size)) in self.regions.iter().enumerate() {
            ops.push((r, 0, 1));
            ops.push((r, size - 1, 1));
            if size > CS + 4 {
                ops.push((r, CS - 2, 4)); // straddles the first chunk boundary
            }
        }
        for _ in 0..n {
            let r = self.rng.below(self.regions.len() as u64) as usize;
            let size = self.regions[r].1;
            let offset = self.rng.below(size);
            let len = (1 + self.rng.below(300)).min(size - offset);
            ops.push((r, offset, len));
        }
        ops
    }

    /// A random subset of `ops`.
    fn subset(&mut self, ops: &[(usize, u64, u64)]) -> Vec<(usize, u64, u64)> {
        ops.iter()
            .copied()
            .filter(|_| self.rng.below(2) == 0)
            .collect()
    }
}

fn supports(kind: DeviceKind, tier: StoreTier) -> bool {
    match tier {
        StoreTier::Device => {
            matches!(kind, DeviceKind::SoftwareFull | DeviceKind::DiscreteHashing)
        }
        // Spill files go to the system temporary directory, which needs room for them (asked
        // once; the reason printed once).
        StoreTier::File => {
            static ROOM: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
            *ROOM.get_or_init(|| support::spill_room(&std::env::temp_dir(), 16 << 20))
        }
        _ => true,
    }
}

const SIZES: [u64; 5] = [3 * CS + 5, 10 * CS, 1, CS - 1, 7 * CS + CS / 2];

#[test]
fn random_writes_within_the_write_set_are_restored_exactly_after_every_pass() {
    for kind in DEVICES {
        for tier in TIERS.into_iter().filter(|&t| supports(kind, t)) {
            for strategy in STRATEGIES {
                let what = format!("{kind:?} {tier} {strategy}");
                let mut w = World::new(kind, &SIZES, 7);
                let snap = w.snapshotter(tier, strategy);
                let mut s = snap.snapshot(&Filter::for_replay(1)).unwrap();
                let ops = w.write_set(12);
                let passes = 6;
                for pass in 0..passes {
                    let this_pass = if pass == 0 {
                        ops.clone()
                    } else {
                        w.subset(&ops)
                    };
                    for op in this_pass {
                        w.write(op);
                    }
                    if pass + 1 == passes {
                        break; // no restore after the last pass
                    }
                    let req = RestoreRequest {
                        next_pass: pass + 1,
                        may_be_final: pass + 2 == passes,
                    };
                    let r = s.restore(&req).unwrap();
                    assert!(
                        w.identical(),
                        "{what}: pass {pass} restore left differences"
                    );
                    assert_eq!(r.regions_skipped, 0, "{what}");
                    assert_eq!(r.repaired_chunks, 0, "{what}: writer stayed in its set");
                    if req.may_be_final && r.strategy != RestoreStrategy::Full {
                        assert!(r.verified, "{what}: final-pass restore must verify");
                    }
                }
            }
        }
    }
}

#[test]
fn a_writer_leaving_its_write_set_is_caught_by_verification_and_repaired() {
    let mut write_set_cases = 0;
    for kind in DEVICES {
        for tier in TIERS.into_iter().filter(|&t| supports(kind, t)) {
            for strategy in STRATEGIES {
                let what = format!("{kind:?} {tier} {strategy}");
                let mut w = World::new(kind, &SIZES, 11);
                let mut s = w
                    .snapshotter(tier, strategy)
                    .snapshot(&Filter::for_replay(1))
                    .unwrap();
                // Pass 0 writes inside region 1 only; the write set is learned from it.
                w.write((1, 100, 10));
                let r = s
                    .restore(&RestoreRequest {
                        next_pass: 1,
                        may_be_final: false,
                    })
                    .unwrap();
                assert!(w.identical(), "{what}");
                assert_eq!(r.repaired_chunks, 0);
                // Pass 1 also writes a chunk of region 4 (outside the learned set) across a
                // chunk boundary: two chunks outside the set.
                w.write((1, 100, 10));
                w.write((4, 2 * CS - 1, 2));
                let r = s
                    .restore(&RestoreRequest {
                        next_pass: 2,
                        may_be_final: false,
                    })
                    .unwrap();
                let writeset = r.strategy == RestoreStrategy::Writeset && !r.verified;
                if writeset {
                    assert!(
                        !w.identical(),
                        "{what}: an unverified write set cannot see it"
                    );
                } else {
                    assert!(w.identical(), "{what}");
                }
                // The next pass may be final: verification runs and repairs.
                let r = s
                    .restore(&RestoreRequest {
                        next_pass: 3,
                        may_be_final: true,
                    })
                    .unwrap();
                assert!(w.identical(), "{what}: final verification left differences");
                if writeset {
                    write_set_cases += 1;
                    assert!(r.verified, "{what}");
                    assert_eq!(
                        r.repaired_chunks, 2,
                        "{what}: both chunks repaired and reported"
                    );
                    assert_eq!(r.chunks_restored, 2, "{what}");
                }
            }
        }
    }
    // The write-set strategy on every device and tier it supports (4 + 3 + 3 + 4, less the file
    // tier where its disk has no room).
    let supported: usize = DEVICES
        .into_iter()
        .map(|kind| TIERS.into_iter().filter(|&t| supports(kind, t)).count())
        .sum();
    assert_eq!(
        supported,
        if supports(DEVICES[0], StoreTier::File) {
            14
        } else {
            10
        }
    );
    assert_eq!(write_set_cases, supported);
}

#[test]
fn auto_switches_from_write_set_to_full_restores_exactly() {
    for kind in DEVICES {
        // Above the auto strategy's full-restore threshold.
        let sizes = [
            AUTO_FULL_BELOW_BYTES / 2 + 5,
            AUTO_FULL_BELOW_BYTES / 2 + 3 * CS,
        ];
        let mut w = World::new(kind, &sizes, 3);
        let mut s = w
            .snapshotter(StoreTier::Host, RestoreStrategy::Auto)
            .snapshot(&Filter::for_replay(1))
            .unwrap();
        // Where writes can be followed, auto follows them until a pass writes too much.
        let first = if tracks(kind) {
            RestoreStrategy::Tracked
        } else {
            RestoreStrategy::Writeset
        };
        assert_eq!(s.report().strategy, first, "{kind:?}");
        let small = w.write_set(5);
        let mut strategies = Vec::new();
        for pass in 0..4u64 {
            if pass < 2 {
                for op in small.clone() {
                    w.write(op);
                }
            } else {
                // Most of memory changes.
                for r in 0..2 {
                    let size = w.regions[r].1;
                    w.write((r, 0, size));
                }
            }
            let r = s
                .restore(&RestoreRequest {
                    next_pass: pass + 1,
                    may_be_final: pass == 2,
                })
                .unwrap();
            assert!(w.identical(), "{kind:?} pass {pass}");
            strategies.push(r.strategy);
        }
        assert_eq!(
            strategies,
            [first, first, first, RestoreStrategy::Full],
            "{kind:?}"
        );
    }
}

#[test]
fn tracked_restores_write_back_exactly_the_chunks_of_the_pages_written_and_hash_nothing() {
    for kind in [DeviceKind::SoftwareFull, DeviceKind::SoftwarePlain] {
        if !tracks_or_says_why(kind) {
            return;
        }
        let sizes = [4 * CS, 6 * CS];
        let mut w = World::new(kind, &sizes, 5);
        let mut s = w
            .snapshotter(StoreTier::Host, RestoreStrategy::Tracked)
            .snapshot(&Filter::for_replay(1))
            .unwrap();
        assert_eq!(s.report().strategy, RestoreStrategy::Tracked);
        assert!(!s.report().hashed, "nothing to hash: writes are followed");
        // One byte in chunk 1 of region 0, and four bytes across chunks 2 and 3 of region 1.
        w.write((0, CS + 7, 1));
        w.write((1, 3 * CS - 2, 4));
        let r = s
            .restore(&RestoreRequest {
                next_pass: 1,
                may_be_final: false,
            })
            .unwrap();
        assert!(w.identical(), "{kind:?}");
        assert_eq!(r.strategy, RestoreStrategy::Tracked);
        assert!(r.verified && !r.unverified);
        assert_eq!((r.bytes_hashed, r.chunks_restored), (0, 3), "{kind:?}");
        // Nothing written: nothing restored. Then a write the restore itself must not hide.
        let r = s
            .restore(&RestoreRequest {
                next_pass: 2,
                may_be_final: false,
            })
            .unwrap();
        assert_eq!(r.chunks_restored, 0, "{kind:?}");
        w.write((0, CS + 7, 1));
        let r = s
            .restore(&RestoreRequest {
                next_pass: 3,
                may_be_final: true,
            })
            .unwrap();
        assert!(w.identical(), "{kind:?}");
        assert_eq!(r.chunks_restored, 1, "{kind:?}");
    }
}

/// Auto follows the writes of a kernel it knows nothing about, then stops after a restore finds
/// that the passes write too much for that to pay. The snapshot was taken without hashes (its
/// writes were to be followed), so a replay with many restores still ahead must not restore
/// all of them in full: the store is hashed, and the restores left choose among the verified
/// ways (here a third of the footprint changes each pass, so a hash restore is the cheaper).
/// Every restore stays exact.
#[test]
fn auto_that_stops_following_writes_hashes_the_store_for_the_restores_still_ahead() {
    let kind = DeviceKind::SoftwareFull;
    if !tracks_or_says_why(kind) {
        return;
    }
    // 3 MiB: above auto's full-restore threshold, below the size whose timings teach rates (the
    // default rates decide, the same on every machine).
    let chunks = 768;
    let mut w = World::new(kind, &[chunks * CS], 43);
    let snapshotter = w.snapshotter(StoreTier::Host, RestoreStrategy::Auto);
    let passes = 20;
    let plan = snapshotter
        .plan(&Filter::for_replay(1))
        .unwrap()
        .with_planned_restores(Some(passes - 1));
    w.settle();
    let mut s = snapshotter.take(plan).unwrap();
    assert_eq!(
        s.report().strategy,
        RestoreStrategy::Tracked,
        "a kernel nothing is known about: its writes are followed"
    );
    assert!(!s.report().hashed);
    // Three chunks in ten, others each pass: 30% of the footprint, never the same twice in a
    // row.
    let reports = w.run_passes(&mut s, passes, "auto", |w, pass| {
        for c in (0..chunks).filter(|c| (c + 3 * pass) % 10 < 3) {
            w.write((0, c * CS + 16, 8));
        }
    });
    let stopped = reports
        .iter()
        .position(|r| r.strategy != RestoreStrategy::Tracked)
        .expect("following writes that cost more than a full copy stops");
    let after = &reports[stopped..];
    // The first of them hashes the store, then restores the verified way, as do the others.
    assert!(
        after
            .iter()
            .all(|r| r.strategy != RestoreStrategy::Full && r.verified),
        "{} restores ahead after following stopped: {:?}",
        after.len(),
        after.iter().map(|r| r.strategy).collect::<Vec<_>>()
    );
}

/// What a fault on a followed page costs is measured on the passes that paid it: where a
/// replay's passes write the same pages, the first pass faults on every one of them and the
/// third on none (they are left open), and the difference of their times prices a fault. Passes
/// that write other pages each time fault alike, and measure nothing. Every restore stays exact.
#[test]
fn a_fault_is_priced_by_the_passes_that_paid_it() {
    let kind = DeviceKind::SoftwareFull;
    if !tracks_or_says_why(kind) {
        return;
    }
    // 32 MiB of 4 KiB pages: a pass writing every other page faults on 4,096 of them (several
    // milliseconds of faults).
    let chunks = 8192;
    let mut w = World::new(kind, &[chunks * CS], 47);
    let snapshotter = w.snapshotter(StoreTier::Host, RestoreStrategy::Tracked);
    let page_writes = |w: &mut World, pages: &mut dyn Iterator<Item = u64>| {
        for c in pages {
            w.write((0, c * CS + 8, 8));
        }
    };
    // Each pass writes a quarter of the pages, another quarter each time.
    for _ in 0..3 {
        w.settle();
        let mut s = snapshotter.snapshot(&Filter::for_replay(1)).unwrap();
        let reports = w.run_passes(&mut s, 4, "tracked, other pages", |w, pass| {
            page_writes(w, &mut (0..chunks).filter(|c| c % 4 == pass % 4))
        });
        assert!(
            reports
                .iter()
                .all(|r| r.strategy == RestoreStrategy::Tracked)
        );
    }
    assert_eq!(
        snapshotter.measured_fault_ns(),
        None,
        "passes that fault alike say nothing of what a fault costs"
    );
    // Every pass writes the same half of the pages: the third pass faults on none. A pass
    // preempted for longer than the first pass's faults took measures nothing, so more replays
    // are allowed (each takes a few tens of milliseconds). Every pass, the first included, is
    // timed with the harness's check of the whole footprint before it (`run_passes`): without
    // it before the first, later passes took 20 ms more than the first and nothing was priced.
    let mut replays = 0;
    while snapshotter.measured_fault_ns().is_none() && replays < 64 {
        w.settle();
        let mut s = snapshotter.snapshot(&Filter::for_replay(1)).unwrap();
        w.run_passes(&mut s, 4, "tracked, the same pages", |w, _| {
            page_writes(w, &mut (0..chunks).step_by(2))
        });
        replays += 1;
    }
    let fault = snapshotter
        .measured_fault_ns()
        .expect("replays whose passes write the same pages measure a fault");
    assert!(fault > 0.0 && fault.is_finite(), "{fault} ns a page");
    eprintln!("a fault measured at {fault:.0} ns a page after {replays} replay(s)");
}

/// A replay runs the same kernel on the same bytes, so its passes mostly write the same pages:
/// a tracked restore leaves the pages written at two restores in a row open (written back at
/// every restore, no fault for the next pass). Every restore must still bring back the
/// snapshot: when a pass writes open pages again, writes pages that are not open, writes
/// part of a page a neighbouring region shares, or stops writing the open ones, which are
/// then followed again within a few restores.
#[test]
fn pages_written_by_every_pass_are_left_open_and_every_restore_stays_exact() {
    for kind in [DeviceKind::SoftwareFull, DeviceKind::SoftwarePlain] {
        if !tracks_or_says_why(kind) {
            return;
        }
        let sizes = [16 * CS, 6 * CS + 5];
        let mut w = World::new(kind, &sizes, 31);
        let mut s = w
            .snapshotter(StoreTier::Host, RestoreStrategy::Tracked)
            .snapshot(&Filter::for_replay(1))
            .unwrap();
        let mut next_pass = 0;
        let mut pass = |w: &mut World, ops: &[(usize, u64, u64)]| {
            for &op in ops {
                w.write(op);
            }
            next_pass += 1;
            let r = s
                .restore(&RestoreRequest {
                    next_pass,
                    may_be_final: false,
                })
                .unwrap();
            assert!(w.identical(), "{kind:?}: restore {next_pass}");
            assert_eq!(r.strategy, RestoreStrategy::Tracked, "{kind:?}");
            r
        };
        // Three pages of region 0 (one write across two of them) and the last, partial page
        // of region 1.
        let same = [(0, 3 * CS + 100, CS), (0, 9 * CS, 8), (1, 6 * CS, 5)];
        let first = pass(&mut w, &same);
        assert_eq!(
            first.bytes_left_open, 0,
            "{kind:?}: no pass before the first"
        );
        let second = pass(&mut w, &same);
        assert_eq!(
            second.bytes_left_open,
            4 * CS,
            "{kind:?}: the pages both passes wrote"
        );
        // Open pages written again, and a page that is not open: both restored.
        let r = pass(&mut w, &[(0, 4 * CS + 7, 3), (0, 12 * CS, 1)]);
        assert!(r.chunks_restored >= 5, "{kind:?}: {}", r.chunks_restored);
        // Passes that write nothing: the open pages are written back whatever the pass did,
        // until a restore protects them again; then nothing is open and nothing written.
        let mut quiet = Vec::new();
        for _ in 0..12 {
            quiet.push(pass(&mut w, &[]));
        }
        let protected_at = quiet
            .iter()
            .position(|r| r.bytes_left_open == 0)
            .expect("open pages followed again");
        assert!(protected_at < 9, "{kind:?}: after {protected_at} restores");
        for r in &quiet[protected_at + 1..] {
            assert_eq!((r.bytes_left_open, r.chunks_restored), (0, 0), "{kind:?}");
        }
        // Followed again: a write to a page that was open is found and restored.
        let r = pass(&mut w, &[(0, 9 * CS + 3, 1)]);
        assert_eq!(r.chunks_restored, 1, "{kind:?}");
    }
}

/// Pages left open are protected again at a revisit, and the pass after it faults on them.
/// Where that pass writes them all again, the next revisit comes after twice as many restores
/// (8, then 16, then 32): a replay whose passes keep writing the same pages pays fewer faulting
/// passes. Where it writes only some of them, revisits come every 8 restores again. Every
/// restore stays exact.
#[test]
fn revisits_of_open_pages_are_put_off_while_the_passes_keep_writing_them() {
    let kind = DeviceKind::SoftwareFull;
    if !tracks_or_says_why(kind) {
        return;
    }
    let mut w = World::new(kind, &[16 * CS], 47);
    let snapshotter = w.snapshotter(StoreTier::Host, RestoreStrategy::Tracked);
    // Restores that left nothing open, numbered from 1: the first (no scan before it) and
    // each revisit.
    let closed = |reports: &[RestoreReport]| -> Vec<usize> {
        reports
            .iter()
            .enumerate()
            .filter(|(_, r)| r.bytes_left_open == 0)
            .map(|(i, _)| i + 1)
            .collect()
    };
    let same = [(0, 2 * CS, 8), (0, 5 * CS + 9, 1), (0, 11 * CS, CS)];
    w.settle();
    let mut s = snapshotter.snapshot(&Filter::for_replay(1)).unwrap();
    let reports = w.run_passes(&mut s, 60, "the same pages", |w, _| {
        for &op in &same {
            w.write(op);
        }
    });
    assert!(
        reports
            .iter()
            .all(|r| r.strategy == RestoreStrategy::Tracked)
    );
    assert_eq!(closed(&reports), [1, 10, 27], "the same pages every pass");
    drop(s);

    // After the first revisit the passes write two of the three pages: the next revisit comes
    // 8 restores later, not 16 (after it, the two pages are all the passes write, and all
    // that is open).
    w.settle();
    let mut s = snapshotter.snapshot(&Filter::for_replay(1)).unwrap();
    let reports = w.run_passes(&mut s, 30, "fewer pages", |w, pass| {
        let ops = if pass < 10 { &same[..] } else { &same[..2] };
        for &op in ops {
            w.write(op);
        }
    });
    assert_eq!(closed(&reports), [1, 10, 19], "two of the three pages");
}

#[test]
fn freed_region_is_skipped_while_the_others_are_restored() {
    for kind in DEVICES {
        for strategy in STRATEGIES {
            let mut w = World::new(kind, &SIZES, 5);
            let mut s = w
                .snapshotter(StoreTier::Host, strategy)
                .snapshot(&Filter::for_replay(1))
                .unwrap();
            w.write((0, 0, 50));
            w.write((2, 0, 1));
            let (gone, _) = w.regions.remove(2);
            w.expected.remove(2);
            assert!(w.device.free_tracked(&w.inventory, gone));
            let r = s.restore(&RestoreRequest::default()).unwrap();
            assert_eq!(r.regions_skipped, 1, "{kind:?} {strategy}");
            assert!(w.identical(), "{kind:?} {strategy}");
        }
    }
}

/// What was learned is reused across dispatches of one kernel (the write set is written from the
/// store unhashed), yet every pass of every dispatch starts from the bytes that dispatch's first
/// pass saw: the kernel's writes move to chunks outside the set learned earlier (dispatch 1),
/// then spread (dispatch 2), then shrink back (dispatch 3). A restore that trusted the reused set
/// without hashing the rest would leave dispatch 2's writes in place.
#[test]
fn learned_sets_reused_across_dispatches_still_start_every_pass_from_its_dispatch_snapshot() {
    const KERNEL: u64 = 0xC0DE;
    let sizes = [
        AUTO_FULL_BELOW_BYTES / 2 + 5,
        AUTO_FULL_BELOW_BYTES / 2 + 3 * CS,
    ];
    let mut reused_cases = 0;
    for kind in DEVICES {
        // One world per device: each dispatch starts from whatever memory holds.
        let mut w = World::new(kind, &sizes, 11);
        for tier in TIERS.into_iter().filter(|&t| supports(kind, t)) {
            for strategy in STRATEGIES {
                let what = format!("{kind:?} {tier} {strategy}");
                let snap = w.snapshotter(tier, strategy);
                // Writes in region 0 only, then region 1 only, then both, then region 0.
                let in_region = |w: &mut World, r: usize| -> Vec<(usize, u64, u64)> {
                    w.write_set(20).into_iter().filter(|op| op.0 == r).collect()
                };
                let first = in_region(&mut w, 0);
                let moved = in_region(&mut w, 1);
                let spread: Vec<_> = first.iter().chain(&moved).copied().collect();
                for (dispatch, ops) in [&first, &moved, &spread, &first].into_iter().enumerate() {
                    // The application's memory between dispatches is the new starting point.
                    w.settle();
                    let plan = snap.plan(&Filter::for_replay(1)).unwrap();
                    let mut s = snap.take_for_kernel(plan, KERNEL).unwrap();
                    let seeded = s.learned_chunks().unwrap_or(0);
                    let restores = w.run_passes(
                        &mut s,
                        4,
                        &format!("{what}: dispatch {dispatch}"),
                        |w, _| {
                            for &op in ops {
                                w.write(op);
                            }
                        },
                    );
                    for (pass, r) in restores.iter().enumerate() {
                        if r.strategy != RestoreStrategy::Full
                            && strategy != RestoreStrategy::WritesetUnverified
                        {
                            assert!(r.verified && !r.unverified, "{what}");
                        }
                        if pass == 0 && seeded > 0 && r.bytes_hashed < r.chunks * CS {
                            reused_cases += 1;
                        }
                    }
                    if matches!(strategy, RestoreStrategy::Writeset) && dispatch > 0 {
                        assert!(
                            seeded > 0,
                            "{what}: dispatch {dispatch} reuses the write set learned earlier"
                        );
                    }
                }
            }
        }
    }
    // The write set (every device and tier it supports) and auto reused a learned set without
    // hashing it.
    assert!(reused_cases >= 14, "{reused_cases}");
}

/// A replay that followed writes keeps following its footprint after it ends, and the next
/// snapshot of the same allocations copies only the pages written since. What the application
/// writes between the two (into pages the last pass wrote, pages restores had protected again,
/// and pages nothing touched since the first snapshot) must be in that snapshot: a restore of
/// the second replay that brought back the first one's bytes would undo the application's work.
#[test]
fn a_footprint_followed_between_dispatches_snapshots_what_the_application_wrote_in_between() {
    if !tracks_or_says_why(DeviceKind::SoftwarePlain) {
        return;
    }
    for strategy in [RestoreStrategy::Tracked, RestoreStrategy::Auto] {
        let what = format!("{strategy}");
        // Large enough for auto to follow writes in a long replay.
        let sizes = [AUTO_FULL_BELOW_BYTES, 3 * CS + 5];
        let mut w = World::new(DeviceKind::SoftwarePlain, &sizes, 21);
        let snap = w.keeping_snapshotter(strategy);
        let ops = vec![(0, 5 * CS + 3, 10), (1, CS - 2, 4)];
        let first = w.replay(&snap, &ops, 38, &what);
        assert_eq!(first.strategy, RestoreStrategy::Tracked, "{what}");
        assert_eq!(
            first.bytes_moved,
            w.bytes(),
            "{what}: the first snapshot copies everything"
        );
        assert_eq!(snap.following(), Some(w.bytes()), "{what}: still followed");
        // The application between dispatches: a page the passes wrote, a page far from them,
        // and the last byte of the small region.
        w.write((0, 5 * CS, 1));
        w.write((0, 40 * CS + 9, 100));
        w.write((1, 3 * CS + 4, 1));
        let second = w.replay(&snap, &ops, 5, &what);
        assert_eq!(second.strategy, RestoreStrategy::Tracked, "{what}");
        assert!(
            second.bytes_moved > 0 && second.bytes_moved <= 6 * CS,
            "{what}: only the chunks written since are copied ({} bytes)",
            second.bytes_moved
        );
        // A replay whose pass writes nothing: the snapshot copies what the last pass wrote.
        let third = w.replay(&snap, &[], 3, &what);
        assert!(third.bytes_moved <= 4 * CS, "{what}: {}", third.bytes_moved);
        let fourth = w.replay(&snap, &ops, 2, &what);
        assert_eq!(fourth.bytes_moved, 0, "{what}: nothing written since");
        assert!(snap.stop_following(), "{what}");
        assert_eq!(snap.following(), None);
        let fifth = w.replay(&snap, &ops, 2, &what);
        assert_eq!(
            fifth.bytes_moved,
            w.bytes(),
            "{what}: copied whole after stopping"
        );
    }
}

/// A footprint kept followed is continued only by a snapshot of the same allocations: one of a
/// region freed and allocated again, or of other regions, copies everything, and a snapshot
/// that does not keep its store leaves nothing followed behind.
#[test]
fn a_footprint_followed_between_dispatches_is_continued_only_over_the_same_allocations() {
    if !tracks_or_says_why(DeviceKind::SoftwarePlain) {
        return;
    }
    let sizes = [8 * CS, 3 * CS + 5];
    let mut w = World::new(DeviceKind::SoftwarePlain, &sizes, 22);
    let snap = w.keeping_snapshotter(RestoreStrategy::Tracked);
    let ops = vec![(0, 2 * CS, 8), (1, 0, 1)];
    w.replay(&snap, &ops, 3, "first");
    assert!(snap.following().is_some());
    // Region 1 freed and allocated again (perhaps at the same address): another allocation.
    let (gone, size) = w.regions.remove(1);
    w.expected.remove(1);
    assert!(w.device.free_tracked(&w.inventory, gone));
    let again = w
        .device
        .alloc_tracked(&w.inventory, size, 1, MemoryKind::CoarseDevice)
        .unwrap();
    w.device.write(again, &vec![7u8; size as usize]).unwrap();
    w.regions.push((again, size));
    w.expected.push(vec![7u8; size as usize]);
    let r = w.replay(&snap, &ops, 3, "after a new allocation");
    assert_eq!(r.bytes_moved, w.bytes(), "another footprint: copied whole");
    // Continued over the same allocations again, then a new region joins the footprint.
    let r = w.replay(&snap, &ops, 3, "same allocations");
    assert!(r.bytes_moved < w.bytes(), "{}", r.bytes_moved);
    let extra = w
        .device
        .alloc_tracked(&w.inventory, 2 * CS, 1, MemoryKind::CoarseDevice)
        .unwrap();
    w.regions.push((extra, 2 * CS));
    let r = w.replay(&snap, &ops, 3, "a region more");
    assert_eq!(r.bytes_moved, w.bytes());
    // A snapshotter that does not keep its store follows nothing after its replay.
    let plain = w.snapshotter(StoreTier::Host, RestoreStrategy::Tracked);
    assert!(snap.stop_following());
    w.replay(&plain, &ops, 3, "store not kept");
    assert_eq!(plain.following(), None);
}

/// Two snapshotters over the same memory: while one keeps a footprint followed, the other's
/// replays (which cannot follow the same pages: the kernel refuses a second tracker) still
/// restore exactly, and their passes' writes and restores are seen by the first one's next
/// snapshot.
#[test]
fn a_second_snapshotter_over_a_footprint_kept_followed_restores_exactly_and_is_seen() {
    if !tracks_or_says_why(DeviceKind::SoftwarePlain) {
        return;
    }
    let sizes = [16 * CS, 5 * CS + 1];
    let mut w = World::new(DeviceKind::SoftwarePlain, &sizes, 23);
    let first = w.keeping_snapshotter(RestoreStrategy::Tracked);
    let other = w.keeping_snapshotter(RestoreStrategy::Tracked);
    let ops = vec![(0, 9 * CS + 1, 30), (1, 5 * CS, 1)];
    w.replay(&first, &ops, 3, "first");
    assert!(first.following().is_some());
    let r = w.replay(&other, &[(0, 3 * CS, 5), (1, 0, 2)], 4, "other");
    assert_ne!(
        r.strategy,
        RestoreStrategy::Tracked,
        "the pages are followed by the first snapshotter already"
    );
    w.write((0, 12 * CS, 3));
    let r = w.replay(&first, &ops, 4, "first again");
    assert_eq!(r.strategy, RestoreStrategy::Tracked);
    assert!(r.bytes_moved < w.bytes());
}

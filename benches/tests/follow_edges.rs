//! A footprint followed between replays while the application forks, discards pages and writes
//! from other threads, and one over 64 MiB with the rayon pool busy: every restore exact, and
//! following stopped while a forked child lives can start again (it could not).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kreplay_benches::{HostDevice, HostDeviceOptions, SplitMix64};
use kreplay_snapshot::*;

const CS: u64 = 4096;

unsafe extern "C" {
    fn fork() -> i32;
    fn pipe(fds: *mut i32) -> i32;
    fn read(fd: i32, buf: *mut u8, n: usize) -> isize;
    fn write(fd: i32, buf: *const u8, n: usize) -> isize;
    fn close(fd: i32) -> i32;
    fn waitpid(pid: i32, status: *mut i32, options: i32) -> i32;
    fn madvise(addr: *mut u8, len: usize, advice: i32) -> i32;
    fn _exit(code: i32) -> !;
}
const MADV_DONTNEED: i32 = 4;

fn tracks() -> bool {
    let ok = kreplay_wtrack::available().is_ok();
    if !ok {
        eprintln!("skipped: {:?}", kreplay_wtrack::available());
    }
    ok
}

struct World {
    device: Arc<HostDevice>,
    inventory: Arc<Inventory>,
    regions: Vec<(u64, u64)>,
    expected: Vec<Vec<u8>>,
    rng: SplitMix64,
}

impl World {
    fn new(sizes: &[u64], seed: u64) -> World {
        // SAFETY: tests write device memory from other threads only between restores, joined
        // before any snapshot or restore.
        let device =
            Arc::new(unsafe { HostDevice::with_host_windows(HostDeviceOptions::default()) });
        let inventory = Arc::new(Inventory::new());
        let mut rng = SplitMix64::new(seed);
        let mut regions = Vec::new();
        for &size in sizes {
            let addr = device
                .alloc_tracked(&inventory, size, 1, MemoryKind::CoarseDevice)
                .unwrap();
            let data: Vec<u8> = (0..size).map(|_| rng.next_u64() as u8).collect();
            device.write(addr, &data).unwrap();
            regions.push((addr, size));
        }
        let mut w = World {
            device,
            inventory,
            regions,
            expected: Vec::new(),
            rng,
        };
        w.settle();
        w
    }
    fn keeping(&self, strategy: RestoreStrategy) -> Snapshotter {
        let config = SnapshotConfig::default()
            .with_store(StoreTier::Host)
            .with_strategy(strategy)
            .with_chunk_size(CS)
            .with_verify_every(0);
        Snapshotter::new(self.inventory.clone(), self.device.clone(), config).unwrap()
    }
    fn settle(&mut self) {
        self.expected = self
            .regions
            .iter()
            .map(|&(a, s)| self.device.to_vec(a, s).unwrap())
            .collect();
    }
    fn first_difference(&self) -> Option<(usize, usize)> {
        for (r, (&(a, s), data)) in self.regions.iter().zip(&self.expected).enumerate() {
            let now = self.device.to_vec(a, s).unwrap();
            if let Some(i) = now.iter().zip(data).position(|(x, y)| x != y) {
                return Some((r, i));
            }
        }
        None
    }
    fn write(&mut self, (region, offset, len): (usize, u64, u64)) {
        let bytes: Vec<u8> = (0..len).map(|_| self.rng.next_u64() as u8).collect();
        self.device
            .write(self.regions[region].0 + offset, &bytes)
            .unwrap();
    }
    /// A replay: snapshot, `passes` passes each running `pass`, restores between, memory
    /// checked against the snapshot after every restore.
    fn replay(
        &mut self,
        snap: &Snapshotter,
        passes: u64,
        what: &str,
        mut pass: impl FnMut(&mut World, u64),
    ) -> (SnapshotReport, Vec<RestoreReport>) {
        self.settle();
        let mut s = snap.snapshot(&Filter::for_replay(1)).unwrap();
        let mut reports = Vec::new();
        for p in 0..passes {
            pass(self, p);
            if p + 1 == passes {
                break;
            }
            let r = s
                .restore(&RestoreRequest {
                    next_pass: p + 1,
                    may_be_final: p + 2 == passes,
                })
                .unwrap();
            assert_eq!(
                self.first_difference(),
                None,
                "{what}: pass {p}: memory differs from the snapshot after the restore ({:?})",
                r.strategy
            );
            reports.push(r);
        }
        (s.report().clone(), reports)
    }
}

/// The application forks a helper that outlives the replay (a subprocess it keeps); the
/// snapshotter then stops following. The next replay asks for tracked restores: the memory is
/// the process's own and no other tracker follows it, so it must be followed again.
#[test]
fn following_stopped_while_a_forked_child_lives_can_start_again() {
    if !tracks() {
        return;
    }
    let mut w = World::new(&[64 * CS, 3 * CS + 5], 101);
    let snap = w.keeping(RestoreStrategy::Tracked);
    let ops = [(0usize, 5 * CS + 3, 10u64), (1, CS - 2, 4)];
    let (first, _) = w.replay(&snap, 4, "first", |w, _| {
        ops.iter().for_each(|&o| w.write(o))
    });
    assert_eq!(first.strategy, RestoreStrategy::Tracked);
    assert!(snap.following().is_some());
    let mut fds = [0i32; 2];
    // SAFETY: a new pipe; the child blocks on it and exits without running Rust code of ours.
    assert_eq!(unsafe { pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: the child only blocks on a read and exits.
    let pid = unsafe { fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let mut b = 0u8;
        // SAFETY: our own descriptors.
        unsafe {
            close(fds[1]);
            read(fds[0], &mut b, 1);
            _exit(0);
        }
    }
    // SAFETY: our own descriptor.
    unsafe { close(fds[0]) };
    assert!(snap.stop_following());
    w.write((0, 9 * CS, 7));
    let (second, _) = w.replay(&snap, 4, "after stop", |w, _| {
        ops.iter().for_each(|&o| w.write(o))
    });
    // SAFETY: release the child (a byte, not end of file: a child forked by another test may
    // hold a copy of this pipe's write end) and reap it.
    unsafe {
        write(fds[1], [1u8].as_ptr(), 1);
        close(fds[1]);
        let mut st = 0;
        waitpid(pid, &mut st, 0);
    }
    assert_eq!(
        second.strategy,
        RestoreStrategy::Tracked,
        "tracked asked, memory followable, but not followed after the fork"
    );
}

/// The application discards pages of a followed region between replays and during a pass
/// (MADV_DONTNEED: zeros), small runs and a whole 2 MiB-aligned block.
#[test]
fn pages_discarded_between_replays_and_during_passes_are_snapshotted_and_restored() {
    if !tracks() {
        return;
    }
    let big = 6u64 << 20;
    let mut w = World::new(&[big, 5 * CS + 1], 102);
    let snap = w.keeping(RestoreStrategy::Tracked);
    let base = w.regions[0].0 as usize;
    let aligned = base.div_ceil(2 << 20) * (2 << 20);
    let off = (aligned - base) as u64;
    let ops = [(0usize, off + 17 * CS, 64u64), (0, 3 * CS, 8), (1, 0, 3)];
    w.replay(&snap, 3, "first", |w, _| {
        ops.iter().for_each(|&o| w.write(o))
    });
    // Between replays: discard a whole aligned 2 MiB block and a small run.
    // SAFETY: both ranges lie inside the region this test allocated and owns.
    unsafe {
        assert_eq!(madvise(aligned as *mut u8, 2 << 20, MADV_DONTNEED), 0);
        assert_eq!(
            madvise(
                (base + 2 * CS as usize) as *mut u8,
                3 * CS as usize,
                MADV_DONTNEED
            ),
            0
        );
    }
    // The passes write inside the discarded pages: each restore must bring zeros back there.
    let (r, _) = w.replay(&snap, 4, "after discard", |w, p| {
        ops.iter().for_each(|&o| w.write(o));
        if p == 1 {
            // During a pass: discard another block; the restore must bring its bytes back.
            // SAFETY: inside the region this test allocated and owns.
            unsafe {
                assert_eq!(
                    madvise((aligned + (1 << 20)) as *mut u8, 1 << 20, MADV_DONTNEED),
                    0
                );
            }
        }
    });
    eprintln!("after discard: {:?} {} bytes", r.strategy, r.bytes_moved);
}

/// Other threads write the followed footprint between replays and inside passes (joined before
/// the restore); a footprint over 64 MiB is scanned in pieces on a rayon pool kept busy.
#[test]
fn other_threads_writes_over_a_large_footprint_with_the_pool_busy_are_restored() {
    if !tracks() {
        return;
    }
    let sizes = [80u64 << 20, 40 << 20, 3 * CS + 7];
    let mut w = World::new(&sizes, 103);
    let snap = w.keeping(RestoreStrategy::Tracked);
    let busy = Arc::new(AtomicBool::new(true));
    for _ in 0..4 {
        let busy = busy.clone();
        rayon::spawn(move || {
            let t = std::time::Instant::now();
            while busy.load(Ordering::Relaxed) && t.elapsed().as_millis() < 300 {
                std::hint::spin_loop();
            }
        });
    }
    let mut seed = SplitMix64::new(7);
    let mut threaded = |w: &mut World, n: usize| {
        let writes: Vec<(usize, u64)> = (0..n)
            .map(|_| {
                let r = seed.below(w.regions.len() as u64) as usize;
                (r, seed.below(w.regions[r].1))
            })
            .collect();
        let regions = w.regions.clone();
        std::thread::scope(|s| {
            for part in writes.chunks(writes.len().div_ceil(3)) {
                let regions = &regions;
                s.spawn(move || {
                    for &(r, off) in part {
                        let p = (regions[r].0 + off) as *mut u8;
                        // SAFETY: inside a live allocation; no snapshot or restore runs now.
                        unsafe { p.write_volatile(p.read_volatile().wrapping_add(1)) };
                    }
                });
            }
        });
    };
    for round in 0..3 {
        let what = format!("round {round}");
        let (s, reports) = w.replay(&snap, 5, &what, |w, _| threaded(w, 500));
        eprintln!(
            "{what}: {:?} {} bytes, restores {:?}",
            s.strategy,
            s.bytes_moved,
            reports.iter().map(|r| r.strategy).collect::<Vec<_>>()
        );
        // Between replays.
        threaded(&mut w, 300);
    }
    busy.store(false, Ordering::Relaxed);
}

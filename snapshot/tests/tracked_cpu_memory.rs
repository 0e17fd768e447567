//! Tracked restores on a device whose memory is this process's own anonymous memory, written
//! only by its CPU (`Capabilities::cpu_writes`): writes by plain stores, by the kernel on the
//! process's behalf, and memory the application zeroes with `madvise`, between and across
//! snapshots of the same allocations.

use std::sync::Arc;

use kreplay_snapshot::*;
use memmap2::MmapMut;

const PAGE: usize = 4096;
const PAGES: usize = 64;

/// Device memory: one private anonymous mapping, addressed by its host addresses.
struct CpuDevice {
    map: MmapMut,
}

impl CpuDevice {
    fn new() -> Arc<Self> {
        let mut map = MmapMut::map_anon(PAGES * PAGE).unwrap();
        for (i, b) in map.iter_mut().enumerate() {
            *b = (i * 7 % 251) as u8 | 1;
        }
        Arc::new(CpuDevice { map })
    }
    fn base(&self) -> u64 {
        self.map.as_ptr() as u64
    }
    fn ptr(&self, addr: u64) -> *mut u8 {
        assert!(addr >= self.base() && addr < self.base() + self.map.len() as u64);
        addr as *mut u8
    }
    fn bytes(&self) -> Vec<u8> {
        self.map.to_vec()
    }
    /// A CPU store of `value` at byte `at`.
    fn store(&self, at: usize, value: u8) {
        // SAFETY: `at` is inside the mapping, which lives as long as `self`; the tests write
        // only between snapshot and restore calls, never during one.
        unsafe { self.ptr(self.base() + at as u64).write_volatile(value) }
    }
}

impl DeviceMemory for CpuDevice {
    fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), CopyError> {
        // SAFETY: the range is inside the mapping (checked by `ptr` at both ends).
        unsafe {
            self.ptr(addr + dst.len() as u64 - 1);
            std::ptr::copy_nonoverlapping(self.ptr(addr), dst.as_mut_ptr(), dst.len());
        }
        Ok(())
    }
    fn write(&self, addr: u64, src: &[u8]) -> Result<(), CopyError> {
        // SAFETY: as in `read`.
        unsafe {
            self.ptr(addr + src.len() as u64 - 1);
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr(addr), src.len());
        }
        Ok(())
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::NONE.with_cpu_writes(true)
    }
    fn host_window(&self, addr: u64, len: u64) -> Option<HostWindow> {
        self.ptr(addr + len - 1);
        // SAFETY: the range lies inside the mapping, which outlives every snapshot of it.
        Some(unsafe { HostWindow::new(self.ptr(addr), len as usize) })
    }
}

fn setup(strategy: RestoreStrategy) -> (Arc<CpuDevice>, Arc<Inventory>, Snapshotter) {
    let dev = CpuDevice::new();
    let inv = Arc::new(Inventory::new());
    inv.on_alloc(NewAllocation {
        base: dev.base(),
        size: (PAGES * PAGE) as u64,
        owner_agent: 1,
        kind: MemoryKind::CoarseDevice,
    });
    let config = SnapshotConfig::default()
        .with_strategy(strategy)
        .with_store(StoreTier::Host)
        .with_chunk_size(1024)
        .with_keep_store(true);
    let snap = Snapshotter::new(inv.clone(), dev.clone(), config).unwrap();
    (dev, inv, snap)
}

fn restore(s: &mut Snapshot, pass: u64) -> RestoreReport {
    s.restore(&RestoreRequest {
        next_pass: pass + 1,
        may_be_final: true,
    })
    .unwrap()
}

/// Pass patterns: the same pages every pass (left writable after two), then other pages, then
/// nothing, then everything.
fn pass_writes(dev: &CpuDevice, pass: u64) {
    match pass {
        0..=3 => (0..PAGES / 2).for_each(|p| dev.store(p * PAGE + 5, pass as u8)),
        4 => dev.store((PAGES - 1) * PAGE + 100, 0xEE),
        5 => {}
        6..=15 => (0..PAGES).for_each(|p| dev.store(p * PAGE + (pass as usize % PAGE), 0)),
        _ => dev.store(((pass as usize * 13) % PAGES) * PAGE, 0x42),
    }
}

#[test]
fn tracked_restores_bring_back_every_cpu_write_whatever_the_pattern() {
    let (dev, _inv, snap) = setup(RestoreStrategy::Tracked);
    let mut s = snap.snapshot(&Filter::for_replay(1)).unwrap();
    let original = dev.bytes();
    for pass in 0..24 {
        pass_writes(&dev, pass);
        let r = restore(&mut s, pass);
        assert!(dev.bytes() == original, "pass {pass}: {r:?}");
    }
}

/// After a followed snapshot is dropped its footprint stays followed, and the next snapshot of
/// the same allocation copies only the pages written since: writes between the two (CPU
/// stores, the kernel filling a buffer from a pipe, pages the application zeroed with
/// `MADV_DONTNEED`) must all be in the second snapshot.
#[test]
fn a_snapshot_of_a_followed_footprint_holds_every_change_made_since_the_last_one() {
    let (dev, _inv, snap) = setup(RestoreStrategy::Tracked);
    let mut first = snap.snapshot(&Filter::for_replay(1)).unwrap();
    pass_writes(&dev, 0);
    restore(&mut first, 0);
    drop(first);
    let followed = snap.following();
    // Changes while nothing is snapshotted.
    dev.store(3 * PAGE + 1, 0x11);
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe() returns.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let msg = [0x77u8; 300];
    // SAFETY: writes from and reads into live buffers of the given lengths; the read lands in
    // the mapping, inside page 9.
    unsafe {
        assert_eq!(libc::write(fds[1], msg.as_ptr().cast(), msg.len()), 300);
        assert_eq!(
            libc::read(
                fds[0],
                dev.ptr(dev.base() + 9 * PAGE as u64).cast(),
                msg.len()
            ),
            300
        );
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
    // SAFETY: pages 20..22 of the private anonymous mapping, which stays mapped; they read
    // back as zeros afterwards.
    let zeroed = unsafe {
        libc::madvise(
            dev.ptr(dev.base() + 20 * PAGE as u64).cast(),
            2 * PAGE,
            libc::MADV_DONTNEED,
        )
    };
    assert_eq!(zeroed, 0);
    let expected = dev.bytes();
    assert_eq!(expected[20 * PAGE], 0);
    let mut second = snap.snapshot(&Filter::for_replay(1)).unwrap();
    assert!(followed.is_some(), "the footprint stayed followed");
    assert!(
        second.report().bytes_moved < (PAGES * PAGE) as u64,
        "only the pages written since were copied: {:?}",
        second.report()
    );
    // Wipe everything, restore: memory must be what it was when the second snapshot was taken.
    for p in 0..PAGES {
        for i in (0..PAGE).step_by(64) {
            dev.store(p * PAGE + i, 0xFF);
        }
    }
    restore(&mut second, 0);
    let now = dev.bytes();
    let differ: Vec<usize> = (0..PAGES)
        .filter(|&p| now[p * PAGE..(p + 1) * PAGE] != expected[p * PAGE..(p + 1) * PAGE])
        .collect();
    assert!(
        differ.is_empty(),
        "pages differing from the second snapshot: {differ:?}"
    );
}

#[test]
fn auto_with_write_following_restores_exactly_across_dispatches() {
    let (dev, _inv, snap) = setup(RestoreStrategy::Auto);
    for dispatch in 0..6u64 {
        let plan = snap
            .plan(&Filter::for_replay(1))
            .unwrap()
            .with_planned_restores(Some(8));
        let mut s = snap.take_for_kernel(plan, 1).unwrap();
        let at_snapshot = dev.bytes();
        for pass in 0..8 {
            pass_writes(&dev, pass + dispatch);
            let r = restore(&mut s, pass);
            assert!(
                dev.bytes() == at_snapshot,
                "dispatch {dispatch} pass {pass}: {r:?}"
            );
        }
        // The last pass's writes stay, as a replay's final pass leaves them.
        pass_writes(&dev, 100 + dispatch);
    }
}

/// Two live tracked snapshots of the same memory, taken at different moments: a restore of one
/// must not hide from the other the writes it has to undo.
#[test]
fn two_live_tracked_snapshots_of_the_same_memory_each_restore_their_own_bytes() {
    let (dev, _inv, snap) = setup(RestoreStrategy::Tracked);
    let mut a = snap.snapshot(&Filter::for_replay(1)).unwrap();
    let at_a = dev.bytes();
    dev.store(5 * PAGE, 0x55);
    let mut b = snap.snapshot(&Filter::for_replay(1)).unwrap();
    let at_b = dev.bytes();
    dev.store(5 * PAGE, 0x66);
    dev.store(7 * PAGE, 0x77);
    restore(&mut a, 0);
    assert!(dev.bytes() == at_a, "a restored");
    restore(&mut b, 0);
    let now = dev.bytes();
    let differ: Vec<usize> = (0..PAGES)
        .filter(|&p| now[p * PAGE..(p + 1) * PAGE] != at_b[p * PAGE..(p + 1) * PAGE])
        .collect();
    assert!(
        differ.is_empty(),
        "pages differing from b's snapshot: {differ:?}"
    );
}

/// The mapping under a followed footprint replaced while nothing is snapshotted (a software
/// runtime recycling the pages of a live allocation with a fresh mapping at the same address):
/// the next snapshot of the allocation must hold the new mapping's bytes, not the old store's.
#[test]
fn a_followed_footprint_whose_mapping_was_replaced_is_copied_again() {
    let (dev, _inv, snap) = setup(RestoreStrategy::Tracked);
    let mut first = snap.snapshot(&Filter::for_replay(1)).unwrap();
    pass_writes(&dev, 0);
    restore(&mut first, 0);
    drop(first);
    assert!(snap.following().is_some());
    // SAFETY: replaces the test's own private anonymous mapping with a fresh one of the same
    // size at the same address (MAP_FIXED); `dev.map` still covers exactly that range.
    let remapped = unsafe {
        libc::mmap(
            dev.ptr(dev.base()).cast(),
            PAGES * PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    assert_eq!(remapped as u64, dev.base());
    dev.store(2 * PAGE + 3, 0x99);
    let expected = dev.bytes();
    let mut second = snap.snapshot(&Filter::for_replay(1)).unwrap();
    for p in 0..PAGES {
        dev.store(p * PAGE + 8, 0xFF);
    }
    restore(&mut second, 0);
    let now = dev.bytes();
    let differ: Vec<usize> = (0..PAGES)
        .filter(|&p| now[p * PAGE..(p + 1) * PAGE] != expected[p * PAGE..(p + 1) * PAGE])
        .collect();
    assert!(
        differ.is_empty(),
        "pages differing from the second snapshot: {differ:?} ({:?})",
        second.report()
    );
}

//! A device for the GPU-free tests of the CUDA backend and of the C ABI on CUDA: host memory
//! of 32-bit words (addresses are byte offsets into them), tracked as one allocation, with its
//! snapshotter, enabled device locks and replay filter.

use std::sync::{Arc, Mutex};

use kreplay_ctxmask::ContextRegistry;
use kreplay_cuda::WindowContext;
use kreplay_locks::AgentLocks;
use kreplay_snapshot::{
    CopyError, DeviceMemory, Filter, Inventory, MemoryKind, NewAllocation, SnapshotConfig,
    Snapshotter,
};

/// The "device": words `0..n`, read and written byte by byte at any offset.
pub struct HostMemory(pub Mutex<Vec<u32>>);

impl HostMemory {
    /// `words` words holding `0, 1, 2, ...`.
    pub fn counting(words: usize) -> HostMemory {
        HostMemory(Mutex::new((0..words as u32).collect()))
    }

    /// The "kernel": `x += 1` on every word, so a forgotten restore shows as a wrong word.
    #[allow(dead_code)]
    pub fn add_one(&self) {
        self.0.lock().unwrap().iter_mut().for_each(|x| *x += 1);
    }
}

impl DeviceMemory for HostMemory {
    fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), CopyError> {
        let mem = self.0.lock().unwrap();
        let at = addr as usize;
        let bytes = mem.iter().flat_map(|w| w.to_le_bytes());
        for (b, from) in dst.iter_mut().zip(bytes.skip(at)) {
            *b = from;
        }
        Ok(())
    }

    fn write(&self, addr: u64, src: &[u8]) -> Result<(), CopyError> {
        let mut mem = self.0.lock().unwrap();
        for (i, b) in src.iter().enumerate() {
            let at = addr as usize + i;
            let mut w = mem[at / 4].to_le_bytes();
            w[at % 4] = *b;
            mem[at / 4] = u32::from_le_bytes(w);
        }
        Ok(())
    }
}

/// One device: its memory as one tracked coarse-grained allocation at address 0, what a replay
/// window needs beside it.
pub struct OneDevice {
    /// The device's memory.
    pub memory: Arc<HostMemory>,
    /// The tracked allocations.
    #[allow(dead_code)]
    pub inventory: Arc<Inventory>,
    /// Device locks, enabled.
    pub locks: AgentLocks,
    /// Snapshots of the memory.
    pub snapshotter: Snapshotter,
    /// The replay filter of the device.
    pub filter: Filter,
}

impl OneDevice {
    /// `words` counting words (see [`HostMemory::counting`]) on device `agent`.
    #[allow(dead_code)]
    pub fn new(words: usize, agent: u64, config: SnapshotConfig) -> OneDevice {
        OneDevice::with_allocations(words, &[(0, (words * 4) as u64)], agent, config)
    }

    /// `words` counting words of which only `allocations` (base, size in bytes) are tracked
    /// as allocations of device `agent`: the rest is memory no allocation call returned (a
    /// module's variables).
    #[allow(dead_code)]
    pub fn with_allocations(
        words: usize,
        allocations: &[(u64, u64)],
        agent: u64,
        config: SnapshotConfig,
    ) -> OneDevice {
        let memory = Arc::new(HostMemory::counting(words));
        let inventory = Arc::new(Inventory::new());
        for &(base, size) in allocations {
            inventory.on_alloc(NewAllocation {
                base,
                size,
                owner_agent: agent,
                kind: MemoryKind::CoarseDevice,
            });
        }
        let snapshotter = Snapshotter::new(inventory.clone(), memory.clone(), config).unwrap();
        let locks = AgentLocks::new();
        locks.set_enabled(true);
        OneDevice {
            memory,
            inventory,
            locks,
            snapshotter,
            filter: Filter::for_replay(agent),
        }
    }

    /// A replay window's context on this device, with the tool contexts of `registry`.
    pub fn context<'a>(&'a self, registry: &'a ContextRegistry) -> WindowContext<'a> {
        WindowContext {
            locks: &self.locks,
            snapshotter: &self.snapshotter,
            filter: &self.filter,
            registry,
            group: &[],
        }
    }
}

/// Room kept beyond a test's own spill files, for the other writers on the same file system
/// (other tests, builds) between the check and the spill.
const SPILL_SLACK: u64 = 64 << 20;

/// Whether spill files of `bytes` bytes in all fit in `dir` (the spill folder the test uses),
/// printing why the file tier's part of the test is skipped when they do not: kreplay refuses a
/// spill file that would leave its file system short (`kreplay_snapshot::spill_room`), so on
/// a machine with little disk free a test of the file tier would fail for the machine, not the
/// code.
#[allow(dead_code)] // for the tests of the file tier
pub fn spill_room(dir: &std::path::Path, bytes: u64) -> bool {
    let short = kreplay_snapshot::spill_room(dir).filter(|&room| room < bytes + SPILL_SLACK);
    if let Some(room) = short {
        eprintln!(
            "skipped: {} leaves {room} bytes for spill files: too little for {bytes}",
            dir.display()
        );
    }
    short.is_none()
}
